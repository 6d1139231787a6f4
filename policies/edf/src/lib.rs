//! `edf`: earliest deadline first. Each stage keeps its requests ordered by absolute
//! deadline; an idle worker gets the most urgent requests as one batch, as large as
//! the most urgent of them can afford; a request that can no longer finish in time,
//! even alone, is dropped (`deadline-unreachable`) at arrival or when it reaches the
//! head of its queue.
//!
//! Feasibility is judged on the stage at hand only (its profiled batch latency),
//! not on the stages downstream: that refinement is what PARD adds.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use yardmaster_sdk::{Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId, WorkerId};

/// Earliest deadline first, dropping what cannot finish.
#[derive(Debug, Default)]
pub struct Edf {
    /// Per stage: (deadline, id), earliest first.
    queues: Vec<BinaryHeap<Reverse<(Instant, RequestId)>>>,
    /// Requests the host ended while they were queued (removed lazily).
    ended: HashSet<RequestId>,
    /// Per stage: latency of a batch of one on its fastest variant.
    fastest_single: Vec<u64>,
}

impl Edf {
    fn queue(&mut self, stage: u32) -> &mut BinaryHeap<Reverse<(Instant, RequestId)>> {
        let index = stage as usize;
        if self.queues.len() <= index {
            self.queues.resize_with(index + 1, BinaryHeap::new);
        }
        &mut self.queues[index]
    }

    /// Form the next batch for `worker` from `stage`'s queue, dropping heads that
    /// cannot finish; returns the batch (possibly empty).
    fn form_batch(&mut self, ctx: &mut Ctx, stage: u32, worker: WorkerId) -> Vec<RequestId> {
        let now = ctx.now();
        let limit = ctx.batch_limit(stage) as usize;
        // Iteration workers keep running their resident sequences first. The batch is
        // sized for what it can hold up front: growing it reallocates and copies, and
        // inside a component that is the allocator's work and a bulk copy each time.
        let resident = ctx.resident(worker);
        let mut batch: Vec<RequestId> = Vec::with_capacity(limit.min(resident.len() + self.queues[stage as usize].len()));
        batch.extend(resident.iter().take(limit).map(|s| s.id));
        let mut binding_deadline = Instant::MAX;
        while batch.len() < limit {
            let Some(&Reverse((deadline, id))) = self.queues[stage as usize].peek() else { break };
            if !self.ended.is_empty() && self.ended.remove(&id) {
                self.queues[stage as usize].pop();
                continue;
            }
            let size = batch.len() as u32 + 1;
            let finish = now.saturating_add(ctx.batch_latency(worker, size));
            if binding_deadline == Instant::MAX && finish > deadline {
                // Cannot finish even alone: drop it and look at the next one.
                self.queues[stage as usize].pop();
                ctx.drop_request(id, DropReason::DeadlineUnreachable);
                continue;
            }
            // The earliest deadline in the batch is binding: growing the batch must not
            // make it late.
            if finish > binding_deadline.min(deadline) {
                break;
            }
            binding_deadline = binding_deadline.min(deadline);
            self.queues[stage as usize].pop();
            batch.push(id);
        }
        batch
    }
}

impl Policy for Edf {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let mut fastest_single = Vec::new();
        for stage in &ctx.config().stages {
            let index = stage.id as usize;
            if fastest_single.len() <= index {
                fastest_single.resize(index + 1, 0);
            }
            fastest_single[index] = stage.variants.iter().filter_map(|v| ctx.latency().mean(stage.id, v.id, 1)).min().unwrap_or(0);
        }
        Ok(Self { fastest_single, ..Self::default() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        let fastest = self.fastest_single.get(request.stage as usize).copied().unwrap_or(0);
        if ctx.now().saturating_add(fastest) > request.deadline {
            ctx.drop_request(request.id, DropReason::DeadlineUnreachable);
            return;
        }
        self.queue(request.stage).push(Reverse((request.deadline, request.id)));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.ended.insert(request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        for stage in 0..self.queues.len() as u32 {
            // A dispatch makes its worker busy, so this walks the idle workers in turn.
            loop {
                let next = ctx.idle_workers(stage).next();
                let Some(worker) = next else { break };
                let batch = self.form_batch(ctx, stage, worker);
                if batch.is_empty() {
                    break;
                }
                ctx.dispatch(worker, batch);
            }
        }
    }
}

yardmaster_sdk::export_policy!(Edf);
