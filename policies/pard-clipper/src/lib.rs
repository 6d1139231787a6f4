//! `pard-clipper`: the Clipper++ baseline of the PARD paper — reactive dropping
//! against a fixed per-module share of the SLO.
//!
//! The SLO is split in proportion to the modules' profiled batch durations along the
//! longest path through each module (`SLO_k = SLO · d_k(b_k) / Σ_{i∈P} d_i(b_i)`).
//! Queues are first come, first served; a request taken out of the queue is dropped
//! when it has already used up its module's share before inference (`t_e − t_r >
//! SLO_k`, its own execution not counted), so requests that end up late still run to
//! the end. Batching, dispatch and planning are the ones PARD uses.

use yardmaster_sdk::helpers::{BrokeredPipeline, Discipline, FifoQueue, FillContext, Filled, NexusPlan, PipelineRule, Queued, StageGraph};
use yardmaster_sdk::{Ctx, DropReason, StageId};

/// Clipper++'s proportional split and local drop rule.
#[derive(Debug, Clone, Default)]
pub struct ClipperRule {
    /// Each module's share of the end-to-end SLO.
    shares: Vec<f64>,
}

impl ClipperRule {
    /// The rule for a graph whose modules take `durations` (ns) per batch.
    pub fn new(graph: &StageGraph, durations: &[f64]) -> Self {
        Self { shares: graph.proportional_shares(|k| durations[k as usize]) }
    }

    /// A module's share of the SLO.
    pub fn share(&self, stage: StageId) -> f64 {
        self.shares.get(stage as usize).copied().unwrap_or(1.0)
    }

    /// Whether `request` has used up its budget at `stage` by `expected_start`.
    pub fn over_budget(&self, request: &Queued, stage: StageId, expected_start: u64) -> bool {
        let slo = request.deadline.saturating_sub(request.sent_at) as f64;
        expected_start.saturating_sub(request.arrived_at) as f64 > self.share(stage) * slo
    }
}

impl Discipline<FifoQueue> for ClipperRule {
    fn fill(&mut self, _ctx: &Ctx, queue: &mut FifoQueue, fill: &FillContext, out: &mut Filled) {
        while out.admit.len() < fill.room {
            let Some(request) = queue.pop_front() else { break };
            if self.over_budget(&request, fill.stage, fill.expected_start) {
                out.drop.push((request, DropReason::DeadlineUnreachable));
            } else {
                out.admit.push(request);
            }
        }
    }
}

impl PipelineRule for ClipperRule {
    type Queue = FifoQueue;

    fn init(ctx: &mut Ctx, graph: &StageGraph, plan: &NexusPlan) -> Result<Self, String> {
        let durations: Vec<f64> =
            (0..graph.len()).map(|k| ctx.latency().mean(k as StageId, 0, plan.batch[k]).unwrap_or(0) as f64).collect();
        Ok(Self::new(graph, &durations))
    }
}

/// Clipper++ as a policy.
pub type PardClipper = BrokeredPipeline<ClipperRule>;

yardmaster_sdk::export_policy!(PardClipper);

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn budgets_are_proportional_and_the_check_is_local() {
        let rule = ClipperRule::new(&StageGraph::chain(3), &[60e6, 20e6, 20e6]);
        assert_eq!(rule.share(0), 0.6);
        assert_eq!(rule.share(1), 0.2);
        // SLO 400 ms: module 1 may spend 80 ms before inference.
        let request = Queued { id: 1, stage: 1, sent_at: 0, arrived_at: 100 * MS, deadline: 400 * MS, key: 0 };
        assert!(!rule.over_budget(&request, 1, 180 * MS));
        assert!(rule.over_budget(&request, 1, 181 * MS));
        // Time spent upstream does not count: a request sent long ago still passes.
        let old = Queued { sent_at: 0, arrived_at: 390 * MS, ..request };
        assert!(!rule.over_budget(&old, 1, 400 * MS));
    }
}
