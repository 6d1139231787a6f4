//! The engine's agenda: what it has scheduled for itself (ticks, timers, deferred
//! requests, expiries), handed out soonest first, and in the order they were scheduled
//! among those due at the same instant.
//!
//! Most entries are scheduled in order of their time: every request schedules its
//! expiry (its deadline and a grace), and requests of one stream arrive in deadline
//! order. Those go to a queue in arrival order, at O(1) each; only an entry earlier
//! than the queue's last (a tick, a timer, another stream's expiry) goes to a heap,
//! and the two heads are compared on the way out. The order handed out is exactly that
//! of one heap ordered by (time, order scheduled).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// One scheduled entry: its time, its place in the order of scheduling, and what.
type Entry<T> = (u64, u64, T);

/// Entries by time, soonest first (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct Agenda<T> {
    /// Entries scheduled no earlier than the ones before them, in that order.
    in_order: VecDeque<Entry<T>>,
    /// The others.
    heap: BinaryHeap<Reverse<Entry<T>>>,
    /// Entries scheduled so far (each one's place in that order).
    scheduled: u64,
}

impl<T> Default for Agenda<T> {
    fn default() -> Self {
        Self { in_order: VecDeque::new(), heap: BinaryHeap::new(), scheduled: 0 }
    }
}

impl<T: Ord> Agenda<T> {
    /// Schedule `what` at `at`.
    pub(crate) fn schedule(&mut self, at: u64, what: T) {
        self.scheduled += 1;
        if self.in_order.back().is_none_or(|(last, _, _)| at >= *last) {
            self.in_order.push_back((at, self.scheduled, what));
        } else {
            self.heap.push(Reverse((at, self.scheduled, what)));
        }
    }

    /// The time and place of the soonest entry, and whether it is in the heap.
    fn head(&self) -> Option<(u64, u64, bool)> {
        let queued = self.in_order.front().map(|(at, order, _)| (*at, *order, false));
        let heaped = self.heap.peek().map(|Reverse((at, order, _))| (*at, *order, true));
        match (queued, heaped) {
            (Some(q), Some(h)) => Some(if (h.0, h.1) < (q.0, q.1) { h } else { q }),
            (q, h) => q.or(h),
        }
    }

    /// When the soonest entry is due.
    pub(crate) fn next_time(&self) -> Option<u64> {
        self.head().map(|(at, _, _)| at)
    }

    /// The soonest entry if it is due at or before `now`, taken off the agenda.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<T> {
        let (at, _, heaped) = self.head()?;
        if at > now {
            return None;
        }
        if heaped {
            self.heap.pop().map(|Reverse((_, _, what))| what)
        } else {
            self.in_order.pop_front().map(|(_, _, what)| what)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order one heap of (time, order scheduled) hands entries out in.
    fn by_heap(entries: &[(u64, u32)]) -> Vec<u32> {
        let mut heap: BinaryHeap<Reverse<(u64, usize, u32)>> =
            entries.iter().enumerate().map(|(i, &(at, what))| Reverse((at, i, what))).collect();
        std::iter::from_fn(|| heap.pop().map(|Reverse((_, _, what))| what)).collect()
    }

    #[test]
    fn entries_come_out_by_time_then_in_the_order_scheduled() {
        let entries = [(5, 1), (5, 2), (3, 3), (7, 4), (5, 5), (1, 6), (7, 7), (9, 8), (2, 9), (9, 10)];
        let mut agenda = Agenda::default();
        for &(at, what) in &entries {
            agenda.schedule(at, what);
        }
        assert!(!agenda.heap.is_empty() && !agenda.in_order.is_empty(), "both are used");
        assert_eq!(agenda.next_time(), Some(1));
        assert_eq!(agenda.pop_due(0), None, "nothing is due before 1");
        let mut out = Vec::new();
        while let Some(what) = agenda.pop_due(u64::MAX) {
            out.push(what);
        }
        assert_eq!(out, by_heap(&entries));
        assert_eq!(agenda.next_time(), None);
    }

    #[test]
    fn entries_scheduled_while_others_are_handed_out_keep_the_order() {
        // A pseudo-random mix of in-order and earlier entries, scheduled between pops.
        let mut rng = yardmaster_formats::rng::SimRng::new(7);
        let mut next = move || rng.next_u64();
        let mut agenda = Agenda::default();
        let mut reference: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
        let (mut now, mut scheduled) = (0u64, 0u64);
        for round in 0..2_000u64 {
            for _ in 0..(next() % 4) {
                let at = now + if next() % 3 == 0 { next() % 50 } else { 100 + round / 4 };
                scheduled += 1;
                agenda.schedule(at, scheduled);
                reference.push(Reverse((at, scheduled, scheduled)));
            }
            now += next() % 20;
            loop {
                let expected = reference.peek().filter(|Reverse((at, _, _))| *at <= now).map(|Reverse((_, _, what))| *what);
                assert_eq!(agenda.pop_due(now), expected);
                if expected.is_none() {
                    break;
                }
                reference.pop();
            }
            assert_eq!(agenda.next_time(), reference.peek().map(|Reverse((at, _, _))| *at));
        }
    }
}
