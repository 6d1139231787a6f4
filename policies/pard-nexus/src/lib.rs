//! `pard-nexus`: the Nexus baseline of the PARD paper — reactive dropping with a
//! sliding window, in arrival order.
//!
//! When a worker's open batch collects with `need` free places and expected start
//! t_e, Nexus looks for the earliest window of `need` consecutive queued requests
//! (or up to the end of the queue) that would all finish the *current* module in time
//! (`t_e + d_k(b_k) ≤ D_r`, the end-to-end deadline: later modules are never
//! considered), drops every request before that window — even those that would pass
//! on their own — and admits the window. If no window passes, the whole queue is
//! dropped. Batching, dispatch and planning are the ones PARD uses.

use yardmaster_sdk::helpers::{BrokeredPipeline, Discipline, FifoQueue, FillContext, Filled, NexusPlan, PipelineRule, StageGraph};
use yardmaster_sdk::{Ctx, DropReason};

/// The start of the earliest window of `need` consecutive passing requests (a
/// shorter window may end at the queue's end); the number of requests when every
/// window fails, i.e. everything is to be dropped. It reads `passes` only up to the
/// end of the first passing window, so a decision costs the dropped prefix and the
/// window, not the whole queue.
pub fn window_start(passes: impl IntoIterator<Item = bool>, need: usize) -> usize {
    let need = need.max(1);
    let mut start = 0;
    for (i, ok) in passes.into_iter().enumerate() {
        if !ok {
            start = i + 1;
        } else if i + 1 - start >= need {
            return start;
        }
    }
    start
}

/// Nexus's sliding-window drop rule.
#[derive(Debug, Clone, Default)]
pub struct NexusRule;

impl Discipline<FifoQueue> for NexusRule {
    fn fill(&mut self, ctx: &Ctx, queue: &mut FifoQueue, fill: &FillContext, out: &mut Filled) {
        let duration = ctx.latency().mean(fill.stage, 0, ctx.batch_limit(fill.stage)).unwrap_or(0);
        let finish = fill.expected_start + duration;
        let start = window_start(queue.iter().map(|q| finish <= q.deadline), fill.room);
        for _ in 0..start {
            let late = queue.pop_front().expect("within the queue");
            out.drop.push((late, DropReason::DeadlineUnreachable));
        }
        while out.admit.len() < fill.room {
            let Some(request) = queue.pop_front() else { break };
            out.admit.push(request);
        }
    }
}

impl PipelineRule for NexusRule {
    type Queue = FifoQueue;

    fn init(_ctx: &mut Ctx, _graph: &StageGraph, _plan: &NexusPlan) -> Result<Self, String> {
        Ok(Self)
    }
}

/// Nexus as a policy.
pub type PardNexus = BrokeredPipeline<NexusRule>;

yardmaster_sdk::export_policy!(PardNexus);

#[cfg(test)]
mod tests {
    use super::*;

    /// Property 13: deadlines [late, ok, late, ok, ok, ok] with need = 3: drop the
    /// first three and admit the last three; if every window fails, drop all.
    #[test]
    fn sliding_window_drops_the_prefix_before_the_first_passing_window() {
        let (late, ok) = (false, true);
        assert_eq!(window_start([late, ok, late, ok, ok, ok], 3), 3);
        assert_eq!(window_start([late, ok, late, ok, ok, late], 3), 6, "every window fails");
        assert_eq!(window_start([ok, ok], 3), 0, "a short queue is one window");
        assert_eq!(window_start([late, ok], 3), 1, "a window may end at the queue's end");
        assert_eq!(window_start([], 3), 0);
        assert_eq!(window_start([ok, late, ok, ok], 1), 0);
    }
}
