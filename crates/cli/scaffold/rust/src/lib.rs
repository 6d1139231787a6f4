//! `{{name}}`: earliest deadline first, written with the Yardmaster SDK.
//!
//! - Each stage keeps its waiting requests ordered by (deadline, id).
//! - A request that cannot finish even alone on the stage's fastest variant is dropped
//!   when it arrives (`deadline-unreachable`); so is a queue head that cannot finish
//!   alone on the worker about to take it.
//! - Once per call, every idle worker (lowest id first) gets its resident LLM
//!   sequences, then the most urgent requests, as many as keep the earliest deadline in
//!   the batch reachable.
//!
//! The SDK calls one method per event (`on_arrival`, `on_worker_idle`, …) and then
//! `on_events_done` once per delivered batch of events; `Ctx` keeps track of the
//! cluster (idle workers, profiles, resident sequences) and collects the actions.

use std::collections::{BTreeSet, HashMap};

use yardmaster_sdk::{Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId, StageId, WorkerId};

/// What the policy knows about one stage.
#[derive(Debug)]
struct StageQueue {
    id: StageId,
    /// Latency of a batch of one on the stage's fastest variant.
    fastest_single: u64,
    /// Waiting requests, most urgent first.
    queue: BTreeSet<(Instant, RequestId)>,
}

/// Earliest deadline first, dropping what cannot finish.
#[derive(Debug)]
pub struct DeadlineFirst {
    /// Stages in configuration order.
    stages: Vec<StageQueue>,
    /// Stage id → index into `stages`.
    index: HashMap<StageId, usize>,
    /// Queued request → (stage index, deadline), to forget it when the host ends it.
    queued: HashMap<RequestId, (usize, Instant)>,
}

impl DeadlineFirst {
    /// The next batch for `worker` of stage `s`: its resident sequences, then queue
    /// heads while the earliest deadline in the batch stays reachable; heads that cannot
    /// finish even alone are dropped on the way.
    fn form_batch(&mut self, ctx: &mut Ctx, s: usize, worker: WorkerId) -> Vec<RequestId> {
        let now = ctx.now();
        let limit = ctx.batch_limit(self.stages[s].id) as usize;
        let mut batch: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|q| q.id).collect();
        let mut binding: Option<Instant> = None;
        while batch.len() < limit {
            let Some(&(deadline, id)) = self.stages[s].queue.first() else { break };
            let finish = now.saturating_add(ctx.batch_latency(worker, batch.len() as u32 + 1));
            if binding.is_none() && finish > deadline {
                self.unqueue(s, deadline, id);
                ctx.drop_request(id, DropReason::DeadlineUnreachable);
                continue;
            }
            let earliest = binding.map_or(deadline, |b| b.min(deadline));
            if finish > earliest {
                break;
            }
            binding = Some(earliest);
            self.unqueue(s, deadline, id);
            batch.push(id);
        }
        batch
    }

    fn unqueue(&mut self, s: usize, deadline: Instant, id: RequestId) {
        self.stages[s].queue.remove(&(deadline, id));
        self.queued.remove(&id);
    }
}

impl Policy for DeadlineFirst {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let mut stages = Vec::new();
        let mut index = HashMap::new();
        for stage in &ctx.config().stages {
            let fastest_single = stage.variants.iter().filter_map(|v| ctx.latency().mean(stage.id, v.id, 1)).min().unwrap_or(0);
            index.insert(stage.id, stages.len());
            stages.push(StageQueue { id: stage.id, fastest_single, queue: BTreeSet::new() });
        }
        Ok(Self { stages, index, queued: HashMap::new() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        let Some(&s) = self.index.get(&request.stage) else {
            ctx.drop_request(request.id, DropReason::Policy);
            return;
        };
        if ctx.now().saturating_add(self.stages[s].fastest_single) > request.deadline {
            ctx.drop_request(request.id, DropReason::DeadlineUnreachable);
            return;
        }
        self.stages[s].queue.insert((request.deadline, request.id));
        self.queued.insert(request.id, (s, request.deadline));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        if let Some((s, deadline)) = self.queued.remove(&request) {
            self.stages[s].queue.remove(&(deadline, request));
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        for s in 0..self.stages.len() {
            let stage = self.stages[s].id;
            loop {
                let Some(worker) = ctx.idle_workers(stage).next() else { break };
                let batch = self.form_batch(ctx, s, worker);
                if batch.is_empty() {
                    break;
                }
                ctx.dispatch(worker, batch);
            }
        }
    }
}

yardmaster_sdk::export_policy!(DeadlineFirst);

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_sdk::testing::{dispatches, linear_variant, one_stage, request, MS};
    use yardmaster_sdk::{Action, Driver, Event, NullHost};

    /// One stage, batches of up to 4 taking 10 ms + 2 ms per request, two workers.
    fn start() -> Driver<DeadlineFirst> {
        let config = one_stage(vec![linear_variant(0, "v", 2 * MS, 10 * MS, 4)], 4, 2);
        Driver::new(config, Box::new(NullHost::new(0, 1))).expect("init").0
    }

    #[test]
    fn the_most_urgent_requests_go_first() {
        let mut driver = start();
        let arrivals = vec![
            Event::Arrival(request(1, 0, 0, 100 * MS)),
            Event::Arrival(request(2, 0, 0, 50 * MS)),
            Event::Arrival(request(3, 0, 0, 80 * MS)),
        ];
        assert!(driver.handle(0, arrivals).is_empty(), "no worker is idle yet");
        let actions = driver.handle(MS, vec![Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), vec![(0, vec![2, 3, 1])]);
    }

    #[test]
    fn what_cannot_finish_is_dropped() {
        let mut driver = start();
        // Even alone a batch takes 12 ms: a 5 ms deadline cannot be met.
        let actions = driver.handle(0, vec![Event::Arrival(request(1, 0, 0, 5 * MS))]);
        assert!(matches!(&actions[..], [Action::Drop(d)] if d.request == 1 && d.reason == DropReason::DeadlineUnreachable));
    }
}
