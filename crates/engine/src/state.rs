//! The engine's tables: requests (pieces of end-to-end requests), their origins,
//! workers and stages. [`ClusterState`] is also the view the policy runtime validates
//! actions against.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use super::hosts::{Hosts, WorkerStart};
use super::pipeline::Pipeline;
use yardmaster_policy::contract::{self, Placement, Request, StageKind};
use yardmaster_policy::validate::{ClusterView, HostSlots, SequenceState, StageState, WorkerState};

/// Where a piece is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceState {
    /// Handed to the policy, waiting at its stage.
    Queued,
    /// In the job running on a worker.
    Running(u32),
    /// Resident but paused on an iteration worker.
    Paused(u32),
    /// Handed back to the host until a time.
    Deferred,
    /// Waiting at a fan-in stage for its siblings.
    Merging,
}

/// A request at one stage: an end-to-end request, or a piece of one after a fan-out.
#[derive(Debug, Clone)]
pub struct Piece {
    /// What the policy sees.
    pub request: Request,
    /// Where it is.
    pub state: PieceState,
    /// Tokens generated so far (iteration stages).
    pub generated: u32,
    /// How it resumes on an iteration worker.
    pub resume: super::exec::Resume,
}

/// Pieces by id, with each origin's pieces indexed, so that ending an origin (a drop,
/// a failure, an expiry) touches its own pieces only, not every piece the engine holds
/// — at overload the engine holds tens of thousands, and every drop ends an origin.
///
/// Reads go through `Deref` to the map; changes go through [`PieceTable::insert`] and
/// [`PieceTable::remove`], which keep the index. A piece's `request.origin` must not be
/// changed in place (no caller does: a piece keeps its origin for life).
///
/// The piece whose id is its origin's (the request as submitted, before any fan-out)
/// is not indexed: it is found by its id. So a request moving along a chain of stages
/// never touches the index — only the pieces of a fan-out do.
#[derive(Debug, Clone, Default)]
pub struct PieceTable {
    by_id: FxHashMap<u64, Piece>,
    /// Pieces by origin, except the one whose id is the origin's.
    by_origin: FxHashMap<u64, Vec<u64>>,
}

impl PieceTable {
    /// Insert or replace a piece; the replaced one, if any.
    pub(crate) fn insert(&mut self, id: u64, piece: Piece) -> Option<Piece> {
        let origin = piece.request.origin;
        let replaced = self.by_id.insert(id, piece);
        if let Some(old) = &replaced {
            self.unindex(old.request.origin, id);
        }
        if id != origin {
            self.by_origin.entry(origin).or_default().push(id);
        }
        replaced
    }

    /// Remove a piece; it, if it was there.
    pub(crate) fn remove(&mut self, id: &u64) -> Option<Piece> {
        let piece = self.by_id.remove(id)?;
        self.unindex(piece.request.origin, *id);
        Some(piece)
    }

    /// A piece, to change (its origin excepted).
    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut Piece> {
        self.by_id.get_mut(id)
    }

    /// The ids of an origin's pieces, ascending.
    pub fn of_origin(&self, origin: u64) -> Vec<u64> {
        let mut ids = self.by_origin.get(&origin).cloned().unwrap_or_default();
        if self.by_id.get(&origin).is_some_and(|p| p.request.origin == origin) {
            ids.push(origin);
        }
        ids.sort_unstable();
        ids
    }

    /// Take `id` out of `origin`'s index (the origin's own piece is not in it).
    fn unindex(&mut self, origin: u64, id: u64) {
        if id == origin {
            return;
        }
        if let Some(ids) = self.by_origin.get_mut(&origin) {
            if let Some(at) = ids.iter().position(|&x| x == id) {
                ids.swap_remove(at);
            }
            if ids.is_empty() {
                self.by_origin.remove(&origin);
            }
        }
    }
}

impl std::ops::Deref for PieceTable {
    type Target = FxHashMap<u64, Piece>;

    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

/// An end-to-end request and its live pieces.
#[derive(Debug, Clone)]
pub struct Origin {
    /// Its stream.
    pub stream: u32,
    /// When the client sent it.
    pub sent_at: u64,
    /// Absolute deadline.
    pub deadline: u64,
    /// Pieces not yet ended.
    pub live: u32,
    /// Product of the accuracies of the variants that served each stage.
    pub accuracy: f64,
    /// Stages already counted in `accuracy` (bit per stage id < 64).
    pub served: u64,
    /// Tokens generated over all pieces.
    pub tokens: u32,
    /// Total time its pieces waited in queues.
    pub queue_delay: u64,
    /// When the engine took it in.
    pub arrived_at: u64,
    /// When a job first ran a piece of it (`None`: none has yet).
    pub first_job_at: Option<u64>,
    /// Pieces of it waiting at fan-in stages, by stage.
    pub merging: Vec<(u32, u64)>,
}

/// What a worker is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerPhase {
    /// Loading; serves from `ready_at` on (estimated).
    Starting,
    /// Free.
    Idle,
    /// Running a job.
    Busy {
        /// Pieces in the job.
        items: Vec<u64>,
        /// When it started.
        started: u64,
    },
    /// Finishing its job, then removed.
    Draining {
        /// Pieces in the job.
        items: Vec<u64>,
        /// When it started.
        started: u64,
    },
}

/// A worker.
#[derive(Debug, Clone)]
pub struct WorkerEntry {
    /// As the policy sees it.
    pub info: contract::Worker,
    /// What it does.
    pub phase: WorkerPhase,
    /// Resident sequences (iteration stages), with their KV bytes.
    pub resident: BTreeMap<u64, u64>,
    /// Busy time in the current tick window.
    pub busy_in_window: u64,
    /// Size of its last job.
    pub last_batch: u32,
    /// Origins of the pieces of the running job (for accelerator-time accounting).
    pub job_origins: Vec<u64>,
}

impl WorkerEntry {
    /// A worker in `phase` with nothing resident.
    pub fn new(info: contract::Worker, phase: WorkerPhase) -> Self {
        Self { info, phase, resident: BTreeMap::new(), busy_in_window: 0, last_batch: 0, job_origins: Vec::new() }
    }
}

/// Per-stage counters of the current tick window.
#[derive(Debug, Clone, Default)]
pub struct StageWindow {
    /// Arrivals.
    pub arrivals: u64,
    /// Pieces finished.
    pub completions: u64,
    /// Jobs started.
    pub jobs: u64,
    /// Pieces in those jobs.
    pub job_items: u64,
}

/// Per-stage state.
#[derive(Debug, Clone)]
pub struct StageEntry {
    /// Current batch limit.
    pub batch_limit: u32,
    /// Serving + starting workers.
    pub replicas: u32,
    /// Tick window counters.
    pub window: StageWindow,
    /// The policy's routing table for requests entering the stage (advisory).
    pub routes: Vec<contract::Route>,
}

/// Everything the engine knows. Drivers read it through [`crate::Engine::state`] and
/// its accessors; only the engine changes it.
pub struct ClusterState {
    /// The pipeline.
    pub(crate) pipeline: Pipeline,
    /// Now.
    pub(crate) now: u64,
    /// Pieces by id.
    pub(crate) pieces: PieceTable,
    /// Origins by id.
    pub(crate) origins: FxHashMap<u64, Origin>,
    /// Workers by id.
    pub(crate) workers: BTreeMap<u32, WorkerEntry>,
    /// Stages by id.
    pub(crate) stages: Vec<StageEntry>,
    /// Queued pieces per stage in arrival order (for snapshots; lazily cleaned).
    pub(crate) queued_order: Vec<VecDeque<(u64, u64)>>,
    /// Most intra-op threads per worker.
    pub(crate) max_threads: u32,
    /// The hosts: who holds which slot, and what each caches.
    pub(crate) hosts: Hosts,
}

impl ClusterState {
    /// The state at start: the pipeline's initial replicas are not created here.
    pub fn new(pipeline: Pipeline, max_threads: u32) -> Self {
        let stages = pipeline
            .stages
            .iter()
            .map(|s| StageEntry { batch_limit: s.max_batch, replicas: 0, window: StageWindow::default(), routes: Vec::new() })
            .collect();
        let queued_order = vec![VecDeque::new(); pipeline.stages.len()];
        let hosts = Hosts::new(&pipeline.hosts, pipeline.max_workers);
        Self {
            hosts,
            pipeline,
            now: 0,
            pieces: PieceTable::default(),
            origins: FxHashMap::default(),
            workers: BTreeMap::new(),
            stages,
            queued_order,
            max_threads,
        }
    }

    /// The pipeline being served.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The engine's clock as of the last event it handled.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Every worker by id, starting and draining ones included.
    pub fn workers(&self) -> &BTreeMap<u32, WorkerEntry> {
        &self.workers
    }

    /// Every stage's state, by stage id.
    pub fn stages(&self) -> &[StageEntry] {
        &self.stages
    }

    /// Every end-to-end request not yet ended, by origin id.
    pub fn origins(&self) -> &FxHashMap<u64, Origin> {
        &self.origins
    }

    /// Every piece (request at a stage) not yet ended, by id.
    pub fn pieces(&self) -> &PieceTable {
        &self.pieces
    }

    /// Every host's state: free slots, replicas per stage, cached parameters.
    pub fn hosts(&self) -> Vec<contract::HostStats> {
        self.hosts.stats(self.stages.len())
    }

    /// The hosts as the policy's configuration lists them.
    pub fn host_info(&self) -> Vec<contract::HostInfo> {
        self.hosts.info()
    }

    /// Add a worker in `phase`, seated where `placement` says (or by the hosts'
    /// default rule); `info`'s host and slot are filled in. A worker `loading` its
    /// model caches it on its host once ready. Where it starts, and whether warm.
    pub(crate) fn add_worker(
        &mut self,
        mut info: contract::Worker,
        phase: WorkerPhase,
        placement: Option<&Placement>,
        loading: bool,
    ) -> WorkerStart {
        let bytes = self.pipeline.stages[info.stage as usize].variants.get(info.variant as usize).map_or(0, |v| v.memory_bytes);
        let start = self.hosts.place(info.id, info.stage, info.variant, bytes, placement, self.now, loading);
        info.host = start.host;
        info.slot = start.slot;
        self.workers.insert(info.id, WorkerEntry::new(info, phase));
        start
    }

    /// Remove a worker; its slot is free again.
    pub(crate) fn remove_worker_entry(&mut self, id: u32) -> Option<WorkerEntry> {
        self.hosts.release(id);
        self.workers.remove(&id)
    }

    /// A worker now runs `variant`: its host loads (and caches) those parameters.
    pub(crate) fn switch_variant(&mut self, id: u32, variant: u32) {
        let Some(worker) = self.workers.get_mut(&id) else { return };
        worker.info.variant = variant;
        let bytes = self.pipeline.stages[worker.info.stage as usize].variants.get(variant as usize).map_or(0, |v| v.memory_bytes);
        self.hosts.switch_variant(id, variant, bytes, self.now);
    }

    /// Workers that can take work now.
    pub fn idle(&self) -> impl Iterator<Item = u32> + '_ {
        self.workers.values().filter(|w| w.phase == WorkerPhase::Idle).map(|w| w.info.id)
    }

    /// Serving workers (not starting).
    pub fn serving(&self) -> usize {
        self.workers.values().filter(|w| w.phase != WorkerPhase::Starting).count()
    }

    /// The telemetry snapshot; resets the tick window.
    pub fn snapshot(&mut self, window_ns: u64) -> contract::Snapshot {
        let now = self.now;
        let seconds = (window_ns as f64 / 1e9).max(1e-9);
        let mut stages = Vec::with_capacity(self.stages.len());
        for (i, stage) in self.stages.iter_mut().enumerate() {
            let order = &mut self.queued_order[i];
            while let Some(&(id, _)) = order.front() {
                if self.pieces.get(&id).is_some_and(|p| p.state == PieceState::Queued && p.request.stage == i as u32) {
                    break;
                }
                order.pop_front();
            }
            let queue_length = self.pieces.values().filter(|p| p.state == PieceState::Queued && p.request.stage == i as u32).count() as u32;
            let oldest = order.front().map_or(now, |&(_, at)| at);
            let w = std::mem::take(&mut stage.window);
            let starting = self.workers.values().filter(|x| x.info.stage == i as u32 && x.phase == WorkerPhase::Starting).count() as u32;
            stages.push(contract::StageStats {
                stage: i as u32,
                queue_length,
                queue_delay: now.saturating_sub(oldest),
                arrival_rate: w.arrivals as f64 / seconds,
                throughput: w.completions as f64 / seconds,
                mean_batch: if w.jobs == 0 { 0.0 } else { w.job_items as f64 / w.jobs as f64 },
                replicas: stage.replicas - starting,
                starting,
                batch_limit: stage.batch_limit,
            });
        }
        let workers = self
            .workers
            .values_mut()
            .map(|w| {
                let busy_now = match &w.phase {
                    WorkerPhase::Busy { started, .. } | WorkerPhase::Draining { started, .. } => {
                        now.saturating_sub(*started).min(window_ns)
                    }
                    _ => 0,
                };
                let busy = std::mem::take(&mut w.busy_in_window) + busy_now;
                contract::WorkerStats {
                    worker: w.info.id,
                    stage: w.info.stage,
                    variant: w.info.variant,
                    busy: matches!(w.phase, WorkerPhase::Busy { .. } | WorkerPhase::Draining { .. }),
                    utilisation: (busy as f64 / window_ns.max(1) as f64).min(1.0),
                    last_batch: w.last_batch,
                    threads: w.info.threads,
                    memory_used: w.resident.values().sum(),
                    memory_capacity: w.info.memory_bytes,
                }
            })
            .collect();
        let (host_memory_used, host_memory_capacity) = self.hosts.cache_totals();
        let hosts = self.hosts.stats(self.stages.len());
        contract::Snapshot { at: now, stages, workers, host_memory_used, host_memory_capacity, hosts }
    }
}

impl ClusterView for ClusterState {
    fn now(&self) -> u64 {
        self.now
    }

    fn worker(&self, id: u32) -> Option<WorkerState> {
        let w = self.workers.get(&id)?;
        if w.phase == WorkerPhase::Starting {
            return None;
        }
        Some(WorkerState { stage: w.info.stage, busy: w.phase != WorkerPhase::Idle })
    }

    fn idle_workers(&self) -> Vec<u32> {
        self.idle().collect()
    }

    fn serving_workers(&self) -> Vec<contract::Worker> {
        let mut workers: Vec<contract::Worker> =
            self.workers.values().filter(|w| w.phase != WorkerPhase::Starting).map(|w| w.info).collect();
        workers.sort_by_key(|w| w.id);
        workers
    }

    fn stage(&self, id: u32) -> Option<StageState> {
        let def = self.pipeline.stages.get(id as usize)?;
        let entry = &self.stages[id as usize];
        Some(StageState {
            kind: def.kind,
            max_batch: def.max_batch,
            batch_limit: entry.batch_limit,
            variants: def.variants.len() as u32,
            min_replicas: def.min_replicas,
            max_replicas: def.max_replicas,
            replicas: entry.replicas,
        })
    }

    fn sequence(&self, id: u64) -> Option<SequenceState> {
        let piece = self.pieces.get(&id)?;
        match piece.state {
            PieceState::Paused(worker) => Some(SequenceState { worker, running: false }),
            PieceState::Running(worker) if self.pipeline.stages[piece.request.stage as usize].kind == StageKind::Iteration => {
                Some(SequenceState { worker, running: true })
            }
            _ => None,
        }
    }

    fn max_workers(&self) -> u32 {
        self.pipeline.max_workers
    }

    fn total_replicas(&self) -> u32 {
        self.stages.iter().map(|s| s.replicas).sum()
    }

    fn max_threads(&self) -> u32 {
        self.hosts.thread_limit().map_or(self.max_threads, |limit| limit.min(self.max_threads))
    }

    fn host_slots(&self, host: u32) -> Option<HostSlots> {
        self.hosts.slots(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(id: u64, origin: u64) -> Piece {
        let request = crate::test_support::request(id, origin);
        Piece { request, state: PieceState::Queued, generated: 0, resume: super::super::exec::Resume::Fresh }
    }

    #[test]
    fn an_origins_pieces_are_its_own_and_those_of_its_fan_out() {
        let mut table = PieceTable::default();
        table.insert(1, piece(1, 1));
        table.insert(2, piece(2, 2));
        assert_eq!(table.of_origin(1), vec![1]);
        assert!(table.by_origin.is_empty(), "a piece that is its origin is found by its id");
        // A fan-out of origin 1: its own piece ends, children begin.
        table.remove(&1);
        table.insert(5, piece(5, 1));
        table.insert(3, piece(3, 1));
        assert_eq!(table.of_origin(1), vec![3, 5]);
        // A merge keeps one of them; the others go.
        table.remove(&5);
        assert_eq!(table.of_origin(1), vec![3]);
        table.remove(&3);
        assert!(table.of_origin(1).is_empty());
        assert!(table.by_origin.is_empty(), "no origin is left indexed");
        // The origin's own piece beside pieces of its fan-out, ascending.
        table.insert(7, piece(7, 2));
        table.insert(4, piece(4, 2));
        assert_eq!(table.of_origin(2), vec![2, 4, 7]);
        // Replacing a piece moves it to its new origin's index.
        table.insert(4, piece(4, 1));
        assert_eq!((table.of_origin(1), table.of_origin(2)), (vec![4], vec![2, 7]));
        assert!(table.of_origin(9).is_empty());
    }
}
