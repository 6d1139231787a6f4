//! `fifo`: the naive policy. Requests run in arrival order per stage, in batches as
//! large as the stage allows, on whichever worker is idle; nothing is ever dropped.
//!
//! It is also the host's built-in fallback: when an arm's policy traps or overruns
//! its budget under `fail-open`, the host replays the queued requests into `fifo`.

use std::collections::{HashSet, VecDeque};

use yardmaster_sdk::{Ctx, EndReason, Policy, Request, RequestId};

/// First in, first out, never drops.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Queued request ids per stage, oldest first.
    queues: Vec<VecDeque<RequestId>>,
    /// Requests the host ended while they were queued (removed lazily).
    ended: HashSet<RequestId>,
}

impl Fifo {
    /// Requests waiting, over all stages.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum::<usize>() - self.ended.len()
    }

    fn queue(&mut self, stage: u32) -> &mut VecDeque<RequestId> {
        let index = stage as usize;
        if self.queues.len() <= index {
            self.queues.resize_with(index + 1, VecDeque::new);
        }
        &mut self.queues[index]
    }
}

impl Policy for Fifo {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.queue(request.stage).push_back(request.id);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.ended.insert(request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        for stage in 0..self.queues.len() as u32 {
            let limit = ctx.batch_limit(stage) as usize;
            // A dispatch makes its worker busy, so this walks the idle workers in turn.
            loop {
                let next = ctx.idle_workers(stage).next();
                let Some(worker) = next else { break };
                // Iteration workers keep running their resident sequences first.
                let mut batch: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|s| s.id).collect();
                let queue = &mut self.queues[stage as usize];
                while batch.len() < limit {
                    let Some(id) = queue.pop_front() else { break };
                    if self.ended.is_empty() || !self.ended.remove(&id) {
                        batch.push(id);
                    }
                }
                if batch.is_empty() {
                    break;
                }
                ctx.dispatch(worker, batch);
            }
        }
    }
}

yardmaster_sdk::export_policy!(Fifo);
