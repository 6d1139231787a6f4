//! One FLEX instance: the online scheduler of one serving group (SHEPHERD's
//! Algorithms 1 and 2), as a pure state machine over logical time.
//!
//! The group keeps one deadline-ordered queue per model and the batch each of its
//! workers runs. Its handlers ([`FlexGroup::arrive`], [`FlexGroup::complete`],
//! [`FlexGroup::idle`], [`FlexGroup::sweep`]) append [`Decision`]s: start a batch,
//! preempt a worker, drop a request. It never talks to the host: the policy adapter
//! (`lib.rs`) turns decisions into actions, and the tests drive it directly with
//! exact latencies.

use std::collections::{BTreeMap, BTreeSet};

use yardmaster_sdk::helpers::ModelCatalog;
use yardmaster_sdk::{DropReason, Instant, RequestId, StageId, WorkerId};

/// Queue order of a request: (deadline, arrival, id), ascending.
pub type Key = (Instant, Instant, RequestId);

/// How BATCHGEN builds a model's candidate batch (spec §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// The largest feasible contiguous deadline window (ties → most urgent).
    Largest,
    /// The literal Algorithm 2: the feasible prefix from the most urgent request.
    Prefix,
}

/// Which candidate batch wins across models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// FLEX: the largest batch (ties → earlier deadline, then model index).
    Largest,
    /// The EDF-inside-FLEX ablation: the batch with the earliest deadline.
    Earliest,
}

/// The order in which DISPATCH offers busy workers a preempting batch (after every idle
/// worker). Every order keeps Algorithm 1's outcome: DISPATCH repeats until no busy
/// worker runs a batch that a feasible candidate is λ times larger than; the order only
/// picks which worker is preempted first when several qualify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyOrder {
    /// By worker id (spec §9 choice 4's literal order).
    Id,
    /// The batch that started most recently first (the least work thrown away), ties by
    /// id. The default: on the reproduction's cluster it throws away less GPU time and
    /// loses fewer preempted requests than `Id` (docs/flex.md).
    LatestStart,
    /// The batch that would end last first (the worker that frees up last), ties by id.
    LatestEnd,
}

/// The parameters of a FLEX instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Preemption factor λ: a running batch of b is preempted by a feasible batch of at
    /// least λ·b (infinity: never preempt).
    pub lambda: f64,
    /// Largest batch (also capped by the stage's `max-batch`).
    pub max_batch: u32,
    /// Estimated preemption delay as a fraction of the running batch's latency.
    pub preempt_delay_fraction: f64,
    /// Candidate construction.
    pub batch_mode: BatchMode,
    /// Cross-model choice.
    pub selection: Selection,
    /// Order of busy workers in DISPATCH.
    pub busy_order: BusyOrder,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lambda: 3.03,
            max_batch: 128,
            preempt_delay_fraction: 0.0,
            batch_mode: BatchMode::Largest,
            selection: Selection::Largest,
            busy_order: BusyOrder::LatestStart,
        }
    }
}

/// What the scheduler decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run `requests` (deadline order) of `model` on `worker`, starting at `at`.
    Start { worker: WorkerId, model: usize, requests: Vec<RequestId>, at: Instant },
    /// Abort the batch running on `worker`; `requests` were in it.
    Preempt { worker: WorkerId, requests: Vec<RequestId> },
    /// Drop a request that can no longer meet its deadline.
    Drop { request: RequestId, reason: DropReason },
}

/// Where [`FlexGroup::forget`] found a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgotten {
    /// In a queue.
    Queued,
    /// In the batch of this worker.
    InBatch(WorkerId),
    /// Not in this group.
    Unknown,
}

/// A batch a worker runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// Its model.
    pub model: usize,
    /// Its requests, in deadline order.
    pub keys: Vec<Key>,
    /// When it started.
    pub start: Instant,
    /// When it ends if nothing preempts it.
    pub end: Instant,
}

/// A worker of the group.
#[derive(Debug, Clone, PartialEq)]
struct GroupWorker {
    stage: StageId,
    run: Option<Running>,
}

/// Counters of one instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupStats {
    /// Batches started.
    pub starts: u64,
    /// Preemptions decided.
    pub preemptions: u64,
    /// Requests in preempted batches (the sizes summed).
    pub preempted_requests: u64,
    /// Requests in batches that ran to completion.
    pub completed_requests: u64,
    /// Requests dropped.
    pub drops: u64,
}

/// A candidate batch of one model.
#[derive(Debug, Clone, PartialEq)]
struct Candidate {
    model: usize,
    keys: Vec<Key>,
}

/// The FLEX scheduler of one serving group.
#[derive(Debug, Clone)]
pub struct FlexGroup {
    settings: Settings,
    /// Models this group serves (ascending).
    models: Vec<usize>,
    /// Per model (catalog index): queued requests.
    queues: BTreeMap<usize, BTreeSet<Key>>,
    workers: BTreeMap<WorkerId, GroupWorker>,
    stats: GroupStats,
}

impl FlexGroup {
    /// An empty group serving `models` with no workers.
    pub fn new(settings: Settings, models: Vec<usize>) -> Self {
        let mut models = models;
        models.sort_unstable();
        models.dedup();
        let queues = models.iter().map(|&m| (m, BTreeSet::new())).collect();
        Self { settings, models, queues, workers: BTreeMap::new(), stats: GroupStats::default() }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Change the measured-or-configured preemption delay fraction.
    pub fn set_preempt_delay_fraction(&mut self, fraction: f64) {
        self.settings.preempt_delay_fraction = fraction.max(0.0);
    }

    /// Counters.
    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }

    /// The models this group serves.
    pub fn models(&self) -> &[usize] {
        &self.models
    }

    /// Add a worker (idle) running models of `stage`.
    pub fn add_worker(&mut self, worker: WorkerId, stage: StageId) {
        self.workers.entry(worker).or_insert(GroupWorker { stage, run: None });
    }

    /// Add a worker that already runs a batch (a plan moved it here).
    pub fn adopt_worker(&mut self, worker: WorkerId, stage: StageId, run: Option<Running>) {
        self.workers.insert(worker, GroupWorker { stage, run });
    }

    /// Remove a worker, returning the batch it was running.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Option<(StageId, Option<Running>)> {
        self.workers.remove(&worker).map(|w| (w.stage, w.run))
    }

    /// The workers, by id.
    pub fn worker_ids(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers.keys().copied()
    }

    /// The batch a worker runs, if any.
    pub fn running(&self, worker: WorkerId) -> Option<&Running> {
        self.workers.get(&worker).and_then(|w| w.run.as_ref())
    }

    /// Whether the group has `worker`.
    pub fn has_worker(&self, worker: WorkerId) -> bool {
        self.workers.contains_key(&worker)
    }

    /// Queued requests of every model, for a plan change to move them.
    pub fn take_queued(&mut self) -> Vec<(usize, Key)> {
        let mut out = Vec::new();
        for (&model, queue) in &mut self.queues {
            out.extend(std::mem::take(queue).into_iter().map(|k| (model, k)));
        }
        out
    }

    /// Every queued request with its model (model order, then deadline order).
    pub fn queued_keys(&self) -> impl Iterator<Item = (usize, Key)> + '_ {
        self.queues.iter().flat_map(|(&m, q)| q.iter().map(move |k| (m, *k)))
    }

    /// Number of queued requests.
    pub fn queued(&self) -> usize {
        self.queues.values().map(BTreeSet::len).sum()
    }

    /// Whether `key` of `model` is queued.
    pub fn is_queued(&self, model: usize, key: &Key) -> bool {
        self.queues.get(&model).is_some_and(|q| q.contains(key))
    }

    /// Put a request in its queue without dispatching (plan changes, coalesced arrivals).
    pub fn enqueue(&mut self, model: usize, key: Key) {
        if !self.queues.contains_key(&model) {
            self.models.push(model);
            self.models.sort_unstable();
        }
        self.queues.entry(model).or_default().insert(key);
    }

    /// Forget a request the host ended: out of its queue, or out of a batch (a batch
    /// left empty makes its worker idle).
    pub fn forget(&mut self, model: usize, key: &Key) -> Forgotten {
        if self.queues.get_mut(&model).is_some_and(|q| q.remove(key)) {
            return Forgotten::Queued;
        }
        for (&id, worker) in &mut self.workers {
            if let Some(run) = worker.run.as_mut() {
                if let Some(at) = run.keys.iter().position(|k| k == key) {
                    run.keys.remove(at);
                    if run.keys.is_empty() {
                        worker.run = None;
                    }
                    return Forgotten::InBatch(id);
                }
            }
        }
        Forgotten::Unknown
    }

    /// A worker's batch ended without FLEX choosing the next one (the caller decides).
    pub fn complete_without_restart(&mut self, worker: WorkerId) {
        if let Some(run) = self.workers.get_mut(&worker).and_then(|w| w.run.take()) {
            self.stats.completed_requests += run.keys.len() as u64;
        }
    }

    /// The host handed a worker's batch back without running it: its requests return
    /// to their queue and the worker is idle.
    pub fn requeue_run(&mut self, worker: WorkerId) {
        if let Some(run) = self.workers.get_mut(&worker).and_then(|w| w.run.take()) {
            for key in run.keys {
                self.enqueue(run.model, key);
            }
        }
    }

    /// A batch that runs outside FLEX's choice (an iteration worker continuing its
    /// resident sequences) occupies `worker`.
    pub fn occupy(&mut self, catalog: &ModelCatalog, worker: WorkerId, model: usize, keys: Vec<Key>, now: Instant) {
        let end = now + catalog.get(model).latency(keys.len() as u32);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.run = Some(Running { model, keys, start: now, end });
        }
    }

    /// ON_ARRIVAL (lines 14–16): drop what cannot finish even alone, queue the rest,
    /// then DISPATCH.
    pub fn arrive(&mut self, catalog: &ModelCatalog, model: usize, key: Key, now: Instant, out: &mut Vec<Decision>) {
        if !feasible_alone(catalog, model, &key, now) {
            self.stats.drops += 1;
            out.push(Decision::Drop { request: key.2, reason: DropReason::DeadlineUnreachable });
            return;
        }
        self.enqueue(model, key);
        self.dispatch(catalog, now, out);
    }

    /// ON_COMPLETION (lines 31–32): the worker's batch finished; give it the largest
    /// feasible batch. Never preempts.
    pub fn complete(&mut self, catalog: &ModelCatalog, worker: WorkerId, now: Instant, out: &mut Vec<Decision>) {
        let Some(w) = self.workers.get_mut(&worker) else { return };
        if let Some(run) = w.run.take() {
            self.stats.completed_requests += run.keys.len() as u64;
        }
        self.idle(catalog, worker, now, out);
    }

    /// An idle worker (at start-up, or freed without a completion) takes the largest
    /// feasible batch, if any.
    pub fn idle(&mut self, catalog: &ModelCatalog, worker: WorkerId, now: Instant, out: &mut Vec<Decision>) {
        if self.workers.get(&worker).is_none_or(|w| w.run.is_some()) {
            return;
        }
        if let Some(candidate) = self.batchgen(catalog, worker, now, out) {
            self.start(catalog, worker, candidate, now, out);
        }
    }

    /// The optional tick sweep: drop every queued request that can no longer finish.
    pub fn sweep(&mut self, catalog: &ModelCatalog, now: Instant, out: &mut Vec<Decision>) {
        let models = self.models.clone();
        for model in models {
            self.drop_unreachable(catalog, model, now, out);
        }
    }

    /// DISPATCH (lines 17–30): idle workers first, by id, then busy ones in
    /// `busy_order`; an idle
    /// worker starts the largest feasible batch, a busy one is preempted when that
    /// batch is at least λ times its running batch, and the loop restarts after each
    /// preemption.
    pub fn dispatch(&mut self, catalog: &ModelCatalog, now: Instant, out: &mut Vec<Decision>) {
        loop {
            let mut busy: Vec<(WorkerId, &Running)> =
                self.workers.iter().filter_map(|(&id, w)| w.run.as_ref().map(|r| (id, r))).collect();
            match self.settings.busy_order {
                BusyOrder::Id => {}
                BusyOrder::LatestStart => busy.sort_by_key(|(id, r)| (std::cmp::Reverse(r.start), *id)),
                BusyOrder::LatestEnd => busy.sort_by_key(|(id, r)| (std::cmp::Reverse(r.end), *id)),
            }
            let order: Vec<WorkerId> = self
                .workers
                .iter()
                .filter(|(_, w)| w.run.is_none())
                .map(|(&id, _)| id)
                .chain(busy.into_iter().map(|(id, _)| id))
                .collect();
            let mut restarted = false;
            for worker in order {
                if let Some(run) = self.workers[&worker].run.as_ref() {
                    // No batch could reach λ·b: skip BATCHGEN (it only reads).
                    let needed = self.settings.lambda * run.keys.len() as f64;
                    if (self.size_bound(catalog, worker) as f64) < needed {
                        continue;
                    }
                }
                let Some(candidate) = self.batchgen(catalog, worker, now, out) else { continue };
                let running = self.workers[&worker].run.as_ref().map(|r| r.keys.len());
                match running {
                    None => self.start(catalog, worker, candidate, now, out),
                    Some(size) => {
                        if (candidate.keys.len() as f64) < self.settings.lambda * size as f64 {
                            continue;
                        }
                        self.preempt(catalog, worker, candidate, now, out);
                        restarted = true;
                        break;
                    }
                }
            }
            if !restarted {
                return;
            }
        }
    }

    /// Lines 25–28: abort `worker`'s batch, start `candidate` there after the
    /// preemption delay, and put the old batch's other requests back (or drop them).
    fn preempt(&mut self, catalog: &ModelCatalog, worker: WorkerId, candidate: Candidate, now: Instant, out: &mut Vec<Decision>) {
        let delay = self.preempt_delay(catalog, worker);
        let old = self.workers.get_mut(&worker).and_then(|w| w.run.take()).expect("a running batch");
        self.stats.preemptions += 1;
        self.stats.preempted_requests += old.keys.len() as u64;
        out.push(Decision::Preempt { worker, requests: old.keys.iter().map(|k| k.2).collect() });
        let chosen: BTreeSet<RequestId> = candidate.keys.iter().map(|k| k.2).collect();
        self.start(catalog, worker, candidate, now + delay, out);
        for key in old.keys {
            if chosen.contains(&key.2) {
                continue;
            }
            if feasible_alone(catalog, old.model, &key, now) {
                self.enqueue(old.model, key);
            } else {
                self.stats.drops += 1;
                out.push(Decision::Drop { request: key.2, reason: DropReason::Preempted });
            }
        }
    }

    /// δ_pre for a worker: the configured fraction of its running batch's latency.
    fn preempt_delay(&self, catalog: &ModelCatalog, worker: WorkerId) -> Instant {
        match self.workers.get(&worker).and_then(|w| w.run.as_ref()) {
            Some(run) if self.settings.preempt_delay_fraction > 0.0 => {
                let latency = catalog.get(run.model).latency(run.keys.len() as u32) as f64;
                (latency * self.settings.preempt_delay_fraction).round() as Instant
            }
            _ => 0,
        }
    }

    /// START: take the batch's requests out of their queue and occupy the worker.
    fn start(&mut self, catalog: &ModelCatalog, worker: WorkerId, candidate: Candidate, at: Instant, out: &mut Vec<Decision>) {
        if let Some(queue) = self.queues.get_mut(&candidate.model) {
            for key in &candidate.keys {
                queue.remove(key);
            }
        }
        let end = at + catalog.get(candidate.model).latency(candidate.keys.len() as u32);
        let requests = candidate.keys.iter().map(|k| k.2).collect();
        self.stats.starts += 1;
        out.push(Decision::Start { worker, model: candidate.model, requests, at });
        if let Some(w) = self.workers.get_mut(&worker) {
            w.run = Some(Running { model: candidate.model, keys: candidate.keys, start: at, end });
        }
    }

    /// Line 4: drop queued requests of `model` that cannot finish even alone (they sit
    /// at the front, the queue being in deadline order).
    fn drop_unreachable(&mut self, catalog: &ModelCatalog, model: usize, now: Instant, out: &mut Vec<Decision>) {
        let Some(queue) = self.queues.get_mut(&model) else { return };
        while let Some(first) = queue.first().copied() {
            if feasible_alone(catalog, model, &first, now) {
                break;
            }
            queue.pop_first();
            self.stats.drops += 1;
            out.push(Decision::Drop { request: first.2, reason: DropReason::DeadlineUnreachable });
        }
    }

    /// BATCHGEN(n, t) (Algorithm 2): the largest feasible batch for `worker` over every
    /// model its stage serves, its own running requests included.
    fn batchgen(&mut self, catalog: &ModelCatalog, worker: WorkerId, now: Instant, out: &mut Vec<Decision>) -> Option<Candidate> {
        let stage = self.workers.get(&worker)?.stage;
        let delay = self.preempt_delay(catalog, worker);
        let start = now + delay;
        let models: Vec<usize> = self.models.iter().copied().filter(|&m| catalog.get(m).stage == stage).collect();
        let mut best: Option<(usize, Window)> = None;
        for model in models {
            let running_here = self.workers[&worker].run.as_ref().filter(|r| r.model == model).is_some();
            if self.queues.get(&model).is_none_or(BTreeSet::is_empty) && !running_here {
                continue;
            }
            self.drop_unreachable(catalog, model, now, out);
            let extra = self.extra(worker, model);
            let Some(window) = self.window(catalog, model, &self.queues[&model], extra, start) else { continue };
            if best.as_ref().is_none_or(|(m, b)| self.better((model, &window), (*m, b))) {
                best = Some((model, window));
            }
        }
        let (model, window) = best?;
        let keys = self.window_keys(catalog, model, worker, start, &window);
        Some(Candidate { model, keys })
    }

    /// The running requests of `worker` if it runs `model` (they may be re-batched).
    fn extra(&self, worker: WorkerId, model: usize) -> &[Key] {
        match self.workers.get(&worker).and_then(|w| w.run.as_ref()) {
            Some(run) if run.model == model => &run.keys,
            _ => &[],
        }
    }

    /// Whether candidate `a` beats `b` across models.
    fn better(&self, a: (usize, &Window), b: (usize, &Window)) -> bool {
        use std::cmp::Reverse;
        match self.settings.selection {
            Selection::Largest => (Reverse(a.1.size), a.1.deadline, a.0) < (Reverse(b.1.size), b.1.deadline, b.0),
            Selection::Earliest => (a.1.deadline, Reverse(a.1.size), a.0) < (b.1.deadline, Reverse(b.1.size), b.0),
        }
    }

    /// The most requests any batch for `worker` could have: per model, its queue plus
    /// the worker's own running requests, capped by the batch limit. A cheap bound that
    /// spares BATCHGEN on busy workers no candidate could preempt.
    fn size_bound(&self, catalog: &ModelCatalog, worker: WorkerId) -> usize {
        let Some(w) = self.workers.get(&worker) else { return 0 };
        self.models
            .iter()
            .filter(|&&m| catalog.get(m).stage == w.stage)
            .map(|&m| {
                let limit = self.settings.max_batch.min(catalog.get(m).max_batch) as usize;
                (self.queues.get(&m).map_or(0, BTreeSet::len) + self.extra(worker, m).len()).min(limit)
            })
            .max()
            .unwrap_or(0)
    }

    /// Lines 5–11 for one model: among the requests of `queue` and `extra` (both in
    /// deadline order) that can finish alone when started at `start`, the window that
    /// forms the batch (`None` when empty).
    fn window(&self, catalog: &ModelCatalog, model: usize, queue: &BTreeSet<Key>, extra: &[Key], start: Instant) -> Option<Window> {
        let info = catalog.get(model);
        let limit = self.settings.max_batch.min(info.max_batch).max(1);
        let alone = info.latency(1);
        let feasible = move |k: &Key| start.saturating_add(alone) <= k.0;
        let merged = || merge_sorted(queue.iter().copied(), extra.iter().copied()).filter(feasible);
        // Largest batch whose earliest deadline is `d`.
        let fits = |d: Instant| info.largest_batch_within(d.saturating_sub(start), limit) as usize;
        let (from, size) = match self.settings.batch_mode {
            BatchMode::Prefix => {
                let first = merged().next()?;
                (0, merged().count().min(fits(first.0)))
            }
            BatchMode::Largest => {
                // The infeasible requests sit at the front of the queue.
                let skipped = queue.iter().take_while(|k| !feasible(k)).count();
                let q = queue.len() - skipped + extra.iter().filter(|k| feasible(k)).count();
                let (mut best_from, mut best_size) = (0, 0);
                for (i, key) in merged().enumerate() {
                    let remaining = q - i;
                    if remaining <= best_size {
                        break;
                    }
                    let k = fits(key.0);
                    let size = remaining.min(k);
                    if size > best_size {
                        (best_from, best_size) = (i, size);
                    }
                    if k >= limit as usize {
                        // Later windows are capped by `limit` too and have fewer requests.
                        break;
                    }
                }
                (best_from, best_size)
            }
        };
        if size == 0 {
            return None;
        }
        let deadline = merged().nth(from).map_or(Instant::MAX, |k| k.0);
        Some(Window { from, size, deadline })
    }

    /// The requests of a window found by [`Self::window`].
    fn window_keys(&self, catalog: &ModelCatalog, model: usize, worker: WorkerId, start: Instant, window: &Window) -> Vec<Key> {
        let alone = catalog.get(model).latency(1);
        let extra = self.extra(worker, model);
        merge_sorted(self.queues[&model].iter().copied(), extra.iter().copied())
            .filter(|k| start.saturating_add(alone) <= k.0)
            .skip(window.from)
            .take(window.size)
            .collect()
    }
}

/// A candidate batch as a window of a model's feasible requests in deadline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// Index of its first request.
    from: usize,
    /// Its size.
    size: usize,
    /// Its earliest deadline.
    deadline: Instant,
}

/// `t + l_m(1) ≤ d_r`: the request could still finish if it started alone at `now`.
pub fn feasible_alone(catalog: &ModelCatalog, model: usize, key: &Key, now: Instant) -> bool {
    now.saturating_add(catalog.get(model).latency(1)) <= key.0
}

/// Two ascending iterators merged into one ascending iterator.
fn merge_sorted<I: Iterator<Item = Key>, J: Iterator<Item = Key>>(a: I, b: J) -> impl Iterator<Item = Key> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) => {
            if x <= y {
                a.next()
            } else {
                b.next()
            }
        }
        (Some(_), None) => a.next(),
        (None, Some(_)) => b.next(),
        (None, None) => None,
    })
}
