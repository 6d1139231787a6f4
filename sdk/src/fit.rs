//! Batches that fit: the SDK's guard on every dispatch, so that every policy built on
//! it keeps two rules of the contract without knowing them — a batch is at most the
//! stage's batch limit in *items* (a client batch of N rows is one request of N items,
//! never split), and a step of a stateful sequence runs only on the worker that holds
//! the sequence (`request.correlation.worker`).
//!
//! Most requests carry one item and no sequence; the guard remembers only the others
//! ([`Constraints`]), so a policy that never sees one pays a check of an empty map per
//! dispatch. When a dispatch breaks a rule, the guard keeps the policy's own picture as
//! true as it can:
//! - a batch over the limit in items runs on the worker the policy named as
//!   *consecutive runs*, each within the limit: the first at once, the next ones as
//!   the worker goes idle, before the policy hears it is idle. The policy sees its batch
//!   finish in parts (a `batch-done` per run) and the worker idle once, after the last;
//!   no request is split, handed back, or run anywhere else;
//! - a sequence step meant for another worker than its holder runs on its holder: at
//!   once, as a batch of its own, when the holder is idle; else it is handed back to the
//!   policy as an arrival when the holder goes idle (just before its `worker-idle`).
//!   When nothing of a dispatch is left for the worker the policy named, that worker is
//!   announced idle again at the next call (`worker-idle`), since the policy believes
//!   it busy. A policy that keeps its own idea of where each request runs should place
//!   a step on `correlation.worker` itself.
//!
//! If the worker goes away, or the policy preempts it, with runs still to start, their
//! requests come back to the policy as arrivals at its next call. Nothing is dropped and
//! the host is never asked to run a batch it would reject. Batch-forming
//! helpers that count items themselves ([`Ctx::items`](crate::Ctx::items)) never trigger it.

use std::collections::{BTreeMap, VecDeque};

use crate::{Request, RequestId, VariantId, WorkerId};

/// A run still to start on a worker: its requests, and the variant the dispatch asked for.
type Run = (Vec<Request>, Option<VariantId>);

/// What the guard remembers of the requests that constrain a batch.
#[derive(Debug, Default)]
pub(crate) struct Constraints {
    /// Requests of several items or bound to a worker, by id (as they arrived).
    special: BTreeMap<RequestId, Request>,
    /// Runs of a dispatch over the limit still to start, per worker, in order: each
    /// starts when the worker goes idle.
    runs: BTreeMap<WorkerId, VecDeque<Run>>,
    /// Requests to hand back to the policy at the next call (their worker went away).
    next_call: Vec<Request>,
    /// Sequence steps withheld from a dispatch, to hand back when their worker is idle.
    when_idle: BTreeMap<WorkerId, Vec<Request>>,
    /// Workers a dispatch named whose whole batch was withheld or sent to the workers
    /// holding its steps: the policy believes them busy, so they are announced idle
    /// again at the next call.
    idle_again: Vec<WorkerId>,
}

/// How the guard split one dispatch.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Fitted {
    /// The batch to run on the worker asked for.
    pub batch: Vec<RequestId>,
    /// Sequence steps to run on their own idle worker instead, one batch per worker.
    pub elsewhere: Vec<(WorkerId, Vec<RequestId>)>,
}

impl Constraints {
    /// Whether no held request constrains a batch (the common case: every dispatch
    /// passes as it is).
    #[inline]
    pub(crate) fn is_clear(&self) -> bool {
        self.special.is_empty()
    }

    /// Note an arrival: remember it if it constrains a batch.
    pub(crate) fn arrived(&mut self, request: &Request) {
        if request.items > 1 || request.correlation.as_ref().is_some_and(|c| c.worker.is_some()) {
            self.special.insert(request.id, request.clone());
        } else if !self.special.is_empty() {
            self.special.remove(&request.id);
        }
    }

    /// Forget a request (dispatched, dropped, deferred, ended).
    pub(crate) fn forget(&mut self, id: RequestId) {
        if !self.special.is_empty() {
            self.special.remove(&id);
        }
    }

    /// A request that leaves the policy's hands before it runs (the host ended it, or
    /// the policy dropped or deferred it): no longer to run or hand back.
    pub(crate) fn ended(&mut self, id: RequestId) {
        self.forget(id);
        if self.runs.is_empty() && self.next_call.is_empty() && self.when_idle.is_empty() {
            return;
        }
        self.next_call.retain(|r| r.id != id);
        for waiting in self.when_idle.values_mut() {
            waiting.retain(|r| r.id != id);
        }
        for runs in self.runs.values_mut() {
            for (run, _) in runs.iter_mut() {
                run.retain(|r| r.id != id);
            }
            runs.retain(|(run, _)| !run.is_empty());
        }
        self.runs.retain(|_, runs| !runs.is_empty());
    }

    /// The next run to start on `worker`, now idle, with the variant its dispatch
    /// asked for, if a dispatch left one.
    pub(crate) fn next_run(&mut self, worker: WorkerId) -> Option<(Vec<RequestId>, Option<VariantId>)> {
        if self.runs.is_empty() {
            return None;
        }
        let runs = self.runs.get_mut(&worker)?;
        let run = runs.pop_front();
        if runs.is_empty() {
            self.runs.remove(&worker);
        }
        run.map(|(run, variant)| (run.into_iter().map(|r| r.id).collect(), variant))
    }

    /// The policy preempted `worker`: runs it had still to start come back to it.
    pub(crate) fn preempted(&mut self, worker: WorkerId) {
        if let Some(runs) = self.runs.remove(&worker) {
            self.next_call.extend(runs.into_iter().flat_map(|(run, _)| run));
        }
    }

    /// Items a held request carries (1 unless it said otherwise).
    pub(crate) fn items(&self, id: RequestId) -> u32 {
        self.special.get(&id).map_or(1, |r| r.items.max(1))
    }

    /// Split a dispatch of `requests` on `worker` into what keeps the rules (called only
    /// while some held request constrains a batch, [`Constraints::is_clear`]): sequence
    /// steps go to their holder (run there now, as a batch of their own, when `is_idle`
    /// says it is idle; else handed back when it goes idle), and each batch is at most
    /// `limit` items (a request alone up to `max_batch`), the rest left as later runs on
    /// the same worker ([`Constraints::within`]). (A batch over the limit in one-item
    /// requests alone is the policy's own doing and left for the host to reject.)
    pub(crate) fn fit(
        &mut self,
        worker: WorkerId,
        requests: Vec<RequestId>,
        limit: u32,
        max_batch: u32,
        variant: Option<VariantId>,
        is_idle: impl Fn(WorkerId) -> bool,
    ) -> Fitted {
        let mut fitted = Fitted::default();
        let mut elsewhere: BTreeMap<WorkerId, Vec<RequestId>> = BTreeMap::new();
        for id in requests {
            let holder = self.special.get(&id).and_then(|r| r.correlation.as_ref()).and_then(|c| c.worker).filter(|&h| h != worker);
            match holder {
                Some(h) if is_idle(h) => elsewhere.entry(h).or_default().push(id),
                Some(h) => {
                    let request = self.special.remove(&id).expect("a bound request is remembered");
                    self.when_idle.entry(h).or_default().push(request);
                }
                None => fitted.batch.push(id),
            }
        }
        fitted.batch = self.within(worker, fitted.batch, limit, max_batch, variant);
        fitted.elsewhere = elsewhere.into_iter().map(|(w, batch)| (w, self.within(w, batch, limit, max_batch, None))).collect();
        fitted
    }

    /// The first run of `batch` on `worker`: requests of several items are moved, the
    /// last first, to later runs until it is at most `limit` items (a request alone up
    /// to `max_batch`); the later runs, each within the limit too, wait for the worker
    /// to go idle.
    fn within(
        &mut self,
        worker: WorkerId,
        mut batch: Vec<RequestId>,
        limit: u32,
        max_batch: u32,
        variant: Option<VariantId>,
    ) -> Vec<RequestId> {
        let fits = |constraints: &Self, batch: &[RequestId]| {
            let items: u32 = batch.iter().map(|&id| constraints.items(id)).sum();
            items <= limit || (batch.len() == 1 && items <= max_batch.max(limit))
        };
        let mut later: Vec<Request> = Vec::new();
        while !fits(self, &batch) {
            let Some(at) = batch.iter().rposition(|id| self.special.get(id).is_some_and(|r| r.items > 1)) else { break };
            if batch.len() == 1 {
                break;
            }
            let id = batch.remove(at);
            later.push(self.special.remove(&id).expect("a request of several items is remembered"));
        }
        // The moved requests, in the policy's order, packed into runs of at most
        // `limit` items (a request alone may carry up to `max_batch`).
        later.reverse();
        let mut run: Vec<Request> = Vec::new();
        let mut items = 0;
        for request in later {
            let n = request.items.max(1);
            if !run.is_empty() && items + n > limit {
                self.runs.entry(worker).or_default().push_back((std::mem::take(&mut run), variant));
                items = 0;
            }
            items += n;
            run.push(request);
        }
        if !run.is_empty() {
            self.runs.entry(worker).or_default().push_back((run, variant));
        }
        batch
    }

    /// Note that a dispatch to `worker` was emptied: the worker is still idle.
    pub(crate) fn emptied(&mut self, worker: WorkerId) {
        if !self.idle_again.contains(&worker) {
            self.idle_again.push(worker);
        }
    }

    /// Workers to announce idle again at the start of a call.
    pub(crate) fn take_idle_again(&mut self) -> Vec<WorkerId> {
        std::mem::take(&mut self.idle_again)
    }

    /// Requests to hand back at the start of a call.
    pub(crate) fn take_next_call(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.next_call)
    }

    /// Sequence steps to hand back now that `worker` is idle.
    pub(crate) fn take_when_idle(&mut self, worker: WorkerId) -> Vec<Request> {
        if self.when_idle.is_empty() {
            return Vec::new();
        }
        self.when_idle.remove(&worker).unwrap_or_default()
    }

    /// Sequence steps held for a worker that is gone, and runs it had still to start:
    /// handed back at the next call (the host fails the steps, as their state went with
    /// the worker; the others the policy places again).
    pub(crate) fn worker_gone(&mut self, worker: WorkerId) {
        if let Some(waiting) = self.when_idle.remove(&worker) {
            self.next_call.extend(waiting);
        }
        self.preempted(worker);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use crate::testing::{constant_variant, dispatches, one_stage, request};
    use crate::{Correlation, Ctx, Driver, Event, NullHost, Policy, Request, RequestId, WorkerId};

    /// First come, first served in batches of up to the limit *in requests*: a policy
    /// that knows nothing of items or sequences.
    struct Naive(VecDeque<RequestId>);

    impl Naive {
        fn serve(&mut self, ctx: &mut Ctx) {
            for worker in ctx.idle_workers(0).collect::<Vec<_>>() {
                let n = (ctx.batch_limit(0) as usize).min(self.0.len());
                if n > 0 {
                    let batch = self.0.drain(..n).collect();
                    ctx.dispatch(worker, batch);
                }
            }
        }
    }

    impl Policy for Naive {
        fn init(_: &mut Ctx) -> Result<Self, String> {
            Ok(Naive(VecDeque::new()))
        }
        fn on_arrival(&mut self, _: &mut Ctx, request: Request) {
            self.0.push_back(request.id);
        }
        fn on_events_done(&mut self, ctx: &mut Ctx) {
            self.serve(ctx);
        }
    }

    fn driver(workers: u32, max_batch: u32) -> Driver<Naive> {
        Driver::new(one_stage(vec![constant_variant(1_000)], max_batch, workers), Box::new(NullHost::default())).unwrap().0
    }

    fn items(id: RequestId, items: u32) -> Event {
        Event::Arrival(Request { items, ..request(id, 0, 0, 1_000_000) })
    }

    fn step(id: RequestId, worker: Option<WorkerId>) -> Event {
        let correlation = Some(Correlation { id: 77, start: worker.is_none(), end: false, worker });
        Event::Arrival(Request { correlation, ..request(id, 0, 0, 1_000_000) })
    }

    #[test]
    fn a_batch_over_the_limit_in_items_runs_as_consecutive_runs_on_its_worker() {
        let mut d = driver(1, 4);
        // Requests of 2, 1, 2, 1, 3 and 2 items: 11 items in 6 requests.
        let events = vec![items(1, 2), items(2, 1), items(3, 2), items(4, 1), items(5, 3), items(6, 2), Event::WorkerIdle(0)];
        let actions = d.handle(1, events);
        // The policy sent four requests (7 items): 2 + 1 + 1 items run first.
        assert_eq!(dispatches(&actions), [(0, vec![1, 2, 4])]);
        assert_eq!(d.policy().0.len(), 2, "nothing comes back to the policy");
        // Each time the worker goes idle the next run starts, before the policy hears of it.
        let actions = d.handle(2, vec![Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![3])]);
        // Its batch done, the policy hears the worker is idle and sends 5 and 6 (5 items).
        let actions = d.handle(3, vec![Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![5])]);
        let actions = d.handle(4, vec![Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![6])]);
        // The last run done, the policy hears the worker is idle and serves what came.
        let actions = d.handle(5, vec![items(7, 1), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![7])]);
    }

    #[test]
    fn runs_still_to_start_come_back_when_their_worker_goes_away_or_ends_them() {
        let mut d = driver(1, 4);
        let actions = d.handle(1, vec![items(1, 3), items(2, 3), items(3, 3), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![1])]);
        // The host ends request 2 while it waits for its run: it never runs.
        let actions = d.handle(2, vec![Event::RequestEnded((2, crate::EndReason::Expired)), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![3])]);
        let mut d = driver(1, 4);
        d.handle(1, vec![items(1, 3), items(2, 3), Event::WorkerIdle(0)]);
        d.handle(2, vec![Event::WorkerRemoved(0)]);
        // Request 2's run never started: the policy has it back.
        d.handle(3, Vec::new());
        assert_eq!(d.policy().0.iter().copied().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn a_client_batch_alone_may_fill_the_largest_batch() {
        let mut d = driver(1, 8);
        let actions = d.handle(1, vec![items(1, 8), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![1])]);
    }

    #[test]
    fn a_sequence_step_runs_only_on_the_worker_holding_its_sequence() {
        let mut d = driver(2, 4);
        // Both workers busy at first; the step is held by worker 1.
        let actions = d.handle(1, vec![step(1, Some(1)), items(2, 1), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![2])], "the step waits for worker 1");
        // Worker 1 goes idle: the step comes back and runs there.
        let actions = d.handle(2, vec![Event::WorkerIdle(1)]);
        assert_eq!(dispatches(&actions), [(1, vec![1])]);
        // A step whose worker is idle runs there at once, beside the policy's batch.
        let actions = d.handle(3, vec![Event::WorkerIdle(0), step(3, Some(0)), items(4, 1)]);
        assert_eq!(dispatches(&actions), [(0, vec![3, 4])]);
        let mut d = driver(2, 4);
        let actions = d.handle(1, vec![Event::WorkerIdle(1), step(5, Some(1)), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(1, vec![5])], "moved to its idle holder");
        // A first step (no holder yet) goes anywhere.
        let actions = d.handle(2, vec![step(6, None), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![6])]);
    }
}
