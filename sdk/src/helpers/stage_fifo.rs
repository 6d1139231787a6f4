//! Per-stage first-in-first-out queues for policies whose request path is trivial
//! (autoscalers such as QUART and its baselines): requests wait at their stage in
//! arrival order, each idle worker takes the oldest ones (up to the stage's batch
//! limit), nothing is dropped — unless the policy asks ([`StageFifo::drop_unreachable`])
//! to drop, when it takes them out, the requests that can no longer finish in time.
//! Besides dispatching, the queues measure what such
//! policies plan with: the time-averaged queue length of each stage and the sojourn
//! time (wait plus service) of each request that finishes a stage.
//!
//! Every operation costs the same however long the queues grow: the bookkeeping by
//! request id is ordered (B-trees), whose inserts cost a logarithm of the queue at
//! worst. A hash map grows by rehashing every entry in one insert: past capacity,
//! where a policy that never drops keeps every request (QUART's baselines hold five
//! seconds of arrivals until the host expires them), one event call then rehashed
//! hundreds of thousands of ids and ran out of its fuel (issue 43).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::{BatchOutcome, Ctx, Duration, Instant, Request, RequestId, StageId, WorkerId};

/// The time integral of one stage's queue length since the last reading.
#[derive(Clone, Debug, Default)]
struct QueueArea {
    since: Instant,
    last_change: Instant,
    integral: f64,
}

/// FIFO queues, one per stage, with queue-length and sojourn-time measurement.
#[derive(Clone, Debug, Default)]
pub struct StageFifo {
    /// Per stage: (request, arrived at the stage, deadline), oldest first; may hold
    /// ended ids.
    queues: Vec<VecDeque<(RequestId, Instant, Instant)>>,
    /// Per stage: requests waiting that have not ended.
    live: Vec<usize>,
    /// Stage of every queued request, to account for one the host ends.
    queued_stage: BTreeMap<RequestId, StageId>,
    /// Requests the host ended while queued (removed lazily).
    ended: BTreeSet<RequestId>,
    /// Per busy worker: its stage and when each request of its batch reached the stage.
    in_service: HashMap<WorkerId, (StageId, Vec<Instant>)>,
    areas: Vec<QueueArea>,
    /// Per stage: the least time a request must have left when it is taken out of the
    /// queue, or `None` (never drop).
    slack: Option<Vec<Duration>>,
    /// Requests dropped as unreachable so far.
    dropped: u64,
    /// Per stage: requests dropped there as unreachable so far.
    dropped_at: Vec<u64>,
}

impl StageFifo {
    /// Empty queues.
    pub fn new() -> Self {
        Self::default()
    }

    fn ensure(&mut self, stage: StageId) -> usize {
        let index = stage as usize;
        if self.queues.len() <= index {
            self.queues.resize_with(index + 1, VecDeque::new);
            self.live.resize(index + 1, 0);
            self.dropped_at.resize(index + 1, 0);
            self.areas.resize_with(index + 1, QueueArea::default);
        }
        index
    }

    /// Account the queue length held since the last change, up to `now`.
    fn advance(&mut self, index: usize, now: Instant) {
        let area = &mut self.areas[index];
        let elapsed = now.saturating_sub(area.last_change);
        area.integral += self.live[index] as f64 * elapsed as f64;
        area.last_change = area.last_change.max(now);
    }

    /// Queue a request at its stage (`now` is the current time).
    pub fn push(&mut self, now: Instant, request: &Request) {
        let index = self.ensure(request.stage);
        self.advance(index, now);
        self.queues[index].push_back((request.id, request.arrived_at, request.deadline));
        self.live[index] += 1;
        self.queued_stage.insert(request.id, request.stage);
    }

    /// Forget a request the host ended while it was queued.
    pub fn forget(&mut self, now: Instant, request: RequestId) {
        if let Some(stage) = self.queued_stage.remove(&request) {
            let index = stage as usize;
            self.advance(index, now);
            self.live[index] -= 1;
            self.ended.insert(request);
        }
    }

    /// Drop, instead of dispatching, every request taken out of the queue of a stage
    /// `s` with less than `slack[s]` left before its deadline (a stage past the end of
    /// `slack` keeps everything): the time its own batch and the stages after it need
    /// at the least. In arrival order the oldest request has the least time left, so
    /// under overload the queue stays at about what can still finish and every
    /// dispatched request can still be on time, where a queue that keeps everything
    /// grows until nearly every request is late.
    pub fn drop_unreachable(&mut self, slack: Vec<Duration>) {
        self.slack = Some(slack);
    }

    /// Requests dropped as unreachable so far ([`Self::drop_unreachable`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Requests dropped as unreachable at `stage` so far.
    pub fn dropped_at(&self, stage: StageId) -> u64 {
        self.dropped_at.get(stage as usize).copied().unwrap_or(0)
    }

    /// Requests waiting at `stage` now.
    pub fn len(&self, stage: StageId) -> usize {
        self.live.get(stage as usize).copied().unwrap_or(0)
    }

    /// `true` when no request waits anywhere.
    pub fn is_empty(&self) -> bool {
        self.live.iter().all(|&n| n == 0)
    }

    /// Time-averaged number of requests waiting at `stage` since the previous call
    /// for that stage (or since the start), up to `now`; starts a new period.
    /// Returns the current length when no time has passed.
    pub fn take_mean_len(&mut self, stage: StageId, now: Instant) -> f64 {
        let index = self.ensure(stage);
        self.advance(index, now);
        let area = &mut self.areas[index];
        let span = now.saturating_sub(area.since);
        let mean = if span == 0 { self.live[index] as f64 } else { area.integral / span as f64 };
        *area = QueueArea { since: now, last_change: now, integral: 0.0 };
        mean
    }

    /// Give every idle worker the oldest requests of its stage, up to the stage's
    /// batch limit. An iteration-level (LLM) worker keeps its resident sequences
    /// first and fills the rest of the frame from the queue.
    pub fn dispatch_idle(&mut self, ctx: &mut Ctx) {
        let now = ctx.now();
        for index in 0..self.queues.len() {
            let stage = index as StageId;
            let limit = ctx.batch_limit(stage) as usize;
            let idle: Vec<WorkerId> = ctx.idle_workers(stage).collect();
            for worker in idle {
                self.advance(index, now);
                let mut batch: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|s| s.id).collect();
                let mut arrivals = Vec::new();
                while batch.len() < limit && self.live[index] > 0 {
                    let Some((id, arrived_at, deadline)) = self.queues[index].pop_front() else { break };
                    if !self.ended.is_empty() && self.ended.remove(&id) {
                        continue;
                    }
                    self.queued_stage.remove(&id);
                    self.live[index] -= 1;
                    let needed = self.slack.as_ref().and_then(|slack| slack.get(index)).copied();
                    if needed.is_some_and(|needed| deadline < now.saturating_add(needed)) {
                        ctx.drop_request(id, crate::DropReason::DeadlineUnreachable);
                        self.dropped += 1;
                        self.dropped_at[index] += 1;
                        continue;
                    }
                    batch.push(id);
                    arrivals.push(arrived_at);
                }
                if batch.is_empty() {
                    continue;
                }
                self.in_service.insert(worker, (stage, arrivals));
                ctx.dispatch(worker, batch);
            }
        }
    }

    /// A batch finished: its stage and the sojourn time at that stage (arrival at the
    /// stage until `now`) of each of its requests, or `None` for a batch these queues
    /// did not dispatch.
    pub fn finish(&mut self, outcome: &BatchOutcome, now: Instant) -> Option<(StageId, Vec<Duration>)> {
        let (stage, arrivals) = self.in_service.remove(&outcome.worker)?;
        Some((stage, arrivals.into_iter().map(|at| now.saturating_sub(at)).collect()))
    }

    /// Forget the batch of a worker that left (its requests are the host's again).
    pub fn worker_gone(&mut self, worker: WorkerId) {
        self.in_service.remove(&worker);
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use crate::{Config, DeviceKind, NullHost, Stage, StageKind, Worker};

    pub(super) fn request(id: RequestId, stage: StageId, at: Instant) -> Request {
        Request {
            id,
            origin: id,
            stage,
            stream: 0,
            sent_at: at,
            arrived_at: at,
            deadline: at + 1_000_000_000,
            priority: 0,
            input_size: 0,
            expected_tokens: 0,
            requeues: 0,
            tags: None,
            items: 1,
            correlation: None,
        }
    }

    pub(super) fn ctx(workers: u32, max_batch: u32) -> Ctx {
        let stage = Stage {
            id: 0,
            name: "s".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants: vec![],
            max_batch,
            min_replicas: 1,
            max_replicas: 8,
        };
        let workers = (0..workers)
            .map(|id| Worker { id, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 })
            .collect();
        let config = Config {
            arm: "t".into(),
            stages: vec![stage],
            workers,
            streams: vec![],
            params: vec![],
            tick_interval: 1_000_000_000,
            max_workers: 8,
            seed: 1,
            now: 0,
            hosts: Vec::new(),
        };
        Ctx::new(config, Box::new(NullHost::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{ctx, request};
    use super::*;
    use crate::Action;

    fn dispatched(ctx: &mut Ctx) -> Vec<(WorkerId, Vec<RequestId>)> {
        ctx.take_actions()
            .into_iter()
            .filter_map(|a| match a {
                Action::Dispatch(d) => Some((d.worker, d.requests)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn serves_in_arrival_order_one_batch_per_idle_worker() {
        let mut ctx = ctx(2, 1);
        let mut fifo = StageFifo::new();
        for id in [7, 3, 9] {
            fifo.push(0, &request(id, 0, id));
        }
        ctx.mark_idle(0);
        ctx.mark_idle(1);
        fifo.dispatch_idle(&mut ctx);
        assert_eq!(dispatched(&mut ctx), vec![(0, vec![7]), (1, vec![3])]);
        assert_eq!(fifo.len(0), 1);
    }

    #[test]
    fn ended_requests_are_skipped_and_not_counted() {
        let mut ctx = ctx(1, 4);
        let mut fifo = StageFifo::new();
        for id in 1..=3 {
            fifo.push(0, &request(id, 0, 0));
        }
        fifo.forget(0, 2);
        assert_eq!(fifo.len(0), 2);
        ctx.mark_idle(0);
        fifo.dispatch_idle(&mut ctx);
        assert_eq!(dispatched(&mut ctx), vec![(0, vec![1, 3])]);
        assert!(fifo.is_empty());
    }

    #[test]
    fn unreachable_requests_are_dropped_when_taken_out_only_if_asked() {
        // Deadlines at 1 s (request 1 and 2) and 1.5 s (request 3); now 0.8 s; 0.3 s needed.
        let run = |slack: Option<Vec<Duration>>| {
            let mut ctx = ctx(1, 2);
            let mut fifo = StageFifo::new();
            for id in 1..=3 {
                let mut r = request(id, 0, 0);
                r.deadline = if id == 3 { 1_500_000_000 } else { 1_000_000_000 };
                fifo.push(0, &r);
            }
            if let Some(slack) = slack {
                fifo.drop_unreachable(slack);
            }
            ctx.set_now(800_000_000);
            ctx.mark_idle(0);
            fifo.dispatch_idle(&mut ctx);
            let actions = ctx.take_actions();
            let drops: Vec<RequestId> = actions
                .iter()
                .filter_map(|a| match a {
                    Action::Drop(d) => Some(d.request),
                    _ => None,
                })
                .collect();
            let batches: Vec<Vec<RequestId>> = actions
                .into_iter()
                .filter_map(|a| match a {
                    Action::Dispatch(d) => Some(d.requests),
                    _ => None,
                })
                .collect();
            assert_eq!(fifo.dropped_at(0), fifo.dropped());
            (drops, batches, fifo.dropped(), fifo.len(0))
        };
        assert_eq!(run(None), (vec![], vec![vec![1, 2]], 0, 1));
        assert_eq!(run(Some(vec![300_000_000])), (vec![1, 2], vec![vec![3]], 2, 0));
        // Exactly enough time left is kept.
        assert_eq!(run(Some(vec![200_000_000])), (vec![], vec![vec![1, 2]], 0, 1));
    }

    #[test]
    fn queue_length_is_averaged_over_time_and_sojourn_is_measured() {
        let mut ctx = ctx(1, 1);
        let mut fifo = StageFifo::new();
        // Two requests wait for 1 s, then one is served: 2 for 1 s, 1 for 1 s.
        fifo.push(0, &request(1, 0, 0));
        fifo.push(0, &request(2, 0, 0));
        ctx.set_now(1_000_000_000);
        ctx.mark_idle(0);
        fifo.dispatch_idle(&mut ctx);
        let mean = fifo.take_mean_len(0, 2_000_000_000);
        assert!((mean - 1.5).abs() < 1e-9, "{mean}");
        let outcome = BatchOutcome { worker: 0, started_at: 1_000_000_000, duration: 500_000_000, results: vec![] };
        let (stage, sojourns) = fifo.finish(&outcome, 1_500_000_000).unwrap();
        assert_eq!((stage, sojourns), (0, vec![1_500_000_000]));
        assert!(fifo.finish(&outcome, 2_000_000_000).is_none(), "a batch finishes once");
        assert_eq!(fifo.take_mean_len(0, 3_000_000_000), 1.0);
    }
}

#[cfg(test)]
mod stress {
    use super::*;

    #[test]
    fn bookkeeping_stays_bounded_over_many_requests() {
        let mut ctx = super::tests_support::ctx(3, 1);
        let mut fifo = StageFifo::new();
        for w in 0..3 {
            ctx.mark_idle(w);
        }
        let mut now = 0;
        for id in 0..200_000u64 {
            now += 10;
            ctx.set_now(now);
            fifo.push(now, &super::tests_support::request(id, 0, now));
            if id % 7 == 0 {
                fifo.forget(now, id);
            }
            fifo.dispatch_idle(&mut ctx);
            for action in ctx.take_actions() {
                if let crate::Action::Dispatch(d) = action {
                    let outcome = BatchOutcome { worker: d.worker, started_at: now, duration: 1, results: vec![] };
                    fifo.finish(&outcome, now);
                    ctx.mark_idle(d.worker);
                }
            }
        }
        assert!(fifo.queued_stage.len() < 10, "{}", fifo.queued_stage.len());
        assert!(fifo.ended.len() < 10, "{}", fifo.ended.len());
        assert!(fifo.in_service.len() <= 3);
        assert!(fifo.queues[0].len() < 10);
    }
}
