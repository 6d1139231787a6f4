//! Batch latency look-ups from the profiles in the policy's configuration.

use crate::{Config, Duration, LatencyPoint, StageId, VariantId};

/// Profiled batch latencies of every (stage, variant), with linear interpolation
/// between profiled batch sizes and linear extrapolation past the largest one.
///
/// Mean latencies of every batch size up to the stage's `max-batch` are computed once,
/// so the common look-up is an index.
#[derive(Debug, Clone, Default)]
pub struct LatencyTable {
    /// `profiles[stage][variant]`, each sorted by batch size.
    profiles: Vec<Vec<Vec<LatencyPoint>>>,
    /// `dense[stage][variant][batch - 1]`: mean latency for batch sizes 1..=max-batch.
    dense: Vec<Vec<Vec<Duration>>>,
}

impl LatencyTable {
    /// Index the profiles of a configuration.
    pub fn from_config(config: &Config) -> Self {
        let mut profiles: Vec<Vec<Vec<LatencyPoint>>> = Vec::new();
        for stage in &config.stages {
            let index = stage.id as usize;
            if profiles.len() <= index {
                profiles.resize(index + 1, Vec::new());
            }
            let mut variants = Vec::new();
            for variant in &stage.variants {
                let v = variant.id as usize;
                if variants.len() <= v {
                    variants.resize(v + 1, Vec::new());
                }
                let mut points = variant.profile.clone();
                points.sort_by_key(|p| p.batch);
                variants[v] = points;
            }
            profiles[index] = variants;
        }
        let mut table = Self { profiles, dense: Vec::new() };
        table.dense = config
            .stages
            .iter()
            .map(|stage| {
                (0..table.profiles.get(stage.id as usize).map_or(0, Vec::len) as u32)
                    .map(|variant| (1..=stage.max_batch).map_while(|b| table.lookup(stage.id, variant, b, |p| p.mean)).collect())
                    .collect()
            })
            .collect();
        // `dense` is indexed by stage id; keep it aligned with `profiles`.
        let mut aligned = vec![Vec::new(); table.profiles.len()];
        for (stage, dense) in config.stages.iter().zip(std::mem::take(&mut table.dense)) {
            aligned[stage.id as usize] = dense;
        }
        table.dense = aligned;
        table
    }

    /// Mean latency of a batch of `batch` requests, or `None` without a profile.
    pub fn mean(&self, stage: StageId, variant: VariantId, batch: u32) -> Option<Duration> {
        let dense = self.dense.get(stage as usize).and_then(|s| s.get(variant as usize));
        match dense.and_then(|d| d.get(batch.max(1) as usize - 1)) {
            Some(latency) => Some(*latency),
            None => self.lookup(stage, variant, batch, |p| p.mean),
        }
    }

    /// Tail latency of a batch of `batch` requests, or `None` without a profile.
    pub fn tail(&self, stage: StageId, variant: VariantId, batch: u32) -> Option<Duration> {
        self.lookup(stage, variant, batch, |p| p.tail)
    }

    /// The largest batch size whose mean latency is at most `budget` (0 if none fits).
    pub fn largest_batch_within(&self, stage: StageId, variant: VariantId, budget: Duration, limit: u32) -> u32 {
        let mut best = 0;
        for batch in 1..=limit {
            match self.mean(stage, variant, batch) {
                Some(latency) if latency <= budget => best = batch,
                _ => break,
            }
        }
        best
    }

    /// The batch of at most `limit` requests, taking at most `budget`, that serves the
    /// most requests per second (see [`most_productive_batch`]; 0 when none fits).
    pub fn most_productive_batch_within(&self, stage: StageId, variant: VariantId, budget: Duration, limit: u32) -> u32 {
        let fits = self.largest_batch_within(stage, variant, budget, limit);
        most_productive_batch(fits, |b| self.mean(stage, variant, b).unwrap_or(Duration::MAX))
    }

    fn lookup(&self, stage: StageId, variant: VariantId, batch: u32, value: impl Fn(&LatencyPoint) -> Duration) -> Option<Duration> {
        let points = self.profiles.get(stage as usize)?.get(variant as usize)?;
        interpolate(points, batch, |p| p.batch, value)
    }
}

/// Among batches of 1 to `fits` requests taking `latency(b)` each, the one that
/// serves the most requests per second — the smaller on a tie, 0 when `fits` is 0.
/// Where throughput grows with the batch that is `fits` itself; on a profile with a
/// sweet spot (a larger batch serving fewer per second) it is the sweet spot.
pub fn most_productive_batch(fits: u32, latency: impl Fn(u32) -> Duration) -> u32 {
    // b₁/l₁ against b₂/l₂ compared as b₂·l₁ against b₁·l₂: exact in integers.
    let served = |b: u32| (b as u128, latency(b).max(1) as u128);
    (1..=fits).fold(0, |best, b| {
        if best == 0 {
            return b;
        }
        let ((b1, l1), (b2, l2)) = (served(best), served(b));
        if b2 * l1 > b1 * l2 {
            b
        } else {
            best
        }
    })
}

/// A profiled value at `batch` from points sorted by batch size: linear between the
/// points around it, linear from the last two past the end, the first point's value
/// below the start and the only point's value when there is one. `None` without points.
///
/// This is the one interpolation rule of Yardmaster: the host's profiles and the
/// simulator use it too.
pub fn interpolate<P>(points: &[P], batch: u32, batch_of: impl Fn(&P) -> u32, value: impl Fn(&P) -> Duration) -> Option<Duration> {
    let batch = batch.max(1);
    let first = points.first()?;
    if points.len() == 1 || batch <= batch_of(first) {
        return Some(value(first));
    }
    // Find the segment [lo, hi] around `batch` (or the last segment to extrapolate).
    let upper = points.partition_point(|p| batch_of(p) < batch).clamp(1, points.len() - 1);
    let (lo, hi) = (&points[upper - 1], &points[upper]);
    if batch == batch_of(hi) {
        return Some(value(hi));
    }
    let (lo_batch, hi_batch) = (batch_of(lo) as f64, batch_of(hi) as f64);
    let slope = (value(hi) as f64 - value(lo) as f64) / (hi_batch - lo_batch);
    let estimate = value(lo) as f64 + slope * (batch as f64 - lo_batch);
    Some(estimate.max(0.0).round() as Duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{constant_variant, one_stage};
    use crate::{DeviceKind, Variant};

    fn config(points: &[(u32, u64)]) -> Config {
        let profile = points.iter().map(|&(batch, mean)| LatencyPoint { batch, mean, tail: mean * 2 }).collect();
        let mut config = one_stage(vec![Variant { profile, ..constant_variant(0) }], 32, 1);
        config.workers[0].device = DeviceKind::Cpu;
        config
    }

    #[test]
    fn interpolates_and_extrapolates() {
        let table = LatencyTable::from_config(&config(&[(1, 10), (4, 40), (8, 60)]));
        assert_eq!(table.mean(0, 0, 1), Some(10));
        assert_eq!(table.mean(0, 0, 2), Some(20));
        assert_eq!(table.mean(0, 0, 4), Some(40));
        assert_eq!(table.mean(0, 0, 6), Some(50));
        assert_eq!(table.mean(0, 0, 16), Some(100));
        assert_eq!(table.tail(0, 0, 2), Some(40));
        assert_eq!(table.mean(1, 0, 1), None);
        assert_eq!(table.mean(0, 3, 1), None);
    }

    #[test]
    fn largest_batch_within_budget() {
        let table = LatencyTable::from_config(&config(&[(1, 10), (8, 80)]));
        assert_eq!(table.largest_batch_within(0, 0, 35, 32), 3);
        assert_eq!(table.largest_batch_within(0, 0, 5, 32), 0);
        assert_eq!(table.largest_batch_within(0, 0, 10_000, 16), 16);
    }
}
