//! Engine tests: lifecycle invariants under random policies, DAG split and merge,
//! preemption, scaling delays, metrics on hand-computed cases.

use std::collections::{BTreeMap, HashSet};

use yardmaster_sdk::{self as sdk, Ctx, Policy};

use yardmaster_engine::*;
use yardmaster_formats::pipeline::from_toml;
use yardmaster_policy::contract;
use yardmaster_policy::{Arm, FailureMode, NativePolicy};

/// An executor that records what it is asked and lets the test finish jobs.
#[derive(Default)]
pub(crate) struct TestExecutor {
    pub(crate) started: Vec<BatchJob>,
    aborted: Vec<u32>,
    pub(crate) provisioned: Vec<u32>,
    /// Where each provisioned worker starts.
    starts: Vec<(u32, WorkerStart)>,
    retired: Vec<u32>,
    evicted: Vec<(u32, u64)>,
}

impl Executor for TestExecutor {
    fn start(&mut self, job: BatchJob) {
        self.started.push(job);
    }
    fn abort(&mut self, worker: u32) {
        self.aborted.push(worker);
        self.started.retain(|j| j.worker != worker);
    }
    fn provision(&mut self, worker: u32, _stage: u32, _variant: u32, start: WorkerStart) {
        self.provisioned.push(worker);
        self.starts.push((worker, start));
    }
    fn retire(&mut self, worker: u32) {
        self.retired.push(worker);
    }
    fn set_threads(&mut self, _worker: u32, _threads: u32) {}
    fn set_variant(&mut self, _worker: u32, _variant: u32) {}
    fn evict(&mut self, worker: u32, sequence: u64, _mode: contract::EvictMode) {
        self.evicted.push((worker, sequence));
    }
}

pub(crate) const MS: u64 = 1_000_000;

/// A seeded random source for the randomized tests (splitmix64).
struct TestRng(u64);

impl TestRng {
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        let (state, value) = sdk::splitmix64(self.0);
        self.0 = state;
        (value >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n.
    fn below(&mut self, n: u64) -> u64 {
        ((self.uniform() * n as f64) as u64).min(n - 1)
    }
}

pub(crate) fn chain(stages: usize, replicas: u32) -> Pipeline {
    let mut text = String::from("name = \"t\"\nslo_ms = 100\n");
    for i in 0..stages {
        text += &format!("[[stage]]\nname = \"s{i}\"\nmax_batch = 4\nreplicas = {replicas}\nmax_replicas = 4\n");
        if i + 1 < stages {
            text += &format!("successors = [\"s{}\"]\n", i + 1);
        }
        text += "[[stage.variant]]\nname = \"v\"\nalpha_ms = 1.0\nbeta_ms = 1.0\n";
    }
    from_toml(&text, "test").unwrap()
}

pub(crate) fn engine_with<P: Policy + Send>(pipeline: Pipeline) -> (Engine<ManualClock, TestExecutor>, ManualClock) {
    let clock = ManualClock::default();
    let engine = Engine::new(clock.clone(), TestExecutor::default(), pipeline, EngineOptions::default(), |config, view| {
        Arm::start("test", config, Box::new(NativePolicy::<P>::new("test", 3, 100_000)), FailureMode::FailOpen, view)
    });
    (engine, clock)
}

/// A successful result of `job`, every item yielding `fan_out`.
pub(crate) fn success(job: &BatchJob, fan_out: &[(u32, u32)]) -> JobResult {
    JobResult {
        worker: job.worker,
        duration: MS,
        items: job
            .items
            .iter()
            .map(|i| ItemResult { id: i.id, error: None, tokens: 0, finished: true, fan_out: fan_out.to_vec() })
            .collect(),
    }
}

/// Finish every started job successfully (fan-out as given per stage).
fn finish_all(engine: &mut Engine<ManualClock, TestExecutor>, fan_out: &BTreeMap<u32, Vec<(u32, u32)>>) {
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    for job in jobs {
        let fan = fan_out.get(&job.stage).cloned().unwrap_or_default();
        engine.job_finished(success(&job, &fan));
    }
}

#[test]
fn a_chain_request_passes_every_stage_and_completes_once() {
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(3, 1));
    let id = engine.submit(Submission { stream: 0, ..Default::default() });
    for stage in 0..3 {
        engine.flush();
        let job = engine.executor().started.last().cloned().expect("a job");
        assert_eq!(job.stage, stage);
        assert_eq!(job.items[0].id, id, "a chain keeps the request's id");
        clock.set((stage as u64 + 1) * 10 * MS);
        finish_all(&mut engine, &BTreeMap::new());
    }
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].id, id);
    assert_eq!(ended[0].outcome, Outcome::Completed);
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_dag_splits_into_pieces_and_merges_them_at_the_fan_in_stage() {
    let text = r#"
        name = "dag"
        slo_ms = 1000
        [[stage]]
        name = "detect"
        successors = ["cars", "faces"]
        max_batch = 8
        [[stage.variant]]
        name = "d"
        alpha_ms = 1.0
        beta_ms = 1.0
        [[stage]]
        name = "cars"
        successors = ["sink"]
        max_batch = 8
        [[stage.variant]]
        name = "c"
        alpha_ms = 1.0
        beta_ms = 1.0
        [[stage]]
        name = "faces"
        successors = ["sink"]
        max_batch = 8
        [[stage.variant]]
        name = "f"
        alpha_ms = 1.0
        beta_ms = 1.0
        [[stage]]
        name = "sink"
        max_batch = 8
        [[stage.variant]]
        name = "s"
        alpha_ms = 0.0
        beta_ms = 0.1
    "#;
    let (mut engine, _) = engine_with::<policy_fifo::Fifo>(from_toml(text, "dag").unwrap());
    let id = engine.submit(Submission::default());
    engine.flush();
    // The detector finds 3 cars and 2 faces.
    let fan = BTreeMap::from([(0, vec![(1, 3), (2, 2)])]);
    finish_all(&mut engine, &fan);
    engine.flush();
    let jobs = &engine.executor().started;
    let pieces: Vec<(u32, u64)> = jobs.iter().flat_map(|j| j.items.iter().map(move |i| (j.stage, i.id))).collect();
    assert_eq!(pieces.iter().filter(|(s, _)| *s == 1).count(), 3);
    assert_eq!(pieces.iter().filter(|(s, _)| *s == 2).count(), 2);
    assert!(pieces.iter().all(|(_, p)| *p != id), "pieces get new ids");
    assert_eq!(engine.state().origins()[&id].live, 5);
    // Cars finish first: they wait at the sink for the faces.
    let cars: Vec<BatchJob> = engine.executor().started.iter().filter(|j| j.stage == 1).cloned().collect();
    engine.executor_mut().started.retain(|j| j.stage != 1);
    for job in cars {
        engine.job_finished(success(&job, &[]));
    }
    engine.flush();
    assert!(engine.executor().started.iter().all(|j| j.stage != 3), "the sink waits for every piece");
    finish_all(&mut engine, &BTreeMap::new());
    engine.flush();
    let sink: Vec<&BatchJob> = engine.executor().started.iter().filter(|j| j.stage == 3).collect();
    assert_eq!(sink.len(), 1);
    assert_eq!(sink[0].items.len(), 1, "merged into one piece");
    finish_all(&mut engine, &BTreeMap::new());
    let ended = engine.take_ended();
    let slo = engine.state().pipeline().streams[0].slo_ns;
    assert_eq!(
        ended,
        vec![Ended { id, outcome: Outcome::Completed, at: 0, sent_at: 0, deadline: slo, arrived_at: 0, first_job_at: Some(0) }]
    );
}

#[test]
fn a_detector_that_finds_nothing_completes_the_request() {
    let (mut engine, _) = engine_with::<policy_fifo::Fifo>(
        from_toml(yardmaster_formats::presets::PIPELINES.iter().find(|(name, _)| *name == "traffic-dag").unwrap().1, "traffic-dag")
            .unwrap(),
    );
    let id = engine.submit(Submission::default());
    engine.flush();
    finish_all(&mut engine, &BTreeMap::from([(0, vec![(1, 0), (2, 0)])]));
    let slo = engine.state().pipeline().streams[0].slo_ns;
    assert_eq!(
        engine.take_ended(),
        vec![Ended { id, outcome: Outcome::Completed, at: 0, sent_at: 0, deadline: slo, arrived_at: 0, first_job_at: Some(0) }]
    );
}

/// Preempts whatever runs as soon as anything arrives (once per worker).
#[derive(Default)]
struct PreemptOnArrival {
    queue: Vec<u64>,
    preempted: HashSet<u32>,
}

impl Policy for PreemptOnArrival {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, request: sdk::Request) {
        self.queue.push(request.id);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let busy: Vec<u32> = ctx.workers().filter(|w| !w.idle).map(|w| w.info.id).collect();
        if !self.queue.is_empty() {
            for w in busy {
                if self.preempted.insert(w) {
                    ctx.preempt(w);
                }
            }
        }
        let idle: Vec<u32> = ctx.idle_workers(0).collect();
        for w in idle {
            if !self.queue.is_empty() {
                let batch: Vec<u64> = self.queue.drain(..self.queue.len().min(4)).collect();
                ctx.dispatch(w, batch);
            }
        }
    }
}

#[test]
fn preemption_returns_the_running_requests_to_the_policy() {
    let (mut engine, _) = engine_with::<PreemptOnArrival>(chain(1, 1));
    let first = engine.submit(Submission::default());
    engine.flush();
    assert_eq!(engine.executor().started.len(), 1);
    let second = engine.submit(Submission::default());
    engine.flush();
    assert_eq!(engine.executor().aborted, vec![0]);
    assert_eq!(engine.stats().preemptions, 1);
    // Both come back (as arrivals, with the idle worker) at the next decision point
    // and are dispatched together on the freed worker.
    engine.flush();
    let job = engine.executor().started.last().unwrap();
    let ids: HashSet<u64> = job.items.iter().map(|i| i.id).collect();
    assert_eq!(ids, HashSet::from([first, second]));
    finish_all(&mut engine, &BTreeMap::new());
    assert_eq!(engine.take_ended().len(), 2);
}

/// Scales stage 0 to 3 replicas at init, then to 1 at the first tick.
struct Scaler;

impl Policy for Scaler {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        ctx.scale(0, 3, None);
        Ok(Scaler)
    }
    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: sdk::Snapshot) {
        ctx.scale(0, 1, None);
    }
}

#[test]
fn scaling_starts_workers_only_when_ready_and_drains_on_the_way_down() {
    let (mut engine, clock) = engine_with::<Scaler>(chain(1, 1));
    assert_eq!(engine.executor().provisioned, vec![1, 2]);
    assert_eq!(engine.state().serving(), 1, "new workers are starting, not serving");
    use yardmaster_policy::validate::ClusterView;
    assert!(engine.state().worker(1).is_none(), "a starting worker cannot be dispatched to");
    clock.set(200 * MS);
    engine.worker_ready(1);
    engine.flush();
    assert_eq!(engine.state().serving(), 2);
    // The tick scales down to 1: the starting worker is cancelled, an idle one removed.
    clock.set(1_000 * MS);
    engine.advance();
    engine.flush();
    assert_eq!(engine.executor().retired.len(), 2);
    assert_eq!(engine.state().workers().len(), 1);
    assert_eq!(engine.state().stages()[0].replicas, 1);
}

/// Scales stage 0 from 1 to 5 replicas at init, placing three of the four new ones —
/// two on host 1 (one on its slot 2), one on host 0 — and leaving the fourth to the
/// host; on its first tick it names a host that does not exist.
struct Placer;

impl Policy for Placer {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let at = |host, slot| sdk::Placement { host, slot };
        ctx.scale_placed(0, 5, None, vec![at(1, Some(2)), at(1, None), at(0, None)]);
        Ok(Placer)
    }
    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: sdk::Snapshot) {
        ctx.scale_placed(0, 6, None, vec![sdk::Placement { host: 7, slot: None }]);
    }
}

#[test]
fn new_replicas_start_where_the_policy_places_them_warm_where_their_parameters_are_cached() {
    let mut pipeline = chain(1, 1);
    pipeline.stages[0].max_replicas = 6;
    pipeline.max_workers = 6;
    pipeline.hosts = vec![hosts::HostDef::new("h0", 2, 1 << 30), hosts::HostDef::new("h1", 4, 1 << 30)];
    pipeline.validate("test").unwrap();
    let config = Engine::<ManualClock, TestExecutor>::policy_config(&pipeline, "test", &EngineOptions::default());
    assert_eq!(config.hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect::<Vec<_>>(), [("h0", 2), ("h1", 4)]);
    // The initial worker went to the host with the most free slots.
    assert_eq!((config.workers[0].host, config.workers[0].slot), (1, 0));
    let (mut engine, clock) = engine_with::<Placer>(pipeline);
    let starts: Vec<(u32, u32, bool)> = engine.executor().starts.iter().map(|(_, s)| (s.host, s.slot, s.warm)).collect();
    // Host 1 caches the stage (its initial worker): warm there; host 0 is cold for the
    // third replica, and for the fourth, which the host placed where the parameters
    // are going (h0 and h1 both hold an entry and have one free slot: h0) — cold too,
    // because the third replica is still loading them there.
    assert_eq!(starts, [(1, 2, true), (1, 1, true), (0, 0, false), (0, 1, false)]);
    let hosts = engine.state().hosts();
    assert_eq!((hosts[0].free_slots, hosts[1].free_slots), (0, 1));
    assert_eq!(hosts[1].replicas, [3]);
    clock.set(100 * MS);
    engine.worker_ready(1);
    let worker = engine.state().workers()[&1].info;
    assert_eq!((worker.host, worker.slot), (1, 2), "the worker carries its seat");
    // A placement on a host that does not exist is refused with the reason.
    clock.set(1_000 * MS);
    engine.advance();
    engine.flush();
    assert_eq!(engine.arm().stats().rejected.get("bad-placement"), Some(&1));
    assert_eq!(engine.state().stages()[0].replicas, 5);
}

/// Emits random actions, valid or not, from the host's seeded random source.
#[derive(Default)]
struct Chaos {
    held: Vec<u64>,
}

impl Policy for Chaos {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, request: sdk::Request) {
        self.held.push(request.id);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let draws = (ctx.host().random() % 6) as usize;
        for _ in 0..draws {
            let r = ctx.host().random();
            let pick =
                |held: &Vec<u64>| if held.is_empty() || r.is_multiple_of(7) { r % 1000 } else { held[(r as usize / 7) % held.len()] };
            let worker = (r >> 20) as u32 % 5;
            match r % 9 {
                0 | 1 => {
                    let n = 1 + (r >> 8) as usize % 5;
                    let batch: Vec<u64> = (0..n).map(|k| pick(&self.held).wrapping_add(k as u64 * (r >> 40) % 2)).collect();
                    ctx.dispatch(worker, batch);
                }
                2 => ctx.drop_request(pick(&self.held), sdk::DropReason::Policy),
                3 => ctx.preempt(worker),
                4 => ctx.defer(pick(&self.held), ctx.now() + (r >> 16) % (50 * MS)),
                5 => ctx.scale((r >> 12) as u32 % 3, (r >> 24) as u32 % 5, None),
                6 => ctx.set_timer(ctx.now() + (r >> 10) % (20 * MS), r),
                7 => ctx.set_batch_limit((r >> 12) as u32 % 3, (r >> 24) as u32 % 6),
                _ => ctx.evict(pick(&self.held), sdk::EvictMode::Recompute),
            }
        }
        // Forget what the host may have taken; ids unknown to the host are harmless.
        if self.held.len() > 64 {
            self.held.drain(..32);
        }
    }
}

#[test]
fn random_policies_never_lose_or_duplicate_a_request() {
    for seed in 0..25u64 {
        let (mut engine, clock) = engine_with::<Chaos>(chain(3, 1));
        let mut rng = TestRng(seed);
        let mut submitted = HashSet::new();
        let mut ended = HashSet::new();
        let mut now = 0;
        for _ in 0..400 {
            now += (rng.uniform() * 3.0 * MS as f64) as u64;
            clock.set(now);
            match rng.below(4) {
                0 | 1 => {
                    submitted.insert(engine.submit(Submission::default()));
                }
                2 => {
                    // Finish some started jobs; fail one request in five.
                    let jobs = std::mem::take(&mut engine.executor_mut().started);
                    for job in jobs {
                        let fail = rng.below(5) == 0;
                        engine.job_finished(JobResult {
                            worker: job.worker,
                            duration: MS,
                            items: job
                                .items
                                .iter()
                                .enumerate()
                                .map(|(k, i)| ItemResult {
                                    id: i.id,
                                    error: (fail && k == 0).then(|| "boom".to_string()),
                                    tokens: 0,
                                    finished: true,
                                    fan_out: vec![],
                                })
                                .collect(),
                        });
                    }
                }
                _ => {
                    for w in engine.executor().provisioned.clone() {
                        engine.worker_ready(w);
                    }
                }
            }
            engine.advance();
            engine.flush();
            for e in engine.take_ended() {
                assert!(ended.insert(e.id), "seed {seed}: request {} ended twice", e.id);
                assert!(submitted.contains(&e.id), "seed {seed}: unknown request {} ended", e.id);
            }
        }
        // Drain: finish every job and let expiry end whatever the policy still holds.
        for step in 0..200 {
            now += 100 * MS;
            clock.set(now);
            finish_all(&mut engine, &BTreeMap::new());
            engine.advance();
            engine.flush();
            for e in engine.take_ended() {
                assert!(ended.insert(e.id), "seed {seed}: request {} ended twice", e.id);
            }
            if ended.len() == submitted.len() && step > 2 {
                break;
            }
        }
        assert_eq!(ended, submitted, "seed {seed}: every request ends exactly once");
        assert_eq!(engine.in_flight(), 0);
        let summary = engine.accounting().summary(now);
        assert_eq!(summary.overall.ended as usize, submitted.len(), "seed {seed}: accounting saw every end");
        assert!(engine.arm().stats().rejected_total() > 0, "the chaos policy also emitted invalid actions");
    }
}

/// Run `request` alone on an idle worker of stage 0, if there is one.
fn dispatch_alone_if_idle(ctx: &mut Ctx, request: u64) {
    let idle = ctx.idle_workers(0).next();
    if let Some(worker) = idle {
        ctx.dispatch(worker, vec![request]);
    }
}

/// Dispatches each arrival alone to an idle worker, never resumes paused sequences,
/// and asks to scale stage 0 down to one replica at every tick.
#[derive(Default)]
struct PauseAndShrink;

impl Policy for PauseAndShrink {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self)
    }
    fn on_arrival(&mut self, ctx: &mut Ctx, request: sdk::Request) {
        dispatch_alone_if_idle(ctx, request.id);
    }
    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: sdk::Snapshot) {
        ctx.scale(0, 1, None);
    }
}

#[test]
fn workers_holding_paused_sequences_are_not_removed_and_still_count() {
    let (mut engine, clock) = engine_with::<PauseAndShrink>(llm_pipeline(2));
    for _ in 0..2 {
        engine.submit(Submission { input_size: 100, expected_tokens: 100, ..Default::default() });
    }
    engine.flush();
    assert_eq!(engine.executor().started.len(), 2, "one sequence per worker");
    // One frame each: both sequences stay resident, paused (the policy never resumes them).
    finish_frames(&mut engine, 8);
    assert!(engine.state().workers().values().all(|w| w.resident.len() == 1));
    // The tick asks for one replica: neither worker can go, so both still count.
    clock.set(1_000 * MS);
    engine.advance();
    engine.flush();
    assert_eq!(engine.state().workers().len(), 2);
    assert_eq!(engine.state().stages()[0].replicas, 2);
    assert!(engine.executor().retired.is_empty());
}

/// Holds every request it is given and dispatches none.
struct Hold;

impl Policy for Hold {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Hold)
    }
}

#[test]
fn a_swap_replays_the_held_requests_into_the_new_policy_which_serves_each_once() {
    let (mut engine, clock) = engine_with::<Hold>(chain(1, 1));
    let ids: Vec<u64> = (0..20).map(|_| engine.submit(Submission::default())).collect();
    engine.flush();
    assert!(engine.executor().started.is_empty(), "the holder dispatches nothing");
    assert_eq!(engine.arm().ledger().len(), 20);

    // A request arriving just before the swap reaches the old policy first (it is held
    // too), so it is replayed like the others.
    let late = engine.submit(Submission::default());
    let fifo = NativePolicy::<policy_fifo::Fifo>::new("fifo", 3, 100_000);
    let outcome = engine.swap(yardmaster_policy::Candidate::native(Box::new(fifo)));
    assert_eq!(outcome.report.replayed, 21);
    assert_eq!(outcome.report.state, yardmaster_policy::ArmState::Primary);
    assert!(outcome.retired.is_some_and(|old| old.label().contains("test")), "the holder is handed back");
    assert_eq!(engine.arm().stats().swaps.count, 1);
    assert_eq!(engine.arm().stats().swaps.last, outcome.pause);
    assert!(!engine.executor().started.is_empty(), "fifo dispatches what was replayed");

    for step in 1..=20 {
        clock.set(step * 10 * MS);
        finish_all(&mut engine, &BTreeMap::new());
        engine.flush();
    }
    let mut ended: Vec<u64> = engine.take_ended().iter().map(|e| e.id).collect();
    ended.sort();
    let mut expected = ids;
    expected.push(late);
    assert_eq!(ended, expected, "every request ended exactly once");
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_shadow_sees_the_live_events_and_its_actions_are_counted_never_applied() {
    let (mut engine, _clock) = engine_with::<Hold>(chain(1, 2));
    let first: Vec<u64> = (0..3).map(|_| engine.submit(Submission::default())).collect();
    let fifo = NativePolicy::<policy_fifo::Fifo>::new("fifo", 3, 100_000);
    assert!(engine.start_shadow(yardmaster_policy::Candidate::native(Box::new(fifo))).is_none());
    for _ in 0..5 {
        engine.submit(Submission::default());
    }
    engine.flush();
    assert!(engine.executor().started.is_empty(), "the shadow's dispatches are not executed");
    assert_eq!(engine.arm().ledger().len(), 8, "the live policy still holds everything");
    let report = engine.shadow_report().expect("a shadow runs");
    assert_eq!(report.state, "running");
    assert!(report.events >= 5 + 3, "the held requests were replayed, the new ones delivered: {report:?}");
    assert_eq!(report.accepted.get("dispatch"), Some(&2), "fifo dispatched to both idle workers: {report:?}");
    assert!(report.held < 8, "the shadow's own ledger follows its decisions: {report:?}");
    assert!(first.iter().all(|id| engine.arm().ledger().get(*id).is_some()));
    let last = engine.stop_shadow().expect("the final report");
    assert_eq!(last.accepted, report.accepted);
    assert!(engine.shadow_report().is_none());
}

#[test]
fn a_lost_worker_finishes_its_job_then_leaves_and_its_stage_counts_one_replica_fewer() {
    let (mut engine, _clock) = engine_with::<policy_fifo::Fifo>(chain(1, 2));
    let workers: Vec<u32> = engine.state().workers().keys().copied().collect();
    assert_eq!(workers.len(), 2);
    let id = engine.submit(Submission { stream: 0, ..Default::default() });
    engine.flush();
    let job = engine.executor().started.last().cloned().expect("a job");
    let busy = job.worker;
    let idle = *workers.iter().find(|&&w| w != busy).unwrap();

    // The idle one is lost: removed at once, and no longer counted.
    engine.worker_lost(idle, "gone");
    assert!(!engine.state().workers().contains_key(&idle));
    assert_eq!(engine.state().stages()[0].replicas, 1);
    // The busy one is lost: its job still reports (failed), then it leaves.
    engine.worker_lost(busy, "model failed to load");
    assert!(engine.state().workers().contains_key(&busy), "kept until its job reports");
    let failed = JobResult {
        worker: busy,
        duration: MS,
        items: vec![ItemResult { id, error: Some("model failed to load".into()), tokens: 0, finished: false, fan_out: vec![] }],
    };
    engine.job_finished(failed);
    engine.flush();
    assert!(engine.state().workers().is_empty(), "a lost worker leaves after its job");
    assert_eq!(engine.state().stages()[0].replicas, 0);
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 1, "the request ends exactly once");
    assert!(matches!(&ended[0].outcome, Outcome::Failed { error } if error.contains("failed to load")));
    engine.worker_lost(busy, "again"); // a second report of a gone worker changes nothing
    assert_eq!(engine.state().stages()[0].replicas, 0);
    assert!(engine.executor().retired.contains(&idle));
}

#[test]
fn requests_waiting_at_a_stage_left_without_workers_fail_with_the_reason() {
    let (mut engine, _clock) = engine_with::<policy_fifo::Fifo>(chain(1, 1));
    let ids: Vec<u64> = (0..6).map(|_| engine.submit(Submission { stream: 0, ..Default::default() })).collect();
    engine.flush();
    let job = engine.executor().started.last().cloned().expect("a job");
    assert_eq!(job.items.len(), 4, "one batch of four runs, two wait");
    engine.worker_lost(job.worker, "its model failed to load");
    engine.flush();
    let waiting_failed = engine.take_ended();
    assert_eq!(waiting_failed.len(), 2, "the two waiting requests fail at once");
    assert!(waiting_failed
        .iter()
        .all(|e| matches!(&e.outcome, Outcome::Failed { error } if error.contains("no worker left") && error.contains("failed to load"))));
    let result = JobResult {
        worker: job.worker,
        duration: MS,
        items: job
            .items
            .iter()
            .map(|i| ItemResult { id: i.id, error: Some("failed to load".into()), tokens: 0, finished: false, fan_out: vec![] })
            .collect(),
    };
    engine.job_finished(result);
    engine.flush();
    let mut ended: Vec<u64> = waiting_failed.iter().chain(engine.take_ended().iter()).map(|e| e.id).collect();
    ended.sort();
    assert_eq!(ended, ids, "every request ended exactly once");
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn arrivals_at_a_stage_that_lost_its_last_worker_fail_at_once_until_it_scales_up_again() {
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(2, 1));
    let second = *engine.state().workers().values().find(|w| w.info.stage == 1).map(|w| &w.info.id).unwrap();
    engine.worker_lost(second, "connection to the node lost: idle timeout");
    engine.flush();

    // A fresh request still passes stage 0, then fails on reaching stage 1 — at once,
    // not at its deadline — and the policy is never handed it there.
    let id = engine.submit(Submission { stream: 0, ..Default::default() });
    engine.flush();
    let job = engine.executor().started.last().cloned().expect("stage 0 still serves");
    assert_eq!(job.stage, 0);
    clock.set(5 * MS);
    finish_all(&mut engine, &BTreeMap::new());
    engine.flush();
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].id, id);
    assert_eq!(ended[0].at, 5 * MS, "ended when it reached the stage");
    match &ended[0].outcome {
        Outcome::Failed { error } => {
            assert_eq!(error, "stage s1 has no worker left: connection to the node lost: idle timeout")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(engine.arm().ledger().get(id).is_none(), "the policy holds nothing of it");
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(engine.stats().jobs, 1, "nothing was dispatched at stage 1");

    // The stage is scaled up again: arrivals queue for the starting worker and are
    // served once it is ready.
    engine.resize(1, 1);
    let fresh = *engine.executor().provisioned.last().expect("a worker provisioned");
    let id = engine.submit(Submission { stream: 0, ..Default::default() });
    engine.flush();
    clock.set(10 * MS);
    finish_all(&mut engine, &BTreeMap::new());
    engine.flush();
    assert!(engine.take_ended().is_empty(), "it waits at stage 1 for the starting worker");
    assert!(engine.holds_request(id));
    engine.worker_ready(fresh);
    engine.flush();
    let job = engine.executor().started.last().cloned().expect("a job on the fresh worker");
    assert_eq!((job.worker, job.stage), (fresh, 1));
    clock.set(15 * MS);
    finish_all(&mut engine, &BTreeMap::new());
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].id, &ended[0].outcome), (id, &Outcome::Completed));
}

/// Finish `jobs` successfully, recording what ran as (stage, request) pairs.
fn finish_recorded(engine: &mut Engine<ManualClock, TestExecutor>, jobs: Vec<BatchJob>, seen: &mut Vec<(u32, u64)>) {
    for job in jobs {
        seen.extend(job.items.iter().map(|i| (job.stage, i.id)));
        engine.job_finished(success(&job, &[]));
    }
}

/// Run until nothing is in flight: finish every job (recording it), flush, move the
/// clock on.
fn run_to_the_end(engine: &mut Engine<ManualClock, TestExecutor>, clock: &ManualClock, seen: &mut Vec<(u32, u64)>) {
    for step in 1..=200u64 {
        if engine.in_flight() == 0 {
            return;
        }
        clock.set(clock.now() + 10 * MS);
        let jobs = std::mem::take(&mut engine.executor_mut().started);
        finish_recorded(engine, jobs, seen);
        engine.flush();
        assert!(step < 200, "requests still in flight: {}", engine.in_flight());
    }
}

/// Every request ended exactly once, and no request ran twice at one stage.
fn assert_each_once(engine: &mut Engine<ManualClock, TestExecutor>, submitted: &[u64], seen: &[(u32, u64)]) {
    let ended: Vec<u64> = engine.take_ended().iter().map(|e| e.id).collect();
    let mut sorted = ended.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ended.len(), "a request ended twice");
    let mut expected = submitted.to_vec();
    expected.sort();
    assert_eq!(sorted, expected, "every request ended");
    let mut runs = seen.to_vec();
    runs.sort();
    let before = runs.len();
    runs.dedup();
    assert_eq!(runs.len(), before, "a request ran twice at one stage: {seen:?}");
}

#[test]
fn a_prepared_swap_tells_the_new_policy_what_changed_and_each_request_ends_once() {
    // Two stages of one worker each: a request keeps its id from one stage to the
    // next, so requests of the snapshot come back (at stage 1) after they left.
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(2, 1));
    let mut submitted: Vec<u64> = (0..30).map(|_| engine.submit(Submission::default())).collect();
    engine.flush();
    let mut seen = Vec::new();
    assert_eq!(engine.arm().ledger().len(), 26, "fifo runs the first four");

    let snapshot = engine.handover_snapshot();
    assert_eq!(snapshot.held(), 26);
    let mut candidate = yardmaster_policy::Candidate::native(Box::new(NativePolicy::<policy_fifo::Fifo>::new("fifo-2", 3, 100_000)));
    candidate.pre_replay(snapshot).expect("fifo takes the replay");
    assert!(candidate.is_prepared());

    // Meanwhile the old policy goes on: the first batch moves to stage 1, the second
    // batch (of the snapshot) runs and moves to stage 1 too, a third starts; new
    // requests come, one held request is cancelled.
    let first_stage_zero: Vec<u64> = submitted[4..8].to_vec();
    clock.set(10 * MS);
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    finish_recorded(&mut engine, jobs, &mut seen);
    engine.flush();
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    let (stage0, stage1): (Vec<BatchJob>, Vec<BatchJob>) = jobs.into_iter().partition(|j| j.stage == 0);
    assert_eq!(stage0[0].items.iter().map(|i| i.id).collect::<Vec<_>>(), first_stage_zero);
    finish_recorded(&mut engine, stage0, &mut seen);
    engine.executor_mut().started = stage1;
    engine.flush();
    submitted.extend((0..5).map(|_| engine.submit(Submission::default())));
    let cancelled = submitted[20];
    engine.cancel(cancelled);
    // Requests 4..8 wait at stage 1 now, under their old ids.
    assert!(first_stage_zero.iter().all(|id| engine.arm().ledger().get(*id).is_some_and(|r| r.stage == 1)));

    let outcome = engine.swap(candidate);
    let yardmaster_policy::Handover::Delta { arrived, left, .. } = outcome.report.handover else {
        panic!("a prepared candidate is told the difference: {:?}", outcome.report)
    };
    // Left: 4..8 (moved on), 8..12 (running), the cancelled one. Arrived: 4..8 at
    // stage 1 and the five new ones.
    assert_eq!((left, arrived), (9, 9), "{:?}", outcome.report);
    assert_eq!(outcome.report.state, yardmaster_policy::ArmState::Primary);

    run_to_the_end(&mut engine, &clock, &mut seen);
    submitted.retain(|id| *id != cancelled);
    let ended_cancelled = engine.take_ended();
    let mut all_ended: Vec<u64> = ended_cancelled.iter().map(|e| e.id).collect();
    assert!(all_ended.contains(&cancelled), "the cancelled request ended (as dropped)");
    all_ended.retain(|id| *id != cancelled);
    all_ended.sort();
    let mut expected = submitted.clone();
    expected.sort();
    assert_eq!(all_ended, expected, "every request ended exactly once");
    let mut runs = seen.clone();
    runs.sort();
    let before = runs.len();
    runs.dedup();
    assert_eq!(runs.len(), before, "no request ran twice at one stage");
    let stats = engine.arm().stats();
    // The new fifo still queued the nine that left at stage 0: each was taken out of
    // its dispatches once, and no dispatch was refused for them.
    assert_eq!(stats.forgiven, 9, "{stats:?}");
    assert_eq!(stats.rejected_total(), 0, "{stats:?}");
}

/// Dispatches its first batches, in its first answer, to every worker of its
/// configuration in turn (without waiting to hear they are idle); then like fifo.
#[derive(Default)]
struct EagerStart {
    queue: std::collections::VecDeque<u64>,
    started: bool,
}

impl Policy for EagerStart {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, request: sdk::Request) {
        self.queue.push_back(request.id);
    }
    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: u64, _reason: sdk::EndReason) {
        self.queue.retain(|id| *id != request);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let workers: Vec<u32> = if std::mem::replace(&mut self.started, true) {
            ctx.idle_workers(0).collect()
        } else {
            let mut all: Vec<u32> = ctx.config().workers.iter().map(|w| w.id).collect();
            all.sort();
            all
        };
        for worker in workers {
            let batch: Vec<u64> = (0..4).map_while(|_| self.queue.pop_front()).collect();
            if batch.is_empty() {
                break;
            }
            ctx.dispatch(worker, batch);
        }
    }
}

/// Dispatches only to workers with even ids, in arrival order.
#[derive(Default)]
struct EvenWorkers {
    queue: std::collections::VecDeque<u64>,
}

impl Policy for EvenWorkers {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, request: sdk::Request) {
        self.queue.push_back(request.id);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let idle: Vec<u32> = ctx.idle_workers(0).filter(|w| w % 2 == 0).collect();
        for worker in idle {
            let batch: Vec<u64> = (0..4).map_while(|_| self.queue.pop_front()).collect();
            if batch.is_empty() {
                break;
            }
            ctx.dispatch(worker, batch);
        }
    }
}

#[test]
fn dispatches_decided_in_the_pre_replay_stand_only_if_they_still_hold_at_the_swap() {
    let (mut engine, clock) = engine_with::<EvenWorkers>(chain(1, 3));
    let workers: Vec<u32> = {
        let mut w: Vec<u32> = engine.state().workers().keys().copied().collect();
        w.sort();
        w
    };
    assert_eq!(workers, [0, 1, 2]);
    let mut submitted: Vec<u64> = (0..20).map(|_| engine.submit(Submission::default())).collect();
    engine.flush();
    let mut seen = Vec::new();
    assert_eq!(engine.executor().started.len(), 2, "workers 0 and 2 run; 1 stays idle");
    assert_eq!(engine.arm().ledger().len(), 12);

    // The candidate's first answer, in the pre-replay, dispatches the next twelve:
    // four each to workers 0, 1 and 2.
    let snapshot = engine.handover_snapshot();
    let mut candidate = yardmaster_policy::Candidate::native(Box::new(NativePolicy::<EagerStart>::new("eager", 3, 100_000)));
    candidate.pre_replay(snapshot).unwrap();

    // Meanwhile worker 0 finishes and the old policy gives it the very batch the
    // candidate meant for it; worker 2 is still busy; two requests arrive.
    clock.set(10 * MS);
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    let (zero, rest): (Vec<BatchJob>, Vec<BatchJob>) = jobs.into_iter().partition(|j| j.worker == 0);
    engine.executor_mut().started = rest;
    finish_recorded(&mut engine, zero, &mut seen);
    engine.flush();
    let again: Vec<u64> = engine.executor().started.iter().find(|j| j.worker == 0).unwrap().items.iter().map(|i| i.id).collect();
    assert_eq!(again, submitted[8..12]);
    submitted.extend((0..2).map(|_| engine.submit(Submission::default())));

    let started_before = engine.executor().started.len();
    let outcome = engine.swap(candidate);
    // Worker 0's batch goes (its requests left meanwhile: forgiven, not run twice),
    // worker 1's stands (idle, its requests held), worker 2's is refused (busy) and
    // its requests, still held, are handed back with the two new ones.
    assert_eq!(outcome.report.handover, yardmaster_policy::Handover::Delta { events: 6, arrived: 6, left: 4 });
    let started: Vec<&BatchJob> = engine.executor().started[started_before..].iter().collect();
    assert_eq!(started.len(), 1, "only the dispatch to worker 1 stood");
    assert_eq!((started[0].worker, started[0].items.iter().map(|i| i.id).collect::<Vec<_>>()), (1, submitted[12..16].to_vec()));
    let stats = engine.arm().stats();
    assert_eq!((stats.rejected.get("worker-busy"), stats.rejected_total()), (Some(&1), 1), "{stats:?}");
    assert_eq!(stats.forgiven, 4, "{stats:?}");

    run_to_the_end(&mut engine, &clock, &mut seen);
    assert_each_once(&mut engine, &submitted, &seen);
}

/// One iteration-level (LLM) stage of `replicas` workers with 40 GiB of KV each.
fn llm_pipeline(replicas: u32) -> Pipeline {
    let text = format!(
        "name = \"llm\"\nslo_ms = 60000\n[[stage]]\nname = \"generate\"\nkind = \"iteration\"\nmax_batch = 4\nreplicas = {replicas}\n\
         worker_memory_mib = 40960\n[[stage.variant]]\nname = \"m\"\nalpha_ms = 1.0\nbeta_ms = 10.0\n"
    );
    from_toml(&text, "llm").unwrap()
}

/// Runs each arrival on an idle worker and resumes a worker's paused sequences
/// whenever it is idle (as the SDK's LLM helpers do).
#[derive(Default)]
struct ResumeResident;

impl Policy for ResumeResident {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self)
    }
    fn on_arrival(&mut self, ctx: &mut Ctx, request: sdk::Request) {
        dispatch_alone_if_idle(ctx, request.id);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let idle = ctx.idle_workers(0).next();
        if idle == Some(0) {
            yardmaster_sdk::helpers::llm::resume_resident(ctx, 0);
        }
    }
}

/// Finish every started frame with `tokens` tokens per sequence, none finished.
fn finish_frames(engine: &mut Engine<ManualClock, TestExecutor>, tokens: u32) {
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    for job in jobs {
        let items = job.items.iter().map(|i| ItemResult { id: i.id, error: None, tokens, finished: false, fan_out: vec![] }).collect();
        engine.job_finished(JobResult { worker: job.worker, duration: MS, items });
    }
    engine.flush();
}

#[test]
fn a_sequence_whose_request_ends_while_its_frame_runs_leaves_with_the_frame() {
    let (mut engine, _clock) = engine_with::<ResumeResident>(llm_pipeline(1));
    engine.submit(Submission { input_size: 100, expected_tokens: 100, ..Default::default() });
    engine.flush();
    let id = engine.executor().started[0].items[0].id;
    // A first frame leaves it paused; the policy resumes it at once.
    finish_frames(&mut engine, 8);
    assert_eq!(engine.executor().started.len(), 1, "the paused sequence was resumed");
    assert!(engine.state().workers()[&0].resident.contains_key(&id));
    // The client goes away while the frame runs.
    engine.cancel(id);
    engine.flush();
    finish_frames(&mut engine, 8);
    let worker = &engine.state().workers()[&0];
    assert!(worker.resident.is_empty(), "the ended sequence no longer holds KV: {:?}", worker.resident);
    assert_eq!(engine.executor().evicted, [(0, id)], "the worker frees its cache");
    assert!(engine.executor().started.is_empty(), "the policy was not told of a phantom resident sequence to resume");
    assert_eq!(engine.arm().stats().rejected_total(), 0);
}

/// A latency-sensitive LLM stream (`ls`, first token due in 1 s) on one worker.
fn ls_llm_pipeline() -> Pipeline {
    let text = "name = \"llm\"\n[[stage]]\nname = \"generate\"\nkind = \"iteration\"\nmax_batch = 4\nreplicas = 1\n\
                worker_memory_mib = 40960\n[[stage.variant]]\nname = \"m\"\nalpha_ms = 1.0\nbeta_ms = 10.0\n\
                [[stream]]\nname = \"ls\"\nentry = \"generate\"\nslo_ms = 1000\n";
    from_toml(text, "llm").unwrap()
}

#[test]
fn a_long_stream_on_its_token_timeline_is_not_expired_and_one_that_stalls_is() {
    let (mut engine, clock) = engine_with::<ResumeResident>(ls_llm_pipeline());
    let tbt = EngineOptions::default().ls_time_between_tokens;
    let grace = EngineOptions::default().expiry_grace;
    let id = engine.submit(Submission { input_size: 100, expected_tokens: 1_000, ..Default::default() });
    engine.flush();
    // Eight tokens every 500 ms, ahead of a token every 100 ms: 20 s of output, four
    // times past the first token's deadline plus the grace.
    for _ in 0..40 {
        clock.set(clock.now() + 500 * MS);
        engine.advance();
        finish_frames(&mut engine, 8);
    }
    assert!(engine.take_ended().is_empty(), "a stream on its timeline was ended");
    // Then it stalls: it ends a grace after its next token's due time, not before.
    let next_due = 1_000 * MS + 320 * tbt;
    let stalled = std::mem::take(&mut engine.executor_mut().started);
    assert_eq!(stalled.len(), 1);
    clock.set(next_due + grace - MS);
    engine.advance();
    engine.flush();
    assert!(engine.take_ended().is_empty(), "ended before its timeline's grace ran out");
    clock.set(next_due + grace + MS);
    engine.advance();
    engine.flush();
    let ended = engine.take_ended();
    assert_eq!(ended.iter().map(|e| e.id).collect::<Vec<_>>(), [id]);
    assert!(matches!(&ended[0].outcome, Outcome::Dropped { reason } if reason.contains("token timeline")), "{:?}", ended[0].outcome);
}

/// Dispatches a request it does not hold the first time, then what it holds when
/// told a worker is idle.
#[derive(Default)]
struct WrongFirst {
    held: Vec<u64>,
    erred: bool,
}

impl Policy for WrongFirst {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, request: sdk::Request) {
        self.held.push(request.id);
    }
    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let idle = ctx.idle_workers(0).next();
        let Some(worker) = idle else { return };
        if !self.erred {
            self.erred = true;
            ctx.dispatch(worker, vec![9_999]);
        } else if !self.held.is_empty() {
            ctx.dispatch(worker, std::mem::take(&mut self.held));
        }
    }
}

#[test]
fn a_refused_dispatch_hands_its_worker_back_to_the_policy() {
    let (mut engine, _clock) = engine_with::<WrongFirst>(chain(1, 1));
    engine.submit(Submission::default());
    engine.flush();
    assert_eq!(engine.arm().stats().rejected_total(), 1, "the dispatch of an unknown request is refused");
    // With its next events the policy hears that the worker is idle, and uses it.
    engine.flush();
    assert_eq!(engine.executor().started.len(), 1, "the worker was handed back");
    assert_eq!(engine.arm().stats().rejected_total(), 1);
}

/// Limits stage 0 to batches of one, then faults on its second arrival.
struct LimitThenFault {
    arrivals: u32,
}

impl Policy for LimitThenFault {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        ctx.set_batch_limit(0, 1);
        Ok(Self { arrivals: 0 })
    }
    fn on_arrival(&mut self, _ctx: &mut Ctx, _request: sdk::Request) {
        self.arrivals += 1;
        assert!(self.arrivals < 2, "a policy bug on the second arrival");
    }
}

#[test]
fn a_fallback_keeps_to_the_batch_limit_its_predecessor_set() {
    let (mut engine, clock) = engine_with::<LimitThenFault>(chain(1, 1));
    engine.submit(Submission::default());
    engine.flush();
    // A tick: the arm keeps the snapshot it will hand a fresh instance.
    clock.set(1_000 * MS);
    engine.advance();
    engine.flush();
    for _ in 0..5 {
        engine.submit(Submission::default());
    }
    engine.flush();
    let stats = engine.arm().stats();
    assert_eq!(stats.fallbacks, 1, "the policy faulted and the fallback took over");
    assert_eq!(stats.rejected.get("batch-over-limit"), None, "the fallback dispatched past the limit in force: {:?}", stats.rejected);
    let job = engine.executor().started.last().expect("the fallback dispatched");
    assert_eq!(job.items.len(), 1, "batches of one, as the limit in force says");
}
