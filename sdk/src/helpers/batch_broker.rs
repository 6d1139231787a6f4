//! Per-worker dynamic batching for pipeline policies that hold their requests
//! themselves (PARD and the baselines it is compared with).
//!
//! Each worker has its own queue and an *open batch*: while the worker runs batch
//! `j`, the policy fills batch `j+1` from the queue (and from new arrivals) up to the
//! stage's batch limit; batch `j+1` is dispatched the moment the worker reports idle.
//! An idle worker starts a batch as soon as a request is admitted to it. Arrivals are
//! dispatched to the workers of their stage round-robin.
//!
//! [`BatchBroker`] owns those mechanics; what differs between policies — which queued
//! request is taken next and which are dropped — is a [`Discipline`], asked to fill
//! the open batch whenever it has room and the queue is not empty. Collection runs
//! once per delivered batch of events ([`BatchBroker::settle`]), so requests that
//! arrive at the same instant are considered together. On iteration-level (LLM)
//! workers the resident sequences are dispatched again first, so paused sequences
//! are never left behind.

use std::collections::{BTreeMap, VecDeque};

use crate::helpers::MinMaxHeap;
use crate::{Ctx, DropReason, Instant, Request, RequestId, StageId, Worker, WorkerId};

/// A request held by the broker: what the disciplines need to order and test it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The request (or sub-request) id.
    pub id: RequestId,
    /// Its stage.
    pub stage: StageId,
    /// When the client sent it (t_s).
    pub sent_at: Instant,
    /// When it reached this stage (t_r).
    pub arrived_at: Instant,
    /// Absolute end-to-end deadline (D_r).
    pub deadline: Instant,
    /// Priority key of a [`PriorityQueue`] (smaller first); the deadline by default.
    pub key: Instant,
}

impl From<&Request> for Queued {
    fn from(r: &Request) -> Self {
        Self { id: r.id, stage: r.stage, sent_at: r.sent_at, arrived_at: r.arrived_at, deadline: r.deadline, key: r.deadline }
    }
}

/// A request admitted to an open batch, with its admission time (t_b).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The request.
    pub request: Queued,
    /// When it was taken out of the queue.
    pub admitted_at: Instant,
}

/// The batch a worker is running, as the policy dispatched it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningBatch {
    /// Dispatch time (τ_run).
    pub started_at: Instant,
    /// Requests in it.
    pub size: u32,
    /// Dispatch time plus the profiled duration of its size.
    pub expected_end: Instant,
}

/// A worker's queue.
pub trait WorkerQueue: Default {
    /// Add a request.
    fn push(&mut self, request: Queued);
    /// Add several requests (a removed worker's, handed on) at once.
    fn push_all(&mut self, requests: Vec<Queued>) {
        for request in requests {
            self.push(request);
        }
    }
    /// Remove a request by id (it reached the stage at `arrived_at`).
    fn remove(&mut self, id: RequestId, arrived_at: Instant) -> Option<Queued>;
    /// Requests held.
    fn len(&self) -> usize;
    /// Whether no request is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Take every request out (in the queue's order).
    fn drain_all(&mut self) -> Vec<Queued>;
    /// The earliest arrival at the stage among the requests held.
    fn oldest_arrival(&self) -> Option<Instant>;
}

/// First come, first served by arrival at the stage (ties by id).
///
/// Arrivals come in time order and join the back; a request found by id is found by
/// binary search on its arrival. Requests handed on together (a removed worker's
/// queue) are merged in one pass: put back one at a time, each went into the middle,
/// a move of half the queue, and a policy that never drops (the naive baseline past
/// capacity) ran out of an event call's fuel when a worker left with thousands queued.
#[derive(Debug, Clone, Default)]
pub struct FifoQueue {
    items: VecDeque<Queued>,
}

impl FifoQueue {
    /// The oldest request.
    pub fn front(&self) -> Option<&Queued> {
        self.items.front()
    }

    /// Take the oldest request.
    pub fn pop_front(&mut self) -> Option<Queued> {
        self.items.pop_front()
    }

    /// The requests, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Queued> + '_ {
        self.items.iter()
    }

    fn order(q: &Queued) -> (Instant, RequestId) {
        (q.arrived_at, q.id)
    }
}

impl WorkerQueue for FifoQueue {
    fn push(&mut self, request: Queued) {
        // Arrivals come in time order; a re-dispatched request is put back in place.
        let at = self.items.partition_point(|q| Self::order(q) <= Self::order(&request));
        self.items.insert(at, request);
    }
    fn push_all(&mut self, mut requests: Vec<Queued>) {
        requests.sort_unstable_by_key(Self::order);
        let old = std::mem::take(&mut self.items);
        self.items.reserve(old.len() + requests.len());
        let (mut old, mut new) = (old.into_iter().peekable(), requests.into_iter().peekable());
        loop {
            let next = match (old.peek(), new.peek()) {
                (Some(a), Some(b)) if Self::order(a) <= Self::order(b) => old.next(),
                (_, Some(_)) => new.next(),
                (Some(_), None) => old.next(),
                (None, None) => break,
            };
            self.items.extend(next);
        }
    }
    fn remove(&mut self, id: RequestId, arrived_at: Instant) -> Option<Queued> {
        // Found by its arrival alone: a request the broker holds in an open batch, not
        // here, is looked for often (the host expires the oldest, admitted ones), and a
        // scan of the queue for it made every such call cost the queue's length.
        let at = self.items.partition_point(|q| Self::order(q) < (arrived_at, id));
        if self.items.get(at).is_some_and(|q| q.id == id) {
            self.items.remove(at)
        } else {
            None
        }
    }
    fn len(&self) -> usize {
        self.items.len()
    }
    fn drain_all(&mut self) -> Vec<Queued> {
        self.items.drain(..).collect()
    }
    fn oldest_arrival(&self) -> Option<Instant> {
        self.items.front().map(|q| q.arrived_at)
    }
}

/// An entry of a [`PriorityQueue`], ordered by `(key, arrived_at, id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Keyed(Queued);

impl Ord for Keyed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.key, self.0.arrived_at, self.0.id).cmp(&(other.0.key, other.0.arrived_at, other.0.id))
    }
}

impl PartialOrd for Keyed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A double-ended priority queue on [`Queued::key`] (ties by arrival, then id):
/// both the smallest and the largest key are taken in O(log n).
#[derive(Debug, Clone, Default)]
pub struct PriorityQueue {
    heap: MinMaxHeap<Keyed>,
}

impl PriorityQueue {
    /// The request with the smallest key.
    pub fn peek_min(&self) -> Option<&Queued> {
        self.heap.peek_min().map(|k| &k.0)
    }

    /// Take the request with the smallest key.
    pub fn pop_min(&mut self) -> Option<Queued> {
        self.heap.pop_min().map(|k| k.0)
    }

    /// Take the request with the largest key.
    pub fn pop_max(&mut self) -> Option<Queued> {
        self.heap.pop_max().map(|k| k.0)
    }
}

impl WorkerQueue for PriorityQueue {
    fn push(&mut self, request: Queued) {
        self.heap.push(Keyed(request));
    }
    fn remove(&mut self, id: RequestId, _arrived_at: Instant) -> Option<Queued> {
        let found = self.heap.iter().find(|k| k.0.id == id).map(|k| k.0)?;
        self.heap.retain(|k| k.0.id != id);
        Some(found)
    }
    fn len(&self) -> usize {
        self.heap.len()
    }
    fn drain_all(&mut self) -> Vec<Queued> {
        let mut all: Vec<Queued> = self.heap.drain().into_iter().map(|k| k.0).collect();
        all.sort_by_key(|q| (q.key, q.arrived_at, q.id));
        all
    }
    fn oldest_arrival(&self) -> Option<Instant> {
        self.heap.iter().map(|k| k.0.arrived_at).min()
    }
}

/// What a discipline is asked to fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillContext {
    /// The worker whose open batch is being filled.
    pub worker: WorkerId,
    /// Its stage.
    pub stage: StageId,
    /// Free places in the open batch.
    pub room: usize,
    /// Requests already in the open batch.
    pub open: usize,
    /// Expected start of the open batch (t_e): the running batch's expected end, or
    /// now when the worker is idle.
    pub expected_start: Instant,
    /// The decision time.
    pub now: Instant,
}

/// A discipline's answer: requests to admit to the open batch, in order, and
/// requests to drop, with the reason.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filled {
    /// Admitted, in service order (at most `room`).
    pub admit: Vec<Queued>,
    /// Dropped.
    pub drop: Vec<(Queued, DropReason)>,
}

/// The part of a pipeline policy that chooses: which queued requests join the open
/// batch and which are dropped.
pub trait Discipline<Q: WorkerQueue> {
    /// Take requests out of `queue` for the open batch described by `fill`. Every
    /// request taken out must appear in `out.admit` or `out.drop`.
    fn fill(&mut self, ctx: &Ctx, queue: &mut Q, fill: &FillContext, out: &mut Filled);

    /// A batch was dispatched on a worker of `stage` at `now` (for statistics).
    fn batch_started(&mut self, _ctx: &Ctx, _stage: StageId, _batch: &[Admitted], _now: Instant) {}
}

/// One worker's share of the broker.
#[derive(Debug, Clone, Default)]
pub struct WorkerSlot<Q> {
    /// The worker's stage.
    pub stage: StageId,
    /// Its queue.
    pub queue: Q,
    /// The open batch (the next batch to run), in service order.
    pub open: Vec<Admitted>,
    /// The batch it runs, if any.
    pub running: Option<RunningBatch>,
}

/// Per-worker queues and open batches with round-robin dispatch; see the module docs.
#[derive(Debug, Clone)]
pub struct BatchBroker<Q> {
    slots: BTreeMap<WorkerId, WorkerSlot<Q>>,
    /// Workers per stage, ascending.
    by_stage: Vec<Vec<WorkerId>>,
    /// Round-robin cursor per stage.
    cursor: Vec<usize>,
    /// Which worker holds each queued or admitted request, and when it reached the
    /// stage. A B-tree, not a hash map: a hash map's growth rehashes every entry in
    /// one call, and a policy that never drops (the naive baseline past capacity)
    /// held 100,000 and more, so that one arrival ran out of an event call's fuel; a
    /// B-tree's every step costs O(log n).
    location: BTreeMap<RequestId, (WorkerId, Instant)>,
    /// Requests of stages that have no worker, waiting for one.
    orphans: Vec<Vec<Queued>>,
    /// Workers to collect for at the next settle.
    dirty: Vec<WorkerId>,
}

impl<Q: WorkerQueue> BatchBroker<Q> {
    /// A broker for the configured workers.
    pub fn new(ctx: &Ctx) -> Self {
        let stages = ctx.config().stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut broker = Self {
            slots: BTreeMap::new(),
            by_stage: vec![Vec::new(); stages],
            cursor: vec![0; stages],
            location: BTreeMap::new(),
            orphans: vec![Vec::new(); stages],
            dirty: Vec::new(),
        };
        for worker in &ctx.config().workers {
            broker.add_worker(worker);
        }
        broker
    }

    /// A worker joined (its queue starts empty; waiting orphans move to it).
    pub fn add_worker(&mut self, worker: &Worker) {
        let stage = worker.stage as usize;
        if self.by_stage.len() <= stage {
            self.by_stage.resize(stage + 1, Vec::new());
            self.cursor.resize(stage + 1, 0);
            self.orphans.resize(stage + 1, Vec::new());
        }
        self.slots.insert(worker.id, WorkerSlot { stage: worker.stage, queue: Q::default(), open: Vec::new(), running: None });
        let list = &mut self.by_stage[stage];
        if let Err(at) = list.binary_search(&worker.id) {
            list.insert(at, worker.id);
        }
        for request in std::mem::take(&mut self.orphans[stage]) {
            self.enqueue(request);
        }
    }

    /// A worker left: its open batch and queue go to the other workers of its stage.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let Some(mut slot) = self.slots.remove(&worker) else { return };
        if let Some(list) = self.by_stage.get_mut(slot.stage as usize) {
            list.retain(|&w| w != worker);
        }
        let mut held: Vec<Queued> = slot.open.drain(..).map(|a| a.request).collect();
        held.extend(slot.queue.drain_all());
        // Round-robin over the stage's other workers, each handed its share at once.
        let stage = slot.stage as usize;
        let workers = self.by_stage.get(stage).cloned().unwrap_or_default();
        if workers.is_empty() {
            for request in held {
                self.location.remove(&request.id);
                self.enqueue(request);
            }
            return;
        }
        let mut shares: Vec<Vec<Queued>> = vec![Vec::new(); workers.len()];
        for request in held {
            shares[self.cursor[stage] % workers.len()].push(request);
            self.cursor[stage] = (self.cursor[stage] + 1) % workers.len();
        }
        for (worker, share) in workers.into_iter().zip(shares) {
            if share.is_empty() {
                continue;
            }
            for request in &share {
                self.location.insert(request.id, (worker, request.arrived_at));
            }
            if let Some(slot) = self.slots.get_mut(&worker) {
                slot.queue.push_all(share);
            }
            self.mark_dirty(worker);
        }
    }

    /// Queue a request at the next worker of its stage (round-robin); returns it, or
    /// `None` when the stage has no worker (the request waits for one).
    pub fn enqueue(&mut self, request: Queued) -> Option<WorkerId> {
        let stage = request.stage as usize;
        let Some(workers) = self.by_stage.get(stage).filter(|w| !w.is_empty()) else {
            if self.orphans.len() <= stage {
                self.orphans.resize(stage + 1, Vec::new());
            }
            self.orphans[stage].push(request);
            return None;
        };
        let worker = workers[self.cursor[stage] % workers.len()];
        self.cursor[stage] = (self.cursor[stage] + 1) % workers.len();
        self.push_to(worker, request);
        Some(worker)
    }

    /// Queue a request at a given worker.
    pub fn push_to(&mut self, worker: WorkerId, request: Queued) {
        let Some(slot) = self.slots.get_mut(&worker) else { return };
        slot.queue.push(request);
        self.location.insert(request.id, (worker, request.arrived_at));
        self.mark_dirty(worker);
    }

    /// Forget a request the host ended (queued or in an open batch); whether it was held.
    pub fn forget(&mut self, id: RequestId) -> bool {
        if let Some((worker, arrived_at)) = self.location.remove(&id) {
            if let Some(slot) = self.slots.get_mut(&worker) {
                if slot.queue.remove(id, arrived_at).is_none() {
                    slot.open.retain(|a| a.request.id != id);
                }
            }
            return true;
        }
        for list in &mut self.orphans {
            if let Some(at) = list.iter().position(|q| q.id == id) {
                list.remove(at);
                return true;
            }
        }
        false
    }

    /// A worker reported idle: its batch is over; collect for it at the next settle.
    pub fn worker_idle(&mut self, worker: WorkerId) {
        if let Some(slot) = self.slots.get_mut(&worker) {
            slot.running = None;
        }
        self.mark_dirty(worker);
    }

    fn mark_dirty(&mut self, worker: WorkerId) {
        if !self.dirty.contains(&worker) {
            self.dirty.push(worker);
        }
    }

    /// A worker's slot.
    pub fn slot(&self, worker: WorkerId) -> Option<&WorkerSlot<Q>> {
        self.slots.get(&worker)
    }

    /// Every worker's slot.
    pub fn slots(&self) -> impl Iterator<Item = (WorkerId, &WorkerSlot<Q>)> + '_ {
        self.slots.iter().map(|(&w, s)| (w, s))
    }

    /// Workers of a stage, ascending.
    pub fn workers_of(&self, stage: StageId) -> &[WorkerId] {
        self.by_stage.get(stage as usize).map_or(&[], Vec::as_slice)
    }

    /// Requests held (queued, admitted or waiting for a worker).
    pub fn held(&self) -> usize {
        self.location.len() + self.orphans.iter().map(Vec::len).sum::<usize>()
    }

    /// Collect for every worker that changed since the last settle: start open batches
    /// on idle workers and fill the next ones.
    pub fn settle(&mut self, ctx: &mut Ctx, discipline: &mut impl Discipline<Q>) {
        while let Some(worker) = self.dirty.pop() {
            self.collect(ctx, discipline, worker);
        }
    }

    /// Collect for every worker (for policies that change their rules at a tick).
    pub fn settle_all(&mut self, ctx: &mut Ctx, discipline: &mut impl Discipline<Q>) {
        self.dirty = self.slots.keys().copied().collect();
        self.settle(ctx, discipline);
    }

    /// COLLECT: fill the open batch of `worker`; when the worker is idle, run it and
    /// fill the next one.
    fn collect(&mut self, ctx: &mut Ctx, discipline: &mut impl Discipline<Q>, worker: WorkerId) {
        let now = ctx.now();
        loop {
            let Some(slot) = self.slots.get_mut(&worker) else { return };
            let limit = ctx.batch_limit(slot.stage) as usize;
            let idle = ctx.worker(worker).is_some_and(|w| w.idle);
            let expected_start = match slot.running {
                Some(run) if !idle => run.expected_end.max(now),
                _ => now,
            };
            if slot.open.len() < limit && !slot.queue.is_empty() {
                let fill =
                    FillContext { worker, stage: slot.stage, room: limit - slot.open.len(), open: slot.open.len(), expected_start, now };
                let mut out = Filled::default();
                discipline.fill(ctx, &mut slot.queue, &fill, &mut out);
                for (request, reason) in out.drop {
                    self.location.remove(&request.id);
                    ctx.drop_request(request.id, reason);
                }
                slot.open.extend(out.admit.into_iter().map(|request| Admitted { request, admitted_at: now }));
            }
            // Iteration-level workers keep running their resident sequences first.
            let resident: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|s| s.id).collect();
            if !(idle && (!slot.open.is_empty() || !resident.is_empty())) {
                return;
            }
            // START: the idle worker runs the open batch now (within the current limit).
            let mut batch = std::mem::take(&mut slot.open);
            if resident.len() + batch.len() > limit {
                for extra in batch.split_off(limit - resident.len()) {
                    slot.queue.push(extra.request);
                }
            }
            let size = (resident.len() + batch.len()) as u32;
            let expected_end = now + ctx.batch_latency(worker, size);
            slot.running = Some(RunningBatch { started_at: now, size, expected_end });
            let stage = slot.stage;
            for admitted in &batch {
                self.location.remove(&admitted.request.id);
            }
            discipline.batch_started(ctx, stage, &batch, now);
            let mut ids = resident;
            ids.extend(batch.iter().map(|a| a.request.id));
            ctx.dispatch(worker, ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{constant_variant, one_stage, MS};
    use crate::{Config, NullHost};

    /// One stage of 20 ms batches of at most 2, `workers` workers, room for 4.
    fn config(workers: u32) -> Config {
        let mut config = one_stage(vec![constant_variant(20 * MS)], 2, workers);
        config.stages[0].min_replicas = 1;
        config.stages[0].max_replicas = 4;
        config.max_workers = 4;
        config
    }

    fn queued(id: RequestId, at: Instant) -> Queued {
        Queued { id, stage: 0, sent_at: at, arrived_at: at, deadline: at + 100 * MS, key: at + 100 * MS }
    }

    /// Admits everything in FIFO order, drops ids above 100.
    struct TakeAll(Vec<Instant>);

    impl Discipline<FifoQueue> for TakeAll {
        fn fill(&mut self, _ctx: &Ctx, queue: &mut FifoQueue, fill: &FillContext, out: &mut Filled) {
            self.0.push(fill.expected_start);
            while out.admit.len() < fill.room {
                let Some(q) = queue.pop_front() else { break };
                if q.id > 100 {
                    out.drop.push((q, DropReason::Policy));
                } else {
                    out.admit.push(q);
                }
            }
        }
    }

    /// A context whose workers are all idle.
    fn ctx(workers: u32) -> Ctx {
        let mut ctx = Ctx::new(config(workers), Box::new(NullHost::default()));
        for w in 0..workers {
            ctx.mark_idle(w);
        }
        ctx
    }

    #[test]
    fn idle_worker_starts_at_once_and_the_next_batch_waits_for_the_running_one() {
        let mut ctx = ctx(1);
        let mut broker = BatchBroker::<FifoQueue>::new(&ctx);
        let mut rule = TakeAll(Vec::new());
        broker.enqueue(queued(1, 0));
        broker.settle(&mut ctx, &mut rule);
        assert!(matches!(ctx.take_actions().as_slice(), [crate::Action::Dispatch(d)] if d.requests == vec![1]));
        // Busy now: arrivals join the open batch (limit 2), the third stays queued.
        ctx.set_now(5 * MS);
        for id in 2..=4 {
            broker.enqueue(queued(id, 5 * MS));
        }
        broker.settle(&mut ctx, &mut rule);
        assert!(ctx.take_actions().is_empty());
        assert_eq!(rule.0.last(), Some(&(20 * MS)), "t_e is the running batch's expected end");
        let slot = broker.slot(0).unwrap();
        assert_eq!(slot.open.iter().map(|a| a.request.id).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(slot.queue.len(), 1);
        // The worker finishes: the open batch runs, request 4 is admitted next.
        ctx.set_now(20 * MS);
        ctx.mark_idle(0);
        broker.worker_idle(0);
        broker.settle(&mut ctx, &mut rule);
        assert!(matches!(ctx.take_actions().as_slice(), [crate::Action::Dispatch(d)] if d.requests == vec![2, 3]));
        assert_eq!(broker.slot(0).unwrap().open[0].request.id, 4);
        assert_eq!(broker.held(), 1);
    }

    #[test]
    fn round_robin_drops_forget_and_worker_removal() {
        let mut ctx = ctx(2);
        let mut broker = BatchBroker::<FifoQueue>::new(&ctx);
        assert_eq!(broker.enqueue(queued(1, 0)), Some(0));
        assert_eq!(broker.enqueue(queued(2, 0)), Some(1));
        assert_eq!(broker.enqueue(queued(101, 0)), Some(0));
        assert!(broker.forget(2));
        assert!(!broker.forget(2));
        broker.settle(&mut ctx, &mut TakeAll(Vec::new()));
        let actions = ctx.take_actions();
        assert!(actions.iter().any(|a| matches!(a, crate::Action::Drop(d) if d.request == 101)));
        assert!(actions.iter().any(|a| matches!(a, crate::Action::Dispatch(d) if d.worker == 0 && d.requests == vec![1])));
        // Worker 1 leaves with a queued request: it moves to worker 0.
        broker.push_to(1, queued(7, 0));
        broker.remove_worker(1);
        assert_eq!(broker.slot(0).unwrap().queue.len(), 1);
        assert_eq!(broker.workers_of(0), &[0]);
    }

    #[test]
    fn a_fifo_queue_merges_requests_handed_on_in_arrival_order() {
        let mut q = FifoQueue::default();
        for (id, at) in [(1, 10), (3, 30), (5, 50)] {
            q.push(queued(id, at));
        }
        q.push_all(vec![queued(6, 60), queued(2, 20), queued(4, 30), queued(0, 0)]);
        assert_eq!(q.iter().map(|r| r.id).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(q.remove(4, 30).map(|r| r.id), Some(4));
        assert_eq!(q.remove(2, 99), None, "found by its arrival only");
        assert_eq!(q.remove(2, 20).map(|r| r.id), Some(2));
        assert_eq!(q.remove(9, 0), None);
        assert_eq!(q.oldest_arrival(), Some(0));
    }

    #[test]
    fn priority_queue_serves_both_ends() {
        let mut q = PriorityQueue::default();
        for (id, key) in [(1, 30), (2, 10), (3, 20)] {
            q.push(Queued { key, ..queued(id, 0) });
        }
        assert_eq!(q.peek_min().map(|r| r.id), Some(2));
        assert_eq!(q.pop_max().map(|r| r.id), Some(1));
        assert_eq!(q.oldest_arrival(), Some(0));
        assert_eq!(q.remove(2, 0).map(|r| r.id), Some(2));
        assert_eq!(q.drain_all().iter().map(|r| r.id).collect::<Vec<_>>(), vec![3]);
    }
}
