//! How much time a request must have left when it is taken out of a stage's queue, from
//! the batches the stages actually run (`measured_batches`, on by default; issue 43).
//!
//! QUART drops a request taken out of its queue with less left than its own batch plus
//! `downstream_reserve` (2) batches of every later stage on the longest downstream
//! path — a wait for a batch and the batch itself — scaled down so that no path asks
//! for more than the SLO ([`crate::unreachable_slack`]). Counted at every stage's batch
//! limit, that is what a request needs under overload, when every batch is full. Below
//! capacity the batches are small and the reserve is far more than a request needs:
//! on `r18-mid-fan-join` (SLO 171 ms) a request had to leave the entry stage with
//! 170 ms left, and QUART dropped 2.2 % there at a quarter of the bound while the
//! requests it served took 58 ms at the median. [`BatchSizes`] keeps a moving average
//! of each stage's batch size, and the slack counts each stage's batch at that size:
//! the same reserve as before past capacity, where the batches are full, and a smaller
//! one below it.

use yardmaster_sdk::helpers::StageGraph;
use yardmaster_sdk::{Ctx, Duration, Instant, StageId};

/// Weight of one batch in a stage's moving average of batch sizes.
pub const ALPHA: f64 = 0.05;

/// How often the slack is recomputed from the measured sizes.
pub const PERIOD: Duration = 50_000_000;

/// Per stage, the least time a request must have left when it is taken out of the
/// stage's queue: its own batch plus `factor` batches for every later stage on the
/// longest downstream path, scaled down so that no path asks for more than the
/// tightest SLO ([`StageGraph::downstream_reserve`]); a stage's batch takes its profiled
/// time at `size(stage)` requests (interpolated between whole sizes, at least 1, at
/// most the stage's batch limit).
pub fn slack(ctx: &Ctx, factor: f64, size: impl Fn(StageId) -> f64) -> Vec<Duration> {
    let config = ctx.config();
    let graph = StageGraph::new(&config.stages);
    let batch = |s: StageId| -> f64 {
        let limit = ctx.batch_limit(s).max(1);
        let size = size(s).clamp(1.0, limit as f64);
        let below = size.floor() as u32;
        let at = |b: u32| ctx.latency().mean(s, 0, b.clamp(1, limit)).unwrap_or(0) as f64;
        let (low, high) = (at(below), at(below + 1));
        low + (size - below as f64) * (high - low)
    };
    let budget = config.streams.iter().map(|s| s.slo).filter(|&slo| slo > 0).min().map_or(f64::INFINITY, |slo| slo as f64);
    let reserve = graph.downstream_reserve(|s| factor * batch(s), budget);
    reserve.iter().enumerate().map(|(s, r)| (batch(s as StageId) + r) as Duration).collect()
}

/// Share of the pieces taken out of the queues that were dropped as unreachable (a
/// moving share over about half a second) above which the pipeline is past capacity and
/// the batches count at their limits.
pub const OVERLOAD_SHARE: f64 = 0.05;

/// Weight each recomputation keeps of the previous drop and completion counts.
const DECAY: f64 = 0.9;

/// A moving average of the batch size each stage runs, and when the slack is due to be
/// recomputed from it.
///
/// Past capacity the stages below a saturated one run small batches too, but they
/// receive the saturated stage's batches in bursts: counted at the measured sizes, the
/// reserve let requests through that then finished late (`r13-src-diamond` at 2×:
/// 0.67 of the bound against 0.75). While more than [`OVERLOAD_SHARE`] of the pieces
/// are dropped as unreachable the batches count at their limits, as before.
#[derive(Debug, Clone)]
pub struct BatchSizes {
    sizes: Vec<f64>,
    limits: Vec<f64>,
    next: Instant,
    /// Decayed counts of pieces dropped and pieces served.
    dropped: f64,
    served: f64,
    /// The queues' count of drops at the previous recomputation.
    dropped_before: u64,
}

impl BatchSizes {
    /// Every stage's average starting at its batch limit (the slack starts where the
    /// static one is), first recomputed at `now`.
    pub fn new(ctx: &Ctx, stages: usize, now: Instant) -> Self {
        let limits: Vec<f64> = (0..stages).map(|s| ctx.batch_limit(s as StageId).max(1) as f64).collect();
        Self { sizes: limits.clone(), limits, next: now, dropped: 0.0, served: 0.0, dropped_before: 0 }
    }

    /// A batch of `size` requests finished at `stage`.
    pub fn record(&mut self, stage: StageId, size: usize) {
        if let Some(average) = self.sizes.get_mut(stage as usize) {
            *average += ALPHA * (size as f64 - *average);
        }
        self.served += size as f64;
    }

    /// Whether more than [`OVERLOAD_SHARE`] of the pieces were dropped lately.
    pub fn overloaded(&self) -> bool {
        self.dropped > OVERLOAD_SHARE * (self.dropped + self.served)
    }

    /// The batch size `stage` counts with: its average, or its limit while
    /// [`Self::overloaded`] (1 for a stage it does not know).
    pub fn size(&self, stage: StageId) -> f64 {
        let sizes = if self.overloaded() { &self.limits } else { &self.sizes };
        sizes.get(stage as usize).copied().unwrap_or(1.0)
    }

    /// Whether the slack is due at `now`, given the queues' count of drops so far; if
    /// so, the next one is [`PERIOD`] later and the drop and service counts decay.
    pub fn due(&mut self, now: Instant, dropped: u64) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + PERIOD;
        self.dropped = DECAY * self.dropped + dropped.saturating_sub(self.dropped_before) as f64;
        self.served *= DECAY;
        self.dropped_before = dropped;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_moves_toward_the_sizes_run() {
        let config = yardmaster_sdk::testing::one_stage(vec![yardmaster_sdk::testing::constant_variant(1_000_000)], 1, 1);
        let ctx = Ctx::new(config, Box::new(yardmaster_sdk::NullHost::default()));
        let mut sizes = BatchSizes::new(&ctx, 1, 0);
        let start = sizes.size(0);
        for _ in 0..200 {
            sizes.record(0, 1);
        }
        assert!((sizes.size(0) - 1.0).abs() < 0.01 * start.max(1.0), "{} from {start}", sizes.size(0));
        assert!(sizes.due(0, 0) && !sizes.due(PERIOD - 1, 0) && sizes.due(PERIOD, 0));
        assert!(!sizes.overloaded());
        // 20 drops against 200 served: past capacity, the limits count again.
        assert!(sizes.due(2 * PERIOD, 20) && sizes.overloaded());
        assert_eq!(sizes.size(0), start);
    }
}
