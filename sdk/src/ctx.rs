//! The policy's view of the world during a call: configuration, workers, clock,
//! parameters, profiles, and the actions it has emitted so far.

use std::collections::BTreeMap;

use crate::fit::Constraints;

use crate::{
    Action, Config, Defer, Dispatch, DropReason, DropRequest, Duration, Evict, EvictMode, Host, Instant, LatencyTable, Level, Placement,
    RequestId, Route, Scale, SequenceState, SetBatchLimit, SetRoutes, SetThreads, SetTimer, SetVariant, StageId, VariantId, VariantTarget,
    Worker, WorkerId,
};

/// A worker as the SDK tracks it: its description and whether it is free.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    /// The worker as the host described it.
    pub info: Worker,
    /// True from its `worker-idle` event until the policy dispatches to it.
    pub idle: bool,
}

/// Worker ids below this are kept in a slot each; larger ones in a map.
const DENSE_WORKER_IDS: WorkerId = 4096;

/// Workers by id, ascending. Hosts number their workers from 0, so a look-up is an
/// index into a slot per id: policies look workers up on every event (is it idle,
/// what does a batch on it cost), and inside a component a B-tree search costs about
/// three times what it does natively. The rare id past [`DENSE_WORKER_IDS`] goes to a
/// map, so a host numbering its workers sparsely costs no memory per unused id there.
#[derive(Debug, Clone, Default)]
struct WorkerTable {
    dense: Vec<Option<WorkerView>>,
    sparse: BTreeMap<WorkerId, WorkerView>,
}

impl WorkerTable {
    fn get(&self, id: WorkerId) -> Option<&WorkerView> {
        if id < DENSE_WORKER_IDS {
            self.dense.get(id as usize)?.as_ref()
        } else {
            self.sparse.get(&id)
        }
    }

    fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerView> {
        if id < DENSE_WORKER_IDS {
            self.dense.get_mut(id as usize)?.as_mut()
        } else {
            self.sparse.get_mut(&id)
        }
    }

    /// Add a worker, or replace the one with its id.
    fn insert(&mut self, view: WorkerView) {
        let id = view.info.id;
        if id < DENSE_WORKER_IDS {
            let index = id as usize;
            if self.dense.len() <= index {
                self.dense.resize(index + 1, None);
            }
            self.dense[index] = Some(view);
        } else {
            self.sparse.insert(id, view);
        }
    }

    fn remove(&mut self, id: WorkerId) {
        if id < DENSE_WORKER_IDS {
            if let Some(slot) = self.dense.get_mut(id as usize) {
                *slot = None;
            }
        } else {
            self.sparse.remove(&id);
        }
    }

    /// Every worker, lowest id first (every sparse id is above every dense one).
    fn values(&self) -> impl Iterator<Item = &WorkerView> {
        self.dense.iter().flatten().chain(self.sparse.values())
    }
}

/// What a policy method can see and do.
pub struct Ctx {
    config: Config,
    host: Box<dyn Host + Send>,
    latency: LatencyTable,
    workers: WorkerTable,
    /// Idle workers per stage, ascending (kept in step with `workers`).
    idle_by_stage: Vec<Vec<WorkerId>>,
    batch_limits: Vec<u32>,
    resident: BTreeMap<WorkerId, Vec<SequenceState>>,
    actions: Vec<Action>,
    now: Instant,
    /// Requests that constrain a batch (several items, a sequence's worker), and what
    /// the guard holds back of a dispatch (see [`crate::fit`]).
    constraints: Constraints,
}

impl Ctx {
    /// A context for `config` with the given host.
    pub fn new(config: Config, host: Box<dyn Host + Send>) -> Self {
        let latency = LatencyTable::from_config(&config);
        let mut workers = WorkerTable::default();
        for w in &config.workers {
            workers.insert(WorkerView { info: *w, idle: false });
        }
        let mut batch_limits = Vec::new();
        for stage in &config.stages {
            let index = stage.id as usize;
            if batch_limits.len() <= index {
                batch_limits.resize(index + 1, 0);
            }
            batch_limits[index] = stage.max_batch;
        }
        Self {
            idle_by_stage: vec![Vec::new(); batch_limits.len()],
            config,
            host,
            latency,
            workers,
            batch_limits,
            resident: BTreeMap::new(),
            actions: Vec::new(),
            now: 0,
            constraints: Constraints::default(),
        }
    }

    /// The configuration the policy was started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The host's clock at this decision point (delivered with the events, so reading
    /// it costs no host call).
    pub fn now(&self) -> Instant {
        self.now
    }

    pub(crate) fn set_now(&mut self, now: Instant) {
        self.now = now;
    }

    /// The host's services (log, metrics, profiles, random source).
    pub fn host(&self) -> &dyn Host {
        self.host.as_ref()
    }

    /// Write an informational line to the host's log.
    pub fn log(&self, level: Level, message: &str) {
        self.host.log(level, message)
    }

    /// A parameter's raw value.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.config.params.iter().find(|p| p.key == key).map(|p| p.value.as_str())
    }

    /// A parameter parsed as `T`, or `default` when absent.
    ///
    /// A value that does not parse is an error naming the key, so `init` can refuse
    /// the configuration with a clear reason.
    pub fn param_or<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, String> {
        match self.param(key) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|_| format!("parameter `{key}`: cannot parse {raw:?}")),
        }
    }

    /// The profiled latency table.
    pub fn latency(&self) -> &LatencyTable {
        &self.latency
    }

    /// Mean latency of a batch on a worker's stage and variant (0 without a profile).
    pub fn batch_latency(&self, worker: WorkerId, batch: u32) -> Duration {
        self.workers.get(worker).and_then(|w| self.latency.mean(w.info.stage, w.info.variant, batch)).unwrap_or(0)
    }

    /// Every known worker.
    pub fn workers(&self) -> impl Iterator<Item = &WorkerView> {
        self.workers.values()
    }

    /// One worker.
    pub fn worker(&self, id: WorkerId) -> Option<&WorkerView> {
        self.workers.get(id)
    }

    /// Idle workers of a stage, lowest id first.
    pub fn idle_workers(&self, stage: StageId) -> impl Iterator<Item = WorkerId> + '_ {
        self.idle_by_stage.get(stage as usize).into_iter().flatten().copied()
    }

    /// Record a worker's idleness in both views.
    fn set_idle(&mut self, worker: WorkerId, idle: bool) {
        let Some(view) = self.workers.get_mut(worker) else { return };
        view.idle = idle;
        let stage = view.info.stage as usize;
        if self.idle_by_stage.len() <= stage {
            self.idle_by_stage.resize(stage + 1, Vec::new());
        }
        let list = &mut self.idle_by_stage[stage];
        match (list.binary_search(&worker), idle) {
            (Err(at), true) => list.insert(at, worker),
            (Ok(at), false) => {
                list.remove(at);
            }
            _ => {}
        }
    }

    /// Unfinished sequences resident on an iteration-level worker as of its last frame
    /// (they stay paused unless dispatched again).
    pub fn resident(&self, worker: WorkerId) -> &[SequenceState] {
        self.resident.get(&worker).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The current batch limit of a stage: its `max-batch` until changed, by this
    /// policy (`set_batch_limit`) or as a tick's snapshot says the host holds it (a
    /// limit set by the policy this instance took over from, or one the host refused).
    pub fn batch_limit(&self, stage: StageId) -> u32 {
        self.batch_limits.get(stage as usize).copied().unwrap_or(1).max(1)
    }

    /// Actions emitted so far in this call.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }

    /// Items a request the policy holds carries (`request.items`: 1, or a client
    /// batch's rows). A batch's size is the sum of its requests' items; a helper that
    /// forms batches counting items keeps them within the limit itself, and
    /// [`Ctx::dispatch`] runs a batch that would not fit as consecutive runs otherwise.
    pub fn items(&self, request: RequestId) -> u32 {
        self.constraints.items(request)
    }

    /// Drop a request.
    pub fn drop_request(&mut self, request: RequestId, reason: DropReason) {
        self.constraints.ended(request);
        self.forget_sequence(request);
        self.actions.push(Action::Drop(DropRequest { request, reason }));
    }

    /// Run `requests` as one batch on `worker` (which the SDK then counts as busy).
    pub fn dispatch(&mut self, worker: WorkerId, requests: Vec<RequestId>) {
        self.dispatch_variant(worker, requests, None)
    }

    /// Run a batch with an explicit variant.
    ///
    /// The batch is kept within the contract's rules (see [`crate::fit`]): at most the
    /// stage's batch limit in items (a batch over it runs as consecutive runs on the
    /// worker), and a stateful sequence's step only on the worker holding the sequence
    /// (it runs there, at once if that worker is idle, else it comes back as an arrival
    /// when it is).
    pub fn dispatch_variant(&mut self, worker: WorkerId, requests: Vec<RequestId>, variant: Option<VariantId>) {
        if self.constraints.is_clear() {
            // No request of several items or of a sequence is held: nothing to fit.
            self.set_idle(worker, false);
            self.actions.push(Action::Dispatch(Dispatch { worker, requests, variant }));
            return;
        }
        let stage = self.workers.get(worker).map(|w| w.info.stage);
        let (limit, max_batch) = match stage {
            Some(stage) => (self.batch_limit(stage), self.config.stages.iter().find(|s| s.id == stage).map_or(1, |s| s.max_batch)),
            None => (u32::MAX, u32::MAX),
        };
        let workers = &self.workers;
        let fitted = self.constraints.fit(worker, requests, limit, max_batch, variant, |w| workers.get(w).is_some_and(|v| v.idle));
        for (holder, batch) in fitted.elsewhere {
            self.push_dispatch(holder, batch, None);
        }
        if fitted.batch.is_empty() {
            self.constraints.emptied(worker);
        } else {
            self.push_dispatch(worker, fitted.batch, variant);
        }
    }

    pub(crate) fn push_dispatch(&mut self, worker: WorkerId, requests: Vec<RequestId>, variant: Option<VariantId>) {
        for &id in &requests {
            self.constraints.forget(id);
        }
        self.set_idle(worker, false);
        self.actions.push(Action::Dispatch(Dispatch { worker, requests, variant }));
    }

    /// Abort the batch running on a worker; its requests come back as arrivals.
    pub fn preempt(&mut self, worker: WorkerId) {
        self.constraints.preempted(worker);
        self.actions.push(Action::Preempt(worker));
    }

    /// Evict a paused sequence from an iteration-level worker.
    pub fn evict(&mut self, sequence: RequestId, mode: EvictMode) {
        self.forget_sequence(sequence);
        self.actions.push(Action::Evict(Evict { sequence, mode }));
    }

    /// Set a stage's replica count; the host places any new replicas.
    pub fn scale(&mut self, stage: StageId, replicas: u32, variant: Option<VariantId>) {
        self.scale_placed(stage, replicas, variant, Vec::new());
    }

    /// Set a stage's replica count, naming where the new replicas go (one entry per
    /// new replica, in order; the host places those without an entry).
    pub fn scale_placed(&mut self, stage: StageId, replicas: u32, variant: Option<VariantId>, placement: Vec<Placement>) {
        self.actions.push(Action::Scale(Scale { stage, replicas, variant, placement }));
    }

    /// Switch the variant of a worker or a stage.
    pub fn set_variant(&mut self, target: VariantTarget, variant: VariantId) {
        if let VariantTarget::Worker(id) = target {
            if let Some(view) = self.workers.get_mut(id) {
                view.info.variant = variant;
            }
        }
        self.actions.push(Action::SetVariant(SetVariant { target, variant }));
    }

    /// Replace the routing table of a stage.
    pub fn set_routes(&mut self, stage: StageId, source: Option<WorkerId>, targets: Vec<Route>) {
        self.actions.push(Action::SetRoutes(SetRoutes { stage, source, targets }));
    }

    /// Take the batch limits in force from a snapshot (no action): a limit this
    /// instance set that the host refused, or one a predecessor set before this
    /// instance took over (a fallback, a swap), is what the host holds the batches to.
    pub fn follow_batch_limits(&mut self, snapshot: &crate::Snapshot) {
        for stats in &snapshot.stages {
            if let Some(slot) = self.batch_limits.get_mut(stats.stage as usize) {
                if stats.batch_limit > 0 {
                    *slot = stats.batch_limit;
                }
            }
        }
    }

    /// Change the largest batch formed for a stage.
    pub fn set_batch_limit(&mut self, stage: StageId, limit: u32) {
        if let Some(slot) = self.batch_limits.get_mut(stage as usize) {
            *slot = limit;
        }
        self.actions.push(Action::SetBatchLimit(SetBatchLimit { stage, limit }));
    }

    /// Change a worker's intra-op thread count.
    pub fn set_threads(&mut self, worker: WorkerId, threads: u32) {
        self.actions.push(Action::SetThreads(SetThreads { worker, threads }));
    }

    /// Hand a request back to the host until `until`.
    pub fn defer(&mut self, request: RequestId, until: Instant) {
        self.constraints.ended(request);
        self.actions.push(Action::Defer(Defer { request, until }));
    }

    /// Ask for a timer event at `at`.
    pub fn set_timer(&mut self, at: Instant, token: u64) {
        self.actions.push(Action::SetTimer(SetTimer { at, token }));
    }

    pub(crate) fn mark_idle(&mut self, worker: WorkerId) {
        self.set_idle(worker, true);
    }

    pub(crate) fn record_frame(&mut self, frame: &crate::FrameReport) {
        let unfinished = frame.sequences.iter().filter(|s| !s.finished).cloned().collect();
        self.resident.insert(frame.worker, unfinished);
    }

    pub(crate) fn forget_sequence(&mut self, id: RequestId) {
        for sequences in self.resident.values_mut() {
            sequences.retain(|s| s.id != id);
        }
    }

    pub(crate) fn constraints(&mut self) -> &mut Constraints {
        &mut self.constraints
    }

    pub(crate) fn add_worker(&mut self, worker: Worker) {
        self.workers.insert(WorkerView { info: worker, idle: false });
    }

    pub(crate) fn remove_worker(&mut self, worker: WorkerId) {
        self.constraints.worker_gone(worker);
        self.set_idle(worker, false);
        self.workers.remove(worker);
        self.resident.remove(&worker);
    }

    pub(crate) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceKind;

    fn view(id: WorkerId, stage: StageId) -> WorkerView {
        let info = Worker { id, stage, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 };
        WorkerView { info, idle: false }
    }

    #[test]
    fn the_worker_table_keeps_dense_and_sparse_ids_in_order() {
        let mut table = WorkerTable::default();
        for id in [DENSE_WORKER_IDS + 7, 3, 0, DENSE_WORKER_IDS, 9] {
            table.insert(view(id, 1));
        }
        let ids: Vec<WorkerId> = table.values().map(|v| v.info.id).collect();
        assert_eq!(ids, [0, 3, 9, DENSE_WORKER_IDS, DENSE_WORKER_IDS + 7]);
        // Replacing, changing and removing, on both sides of the boundary.
        table.insert(view(3, 2));
        assert_eq!(table.get(3).map(|v| v.info.stage), Some(2));
        table.get_mut(DENSE_WORKER_IDS).unwrap().idle = true;
        assert!(table.get(DENSE_WORKER_IDS).unwrap().idle);
        table.remove(0);
        table.remove(DENSE_WORKER_IDS + 7);
        table.remove(12_345_678);
        table.remove(100);
        assert!(table.get(0).is_none() && table.get(DENSE_WORKER_IDS + 7).is_none() && table.get(100).is_none());
        let ids: Vec<WorkerId> = table.values().map(|v| v.info.id).collect();
        assert_eq!(ids, [3, 9, DENSE_WORKER_IDS]);
    }
}
