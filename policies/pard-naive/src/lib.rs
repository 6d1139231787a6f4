//! `pard-naive`: the naive baseline of the PARD paper. Requests are served first come,
//! first served at every module, in batches formed exactly as PARD forms them (per
//! worker, round-robin dispatch, the shared Nexus-style planner); nothing is ever
//! dropped, so requests that finish after their deadline count as dropped (late).

use yardmaster_sdk::helpers::{BrokeredPipeline, Discipline, FifoQueue, FillContext, Filled, NexusPlan, PipelineRule, StageGraph};
use yardmaster_sdk::Ctx;

/// First come, first served; never drops.
#[derive(Debug, Clone, Default)]
pub struct NaiveRule;

impl Discipline<FifoQueue> for NaiveRule {
    fn fill(&mut self, _ctx: &Ctx, queue: &mut FifoQueue, fill: &FillContext, out: &mut Filled) {
        while out.admit.len() < fill.room {
            let Some(request) = queue.pop_front() else { break };
            out.admit.push(request);
        }
    }
}

impl PipelineRule for NaiveRule {
    type Queue = FifoQueue;

    fn init(_ctx: &mut Ctx, _graph: &StageGraph, _plan: &NexusPlan) -> Result<Self, String> {
        Ok(Self)
    }
}

/// The naive baseline as a policy.
pub type PardNaive = BrokeredPipeline<NaiveRule>;

yardmaster_sdk::export_policy!(PardNaive);

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_sdk::helpers::{Queued, WorkerQueue};

    #[test]
    fn admits_in_arrival_order_and_never_drops() {
        let mut queue = FifoQueue::default();
        for (id, at) in [(3, 30), (1, 10), (2, 20)] {
            queue.push(Queued { id, stage: 0, sent_at: 0, arrived_at: at, deadline: 1, key: 1 });
        }
        let fill = FillContext { worker: 0, stage: 0, room: 2, open: 0, expected_start: 1_000, now: 1_000 };
        let mut out = Filled::default();
        let ctx = Ctx::new(
            yardmaster_sdk::Config {
                arm: String::new(),
                stages: vec![],
                workers: vec![],
                streams: vec![],
                params: vec![],
                tick_interval: 1,
                max_workers: 1,
                seed: 0,
                now: 0,
                hosts: Vec::new(),
            },
            Box::new(yardmaster_sdk::NullHost::default()),
        );
        NaiveRule.fill(&ctx, &mut queue, &fill, &mut out);
        assert_eq!(out.admit.iter().map(|q| q.id).collect::<Vec<_>>(), vec![1, 2]);
        assert!(out.drop.is_empty());
    }
}
