//! The check runs on the engine's rules: the script reaches the policy as the engine's
//! events, actions are validated against the engine's state, and the engine applies
//! them (a scale-down drains a busy worker, a request held too long is expired).

use yardmaster_engine::{ClusterState, Submission, WorkerPhase};
use yardmaster_policy::contract::{Action, Config, Event};
use yardmaster_policy::{Arm, ArmOutput, FailureMode, NativePolicy, Rejection};
use yardmaster_sdk::{Ctx, EndReason, Policy, Request, RequestId, StageId, WorkerId};

use super::scripted::{Fate, Harness, MS};
use super::{check_native, component_arm, run, simulated_twice, CheckOptions, Scenario};

/// Start a native `P` as the arm.
fn native<P: Policy + Send>(name: &'static str) -> impl FnOnce(Config, &ClusterState) -> (Arm, ArmOutput) {
    move |config, view| Arm::start(name, config, Box::new(NativePolicy::<P>::new(name, 1, 10_000)), FailureMode::FailOpen, view)
}

/// A vision request sent now, due in 10 s.
fn vision(now: u64) -> Submission {
    Submission { stream: 0, sent_at: now, deadline: now + 10_000 * MS, input_size: 64, ..Submission::default() }
}

/// First come, first served per stage, in batches up to the stage's limit (an LLM
/// worker's resident sequences first).
fn serve_in_order(ctx: &mut Ctx, held: &mut Vec<(RequestId, StageId)>) {
    for stage in 0..ctx.config().stages.len() as StageId {
        let limit = ctx.batch_limit(stage) as usize;
        for worker in ctx.idle_workers(stage).collect::<Vec<_>>() {
            let mut batch: Vec<RequestId> = ctx.resident(worker).iter().map(|s| s.id).take(limit).collect();
            while batch.len() < limit {
                let Some(at) = held.iter().position(|(_, s)| *s == stage) else { break };
                batch.push(held.remove(at).0);
            }
            if !batch.is_empty() {
                ctx.dispatch(worker, batch);
            }
        }
    }
}

/// Serves first come first served, except that the first time both detect workers
/// are idle with two requests waiting, it dispatches one to each and scales the stage
/// down to one replica in the same answer; on its next call it dispatches once more
/// to the worker the engine is draining, which it still counts as its own.
#[derive(Default)]
struct Shrinker {
    held: Vec<(RequestId, StageId)>,
    drained: Option<WorkerId>,
    pushed: bool,
}

impl Policy for Shrinker {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push((request.id, request.stage));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|(id, _)| *id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let idle: Vec<WorkerId> = ctx.idle_workers(0).collect();
        let waiting: Vec<RequestId> = self.held.iter().filter(|(_, s)| *s == 0).map(|(id, _)| *id).collect();
        match self.drained {
            None if idle.len() == 2 && waiting.len() >= 2 => {
                ctx.dispatch(idle[0], vec![waiting[0]]);
                ctx.dispatch(idle[1], vec![waiting[1]]);
                ctx.scale(0, 1, None);
                self.held.retain(|(id, _)| !waiting[..2].contains(id));
                self.drained = Some(idle[1]);
            }
            Some(worker) if !self.pushed && !waiting.is_empty() && ctx.worker(worker).is_some() => {
                ctx.dispatch(worker, vec![waiting[0]]);
                self.pushed = true;
                return;
            }
            _ => {}
        }
        serve_in_order(ctx, &mut self.held);
    }
}

/// Lowers the detect stage's batch limit to 2 at start, then dispatches all it holds
/// there in one batch anyway.
#[derive(Default)]
struct OverLimit {
    held: Vec<RequestId>,
}

impl Policy for OverLimit {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        ctx.set_batch_limit(0, 2);
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push(request.id);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let idle = ctx.idle_workers(0).next();
        if let Some(worker) = idle {
            ctx.dispatch(worker, std::mem::take(&mut self.held));
        }
    }
}

/// Holds every request and never serves one.
#[derive(Default)]
struct Hold;

impl Policy for Hold {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self)
    }
}

#[test]
fn a_scale_down_drains_a_busy_worker_as_the_engine_does() {
    let mut harness = Harness::start(Vec::new(), 1, native::<Shrinker>("shrinker"));
    for _ in 0..3 {
        harness.submit(vision(0));
    }
    harness.flush();
    // Both detect workers are busy: the engine drains the newest instead of removing an
    // idle one (the old scripted cluster removed idle workers only, so worker 1 stayed).
    let state = harness.engine().state();
    assert!(matches!(state.workers()[&1].phase, WorkerPhase::Draining { .. }), "{:?}", state.workers()[&1].phase);
    assert_eq!(state.stages()[0].replicas, 1);

    // The policy still counts worker 1 as its own: the engine's validation sees it busy.
    harness.submit(vision(0));
    harness.flush();
    let last = &harness.calls().last().unwrap().output;
    assert_eq!(last.rejected.len(), 1, "{last:?}");
    assert!(matches!(&last.rejected[0], (Action::Dispatch(d), Rejection::WorkerBusy(1)) if d.worker == 1), "{last:?}");

    assert!(harness.settle(1_000));
    // Worker 1 finished its job and left: its batch-done, then worker-removed, and it
    // was never idle again.
    let events: Vec<&Event> = harness.calls().iter().flat_map(|c| &c.events).collect();
    let done = events.iter().position(|e| matches!(e, Event::BatchDone(b) if b.worker == 1)).expect("worker 1 finished its job");
    let removed = events.iter().position(|e| matches!(e, Event::WorkerRemoved(1))).expect("worker 1 was removed");
    assert!(done < removed);
    assert!(!events.iter().any(|e| matches!(e, Event::WorkerIdle(1))), "a draining worker is not idle again");
    assert!(!harness.engine().state().workers().contains_key(&1));
    assert_eq!(harness.engine().state().stages()[0].replicas, 1);
    // Its request was not lost: every request completed, each once.
    assert_eq!(harness.count(Fate::Completed { late: false }), 4);
    assert!(harness.unfinished().is_empty());
    assert!(harness.violations().is_empty(), "{:?}", harness.violations());
}

#[test]
fn the_check_reports_a_dispatch_to_a_draining_worker_and_loses_nothing() {
    let report = check_native::<Shrinker>("shrinker", &CheckOptions::default());
    assert!(!report.passed());
    assert!(report.rejected.iter().any(|r| r.contains("dispatch rejected: worker 1 is busy")), "{}", report.render());
    assert!(report.lost.is_empty() && report.faults.is_empty() && report.violations.is_empty(), "{}", report.render());
    let o = &report.outcomes;
    assert_eq!(o.on_time + o.late + o.dropped + o.cancelled + o.refused + o.failed, o.requests, "{}", report.render());
}

#[test]
fn a_batch_over_the_limit_the_policy_set_is_rejected() {
    let mut harness = Harness::start(Vec::new(), 1, native::<OverLimit>("over-limit"));
    assert_eq!(harness.engine().state().stages()[0].batch_limit, 2, "the engine applied the policy's limit");
    for _ in 0..3 {
        harness.submit(vision(0));
    }
    harness.flush();
    let last = &harness.calls().last().unwrap().output;
    assert!(last.actions.is_empty());
    assert!(matches!(last.rejected[..], [(_, Rejection::BatchOverLimit { stage: 0, len: 3, limit: 2 })]), "{last:?}");
    assert_eq!(harness.engine().state().workers()[&0].phase, WorkerPhase::Idle);
}

#[test]
fn requests_a_policy_holds_are_expired_by_the_engine_and_reported_lost() {
    let report = check_native::<Hold>("hold", &CheckOptions::default());
    assert!(!report.passed());
    assert_eq!(report.outcomes.cancelled, 1);
    assert_eq!(report.lost.len(), report.outcomes.requests as usize - 1, "{}", report.render());
    assert!(
        report.lost.iter().all(|l| l.contains("held by the policy at stage") && l.contains("the host expired it")),
        "{}",
        report.render()
    );
    assert!(report.violations.is_empty(), "{}", report.render());
}

#[test]
fn the_script_reaches_the_policy_as_every_event_kind_of_the_engine() {
    let result = run(
        Scenario::Cluster,
        &|config: Config, view: &ClusterState| {
            Arm::start("edf", config, Box::new(NativePolicy::<policy_edf::Edf>::new("edf", 7, 10_000)), FailureMode::FailOpen, view)
        },
        &CheckOptions::default(),
    );
    assert!(result.report.passed(), "{}", result.report.render());
    let harness = &result.harness;
    let kinds: std::collections::BTreeSet<&str> = harness.calls().iter().flat_map(|c| c.events.iter().map(Event::kind)).collect();
    for kind in ["arrival", "worker-idle", "batch-done", "frame", "tick", "worker-added", "worker-removed", "request-ended"] {
        assert!(kinds.contains(kind), "{kind} missing: {kinds:?}");
    }
    // Every request ended once, through the engine.
    assert_eq!(harness.fates().count(), harness.submitted());
    assert_eq!(harness.submitted(), CheckOptions::default().requests as usize);
    assert_eq!(harness.engine().in_flight(), 0);
}

#[test]
fn two_runs_are_identical() {
    let start = |config: Config, view: &ClusterState| {
        Arm::start("edf", config, Box::new(NativePolicy::<policy_edf::Edf>::new("edf", 7, 10_000)), FailureMode::FailOpen, view)
    };
    let (first, second) =
        (run(Scenario::Cluster, &start, &CheckOptions::default()), run(Scenario::Cluster, &start, &CheckOptions::default()));
    assert_eq!(first.actions, second.actions);
    assert_eq!(first.report.outcomes, second.report.outcomes);
}

#[test]
fn the_cluster_has_the_shape_the_check_promises() {
    use yardmaster_policy::contract::StageKind;
    let pipeline = super::scripted::pipeline();
    let names: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["detect", "classify", "generate"]);
    assert_eq!(pipeline.stages[0].successors, [1]);
    assert_eq!(pipeline.stages[1].predecessors, [0]);
    assert_eq!(pipeline.stages[0].variants.len(), 2);
    assert_eq!(pipeline.stages[2].kind, StageKind::Iteration);
    assert_eq!(pipeline.stages.iter().map(|s| s.replicas).collect::<Vec<_>>(), [2, 1, 1]);
    assert_eq!(pipeline.max_workers, 7);
    let streams: Vec<(&str, u32, u64)> = pipeline.streams.iter().map(|s| (s.name.as_str(), s.entry, s.slo_ns)).collect();
    assert_eq!(streams, [("vision", 0, 150 * MS), ("chat", 2, 3_000 * MS)]);
    // `base + per_item · batch`, exactly.
    assert_eq!(pipeline.stages[0].variants[0].profile.mean(8), 28 * MS);
    assert_eq!(pipeline.stages[2].variants[0].profile.mean(2), 3 * MS + MS / 2);
    assert_eq!(pipeline.stages[2].variants[0].profile.tail(1), 4_062_500);
    assert_eq!(super::scripted::engine_options(Vec::new(), 7).tick_interval, 100 * MS);
}

// The repository scenario: independent models and an ensemble, reconfigured while
// serving.

/// First come, first served per stage; and, like a policy that keeps a floor of one
/// replica everywhere, on every tick it scales each stage it knows no worker of to one
/// replica — an offline stage included, which the engine refuses.
#[derive(Default)]
struct Floor {
    held: Vec<(RequestId, StageId)>,
}

impl Policy for Floor {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push((request.id, request.stage));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|(id, _)| *id != request);
    }

    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: yardmaster_sdk::Snapshot) {
        let bare: Vec<StageId> =
            ctx.config().stages.iter().map(|s| s.id).filter(|&id| !ctx.workers().any(|w| w.info.stage == id)).collect();
        for stage in bare {
            ctx.scale(stage, 1, None);
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        serve_in_order(ctx, &mut self.held);
    }
}

#[test]
fn the_repository_cluster_has_the_shape_the_check_promises() {
    use super::repository::{self, Served, RECONFIGURATIONS};
    use yardmaster_engine::keeps_places;

    let start = repository::pipeline();
    let names: Vec<&str> = start.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["yolo", "resnet", "bert", "caption/1:resnet", "caption/2:bert"]);
    let streams: Vec<(&str, u32, u64)> = start.streams.iter().map(|s| (s.name.as_str(), s.entry, s.slo_ns)).collect();
    assert_eq!(streams, [("yolo", 0, 200 * MS), ("resnet", 1, 100 * MS), ("bert", 2, 50 * MS), ("caption", 3, 300 * MS)]);
    // Three independent one-stage models; the ensemble a chain of two, entered at its first.
    for stage in &start.stages[..3] {
        assert!(stage.successors.is_empty() && stage.predecessors.is_empty(), "{}", stage.name);
    }
    assert_eq!((start.stages[3].successors.clone(), start.stages[4].predecessors.clone()), (vec![4], vec![3]));
    assert!(start.stages[3].predecessors.is_empty() && start.stages[4].successors.is_empty());
    let bounds: Vec<(u32, u32, u32, u32)> =
        start.stages.iter().map(|s| (s.max_batch, s.replicas, s.min_replicas, s.max_replicas)).collect();
    assert_eq!(bounds, [(4, 2, 1, 8), (8, 1, 1, 4), (1, 1, 1, 4), (4, 1, 1, 4), (1, 1, 1, 4)], "bert takes no batch");
    assert_eq!(start.max_workers, 24, "every stage at its most replicas");
    assert_eq!(start.stages[1].variants[0].profile.mean(8), 10 * MS);
    assert_eq!(start.stages[4].variants[0].profile.mean(1), 6 * MS);

    // yolo offline (its places kept), whisper appended, yolo back.
    let [unloaded, loaded, reloaded] = RECONFIGURATIONS.map(|r| r.served.pipeline());
    let yolo = |p: &yardmaster_engine::Pipeline| (p.stages[0].replicas, p.stages[0].min_replicas, p.stages[0].max_replicas);
    assert_eq!((yolo(&unloaded), unloaded.max_workers), ((0, 0, 0), 16));
    assert_eq!((loaded.stages.len(), loaded.streams.len(), loaded.max_workers), (6, 5, 20));
    assert_eq!((loaded.stages[5].name.as_str(), loaded.streams[4].entry, loaded.streams[4].slo_ns), ("whisper", 5, 1_000 * MS));
    assert_eq!((yolo(&reloaded), reloaded.max_workers), ((2, 1, 8), 28));
    let mut served = start.clone();
    for next in [&unloaded, &loaded, &reloaded] {
        keeps_places(&served, next).expect("stages and streams are only added");
        served = next.clone();
    }
    assert_eq!(Served::START.online_streams(), [0, 1, 2, 3]);
    assert_eq!(RECONFIGURATIONS[1].served.online_streams(), [1, 2, 3, 4], "yolo's stream is out of service");

    // Arrivals on every stream, in time order; whisper's only once it is loaded; at the
    // unload, more of yolo's than its two workers take in one batch each.
    let arrivals = repository::arrivals(&CheckOptions::default());
    assert_eq!(arrivals.len(), 240);
    assert!(arrivals.windows(2).all(|w| w[0].sent_at <= w[1].sent_at));
    let streams: std::collections::BTreeSet<u32> = arrivals.iter().map(|s| s.stream).collect();
    assert_eq!(streams.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(arrivals.iter().filter(|s| s.stream == 4).all(|s| s.sent_at > repository::LOAD_AT));
    let burst = arrivals.iter().filter(|s| s.stream == 0 && s.sent_at == repository::UNLOAD_AT).count();
    assert!(burst > 2 * 4, "{burst}");
    assert!(arrivals.iter().all(|s| s.deadline == s.sent_at + loaded.streams[s.stream as usize].slo_ns));
}

#[test]
fn models_unloaded_loaded_and_loaded_again_lose_no_request() {
    use super::repository::RECONFIGURATIONS;

    let result = run(
        Scenario::Repository,
        &|config: Config, view: &ClusterState| {
            Arm::start("edf", config, Box::new(NativePolicy::<policy_edf::Edf>::new("edf", 7, 10_000)), FailureMode::FailOpen, view)
        },
        &CheckOptions::default(),
    );
    let report = &result.report;
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.reconfigurations.len(), RECONFIGURATIONS.len(), "{}", report.render());
    assert!(report.reconfigurations[0].contains("model yolo unloaded"), "{:?}", report.reconfigurations);
    // Requests queued at yolo when it went offline were dropped by the host, those sent
    // to it while offline failed: all ended, none lost.
    let harness = &result.harness;
    let unloaded = harness.count(Fate::Unloaded);
    assert!(unloaded > 0 && report.reconfigurations[0].contains(&format!(": {unloaded} queued requests dropped")), "{}", report.render());
    assert!(harness.count(Fate::Failed) > 0, "{}", report.render());
    assert_eq!(harness.fates().count(), harness.submitted());
    assert_eq!(report.outcomes.unloaded as usize, unloaded);
    let o = &report.outcomes;
    assert_eq!(o.on_time + o.late + o.dropped + o.cancelled + o.refused + o.unloaded + o.failed, o.requests);
    assert!(o.on_time > 0);
    // The engine, the workers and the policy all serve the last pipeline: whisper has
    // its worker, yolo its two again.
    let engine = harness.engine();
    assert_eq!(engine.executor().pipeline().stages.len(), 6, "the scripted workers learned the new stage");
    assert_eq!(harness.arm().config().stages.len(), 6);
    assert_eq!(harness.arm().config().stages[0].max_replicas, 8);
    let replicas: Vec<u32> = engine.state().stages().iter().map(|s| s.replicas).collect();
    assert_eq!(replicas, [2, 1, 1, 1, 1, 1]);
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_policy_that_scales_an_offline_stage_is_rejected_and_reported_for_that_scenario() {
    let report = check_native::<Floor>("floor", &CheckOptions::default());
    assert!(!report.passed());
    assert!(report.cluster().passed(), "every stage of the cluster has a worker: {}", report.render());
    let repository = &report.repository;
    assert!(repository.rejected.iter().any(|r| r == "scale rejected: 1 replicas outside [0, 0] for stage 0"), "{}", report.render());
    assert!(repository.lost.is_empty() && repository.faults.is_empty() && repository.violations.is_empty(), "{}", report.render());
    let text = report.render();
    assert!(text.contains("failed in   repository scenario"), "{text}");
    assert!(text.contains("rejected actions in the repository scenario"), "{text}");
    assert!(text.contains("scenario    cluster: ") && text.contains("scenario    repository: "), "{text}");
}

#[test]
fn every_shipped_policy_passes_the_repository_scenario() {
    let options = CheckOptions::default();
    let sandbox = yardmaster_policy::Sandbox::new(yardmaster_policy::Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let loader = yardmaster_policy::PolicyLoader::new(sandbox.clone(), None);
    let mut failed = Vec::new();
    for artifact in yardmaster_policy_artifacts::SHIPPED {
        let module = loader.load(artifact.name, artifact.bytes).expect("a shipped policy loads");
        let (report, _) = simulated_twice(Scenario::Repository, &component_arm(artifact.name, &sandbox, &module), &options);
        assert_eq!(report.deterministic, Some(true), "{}", artifact.name);
        assert_eq!(report.reconfigurations.len(), 3, "{}: {}", artifact.name, report.render());
        if !report.passed() {
            failed.push(format!("{}:\n{}", artifact.name, report.render()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// The zero-time scenario: stages that take no time, at a light load.

/// First come, first served per stage, but sizes each batch as `budget / latency(1)`
/// in integer arithmetic: a stage that takes no time divides by zero.
#[derive(Default)]
struct Divider {
    held: Vec<(RequestId, StageId)>,
}

impl Policy for Divider {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push((request.id, request.stage));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|(id, _)| *id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        for stage in 0..ctx.config().stages.len() as StageId {
            let latency = ctx.latency().mean(stage, 0, 1).unwrap_or(1);
            let fits = (50 * MS / latency) as u32;
            let most = ctx.config().stages[stage as usize].max_batch.max(1);
            ctx.set_batch_limit(stage, fits.clamp(1, most));
        }
        serve_in_order(ctx, &mut self.held);
    }
}

/// First come, first served per stage, except that it drops what arrives at a stage
/// whose batch of one takes no time (it cannot estimate a throughput there): every
/// request, at the entry.
#[derive(Default)]
struct ZeroDropper {
    held: Vec<(RequestId, StageId)>,
}

impl Policy for ZeroDropper {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        if ctx.latency().mean(request.stage, 0, 1) == Some(0) {
            ctx.drop_request(request.id, yardmaster_sdk::DropReason::DeadlineUnreachable);
        } else {
            self.held.push((request.id, request.stage));
        }
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|(id, _)| *id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        serve_in_order(ctx, &mut self.held);
    }
}

#[test]
fn the_zero_time_cluster_has_the_shape_the_check_promises() {
    use super::zero_time::{self, ZERO_TIME_STAGES};
    let pipeline = zero_time::pipeline();
    let zero: Vec<&str> = pipeline.stages.iter().filter(|s| s.takes_no_time()).map(|s| s.name.as_str()).collect();
    assert_eq!(zero, ZERO_TIME_STAGES);
    assert_eq!(pipeline.stages[pipeline.streams[0].entry as usize].name, "source", "the entry takes no time");
    let split = pipeline.stages.iter().find(|s| s.name == "split").unwrap();
    assert_eq!(split.successors.len(), 2, "the fan-out point takes no time");
    let sink = pipeline.stages.iter().find(|s| s.name == "sink").unwrap();
    assert_eq!(sink.predecessors.len(), 2, "the join takes no time");
    // A light load: a small share of the capacity bound.
    let arrivals = zero_time::arrivals(&CheckOptions::default());
    let rate = arrivals.len() as f64 / (zero_time::ARRIVALS_FOR as f64 / 1e9);
    let bound = yardmaster_engine::bound::capacity_bound(&pipeline, pipeline.max_workers);
    assert!(rate < 0.1 * bound, "{rate} req/s against a bound of {bound}");
    assert!(arrivals.windows(2).all(|w| w[0].sent_at <= w[1].sent_at));
}

#[test]
fn a_policy_that_divides_by_a_zero_latency_or_drops_at_a_zero_time_stage_fails_the_zero_time_scenario() {
    let options = CheckOptions::default();
    let divider = check_native::<Divider>("divider", &options);
    assert!(divider.cluster().passed() && divider.repository.passed(), "no stage takes no time there: {}", divider.render());
    assert!(!divider.zero_time.faults.is_empty(), "{}", divider.render());
    assert!(divider.render().contains("failed in   zero-time scenario"), "{}", divider.render());
    let dropper = check_native::<ZeroDropper>("zero-dropper", &options);
    assert!(dropper.cluster().passed() && dropper.repository.passed(), "{}", dropper.render());
    assert!(dropper.zero_time.violations.iter().any(|v| v.contains("requests on time at a light load")), "{}", dropper.render());
    assert!(!dropper.passed());
}

#[test]
fn every_shipped_policy_passes_the_zero_time_scenario() {
    let options = CheckOptions::default();
    let sandbox = yardmaster_policy::Sandbox::new(yardmaster_policy::Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let loader = yardmaster_policy::PolicyLoader::new(sandbox.clone(), None);
    let mut failed = Vec::new();
    for artifact in yardmaster_policy_artifacts::SHIPPED {
        let module = loader.load(artifact.name, artifact.bytes).expect("a shipped policy loads");
        let (report, _) = simulated_twice(Scenario::ZeroTime, &component_arm(artifact.name, &sandbox, &module), &options);
        assert_eq!(report.deterministic, Some(true), "{}", artifact.name);
        if !report.passed() {
            failed.push(format!("{}:\n{}", artifact.name, report.render()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A policy written without the SDK that counts a batch in requests, not items, and
/// sends a sequence's step to whichever worker is idle: first come, first served, up
/// to the stage's `max_batch` requests per dispatch.
#[derive(Default)]
struct CountsRequests {
    stage_of: std::collections::BTreeMap<u32, u32>,
    max_batch: Vec<u32>,
    queued: Vec<Vec<u64>>,
    idle: std::collections::BTreeSet<u32>,
    cost: yardmaster_policy::CallCost,
}

impl CountsRequests {
    fn dispatch(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        for worker in std::mem::take(&mut self.idle) {
            let stage = self.stage_of[&worker] as usize;
            let queue = &mut self.queued[stage];
            if queue.is_empty() {
                self.idle.insert(worker);
                continue;
            }
            let take = queue.len().min(self.max_batch[stage] as usize);
            let requests: Vec<u64> = queue.drain(..take).collect();
            actions.push(Action::Dispatch(yardmaster_policy::contract::Dispatch { worker, requests, variant: None }));
        }
        actions
    }
}

impl yardmaster_policy::PolicyInstance for CountsRequests {
    fn label(&self) -> String {
        "counts-requests".into()
    }
    fn init(&mut self, config: &Config, _now: u64) -> Result<Vec<Action>, yardmaster_policy::PolicyFault> {
        self.max_batch = config.stages.iter().map(|s| s.max_batch).collect();
        self.queued = vec![Vec::new(); config.stages.len()];
        for worker in &config.workers {
            self.stage_of.insert(worker.id, worker.stage);
            self.idle.insert(worker.id);
        }
        Ok(Vec::new())
    }
    fn handle(
        &mut self,
        events: &[Event],
        _now: u64,
        _kind: yardmaster_policy::CallKind,
    ) -> Result<Vec<Action>, yardmaster_policy::PolicyFault> {
        for event in events {
            match event {
                Event::Arrival(request) => self.queued[request.stage as usize].push(request.id),
                Event::WorkerIdle(worker) => {
                    self.idle.insert(*worker);
                }
                Event::WorkerAdded(worker) => {
                    self.stage_of.insert(worker.id, worker.stage);
                    self.idle.insert(worker.id);
                }
                Event::WorkerRemoved(worker) => {
                    self.idle.remove(worker);
                }
                Event::RequestEnded((id, _)) => self.queued.iter_mut().for_each(|q| q.retain(|r| r != id)),
                _ => {}
            }
        }
        Ok(self.dispatch())
    }
    fn last_cost(&self) -> yardmaster_policy::CallCost {
        self.cost
    }
    fn take_emitted(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

#[test]
fn the_batches_scenario_sends_client_batches_and_interleaved_sequences() {
    use super::batches::{self, MAX_ITEMS, SEQUENCES, SEQUENCE_STEPS};
    let arrivals = batches::arrivals(&CheckOptions::default());
    assert!(arrivals.windows(2).all(|w| w[0].sent_at <= w[1].sent_at), "sorted by send time");
    let steps: Vec<_> = arrivals.iter().filter_map(|s| s.sequence).collect();
    assert_eq!(steps.len() as u64, SEQUENCES * u64::from(SEQUENCE_STEPS));
    assert_eq!(steps.iter().filter(|s| s.start).count() as u64, SEQUENCES);
    assert!(arrivals.iter().any(|s| s.items == MAX_ITEMS) && arrivals.iter().any(|s| s.items == 1));
    assert!(arrivals.iter().all(|s| s.items <= MAX_ITEMS), "no request carries more than a stage it passes takes");
    // The sequences overlap in time (interleaved), each step after its sequence's start.
    let first_end = arrivals.iter().position(|s| s.sequence.is_some_and(|q| q.end)).unwrap();
    assert!(arrivals[..first_end].iter().filter(|s| s.sequence.is_some_and(|q| q.start)).count() as u64 == SEQUENCES);
}

#[test]
fn a_policy_that_counts_requests_not_items_fails_the_batches_scenario_and_the_sdk_keeps_the_rules() {
    let options = CheckOptions::default();
    let start = |config: Config, view: &ClusterState| {
        Arm::start("counts-requests", config, Box::new(CountsRequests::default()), FailureMode::FailOpen, view)
    };
    let naive = run(Scenario::Batches, &start, &options).report;
    assert!(!naive.passed(), "{}", naive.render());
    assert!(
        naive.rejected.iter().any(|r| r.contains("items")) && naive.rejected.iter().any(|r| r.contains("is a step of a sequence held by")),
        "a batch over the limit in items and a step away from its state are both rejected: {}",
        naive.render()
    );
    // The same first come, first served on the SDK, through the whole check.
    let in_order = check_native::<InOrder>("in-order", &options);
    assert!(in_order.batches.passed(), "{}", in_order.render());
    let o = &in_order.batches.outcomes;
    assert_eq!(o.on_time + o.late, o.requests, "{}", in_order.render());
}

/// First come, first served on the SDK ([`serve_in_order`]): it counts requests, and
/// the SDK's dispatch keeps a batch's items and a sequence's worker within the rules.
#[derive(Default)]
struct InOrder {
    held: Vec<(RequestId, StageId)>,
}

impl Policy for InOrder {
    fn init(_ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self::default())
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push((request.id, request.stage));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|(id, _)| *id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        serve_in_order(ctx, &mut self.held);
    }
}

#[test]
fn every_shipped_policy_passes_the_batches_scenario() {
    let options = CheckOptions::default();
    let sandbox = yardmaster_policy::Sandbox::new(yardmaster_policy::Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let loader = yardmaster_policy::PolicyLoader::new(sandbox.clone(), None);
    let mut failed = Vec::new();
    for artifact in yardmaster_policy_artifacts::SHIPPED {
        let module = loader.load(artifact.name, artifact.bytes).expect("a shipped policy loads");
        let (report, _) = simulated_twice(Scenario::Batches, &component_arm(artifact.name, &sandbox, &module), &options);
        assert_eq!(report.deterministic, Some(true), "{}", artifact.name);
        if !report.passed() {
            failed.push(format!("{}:\n{}", artifact.name, report.render()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
#[test]
fn tmp_debug_flex() {
    let options = CheckOptions::default();
    let sandbox = yardmaster_policy::Sandbox::new(yardmaster_policy::Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let loader = yardmaster_policy::PolicyLoader::new(sandbox.clone(), None);
    let artifact = yardmaster_policy_artifacts::shipped("flex").unwrap();
    let module = loader.load(artifact.name, artifact.bytes).unwrap();
    let result = run(Scenario::Batches, &component_arm(artifact.name, &sandbox, &module), &options);
    for call in result.harness.calls() {
        let hit_e: Vec<String> = call
            .events
            .iter()
            .filter(|e| format!("{e:?}").contains("id: 26,") || format!("{e:?}").contains("WorkerIdle"))
            .map(|e| format!("{e:?}"))
            .collect();
        let hit_a: Vec<String> = call
            .output
            .actions
            .iter()
            .chain(call.output.rejected.iter().map(|r| &r.0))
            .filter(|a| format!("{a:?}").contains(" 26,") || format!("{a:?}").contains("[26") || format!("{a:?}").contains(" 26]"))
            .map(|a| format!("{a:?}"))
            .collect();
        if !hit_a.is_empty() || call.events.iter().any(|e| format!("{e:?}").contains("id: 26,")) {
            eprintln!("CALL events {:?}\n   actions {:?}", hit_e, hit_a);
        }
    }
}
