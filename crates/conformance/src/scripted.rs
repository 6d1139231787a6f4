//! The world `policy check` runs a policy in: the real engine ([`Engine`]) on a
//! [`ManualClock`], over a small cluster ([`pipeline`], or the repository cluster of
//! [`crate::repository`]) whose workers are scripted ([`ScriptedExecutor`]: a job
//! takes its profiled time, a frame of the LLM stage generates tokens, a provisioned
//! worker is ready after its start-up time).
//!
//! [`Harness`] moves the engine through time and keeps what the check reports: every
//! policy call (its events, the arm's answer and its cost, seen through
//! [`Engine::observe_calls`]) and how every request ended ([`Fate`], from
//! [`Engine::take_ended`]). Nothing here applies an action or keeps its own copy of
//! the cluster: the engine does both, with the same rules as in the simulator and the
//! server.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use yardmaster_engine::metrics::Outcome;
use yardmaster_engine::{
    BatchJob, CallSeen, Clock, ClusterState, Ended, Engine, EngineOptions, Executor, ItemResult, JobResult, ManualClock, PieceState,
    Pipeline, ReconfigureOutcome, Submission, WorkerStart,
};
use yardmaster_policy::contract::{Action, Config, Event, EvictMode, Param, StageKind};
use yardmaster_policy::{Arm, ArmOutput, CallCost};

/// Milliseconds in nanoseconds.
pub const MS: u64 = 1_000_000;
/// Decode steps in one frame of the iteration stage.
pub const FRAME_STEPS: u32 = 4;
/// Output tokens of an LLM request that gives no expected length.
pub const DEFAULT_TOKENS: u32 = 16;
/// Period of `tick` events.
pub const TICK_INTERVAL: u64 = 100 * MS;

/// The check's cluster: a two-stage vision chain (`detect`, with a large and a small
/// variant, then `classify`) and an iteration-level LLM stage (`generate`); two
/// detect workers, one of each other stage; streams `vision` (150 ms) and `chat`
/// (3 s); at most 7 workers. Each profile's mean is `base + per_item · batch` (detect
/// large 4 + 3 ms, small 2 + 1 ms; classify 2 + 1 ms; a decode step of the LLM
/// 3 + 0.25 ms), its tail 25 % more; a new worker starts in 50 ms.
pub const CLUSTER: &str = r#"
name = "check"
max_workers = 7

[[stage]]
name = "detect"
successors = ["classify"]
max_batch = 8
replicas = 2
max_replicas = 4
threads = 2
worker_memory_mib = 4096
[[stage.variant]]
name = "detect-large"
accuracy = 0.92
profile_ms = [[1, 7, 8.75], [2, 10, 12.5], [4, 16, 20], [8, 28, 35]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50
[[stage.variant]]
name = "detect-small"
accuracy = 0.85
profile_ms = [[1, 3, 3.75], [2, 4, 5], [4, 6, 7.5], [8, 10, 12.5]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "classify"
max_batch = 4
replicas = 1
max_replicas = 2
device = "cpu"
threads = 2
worker_memory_mib = 4096
[[stage.variant]]
name = "classify"
accuracy = 0.9
profile_ms = [[1, 3, 3.75], [2, 4, 5], [4, 6, 7.5], [8, 10, 12.5]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "generate"
kind = "iteration"
max_batch = 8
replicas = 1
max_replicas = 1
threads = 2
worker_memory_mib = 4096
[[stage.variant]]
name = "llm"
profile_ms = [[1, 3.25, 4.0625], [2, 3.5, 4.375], [4, 4, 5], [8, 5, 6.25]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stream]]
name = "vision"
entry = "detect"
slo_ms = 150

[[stream]]
name = "chat"
entry = "generate"
slo_ms = 3000
"#;

/// The check's cluster ([`CLUSTER`]) as the engine's pipeline.
pub fn pipeline() -> Pipeline {
    yardmaster_formats::pipeline::from_toml(CLUSTER, "the conformance cluster").expect("the check's cluster is valid")
}

/// The engine settings of the check: ticks every [`TICK_INTERVAL`], frames of
/// [`FRAME_STEPS`], the policy's parameters and seed; the rest as the engine's defaults
/// (so a request the policy holds 5 s past its deadline is expired).
pub fn engine_options(params: Vec<Param>, seed: u64) -> EngineOptions {
    EngineOptions { tick_interval: TICK_INTERVAL, frame_steps: FRAME_STEPS, params, seed, ..EngineOptions::default() }
}

/// Something the scripted workers report when its time comes.
#[derive(Debug, Clone, PartialEq)]
pub enum Due {
    /// A job finished (for [`Engine::job_finished`]).
    Finished(JobResult),
    /// A provisioned worker is ready (for [`Engine::worker_ready`]).
    Ready(u32),
}

/// Scripted workers: each job takes its variant's profiled mean latency for its
/// batch (a frame of the iteration stage: one decode step per frame step, each
/// sequence generating a token per step up to its expected length, or
/// [`DEFAULT_TOKENS`]); a provisioned worker is ready its variant's warm start-up time
/// later. Nothing is random, so two runs of the same policy see the same world.
#[derive(Debug)]
pub struct ScriptedExecutor {
    clock: ManualClock,
    pipeline: Pipeline,
    /// The job each worker runs: when it finishes and what it reports.
    jobs: BTreeMap<u32, (u64, JobResult)>,
    /// Workers starting, with when they are ready.
    starting: BTreeMap<u32, u64>,
}

impl ScriptedExecutor {
    /// Workers of `pipeline`, on `clock`.
    pub fn new(clock: ManualClock, pipeline: Pipeline) -> Self {
        Self { clock, pipeline, jobs: BTreeMap::new(), starting: BTreeMap::new() }
    }

    /// Serve `pipeline` from now on (the engine was reconfigured): profiles and
    /// start-up times of new jobs and workers come from it.
    pub fn set_pipeline(&mut self, pipeline: Pipeline) {
        self.pipeline = pipeline;
    }

    /// The pipeline whose profiles the workers follow.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// When the next job finishes or worker is ready, if any.
    pub fn next_time(&self) -> Option<u64> {
        self.jobs.values().map(|(at, _)| *at).chain(self.starting.values().copied()).min()
    }

    /// Whether no job runs and no worker is starting.
    pub fn is_idle(&self) -> bool {
        self.jobs.is_empty() && self.starting.is_empty()
    }

    /// What is due at or before `now`, in time order (finished jobs before ready
    /// workers at the same time, each by worker id).
    pub fn take_due(&mut self, now: u64) -> Vec<Due> {
        let mut due: Vec<(u64, u8, u32)> = self.jobs.iter().filter(|(_, (at, _))| *at <= now).map(|(w, (at, _))| (*at, 0, *w)).collect();
        due.extend(self.starting.iter().filter(|(_, at)| **at <= now).map(|(w, at)| (*at, 1, *w)));
        due.sort_unstable();
        due.into_iter()
            .map(|(_, kind, worker)| match kind {
                0 => Due::Finished(self.jobs.remove(&worker).expect("due job").1),
                _ => {
                    self.starting.remove(&worker);
                    Due::Ready(worker)
                }
            })
            .collect()
    }
}

impl Executor for ScriptedExecutor {
    fn start(&mut self, job: BatchJob) {
        let def = &self.pipeline.stages[job.stage as usize];
        let step = def.variants[job.variant as usize].profile.mean(job.items.len() as u32);
        let (duration, items) = match def.kind {
            StageKind::Batch => {
                let items = job.items.iter().map(|i| ItemResult { id: i.id, error: None, tokens: 0, finished: true, fan_out: Vec::new() });
                (step, items.collect())
            }
            StageKind::Iteration => {
                let items = job.items.iter().map(|i| {
                    let target = if i.expected_tokens == 0 { DEFAULT_TOKENS } else { i.expected_tokens };
                    let tokens = job.frame_steps.min(target.saturating_sub(i.generated)).max(1);
                    ItemResult { id: i.id, error: None, tokens, finished: i.generated + tokens >= target, fan_out: Vec::new() }
                });
                (step * job.frame_steps.max(1) as u64, items.collect())
            }
        };
        let duration = duration.max(1);
        self.jobs.insert(job.worker, (self.clock.now() + duration, JobResult { worker: job.worker, duration, items }));
    }

    fn abort(&mut self, worker: u32) {
        self.jobs.remove(&worker);
    }

    fn provision(&mut self, worker: u32, stage: u32, variant: u32, start: WorkerStart) {
        let def = &self.pipeline.stages[stage as usize].variants[variant as usize];
        let startup = if start.warm { def.warm_start_ns } else { def.cold_start_ns };
        self.starting.insert(worker, self.clock.now() + startup.max(1));
    }

    fn retire(&mut self, worker: u32) {
        self.starting.remove(&worker);
    }

    fn set_threads(&mut self, _worker: u32, _threads: u32) {}

    fn set_variant(&mut self, _worker: u32, _variant: u32) {}

    fn evict(&mut self, _worker: u32, _sequence: u64, _mode: EvictMode) {}
}

/// How a request ended, as the check counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It went through every stage.
    Completed {
        /// After its deadline.
        late: bool,
    },
    /// The policy dropped it.
    Dropped,
    /// The host dropped it: its model was taken out of service (unloaded) while it
    /// was queued ([`Harness::reconfigure`]).
    Unloaded,
    /// The script cancelled it ([`Harness::cancel`]).
    Cancelled,
    /// A closed arm refused it.
    Refused,
    /// It failed otherwise: its stage was left without workers, or was out of
    /// service (its model unloaded) when it arrived.
    Failed,
    /// The policy held it past its deadline and the expiry grace, and the host
    /// expired it: the policy lost it.
    Expired,
}

/// One policy call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Its events' kind when they are all alike, `mixed` otherwise; `init` for the
    /// arm's start and `handover` for a swap.
    pub kind: &'static str,
    /// The events delivered.
    pub events: Vec<Event>,
    /// The arm's answer.
    pub output: ArmOutput,
    /// What it cost the instance that answered.
    pub cost: Option<CallCost>,
}

impl Call {
    fn seen(call: &CallSeen<'_>) -> Self {
        Self { kind: call_kind(call.events), events: call.events.to_vec(), output: call.output.clone(), cost: call.cost }
    }
}

/// The kind of a call: its events' kind when they are all alike, `mixed` otherwise.
pub fn call_kind(events: &[Event]) -> &'static str {
    match events.first() {
        None => "handover",
        Some(first) if events.iter().all(|e| e.kind() == first.kind()) => first.kind(),
        Some(_) => "mixed",
    }
}

/// The engine on the scripted cluster, with everything the check observes.
pub struct Harness {
    engine: Engine<ManualClock, ScriptedExecutor>,
    clock: ManualClock,
    /// Calls the engine's observer saw and [`Harness::sync`] has not collected yet.
    seen: Arc<Mutex<Vec<Call>>>,
    calls: Vec<Call>,
    /// Submitted requests, with their stream.
    submitted: BTreeMap<u64, u32>,
    ended: BTreeMap<u64, (Fate, Ended)>,
    cancelled: BTreeSet<u64>,
    /// Requests a closed arm handed back to fail.
    refused: BTreeSet<u64>,
    /// Requests the policy dropped (accepted drop actions).
    dropped: BTreeSet<u64>,
    /// Where each request the host expired was just before.
    expiring: BTreeMap<u64, String>,
    violations: Vec<String>,
}

impl Harness {
    /// Start the engine on the check's cluster ([`pipeline`]) with the policy's
    /// `params` and `seed`, asking `start_arm` for the arm.
    pub fn start(params: Vec<Param>, seed: u64, start_arm: impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput)) -> Self {
        Self::start_on(pipeline(), params, seed, start_arm)
    }

    /// Start the engine on `pipeline` with the policy's `params` and `seed`, asking
    /// `start_arm` for the arm.
    pub fn start_on(
        pipeline: Pipeline,
        params: Vec<Param>,
        seed: u64,
        start_arm: impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput),
    ) -> Self {
        let clock = ManualClock::default();
        let executor = ScriptedExecutor::new(clock.clone(), pipeline.clone());
        let mut first = ArmOutput::default();
        let mut engine = Engine::new(clock.clone(), executor, pipeline, engine_options(params, seed), |config, view| {
            let (arm, output) = start_arm(config, view);
            first = output.clone();
            (arm, output)
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        engine.observe_calls(Box::new(move |call| sink.lock().expect("observer").push(Call::seen(call))));
        let init = Call { kind: "init", events: Vec::new(), output: first, cost: None };
        let mut harness = Self {
            engine,
            clock,
            seen,
            calls: vec![init],
            submitted: BTreeMap::new(),
            ended: BTreeMap::new(),
            cancelled: BTreeSet::new(),
            refused: BTreeSet::new(),
            dropped: BTreeSet::new(),
            expiring: BTreeMap::new(),
            violations: Vec::new(),
        };
        harness.sync();
        harness
    }

    /// The engine (read-only: the harness's methods are how the script acts on it).
    pub fn engine(&self) -> &Engine<ManualClock, ScriptedExecutor> {
        &self.engine
    }

    /// The policy arm.
    pub fn arm(&self) -> &Arm {
        self.engine.arm()
    }

    /// The clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Every policy call so far, the arm's start first.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// How every request that ended did, by id.
    pub fn fates(&self) -> impl Iterator<Item = (u64, Fate)> + '_ {
        self.ended.iter().map(|(id, (fate, _))| (*id, *fate))
    }

    /// How many requests ended with `fate`.
    pub fn count(&self, fate: Fate) -> usize {
        self.fates().filter(|(_, f)| *f == fate).count()
    }

    /// Requests submitted.
    pub fn submitted(&self) -> usize {
        self.submitted.len()
    }

    /// Problems seen: a request ending twice, or ending without being submitted.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Requests not ended yet, by id, with where they are.
    pub fn unfinished(&self) -> Vec<(u64, String)> {
        let mut open: Vec<u64> = self.engine.state().origins().keys().copied().collect();
        open.sort_unstable();
        open.into_iter().map(|id| (id, self.whereabouts(id))).collect()
    }

    /// Requests the policy lost: those the host expired (held past their deadline
    /// and the grace) and those still in flight, each named with where it was.
    pub fn lost(&self) -> Vec<String> {
        let stream = |id: u64| {
            let stream = self.submitted.get(&id).copied().unwrap_or(0) as usize;
            self.engine.state().pipeline().streams.get(stream).map_or("?", |s| s.name.as_str()).to_string()
        };
        let mut lost: Vec<String> = self
            .ended
            .iter()
            .filter(|(_, (fate, _))| *fate == Fate::Expired)
            .map(|(id, (_, ended))| {
                let place = self.expiring.get(id).map_or("held by the policy", String::as_str);
                format!("request {id} ({}) {place} past its deadline: the host expired it at {} ms", stream(*id), ended.at / MS)
            })
            .collect();
        for (id, place) in self.unfinished() {
            lost.push(format!("request {id} ({}) still {place} at the end ({} ms)", stream(id), self.now() / MS));
        }
        lost
    }

    /// Submit a request now (the policy hears of it at the next [`Harness::flush`]).
    pub fn submit(&mut self, submission: Submission) -> u64 {
        let stream = submission.stream;
        let id = self.engine.submit(submission);
        self.submitted.insert(id, stream);
        self.sync();
        id
    }

    /// The client gives up on request `id` ([`Engine::cancel`]).
    pub fn cancel(&mut self, id: u64) {
        self.cancelled.insert(id);
        self.engine.cancel(id);
        self.sync();
    }

    /// The host sets a stage's replicas ([`Engine::resize`]).
    pub fn resize(&mut self, stage: u32, replicas: u32) {
        self.engine.resize(stage, replicas);
        self.sync();
    }

    /// The host loses a worker ([`Engine::worker_lost`]).
    pub fn worker_lost(&mut self, worker: u32, reason: &str) {
        self.engine.worker_lost(worker, reason);
        self.sync();
    }

    /// The host serves a changed cluster from now on ([`Engine::reconfigure`]): the
    /// workers learn its profiles first (the engine provisions the workers of a stage
    /// added or brought back online as it reconfigures). Requests queued at a stage going
    /// offline, which the host drops, end as [`Fate::Unloaded`]. `Err`: the engine
    /// refused the pipeline, and nothing changed.
    pub fn reconfigure(&mut self, pipeline: Pipeline, why: &str) -> Result<ReconfigureOutcome, String> {
        let served = self.engine.executor().pipeline().clone();
        self.engine.executor_mut().set_pipeline(pipeline.clone());
        let outcome = self.engine.reconfigure(pipeline, why);
        if outcome.is_err() {
            self.engine.executor_mut().set_pipeline(served);
        }
        self.sync();
        outcome
    }

    /// Deliver the gathered events to the policy and apply its answer.
    pub fn flush(&mut self) {
        self.engine.flush();
        self.sync();
    }

    /// When something next happens on its own: a job finishes, a worker is ready, or
    /// the engine has a tick, timer, deferred request or expiry due.
    pub fn next_time(&self) -> Option<u64> {
        [self.engine.executor().next_time(), self.engine.next_wakeup()].into_iter().flatten().min()
    }

    /// Whether nothing is left to do: no request in flight, no job running, no worker
    /// starting, no event waiting for the policy.
    pub fn quiet(&self) -> bool {
        !self.engine.has_pending() && self.engine.in_flight() == 0 && self.engine.executor().is_idle()
    }

    /// Move the clock to `t` and report to the engine what the workers did by then:
    /// finished jobs and ready workers. The policy hears of it at the next
    /// [`Harness::flush`].
    pub fn move_to(&mut self, t: u64) {
        self.clock.set(t);
        let now = self.clock.now();
        for due in self.engine.executor_mut().take_due(now) {
            match due {
                Due::Finished(result) => self.engine.job_finished(result),
                Due::Ready(worker) => self.engine.worker_ready(worker),
            }
        }
        self.sync();
    }

    /// Let the engine handle its own wakeups due now ([`Engine::advance`]: ticks,
    /// timers, deferred requests, expiry). At an instant they come after what the
    /// world reported, as in the simulator.
    pub fn wake(&mut self) {
        self.note_expiring(self.clock.now());
        self.engine.advance();
        self.sync();
    }

    /// One instant: what is due at `t`, the engine's wakeups, then a policy call.
    fn step(&mut self, t: u64) {
        self.move_to(t);
        self.wake();
        self.flush();
    }

    /// Run until `t`: at each instant something happens, report it and call the
    /// policy.
    pub fn advance_to(&mut self, t: u64) {
        while let Some(next) = self.next_time().filter(|&next| next <= t) {
            self.step(next);
        }
        self.step(t);
    }

    /// Run every instant before `t`, then move the clock to `t` ([`Harness::move_to`]):
    /// what the caller submits next happens at `t`, before the engine's own wakeups
    /// due then (a tick), which come with the step after.
    pub fn run_up_to(&mut self, t: u64) {
        while let Some(next) = self.next_time().filter(|&next| next < t) {
            self.step(next);
        }
        self.move_to(t);
    }

    /// Run until [`Harness::quiet`]; false if it takes more than `limit` steps.
    pub fn settle(&mut self, limit: usize) -> bool {
        for _ in 0..limit {
            if self.engine.has_pending() {
                self.flush();
                continue;
            }
            if self.quiet() {
                return true;
            }
            let Some(next) = self.next_time() else { return false };
            self.step(next);
        }
        false
    }

    /// Where a request's live pieces are.
    fn whereabouts(&self, origin: u64) -> String {
        let state = self.engine.state();
        let mut places: Vec<String> = state
            .pieces()
            .values()
            .filter(|p| p.request.origin == origin)
            .map(|p| {
                let stage = state.pipeline().stages.get(p.request.stage as usize).map_or("?", |s| s.name.as_str());
                match p.state {
                    PieceState::Queued => format!("held by the policy at stage {stage}"),
                    PieceState::Running(worker) => format!("running on worker {worker} (stage {stage})"),
                    PieceState::Paused(worker) => format!("paused on worker {worker} (stage {stage})"),
                    PieceState::Deferred => format!("deferred by the policy at stage {stage}"),
                    PieceState::Merging => format!("waiting to merge at stage {stage}"),
                }
            })
            .collect();
        places.sort();
        if places.is_empty() {
            "with no live piece".into()
        } else {
            places.join("; ")
        }
    }

    /// Before the engine expires requests at `now`, note where they are.
    fn note_expiring(&mut self, now: u64) {
        let grace = self.engine.options().expiry_grace;
        let due: Vec<u64> = self
            .engine
            .state()
            .origins()
            .iter()
            .filter(|(id, o)| o.deadline.saturating_add(grace) <= now && !self.expiring.contains_key(id))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let place = self.whereabouts(id);
            self.expiring.insert(id, place);
        }
    }

    /// Collect the calls the observer saw and the requests that ended.
    fn sync(&mut self) {
        let seen = std::mem::take(&mut *self.seen.lock().expect("observer"));
        for call in seen {
            self.refused.extend(call.output.refused.iter().copied());
            let drops = call.output.actions.iter().filter_map(|a| if let Action::Drop(d) = a { Some(d.request) } else { None });
            self.dropped.extend(drops);
            self.calls.push(call);
        }
        let grace = self.engine.options().expiry_grace;
        for ended in self.engine.take_ended() {
            let fate = match &ended.outcome {
                Outcome::Completed => Fate::Completed { late: ended.at > ended.deadline },
                Outcome::Dropped { .. } if self.cancelled.contains(&ended.id) => Fate::Cancelled,
                // The policy cannot drop a request at or after its expiry: the engine
                // expires it before the policy's next call.
                Outcome::Dropped { .. } if ended.at >= ended.deadline.saturating_add(grace) => Fate::Expired,
                Outcome::Dropped { .. } if self.dropped.contains(&ended.id) => Fate::Dropped,
                // Neither the client, nor the expiry, nor the policy: a model unloaded.
                Outcome::Dropped { .. } => Fate::Unloaded,
                // Pieces of the check's clusters keep their request's id (neither fans out).
                Outcome::Failed { .. } if self.refused.contains(&ended.id) => Fate::Refused,
                Outcome::Failed { .. } => Fate::Failed,
            };
            if !self.submitted.contains_key(&ended.id) {
                self.violations.push(format!("request {} ended ({fate:?}) but was never submitted", ended.id));
            }
            if let Some((first, _)) = self.ended.get(&ended.id) {
                self.violations.push(format!("request {} ended twice: {first:?}, then {fate:?} at {} ms", ended.id, ended.at / MS));
                continue;
            }
            self.ended.insert(ended.id, (fate, ended));
        }
    }
}
