//! A log-bucketed histogram of `u64` values (latencies in nanoseconds), in the style
//! of HDR histograms, with a relative error of at most [`RELATIVE_ERROR`].
//!
//! Layout: values below 256 have a bucket each (exact). Above that, every power of two
//! `[2^e, 2^(e+1))` is split into 128 equal sub-buckets, so a bucket's width is at
//! most 1/128 of its lower bound. A quantile is answered with the midpoint of the
//! bucket that holds it (clamped to the exact minimum and maximum seen), which is
//! within 1/256 (≈ 0.4 %) of every value in that bucket.
//!
//! Buckets are allocated lazily up to the highest one used: recording latencies of up
//! to a minute (6·10¹⁰ ns) takes 3,840 counters (30 KiB); the whole `u64` range
//! takes 7,424. Recording is O(1) and never allocates once the largest value is seen.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two, as a number of bits.
const SUB_BITS: u32 = 7;
/// Sub-buckets per power of two.
const SUB: u64 = 1 << SUB_BITS;

/// Largest relative error of a value reported by [`Histogram::quantile`]: half a
/// bucket's width over the bucket's lower bound.
pub const RELATIVE_ERROR: f64 = 1.0 / (2 * SUB) as f64;

/// Index of the bucket that holds `value`.
fn bucket_of(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let shift = 63 - value.leading_zeros() - SUB_BITS;
    // (shift + 1) * SUB + (mantissa - SUB), where mantissa = value >> shift ∈ [SUB, 2·SUB).
    (u64::from(shift) * SUB + (value >> shift)) as usize
}

/// Lowest and highest value (inclusive) of bucket `index`.
fn bucket_bounds(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < 2 * SUB {
        return (index, index);
    }
    let shift = index / SUB - 1;
    let low = (index - shift * SUB) << shift;
    (low, low + ((1u64 << shift) - 1))
}

/// Midpoint of bucket `index`: the value a quantile in that bucket is reported as.
fn bucket_midpoint(index: usize) -> u64 {
    let (low, high) = bucket_bounds(index);
    low + (high - low) / 2
}

/// A log-bucketed histogram of `u64` values; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Count per bucket, up to the highest bucket used.
    counts: Vec<u64>,
    /// Number of values recorded.
    count: u64,
    /// Exact sum of the values recorded.
    sum: u128,
    /// Smallest value recorded (`u64::MAX` when empty).
    min: u64,
    /// Largest value recorded (0 when empty).
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self { counts: Vec::new(), count: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    /// Record one value.
    pub fn record(&mut self, value: u64) {
        let index = bucket_of(value);
        if index >= self.counts.len() {
            self.counts.resize(index + 1, 0);
        }
        self.counts[index] += 1;
        self.count += 1;
        self.sum += u128::from(value);
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether no value was recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Exact mean of the values recorded (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Exact smallest value recorded (0 when empty).
    pub fn min(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    /// Exact largest value recorded (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `q`-quantile (`q` in [0, 1], clamped) by nearest rank: the smallest value
    /// such that at least `q · count` values are at or below it, within
    /// [`RELATIVE_ERROR`]. `quantile(0.0)` is the exact minimum, `quantile(1.0)` the
    /// exact maximum; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        if q <= 0.0 {
            return self.min;
        }
        if q >= 1.0 {
            return self.max;
        }
        // The small epsilon keeps 0.99 · 100 from rounding up to rank 100.
        let rank = ((q * self.count as f64 - 1e-9).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return self.representative(index);
            }
        }
        self.max
    }

    /// The value reported for bucket `index`: its midpoint within the exact range seen.
    fn representative(&self, index: usize) -> u64 {
        bucket_midpoint(index).clamp(self.min(), self.max)
    }

    /// Add every value recorded in `other` to this histogram.
    pub fn merge(&mut self, other: &Histogram) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.min = self.min.min(other.min);
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Forget every value, keeping the allocated buckets.
    pub fn clear(&mut self) {
        if self.count > 0 {
            self.counts.fill(0);
        }
        *self = Self { counts: std::mem::take(&mut self.counts), ..Self::new() };
    }

    /// How many values are at most `value` (to the histogram's bucket precision: a
    /// bucket counts when the value it reports is at most `value`).
    pub fn count_at_most(&self, value: u64) -> u64 {
        self.counts.iter().enumerate().filter(|(index, _)| self.representative(*index) <= value).map(|(_, &n)| n).sum()
    }

    /// The cumulative distribution: for each non-empty bucket in increasing order, its
    /// reported value and the fraction of all values at or below that bucket. The last
    /// point has fraction 1.
    pub fn cdf(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        let total = self.count as f64;
        let mut seen = 0;
        self.counts.iter().enumerate().filter(|(_, &n)| n > 0).map(move |(index, &n)| {
            seen += n;
            (self.representative(index), seen as f64 / total)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        let mut expected_low = 0;
        for index in 0..bucket_of(u64::MAX) + 1 {
            let (low, high) = bucket_bounds(index);
            assert_eq!(low, expected_low, "bucket {index}");
            assert!(high >= low);
            assert_eq!(bucket_of(low), index);
            assert_eq!(bucket_of(high), index);
            expected_low = high.wrapping_add(1);
        }
        assert_eq!(expected_low, 0, "the last bucket ends at u64::MAX");
        assert_eq!(bucket_of(u64::MAX), 7423);
    }

    #[test]
    fn small_values_are_exact() {
        for v in 0..256 {
            assert_eq!(bucket_bounds(bucket_of(v)), (v, v));
        }
    }

    #[test]
    fn midpoints_are_within_the_relative_error() {
        let mut v: u64 = 1;
        while v < u64::MAX / 3 {
            for probe in [v, v + v / 3, v * 2 - 1] {
                let mid = bucket_midpoint(bucket_of(probe)) as f64;
                let err = (mid - probe as f64).abs() / probe as f64;
                assert!(err <= RELATIVE_ERROR, "value {probe}: reported {mid}, error {err}");
            }
            v = v * 3 / 2 + 1;
        }
        const { assert!(RELATIVE_ERROR <= 0.01) };
    }

    #[test]
    fn hand_computed_quantiles() {
        // 1..=100 ms: p50 = 50 ms, p90 = 90 ms, p99 = 99 ms by nearest rank.
        let mut h = Histogram::new();
        for ms in (1..=100u64).rev() {
            h.record(ms * 1_000_000);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.mean(), 50.5e6);
        assert_eq!(h.min(), 1_000_000);
        assert_eq!(h.max(), 100_000_000);
        for (q, want) in [(0.5, 50e6), (0.9, 90e6), (0.99, 99e6), (0.01, 1e6)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want <= RELATIVE_ERROR, "q {q}: {got} vs {want}");
        }
        assert_eq!(h.quantile(0.0), 1_000_000);
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.quantile(7.0), 100_000_000, "q is clamped");
    }

    #[test]
    fn quantile_of_a_single_value_is_that_value() {
        let mut h = Histogram::new();
        h.record(123_456_789);
        for q in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(h.quantile(q), 123_456_789);
        }
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let h = Histogram::new();
        assert!(h.is_empty());
        assert_eq!((h.count(), h.min(), h.max(), h.quantile(0.5)), (0, 0, 0, 0));
        assert_eq!(h.mean(), 0.0);
        assert_eq!(h.cdf().count(), 0);
        assert_eq!(Histogram::default().min(), 0);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let (mut a, mut b, mut all) = (Histogram::new(), Histogram::default(), Histogram::new());
        for v in [5u64, 70_000, 3_000_000_000] {
            a.record(v);
            all.record(v);
        }
        for v in [1u64, 900, 12_345_678_901] {
            b.record(v);
            all.record(v);
        }
        let mut empty = Histogram::default();
        empty.merge(&a);
        assert_eq!(empty.min(), 5);
        a.merge(&b);
        assert_eq!(a.count(), all.count());
        assert_eq!((a.min(), a.max(), a.mean()), (all.min(), all.max(), all.mean()));
        for q in [0.1, 0.5, 0.9] {
            assert_eq!(a.quantile(q), all.quantile(q));
        }
        assert_eq!(a.cdf().collect::<Vec<_>>(), all.cdf().collect::<Vec<_>>());
    }

    #[test]
    fn clear_forgets_values_but_keeps_working() {
        let mut h = Histogram::new();
        h.record(1_000_000_000);
        h.clear();
        assert!(h.is_empty());
        assert_eq!(h.quantile(0.99), 0);
        h.record(7);
        assert_eq!((h.min(), h.max(), h.quantile(0.5)), (7, 7, 7));
    }

    #[test]
    fn cdf_is_monotone_and_ends_at_one() {
        let mut h = Histogram::new();
        for v in [10u64, 10, 20, 40_000] {
            h.record(v);
        }
        let cdf: Vec<_> = h.cdf().collect();
        assert_eq!(cdf, vec![(10, 0.5), (20, 0.75), (40_000, 1.0)]);
    }
}
