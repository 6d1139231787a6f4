//! Batches that fit: the SDK's guard on every dispatch, so that every policy built on
//! it keeps two rules of the contract without knowing them — a batch is at most the
//! stage's batch limit in *items* (a client batch of N rows is one request of N items,
//! never split), and a step of a stateful sequence runs only on the worker that holds
//! the sequence (`request.correlation.worker`).
//!
//! Most requests carry one item and no sequence; the guard remembers only the others
//! ([`Constraints`]), so a policy that never sees one pays a check of an empty map per
//! dispatch. When a dispatch breaks a rule, the guard dispatches the part that keeps
//! it and withholds the rest: a request that did not fit is handed back to the policy
//! as an arrival at its next call, and a sequence step meant for a busy worker is
//! handed back when that worker goes idle (just before its `worker-idle`). Nothing is
//! dropped and the host is never asked to run a batch it would reject. Batch-forming
//! helpers that count items themselves ([`Ctx::items`](crate::Ctx::items)) never trigger it.

use std::collections::BTreeMap;

use crate::{Request, RequestId, WorkerId};

/// What the guard remembers of the requests that constrain a batch.
#[derive(Debug, Default)]
pub(crate) struct Constraints {
    /// Requests of several items or bound to a worker, by id (as they arrived).
    special: BTreeMap<RequestId, Request>,
    /// Requests withheld from a dispatch, to hand back at the next call.
    next_call: Vec<Request>,
    /// Sequence steps withheld from a dispatch, to hand back when their worker is idle.
    when_idle: BTreeMap<WorkerId, Vec<Request>>,
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

    /// A request the host ended: also no longer to hand back.
    pub(crate) fn ended(&mut self, id: RequestId) {
        self.forget(id);
        self.next_call.retain(|r| r.id != id);
        for waiting in self.when_idle.values_mut() {
            waiting.retain(|r| r.id != id);
        }
    }

    /// Items a held request carries (1 unless it said otherwise).
    pub(crate) fn items(&self, id: RequestId) -> u32 {
        self.special.get(&id).map_or(1, |r| r.items.max(1))
    }

    /// Split a dispatch of `requests` on `worker` into what keeps the rules: sequence
    /// steps go to their holder (run there now, as a batch of their own, when
    /// `is_idle` says it is idle; else handed back when it goes idle), and the batch is
    /// at most `limit` items (a request alone up to `max_batch`): requests of several
    /// items are withheld, the last first, until it fits, and handed back at the next
    /// call. (A batch over the limit in one-item requests alone is the policy's own
    /// doing and left for the host to reject.)
    pub(crate) fn fit(
        &mut self,
        worker: WorkerId,
        requests: Vec<RequestId>,
        limit: u32,
        max_batch: u32,
        is_idle: impl Fn(WorkerId) -> bool,
    ) -> Fitted {
        if self.special.is_empty() {
            return Fitted { batch: requests, elsewhere: Vec::new() };
        }
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
        fitted.batch = self.within(fitted.batch, limit, max_batch);
        fitted.elsewhere = elsewhere.into_iter().map(|(w, batch)| (w, self.within(batch, limit, max_batch))).collect();
        fitted
    }

    /// `batch` with requests of several items withheld, the last first, until it is
    /// at most `limit` items (a request alone up to `max_batch`).
    fn within(&mut self, mut batch: Vec<RequestId>, limit: u32, max_batch: u32) -> Vec<RequestId> {
        let fits = |batch: &[RequestId], special: &BTreeMap<RequestId, Request>| {
            let items: u32 = batch.iter().map(|id| special.get(id).map_or(1, |r| r.items.max(1))).sum();
            items <= limit || (batch.len() == 1 && items <= max_batch.max(limit))
        };
        while !fits(&batch, &self.special) {
            let Some(at) = batch.iter().rposition(|id| self.special.get(id).is_some_and(|r| r.items > 1)) else { break };
            if batch.len() == 1 {
                break;
            }
            let id = batch.remove(at);
            let request = self.special.remove(&id).expect("a request of several items is remembered");
            self.next_call.push(request);
        }
        batch
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

    /// Sequence steps held for a worker that is gone: handed back at the next call
    /// (the host fails them, as their state went with the worker).
    pub(crate) fn worker_gone(&mut self, worker: WorkerId) {
        if let Some(waiting) = self.when_idle.remove(&worker) {
            self.next_call.extend(waiting);
        }
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
    fn a_batch_is_kept_within_the_limit_in_items_and_what_did_not_fit_comes_back() {
        let mut d = driver(1, 4);
        // Requests of 2, 1, 2 and 1 items: 6 items in 4 requests.
        let actions = d.handle(1, vec![items(1, 2), items(2, 1), items(3, 2), items(4, 1), Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![1, 2, 4])], "the last 2-item request is withheld: 2 + 1 + 1 items");
        // At the next call the withheld request is handed back to the policy and runs.
        let actions = d.handle(2, vec![Event::WorkerIdle(0)]);
        assert_eq!(dispatches(&actions), [(0, vec![3])]);
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
