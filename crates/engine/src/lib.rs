//! The scheduling engine: one state machine that owns every request and worker and
//! asks a policy arm what to do, generic over a [`Clock`] and an [`Executor`] so the
//! simulator and the server drive the very same code.
//!
//! The engine knows nothing of HTTP, QUIC, ONNX Runtime or traces. Its driver
//! reports what happened — a request submitted, a job finished, a worker ready, the
//! clock reaching [`Engine::next_wakeup`] — and calls [`Engine::flush`] at each
//! decision point: the events gathered since the last flush go to the policy in one
//! call, and the validated actions are applied (jobs started on the executor, requests
//! dropped, workers provisioned or retired, timers set).
//!
//! Lifecycle of a request: submitted → queued at its entry stage (an `arrival` for the
//! policy) → dispatched in a job → done at the stage → forwarded to the next stage(s)
//! → completed; or dropped, expired, failed or refused at any point. A request that
//! fans out becomes pieces (sub-requests with new ids and the same `origin`); a
//! fan-in stage waits for every live piece of the origin and merges them into one.
//! The end-to-end request ends exactly once, when its last piece finishes or its
//! first piece is dropped or fails; the accounting sees exactly that one end.
//!
//! [`metrics`] is the one definition of every metric, fed by the engine as requests
//! end, and read alike by the simulator's reports and the server's Prometheus text.

#![warn(missing_docs)]

mod agenda;
pub mod bound;
mod exec;
pub mod hosts;
pub mod metrics;
pub mod pipeline;
mod reconfigure;
mod sequences;
mod state;
#[cfg(test)]
mod test_support;

pub use exec::{
    BatchJob, Clock, Executor, IdSpace, ItemResult, JobItem, JobResult, ManualClock, MonotonicClock, RecordingExecutor, Resume,
    SharedExecutor, WorkerStart,
};
pub use metrics::Outcome;
pub use pipeline::{Pipeline, Profile, StageDef, StreamDef, VariantDef};
pub use reconfigure::{keeps_places, ReconfigureOutcome};
pub use state::{ClusterState, Origin, Piece, PieceState, PieceTable, WorkerEntry, WorkerPhase};

use crate::metrics::{Accounting, BatchRecord, RequestEnd};
use yardmaster_policy::contract::{self, Action, Config, EndReason, Event, Param, Request, StageKind};
use yardmaster_policy::{Arm, ArmOutput, CallCost, Candidate, HandoverSnapshot, PolicyInstance, Shadow, ShadowReport, SwapReport};

/// The LS time between tokens when the driver sets none: 100 ms.
pub const DEFAULT_LS_TIME_BETWEEN_TOKENS: u64 = 100_000_000;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Period of `tick` events.
    pub tick_interval: u64,
    /// Decode steps per frame on iteration stages.
    pub frame_steps: u32,
    /// The host expires a request the policy still holds this long after its deadline
    /// (for a latency-sensitive LLM request: after its next token's due time on its
    /// token timeline).
    pub expiry_grace: u64,
    /// Most intra-op threads per worker.
    pub max_threads: u32,
    /// Policy parameters.
    pub params: Vec<Param>,
    /// Seed of the policy's random source.
    pub seed: u64,
    /// Window of the accounting's time series.
    pub metrics_window: u64,
    /// LLM goodput accounting: the time between tokens promised to latency-sensitive
    /// streams (their token timeline), in nanoseconds. The driver sets it from the
    /// service level it serves; a policy's own parameters never change it.
    pub ls_time_between_tokens: u64,
}

impl EngineOptions {
    /// The LS time between tokens a driver serves, in nanoseconds: `explicit_ms` (the
    /// driver's own setting) if given, else the `tbt_ms` policy parameter in `params`
    /// (so that what the policies schedule for is what is measured), else
    /// [`DEFAULT_LS_TIME_BETWEEN_TOKENS`]. For drivers filling
    /// [`EngineOptions::ls_time_between_tokens`]; the engine itself reads only that field.
    pub fn ls_time_between_tokens_from(explicit_ms: Option<f64>, params: &[Param]) -> u64 {
        let from_params = || params.iter().find(|p| p.key == "tbt_ms").and_then(|p| p.value.trim().parse::<f64>().ok());
        explicit_ms.or_else(from_params).map_or(DEFAULT_LS_TIME_BETWEEN_TOKENS, |ms| (ms * 1e6) as u64)
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            tick_interval: 1_000_000_000,
            frame_steps: 8,
            expiry_grace: 5_000_000_000,
            max_threads: 16,
            params: Vec::new(),
            seed: 1,
            metrics_window: 1_000_000_000,
            ls_time_between_tokens: DEFAULT_LS_TIME_BETWEEN_TOKENS,
        }
    }
}

/// What a client asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Submission {
    /// Stream (entry stage and SLO).
    pub stream: u32,
    /// When the client sent it (defaults to now when 0 and later than now).
    pub sent_at: u64,
    /// Deadline override (0: sent_at + the stream's SLO).
    pub deadline: u64,
    /// Client priority.
    pub priority: u32,
    /// Input size (prompt tokens for LLMs).
    pub input_size: u32,
    /// Expected output tokens (0 when unknown).
    pub expected_tokens: u32,
    /// Items the request carries: a client batch's leading dimension (0 counts as 1).
    /// A batch's size is the sum of its requests' items.
    pub items: u32,
    /// The stateful sequence the request is a step of, if any.
    pub sequence: Option<SequenceStep>,
}

/// One request's place in a stateful sequence (Triton's sequence batcher): the
/// sequence's correlation id and whether the request starts or ends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SequenceStep {
    /// The sequence's correlation id.
    pub id: u64,
    /// The first request of the sequence.
    pub start: bool,
    /// The last request of the sequence.
    pub end: bool,
}

/// How an end-to-end request ended, for the driver (the server answers the client).
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// The end-to-end request.
    pub id: u64,
    /// Its outcome.
    pub outcome: Outcome,
    /// When.
    pub at: u64,
    /// When the client sent it.
    pub sent_at: u64,
    /// Its deadline.
    pub deadline: u64,
    /// When the engine took it in (its queue started).
    pub arrived_at: u64,
    /// When a job first ran a piece of it (its compute started); `None` when none did.
    pub first_job_at: Option<u64>,
}

/// Things the engine schedules for itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Wakeup {
    Tick,
    Timer(u64),
    Deferred(u64),
    Expire(u64),
}

/// What [`Engine::swap`] did.
pub struct SwapOutcome {
    /// The arm's account of the hand-over.
    pub report: SwapReport,
    /// Wall time the swap held the engine: the hand-over (the new policy's `init`
    /// and the replay) and applying its actions.
    pub pause: std::time::Duration,
    /// The instance that answered before, for the caller to drop off the hot path.
    pub retired: Option<Box<dyn PolicyInstance>>,
}

impl std::fmt::Debug for SwapOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapOutcome").field("report", &self.report).field("pause", &self.pause).finish_non_exhaustive()
    }
}

/// One policy call, as an observer set with [`Engine::observe_calls`] sees it.
#[derive(Debug)]
pub struct CallSeen<'a> {
    /// The events delivered (none for a swap's hand-over).
    pub events: &'a [Event],
    /// The arm's validated answer, before the engine applies it.
    pub output: &'a ArmOutput,
    /// What the call cost the instance that answered ([`Arm::last_cost`]).
    pub cost: Option<CallCost>,
}

/// Watches every policy call of an engine (see [`Engine::observe_calls`]).
pub type CallObserver = Box<dyn FnMut(&CallSeen<'_>) + Send>;

/// Engine counters beyond the arm's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Policy calls (flushes that delivered events).
    pub flushes: u64,
    /// Events delivered.
    pub events: u64,
    /// Jobs started.
    pub jobs: u64,
    /// Preemptions applied.
    pub preemptions: u64,
    /// Evictions applied.
    pub evictions: u64,
    /// Caches of sequences whose request ended while resident on an iteration-level
    /// worker, freed there (the executor is told as for an eviction by recompute; not
    /// an eviction the policy asked for).
    pub freed_caches: u64,
    /// Requests the host expired.
    pub expired: u64,
    /// Actions the engine refused after validation (e.g. KV cache full).
    pub refused_actions: u64,
    /// Policy drops by the stage the dropped piece was at (indexed by stage id).
    pub drops_by_stage: Vec<u64>,
    /// Jobs by batch size: entry `k` counts jobs of at most `2^k` requests (and more
    /// than `2^(k-1)`); the last entry counts every larger job.
    pub batch_sizes: [u64; BATCH_SIZE_BUCKETS],
    /// Requests over all jobs started (their mean batch size is this over `jobs`).
    pub batch_items: u64,
}

/// Buckets of [`EngineStats::batch_sizes`]: 1, 2, 4, … 512, and above.
pub const BATCH_SIZE_BUCKETS: usize = 11;

impl EngineStats {
    /// Count a job of `size` requests.
    fn record_batch(&mut self, size: usize) {
        let bucket = (usize::BITS - size.saturating_sub(1).leading_zeros()) as usize;
        self.batch_sizes[bucket.min(BATCH_SIZE_BUCKETS - 1)] += 1;
        self.batch_items += size as u64;
        self.jobs += 1;
    }
}

/// The scheduling engine.
pub struct Engine<C: Clock, X: Executor> {
    clock: C,
    executor: X,
    arm: Arm,
    shadow: Option<Shadow>,
    state: ClusterState,
    options: EngineOptions,
    pending: Vec<Event>,
    agenda: agenda::Agenda<Wakeup>,
    ids: IdSpace,
    accounting: Accounting,
    ended: Vec<Ended>,
    stats: EngineStats,
    /// Per stage: why it has no worker left since its last one was lost (None while
    /// it has one, or has never lost one). Arrivals at such a stage fail at once.
    unserved: Vec<Option<String>>,
    /// Live stateful sequences (see [`sequences`]).
    sequences: sequences::Sequences,
    observer: Option<CallObserver>,
    /// The optimal bound's capacity (see [`bound`]), for the current `max_workers`.
    capacity_bound: f64,
}

impl<C: Clock, X: Executor> Engine<C, X> {
    /// The policy configuration for `pipeline` (what `init` receives).
    pub fn policy_config(pipeline: &Pipeline, arm: &str, options: &EngineOptions) -> Config {
        // The initial workers and their seats, as the engine will give them.
        let mut workers = Vec::new();
        for (worker, stage, start) in hosts::initial_seats(pipeline) {
            let mut info = worker_info(worker, stage, &pipeline.stages[stage as usize]);
            (info.host, info.slot) = (start.host, start.slot);
            workers.push(info);
        }
        // The hosts as the configuration lists them (names, slots, caches: no seat).
        let hosts = hosts::Hosts::new(&pipeline.hosts, pipeline.max_workers);
        Config {
            arm: arm.into(),
            stages: pipeline.contract_stages(),
            workers,
            streams: pipeline.contract_streams(),
            hosts: hosts.info(),
            params: options.params.clone(),
            tick_interval: options.tick_interval,
            max_workers: pipeline.max_workers,
            seed: options.seed,
            now: 0,
        }
    }

    /// An engine for `pipeline` with its initial workers (serving at once), asking
    /// `start_arm` for the policy arm given the configuration and the cluster view.
    pub fn new(
        clock: C,
        executor: X,
        pipeline: Pipeline,
        options: EngineOptions,
        start_arm: impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput),
    ) -> Self {
        Self::build(clock, executor, pipeline, options, IdSpace::default(), "main", true, start_arm)
    }

    /// An engine beside others on the same executor (the second arm of an A/B run):
    /// ids come from the shared `ids`, the arm is called `arm`, and `pipeline`'s
    /// initial replicas are provisioned on the executor — they reach the policy as
    /// `worker-added` when ready, so its configuration lists no worker.
    pub fn beside(
        clock: C,
        executor: X,
        pipeline: Pipeline,
        options: EngineOptions,
        ids: IdSpace,
        arm: &str,
        start_arm: impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput),
    ) -> Self {
        Self::build(clock, executor, pipeline, options, ids, arm, false, start_arm)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        clock: C,
        executor: X,
        pipeline: Pipeline,
        options: EngineOptions,
        ids: IdSpace,
        arm: &str,
        serving_at_once: bool,
        start_arm: impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput),
    ) -> Self {
        let mut state = ClusterState::new(pipeline, options.max_threads);
        state.now = clock.now();
        let mut config = Self::policy_config(&state.pipeline, arm, &options);
        let mut provision = Vec::new();
        if serving_at_once {
            // The configuration numbers the initial workers from 0, as the executors do.
            ids.reserve_workers(config.workers.len() as u32);
            let loading = executor.initial_workers_report_ready();
            for worker in &config.workers {
                let seat = contract::Placement { host: worker.host, slot: Some(worker.slot) };
                state.add_worker(*worker, WorkerPhase::Idle, Some(&seat), loading);
                state.stages[worker.stage as usize].replicas += 1;
            }
        } else {
            for worker in std::mem::take(&mut config.workers) {
                let mut info = worker;
                info.id = ids.worker();
                let start = state.add_worker(info, WorkerPhase::Starting, None, true);
                state.stages[info.stage as usize].replicas += 1;
                provision.push((info.id, info.stage, info.variant, start));
            }
        }
        let (arm, output) = start_arm(config, &state);
        let mut accounting = Accounting::new(options.metrics_window);
        if state.pipeline.stages.iter().any(|s| s.kind == StageKind::Iteration) {
            // LLM goodput by service class: classes from stream names, the LS token
            // timeline from the options.
            let names: Vec<&str> = state.pipeline.streams.iter().map(|s| s.name.as_str()).collect();
            accounting.llm_mut().activate(&names, options.ls_time_between_tokens);
        }
        let mut engine = Self {
            clock,
            executor,
            arm,
            shadow: None,
            state,
            options,
            pending: Vec::new(),
            agenda: agenda::Agenda::default(),
            ids,
            accounting,
            ended: Vec::new(),
            stats: EngineStats::default(),
            unserved: Vec::new(),
            sequences: sequences::Sequences::default(),
            observer: None,
            capacity_bound: f64::NAN,
        };
        engine.capacity_bound = bound::capacity_bound(&engine.state.pipeline, engine.state.pipeline.max_workers);
        engine.unserved = vec![None; engine.state.stages.len()];
        for (worker, stage, variant, start) in provision {
            engine.executor.provision(worker, stage, variant, start);
        }
        let now = engine.state.now;
        engine.accounting.workers_changed(now, engine.state.serving() as u32);
        engine.update_capacity();
        engine.schedule(now + engine.options.tick_interval, Wakeup::Tick);
        engine.apply(output);
        engine
    }

    /// Watch every policy call from now on (replacing an earlier observer): `observer`
    /// sees each call's events, the arm's answer before it is applied, and the call's
    /// cost. For the conformance check (`yardmaster policy check`), which reports
    /// rejected actions, faults and decision cost per call. The arm's start is not a
    /// call seen here: its answer is the one `start_arm` returns.
    pub fn observe_calls(&mut self, observer: CallObserver) {
        self.observer = Some(observer);
    }

    /// The cluster state (read-only).
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The policy arm.
    pub fn arm(&self) -> &Arm {
        &self.arm
    }

    /// The executor.
    pub fn executor(&self) -> &X {
        &self.executor
    }

    /// The executor, mutably (drivers use it to collect finished jobs).
    pub fn executor_mut(&mut self) -> &mut X {
        &mut self.executor
    }

    /// Counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The settings it runs with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Where its request and worker ids come from (share it with an engine started
    /// [`Engine::beside`] this one).
    pub fn ids(&self) -> IdSpace {
        self.ids.clone()
    }

    /// Whether `worker` is one of this engine's workers.
    pub fn owns_worker(&self, worker: u32) -> bool {
        self.state.workers.contains_key(&worker)
    }

    /// Whether the end-to-end request `id` is in flight here.
    pub fn holds_request(&self, id: u64) -> bool {
        self.state.origins.contains_key(&id)
    }

    /// Set a stage's replicas from outside the policy (the host dividing workers
    /// between the arms of an A/B run): workers are provisioned, or starting, idle and
    /// then busy ones leave (busy ones after their job), as for the policy's `scale`.
    pub fn resize(&mut self, stage: u32, replicas: u32) {
        if (stage as usize) < self.state.stages.len() {
            self.now();
            let variant = self.state.workers.values().find(|w| w.info.stage == stage).map_or(0, |w| w.info.variant);
            self.scale(stage, replicas, variant, &[]);
        }
    }

    /// Cap the workers the policy may ask for (its share of the cluster).
    pub fn set_max_workers(&mut self, max_workers: u32) {
        self.state.pipeline.max_workers = max_workers;
        self.state.hosts.set_max_workers(max_workers);
        self.now();
        self.capacity_bound = bound::capacity_bound(&self.state.pipeline, max_workers);
        self.update_capacity();
    }

    /// The optimal goodput bound's capacity: the most end-to-end requests per second
    /// any decisions could serve on this cluster (see [`bound`]).
    pub fn capacity_bound(&self) -> f64 {
        self.capacity_bound
    }

    /// The accounting (every metric).
    pub fn accounting(&self) -> &Accounting {
        &self.accounting
    }

    /// Requests that ended since the last call (for the server to answer clients).
    pub fn take_ended(&mut self) -> Vec<Ended> {
        std::mem::take(&mut self.ended)
    }

    /// [`Engine::take_ended`] onto the end of `out`, for a driver that reuses one
    /// buffer at every decision point (the engine keeps its own buffer too).
    pub fn take_ended_into(&mut self, out: &mut Vec<Ended>) {
        out.append(&mut self.ended);
    }

    /// End-to-end requests not yet ended.
    pub fn in_flight(&self) -> usize {
        self.state.origins.len()
    }

    /// When the engine next needs the driver to call [`Engine::advance`].
    pub fn next_wakeup(&self) -> Option<u64> {
        self.agenda.next_time()
    }

    /// Whether events wait for the next [`Engine::flush`].
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn now(&mut self) -> u64 {
        let now = self.clock.now().max(self.state.now);
        self.state.now = now;
        now
    }

    fn schedule(&mut self, at: u64, what: Wakeup) {
        self.agenda.schedule(at, what);
    }

    /// A client request arrives; returns its id.
    pub fn submit(&mut self, submission: Submission) -> u64 {
        self.submit_tagged(submission, None)
    }

    /// A client request with labels arrives (e.g. the job and stage of one call of a
    /// compound LLM job, `yardmaster_sdk::helpers::compound`); the policy sees the
    /// tags on the request and the LLM accounting links calls to their jobs by them.
    /// Returns its id.
    pub fn submit_tagged(&mut self, submission: Submission, tags: Option<Vec<contract::Tag>>) -> u64 {
        let now = self.now();
        let id = self.ids.request();
        let stream = &self.state.pipeline.streams[submission.stream as usize];
        let sent_at = if submission.sent_at == 0 || submission.sent_at > now { now } else { submission.sent_at };
        let deadline = if submission.deadline == 0 { sent_at + stream.slo_ns } else { submission.deadline };
        let entry = stream.entry;
        self.state.origins.insert(
            id,
            Origin {
                stream: submission.stream,
                sent_at,
                deadline,
                live: 1,
                accuracy: 1.0,
                served: 0,
                tokens: 0,
                queue_delay: 0,
                arrived_at: now,
                first_job_at: None,
                merging: Vec::new(),
            },
        );
        self.accounting.arrival(now, submission.stream);
        let link = tags
            .as_deref()
            .and_then(|t| yardmaster_sdk::helpers::compound::CallLink::from_pairs(t.iter().map(|t| (t.key.as_str(), t.value.as_str()))));
        self.accounting.llm_mut().submitted(id, submission.stream, sent_at, deadline, submission.input_size, link);
        let request = Request {
            id,
            origin: id,
            stage: entry,
            stream: submission.stream,
            sent_at,
            arrived_at: now,
            deadline,
            priority: submission.priority,
            input_size: submission.input_size,
            expected_tokens: submission.expected_tokens,
            requeues: 0,
            tags,
            items: submission.items.max(1),
            correlation: None,
        };
        self.schedule(deadline.saturating_add(self.options.expiry_grace), Wakeup::Expire(id));
        if (request.items > 1 || submission.sequence.is_some()) && !self.arm.sees_items_and_sequences() {
            let error = self.unseen_by_policy(&request, submission.sequence.is_some());
            self.finish_origin(id, Outcome::Failed { error }, now);
            return id;
        }
        match submission.sequence {
            None => self.enqueue(request, 0),
            Some(step) => self.admit_step(request, step),
        }
        id
    }

    /// Why a client batch or a sequence step cannot be served by the policy answering
    /// now: it was built against a contract older than 0.3.0, which shows it neither
    /// a request's items nor its sequence, so it would batch past the stage's limit or
    /// run a step away from its state.
    fn unseen_by_policy(&self, request: &Request, sequence: bool) -> String {
        let what =
            if sequence { "a stateful sequence's requests".to_string() } else { format!("a client batch ({} items)", request.items) };
        let version = self.arm.contract_version().map_or_else(|| "an older contract".to_string(), |v| format!("contract {v}"));
        format!(
            "the policy {:?} speaks {version}, which cannot see {what}: rebuild it against contract {} or later (see wit/README.md), or send one item per request without sequence parameters",
            self.arm.name(),
            contract::ITEMS_AND_SEQUENCES
        )
    }

    /// A step of a stateful sequence arrives: queue it bound to the sequence's worker,
    /// hold it behind the sequence's request in flight, or refuse it (the request fails
    /// at once, naming why; the policy never sees it).
    fn admit_step(&mut self, mut request: Request, step: SequenceStep) {
        match self.sequences.admit(request.stage, step, &request) {
            Ok(sequences::Admission::Now(worker)) => {
                request.correlation = Some(sequences::correlation(step, worker));
                self.enqueue(request, 0);
            }
            Ok(sequences::Admission::Held) => {}
            Err(error) => {
                let now = self.state.now;
                self.finish_origin(request.origin, Outcome::Failed { error }, now);
            }
        }
    }

    /// Forget a stateful sequence that has been idle past its timeout (Triton's
    /// `max_sequence_idle_microseconds`): the executor frees its state on the worker
    /// holding it, and a later request of the id must start it again. Returns false
    /// when the sequence is not live or has a request in flight (it is not idle).
    pub fn release_sequence(&mut self, stream: u32, id: u64) -> bool {
        let Some(stage) = self.state.pipeline.streams.get(stream as usize).map(|s| s.entry) else { return false };
        match self.sequences.release(stage, id) {
            Some(worker) => {
                if let Some(worker) = worker {
                    self.executor.sequence_released(worker, id);
                }
                true
            }
            None => false,
        }
    }

    /// A client gave up on a request.
    pub fn cancel(&mut self, id: u64) {
        let now = self.now();
        self.end_origin(id, Outcome::Dropped { reason: "cancelled by the client".into() }, now, EndReason::Cancelled);
    }

    /// Put a piece in its stage's queue and tell the policy — unless the stage lost
    /// its last worker (see [`Engine::worker_lost`]): then the piece's request fails
    /// at once with the cause, and the policy never sees it.
    fn enqueue(&mut self, request: Request, generated: u32) {
        let stage = request.stage as usize;
        let now = self.state.now;
        if let Some(error) = self.unserved[stage].clone() {
            self.state.pieces.remove(&request.id);
            self.end_origin_except(request.origin, Outcome::Failed { error }, now, EndReason::Failed, Some(request.id));
            return;
        }
        let resume = self.state.pieces.get(&request.id).map_or(Resume::Fresh, |p| p.resume);
        self.state.stages[stage].window.arrivals += 1;
        self.state.queued_order[stage].push_back((request.id, now));
        self.pending.push(Event::Arrival(request.clone()));
        self.state.pieces.insert(request.id, Piece { request, state: PieceState::Queued, generated, resume });
    }

    /// A worker finished starting.
    pub fn worker_ready(&mut self, worker: u32) {
        self.now();
        // Its parameters are in its host's cache now (an initial worker's too).
        self.state.hosts.loaded(worker);
        let Some(entry) = self.state.workers.get_mut(&worker) else { return };
        if entry.phase != WorkerPhase::Starting {
            return;
        }
        entry.phase = WorkerPhase::Idle;
        let info = entry.info;
        self.pending.push(Event::WorkerAdded(info));
        self.pending.push(Event::WorkerIdle(worker));
        let (now, serving) = (self.state.now, self.state.serving() as u32);
        self.accounting.workers_changed(now, serving);
        self.update_capacity();
    }

    /// A worker was lost — its model failed to load, or its host went away — and takes
    /// no more work. A job it is running still reports its result (the executor fails
    /// it); the worker is then removed. The policy sees `worker-removed` (for a worker
    /// it had seen added), and the stage counts one replica fewer, so a later
    /// scale-up replaces it. When the stage is left with no worker that will serve
    /// (none starting, idle or busy), the requests queued there fail now with `reason`
    /// instead of waiting for their deadlines, and so do later arrivals at the stage
    /// until a worker is provisioned there again (a policy's or the host's scale-up).
    pub fn worker_lost(&mut self, worker: u32, reason: &str) {
        self.now();
        self.sequences_gone(worker, &format!("was lost: {reason}"));
        // Already leaving (a scale-down counted it) or unknown: nothing more to do.
        let Some(stage) = self.retire_worker(worker) else { return };
        let serves = |w: &WorkerEntry| {
            w.info.stage as usize == stage && matches!(w.phase, WorkerPhase::Starting | WorkerPhase::Idle | WorkerPhase::Busy { .. })
        };
        if !self.state.workers.values().any(serves) {
            let name = self.state.pipeline.stages[stage].name.clone();
            let error = format!("stage {name} has no worker left: {reason}");
            self.unserved[stage] = Some(error.clone());
            let waiting: Vec<u64> = self
                .state
                .pieces
                .iter()
                .filter(|(_, p)| p.request.stage as usize == stage && p.state == PieceState::Queued)
                .map(|(id, _)| *id)
                .collect();
            for id in waiting {
                self.fail_piece(id, error.clone());
            }
        }
    }

    /// A job finished.
    pub fn job_finished(&mut self, result: JobResult) {
        if !self.executor.accept_result(&result) {
            // A preempted job's result that was already on its way: its requests were
            // taken back at the preemption, and the worker may run another job now.
            return;
        }
        let now = self.now();
        let Some(worker) = self.state.workers.get_mut(&result.worker) else { return };
        let (items, draining) = match std::mem::replace(&mut worker.phase, WorkerPhase::Idle) {
            WorkerPhase::Busy { items, .. } => (items, false),
            WorkerPhase::Draining { items, .. } => (items, true),
            other => {
                worker.phase = other;
                return;
            }
        };
        worker.busy_in_window += result.duration;
        worker.last_batch = items.len() as u32;
        let stage_id = worker.info.stage;
        let variant_id = worker.info.variant;
        let kind = self.state.pipeline.stages[stage_id as usize].kind;
        if kind == StageKind::Batch {
            // The host's measured speed: this job's profiled time against its own.
            let profiled = self.state.pipeline.stages[stage_id as usize].variants[variant_id as usize].profile.mean(items.len() as u32);
            self.state.hosts.job_measured(result.worker, profiled, result.duration);
        }
        // Accelerator time, attributed to the origins of the job's pieces (those that
        // ended meanwhile too: their time was wasted).
        self.accounting.batch_finished(BatchRecord {
            at: now,
            worker: result.worker,
            duration: result.duration,
            requests: &worker.job_origins,
        });
        worker.job_origins.clear();
        let pieces = &self.state.pieces;
        self.accounting.stage_ran(
            stage_id,
            result.duration,
            items.iter().filter_map(|id| pieces.get(id)).map(|piece| piece.request.stream),
        );

        let mut outcome_results = Vec::with_capacity(result.items.len());
        let mut sequences = Vec::new();
        for item in &result.items {
            outcome_results.push(contract::RequestResult {
                id: item.id,
                status: if item.error.is_some() { contract::RequestStatus::Failed } else { contract::RequestStatus::Ok },
                tokens: item.tokens,
            });
        }
        self.pending.push(Event::BatchDone(contract::BatchOutcome {
            worker: result.worker,
            started_at: now.saturating_sub(result.duration),
            duration: result.duration,
            results: outcome_results,
        }));
        for item in result.items {
            if !items.contains(&item.id) {
                continue;
            }
            self.state.stages[stage_id as usize].window.completions += 1;
            if let Some(error) = item.error {
                self.fail_piece(item.id, error);
                continue;
            }
            self.mark_served(item.id, stage_id, variant_id);
            if !self.sequences.is_empty() {
                if let Some(origin) = self.state.pieces.get(&item.id).filter(|p| p.request.correlation.is_some()).map(|p| p.request.origin)
                {
                    self.sequences.ran(origin, result.worker);
                }
            }
            match kind {
                StageKind::Batch => self.forward(item.id, &item.fan_out),
                StageKind::Iteration => {
                    let kv_per_token = self.state.pipeline.stages[stage_id as usize].llm.kv_bytes_per_token;
                    let Some(piece) = self.state.pieces.get_mut(&item.id) else { continue };
                    let started = now.saturating_sub(result.duration);
                    let (origin, before) = (piece.request.origin, piece.generated);
                    self.accounting.llm_mut().tokens_emitted(
                        origin,
                        started,
                        result.duration,
                        self.options.frame_steps,
                        before,
                        item.tokens,
                    );
                    piece.generated += item.tokens;
                    piece.resume = Resume::Continue;
                    let generated = piece.generated;
                    let kv = (piece.request.input_size as u64 + generated as u64) * kv_per_token;
                    if let Some(origin) = self.state.origins.get_mut(&piece.request.origin) {
                        origin.tokens += item.tokens;
                    }
                    sequences.push(contract::SequenceState { id: item.id, generated, kv_bytes: kv, finished: item.finished });
                    let worker = self.state.workers.get_mut(&result.worker).expect("worker exists");
                    if item.finished {
                        worker.resident.remove(&item.id);
                        self.forward(item.id, &item.fan_out);
                    } else {
                        worker.resident.insert(item.id, kv);
                        if let Some(piece) = self.state.pieces.get_mut(&item.id) {
                            piece.state = PieceState::Paused(result.worker);
                        }
                    }
                }
            }
        }
        // Pieces of the job the executor did not report are failed, never lost.
        for id in items {
            if self.state.pieces.get(&id).is_some_and(|p| p.state == PieceState::Running(result.worker)) {
                self.fail_piece(id, "the worker reported no result for it".into());
            }
        }
        if kind == StageKind::Iteration {
            // A resumed sequence stays resident while its frame runs; one whose request
            // ended meanwhile (expired, cancelled) is gone: free its cache, here and on
            // the worker, so neither the KV count nor the frame report keeps it.
            let worker = self.state.workers.get(&result.worker).expect("worker exists");
            let ended: Vec<u64> = worker.resident.keys().copied().filter(|id| !self.state.pieces.contains_key(id)).collect();
            for id in ended {
                self.free_cache(result.worker, id);
            }
            let worker = &self.state.workers[&result.worker];
            // Every resident sequence, the paused ones too.
            let reported: Vec<u64> = sequences.iter().map(|s| s.id).collect();
            for (&id, &kv) in &worker.resident {
                if !reported.contains(&id) {
                    let generated = self.state.pieces.get(&id).map_or(0, |p| p.generated);
                    sequences.push(contract::SequenceState { id, generated, kv_bytes: kv, finished: false });
                }
            }
            self.pending.push(Event::Frame(contract::FrameReport {
                worker: result.worker,
                steps: self.options.frame_steps,
                duration: result.duration,
                sequences,
                kv_capacity: worker.info.memory_bytes,
            }));
        }
        if draining {
            self.remove_worker(result.worker);
        } else {
            self.pending.push(Event::WorkerIdle(result.worker));
        }
    }

    fn mark_served(&mut self, piece: u64, stage: u32, variant: u32) {
        let Some(origin_id) = self.state.pieces.get(&piece).map(|p| p.request.origin) else { return };
        let accuracy = self.state.pipeline.stages[stage as usize].variants[variant as usize].accuracy;
        if let Some(origin) = self.state.origins.get_mut(&origin_id) {
            let bit = 1u64 << (stage % 64);
            if origin.served & bit == 0 {
                origin.served |= bit;
                origin.accuracy *= accuracy;
            }
        }
    }

    /// A piece finished its stage: send it on, split it, or complete its origin.
    fn forward(&mut self, id: u64, fan_out: &[(u32, u32)]) {
        let now = self.state.now;
        let Some(piece) = self.state.pieces.remove(&id) else { return };
        let stage = piece.request.stage as usize;
        let origin_id = piece.request.origin;
        let successors = &self.state.pipeline.stages[stage].successors;
        match successors.as_slice() {
            [] => {
                self.piece_done(origin_id, now);
                return;
            }
            // The common case, a chain: the same piece moves on.
            &[next] if fan_out.iter().all(|(t, n)| *t != next || *n == 1) => {
                self.arrive_at(piece.request, next, piece.generated);
                return;
            }
            _ => {}
        }
        let successors = successors.clone();
        let counts: Vec<(u32, u32)> =
            successors.iter().map(|s| (*s, fan_out.iter().find(|(t, _)| t == s).map_or(1, |(_, n)| *n))).collect();
        let total: u32 = counts.iter().map(|(_, n)| n).sum();
        if total == 1 {
            // A chain: the same piece moves on.
            let next = counts.iter().find(|(_, n)| *n == 1).expect("one successor").0;
            self.arrive_at(piece.request, next, piece.generated);
            return;
        }
        // Fan-out: this piece ends, `total` new ones begin (possibly none).
        if let Some(origin) = self.state.origins.get_mut(&origin_id) {
            origin.live = origin.live - 1 + total;
        }
        for (next, n) in counts {
            for _ in 0..n {
                let mut child = piece.request.clone();
                child.id = self.ids.request();
                child.requeues = 0;
                self.arrive_at(child, next, 0);
            }
        }
        if total == 0 {
            self.check_origin_done(origin_id, now);
        }
    }

    /// A piece reaches a stage: queue it, or hold it at a fan-in stage until every live
    /// piece of its origin is there.
    fn arrive_at(&mut self, mut request: Request, stage: u32, generated: u32) {
        let now = self.state.now;
        request.stage = stage;
        request.arrived_at = now;
        // A sequence is bound at the stage it entered; later stages see a plain request.
        request.correlation = None;
        let fan_in = self.state.pipeline.stages[stage as usize].predecessors.len() > 1;
        if !fan_in {
            self.enqueue(request, generated);
            return;
        }
        let origin_id = request.origin;
        let Some(origin) = self.state.origins.get_mut(&origin_id) else { return };
        origin.merging.push((stage, request.id));
        let waiting = origin.merging.iter().filter(|(s, _)| *s == stage).count() as u32;
        if waiting < origin.live {
            self.state.pieces.insert(request.id, Piece { request, state: PieceState::Merging, generated, resume: Resume::Fresh });
            return;
        }
        // Every live piece is here: merge them into this one.
        let merged: Vec<u64> = origin.merging.iter().filter(|(s, _)| *s == stage).map(|(_, id)| *id).collect();
        origin.merging.retain(|(s, _)| *s != stage);
        origin.live = 1;
        for id in merged {
            if id != request.id {
                self.state.pieces.remove(&id);
            }
        }
        self.enqueue(request, generated);
    }

    fn piece_done(&mut self, origin_id: u64, now: u64) {
        if let Some(origin) = self.state.origins.get_mut(&origin_id) {
            origin.live = origin.live.saturating_sub(1);
        }
        self.check_origin_done(origin_id, now);
    }

    fn check_origin_done(&mut self, origin_id: u64, now: u64) {
        let Some(origin) = self.state.origins.get(&origin_id) else { return };
        if origin.live > 0 {
            // Pieces waiting at a fan-in stage may now be all that is left.
            let stages: Vec<u32> = origin.merging.iter().map(|(s, _)| *s).collect();
            if let Some(&stage) = stages.first() {
                let waiting = stages.iter().filter(|s| **s == stage).count() as u32;
                if waiting == origin.live {
                    let last = origin.merging.iter().rev().find(|(s, _)| *s == stage).map(|(_, id)| *id).expect("waiting piece");
                    if let Some(piece) = self.state.pieces.get(&last).cloned() {
                        let origin = self.state.origins.get_mut(&origin_id).expect("origin");
                        origin.merging.retain(|(_, id)| *id != last);
                        origin.live -= 1;
                        self.state.pieces.remove(&last);
                        self.arrive_at(piece.request, stage, piece.generated);
                    }
                }
            }
            return;
        }
        self.finish_origin(origin_id, Outcome::Completed, now);
    }

    fn finish_origin(&mut self, origin_id: u64, outcome: Outcome, now: u64) {
        let Some(origin) = self.state.origins.remove(&origin_id) else { return };
        self.accounting.request_ended(RequestEnd {
            id: origin_id,
            stream: origin.stream,
            sent_at: origin.sent_at,
            ended_at: now,
            deadline: origin.deadline,
            outcome: outcome.clone(),
            tokens: origin.tokens,
            accuracy: origin.accuracy,
            queue_delay: origin.queue_delay,
        });
        self.ended.push(Ended {
            id: origin_id,
            outcome,
            at: now,
            sent_at: origin.sent_at,
            deadline: origin.deadline,
            arrived_at: origin.arrived_at,
            first_job_at: origin.first_job_at,
        });
        if !self.sequences.is_empty() {
            let completed = matches!(self.ended.last().map(|e| &e.outcome), Some(Outcome::Completed));
            self.sequence_moves_on(origin_id, completed);
        }
    }

    /// A sequence's request ended: queue the next one, fail those that can no longer
    /// run, free state that is no longer needed.
    fn sequence_moves_on(&mut self, origin_id: u64, completed: bool) {
        let after = self.sequences.origin_ended(origin_id, completed);
        if let Some((worker, id)) = after.release {
            self.executor.sequence_released(worker, id);
        }
        let now = self.state.now;
        for (origin, error) in after.failed {
            self.finish_origin(origin, Outcome::Failed { error }, now);
        }
        if let Some((mut request, worker)) = after.next {
            let step = sequences::step_of(&request);
            request.correlation = Some(sequences::correlation(step, worker));
            request.arrived_at = now;
            self.enqueue(request, 0);
        }
    }

    /// Every sequence bound to `worker` is gone with it (`why`: "was lost: …", "was
    /// scaled down"): its requests fail, saying so.
    fn sequences_gone(&mut self, worker: u32, why: &str) {
        if self.sequences.is_empty() {
            return;
        }
        let now = self.state.now;
        for (origin, error) in self.sequences.worker_gone(worker, why) {
            self.end_origin(origin, Outcome::Failed { error }, now, EndReason::Failed);
        }
    }

    /// End an origin early (drop, failure, cancellation, expiry): every live piece goes,
    /// the policy is told about the ones it held (except `except`, which it ended itself).
    fn end_origin(&mut self, origin_id: u64, outcome: Outcome, now: u64, reason: EndReason) {
        self.end_origin_except(origin_id, outcome, now, reason, None)
    }

    /// Free the cache of sequence `id`, whose request ended while it was resident on
    /// iteration-level `worker`: here, and on the worker (told as for an eviction by
    /// recompute, counted apart from the policy's evictions).
    fn free_cache(&mut self, worker: u32, id: u64) {
        if let Some(w) = self.state.workers.get_mut(&worker) {
            w.resident.remove(&id);
        }
        self.executor.evict(worker, id, contract::EvictMode::Recompute);
        self.stats.freed_caches += 1;
    }

    fn end_origin_except(&mut self, origin_id: u64, outcome: Outcome, now: u64, reason: EndReason, except: Option<u64>) {
        if !self.state.origins.contains_key(&origin_id) {
            return;
        }
        for id in self.state.pieces.of_origin(origin_id) {
            let Some(piece) = self.state.pieces.remove(&id) else { continue };
            match piece.state {
                PieceState::Queued | PieceState::Deferred if Some(id) != except => {
                    self.pending.push(Event::RequestEnded((id, reason)));
                }
                PieceState::Paused(worker) => {
                    self.free_cache(worker, id);
                    if Some(id) != except {
                        self.pending.push(Event::RequestEnded((id, reason)));
                    }
                }
                // A running piece finishes on its worker; its result is ignored.
                _ => {}
            }
        }
        self.finish_origin(origin_id, outcome, now);
    }

    fn fail_piece(&mut self, id: u64, error: String) {
        let now = self.state.now;
        if let Some(origin) = self.state.pieces.get(&id).map(|p| p.request.origin) {
            self.end_origin_except(origin, Outcome::Failed { error }, now, EndReason::Failed, Some(id));
        }
    }

    /// Handle everything due at or before now: ticks, timers, deferred requests, expiry.
    pub fn advance(&mut self) {
        let now = self.now();
        while let Some(what) = self.agenda.pop_due(now) {
            match what {
                Wakeup::Tick => {
                    let snapshot = self.state.snapshot(self.options.tick_interval);
                    self.pending.push(Event::Tick(snapshot));
                    self.schedule(now + self.options.tick_interval, Wakeup::Tick);
                }
                Wakeup::Timer(token) => self.pending.push(Event::Timer(token)),
                Wakeup::Deferred(id) => {
                    if let Some(piece) = self.state.pieces.get(&id).filter(|p| p.state == PieceState::Deferred) {
                        let mut request = piece.request.clone();
                        let generated = piece.generated;
                        request.requeues += 1;
                        request.arrived_at = now;
                        self.enqueue(request, generated);
                    }
                }
                Wakeup::Expire(origin) => {
                    let Some(held) = self.state.origins.get(&origin) else { continue };
                    // A latency-sensitive LLM stream is due token by token: it expires
                    // a grace after its next token's due time, so a long output kept
                    // on its timeline runs to the end.
                    let next_due = self.accounting.llm().next_token_due(origin, held.tokens);
                    if let Some(until) = next_due.map(|due| due.saturating_add(self.options.expiry_grace)).filter(|&t| t > now) {
                        self.schedule(until, Wakeup::Expire(origin));
                        continue;
                    }
                    let reason =
                        if next_due.is_some() { "expired: fell behind its token timeline" } else { "expired: held past its deadline" };
                    self.stats.expired += 1;
                    self.end_origin(origin, Outcome::Dropped { reason: reason.into() }, now, EndReason::Expired);
                }
            }
        }
    }

    /// Deliver the gathered events to the policy and apply its answer. Returns whether
    /// there was anything to deliver.
    pub fn flush(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        loop {
            self.now();
            let mut events = std::mem::take(&mut self.pending);
            self.stats.flushes += 1;
            self.stats.events += events.len() as u64;
            let output = self.arm.handle(&events, &self.state);
            if let Some(observe) = &mut self.observer {
                observe(&CallSeen { events: &events, output: &output, cost: self.arm.last_cost() });
            }
            if let Some(shadow) = &mut self.shadow {
                // Before the live answer is applied: both answer against the same cluster.
                shadow.observe(&events, &self.state);
            }
            // Reuse the buffer for the events the answer causes.
            events.clear();
            self.pending = events;
            // After a prepared swap, a policy whose dispatch named only requests that
            // had left must hear at once that the worker is idle after all.
            let settle = !output.idle_again.is_empty();
            self.apply(output);
            if !settle || self.pending.is_empty() {
                return true;
            }
        }
    }

    /// Swap the policy at a quiet point: the events gathered so far go to the old
    /// policy first ([`Engine::flush`]), then the arm hands over to `candidate`
    /// ([`Arm::swap`]: a full replay, or — for a candidate prepared from
    /// [`Engine::handover_snapshot`] — what changed since the snapshot) and the
    /// hand-over's actions are applied. The wall time of the hand-over is measured
    /// and counted in the arm's stats.
    pub fn swap(&mut self, candidate: Candidate) -> SwapOutcome {
        self.flush();
        let started = std::time::Instant::now();
        self.now();
        let (output, report, retired) = self.arm.swap(candidate, &self.state);
        self.apply_handover(output);
        let pause = started.elapsed();
        self.arm.record_swap_pause(pause);
        SwapOutcome { report, pause, retired }
    }

    /// Apply what a hand-over to a new policy instance answered (a swap, a
    /// reconfiguration): the observer sees it as a call without events, and workers it
    /// left idle are announced at once.
    fn apply_handover(&mut self, output: ArmOutput) {
        if let Some(observe) = &mut self.observer {
            observe(&CallSeen { events: &[], output: &output, cost: self.arm.last_cost() });
        }
        let settle = !output.idle_again.is_empty();
        self.apply(output);
        if settle {
            self.flush();
        }
    }

    /// What a swap candidate is prepared from off the engine's thread (see
    /// [`Candidate::pre_replay`]): the arm's configuration as of now and a copy of the
    /// requests it holds. Events not yet delivered to the policy are not in it; they
    /// reach the candidate at the swap.
    pub fn handover_snapshot(&self) -> HandoverSnapshot {
        self.arm.handover_snapshot(&self.state)
    }

    /// Start `candidate` as a shadow of the arm (replacing a shadow already running,
    /// whose final report is returned): it gets every batch of events the arm gets, and
    /// its answers are validated and counted, never applied (see [`Shadow`]). Events
    /// gathered so far go to the arm first, so the shadow starts from what it holds.
    pub fn start_shadow(&mut self, candidate: Candidate) -> Option<ShadowReport> {
        self.flush();
        self.now();
        let held = self.arm.ledger().in_arrival_order();
        let snapshot = self.arm.last_snapshot().cloned();
        // A shadow starts from the server's parameters (and its own), as a swap would.
        let shadow = Shadow::start(candidate, &self.arm.base_config(), held, snapshot, &self.state);
        self.shadow.replace(shadow).map(|old| old.report())
    }

    /// Stop the shadow; its final report.
    pub fn stop_shadow(&mut self) -> Option<ShadowReport> {
        self.shadow.take().map(|s| s.report())
    }

    /// The running shadow's report.
    pub fn shadow_report(&self) -> Option<ShadowReport> {
        self.shadow.as_ref().map(|s| s.report())
    }

    fn apply(&mut self, output: ArmOutput) {
        let now = self.state.now;
        if !output.refused.is_empty() {
            let reason = output.refusal.clone().unwrap_or_else(|| "the policy arm refuses work".into());
            for id in output.refused {
                if let Some(origin) = self.state.pieces.get(&id).map(|p| p.request.origin) {
                    self.end_origin_except(origin, Outcome::Failed { error: reason.clone() }, now, EndReason::Failed, Some(id));
                }
            }
        }
        for action in output.actions {
            self.apply_action(action);
        }
        for worker in output.idle_again {
            if self.state.workers.get(&worker).is_some_and(|w| w.phase == WorkerPhase::Idle) {
                self.pending.push(Event::WorkerIdle(worker));
            }
        }
        // A refused dispatch left its worker idle while the policy believes it busy:
        // tell it again with its next events (not at once, so a policy that keeps
        // sending the same refused dispatch cannot spin the engine).
        for (action, _) in &output.rejected {
            if let Action::Dispatch(d) = action {
                let idle = self.state.workers.get(&d.worker).is_some_and(|w| w.phase == WorkerPhase::Idle);
                if idle && !self.pending.contains(&Event::WorkerIdle(d.worker)) {
                    self.pending.push(Event::WorkerIdle(d.worker));
                }
            }
        }
    }

    fn apply_action(&mut self, action: Action) {
        let now = self.state.now;
        match action {
            Action::Drop(d) => {
                if let Some((origin, stage)) = self.state.pieces.get(&d.request).map(|p| (p.request.origin, p.request.stage as usize)) {
                    if self.stats.drops_by_stage.len() <= stage {
                        self.stats.drops_by_stage.resize(stage + 1, 0);
                    }
                    self.stats.drops_by_stage[stage] += 1;
                    let reason = format!("dropped by the policy: {}", drop_reason(d.reason));
                    self.end_origin_except(origin, Outcome::Dropped { reason }, now, EndReason::Cancelled, Some(d.request));
                }
            }
            Action::Dispatch(d) => self.start_job(d),
            Action::Preempt(worker) => self.preempt(worker),
            Action::Evict(e) => {
                let Some(piece) = self.state.pieces.get_mut(&e.sequence) else { return };
                let PieceState::Paused(worker) = piece.state else { return };
                piece.resume = match e.mode {
                    contract::EvictMode::Recompute => Resume::Recompute,
                    contract::EvictMode::Swap => Resume::SwapIn,
                };
                let mut request = piece.request.clone();
                let generated = piece.generated;
                if let Some(w) = self.state.workers.get_mut(&worker) {
                    w.resident.remove(&e.sequence);
                }
                self.executor.evict(worker, e.sequence, e.mode);
                self.stats.evictions += 1;
                request.requeues += 1;
                request.arrived_at = now;
                self.enqueue(request, generated);
            }
            Action::Scale(s) => self.scale(s.stage, s.replicas, s.variant.unwrap_or(0), &s.placement),
            Action::SetVariant(v) => {
                let workers: Vec<u32> = match v.target {
                    contract::VariantTarget::Worker(w) => vec![w],
                    contract::VariantTarget::Stage(stage) => {
                        self.state.workers.values().filter(|w| w.info.stage == stage).map(|w| w.info.id).collect()
                    }
                };
                for id in workers {
                    if self.state.workers.contains_key(&id) {
                        self.state.switch_variant(id, v.variant);
                        self.executor.set_variant(id, v.variant);
                    }
                }
                self.update_capacity();
            }
            Action::SetRoutes(r) => self.state.stages[r.stage as usize].routes = r.targets,
            Action::SetBatchLimit(b) => {
                self.state.stages[b.stage as usize].batch_limit = b.limit;
                self.update_capacity();
            }
            Action::SetThreads(t) => {
                if let Some(w) = self.state.workers.get_mut(&t.worker) {
                    w.info.threads = t.threads;
                    self.executor.set_threads(t.worker, t.threads);
                }
            }
            Action::Defer(d) => {
                if let Some(piece) = self.state.pieces.get_mut(&d.request) {
                    piece.state = PieceState::Deferred;
                    self.schedule(d.until, Wakeup::Deferred(d.request));
                }
            }
            Action::SetTimer(t) => self.schedule(t.at, Wakeup::Timer(t.token)),
        }
    }

    fn start_job(&mut self, d: contract::Dispatch) {
        let now = self.state.now;
        let Some(worker) = self.state.workers.get(&d.worker) else { return };
        let (stage, mut variant) = (worker.info.stage, worker.info.variant);
        let def = &self.state.pipeline.stages[stage as usize];
        let kind = def.kind;
        let kv_per_token = def.llm.kv_bytes_per_token;
        if let Some(wanted) = d.variant.filter(|&v| v != variant) {
            self.state.switch_variant(d.worker, wanted);
            self.executor.set_variant(d.worker, wanted);
            variant = wanted;
        }
        // Iteration workers: new sequences must fit in the KV cache.
        if kind == StageKind::Iteration {
            let worker = &self.state.workers[&d.worker];
            let resident: u64 = worker.resident.values().sum();
            let extra: u64 = d
                .requests
                .iter()
                .filter(|id| !worker.resident.contains_key(id))
                .filter_map(|id| self.state.pieces.get(id))
                .map(|p| (p.request.input_size as u64 + p.generated as u64 + 1) * kv_per_token)
                .sum();
            if resident + extra > worker.info.memory_bytes {
                self.stats.refused_actions += 1;
                tracing::debug!(worker = d.worker, "dispatch refused: KV cache full");
                // The new sequences stay with the policy: tell it they are back.
                for id in &d.requests {
                    if let Some(piece) = self.state.pieces.get(id).filter(|p| p.state == PieceState::Queued) {
                        self.pending.push(Event::Arrival(piece.request.clone()));
                    }
                }
                self.pending.push(Event::WorkerIdle(d.worker));
                return;
            }
        }
        let mut items = Vec::with_capacity(d.requests.len());
        for id in &d.requests {
            let Some(piece) = self.state.pieces.get_mut(id) else { continue };
            if piece.state == PieceState::Queued {
                let waited = now.saturating_sub(piece.request.arrived_at);
                if let Some(origin) = self.state.origins.get_mut(&piece.request.origin) {
                    origin.queue_delay += waited;
                    origin.first_job_at.get_or_insert(now);
                }
            }
            piece.state = PieceState::Running(d.worker);
            items.push(JobItem {
                id: *id,
                input_size: piece.request.input_size,
                generated: piece.generated,
                expected_tokens: piece.request.expected_tokens,
                resume: piece.resume,
            });
        }
        let stage_entry = &mut self.state.stages[stage as usize];
        stage_entry.window.jobs += 1;
        stage_entry.window.job_items += items.len() as u64;
        let worker = self.state.workers.get_mut(&d.worker).expect("checked");
        let pieces = &self.state.pieces;
        worker.job_origins.clear();
        worker.job_origins.extend(d.requests.iter().filter_map(|id| pieces.get(id).map(|p| p.request.origin)));
        worker.phase = WorkerPhase::Busy { items: d.requests, started: now };
        self.stats.record_batch(items.len());
        let frame_steps = if kind == StageKind::Iteration { self.options.frame_steps } else { 0 };
        self.executor.start(BatchJob { worker: d.worker, stage, variant, items, frame_steps });
    }

    fn preempt(&mut self, worker_id: u32) {
        let now = self.state.now;
        let Some(worker) = self.state.workers.get_mut(&worker_id) else { return };
        let WorkerPhase::Busy { items, started } = std::mem::replace(&mut worker.phase, WorkerPhase::Idle) else {
            return;
        };
        worker.busy_in_window += now.saturating_sub(started);
        self.executor.abort(worker_id);
        self.stats.preemptions += 1;
        self.accounting.batch_finished(BatchRecord {
            at: now,
            worker: worker_id,
            duration: now.saturating_sub(started),
            requests: &worker.job_origins,
        });
        worker.job_origins.clear();
        for id in items {
            let Some(piece) = self.state.pieces.get(&id) else { continue };
            let mut request = piece.request.clone();
            let generated = piece.generated;
            request.requeues += 1;
            request.arrived_at = now;
            if let Some(w) = self.state.workers.get_mut(&worker_id) {
                w.resident.remove(&id);
            }
            if let Some(piece) = self.state.pieces.get_mut(&id) {
                if piece.resume == Resume::Continue {
                    piece.resume = Resume::Recompute;
                }
            }
            self.enqueue(request, generated);
        }
        self.pending.push(Event::WorkerIdle(worker_id));
    }

    fn scale(&mut self, stage: u32, replicas: u32, variant: u32, placement: &[contract::Placement]) {
        let current = self.state.stages[stage as usize].replicas;
        // Workers that could not be removed (idle LLM workers still holding paused
        // sequences) keep counting as replicas.
        let mut kept = 0;
        if replicas > current {
            // A worker is starting: arrivals queue for it again.
            self.unserved[stage as usize] = None;
            for (i, _) in (current..replicas).enumerate() {
                let id = self.ids.worker();
                let def = &self.state.pipeline.stages[stage as usize];
                let mut info = worker_info(id, stage, def);
                info.variant = variant;
                let start = self.state.add_worker(info, WorkerPhase::Starting, placement.get(i), true);
                self.executor.provision(id, stage, variant, start);
            }
        } else {
            let mut surplus = current - replicas;
            // Cancel starting workers first, then idle ones, then drain busy ones.
            for phase_rank in 0..3 {
                let candidates: Vec<u32> = self
                    .state
                    .workers
                    .values()
                    .rev()
                    .filter(|w| w.info.stage == stage)
                    .filter(|w| match (&w.phase, phase_rank) {
                        (WorkerPhase::Starting, 0) => true,
                        (WorkerPhase::Idle, 1) => w.resident.is_empty(),
                        (WorkerPhase::Busy { .. }, 2) => true,
                        _ => false,
                    })
                    .map(|w| w.info.id)
                    .collect();
                for id in candidates {
                    if surplus == 0 {
                        break;
                    }
                    surplus -= 1;
                    let worker = self.state.workers.get_mut(&id).expect("candidate");
                    match std::mem::replace(&mut worker.phase, WorkerPhase::Idle) {
                        WorkerPhase::Busy { items, started } => worker.phase = WorkerPhase::Draining { items, started },
                        WorkerPhase::Starting => {
                            self.state.remove_worker_entry(id);
                            self.executor.retire(id);
                        }
                        _ => self.remove_worker(id),
                    }
                }
            }
            kept = surplus;
        }
        self.state.stages[stage as usize].replicas = replicas + kept;
        let (now, serving) = (self.state.now, self.state.serving() as u32);
        self.accounting.workers_changed(now, serving);
        self.update_capacity();
    }

    /// Take one worker out of service, wherever it stands (it was lost, or its host
    /// is leaving): a starting or idle one at once, a busy one after its batch. Its
    /// stage counts one replica fewer. Returns the stage, or `None` for a worker that
    /// is unknown or already leaving (counted when it began to).
    fn retire_worker(&mut self, id: u32) -> Option<usize> {
        let worker = self.state.workers.get_mut(&id)?;
        let stage = worker.info.stage as usize;
        match std::mem::replace(&mut worker.phase, WorkerPhase::Idle) {
            WorkerPhase::Busy { items, started } => worker.phase = WorkerPhase::Draining { items, started },
            phase @ WorkerPhase::Draining { .. } => {
                worker.phase = phase;
                return None;
            }
            WorkerPhase::Starting => {
                self.state.remove_worker_entry(id);
                self.executor.retire(id);
            }
            _ => self.remove_worker(id),
        }
        let replicas = &mut self.state.stages[stage].replicas;
        *replicas = replicas.saturating_sub(1);
        let (now, serving) = (self.state.now, self.state.serving() as u32);
        self.accounting.workers_changed(now, serving);
        self.update_capacity();
        Some(stage)
    }

    fn remove_worker(&mut self, id: u32) {
        self.sequences_gone(id, "was scaled down");
        if self.state.remove_worker_entry(id).is_some() {
            self.executor.retire(id);
            self.pending.push(Event::WorkerRemoved(id));
            let (now, serving) = (self.state.now, self.state.serving() as u32);
            self.accounting.workers_changed(now, serving);
            self.update_capacity();
        }
    }

    /// The pipeline's capacity in end-to-end requests per second with the serving
    /// workers as they are now: the slowest stage, each worker running full batches (at
    /// the stage's current batch limit) of its variant, divided by the pieces per
    /// request that reach the stage. (The optimal bound uses [`Engine::capacity_bound`].)
    pub fn capacity(&self) -> f64 {
        let pipeline = &self.state.pipeline;
        let pieces = pieces_per_request(pipeline);
        let mut capacity = f64::INFINITY;
        for (i, def) in pipeline.stages.iter().enumerate() {
            let per_stage: f64 = self
                .state
                .workers
                .values()
                .filter(|w| w.info.stage == i as u32 && w.phase != WorkerPhase::Starting)
                .map(|w| {
                    let b = self.state.stages[i].batch_limit.clamp(1, def.max_batch.max(1));
                    let latency = def.variants[w.info.variant as usize].profile.mean(b).max(1) as f64;
                    b as f64 / (latency / 1e9)
                })
                .sum();
            if pieces[i] > 0.0 {
                capacity = capacity.min(per_stage / pieces[i]);
            }
        }
        // No stage reachable by any stream: the capacity is unknown, not zero.
        if capacity.is_finite() {
            capacity
        } else {
            f64::NAN
        }
    }

    /// Give the accounting the optimal bound's capacity (the cluster's bound: goodput can
    /// never exceed it) and the serving workers' capacity (reported per window).
    fn update_capacity(&mut self) {
        let now = self.state.now;
        self.accounting.set_capacity(now, self.capacity_bound);
        let serving = self.capacity();
        self.accounting.set_serving_capacity(now, serving);
    }
}

/// Mean pieces per end-to-end request reaching each stage, with each stage's first
/// variant's fan-out (fan-in stages count one merged piece); streams entering at an
/// offline stage count none.
pub fn pieces_per_request(pipeline: &Pipeline) -> Vec<f64> {
    let mut pieces = vec![0.0f64; pipeline.stages.len()];
    // A stream entering at an offline stage (no replica allowed: a model taken out of
    // service) brings no request.
    for stream in pipeline.streams.iter().filter(|s| pipeline.stages[s.entry as usize].max_replicas > 0) {
        pieces[stream.entry as usize] = 1.0;
    }
    // Stages in topological order (the pipeline is validated acyclic).
    let mut indegree: Vec<usize> = pipeline.stages.iter().map(|s| s.predecessors.len()).collect();
    let mut ready: Vec<usize> = (0..pipeline.stages.len()).filter(|&i| indegree[i] == 0).collect();
    while let Some(i) = ready.pop() {
        let def = &pipeline.stages[i];
        for &s in &def.successors {
            let next = &pipeline.stages[s as usize];
            if next.predecessors.len() > 1 {
                // A fan-in stage merges an origin's pieces into one.
                if pieces[i] > 0.0 {
                    pieces[s as usize] = 1.0;
                }
            } else {
                pieces[s as usize] += pieces[i] * def.variants[0].fan_out_to(s);
            }
            indegree[s as usize] -= 1;
            if indegree[s as usize] == 0 {
                ready.push(s as usize);
            }
        }
    }
    pieces
}

fn worker_info(id: u32, stage: u32, def: &StageDef) -> contract::Worker {
    contract::Worker {
        id,
        stage,
        variant: 0,
        device: def.device,
        host: 0,
        slot: 0,
        threads: def.threads,
        memory_bytes: def.worker_memory_bytes,
    }
}

fn drop_reason(reason: contract::DropReason) -> &'static str {
    match reason {
        contract::DropReason::DeadlineUnreachable => "its deadline is unreachable",
        contract::DropReason::Overload => "shed under overload",
        contract::DropReason::QueueFull => "the queue is full",
        contract::DropReason::Preempted => "preempted and can no longer finish",
        contract::DropReason::Policy => "policy decision",
    }
}
