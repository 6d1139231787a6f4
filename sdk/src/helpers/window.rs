//! Sliding windows over recent samples.
//!
//! * [`SlidingWindow`] keeps the `(time, value)` samples of the last `span_ns`
//!   nanoseconds and answers sums, means, extremes, rates and exact quantiles.
//! * [`LinearWeightedWindow`] keeps the same kind of samples but averages them
//!   with weights that fall linearly with age, for estimates (such as queueing
//!   delay) that should follow recent behaviour without jumping when an old
//!   sample leaves the window.
//! * [`CountWindow`] keeps the last `N` values regardless of time and answers
//!   mean, standard deviation and coefficient of variation.
//!
//! # Time windows
//!
//! A time window covers the half-open interval `(now - span, now]`, where
//! `now` is the latest time the window has seen (through `push`, `expire` or a
//! query that takes a time). A sample of age `now - t` is kept while its age is
//! below the span; a sample pushed at a time already outside the window is
//! discarded. Samples may be pushed out of time order; they are kept sorted by
//! time.

use std::collections::VecDeque;

use super::quantile::exact_quantile;

/// Nanoseconds per second, for rates.
const NANOS_PER_SEC: f64 = 1e9;

/// A running sum with Neumaier compensation, so that adding and later
/// subtracting values of very different magnitudes does not leave drift.
#[derive(Clone, Copy, Debug, Default)]
struct CompensatedSum {
    sum: f64,
    compensation: f64,
}

impl CompensatedSum {
    fn add(&mut self, x: f64) {
        let total = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - total) + x;
        } else {
            self.compensation += (x - total) + self.sum;
        }
        self.sum = total;
    }

    fn value(&self) -> f64 {
        self.sum + self.compensation
    }
}

/// The sample store shared by the time windows: samples sorted by time, the
/// latest time seen and a running sum of the values.
#[derive(Clone, Debug)]
struct SampleStore {
    span_ns: u64,
    samples: VecDeque<(u64, f64)>,
    latest_ns: Option<u64>,
    /// Running sum of the values held; restarts from exact zero whenever the
    /// store empties.
    sum: CompensatedSum,
}

impl SampleStore {
    fn new(span_ns: u64) -> Self {
        assert!(span_ns > 0, "window span must be positive, got 0 ns");
        Self { span_ns, samples: VecDeque::new(), latest_ns: None, sum: CompensatedSum::default() }
    }

    /// The later of `now_ns` and the latest time seen.
    fn effective_now(&self, now_ns: u64) -> u64 {
        self.latest_ns.map_or(now_ns, |latest| latest.max(now_ns))
    }

    /// The oldest sample time still inside the window ending at `now_ns`.
    fn oldest_kept(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.span_ns - 1)
    }

    /// Index of the first sample inside the window ending at `now_ns` (or at
    /// the latest time seen, if later).
    fn first_in_window(&self, now_ns: u64) -> usize {
        let oldest = self.oldest_kept(self.effective_now(now_ns));
        self.samples.partition_point(|&(t, _)| t < oldest)
    }

    /// Expires up to `t_ns`, then inserts the sample in time order unless it
    /// is already outside the window.
    fn push(&mut self, t_ns: u64, value: f64) {
        self.expire(t_ns);
        if t_ns < self.oldest_kept(self.effective_now(t_ns)) {
            return;
        }
        let at = match self.samples.back() {
            Some(&(last, _)) if t_ns < last => self.samples.partition_point(|&(t, _)| t <= t_ns),
            _ => self.samples.len(),
        };
        self.samples.insert(at, (t_ns, value));
        self.sum.add(value);
    }

    /// Advances the latest time seen to `now_ns` (if later) and drops the
    /// samples outside the window ending there.
    fn expire(&mut self, now_ns: u64) {
        let now = self.effective_now(now_ns);
        self.latest_ns = Some(now);
        let oldest = self.oldest_kept(now);
        while let Some(&(t, value)) = self.samples.front() {
            if t >= oldest {
                break;
            }
            self.samples.pop_front();
            self.sum.add(-value);
        }
        if self.samples.is_empty() {
            self.sum = CompensatedSum::default();
        }
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().map(|&(_, value)| value)
    }

    fn iter(&self) -> impl ExactSizeIterator<Item = (u64, f64)> + '_ {
        self.samples.iter().copied()
    }
}

/// A time window over `(t_ns, value)` samples: keeps the samples of the last
/// `span_ns` nanoseconds and answers sum, mean, extremes, rate and exact
/// quantiles over them.
#[derive(Clone, Debug)]
pub struct SlidingWindow {
    store: SampleStore,
}

impl SlidingWindow {
    /// Creates an empty window covering `span_ns` nanoseconds.
    ///
    /// # Panics
    /// If `span_ns` is zero.
    pub fn new(span_ns: u64) -> Self {
        Self { store: SampleStore::new(span_ns) }
    }

    /// The span of the window in nanoseconds.
    pub fn span_ns(&self) -> u64 {
        self.store.span_ns
    }

    /// Adds a sample taken at `t_ns`, first dropping the samples that the
    /// (possibly advanced) latest time pushes out of the window.
    pub fn push(&mut self, t_ns: u64, value: f64) {
        self.store.push(t_ns, value);
    }

    /// Advances the latest time seen to `now_ns` (if later) and drops the
    /// samples that fall out of the window.
    pub fn expire(&mut self, now_ns: u64) {
        self.store.expire(now_ns);
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// `true` if no sample is held.
    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// Sum of the values held (0 when empty).
    pub fn sum(&self) -> f64 {
        self.store.sum.value()
    }

    /// Mean of the values held, or `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.sum() / self.len() as f64)
    }

    /// Smallest value held, or `None` when empty.
    pub fn min(&self) -> Option<f64> {
        self.store.values().reduce(f64::min)
    }

    /// Largest value held, or `None` when empty.
    pub fn max(&self) -> Option<f64> {
        self.store.values().reduce(f64::max)
    }

    /// Samples per second: the number of samples inside the window ending at
    /// `now_ns` (or at the latest time seen, if later) divided by the span in
    /// seconds. Does not modify the window.
    pub fn rate_per_sec(&self, now_ns: u64) -> f64 {
        let in_window = self.store.len() - self.store.first_in_window(now_ns);
        in_window as f64 * NANOS_PER_SEC / self.store.span_ns as f64
    }

    /// Exact nearest-rank quantile of the values held (`q = 0` is the minimum,
    /// `q = 1` the maximum), or `None` when empty. Sorts a copy: O(n log n).
    ///
    /// # Panics
    /// If `q` is not in `[0, 1]`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        exact_quantile(self.store.values(), q)
    }

    /// Mean of the samples inside the window ending at `now_ns` (or at the
    /// latest time seen, if later), each weighted by `(span - age) / span`, or
    /// `None` if no sample is inside. Does not modify the window.
    pub fn weighted_mean(&self, now_ns: u64) -> Option<f64> {
        let now = self.store.effective_now(now_ns);
        let span = self.store.span_ns as f64;
        let first = self.store.first_in_window(now_ns);
        let (weighted_sum, total_weight) = self.store.samples.range(first..).fold((0.0, 0.0), |(sum, total), &(t, value)| {
            let weight = (span - (now - t) as f64) / span;
            (sum + weight * value, total + weight)
        });
        (total_weight > 0.0).then(|| weighted_sum / total_weight)
    }

    /// Iterates over the `(t_ns, value)` samples held, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u64, f64)> + '_ {
        self.store.iter()
    }
}

/// A time window read through its linearly recency-weighted mean
/// ([`SlidingWindow::weighted_mean`]): a sample taken at `now` weighs 1 and the
/// weight falls to `1 / span_ns` for a sample at the far edge of the window. The
/// same store serves both readings, so this is the sliding window under the name
/// the reference policies use.
pub type LinearWeightedWindow = SlidingWindow;

/// The last `capacity` values pushed (a fixed-capacity ring), with mean,
/// population standard deviation and coefficient of variation. Statistics are
/// computed on demand in O(capacity).
#[derive(Clone, Debug)]
pub struct CountWindow {
    capacity: usize,
    values: VecDeque<f64>,
}

impl CountWindow {
    /// Creates an empty window holding at most `capacity` values.
    ///
    /// # Panics
    /// If `capacity` is zero.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "window capacity must be positive, got 0");
        Self { capacity, values: VecDeque::with_capacity(capacity) }
    }

    /// The most values the window holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds a value, evicting the oldest one when the window is full.
    pub fn push(&mut self, value: f64) {
        if self.values.len() == self.capacity {
            self.values.pop_front();
        }
        self.values.push_back(value);
    }

    /// Number of values held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// `true` if no value is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `true` once the window holds `capacity` values.
    pub fn is_full(&self) -> bool {
        self.values.len() == self.capacity
    }

    /// Removes every value.
    pub fn clear(&mut self) {
        self.values.clear();
    }

    /// Mean of the values held, or `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (!self.is_empty()).then(|| self.values.iter().sum::<f64>() / self.len() as f64)
    }

    /// Population standard deviation of the values held, or `None` when empty.
    pub fn std_dev(&self) -> Option<f64> {
        let mean = self.mean()?;
        let squared: f64 = self.values.iter().map(|v| (v - mean).powi(2)).sum();
        Some((squared / self.len() as f64).sqrt())
    }

    /// Coefficient of variation (`std_dev / mean`), or `None` when empty or
    /// when the mean is zero.
    pub fn cv(&self) -> Option<f64> {
        let mean = self.mean().filter(|&m| m != 0.0)?;
        Some(self.std_dev()? / mean)
    }

    /// Iterates over the values held, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = f64> + DoubleEndedIterator + '_ {
        self.values.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::helpers::test_rng::XorShift;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    /// Brute-force reference: every sample ever pushed, filtered on query.
    struct Reference {
        span: u64,
        latest: u64,
        samples: Vec<(u64, f64)>,
    }

    impl Reference {
        fn advance(&mut self, now: u64) {
            self.latest = self.latest.max(now);
        }

        fn live(&self, now: u64) -> Vec<(u64, f64)> {
            let now = self.latest.max(now);
            let mut live: Vec<(u64, f64)> = self.samples.iter().copied().filter(|&(t, _)| t <= now && now - t < self.span).collect();
            live.sort_by_key(|&(t, _)| t);
            live
        }
    }

    #[test]
    fn sliding_window_matches_brute_force() {
        let mut rng = XorShift::new(42);
        for span in [1, 7, 100, 1_000] {
            let mut window = SlidingWindow::new(span);
            let mut reference = Reference { span, latest: 0, samples: Vec::new() };
            let mut now = 0u64;
            for step in 0..4_000 {
                match rng.below(10) {
                    0..=6 => {
                        now += rng.below(span / 4 + 2);
                        // Mostly in order, sometimes a little late.
                        let t = now.saturating_sub(if rng.below(5) == 0 { rng.below(span + 10) } else { 0 });
                        let value = (rng.unit() - 0.3) * 100.0;
                        window.push(t, value);
                        reference.advance(t);
                        // Samples pushed too late are discarded by the window.
                        if reference.latest - t < span {
                            reference.samples.push((t, value));
                        }
                    }
                    7 | 8 => {
                        now += rng.below(span / 2 + 1);
                        window.expire(now);
                        reference.advance(now);
                    }
                    _ => {
                        let probe = now + rng.below(span + 1);
                        let expected = reference.live(probe).len() as f64 * 1e9 / span as f64;
                        assert!(close(window.rate_per_sec(probe), expected), "step {step}");
                    }
                }
                let live = reference.live(0);
                let values: Vec<f64> = live.iter().map(|&(_, v)| v).collect();
                assert_eq!(window.len(), live.len(), "span {span} step {step}");
                assert_eq!(window.is_empty(), live.is_empty());
                assert_eq!(window.iter().map(|(t, _)| t).collect::<Vec<_>>(), live.iter().map(|&(t, _)| t).collect::<Vec<_>>());
                let expected_sum: f64 = values.iter().sum();
                assert!(close(window.sum(), expected_sum), "sum {} vs {expected_sum}", window.sum());
                match window.mean() {
                    Some(mean) => assert!(close(mean, expected_sum / values.len() as f64)),
                    None => assert!(values.is_empty()),
                }
                assert_eq!(window.min(), values.iter().copied().reduce(f64::min));
                assert_eq!(window.max(), values.iter().copied().reduce(f64::max));
                if step % 50 == 0 && !values.is_empty() {
                    let mut sorted = values.clone();
                    sorted.sort_by(f64::total_cmp);
                    assert_eq!(window.quantile(0.0), sorted.first().copied());
                    assert_eq!(window.quantile(1.0), sorted.last().copied());
                    let median = window.quantile(0.5).unwrap();
                    let rank = (sorted.len() as f64 * 0.5).ceil() as usize;
                    assert_eq!(median, sorted[rank.max(1) - 1]);
                }
            }
        }
    }

    #[test]
    fn window_is_half_open() {
        let mut window = SlidingWindow::new(10);
        window.push(0, 1.0);
        window.push(9, 2.0);
        assert_eq!(window.len(), 2);
        window.push(10, 3.0); // age of the first sample is now 10 = span
        assert_eq!(window.iter().collect::<Vec<_>>(), vec![(9, 2.0), (10, 3.0)]);
        window.expire(5); // time never goes backwards
        assert_eq!(window.len(), 2);
        window.push(0, 9.0); // already outside the window
        assert_eq!(window.len(), 2);
        assert_eq!(window.sum(), 5.0);
        window.expire(1_000);
        assert!(window.is_empty());
        assert_eq!(window.sum(), 0.0);
        assert_eq!(window.mean(), None);
        assert_eq!(window.min(), None);
        assert_eq!(window.quantile(0.5), None);
        assert_eq!(window.span_ns(), 10);
    }

    #[test]
    fn out_of_order_samples_are_kept_sorted() {
        let mut window = SlidingWindow::new(100);
        for t in [50, 10, 30, 30, 20, 60] {
            window.push(t, t as f64);
        }
        let times: Vec<u64> = window.iter().map(|(t, _)| t).collect();
        assert_eq!(times, vec![10, 20, 30, 30, 50, 60]);
        assert_eq!(window.sum(), 200.0);
    }

    #[test]
    fn rate_counts_samples_per_second() {
        let second = 1_000_000_000;
        let mut window = SlidingWindow::new(5 * second);
        // One sample every 100 ms for 10 s: 50 samples in a 5 s window.
        for i in 0..100 {
            window.push(i * second / 10, 1.0);
        }
        let now = 99 * second / 10;
        assert!(close(window.rate_per_sec(now), 10.0));
        // Querying later does not mutate but counts only what is still inside.
        assert!(close(window.rate_per_sec(now + 2_500_000_000), 5.0));
        assert_eq!(window.len(), 50);
        assert_eq!(window.rate_per_sec(now + 6 * second), 0.0);
    }

    #[test]
    fn running_sum_does_not_drift() {
        let mut window = SlidingWindow::new(10);
        window.push(0, 1e20);
        for t in 1..5 {
            window.push(t, 1.0);
        }
        window.expire(10); // drops only the huge sample
        assert_eq!(window.len(), 4);
        assert_eq!(window.sum(), 4.0);

        let mut rng = XorShift::new(5);
        let mut window = SlidingWindow::new(1_000);
        for t in 0..200_000u64 {
            window.push(t, rng.unit() * 1e6 + 0.1);
        }
        let exact: f64 = window.iter().map(|(_, v)| v).sum();
        assert!((window.sum() - exact).abs() < 1e-6, "{} vs {exact}", window.sum());
    }

    #[test]
    #[should_panic(expected = "window span must be positive")]
    fn zero_span_panics() {
        let _ = SlidingWindow::new(0);
    }

    #[test]
    #[should_panic(expected = "quantile must be in [0, 1]")]
    fn quantile_out_of_range_panics() {
        let mut window = SlidingWindow::new(10);
        window.push(1, 1.0);
        let _ = window.quantile(1.5);
    }

    #[test]
    fn weighted_mean_weights_by_recency() {
        let mut window = LinearWeightedWindow::new(10);
        assert_eq!(window.weighted_mean(0), None);
        window.push(0, 10.0);
        assert_eq!(window.weighted_mean(0), Some(10.0));
        window.push(5, 20.0);
        // At t = 5: weights 5/10 and 10/10.
        let expected = (0.5 * 10.0 + 1.0 * 20.0) / 1.5;
        assert!(close(window.weighted_mean(5).unwrap(), expected));
        // At t = 9: weights 1/10 and 6/10; queries do not mutate.
        let expected = (0.1 * 10.0 + 0.6 * 20.0) / 0.7;
        assert!(close(window.weighted_mean(9).unwrap(), expected));
        assert_eq!(window.len(), 2);
        // At t = 10 the first sample has left the window.
        assert_eq!(window.weighted_mean(10), Some(20.0));
        assert_eq!(window.weighted_mean(15), None);
        window.expire(15);
        assert!(window.is_empty());
        assert_eq!(window.span_ns(), 10);
    }

    #[test]
    fn weighted_mean_matches_brute_force() {
        let mut rng = XorShift::new(77);
        let span = 5_000_000_000u64;
        let mut window = LinearWeightedWindow::new(span);
        let mut all: Vec<(u64, f64)> = Vec::new();
        let mut now = 0u64;
        for _ in 0..3_000 {
            now += rng.below(20_000_000);
            let value = rng.unit() * 50.0;
            window.push(now, value);
            all.push((now, value));
            let probe = now + rng.below(span / 2);
            let (num, den) = all
                .iter()
                .filter(|&&(t, _)| probe - t < span)
                .map(|&(t, v)| {
                    let w = (span - (probe - t)) as f64 / span as f64;
                    (w * v, w)
                })
                .fold((0.0, 0.0), |(a, b), (c, d)| (a + c, b + d));
            let got = window.weighted_mean(probe);
            if den > 0.0 {
                assert!(close(got.unwrap(), num / den), "{got:?} vs {}", num / den);
                // A weighted mean lies between the extremes.
                let (lo, hi) = window.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, v)| (lo.min(v), hi.max(v)));
                assert!((lo..=hi).contains(&got.unwrap()));
            } else {
                assert_eq!(got, None);
            }
            assert_eq!(window.iter().count(), window.len());
        }
    }

    #[test]
    fn count_window_matches_brute_force() {
        let mut rng = XorShift::new(9);
        for capacity in [1, 2, 5, 64] {
            let mut window = CountWindow::new(capacity);
            let mut all: Vec<f64> = Vec::new();
            for _ in 0..500 {
                let value = rng.unit() * 10.0 - 2.0;
                window.push(value);
                all.push(value);
                let last = &all[all.len().saturating_sub(capacity)..];
                assert_eq!(window.iter().collect::<Vec<_>>(), last);
                assert_eq!(window.len(), last.len());
                assert_eq!(window.is_full(), last.len() == capacity);
                let mean = last.iter().sum::<f64>() / last.len() as f64;
                let var = last.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / last.len() as f64;
                assert!(close(window.mean().unwrap(), mean));
                assert!(close(window.std_dev().unwrap(), var.sqrt()));
                assert!(close(window.cv().unwrap(), var.sqrt() / mean));
            }
        }
    }

    #[test]
    fn count_window_edge_cases() {
        let mut window = CountWindow::new(3);
        assert_eq!(window.capacity(), 3);
        assert!(window.is_empty());
        assert_eq!((window.mean(), window.std_dev(), window.cv()), (None, None, None));
        window.push(-1.0);
        window.push(1.0);
        assert_eq!(window.mean(), Some(0.0));
        assert_eq!(window.std_dev(), Some(1.0));
        assert_eq!(window.cv(), None); // mean is zero
        for v in [2.0, 2.0, 2.0] {
            window.push(v);
        }
        assert_eq!(window.std_dev(), Some(0.0));
        assert_eq!(window.cv(), Some(0.0));
        assert_eq!(window.iter().rev().collect::<Vec<_>>(), vec![2.0, 2.0, 2.0]);
        window.clear();
        assert!(window.is_empty());
    }

    #[test]
    #[should_panic(expected = "window capacity must be positive")]
    fn zero_capacity_panics() {
        let _ = CountWindow::new(0);
    }
}
