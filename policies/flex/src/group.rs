//! One FLEX instance: the online scheduler of one serving group (SHEPHERD's
//! Algorithms 1 and 2), as a pure state machine over logical time.
//!
//! The group keeps one deadline-ordered queue per model and the batch each of its
//! workers runs. Its handlers ([`FlexGroup::arrive`], [`FlexGroup::complete`],
//! [`FlexGroup::idle`], [`FlexGroup::sweep`]) append [`Decision`]s: start a batch,
//! preempt a worker, drop a request. It never talks to the host: the policy adapter
//! (`lib.rs`) turns decisions into actions, and the tests drive it directly with
//! exact latencies.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

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
    /// FLEX as written: the largest batch (ties → earlier deadline, then model index).
    Largest,
    /// The default: earliest deadline first while the group can still meet every
    /// queued deadline that way, the largest batch once it cannot (an idle worker's
    /// choice; a preempting batch is always the largest).
    Adaptive,
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
    /// Skip a preemption of a batch of b unless the preempting batch would lose at
    /// least λ·b of its requests by waiting for the group's other workers (false:
    /// Algorithm 1 as written). With one worker it never skips.
    pub defer_preemption: bool,
    /// Stages (of a pipeline: those with stages after them) where an idle worker of a
    /// loaded group takes the freshest window — the requests with the latest deadlines
    /// — rather than the earliest that fit ([`FlexGroup`]'s BATCHGEN; a preempting
    /// batch keeps the paper's window; empty: none, the paper's rule).
    pub fresh_stages: Vec<StageId>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lambda: 3.03,
            max_batch: 128,
            preempt_delay_fraction: 0.0,
            batch_mode: BatchMode::Largest,
            selection: Selection::Adaptive,
            busy_order: BusyOrder::LatestStart,
            defer_preemption: true,
            fresh_stages: Vec::new(),
        }
    }
}

impl Settings {
    /// FLEX as the paper writes it (spec §3): the largest batch always wins, every
    /// preemption the λ rule allows is made, and DISPATCH offers busy workers by id.
    pub fn paper() -> Self {
        Self { selection: Selection::Largest, defer_preemption: false, busy_order: BusyOrder::Id, ..Self::default() }
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
        // Only the arrival's stage changed: the other stages' workers are as their
        // last dispatch left them.
        self.dispatch_stage(catalog, now, Some(catalog.get(model).stage), out);
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
    /// `busy_order`; an idle worker starts the largest feasible batch (or the adaptive
    /// selection's), a busy one is preempted when that batch is at least λ times its
    /// running batch (and, with `defer_preemption`, waiting would lose at least as
    /// many), and the loop restarts after each preemption.
    pub fn dispatch(&mut self, catalog: &ModelCatalog, now: Instant, out: &mut Vec<Decision>) {
        self.dispatch_stage(catalog, now, None, out);
    }

    /// DISPATCH over the workers of `stage` only (every worker when `None`): after
    /// arrivals at that stage alone, the other stages' workers are as their last
    /// dispatch left them.
    pub fn dispatch_stage(&mut self, catalog: &ModelCatalog, now: Instant, stage: Option<StageId>, out: &mut Vec<Decision>) {
        let of_stage = |w: &GroupWorker| stage.is_none_or(|s| w.stage == s);
        loop {
            let mut busy: Vec<(WorkerId, &Running)> =
                self.workers.iter().filter(|(_, w)| of_stage(w)).filter_map(|(&id, w)| w.run.as_ref().map(|r| (id, r))).collect();
            match self.settings.busy_order {
                BusyOrder::Id => {}
                BusyOrder::LatestStart => busy.sort_by_key(|(id, r)| (std::cmp::Reverse(r.start), *id)),
                BusyOrder::LatestEnd => busy.sort_by_key(|(id, r)| (std::cmp::Reverse(r.end), *id)),
            }
            let order: Vec<WorkerId> = self
                .workers
                .iter()
                .filter(|(_, w)| of_stage(w) && w.run.is_none())
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
                        if self.settings.defer_preemption
                            && (self.lost_by_waiting(catalog, &candidate, worker, now) as f64) < self.settings.lambda * size as f64
                        {
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
        let (mut model, mut window) = best?;
        let mut urgent = None;
        if self.settings.selection == Selection::Adaptive {
            urgent = self.edf_when_feasible(catalog, worker, start);
        }
        if let Some(chosen) = urgent {
            (model, window) = chosen;
        } else if self.settings.fresh_stages.contains(&stage) && self.workers[&worker].run.is_none() {
            if let Some(fresh) = self.fresh_window(catalog, model, &self.queues[&model], start) {
                window = fresh;
            }
        }
        let keys = self.window_keys(model, worker, &window);
        Some(Candidate { model, keys })
    }

    /// How many of `candidate`'s requests would miss their deadlines if, instead of
    /// preempting `worker` now, they waited for the group's other workers that serve
    /// its model's stage: each, in the order they free, takes the largest feasible batch
    /// of what is left of the candidate (other models' claims on those workers are
    /// ignored). The whole candidate when there is no such worker.
    fn lost_by_waiting(&self, catalog: &ModelCatalog, candidate: &Candidate, worker: WorkerId, now: Instant) -> usize {
        let stage = catalog.get(candidate.model).stage;
        let mut frees: Vec<Instant> =
            self.workers.iter().filter(|(&id, w)| id != worker && w.stage == stage).map(|(_, w)| w.free_at(now)).collect();
        frees.sort_unstable();
        let mut left: BTreeSet<Key> = candidate.keys.iter().copied().collect();
        for free in frees {
            let Some(window) = self.window(catalog, candidate.model, &left, &[], free) else { continue };
            let taken: Vec<Key> = members_from(&left, &[], window.first).take(window.size).collect();
            for key in taken {
                left.remove(&key);
            }
            if left.is_empty() {
                break;
            }
        }
        left.len()
    }

    /// The adaptive selection's choice for an idle `worker`: when every queued request
    /// can still meet its deadline if the group serves the queues earliest deadline
    /// first (each batch as large as its most urgent request allows, on whichever
    /// worker frees first), the batch of the most urgent request; `None` (the largest
    /// batch wins) when that schedule would miss a deadline or needs more batches than
    /// the check plays out.
    fn edf_when_feasible(&self, catalog: &ModelCatalog, worker: WorkerId, start: Instant) -> Option<(usize, Window)> {
        /// Batches the check plays out before it calls the group loaded. It runs for
        /// every idle worker at every arrival, reading up to this many batches of the
        /// queue: at 256, one call on the random-application sweep (r04 at 5×, a
        /// burst of arrivals with a long queue) ran out of its 50 M units of fuel and
        /// the fallback served the rest (0.49 of the bound). At 32, over the 21
        /// applications, 6 loads and 2 seeds: no fault, r04 at 5× 0.85 of the bound,
        /// no application and load losing more than 0.025 of the bound (docs/flex.md).
        const CHECK_LIMIT: usize = 32;
        let w = self.workers.get(&worker)?;
        if w.run.is_some() {
            return None;
        }
        let stage = w.stage;
        // Per model of the stage: the deadlines of its requests that can still finish
        // alone, in order, read lazily (the check stops after CHECK_LIMIT batches).
        let mut pending = Vec::new();
        let mut first_keys = Vec::new();
        let mut heads: BinaryHeap<Reverse<(Instant, usize, usize)>> = BinaryHeap::new();
        for (&model, queue) in &self.queues {
            let info = catalog.get(model);
            if info.stage != stage {
                continue;
            }
            let mut requests = queue.range(lowest_key(start.saturating_add(info.latency(1)))..).peekable();
            if let Some(&&first) = requests.peek() {
                heads.push(Reverse((first.0, model, pending.len())));
                first_keys.push(first);
                pending.push(requests.map(|k| k.0).peekable());
            }
        }
        let mut free: BinaryHeap<Reverse<(Instant, WorkerId)>> = self
            .workers
            .iter()
            .filter(|(_, other)| other.stage == stage)
            .map(|(&id, other)| Reverse((if id == worker { start } else { other.free_at(start) }, id)))
            .collect();
        let mut first: Option<(usize, Window)> = None;
        for _ in 0..CHECK_LIMIT {
            let Some(Reverse((deadline, model, i))) = heads.pop() else { return first };
            let Reverse((at, id)) = free.pop()?;
            let info = catalog.get(model);
            let limit = self.settings.max_batch.min(info.max_batch).max(1);
            let fits = info.largest_batch_within(deadline.saturating_sub(at), limit) as usize;
            let requests = &mut pending[i];
            let size = requests.by_ref().take(fits).count();
            if size == 0 {
                return None;
            }
            first.get_or_insert((model, Window { first: first_keys[i], size }));
            free.push(Reverse((at + info.latency(size as u32), id)));
            if let Some(&next) = requests.peek() {
                heads.push(Reverse((next, model, i)));
            }
        }
        None
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
        match self.settings.selection {
            Selection::Largest | Selection::Adaptive => (Reverse(a.1.size), a.1.deadline(), a.0) < (Reverse(b.1.size), b.1.deadline(), b.0),
            Selection::Earliest => (a.1.deadline(), Reverse(a.1.size), a.0) < (b.1.deadline(), Reverse(b.1.size), b.0),
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
    ///
    /// Its cost is bounded by the batch limit, not the queue: at most log₂(limit) + 2
    /// reads of at most `limit` requests each, however long the queue grows under
    /// overload.
    fn window(&self, catalog: &ModelCatalog, model: usize, queue: &BTreeSet<Key>, extra: &[Key], start: Instant) -> Option<Window> {
        let info = catalog.get(model);
        let limit = self.settings.max_batch.min(info.max_batch).max(1);
        // Largest batch whose earliest deadline is `d`.
        let fits = |d: Instant| info.largest_batch_within(d.saturating_sub(start), limit) as usize;
        // The window starts at the first request that fits a batch of `low`: 1 for the
        // literal prefix (the first that can still finish alone; the infeasible ones
        // sit at the front of the queue), b* for the largest window.
        let low = match self.settings.batch_mode {
            BatchMode::Prefix => 1,
            BatchMode::Largest => {
                // The largest window has b* requests or more, b* the largest batch
                // with at least b* requests whose deadlines each fit a batch of b*
                // (whether b requests fit is monotone in b: found by bisection). It
                // starts at the first of those requests: an earlier start fits fewer
                // than b*, a later one has fewer than b* + 1 behind it.
                let fits_batch = |b: usize| {
                    let threshold = lowest_key(start.saturating_add(info.latency(b as u32)));
                    members_from(queue, extra, threshold).take(b).count() >= b
                };
                let (mut low, mut high) = (1, fits(Instant::MAX).max(1));
                while low < high {
                    let mid = (low + high).div_ceil(2);
                    if fits_batch(mid) {
                        low = mid;
                    } else {
                        high = mid - 1;
                    }
                }
                low
            }
        };
        let first = members_from(queue, extra, lowest_key(start.saturating_add(info.latency(low as u32)))).next()?;
        let size = members_from(queue, extra, first).take(fits(first.0)).count();
        Some(Window { first, size })
    }

    /// The freshest window of `queue` for an idle worker's batch started at `start`: the
    /// requests with the latest deadlines, as many as fit a batch (the most `b` whose
    /// `b` latest deadlines each allow a batch of `b`; at least as many as the window of
    /// [`Self::window`]). Reads at most the batch limit's requests.
    fn fresh_window(&self, catalog: &ModelCatalog, model: usize, queue: &BTreeSet<Key>, start: Instant) -> Option<Window> {
        let info = catalog.get(model);
        let limit = self.settings.max_batch.min(info.max_batch).max(1) as usize;
        let mut window = None;
        for (index, &key) in queue.iter().rev().take(limit).enumerate() {
            if start.saturating_add(info.latency(index as u32 + 1)) > key.0 {
                break;
            }
            window = Some(Window { first: key, size: index + 1 });
        }
        window
    }

    /// The requests of a window found by [`Self::window`] for `worker`.
    fn window_keys(&self, model: usize, worker: WorkerId, window: &Window) -> Vec<Key> {
        members_from(&self.queues[&model], self.extra(worker, model), window.first).take(window.size).collect()
    }
}

impl GroupWorker {
    /// When the worker can start a new batch, seen at `now`: now if idle, else when its
    /// batch ends.
    fn free_at(&self, now: Instant) -> Instant {
        self.run.as_ref().map_or(now, |r| r.end.max(now))
    }
}

/// The requests of `queue` and `extra` (each in queue order) from `from` on, merged.
fn members_from<'a>(queue: &'a BTreeSet<Key>, extra: &'a [Key], from: Key) -> impl Iterator<Item = Key> + 'a {
    merge_sorted(queue.range(from..).copied(), extra.iter().copied().filter(move |k| *k >= from))
}

/// The smallest key with deadline `deadline`: every request from it on in queue order
/// has a deadline at least `deadline`.
fn lowest_key(deadline: Instant) -> Key {
    (deadline, Instant::MIN, RequestId::MIN)
}

/// A candidate batch: `size` requests of one model in deadline order, from `first` on
/// (every one of them can still finish alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// Its first request: the earliest deadline.
    first: Key,
    /// Its size.
    size: usize,
}

impl Window {
    /// Its earliest deadline.
    fn deadline(&self) -> Instant {
        self.first.0
    }
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
