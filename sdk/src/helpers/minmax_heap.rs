//! A double-ended priority queue: an array-based min-max heap.
//!
//! Schedulers that alternate between serving the most and the least urgent
//! request (or that serve one end and shed load from the other) need both
//! extremes cheaply. A min-max heap (Atkinson, Sack, Santoro and Strothotte,
//! 1986) stores a complete binary tree in a `Vec` whose levels alternate
//! between *min levels* (even depths, starting with the root) and *max levels*
//! (odd depths). Every element on a min level is no greater than any of its
//! descendants, every element on a max level is no smaller than any of its
//! descendants, so the minimum is the root and the maximum is one of the
//! root's children.
//!
//! | operation                       | cost        |
//! |---------------------------------|-------------|
//! | `peek_min`, `peek_max`          | O(1)        |
//! | `push`, `pop_min`, `pop_max`    | O(log n)    |
//! | `retain`, `from_iter`           | O(n)        |

use std::fmt;

/// A double-ended priority queue with O(1) access to both the smallest and the
/// largest element and O(log n) insertion and removal at either end.
///
/// Equal elements are popped in an unspecified order.
#[derive(Clone)]
pub struct MinMaxHeap<T: Ord> {
    data: Vec<T>,
}

impl<T: Ord> MinMaxHeap<T> {
    /// Creates an empty heap.
    pub fn new() -> Self {
        Self { data: Vec::new() }
    }

    /// Creates an empty heap with room for at least `capacity` elements.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { data: Vec::with_capacity(capacity) }
    }

    /// Returns the number of elements in the heap.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Returns `true` if the heap holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Inserts an element in O(log n).
    pub fn push(&mut self, item: T) {
        self.data.push(item);
        self.bubble_up(self.data.len() - 1);
    }

    /// Returns the smallest element, or `None` if the heap is empty.
    pub fn peek_min(&self) -> Option<&T> {
        self.data.first()
    }

    /// Returns the largest element, or `None` if the heap is empty.
    pub fn peek_max(&self) -> Option<&T> {
        self.max_index().map(|i| &self.data[i])
    }

    /// Removes and returns the smallest element in O(log n), or `None` if the
    /// heap is empty.
    pub fn pop_min(&mut self) -> Option<T> {
        self.remove_at(0)
    }

    /// Removes and returns the largest element in O(log n), or `None` if the
    /// heap is empty.
    pub fn pop_max(&mut self) -> Option<T> {
        let index = self.max_index()?;
        self.remove_at(index)
    }

    /// Removes every element, keeping the allocated capacity.
    pub fn clear(&mut self) {
        self.data.clear();
    }

    /// Iterates over the elements in arbitrary order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.data.iter()
    }

    /// Removes every element and returns them in arbitrary order.
    pub fn drain(&mut self) -> Vec<T> {
        std::mem::take(&mut self.data)
    }

    /// Keeps only the elements for which `keep` returns `true`, then rebuilds
    /// the heap in O(n).
    pub fn retain<F: FnMut(&T) -> bool>(&mut self, keep: F) {
        self.data.retain(keep);
        self.rebuild();
    }

    /// Consumes the heap and returns its elements in arbitrary order.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// Index of the largest element: the root when it is alone, otherwise the
    /// larger of the root's (at most two) children.
    fn max_index(&self) -> Option<usize> {
        match self.data.len() {
            0 => None,
            1 => Some(0),
            2 => Some(1),
            _ if self.data[2] > self.data[1] => Some(2),
            _ => Some(1),
        }
    }

    /// Removes the element at `index` (the root or one of its children),
    /// moving the last element into the hole and restoring the heap order.
    fn remove_at(&mut self, index: usize) -> Option<T> {
        if index >= self.data.len() {
            return None;
        }
        let removed = self.data.swap_remove(index);
        if index < self.data.len() {
            self.trickle_down(index);
        }
        Some(removed)
    }

    /// Restores the heap order of the whole array in O(n) (Floyd's bottom-up
    /// construction, which carries over to min-max heaps).
    fn rebuild(&mut self) {
        for index in (0..self.data.len() / 2).rev() {
            self.trickle_down(index);
        }
    }

    /// `true` if `a` belongs above `b` on a level of the given kind: smaller on
    /// a min level, larger on a max level.
    fn precedes(&self, a: usize, b: usize, min_level: bool) -> bool {
        if min_level {
            self.data[a] < self.data[b]
        } else {
            self.data[a] > self.data[b]
        }
    }

    /// Moves a freshly appended element at `index` up to its place.
    fn bubble_up(&mut self, index: usize) {
        if index == 0 {
            return;
        }
        let parent = parent(index);
        let min_level = is_min_level(index);
        // The parent lies on the opposite kind of level. If the new element
        // belongs above its parent there, it moves into the parent's chain of
        // levels; otherwise it stays in its own chain.
        if self.precedes(parent, index, min_level) {
            self.data.swap(parent, index);
            self.bubble_up_grandparents(parent, !min_level);
        } else {
            self.bubble_up_grandparents(index, min_level);
        }
    }

    /// Moves the element at `index` up through levels of its own kind.
    fn bubble_up_grandparents(&mut self, mut index: usize, min_level: bool) {
        while index > 2 {
            let grandparent = parent(parent(index));
            if !self.precedes(index, grandparent, min_level) {
                break;
            }
            self.data.swap(index, grandparent);
            index = grandparent;
        }
    }

    /// Moves the element at `index` down to its place among its descendants.
    fn trickle_down(&mut self, mut index: usize) {
        let min_level = is_min_level(index);
        while let Some(best) = self.best_descendant(index, min_level) {
            if !self.precedes(best, index, min_level) {
                break;
            }
            self.data.swap(best, index);
            if best <= 2 * index + 2 {
                // `best` was a child: it is a leaf of this subtree's chain.
                break;
            }
            // `best` was a grandchild; the element moved down may now belong
            // above the grandchild's parent, which is on the opposite kind of
            // level.
            let between = parent(best);
            if self.precedes(between, best, min_level) {
                self.data.swap(between, best);
            }
            index = best;
        }
    }

    /// Among the children and grandchildren of `index`, the one that belongs
    /// highest on a level of the given kind, or `None` for a leaf.
    fn best_descendant(&self, index: usize, min_level: bool) -> Option<usize> {
        let len = self.data.len();
        let children = (2 * index + 1..=2 * index + 2).take_while(|&i| i < len);
        let grandchildren = (4 * index + 3..=4 * index + 6).take_while(|&i| i < len);
        children.chain(grandchildren).reduce(|best, i| if self.precedes(i, best, min_level) { i } else { best })
    }
}

/// Index of the parent of a non-root node.
fn parent(index: usize) -> usize {
    (index - 1) / 2
}

/// `true` if `index` lies on a min level (even depth; the root is depth 0).
fn is_min_level(index: usize) -> bool {
    (index + 1).ilog2().is_multiple_of(2)
}

impl<T: Ord> Default for MinMaxHeap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Ord + fmt::Debug> fmt::Debug for MinMaxHeap<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.data.iter()).finish()
    }
}

impl<T: Ord> FromIterator<T> for MinMaxHeap<T> {
    /// Builds a heap from an iterator in O(n).
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut heap = Self { data: iter.into_iter().collect() };
        heap.rebuild();
        heap
    }
}

impl<T: Ord> Extend<T> for MinMaxHeap<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for item in iter {
            self.push(item);
        }
    }
}

impl<'a, T: Ord> IntoIterator for &'a MinMaxHeap<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::helpers::test_rng::XorShift;

    /// Checks the min-max heap order directly: every node compares correctly
    /// with all of its descendants (checking children and grandchildren
    /// suffices by transitivity).
    fn assert_heap_order<T: Ord + fmt::Debug>(heap: &MinMaxHeap<T>) {
        let data = &heap.data;
        for i in 0..data.len() {
            let descendants = (2 * i + 1..=2 * i + 2).chain(4 * i + 3..=4 * i + 6);
            for d in descendants.filter(|&d| d < data.len()) {
                if is_min_level(i) {
                    assert!(data[i] <= data[d], "min level {i} vs {d}: {data:?}");
                } else {
                    assert!(data[i] >= data[d], "max level {i} vs {d}: {data:?}");
                }
            }
        }
    }

    fn sorted<T: Ord + Clone>(items: impl IntoIterator<Item = T>) -> Vec<T> {
        let mut v: Vec<T> = items.into_iter().collect();
        v.sort();
        v
    }

    #[test]
    fn levels_alternate() {
        let expected = [(0, true), (1, false), (2, false), (3, true), (6, true), (7, false), (14, false), (15, true), (30, true)];
        for (index, min) in expected {
            assert_eq!(is_min_level(index), min, "index {index}");
        }
    }

    #[test]
    fn empty_heap() {
        let mut heap: MinMaxHeap<i32> = MinMaxHeap::default();
        assert!(heap.is_empty());
        assert_eq!(heap.len(), 0);
        assert_eq!(heap.peek_min(), None);
        assert_eq!(heap.peek_max(), None);
        assert_eq!(heap.pop_min(), None);
        assert_eq!(heap.pop_max(), None);
        assert!(heap.drain().is_empty());
    }

    #[test]
    fn small_heaps_have_correct_extremes() {
        let mut heap = MinMaxHeap::with_capacity(4);
        heap.push(5);
        assert_eq!((heap.peek_min(), heap.peek_max()), (Some(&5), Some(&5)));
        heap.push(3);
        assert_eq!((heap.peek_min(), heap.peek_max()), (Some(&3), Some(&5)));
        heap.push(9);
        assert_eq!((heap.peek_min(), heap.peek_max()), (Some(&3), Some(&9)));
        assert_eq!(heap.pop_max(), Some(9));
        assert_eq!(heap.pop_max(), Some(5));
        assert_eq!(heap.pop_max(), Some(3));
        assert_eq!(heap.pop_max(), None);
    }

    #[test]
    fn pop_min_yields_ascending_order() {
        let mut rng = XorShift::new(7);
        for len in 0..80 {
            let items: Vec<u64> = (0..len).map(|_| rng.below(50)).collect();
            let mut heap: MinMaxHeap<u64> = items.iter().copied().collect();
            assert_heap_order(&heap);
            let popped: Vec<u64> = std::iter::from_fn(|| heap.pop_min()).collect();
            assert_eq!(popped, sorted(items));
        }
    }

    #[test]
    fn pop_max_yields_descending_order() {
        let mut rng = XorShift::new(11);
        for len in 0..80 {
            let items: Vec<u64> = (0..len).map(|_| rng.below(1000)).collect();
            let mut heap = MinMaxHeap::new();
            for &x in &items {
                heap.push(x);
                assert_heap_order(&heap);
            }
            let popped: Vec<u64> = std::iter::from_fn(|| heap.pop_max()).collect();
            let mut expected = sorted(items);
            expected.reverse();
            assert_eq!(popped, expected);
        }
    }

    #[test]
    fn random_operations_match_sorted_vec() {
        let mut rng = XorShift::new(0x9E37_79B9_7F4A_7C15);
        let mut heap = MinMaxHeap::new();
        let mut reference: Vec<u64> = Vec::new(); // kept sorted ascending
        for step in 0..20_000 {
            match rng.below(10) {
                0..=4 => {
                    let x = rng.below(200);
                    heap.push(x);
                    let at = reference.partition_point(|&y| y <= x);
                    reference.insert(at, x);
                }
                5 | 6 => {
                    let expected = (!reference.is_empty()).then(|| reference.remove(0));
                    assert_eq!(heap.pop_min(), expected, "step {step}");
                }
                7 | 8 => assert_eq!(heap.pop_max(), reference.pop(), "step {step}"),
                _ => {
                    if rng.below(20) == 0 {
                        let limit = rng.below(200);
                        heap.retain(|&x| x % 3 != 0 || x > limit);
                        reference.retain(|&x| x % 3 != 0 || x > limit);
                    }
                }
            }
            assert_eq!(heap.len(), reference.len());
            assert_eq!(heap.is_empty(), reference.is_empty());
            assert_eq!(heap.peek_min(), reference.first(), "step {step}");
            assert_eq!(heap.peek_max(), reference.last(), "step {step}");
            if step % 97 == 0 {
                assert_heap_order(&heap);
                assert_eq!(sorted(heap.iter().copied()), reference);
            }
        }
    }

    #[test]
    fn from_iterator_heapifies_any_input() {
        let mut rng = XorShift::new(3);
        for len in 0..200 {
            let items: Vec<i64> = (0..len).map(|_| rng.below(1 << 20) as i64 - (1 << 19)).collect();
            let heap: MinMaxHeap<i64> = items.iter().copied().collect();
            assert_heap_order(&heap);
            assert_eq!(heap.peek_min(), items.iter().min());
            assert_eq!(heap.peek_max(), items.iter().max());
            assert_eq!(sorted(heap.into_vec()), sorted(items));
        }
        // Already sorted and reverse-sorted input.
        let ascending: MinMaxHeap<u32> = (0..1000).collect();
        assert_heap_order(&ascending);
        let descending: MinMaxHeap<u32> = (0..1000).rev().collect();
        assert_heap_order(&descending);
        assert_eq!((descending.peek_min(), descending.peek_max()), (Some(&0), Some(&999)));
    }

    #[test]
    fn retain_rebuilds_heap() {
        let mut heap: MinMaxHeap<u32> = (0..500).collect();
        heap.retain(|&x| x % 7 == 3);
        assert_heap_order(&heap);
        let expected: Vec<u32> = (0..500).filter(|x| x % 7 == 3).collect();
        assert_eq!(heap.len(), expected.len());
        assert_eq!(heap.peek_min(), expected.first());
        assert_eq!(heap.peek_max(), expected.last());
        heap.retain(|_| false);
        assert!(heap.is_empty());
    }

    #[test]
    fn drain_and_clear_empty_the_heap() {
        let mut heap: MinMaxHeap<u8> = [4, 1, 3, 1, 5].into_iter().collect();
        let drained = heap.drain();
        assert_eq!(sorted(drained), vec![1, 1, 3, 4, 5]);
        assert!(heap.is_empty());
        heap.extend([2, 8, 6]);
        assert_eq!(heap.len(), 3);
        assert_eq!((heap.peek_min(), heap.peek_max()), (Some(&2), Some(&8)));
        heap.clear();
        assert!(heap.is_empty());
        assert_eq!(heap.pop_max(), None);
    }

    #[test]
    fn duplicates_and_borrowed_iteration() {
        let mut heap = MinMaxHeap::new();
        for _ in 0..10 {
            heap.push(42);
        }
        assert_eq!((&heap).into_iter().count(), 10);
        assert_eq!(heap.pop_max(), Some(42));
        assert_eq!(heap.pop_min(), Some(42));
        assert_eq!(heap.len(), 8);
    }

    #[test]
    fn works_with_non_copy_items() {
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
        struct Job {
            priority: u32,
            name: String,
        }
        let job = |priority, name: &str| Job { priority, name: name.to_owned() };
        let mut heap = MinMaxHeap::new();
        heap.push(job(2, "b"));
        heap.push(job(9, "z"));
        heap.push(job(1, "a"));
        heap.push(job(5, "m"));
        assert_eq!(heap.pop_max().map(|j| j.name), Some("z".to_owned()));
        assert_eq!(heap.pop_min().map(|j| j.name), Some("a".to_owned()));
        assert_eq!(format!("{:?}", MinMaxHeap::<u8>::from_iter([1])), "[1]");
    }
}
