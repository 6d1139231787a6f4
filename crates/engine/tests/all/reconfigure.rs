//! A changed cluster under a running engine: a model's stage added while requests are
//! held, then taken offline, then brought back — every request ends exactly once, the
//! policy is handed the new configuration, and workers follow the stages' bounds.

use std::collections::BTreeMap;

use yardmaster_engine::*;
use yardmaster_formats::pipeline::from_toml;
use yardmaster_policy::{Arm, FailureMode, NativePolicy};

use super::engine::{TestExecutor, MS};

/// `stages` independent one-stage models `m0`, `m1`, …, each its own stream; the
/// models listed in `offline` have no replica allowed.
fn models(stages: usize, offline: &[usize]) -> Pipeline {
    let mut text = String::from("name = \"repo\"\n");
    for i in 0..stages {
        let (replicas, max) = if offline.contains(&i) { (0, 0) } else { (1, 4) };
        text += &format!(
            "[[stage]]\nname = \"m{i}\"\nmax_batch = 4\nreplicas = {replicas}\nmin_replicas = {replicas}\nmax_replicas = {max}\n[[stage.variant]]\nname = \"v\"\nalpha_ms = 1.0\nbeta_ms = 1.0\n"
        );
    }
    for i in 0..stages {
        text += &format!("[[stream]]\nname = \"m{i}\"\nentry = \"m{i}\"\nslo_ms = 1000\n");
    }
    let mut pipeline = from_toml(&text, "test").unwrap();
    pipeline.max_workers = pipeline.stages.iter().map(|s| s.max_replicas).sum();
    pipeline
}

fn engine(pipeline: Pipeline) -> (Engine<ManualClock, TestExecutor>, ManualClock) {
    let clock = ManualClock::default();
    let engine = Engine::new(clock.clone(), TestExecutor::default(), pipeline, EngineOptions::default(), |config, view| {
        Arm::start("test", config, Box::new(NativePolicy::<policy_fifo::Fifo>::new("fifo", 3, 100_000)), FailureMode::FailOpen, view)
    });
    (engine, clock)
}

fn ready_all(engine: &mut Engine<ManualClock, TestExecutor>) -> Vec<u32> {
    let provisioned = std::mem::take(&mut engine.executor_mut().provisioned);
    for &worker in &provisioned {
        engine.worker_ready(worker);
    }
    provisioned
}

fn finish(engine: &mut Engine<ManualClock, TestExecutor>, clock: &ManualClock) {
    clock.set(clock.now() + 5 * MS);
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    for job in jobs {
        let items =
            job.items.iter().map(|i| ItemResult { id: i.id, error: None, tokens: 0, finished: true, fan_out: Vec::new() }).collect();
        engine.job_finished(JobResult { worker: job.worker, duration: MS, items });
    }
    engine.flush();
}

#[test]
fn a_model_added_taken_offline_and_brought_back_loses_no_request() {
    let (mut engine, clock) = engine(models(1, &[]));
    let mut submitted: Vec<u64> = (0..10).map(|_| engine.submit(Submission::default())).collect();
    engine.flush();

    // A second model is loaded while m0's requests are held or running.
    let outcome = engine.reconfigure(models(2, &[]), "model m1 loaded").unwrap();
    assert_eq!(outcome.failed, 0);
    assert_eq!(engine.arm().config().stages.len(), 2, "the policy sees the new stage");
    assert_eq!(engine.arm().config().streams.len(), 2);
    let provisioned = ready_all(&mut engine);
    assert_eq!(provisioned.len(), 1, "m1's initial replica is provisioned");
    assert_eq!(engine.state().workers()[&provisioned[0]].info.stage, 1);
    submitted.extend((0..10).map(|_| engine.submit(Submission { stream: 1, ..Default::default() })));
    engine.flush();
    for _ in 0..10 {
        finish(&mut engine, &clock);
    }
    let ended: BTreeMap<u64, Outcome> = engine.take_ended().into_iter().map(|e| (e.id, e.outcome)).collect();
    assert_eq!(ended.keys().copied().collect::<Vec<_>>(), submitted, "every request ended once");
    assert!(ended.values().all(|o| *o == Outcome::Completed), "{ended:?}");

    // m0 goes offline with requests still queued: they fail with the reason, its
    // worker leaves, and later arrivals fail at once.
    let queued: Vec<u64> = (0..6).map(|_| engine.submit(Submission::default())).collect();
    let outcome = engine.reconfigure(models(2, &[0]), "model m0 unloaded").unwrap();
    let draining = |w: &WorkerEntry| matches!(w.phase, WorkerPhase::Draining { .. });
    assert!(engine.state().workers().values().all(|w| w.info.stage == 1 || draining(w)), "m0's worker leaves after its job");
    assert_eq!(engine.arm().config().stages[0].max_replicas, 0);
    let late = engine.submit(Submission::default());
    for _ in 0..5 {
        finish(&mut engine, &clock);
    }
    assert!(engine.state().workers().values().all(|w| w.info.stage == 1), "m0's worker was retired");
    let ended: BTreeMap<u64, Outcome> = engine.take_ended().into_iter().map(|e| (e.id, e.outcome)).collect();
    let mut expected = queued.clone();
    expected.push(late);
    assert_eq!(ended.keys().copied().collect::<Vec<_>>(), expected);
    let failed = ended
        .values()
        .filter(|o| match o {
            Outcome::Dropped { reason: error } | Outcome::Failed { error } => error.contains("out of service"),
            Outcome::Completed => false,
        })
        .count();
    assert!(outcome.failed > 0, "some were still queued");
    assert_eq!(failed, outcome.failed + 1, "the queued ones and the late one failed with the reason: {ended:?}");
    let completed = ended.values().filter(|o| **o == Outcome::Completed).count();
    assert_eq!(completed + failed, ended.len(), "the running job finished: {ended:?}");
    assert!(engine.capacity_bound().is_finite() && engine.capacity_bound() > 0.0, "the offline model leaves the bound");

    // Loaded again: the same stage comes back with a worker and serves.
    engine.reconfigure(models(2, &[]), "model m0 loaded").unwrap();
    assert_eq!(ready_all(&mut engine).len(), 1);
    let back = engine.submit(Submission::default());
    for _ in 0..3 {
        finish(&mut engine, &clock);
    }
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].id, &ended[0].outcome), (back, &Outcome::Completed));

    // A drain that runs out of time fails what is left of the stream, once each.
    let left: Vec<u64> = (0..3).map(|_| engine.submit(Submission { stream: 1, ..Default::default() })).collect();
    engine.flush();
    assert_eq!(engine.in_flight_of(1), 3);
    assert_eq!(engine.fail_stream(1, "model m1 was unloaded"), 3);
    assert_eq!(engine.in_flight_of(1), 0);
    finish(&mut engine, &clock);
    let ended = engine.take_ended();
    let mut ids: Vec<u64> = ended.iter().map(|e| e.id).collect();
    ids.sort();
    assert_eq!(ids, left);
    assert!(ended.iter().all(|e| matches!(&e.outcome, Outcome::Failed { error } if error == "model m1 was unloaded")), "{ended:?}");
}

#[test]
fn a_pipeline_that_moves_a_stage_or_stream_is_refused_and_nothing_changes() {
    let (mut engine, _clock) = engine(models(2, &[]));
    let error = engine.reconfigure(models(1, &[]), "shrink").unwrap_err();
    assert!(error.contains("only added"), "{error}");
    let mut renamed = models(2, &[]);
    renamed.stages[1].name = "other".into();
    renamed.streams[1].entry = 1;
    let error = engine.reconfigure(renamed, "rename").unwrap_err();
    assert!(error.contains("keeps its place"), "{error}");
    assert_eq!(engine.arm().config().stages.len(), 2);
    assert_eq!(engine.state().pipeline().stages[1].name, "m1");
}
