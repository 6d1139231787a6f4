//! The serving executor: the engine's decisions carried out on ONNX Runtime workers.
//!
//! [`OnnxExecutor`] implements [`Executor`] over groups of [`Workers`] (one
//! [`Placement`] per group: the workers of this process, or of another host), with one
//! [`StageProgram`] per stage turning a request's payload into model inputs and the
//! model's outputs back into payload. It runs in the engine's turn (see
//! [`super::actor`]), so it does little there: it takes the inputs already prepared in
//! each request's parcel (see [`super::payload`]), lays them out as one data-plane
//! [`Job`] and hands it over.
//!
//! A group's [`WorkerEvent`]s are handled on its workers' own threads (workers of this
//! process, through [`super::worker_events::EventRelay`]) or by an event pump thread
//! per group (a remote host's, off a channel):
//! - `Finished`: the stage program folds each request's outputs into its payload and
//!   prepares the next stage's inputs — right there when the program only moves
//!   tensors, on the finisher threads otherwise — then the job's [`JobResult`]
//!   (per-request errors, the measured duration) goes to the engine, taken in on that
//!   thread when the engine is free;
//! - `Ready`: `worker_ready`;
//! - `StartFailed`: logged; the worker is marked failed, the job waiting for it (if
//!   any) and any job already on its way to it fail with the error, so no request waits
//!   on a worker that will never run, and the engine is told the worker is lost (it
//!   removes it; the policy sees `worker-removed` and may scale up a replacement);
//! - `ReconfigureFailed`: logged; the worker keeps its previous session and serves on;
//! - `Aborted`: nothing (the engine already took the job's requests back);
//! - `Reconfigured`, `Retired`: logged, and the worker board updated.
//!
//! A [`super::watchdog`] thread times every running job against its profile: a job
//! that runs far past it is claimed, its requests fail with `worker N stalled: …`, and
//! the worker is restarted under the same id (its job aborted, a fresh worker
//! provisioned in its place; the engine keeps counting it, and jobs sent to it wait for
//! the fresh one to load). The old worker's late events (its job's end, its retirement)
//! are ignored.
//!
//! Every job the executor starts produces exactly one [`JobResult`] unless it is
//! aborted: the job table is the single place a result can be claimed from, by the
//! pump (finished, start failed), by the start path (hand-over refused), by the
//! watchdog (stalled), or by an abort (which claims it and sends nothing).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use yardmaster_dataplane::{
    Job, JobTiming, ModelCatalog, ModelSpec, Request, SequenceStep, StartKind, Tensor, WorkerContext, WorkerEvent, WorkerPool,
};

use super::actor::{Actor, ActorHandle};
use super::payload::{JobSpans, PayloadStore, Prepared};
use super::stages::StageProgram;
use super::starts::{StartCount, StartLog};
use super::watchdog::{self, WatchdogConfig};
use super::worker_events::{EventRelay, GroupEvents};
use super::workers::Workers;
use yardmaster_engine::{BatchJob, Executor, ItemResult, JobResult, MonotonicClock, Pipeline, Profile, WorkerStart};
use yardmaster_policy::contract::EvictMode;

/// The serving actor.
pub type ServeActor = Actor<MonotonicClock, OnnxExecutor>;
/// A handle to the serving actor.
pub type ServeHandle = ActorHandle<MonotonicClock, OnnxExecutor>;

/// A group of workers and the stages it serves.
pub struct Placement {
    /// Stages whose workers live in this group.
    pub stages: Vec<u32>,
    /// The workers.
    pub workers: Box<dyn Workers>,
    /// Their events.
    pub events: GroupEvents,
}

impl Placement {
    /// Stages `stages` on a pool of workers in this process, starting with `threads`
    /// intra-op threads each, whose events are handled on the workers' own threads.
    pub fn local(stages: Vec<u32>, context: WorkerContext, catalog: ModelCatalog, threads: usize) -> Self {
        let relay = EventRelay::new();
        let pool = WorkerPool::with_events(context, catalog, threads, relay.sink());
        Placement { stages, workers: Box::new(pool), events: GroupEvents::Direct(relay) }
    }
}

/// The workers of one host of the cluster (a `yardmaster node`): every worker the
/// engine seats on that host runs there, whatever its stage (see
/// `yardmaster_engine::hosts`).
pub struct HostGroup {
    /// The engine's id of the host.
    pub host: u32,
    /// The host's workers.
    pub workers: Box<dyn Workers>,
    /// Their events.
    pub events: Receiver<WorkerEvent>,
}

impl std::fmt::Debug for HostGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGroup").field("host", &self.host).finish()
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement").field("stages", &self.stages).finish()
    }
}

/// Where a worker stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerStatus {
    /// Loading its model.
    Loading,
    /// Serving.
    Ready,
    /// Could not start; jobs sent to it fail with this error.
    Failed(String),
}

/// Every worker's status, shared with the backend (readiness) and readable by anyone.
#[derive(Debug, Clone, Default)]
pub struct WorkerBoard {
    workers: Arc<Mutex<HashMap<u32, (u32, WorkerStatus)>>>,
    /// The stages that must have a worker ready (offline ones need none).
    online: Arc<Mutex<Vec<u32>>>,
}

impl WorkerBoard {
    /// A board for a pipeline of `stages` stages.
    pub fn new(stages: u32) -> Self {
        Self { workers: Arc::default(), online: Arc::new(Mutex::new((0..stages).collect())) }
    }

    /// The stages that must have a worker ready for [`WorkerBoard::ready`] (models
    /// loaded or unloaded while serving).
    pub fn set_online(&self, stages: Vec<u32>) {
        *lock(&self.online) = stages;
    }

    /// Whether every online stage has a worker ready.
    pub fn ready(&self) -> bool {
        let online = lock(&self.online).clone();
        self.stages_ready(&online)
    }

    /// Whether each of `stages` has a worker ready.
    pub fn stages_ready(&self, stages: &[u32]) -> bool {
        let workers = lock(&self.workers);
        stages.iter().all(|&stage| workers.values().any(|(s, status)| *s == stage && *status == WorkerStatus::Ready))
    }

    /// A worker's status.
    pub fn status(&self, worker: u32) -> Option<WorkerStatus> {
        lock(&self.workers).get(&worker).map(|(_, status)| status.clone())
    }

    /// Every worker: (worker, stage, status), by worker id.
    pub fn snapshot(&self) -> Vec<(u32, u32, WorkerStatus)> {
        let mut all: Vec<_> = lock(&self.workers).iter().map(|(w, (s, status))| (*w, *s, status.clone())).collect();
        all.sort_by_key(|(w, _, _)| *w);
        all
    }

    /// The worker's status once it is no longer loading, waiting at most `limit`.
    fn wait_while_loading(&self, worker: u32, limit: Duration) -> Option<WorkerStatus> {
        let until = Instant::now() + limit;
        loop {
            let status = self.status(worker);
            if status != Some(WorkerStatus::Loading) || Instant::now() >= until {
                return status;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn set(&self, worker: u32, stage: u32, status: WorkerStatus) {
        lock(&self.workers).insert(worker, (stage, status));
    }

    fn update(&self, worker: u32, status: WorkerStatus) -> Option<u32> {
        let mut workers = lock(&self.workers);
        let entry = workers.get_mut(&worker)?;
        entry.1 = status;
        Some(entry.0)
    }

    fn remove(&self, worker: u32) {
        lock(&self.workers).remove(&worker);
    }
}

/// How long a job that a starting worker refused waits for the worker's start verdict
/// (only on that error path; it holds the engine's turn).
const VERDICT_WAIT: Duration = Duration::from_millis(250);

/// A poisoned lock still holds consistent data here (every update is one assignment),
/// so a panic elsewhere must not stop serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run `f`, turning a panic into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(format!("{what} panicked: {}", message.unwrap_or_else(|| "no message".into())))
    })
}

/// Where one stage's jobs spent their time on their workers, summed: Triton's
/// statistics split a model's compute time this way (input, infer, output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTiming {
    /// Jobs measured (a remote host's jobs are not: their workers do not report it).
    pub jobs: u64,
    /// Waiting for the worker to take the job up, and stacking the inputs, ns.
    pub input_ns: u64,
    /// ONNX Runtime's `Run`, ns.
    pub infer_ns: u64,
    /// Splitting the outputs per request, ns.
    pub output_ns: u64,
    /// Jobs whose workers do not measure them (a remote host's): their whole time, ns.
    pub unmeasured_ns: u64,
}

/// Per stage, its [`StageTiming`].
#[derive(Debug, Default)]
struct StageTimings(Vec<StageTiming>);

impl StageTimings {
    /// Count a job of `stage` that took `duration` on its worker, as `timing` says.
    fn add(&mut self, stage: u32, duration: Duration, timing: &JobTiming) {
        let index = stage as usize;
        if self.0.len() <= index {
            self.0.resize(index + 1, StageTiming::default());
        }
        let entry = &mut self.0[index];
        let ns = |d: Duration| d.as_nanos() as u64;
        if !timing.measured() {
            entry.unmeasured_ns += ns(duration);
            return;
        }
        entry.jobs += 1;
        entry.input_ns += ns(timing.input());
        entry.infer_ns += ns(timing.batch.run);
        entry.output_ns += ns(timing.batch.split);
    }
}

/// A job's remaining requests are folded in parallel only when folding its first took
/// this long: below it, a thread's start costs more than it saves (a tiny model's fold
/// moves a few tensors in about a microsecond; starting a scoped thread takes tens).
const PARALLEL_FOLD_AFTER: Duration = Duration::from_micros(200);

/// How many threads fold the `remaining` requests of a job whose first took `first`:
/// one (this thread) for a fold below [`PARALLEL_FOLD_AFTER`], else up to one per core.
fn fold_threads(first: Duration, remaining: usize, cores: usize) -> usize {
    if first < PARALLEL_FOLD_AFTER {
        1
    } else {
        cores.min(remaining).max(1)
    }
}

/// One request's share of a job's batch elements.
#[derive(Debug, Clone, Copy)]
struct Share {
    id: u64,
    elements: usize,
}

/// A job handed to a worker and not yet reported.
#[derive(Debug)]
struct JobRecord {
    worker: u32,
    stage: u32,
    /// The worker's variant (to restart it with the same model).
    variant: u32,
    shares: Vec<Share>,
    /// Requests whose inputs could not be made, with why.
    refused: Vec<(u64, String)>,
    /// When the job was handed over, or when its worker was last seen loading.
    started: Instant,
    /// The profiled p99 of the job's batch on the worker's variant.
    tail: Duration,
}

impl JobRecord {
    /// The job's result when it failed as a whole.
    fn failed(self, error: &str) -> JobResult {
        let mut items: Vec<ItemResult> = self.shares.iter().map(|s| item(s.id, Some(error.to_string()))).collect();
        items.extend(self.refused.into_iter().map(|(id, e)| item(id, Some(e))));
        JobResult { worker: self.worker, duration: 0, items }
    }
}

fn item(id: u64, error: Option<String>) -> ItemResult {
    ItemResult { id, error, tokens: 0, finished: false, fan_out: Vec::new() }
}

#[derive(Debug, Default)]
struct JobTable {
    records: HashMap<u64, JobRecord>,
    running: HashMap<u32, u64>,
}

/// One group of workers, locked for each operation.
type Group = Arc<Mutex<Box<dyn Workers>>>;

/// The worker groups, shared by the executor (in the engine's turn) and the watchdog.
/// Groups are only added (models loaded while serving), never removed.
type Groups = RwLock<Vec<Group>>;

/// What the executor knows of each stage; replaced whole when models are loaded or
/// unloaded while serving ([`OnnxExecutor::serve_pipeline`]).
struct StageTable {
    programs: Vec<Arc<dyn StageProgram>>,
    /// Each stage's successor, when it has exactly one (its inputs are prepared ahead).
    next_stage: Vec<Option<u32>>,
    /// Stage → group.
    stage_group: Vec<usize>,
    /// Each stage's batch limit in rows, where its program counts rows (a client
    /// batch's items): a job of more rows fails rather than running past the model's
    /// `max_batch_size`.
    row_limit: Vec<Option<usize>>,
}

impl StageTable {
    fn new(pipeline: &Pipeline, programs: Vec<Arc<dyn StageProgram>>, stage_group: Vec<usize>) -> Self {
        let next_stage = pipeline.stages.iter().map(|s| if let [next] = s.successors[..] { Some(next) } else { None }).collect();
        let row_limit = pipeline
            .stages
            .iter()
            .zip(&programs)
            .map(|(stage, program)| (program.counts_rows() && stage.max_batch > 0).then_some(stage.max_batch as usize))
            .collect();
        Self { programs, next_stage, stage_group, row_limit }
    }
}

/// What the engine's turns, the worker-event handlers and the watchdog share.
struct Shared {
    stages: RwLock<StageTable>,
    store: PayloadStore,
    board: WorkerBoard,
    jobs: Mutex<JobTable>,
    handle: ServeHandle,
    watchdog: Mutex<WatchdogConfig>,
    /// Workers restarted by the watchdog whose old instance has not reported its
    /// retirement yet: that `Retired` is the old one's and leaves the board alone.
    replaced: Mutex<HashMap<u32, u32>>,
    /// Host → the group of its workers, for the cluster's hosts.
    host_groups: RwLock<HashMap<u32, usize>>,
    /// Worker → its group, for workers seated on a cluster host (the others follow
    /// their stage's group).
    worker_groups: Mutex<HashMap<u32, usize>>,
    /// Where workers were seated and predicted to start warm, against their `Ready`.
    starts: Mutex<StartLog>,
    /// Where each stage's jobs spent their time on their workers.
    timings: Mutex<StageTimings>,
}

impl Shared {
    /// The program of `stage`.
    fn program(&self, stage: u32) -> Result<Arc<dyn StageProgram>, String> {
        let table = read(&self.stages);
        table.programs.get(stage as usize).cloned().ok_or_else(|| format!("stage {stage} is not served here"))
    }

    /// The group serving `stage`.
    fn group(&self, groups: &Groups, stage: u32) -> Option<Group> {
        let index = *read(&self.stages).stage_group.get(stage as usize)?;
        read(groups).get(index).cloned()
    }

    /// The group of `worker` of `stage`: its cluster host's, else its stage's.
    fn worker_group(&self, groups: &Groups, worker: u32, stage: u32) -> Option<Group> {
        match lock(&self.worker_groups).get(&worker) {
            Some(&index) => read(groups).get(index).cloned(),
            None => self.group(groups, stage),
        }
    }

    fn claim(&self, job: u64) -> Option<JobRecord> {
        let mut jobs = lock(&self.jobs);
        let record = jobs.records.remove(&job)?;
        if jobs.running.get(&record.worker) == Some(&job) {
            jobs.running.remove(&record.worker);
        }
        Some(record)
    }

    fn claim_running(&self, worker: u32) -> Option<JobRecord> {
        let mut jobs = lock(&self.jobs);
        let job = jobs.running.remove(&worker)?;
        jobs.records.remove(&job)
    }

    fn report(&self, result: JobResult) {
        // A stopped actor has answered every request already.
        let _ = self.handle.job_finished(result);
    }

    /// Report a job from a thread that holds no lock: its turn runs here when the
    /// engine is free.
    fn report_here(&self, result: JobResult) {
        let _ = self.handle.job_finished_here(result);
    }

    /// The inputs of request `id` at `stage` (prepared ahead, or made now) and its place
    /// in a stateful sequence, if it has one.
    fn take_inputs(&self, id: u64, stage: u32) -> Result<(Vec<Vec<Tensor>>, Option<SequenceStep>), String> {
        let slot = self.store.slot(id).ok_or_else(|| format!("no data is held for request {id}"))?;
        let mut guard = lock(&slot);
        let parcel = guard.as_mut().ok_or_else(|| format!("request {id} has already been answered"))?;
        let sequence = parcel.sequence.clone();
        match parcel.prepared.take() {
            Some(prepared) if prepared.stage == stage => Ok((prepared.elements, sequence)),
            _ => {
                let program = self.program(stage)?;
                Ok((guarded(program.name(), || program.inputs(&parcel.payload))?, sequence))
            }
        }
    }

    /// Fold a job's outputs (one per batch element, in order) into its requests'
    /// payloads and build its result.
    fn finish(&self, record: JobRecord, outputs: Result<Vec<Vec<Tensor>>, String>, duration: u64, timing: JobTiming) -> JobResult {
        let spans = JobSpans { handed: record.started, timing };
        let expected: usize = record.shares.iter().map(|s| s.elements).sum();
        let outputs = outputs.and_then(|o| {
            if o.len() == expected {
                Ok(o)
            } else {
                Err(format!("the worker returned {} results for {expected} inputs", o.len()))
            }
        });
        let mut outputs = match outputs {
            Ok(outputs) => outputs.into_iter(),
            Err(error) => return record.failed(&error),
        };
        let each: Vec<(u64, Vec<Vec<Tensor>>)> =
            record.shares.iter().map(|share| (share.id, outputs.by_ref().take(share.elements).collect())).collect();
        let mut items = self.apply_all(record.stage, each, spans);
        items.extend(record.refused.into_iter().map(|(id, e)| item(id, Some(e))));
        JobResult { worker: record.worker, duration, items }
    }

    /// Applies each request's outputs of a job of `stage`. The first is folded here;
    /// when it took [`PARALLEL_FOLD_AFTER`] or more and others remain, those are
    /// folded in parallel over up to one thread per core (a batch of eight PP-OCR pages
    /// is eight box searches and crop sets, which one thread would do in turn while the
    /// worker waits for the job's report), else here too: moving a tiny model's
    /// tensors takes less than starting a thread. Items come back in `each`'s order.
    fn apply_all(&self, stage: u32, each: Vec<(u64, Vec<Vec<Tensor>>)>, spans: JobSpans) -> Vec<ItemResult> {
        let fold = |(id, outputs): (u64, Vec<Vec<Tensor>>)| item(id, self.apply(id, stage, outputs, spans).err());
        let mut each = each.into_iter();
        let Some(head) = each.next() else { return Vec::new() };
        let begin = Instant::now();
        let first = fold(head);
        let rest: Vec<(u64, Vec<Vec<Tensor>>)> = each.collect();
        let threads = fold_threads(begin.elapsed(), rest.len(), yardmaster_dataplane::parallel::cores());
        if threads < 2 {
            return std::iter::once(first).chain(rest.into_iter().map(fold)).collect();
        }
        let ids: Vec<u64> = rest.iter().map(|(id, _)| *id).collect();
        let done: Vec<Mutex<Option<ItemResult>>> = (0..rest.len()).map(|_| Mutex::new(None)).collect();
        yardmaster_dataplane::parallel::each(rest.into_iter().enumerate().collect(), threads, "yardmaster-fold", |(index, element)| {
            *lock(&done[index]) = Some(fold(element));
        });
        std::iter::once(first)
            .chain(done.into_iter().zip(ids).map(|(slot, id)| {
                slot.into_inner()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .unwrap_or_else(|| item(id, Some("the request's outputs were not folded".to_string())))
            }))
            .collect()
    }

    fn apply(&self, id: u64, stage: u32, outputs: Vec<Vec<Tensor>>, spans: JobSpans) -> Result<(), String> {
        let slot = self.store.slot(id).ok_or_else(|| format!("no data is held for request {id}"))?;
        let mut guard = lock(&slot);
        let parcel = guard.as_mut().ok_or_else(|| format!("request {id} has already been answered"))?;
        parcel.last_job = Some(spans);
        let program = self.program(stage)?;
        guarded(program.name(), || program.apply(&mut parcel.payload, outputs))?;
        parcel.prepared = None;
        let next = read(&self.stages).next_stage.get(stage as usize).copied().flatten();
        if let Some(next) = next {
            // A failure here shows again, as the request's error, when the next stage
            // makes the inputs itself.
            let Ok(program) = self.program(next) else { return Ok(()) };
            if let Ok(elements) = guarded(program.name(), || program.inputs(&parcel.payload)) {
                parcel.prepared = Some(Prepared { stage: next, elements });
            }
        }
        Ok(())
    }
}

/// The engine's executor over ONNX Runtime workers.
pub struct OnnxExecutor {
    groups: Arc<Groups>,
    /// Worker → (stage, variant).
    worker_stage: HashMap<u32, (u32, u32)>,
    /// `profiles[stage][variant]`, for the watchdog.
    profiles: Vec<Vec<Profile>>,
    shared: Arc<Shared>,
    /// Where the pumps of groups added later send finished jobs.
    finishers: mpsc::Sender<Finishing>,
    next_job: u64,
    /// Per worker, results of preempted jobs still on their way to the engine.
    late_results: HashMap<u32, u32>,
}

impl std::fmt::Debug for OnnxExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxExecutor").field("groups", &read(&self.groups).len()).field("workers", &self.worker_stage.len()).finish()
    }
}

impl OnnxExecutor {
    /// An executor for `pipeline` (a chain of batch stages) that reports to `handle`,
    /// running `programs[stage]` around each stage's model, with the workers of
    /// `placements` (every stage in exactly one; checked by the caller, see
    /// [`check_placements`]). Provisions the pipeline's initial workers (the engine
    /// counts them as serving at once; jobs sent before they are ready wait for the
    /// load) and starts one event pump per placement.
    pub fn new(
        handle: ServeHandle,
        pipeline: &Pipeline,
        programs: Vec<Arc<dyn StageProgram>>,
        store: PayloadStore,
        board: WorkerBoard,
        placements: Vec<Placement>,
        hosts: Vec<HostGroup>,
    ) -> Self {
        let mut stage_group = vec![0; pipeline.stages.len()];
        for (index, placement) in placements.iter().enumerate() {
            for &stage in &placement.stages {
                stage_group[stage as usize] = index;
            }
        }
        let shared = Arc::new(Shared {
            stages: RwLock::new(StageTable::new(pipeline, programs, stage_group)),
            store,
            board,
            jobs: Mutex::default(),
            handle,
            watchdog: Mutex::new(WatchdogConfig::default()),
            replaced: Mutex::default(),
            host_groups: RwLock::default(),
            worker_groups: Mutex::default(),
            starts: Mutex::default(),
            timings: Mutex::default(),
        });
        let finishers = start_finishers(&shared);
        let mut groups = Vec::with_capacity(placements.len());
        for (index, placement) in placements.into_iter().enumerate() {
            groups.push(start_group(&shared, &finishers, index, placement.workers, placement.events));
        }
        for host in hosts {
            write(&shared.host_groups).insert(host.host, groups.len());
            groups.push(start_group(&shared, &finishers, groups.len(), host.workers, host.events.into()));
        }
        let groups = Arc::new(RwLock::new(groups));
        // The watchdog holds weak references: it ends once the executor is dropped.
        let (watched, watched_groups) = (Arc::downgrade(&shared), Arc::downgrade(&groups));
        let config_of = watched.clone();
        let spawned = watchdog::spawn(
            "yardmaster-watchdog",
            move || config_of.upgrade().map(|shared| *lock(&shared.watchdog)),
            move |now| match (watched.upgrade(), watched_groups.upgrade()) {
                (Some(shared), Some(groups)) => {
                    check_stalls(&shared, &groups, now);
                    true
                }
                _ => false,
            },
        );
        if let Err(error) = spawned {
            tracing::error!("starting the watchdog: {error}; stalled jobs will not be noticed");
        }
        let profiles = pipeline.stages.iter().map(|s| s.variants.iter().map(|v| v.profile.clone()).collect()).collect();
        let mut executor =
            Self { groups, worker_stage: HashMap::new(), profiles, shared, finishers, next_job: 1, late_results: HashMap::new() };
        for (worker, stage, start) in yardmaster_engine::hosts::initial_seats(pipeline) {
            // The engine seats these workers itself, by the same rule; here they only
            // need to run where it seats them.
            executor.provision(worker, stage, 0, start);
        }
        executor
    }

    /// Worker starts so far: where, warm or cold, against the engine's prediction;
    /// and how many started on another host than the one they were seated on.
    pub fn worker_starts(&self) -> (Vec<StartCount>, u64) {
        let log = lock(&self.shared.starts);
        (log.counts(), log.misplaced())
    }

    /// Where the jobs of `stage` have spent their time on their workers so far.
    pub fn stage_timing(&self, stage: u32) -> StageTiming {
        lock(&self.shared.timings).0.get(stage as usize).copied().unwrap_or_default()
    }

    /// The worker board.
    pub fn board(&self) -> &WorkerBoard {
        &self.shared.board
    }

    /// The watchdog's settings in force.
    pub fn watchdog(&self) -> WatchdogConfig {
        *lock(&self.shared.watchdog)
    }

    /// Change the watchdog's settings (they apply from its next check; callable from
    /// any thread, e.g. through the actor's `inspect`).
    pub fn set_watchdog(&self, config: WatchdogConfig) {
        *lock(&self.shared.watchdog) = config;
    }

    fn group_of(&self, worker: u32) -> Option<Group> {
        let (stage, _) = *self.worker_stage.get(&worker)?;
        self.shared.worker_group(&self.groups, worker, stage)
    }

    /// A host joined the cluster (or came back under the same name): workers the
    /// engine seats on `host.host` from now on run on its workers.
    pub fn add_host(&mut self, host: HostGroup) {
        let mut groups = write(&self.groups);
        let index = groups.len();
        groups.push(start_group(&self.shared, &self.finishers, index, host.workers, host.events.into()));
        write(&self.shared.host_groups).insert(host.host, index);
    }

    /// Serve `pipeline` from now on (models loaded or unloaded while serving; the
    /// engine is reconfigured right after, see `yardmaster_engine::Engine::reconfigure`):
    /// it keeps every stage of the one served and may add some after them, `programs`
    /// is the program of every stage, `placements` hold the workers of the added
    /// stages (each in exactly one), and `models` give existing stages new model files
    /// (a model loaded again), which their groups load for workers provisioned from
    /// now on.
    pub fn serve_pipeline(
        &mut self,
        pipeline: &Pipeline,
        programs: Vec<Arc<dyn StageProgram>>,
        placements: Vec<Placement>,
        models: Vec<(u32, Vec<ModelSpec>)>,
    ) -> Result<(), String> {
        let served = read(&self.shared.stages).stage_group.clone();
        if programs.len() != pipeline.stages.len() || pipeline.stages.len() < served.len() {
            return Err(format!("{} stage programs for {} stages ({} served)", programs.len(), pipeline.stages.len(), served.len()));
        }
        let mut owner: Vec<Option<usize>> = served.iter().map(|&g| Some(g)).collect();
        owner.resize(pipeline.stages.len(), None);
        for (stage, variants) in models {
            let group = self.shared.group(&self.groups, stage).ok_or_else(|| format!("stage {stage} is not served here"))?;
            lock(&group).set_models(stage, variants).map_err(|e| e.to_string())?;
        }
        let mut groups = write(&self.groups);
        for placement in placements {
            let index = groups.len();
            for &stage in &placement.stages {
                match owner.get_mut(stage as usize) {
                    Some(slot @ None) => *slot = Some(index),
                    _ => return Err(format!("a new worker group names stage {stage}, which is served already or does not exist")),
                }
            }
            groups.push(start_group(&self.shared, &self.finishers, index, placement.workers, placement.events));
        }
        drop(groups);
        let stage_group = owner
            .into_iter()
            .enumerate()
            .map(|(stage, group)| group.ok_or_else(|| format!("stage {stage} is placed on no worker group")))
            .collect::<Result<Vec<usize>, String>>()?;
        *write(&self.shared.stages) = StageTable::new(pipeline, programs, stage_group);
        self.profiles = pipeline.stages.iter().map(|s| s.variants.iter().map(|v| v.profile.clone()).collect()).collect();
        Ok(())
    }

    /// The profiled p99 of a batch of `batch` on `worker`'s variant.
    fn profiled_tail(&self, worker: u32, batch: usize) -> Duration {
        let tail = self
            .worker_stage
            .get(&worker)
            .and_then(|&(stage, variant)| self.profiles.get(stage as usize)?.get(variant as usize))
            .map_or(0, |profile| profile.tail(batch as u32));
        Duration::from_nanos(tail)
    }
}

/// The watchdog's check: fail and restart every job that has run past its limit.
fn check_stalls(shared: &Shared, groups: &Groups, now: Instant) {
    let config = *lock(&shared.watchdog);
    let mut overdue = Vec::new();
    {
        let mut jobs = lock(&shared.jobs);
        let JobTable { records, running } = &mut *jobs;
        for job in running.values() {
            let Some(record) = records.get_mut(job) else { continue };
            if shared.board.status(record.worker) == Some(WorkerStatus::Loading) {
                // Waiting for the model to load: not timed yet.
                record.started = now;
                continue;
            }
            let ran = now.saturating_duration_since(record.started);
            if let Some(limit) = config.limit(record.tail) {
                if ran > limit {
                    overdue.push((*job, ran, limit));
                }
            }
        }
    }
    for (job, ran, limit) in overdue {
        // Claimed here, a late result of the job is ignored.
        let Some(record) = shared.claim(job) else { continue };
        let (worker, stage, variant) = (record.worker, record.stage, record.variant);
        let requests = record.shares.len() + record.refused.len();
        let message = config.stalled_message(worker, requests, ran, limit, record.tail);
        tracing::error!(worker, stage, job, "{message}");
        restart(shared, groups, worker, stage, variant);
        let mut result = record.failed(&message);
        result.duration = ran.as_nanos() as u64;
        shared.report(result);
    }
}

/// Replace a stalled worker by a fresh one under the same id.
fn restart(shared: &Shared, groups: &Groups, worker: u32, stage: u32, variant: u32) {
    let Some(group) = shared.worker_group(groups, worker, stage) else { return };
    let mut group = lock(&group);
    group.abort(worker);
    *lock(&shared.replaced).entry(worker).or_default() += 1;
    shared.board.set(worker, stage, WorkerStatus::Loading);
    if let Err(error) = group.provision(worker, stage, variant) {
        let failure = format!("worker {worker} stalled and could not be restarted: {error}");
        tracing::error!(worker, stage, "{failure}");
        lock(&shared.replaced).remove(&worker);
        shared.board.set(worker, stage, WorkerStatus::Failed(failure.clone()));
        let _ = shared.handle.worker_lost(worker, failure);
    }
}

/// Check that `placements` put every stage of a `stages`-stage pipeline in exactly one
/// group.
pub fn check_placements(placements: &[Placement], stages: u32) -> Result<(), String> {
    let mut owner = vec![None; stages as usize];
    for (index, placement) in placements.iter().enumerate() {
        for &stage in &placement.stages {
            let Some(slot) = owner.get_mut(stage as usize) else {
                return Err(format!("placement {index} names stage {stage}; the pipeline has {stages} stages"));
            };
            if let Some(other) = slot.replace(index) {
                return Err(format!("stage {stage} is placed twice (groups {other} and {index})"));
            }
        }
    }
    match owner.iter().position(Option::is_none) {
        Some(stage) => Err(format!("stage {stage} is placed on no worker group")),
        None => Ok(()),
    }
}

impl Executor for OnnxExecutor {
    fn start(&mut self, job: BatchJob) {
        let shared = Arc::clone(&self.shared);
        let variant = self.worker_stage.get(&job.worker).map_or(0, |&(_, variant)| variant);
        let tail = self.profiled_tail(job.worker, job.items.len());
        let mut record = JobRecord {
            worker: job.worker,
            stage: job.stage,
            variant,
            shares: Vec::new(),
            refused: Vec::new(),
            started: Instant::now(),
            tail,
        };
        if let Some(WorkerStatus::Failed(error)) = shared.board.status(job.worker) {
            record.refused = job.items.iter().map(|i| (i.id, start_failure(job.worker, &error))).collect();
            shared.report(record.failed(""));
            return;
        }
        let mut requests = Vec::new();
        for item in &job.items {
            match shared.take_inputs(item.id, job.stage) {
                Ok((elements, sequence)) => {
                    record.shares.push(Share { id: item.id, elements: elements.len() });
                    for inputs in elements {
                        requests.push(Request { id: requests.len() as u64, inputs, sequence: sequence.clone() });
                    }
                }
                Err(error) => record.refused.push((item.id, error)),
            }
        }
        let row_limit = read(&shared.stages).row_limit.get(job.stage as usize).copied().flatten();
        if let Some(limit) = row_limit.filter(|&limit| requests.len() > limit) {
            // The engine keeps a batch's items within the limit; a job past it fails
            // whole (its requests end with the reason) rather than run past the model's
            // max_batch_size.
            let name = shared.program(job.stage).map(|p| p.name().to_string()).unwrap_or_default();
            let error = format!(
                "model {name:?}: a batch of {} rows from {} requests is over max_batch_size {limit}: the batch was not run",
                requests.len(),
                record.shares.len()
            );
            shared.report(record.failed(&error));
            return;
        }
        if requests.is_empty() {
            // Nothing for the model (no text found, or no inputs could be made): the
            // job ends here.
            shared.report(shared.finish(record, Ok(Vec::new()), 0, JobTiming::default()));
            return;
        }
        let id = self.next_job;
        self.next_job += 1;
        {
            let mut jobs = lock(&shared.jobs);
            record.started = Instant::now();
            jobs.records.insert(id, record);
            jobs.running.insert(job.worker, id);
        }
        let handed = match self.group_of(job.worker) {
            Some(group) => lock(&group).start(job.worker, Job { id, requests }).map_err(|e| e.to_string()),
            None => Err(format!("worker {} is unknown to the executor", job.worker)),
        };
        if let Err(error) = handed {
            // A worker whose model failed to load is gone before its pump has read the
            // `StartFailed` that says why; wait briefly for that verdict so the requests
            // fail with the real cause (the pump may claim the job itself meanwhile).
            let error = match shared.board.wait_while_loading(job.worker, VERDICT_WAIT) {
                Some(WorkerStatus::Failed(cause)) => start_failure(job.worker, &cause),
                _ => format!("worker {}: {error}", job.worker),
            };
            if let Some(record) = shared.claim(id) {
                tracing::warn!(worker = job.worker, "a job could not be handed over: {error}");
                shared.report(record.failed(&error));
            }
        }
    }

    fn abort(&mut self, worker: u32) {
        // Claimed here, the job's result (if it still comes) is ignored: the engine has
        // taken its requests back. Claimed already, its result is on its way to the
        // engine: it is refused there (`accept_result`).
        if self.shared.claim_running(worker).is_none() {
            *self.late_results.entry(worker).or_insert(0) += 1;
        }
        if let Some(group) = self.group_of(worker) {
            lock(&group).abort(worker);
        }
    }

    fn accept_result(&mut self, result: &JobResult) -> bool {
        match self.late_results.get_mut(&result.worker) {
            Some(late) if *late > 0 => {
                *late -= 1;
                tracing::debug!(worker = result.worker, "the result of a preempted job came late and is dropped");
                false
            }
            _ => true,
        }
    }

    fn provision(&mut self, worker: u32, stage: u32, variant: u32, start: WorkerStart) {
        self.worker_stage.insert(worker, (stage, variant));
        self.shared.board.set(worker, stage, WorkerStatus::Loading);
        lock(&self.shared.starts).seated(worker, start.host, start.warm);
        // A worker seated on a cluster host runs there when the host serves its stage
        // (a model loaded after the host joined is served by this host's pools).
        let host_group = read(&self.shared.host_groups).get(&start.host).copied();
        let host_group = host_group.filter(|&index| read(&self.groups).get(index).is_some_and(|g| lock(g).serves(stage)));
        match host_group {
            Some(index) => lock(&self.shared.worker_groups).insert(worker, index),
            None => lock(&self.shared.worker_groups).remove(&worker),
        };
        let Some(group) = self.group_of(worker) else { return };
        let provisioned = lock(&group).provision(worker, stage, variant);
        if let Err(error) = provisioned {
            lock(&self.shared.starts).forget(worker);
            tracing::error!(worker, stage, variant, "worker could not be provisioned: {error}; it is reported lost");
            self.shared.board.set(worker, stage, WorkerStatus::Failed(error.to_string()));
            // The engine counts it as starting until told: a stage whose only workers
            // cannot be provisioned (a lost node) then refuses arrivals at once.
            let _ = self.shared.handle.worker_lost(worker, format!("worker {worker} could not be provisioned: {error}"));
        }
    }

    fn retire(&mut self, worker: u32) {
        // The next `Retired` of this id is this retirement's (or the replaced
        // instance's, which is gone as well).
        lock(&self.shared.replaced).remove(&worker);
        lock(&self.shared.starts).forget(worker);
        if let Some(group) = self.group_of(worker) {
            lock(&group).retire(worker);
        }
        self.worker_stage.remove(&worker);
        lock(&self.shared.worker_groups).remove(&worker);
    }

    fn set_threads(&mut self, worker: u32, threads: u32) {
        if let Some(group) = self.group_of(worker) {
            let changed = lock(&group).set_threads(worker, threads);
            if let Err(error) = changed {
                tracing::warn!(worker, threads, "changing a worker's threads failed: {error}");
            }
        }
    }

    fn set_variant(&mut self, worker: u32, variant: u32) {
        let changed = match self.group_of(worker) {
            Some(group) => lock(&group).set_variant(worker, variant).map_err(|error| {
                tracing::warn!(worker, variant, "changing a worker's variant failed: {error}; it keeps its model");
            }),
            None => Err(()),
        };
        if changed.is_ok() {
            if let Some(entry) = self.worker_stage.get_mut(&worker) {
                entry.1 = variant;
            }
        }
    }

    fn initial_workers_report_ready(&self) -> bool {
        // The initial workers load on their hosts after the engine starts, and each
        // reports `Ready` (the pump calls `worker_ready`).
        true
    }

    fn sequence_released(&mut self, worker: u32, sequence: u64) {
        // The worker holding the stateful sequence's state drops it (after the jobs
        // handed to it before).
        if let Some(group) = self.group_of(worker) {
            lock(&group).release_sequence(worker, sequence);
        }
    }

    fn evict(&mut self, worker: u32, sequence: u64, _mode: EvictMode) {
        // Only iteration (LLM) stages hold sequences; the ONNX executor serves batch
        // stages, so the engine never has anything resident here.
        tracing::debug!(worker, sequence, "evict ignored: no resident sequences on ONNX workers");
    }
}

/// A group of workers ready for the executor: its events handled on its workers'
/// threads, or by an event pump thread started here.
fn start_group(
    shared: &Arc<Shared>,
    finishers: &mpsc::Sender<Finishing>,
    index: usize,
    workers: Box<dyn Workers>,
    events: GroupEvents,
) -> Group {
    let (handler_shared, finishers) = (Arc::clone(shared), finishers.clone());
    match events {
        GroupEvents::Direct(relay) => {
            relay.bind(Arc::new(move |event| handle_event(&handler_shared, index, event, &finishers)));
        }
        GroupEvents::Channel(events) => {
            let spawned = std::thread::Builder::new().name(format!("yardmaster-pump-{index}")).spawn(move || {
                while let Ok(event) = events.recv() {
                    handle_event(&handler_shared, index, event, &finishers);
                }
            });
            if let Err(error) = spawned {
                tracing::error!("starting the event pump of worker group {index}: {error}; its workers' results will not arrive");
            }
        }
    }
    Arc::new(Mutex::new(workers))
}

/// A read lock that survives a panic elsewhere (see [`lock`]).
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A write lock that survives a panic elsewhere (see [`lock`]).
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start_failure(worker: u32, error: &str) -> String {
    format!("worker {worker} could not start: {error}")
}

/// A finished job whose outputs are still to be folded into its requests.
struct Finishing {
    record: JobRecord,
    worker: u32,
    outputs: Result<Vec<Vec<Tensor>>, String>,
    duration: u64,
    timing: JobTiming,
}

impl Finishing {
    /// Fold the job's outputs into its requests and make its result (every request
    /// failing with the reason if the fold panics).
    fn fold(self, shared: &Shared) -> JobResult {
        let Finishing { record, worker, outputs, duration, timing } = self;
        let ids: Vec<u64> = record.shares.iter().map(|s| s.id).chain(record.refused.iter().map(|(id, _)| *id)).collect();
        let (stage, begin) = (record.stage, Instant::now());
        let result = guarded("finishing a job", || Ok(shared.finish(record, outputs, duration, timing)))
            .unwrap_or_else(|error| JobResult { worker, duration, items: ids.iter().map(|&id| item(id, Some(error.clone()))).collect() });
        tracing::debug!(stage, requests = ids.len(), fold_ms = begin.elapsed().as_secs_f64() * 1e3, "job folded");
        result
    }
}

/// Threads that fold finished jobs' outputs into their requests (a stage's
/// post-processing and the next stage's pre-processing: for PP-OCR, box finding, crops
/// and resizing) and report the jobs to the engine. Jobs of all workers are folded in
/// parallel, so a fast device is not held back by one thread doing every request's CPU
/// work; one per core, at most 8. They end when every pump has ended.
fn start_finishers(shared: &Arc<Shared>) -> mpsc::Sender<Finishing> {
    let (sender, receiver) = mpsc::channel::<Finishing>();
    let receiver = Arc::new(Mutex::new(receiver));
    let count = yardmaster_dataplane::parallel::cores().clamp(2, 8);
    for index in 0..count {
        let (shared, receiver) = (Arc::clone(shared), Arc::clone(&receiver));
        let spawned = std::thread::Builder::new().name(format!("yardmaster-finish-{index}")).spawn(move || loop {
            let Ok(finishing) = lock(&receiver).recv() else { return };
            shared.report_here(finishing.fold(&shared));
        });
        if let Err(error) = spawned {
            tracing::error!("starting finisher thread {index}: {error}");
        }
    }
    sender
}

/// Handle one event of a worker of group `group`, on the worker's thread or the group's
/// event pump, in the order of that worker's events. A finished job is claimed here and
/// folded here (a light fold) or by the finishers.
fn handle_event(shared: &Shared, group: usize, event: WorkerEvent, finishers: &mpsc::Sender<Finishing>) {
    match event {
        WorkerEvent::Ready { worker, model, kind, took } => {
            tracing::info!(worker, %model, ?kind, took_ms = took.as_secs_f64() * 1e3, "worker ready");
            // The host whose connection this group is (the controller's own otherwise).
            let host = read(&shared.host_groups).iter().find(|(_, &g)| g == group).map_or(0, |(&host, _)| host);
            lock(&shared.starts).ready(worker, host, kind == StartKind::Warm, took);
            shared.board.update(worker, WorkerStatus::Ready);
            let _ = shared.handle.worker_ready(worker);
        }
        WorkerEvent::StartFailed { worker, error } => {
            lock(&shared.starts).forget(worker);
            let error = error.to_string();
            let stage = shared.board.update(worker, WorkerStatus::Failed(error.clone()));
            tracing::error!(worker, ?stage, "worker failed to start: {error}; jobs sent to it fail with this error");
            let failure = start_failure(worker, &error);
            if let Some(record) = shared.claim_running(worker) {
                shared.report(record.failed(&failure));
            }
            let _ = shared.handle.worker_lost(worker, failure);
        }
        WorkerEvent::Finished { worker, job, duration, timing, result } => {
            let Some(record) = shared.claim(job) else { return };
            tracing::debug!(
                worker,
                job,
                stage = record.stage,
                requests = record.shares.len(),
                duration_ms = duration.as_secs_f64() * 1e3,
                "job finished"
            );
            let outputs =
                result.map(|outputs| outputs.into_iter().map(|o| o.outputs).collect()).map_err(|e| format!("worker {worker}: {e}"));
            lock(&shared.timings).add(record.stage, duration, &timing);
            let finishing = Finishing { record, worker, outputs, duration: duration.as_nanos() as u64, timing };
            if shared.program(finishing.record.stage).is_ok_and(|program| program.folds_lightly()) {
                // Moving tensors costs less than waking a finisher: fold here.
                shared.report_here(finishing.fold(shared));
                return;
            }
            if let Err(mpsc::SendError(Finishing { record, .. })) = finishers.send(finishing) {
                // No finisher thread could start: fail the job rather than lose it.
                shared.report(record.failed("the server could not fold the job's outputs (no finisher thread)"));
            }
        }
        WorkerEvent::Aborted { .. } => {}
        WorkerEvent::Reconfigured { worker, model, threads, took } => {
            tracing::info!(worker, %model, threads, took_ms = took.as_secs_f64() * 1e3, "worker reconfigured");
        }
        WorkerEvent::ReconfigureFailed { worker, error } => {
            tracing::warn!(worker, "worker reconfiguration failed: {error}; it keeps its previous session");
        }
        WorkerEvent::Retired { worker } => {
            let mut replaced = lock(&shared.replaced);
            match replaced.get_mut(&worker) {
                Some(count) if *count > 0 => {
                    // The stalled instance the watchdog replaced, gone at last.
                    *count -= 1;
                    if *count == 0 {
                        replaced.remove(&worker);
                    }
                    tracing::info!(worker, "the replaced instance of a restarted worker retired");
                }
                _ => {
                    drop(replaced);
                    tracing::info!(worker, "worker retired");
                    shared.board.remove(worker);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_light_fold_stays_on_its_thread_and_a_heavy_one_spreads_over_the_cores() {
        let light = PARALLEL_FOLD_AFTER - Duration::from_micros(1);
        assert_eq!(fold_threads(light, 63, 16), 1, "a tiny model's batch of 64 is folded here");
        assert_eq!(fold_threads(PARALLEL_FOLD_AFTER, 7, 16), 7, "a heavy fold takes a thread per request left");
        assert_eq!(fold_threads(Duration::from_millis(5), 7, 2), 2, "at most one per core");
        assert_eq!(fold_threads(Duration::from_millis(5), 0, 2), 1, "nothing left: no helper");
    }
}
