//! The engines of a server: one while a single policy schedules everything, two while
//! an A/B run splits the traffic and the workers between a control arm and a
//! candidate arm.
//!
//! Each arm is an [`Engine`] of its own with its own policy, queues, workers and
//! accounting, so every metric is kept per arm and neither policy can see or touch the
//! other's requests or workers. Both engines drive the one executor
//! ([`SharedExecutor`]) and draw request and worker ids from one [`IdSpace`](yardmaster_engine::IdSpace), so an
//! executor's report (a finished job, a worker ready) goes to the engine that owns the
//! worker, and a client's cancellation to the engine that holds the request.
//!
//! Starting a run ([`Arms::start`]) gives the candidate its share of each stage's
//! workers: the candidate's engine provisions them (warm from the model cache), and
//! the run *warms up* first: every request still goes to the control arm, which keeps
//! all its workers, until none of the candidate's workers is starting any more (each
//! has loaded its session and run one warm-up inference before it reports ready, see
//! `yardmaster_dataplane::Worker`). Only then does the split route requests to the
//! candidate, and the control arm gives up as many workers as the candidate got
//! (idle ones at once, busy ones after their job), each keeping at least one; a stage
//! with a single worker gets one more for the candidate while the run lasts. So no
//! request of the candidate waits for a worker to start. The workers a policy may
//! scale to are divided in the same proportion. A run whose candidate is still
//! starting workers after [`WARM_UP_LIMIT`] starts routing anyway (one warning).
//!
//! Ending a run ([`Arms::end`], promote or roll back) sends every new request to the
//! winner at once; the loser keeps scheduling what it holds until nothing of it is in
//! flight, then its workers are retired and the winner scales up by as many. No
//! request moves between arms, so none is lost or handled twice.

use super::split::Split;
use super::stats::{compare, AbReport, ArmTally};

/// The longest a run waits for its candidate's workers before routing to it anyway
/// (nanoseconds of the engine clock).
pub const WARM_UP_LIMIT: u64 = 120_000_000_000;
use yardmaster_engine::{Clock, Ended, Engine, Executor, JobResult, SharedExecutor, Submission, WorkerPhase};
use yardmaster_policy::{Arm, Candidate};

/// An engine of the server, driving the shared executor.
pub type ArmEngine<C, X> = Engine<C, SharedExecutor<X>>;

/// One arm: its label (the `arm` label of its metrics), its engine, and its tally of
/// the current A/B run.
pub struct ArmSlot<C: Clock, X: Executor> {
    /// The arm's name.
    pub label: String,
    /// Its engine.
    pub engine: ArmEngine<C, X>,
    tally: ArmTally,
}

/// An A/B run in progress.
#[derive(Debug, Clone)]
struct Run {
    split: Split,
    started_at: u64,
    /// The winner's slot, once the run is ending; the other arm drains.
    winner: Option<usize>,
    /// Workers provisioned for the candidate beyond the stage's count at the start
    /// (stages that had one worker), per stage.
    extra: Vec<u32>,
    /// The control arm's worker cap at the start.
    max_workers: u32,
    /// While the candidate warms up: what the control arm keeps once routing starts.
    warming: Option<Handoff>,
    /// Nanoseconds from the start until the split began routing to the candidate.
    warm_up: Option<u64>,
    /// The candidate's workers still starting when the first request was routed to it.
    starting_at_first_request: Option<u32>,
}

/// What the control arm gives up once the candidate is warm.
#[derive(Debug, Clone)]
struct Handoff {
    /// Replicas per stage the control keeps.
    replicas: Vec<u32>,
    /// Its worker cap.
    max_workers: u32,
}

/// Where an A/B run stands, as the admin API answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AbStatus {
    /// `none`, `warming` (the candidate's workers are starting; every request goes to
    /// the control), `running` or `ending`.
    pub state: &'static str,
    /// The split, in words (none when no run).
    pub split: Option<String>,
    /// The arms: label, policy, workers per stage, requests in flight.
    pub arms: Vec<ArmStatus>,
    /// The arm that is becoming the whole, while a run ends.
    pub winner: Option<String>,
    /// Milliseconds the candidate took to warm up (from the start until the split
    /// routed to it); none while it warms up or without a run.
    pub warm_up_ms: Option<f64>,
    /// How many of the candidate's workers were still starting when the split routed
    /// its first request to it (none before that request).
    pub starting_at_first_request: Option<u32>,
}

/// One arm in an [`AbStatus`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ArmStatus {
    /// Its label.
    pub arm: String,
    /// The policy instance answering.
    pub policy: String,
    /// Replicas per stage.
    pub workers: Vec<u32>,
    /// Replicas per stage that are ready (loaded and warmed up; the rest are starting).
    pub ready: Vec<u32>,
    /// End-to-end requests in flight.
    pub in_flight: usize,
}

/// The engines of a server (see the module docs).
pub struct Arms<C: Clock, X: Executor> {
    clock: C,
    slots: Vec<ArmSlot<C, X>>,
    run: Option<Run>,
    submitted: u64,
    last_report: Option<AbReport>,
    /// Requests a finished arm had ended but not yet handed out when it was removed.
    carried: Vec<Ended>,
}

impl<C: Clock, X: Executor> Arms<C, X> {
    /// One engine scheduling everything, its metrics labelled `label`.
    pub fn new(clock: C, label: &str, engine: ArmEngine<C, X>) -> Self {
        Self {
            clock,
            slots: vec![ArmSlot { label: label.to_string(), engine, tally: ArmTally::default() }],
            run: None,
            submitted: 0,
            last_report: None,
            carried: Vec::new(),
        }
    }

    /// The control arm's engine (the only one outside an A/B run).
    pub fn main(&self) -> &ArmEngine<C, X> {
        &self.slots[0].engine
    }

    /// The control arm's engine, mutably.
    pub fn main_mut(&mut self) -> &mut ArmEngine<C, X> {
        &mut self.slots[0].engine
    }

    /// Every arm, control first.
    pub fn slots(&self) -> &[ArmSlot<C, X>] {
        &self.slots
    }

    /// The engine of the arm labelled `label`.
    pub fn engine_mut(&mut self, label: &str) -> Option<&mut ArmEngine<C, X>> {
        self.slots.iter_mut().find(|s| s.label == label).map(|s| &mut s.engine)
    }

    /// Whether an A/B run is in progress (running or ending).
    pub fn ab_running(&self) -> bool {
        self.run.is_some()
    }

    fn slot_of_worker(&self, worker: u32) -> usize {
        self.slots.iter().position(|s| s.engine.owns_worker(worker)).unwrap_or(0)
    }

    /// Submit a client's request to the arm the split picks (`key`: the hash of the
    /// client's split key, if it sent one). Returns the arm's slot and the request id.
    pub fn submit(&mut self, submission: Submission, key: Option<u64>) -> (usize, u64) {
        self.submitted += 1;
        let slot = match &self.run {
            Some(Run { winner: Some(winner), .. }) => *winner,
            Some(Run { warming: Some(_), .. }) => 0,
            Some(run) if self.slots.len() > 1 => usize::from(run.split.to_candidate(self.submitted, submission.stream, key)),
            _ => 0,
        };
        if slot == 1 {
            if let Some(run) = self.run.as_mut().filter(|run| run.starting_at_first_request.is_none()) {
                run.starting_at_first_request = Some(starting(&self.slots[1].engine));
            }
        }
        (slot, self.slots[slot].engine.submit(submission))
    }

    /// A stateful sequence of `stream` went idle past its time: every arm forgets it
    /// (it runs in one of them), freeing its state on its replica. Whether one did.
    pub fn release_sequence(&mut self, stream: u32, id: u64) -> bool {
        let mut released = false;
        for slot in &mut self.slots {
            released |= slot.engine.release_sequence(stream, id);
        }
        released
    }

    /// The engine of slot `slot`.
    pub fn engine(&self, slot: usize) -> &ArmEngine<C, X> {
        &self.slots[slot].engine
    }

    /// The engine that owns `worker` (the control arm's when none does).
    pub fn engine_of_worker(&self, worker: u32) -> &ArmEngine<C, X> {
        &self.slots[self.slot_of_worker(worker)].engine
    }

    /// A job finished: to the engine that owns its worker.
    pub fn job_finished(&mut self, result: JobResult) {
        let slot = self.slot_of_worker(result.worker);
        self.slots[slot].engine.job_finished(result);
    }

    /// A worker finished starting (and warming up).
    pub fn worker_ready(&mut self, worker: u32) {
        let slot = self.slot_of_worker(worker);
        self.slots[slot].engine.worker_ready(worker);
        self.end_warm_up();
    }

    /// A worker was lost.
    pub fn worker_lost(&mut self, worker: u32, reason: &str) {
        let slot = self.slot_of_worker(worker);
        self.slots[slot].engine.worker_lost(worker, reason);
        self.end_warm_up();
    }

    /// Start routing to the candidate once none of its workers is starting (or the
    /// warm-up ran past [`WARM_UP_LIMIT`]): the control arm gives up its share of the
    /// workers now.
    fn end_warm_up(&mut self) {
        self.route_to_candidate(false);
    }

    /// End the warm-up: when the candidate's workers are ready, or now with `at_once`.
    fn route_to_candidate(&mut self, at_once: bool) {
        let Some(run) = &mut self.run else { return };
        if run.warming.is_none() || self.slots.len() < 2 {
            return;
        }
        let now = self.clock.now();
        let waited = now.saturating_sub(run.started_at);
        let still = starting(&self.slots[1].engine);
        if still > 0 && waited < WARM_UP_LIMIT && !at_once {
            return;
        }
        if still > 0 && !at_once {
            tracing::warn!(
                starting = still,
                "the A/B candidate's workers are still starting after {} s: routing to it anyway",
                WARM_UP_LIMIT / 1_000_000_000
            );
        }
        let handoff = run.warming.take().expect("checked");
        run.warm_up = Some(waited);
        run.started_at = now;
        let main = &mut self.slots[0].engine;
        for (stage, &replicas) in handoff.replicas.iter().enumerate() {
            main.resize(stage as u32, replicas);
        }
        main.set_max_workers(handoff.max_workers);
        // The comparison counts from here: both arms now serve their share.
        for slot in &mut self.slots {
            slot.tally = ArmTally::default();
        }
        tracing::info!(warm_up_ms = waited as f64 / 1e6, "A/B candidate warm: the split routes to it");
    }

    /// A client gave up on request `id`.
    pub fn cancel(&mut self, id: u64) {
        if let Some(slot) = self.slots.iter_mut().find(|s| s.engine.holds_request(id)) {
            slot.engine.cancel(id);
        }
    }

    /// The earliest wake-up any engine needs.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.slots.iter().filter_map(|s| s.engine.next_wakeup()).min()
    }

    /// Let every engine handle what is due by `now`, then deliver the gathered events
    /// to each policy.
    pub fn advance_and_flush(&mut self, now: u64) {
        self.end_warm_up();
        for slot in &mut self.slots {
            if slot.engine.next_wakeup().is_some_and(|at| at <= now) {
                slot.engine.advance();
            }
            slot.engine.flush();
        }
    }

    /// Requests that ended since the last call, counted in their arm's tally while a
    /// run is in progress. Also finishes an ending run once the losing arm is quiet.
    pub fn take_ended(&mut self) -> Vec<Ended> {
        let mut ended = std::mem::take(&mut self.carried);
        self.collect_ended(&mut ended);
        self.settle();
        ended.append(&mut self.carried);
        ended
    }

    /// Move what every engine ended into `ended`, counting it in its arm's tally while
    /// a run is in progress.
    fn collect_ended(&mut self, ended: &mut Vec<Ended>) {
        let counting = self.run.is_some();
        for slot in &mut self.slots {
            for end in slot.engine.take_ended() {
                if counting {
                    slot.tally.record(&end.outcome, end.sent_at, end.at, end.deadline);
                }
                ended.push(end);
            }
        }
    }

    /// Every request still in flight in any arm.
    pub fn in_flight(&self) -> usize {
        self.slots.iter().map(|s| s.engine.in_flight()).sum()
    }

    /// Start an A/B run: `candidate` (instantiated off this thread, with the control
    /// arm's seed and profiles) becomes the arm `label`, given `split`'s share of the
    /// requests and of each stage's workers. The run starts `warming` (see the module
    /// docs): the split routes to the candidate once its workers are ready. Refused
    /// with the reason when a run is already in progress or the label is taken.
    pub fn start(&mut self, candidate: Candidate, label: &str, split: Split) -> Result<AbStatus, String> {
        self.start_with(candidate, label, split, true)
    }

    /// [`Arms::start`]; with `warm` false the split routes to the candidate at once,
    /// before its workers are ready (its first requests wait for them to start).
    pub fn start_with(&mut self, candidate: Candidate, label: &str, split: Split, warm: bool) -> Result<AbStatus, String> {
        if self.run.is_some() {
            return Err("an A/B run is already in progress: promote or roll it back first".into());
        }
        if label.is_empty() || label == self.slots[0].label {
            return Err(format!("the candidate arm needs a name other than the control's ({:?})", self.slots[0].label));
        }
        let share = split.candidate_share;
        let main = &mut self.slots[0].engine;
        let mut pipeline = main.state().pipeline().clone();
        let current: Vec<u32> = main.state().stages().iter().map(|s| s.replicas).collect();
        let mut extra = vec![0; current.len()];
        let mut control = Vec::with_capacity(current.len());
        for (stage, &n) in current.iter().enumerate() {
            let theirs = match n {
                0 => 0,
                1 => {
                    extra[stage] = 1;
                    1
                }
                n => ((share * n as f64).round() as u32).clamp(1, n - 1),
            };
            pipeline.stages[stage].replicas = theirs;
            control.push(if n == 1 { 1 } else { n - theirs });
        }
        let max_workers = main.state().pipeline().max_workers;
        let candidate_cap = ((share * max_workers as f64).round() as u32).max(pipeline.stages.iter().map(|s| s.replicas).sum());
        let control_cap = max_workers.saturating_sub(candidate_cap).max(control.iter().sum());
        pipeline.max_workers = candidate_cap;
        let mode = main.arm().failure_mode();
        let executor = main.executor().clone();
        let (options, ids) = (main.options().clone(), main.ids());
        let engine = Engine::beside(self.clock.clone(), executor, pipeline, options, ids, label, |config, view| {
            Arm::start_candidate(label, config, candidate, mode, view)
        });
        self.slots.push(ArmSlot { label: label.to_string(), engine, tally: ArmTally::default() });
        self.slots[0].tally = ArmTally::default();
        let started_at = self.clock.now();
        let warming = Some(Handoff { replicas: control, max_workers: control_cap });
        self.run =
            Some(Run { split, started_at, winner: None, extra, max_workers, warming, warm_up: None, starting_at_first_request: None });
        tracing::info!(candidate = label, split = %split.describe(), "A/B run started: the candidate warms up");
        // A candidate with nothing to start (every stage without workers) is warm now.
        self.route_to_candidate(!warm);
        Ok(self.status())
    }

    /// End the run with `winner` (an arm's label) as the whole: promote the candidate,
    /// or roll back to the control. New requests go to the winner from now on; the
    /// other arm drains and hands its workers over.
    pub fn end(&mut self, winner: &str) -> Result<AbStatus, String> {
        let Some(run) = &mut self.run else { return Err("no A/B run is in progress".into()) };
        if let Some(w) = run.winner {
            return Err(format!("the run is already ending in favour of {:?}", self.slots[w].label));
        }
        let Some(index) = self.slots.iter().position(|s| s.label == winner) else {
            let labels: Vec<&str> = self.slots.iter().map(|s| s.label.as_str()).collect();
            return Err(format!("no arm named {winner:?} (arms: {})", labels.join(", ")));
        };
        if run.warming.is_some() {
            if index == 1 {
                return Err("the candidate is still warming up (its workers are starting): promote it once it runs, or roll back".into());
            }
            // A roll-back during the warm-up: the candidate never had a request, and the
            // control never gave up a worker.
            let mut removed = self.slots.remove(1);
            for stage in 0..removed.engine.state().stages().len() {
                removed.engine.resize(stage as u32, 0);
            }
            removed.engine.flush();
            self.carried.extend(removed.engine.take_ended());
            self.run = None;
            self.slots[0].tally = ArmTally::default();
            tracing::info!("A/B run rolled back while its candidate warmed up");
            return Ok(self.status());
        }
        run.winner = Some(index);
        tracing::info!(winner, "A/B run ending: the other arm drains");
        self.settle();
        Ok(self.status())
    }

    /// The label of the control arm and, during a run, the candidate's.
    pub fn labels(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.label.clone()).collect()
    }

    /// Finish an ending run once the loser has nothing in flight and no job running:
    /// retire its workers, scale the winner up by as many, keep the final report.
    fn settle(&mut self) {
        let Some(Run { winner: Some(winner), .. }) = &self.run else { return };
        let winner = *winner;
        let loser = 1 - winner;
        let quiet = {
            let engine = &self.slots[loser].engine;
            engine.in_flight() == 0
                && engine.state().workers().values().all(|w| matches!(w.phase, WorkerPhase::Idle | WorkerPhase::Starting))
        };
        if !quiet {
            return;
        }
        // What the arms ended and nobody has been told yet goes out with the next
        // `take_ended` (and counts in the final report).
        let mut ended = std::mem::take(&mut self.carried);
        self.collect_ended(&mut ended);
        self.carried = ended;
        self.last_report = self.report();
        let run = self.run.take().expect("checked");
        let stages = self.slots[loser].engine.state().stages().len();
        let freed: Vec<u32> = self.slots[loser].engine.state().stages().iter().map(|s| s.replicas).collect();
        for stage in 0..stages {
            self.slots[loser].engine.resize(stage as u32, 0);
        }
        let mut removed = self.slots.remove(loser);
        // The loser's policy learns its workers went; nothing it says matters now.
        removed.engine.flush();
        self.carried.extend(removed.engine.take_ended());
        let survivor = &mut self.slots[0].engine;
        for (stage, freed) in freed.into_iter().enumerate() {
            let now = survivor.state().stages()[stage].replicas;
            survivor.resize(stage as u32, now + freed.saturating_sub(run.extra[stage]));
        }
        let cap = run.max_workers.max(survivor.state().stages().iter().map(|s| s.replicas).sum());
        survivor.set_max_workers(cap);
        self.slots[0].tally = ArmTally::default();
        tracing::info!(arm = %self.slots[0].label, "A/B run ended: one arm schedules everything");
    }

    /// The current run's report (the last run's, once it ended; none before any run).
    pub fn report(&self) -> Option<AbReport> {
        let Some(run) = &self.run else { return self.last_report.clone() };
        let [control, candidate] = &self.slots[..] else { return self.last_report.clone() };
        let seconds = self.clock.now().saturating_sub(run.started_at) as f64 / 1e9;
        let policy = |slot: &ArmSlot<C, X>| slot.engine.arm().instance_label();
        Some(compare(
            (&control.label, &policy(control), &control.tally),
            (&candidate.label, &policy(candidate), &candidate.tally),
            seconds,
            run.split.describe(),
        ))
    }

    /// Where the run stands.
    pub fn status(&self) -> AbStatus {
        let state = match &self.run {
            None => "none",
            Some(Run { winner: None, warming: Some(_), .. }) => "warming",
            Some(Run { winner: None, .. }) => "running",
            Some(_) => "ending",
        };
        AbStatus {
            state,
            split: self.run.as_ref().map(|r| r.split.describe()),
            arms: self
                .slots
                .iter()
                .map(|s| ArmStatus {
                    arm: s.label.clone(),
                    policy: s.engine.arm().instance_label(),
                    workers: s.engine.state().stages().iter().map(|st| st.replicas).collect(),
                    ready: ready_per_stage(&s.engine),
                    in_flight: s.engine.in_flight(),
                })
                .collect(),
            winner: self.run.as_ref().and_then(|r| r.winner).map(|w| self.slots[w].label.clone()),
            warm_up_ms: self.run.as_ref().and_then(|r| r.warm_up).map(|ns| ns as f64 / 1e6),
            starting_at_first_request: self.run.as_ref().and_then(|r| r.starting_at_first_request),
        }
    }
}

/// An engine's workers still starting.
fn starting<C: Clock, X: Executor>(engine: &ArmEngine<C, X>) -> u32 {
    engine.state().workers().values().filter(|w| w.phase == WorkerPhase::Starting).count() as u32
}

/// An engine's ready workers (not starting) per stage.
fn ready_per_stage<C: Clock, X: Executor>(engine: &ArmEngine<C, X>) -> Vec<u32> {
    let mut ready = vec![0; engine.state().stages().len()];
    for worker in engine.state().workers().values().filter(|w| w.phase != WorkerPhase::Starting) {
        if let Some(n) = ready.get_mut(worker.info.stage as usize) {
            *n += 1;
        }
    }
    ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::metrics::Outcome;
    use yardmaster_engine::{EngineOptions, ItemResult, ManualClock, RecordingExecutor};
    use yardmaster_policy::{Limits, Mode, PolicyLoader, Sandbox};

    fn candidate(policy: &str) -> Candidate {
        let sandbox = Sandbox::new(Mode::Simulate, Limits::default()).unwrap();
        let bytes = yardmaster_policy_artifacts::shipped(policy).unwrap().bytes;
        let module = PolicyLoader::new(sandbox.clone(), None).load(policy, bytes).unwrap();
        Candidate::wasm(&sandbox, module, 1, None).unwrap()
    }

    fn arms() -> (Arms<ManualClock, RecordingExecutor>, SharedExecutor<RecordingExecutor>) {
        let pipeline = yardmaster_formats::presets::pipeline("vision-chain").unwrap();
        let clock = ManualClock::default();
        let executor = SharedExecutor::new(RecordingExecutor::default());
        let first = candidate("fifo");
        let engine = Engine::new(clock.clone(), executor.clone(), pipeline, EngineOptions::default(), |config, view| {
            Arm::start_candidate("fifo", config, first, yardmaster_policy::FailureMode::FailOpen, view)
        });
        (Arms::new(clock, "fifo", engine), executor)
    }

    /// Finish every job started so far.
    fn finish(arms: &mut Arms<ManualClock, RecordingExecutor>, executor: &SharedExecutor<RecordingExecutor>) {
        let jobs = executor.borrow_mut().take_started();
        for job in jobs {
            let items =
                job.items.iter().map(|i| ItemResult { id: i.id, error: None, tokens: 0, finished: false, fan_out: Vec::new() }).collect();
            arms.job_finished(JobResult { worker: job.worker, duration: 1, items });
        }
    }

    #[test]
    fn no_request_reaches_the_candidate_before_its_workers_are_ready() {
        let (mut arms, executor) = arms();
        let split = Split::new(0.5, super::super::SplitBy::Request).unwrap();
        // vision-chain: 4, 2 and 3 workers.
        let status = arms.start(candidate("edf"), "edf", split).unwrap();
        assert_eq!(status.state, "warming");
        assert_eq!(status.arms[0].workers, [4, 2, 3], "the control keeps every worker while the candidate warms up");
        assert_eq!((status.arms[1].workers.clone(), status.arms[1].ready.clone()), (vec![2, 1, 2], vec![0, 0, 0]));
        let provisioned = executor.borrow_mut().take_provisioned();
        assert_eq!(provisioned.len(), 5);
        for _ in 0..40 {
            assert_eq!(arms.submit(Submission::default(), None).0, 0, "every request goes to the control while the candidate warms up");
        }
        // All but one ready: still warming.
        for &worker in &provisioned[..4] {
            arms.worker_ready(worker);
        }
        arms.advance_and_flush(0);
        assert_eq!(arms.status().state, "warming");
        assert_eq!(arms.submit(Submission::default(), None).0, 0);
        arms.worker_ready(provisioned[4]);
        let status = arms.status();
        assert_eq!(status.state, "running");
        assert_eq!(status.arms[1].ready, [2, 1, 2]);
        assert_eq!(status.arms[0].workers, [2, 1, 1], "the control gives up its share once the candidate is warm");
        assert!(status.warm_up_ms.is_some());
        let to_candidate = (0..200).filter(|_| arms.submit(Submission::default(), None).0 == 1).count();
        assert!((60..140).contains(&to_candidate), "the split routes to the candidate now: {to_candidate} of 200");
        assert_eq!(arms.status().starting_at_first_request, Some(0), "its first request found every worker ready");
    }

    #[test]
    fn a_roll_back_during_the_warm_up_removes_the_candidate_and_leaves_the_control_whole() {
        let (mut arms, executor) = arms();
        let split = Split::new(0.5, super::super::SplitBy::Request).unwrap();
        arms.start(candidate("edf"), "edf", split).unwrap();
        assert!(arms.end("edf").unwrap_err().contains("still warming up"), "a cold candidate cannot be promoted");
        let status = arms.end("fifo").unwrap();
        assert_eq!(status.state, "none");
        assert_eq!(status.arms.len(), 1);
        assert_eq!(status.arms[0].workers, [4, 2, 3]);
        // Its workers, provisioned, were retired: a late ready changes nothing.
        for worker in executor.borrow_mut().take_provisioned() {
            arms.worker_ready(worker);
        }
        assert_eq!(arms.status().arms[0].workers, [4, 2, 3]);
        assert!(arms.start(candidate("edf"), "edf", split).is_ok(), "a new run can start");
    }

    #[test]
    fn what_the_loser_ended_just_before_it_is_removed_still_goes_out() {
        let (mut arms, executor) = arms();
        let split = Split::new(0.5, super::super::SplitBy::Request).unwrap();
        arms.start(candidate("edf"), "edf", split).unwrap();
        let provisioned = executor.borrow_mut().take_provisioned();
        for worker in provisioned {
            arms.worker_ready(worker);
        }
        let ids: Vec<u64> = (0..20).map(|_| arms.submit(Submission::default(), None).1).collect();
        // Run every request through the three stages without ever taking the ends.
        for _ in 0..3 {
            arms.advance_and_flush(0);
            finish(&mut arms, &executor);
        }
        assert_eq!(arms.in_flight(), 0, "every request completed");
        // Ending the run removes the quiet loser at once; its ends must survive that.
        let status = arms.end("edf").unwrap();
        assert_eq!(status.state, "none");
        let mut ended: Vec<u64> = arms.take_ended().iter().filter(|e| e.outcome == Outcome::Completed).map(|e| e.id).collect();
        ended.sort();
        assert_eq!(ended, ids, "each request ends once, the removed arm's too");
        assert!(arms.take_ended().is_empty());
        let report = arms.report().expect("the run's report stays");
        assert_eq!(report.control.requests + report.candidate.requests, 20);
    }
}
