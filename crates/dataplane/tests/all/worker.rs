//! Workers on real models (CPU): batching equivalence, abort of a running batch, warm
//! and cold replica starts, reconfiguration and retirement, and a stateful model's
//! sequence state.

use crate::common;

use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use yardmaster_dataplane::session::StartKind;
use yardmaster_dataplane::{assets, device, Device, Job, ModelSpec, Request, Tensor, Worker, WorkerContext, WorkerEvent};

const WAIT: Duration = Duration::from_secs(120);

fn context() -> WorkerContext {
    WorkerContext { runtime: common::runtime(), cache: common::cache() }
}

/// Deterministic pseudo-random input in [-1, 1] (the profiler's synthetic inputs).
fn input(shape: &[usize], seed: u64) -> Tensor {
    yardmaster_dataplane::profile::synthetic(shape, seed)
}

fn job(id: u64, shape: &[usize], n: usize) -> Job {
    Job { id, requests: (0..n).map(|i| Request::new(i as u64, vec![input(shape, id * 100 + i as u64)])).collect() }
}

fn ready(events: &Receiver<WorkerEvent>) -> (StartKind, Duration) {
    match events.recv_timeout(WAIT).expect("an event") {
        WorkerEvent::Ready { kind, took, .. } => (kind, took),
        other => panic!("expected Ready, got {other:?}"),
    }
}

fn next(events: &Receiver<WorkerEvent>) -> WorkerEvent {
    events.recv_timeout(WAIT).expect("an event")
}

fn finished(events: &Receiver<WorkerEvent>) -> Vec<Vec<Tensor>> {
    match next(events) {
        WorkerEvent::Finished { result, .. } => result.unwrap().into_iter().map(|r| r.outputs).collect(),
        other => panic!("expected Finished, got {other:?}"),
    }
}

fn batch_equals_single_runs(spec: ModelSpec, shape: &[usize], n: usize) {
    let (tx, events) = mpsc::channel();
    let worker = Worker::provision(1, spec, 1, context(), tx);
    ready(&events);
    let batch = job(7, shape, n);
    worker.start(batch.clone()).unwrap();
    let batched = finished(&events);
    assert_eq!(batched.len(), n);
    // On the CPU a batch computes what single runs compute up to summation order. On a
    // GPU, cuDNN and cuBLAS pick other kernels for other batch sizes, and ONNX Runtime's
    // CUDA provider lets them use TF32 (a 10-bit mantissa: relative error ~1e-3), so the
    // outputs (probabilities here) agree to a few thousandths.
    let tolerance = match common::runtime().device() {
        Device::Cpu => 1e-4,
        Device::Cuda(_) => 5e-3,
    };
    for (i, request) in batch.requests.into_iter().enumerate() {
        worker.start(Job { id: 100 + i as u64, requests: vec![request] }).unwrap();
        let single = finished(&events).remove(0);
        for (a, b) in batched[i].iter().zip(&single) {
            assert_eq!(a.shape, b.shape);
            let diff = a.max_abs_diff(b);
            assert!(diff < tolerance, "request {i}: batched and single outputs differ by {diff} (tolerance {tolerance})");
        }
    }
    // Distinct inputs give outputs further apart than the tolerance, so the comparison
    // above would see requests mixed up.
    let gap = batched[0][0].max_abs_diff(&batched[1][0]);
    assert!(gap > tolerance.max(1e-3), "distinct requests' outputs differ by only {gap}");
}

#[test]
fn a_batch_of_n_equals_n_single_runs_classifier() {
    batch_equals_single_runs(common::model(assets::CLS_MODEL, "cls"), &[3, 48, 192], 4);
}

#[test]
fn a_batch_of_n_equals_n_single_runs_recogniser() {
    batch_equals_single_runs(common::model(assets::REC_MODEL, "rec"), &[3, 48, 320], 3);
}

#[test]
fn a_batch_of_large_requests_equals_single_runs_detector() {
    // 1.2 MB per request: on a GPU these batches are stacked straight into device
    // memory (requests of 1 MiB and more), on the CPU in host memory.
    batch_equals_single_runs(common::model(assets::DET_MODEL, "det"), &[3, 320, 320], 2);
}

#[test]
fn requests_of_different_sizes_are_padded_into_one_batch() {
    let (tx, events) = mpsc::channel();
    let worker = Worker::provision(1, common::model(assets::REC_MODEL, "rec"), 1, context(), tx);
    ready(&events);
    let requests = vec![Request::new(10, vec![input(&[3, 48, 160], 1)]), Request::new(11, vec![input(&[3, 48, 320], 2)])];
    worker.start(Job { id: 1, requests }).unwrap();
    match next(&events) {
        WorkerEvent::Finished { job, result, .. } => {
            let outputs = result.unwrap();
            assert_eq!(job, 1);
            assert_eq!(outputs.iter().map(|o| o.id).collect::<Vec<_>>(), vec![10, 11]);
            // Both padded to the widest: the recogniser's time steps match.
            assert_eq!(outputs[0].outputs[0].shape, outputs[1].outputs[0].shape);
        }
        other => panic!("{other:?}"),
    }
    // A request whose channel count the model fixes at 3 is refused with a clear error.
    worker.start(Job { id: 2, requests: vec![Request::new(12, vec![input(&[4, 48, 320], 3)])] }).unwrap();
    match next(&events) {
        WorkerEvent::Finished { result: Err(error), .. } => assert!(error.to_string().contains("fixes it at 3"), "{error}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn abort_stops_a_running_batch() {
    let (tx, events) = mpsc::channel();
    let worker = Worker::provision(1, common::model(assets::DET_MODEL, "det"), 1, context(), tx);
    ready(&events);
    // Calibrate: one image of the size used below.
    let shape = [3, 960, 960];
    let begin = Instant::now();
    worker.start(job(1, &shape, 1)).unwrap();
    finished(&events);
    let one = begin.elapsed();
    // A batch of 6 takes about six times as long; abort it shortly after it starts.
    worker.start(job(2, &shape, 6)).unwrap();
    std::thread::sleep(one / 2);
    let aborted_at = Instant::now();
    assert_eq!(worker.abort(), Some(2));
    match next(&events) {
        WorkerEvent::Aborted { job, .. } => assert_eq!(job, 2),
        other => panic!("expected Aborted, got {other:?}"),
    }
    let stop = aborted_at.elapsed();
    eprintln!("one image {one:?}; abort took effect after {stop:?}");
    assert!(stop < one * 2, "the abort took {stop:?}; the whole batch would take about {:?}", one * 6);
    // An abort right after the hand-over stops the job before it runs.
    worker.start(job(3, &shape, 1)).unwrap();
    assert_eq!(worker.abort(), Some(3));
    assert!(matches!(next(&events), WorkerEvent::Aborted { job: 3, .. }));
    // The worker carries on.
    worker.start(job(4, &[3, 64, 64], 1)).unwrap();
    assert_eq!(finished(&events).len(), 1);
    assert_eq!(worker.abort(), None, "nothing left to abort");
}

#[test]
fn a_cache_warm_replica_starts_faster_than_a_cold_one() {
    let spec = common::model(assets::REC_MODEL, "rec");
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for round in 0..3 {
        // A fresh cache: the first replica starts cold, the second warm.
        let context = context();
        let (tx, events) = mpsc::channel();
        let first = Worker::provision(round * 2, spec.clone(), 1, context.clone(), tx.clone());
        let (kind, took) = ready(&events);
        assert_eq!(kind, StartKind::Cold);
        cold.push(took);
        assert_eq!(context.cache.len(), 1, "the cold start filled the cache");
        let second = Worker::provision(round * 2 + 1, spec.clone(), 1, context.clone(), tx);
        let (kind, took) = ready(&events);
        assert_eq!(kind, StartKind::Warm);
        warm.push(took);
        // The warm replica computes what the cold one does.
        first.start(job(5, &[3, 48, 320], 1)).unwrap();
        let from_cold = finished(&events);
        second.start(job(5, &[3, 48, 320], 1)).unwrap();
        let from_warm = finished(&events);
        assert!(from_cold[0][0].max_abs_diff(&from_warm[0][0]) < 1e-5);
    }
    let (cold, warm) = (cold.iter().min().unwrap(), warm.iter().min().unwrap());
    eprintln!("replica start: cold {cold:?}, warm {warm:?}");
    assert!(warm < cold, "warm {warm:?} should beat cold {cold:?}");
}

#[test]
fn threads_and_variants_change_by_rebuilding_from_the_cache() {
    let (tx, events) = mpsc::channel();
    let worker = Worker::provision(3, common::model(assets::CLS_MODEL, "cls"), 1, context(), tx);
    ready(&events);
    worker.set_threads(2).unwrap();
    match next(&events) {
        WorkerEvent::Reconfigured { worker, threads, .. } => assert_eq!((worker, threads), (3, 2)),
        other => panic!("{other:?}"),
    }
    worker.set_model(common::model(assets::REC_MODEL, "rec")).unwrap();
    match next(&events) {
        WorkerEvent::Reconfigured { model, threads, .. } => assert_eq!((model.model.as_str(), threads), ("rec", 2)),
        other => panic!("{other:?}"),
    }
    worker.start(job(1, &[3, 48, 320], 2)).unwrap();
    let out = finished(&events);
    assert_eq!(out[0][0].shape[1], 6625, "the recogniser's classes: it now runs the new variant");
    worker.retire();
    assert!(matches!(next(&events), WorkerEvent::Retired { worker: 3 }));
}

#[test]
fn a_missing_model_fails_the_start_with_its_path() {
    let (tx, events) = mpsc::channel();
    let spec = ModelSpec::new(yardmaster_dataplane::ModelKey::new("nothing", "v"), "/nonexistent/model.onnx");
    let _worker = Worker::provision(9, spec, 1, context(), tx);
    match next(&events) {
        WorkerEvent::StartFailed { worker, error } => {
            assert_eq!(worker, 9);
            assert!(error.to_string().contains("/nonexistent/model.onnx"), "{error}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_device_choice_falls_back_to_the_cpu_with_a_reason() {
    let runtime = common::runtime();
    match device::discover_gpus() {
        Err(why) => {
            eprintln!("no GPU here ({why}): checking the CPU fallback");
            let choice = device::choose(yardmaster_dataplane::DevicePreference::Cuda(0));
            assert_eq!(choice.device, yardmaster_dataplane::Device::Cpu);
            assert_eq!(choice.reason, why);
            assert_eq!(runtime.device(), yardmaster_dataplane::Device::Cpu);
        }
        Ok(gpus) => eprintln!("GPUs present ({gpus:?}): the fallback is not exercised here; see tests/gpu.rs"),
    }
}

#[test]
fn a_pool_maps_the_engines_operations_onto_workers() {
    use yardmaster_dataplane::{ModelCatalog, WorkerPool};
    let catalog = ModelCatalog {
        stages: vec![
            vec![common::model(assets::CLS_MODEL, "cls")],
            vec![common::model(assets::REC_MODEL, "rec-a"), common::model(assets::REC_MODEL, "rec-b")],
        ],
    };
    let (mut pool, events) = WorkerPool::new(context(), catalog, 1);
    pool.provision(1, 1, 0).unwrap();
    assert_eq!(ready(&events).0, StartKind::Cold);
    pool.provision(2, 1, 0).unwrap();
    assert_eq!(ready(&events).0, StartKind::Warm, "a second replica of a loaded model starts from memory");
    assert!(pool.provision(3, 5, 0).is_err(), "unknown stage");
    pool.start(2, job(1, &[3, 48, 320], 2)).unwrap();
    match next(&events) {
        WorkerEvent::Finished { worker, job, result, .. } => {
            assert_eq!((worker, job), (2, 1));
            assert_eq!(result.unwrap().len(), 2);
        }
        other => panic!("{other:?}"),
    }
    pool.set_variant(2, 1).unwrap();
    match next(&events) {
        WorkerEvent::Reconfigured { worker, model, .. } => assert_eq!((worker, model.model.as_str()), (2, "rec-b")),
        other => panic!("{other:?}"),
    }
    assert!(pool.set_variant(2, 7).is_err(), "unknown variant");
    assert_eq!(pool.abort(2), None);
    assert!(pool.start(9, job(2, &[3, 48, 320], 1)).is_err(), "unknown worker");
    pool.retire(1);
    assert!(matches!(next(&events), WorkerEvent::Retired { worker: 1 }));
    assert_eq!(pool.len(), 1);
}

/// Dropping a pool waits until every worker thread has ended — one that was retired
/// while running a batch, one still loading its model — so a process that exits next
/// does not tear ONNX Runtime down under a session being destroyed (on the GPU that
/// crashed `serve` at exit). Once the pool is gone, every sender of the event channel
/// is gone too: the channel is closed at once, not merely quiet.
#[test]
fn dropping_a_pool_waits_for_every_worker_thread() {
    use std::sync::mpsc::RecvTimeoutError;
    use yardmaster_dataplane::{ModelCatalog, WorkerPool};
    let catalog =
        ModelCatalog { stages: vec![vec![common::model(assets::DET_MODEL, "det")], vec![common::model(assets::REC_MODEL, "rec")]] };
    let (mut pool, events) = WorkerPool::new(context(), catalog, 1);
    pool.provision(1, 0, 0).unwrap();
    ready(&events);
    pool.start(1, job(1, &[3, 736, 736], 4)).unwrap();
    pool.retire(1); // retired mid-batch: the batch runs on, the thread ends after it
    pool.provision(2, 1, 0).unwrap(); // dropped while it loads
    drop(pool);
    let mut retired = Vec::new();
    loop {
        match events.recv_timeout(Duration::ZERO) {
            Ok(WorkerEvent::Retired { worker }) => retired.push(worker),
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("a worker thread outlived its pool (retired so far: {retired:?})"),
        }
    }
    retired.sort_unstable();
    assert_eq!(retired, [1, 2], "each worker said it retired before its thread ended");
}

/// A worker warms its session up with one run before it reports ready (the
/// detector and the classifier have dynamic per-request shapes: the warm-up gives each
/// dynamic dimension 32), and a warmed-up session's first job runs about as fast as
/// later ones.
#[test]
fn a_session_is_warmed_up_with_one_run() {
    use yardmaster_dataplane::session::ModelSession;
    use yardmaster_dataplane::worker::warm_up;
    let runtime = common::runtime();
    let start = |file, name| ModelSession::start(&runtime, &common::cache(), &common::model(file, name), 1).unwrap().session;
    let mut detector = start(assets::DET_MODEL, "det");
    assert!(warm_up(&mut detector).is_some(), "the detector warms up");
    let mut warmed = start(assets::CLS_MODEL, "cls");
    let took = warm_up(&mut warmed).expect("the classifier warms up");
    // What the warm-up saves: a fresh session's first run against its second.
    let timed = |session: &mut ModelSession, inputs: &[Tensor]| {
        let begin = Instant::now();
        session.run_batch(&[inputs], None).unwrap();
        begin.elapsed()
    };
    let inputs = vec![input(&[3, 48, 192], 3)];
    let mut fresh = start(assets::CLS_MODEL, "cls");
    let (first, second) = (timed(&mut fresh, &inputs), timed(&mut fresh, &inputs));
    let after_warm_up = timed(&mut warmed, &inputs);
    eprintln!("cls: a fresh session's first run {first:?}, its second {second:?}; a warmed-up session's first job {after_warm_up:?} (warm-up {took:?})");
}

/// Silero's voice-activity detector (the `silero-vad` wheel): its recurrent state is an
/// input (`state`) and an output (`stateN`), kept by the worker per sequence.
fn stateful_vad() -> ModelSpec {
    use yardmaster_dataplane::sequence::{SequenceSpec, State};
    let path = assets::assets_dir().join("silero-vad-6.2.3/silero_vad_16k_op15.onnx");
    assert!(path.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", path.display());
    let mut spec = ModelSpec::new(yardmaster_dataplane::ModelKey::new("vad", "1"), path);
    let state = State {
        input: "state".into(),
        output: "stateN".into(),
        element: yardmaster_dataplane::ElementType::F32,
        shape: vec![2, 1, 128],
        initial: Vec::new(),
    };
    spec.sequence = Some(SequenceSpec { controls: Vec::new(), states: vec![state], idle: Duration::from_secs(60) });
    spec
}

#[test]
fn a_stateful_worker_carries_each_sequence_s_state_and_drops_it_when_released() {
    use yardmaster_dataplane::{SequenceStep, TensorData};
    let (tx, events) = mpsc::channel();
    let spec = stateful_vad();
    let worker = Worker::provision(1, spec.clone(), 1, context(), tx);
    ready(&events);
    let chunk = |k: u64| input(&[1, 512], 900 + k);
    let sr = || Tensor::new(vec![], TensorData::from_vec(vec![16000i64])).unwrap();
    let step = |id: u64, start: bool| Some(SequenceStep { id, label: None, start, end: false });
    let run = |job: u64, id: u64, start: bool, k: u64| {
        let request = Request { id: job, inputs: vec![chunk(k), sr()], sequence: step(id, start) };
        worker.start(Job { id: job, requests: vec![request] }).unwrap();
        next(&events)
    };
    // The reference: ONNX Runtime with the state carried by hand.
    let mut session = yardmaster_dataplane::ModelSession::from_file(&common::runtime(), &ModelSpec { sequence: None, ..spec }, 1).unwrap();
    let mut state = Tensor::new(vec![2, 1, 128], vec![0.0f32; 256]).unwrap();
    for (job, k) in [(1, 0), (2, 1), (3, 2)] {
        let mut expected = session.run(&[chunk(k), state, sr()], None).unwrap();
        state = expected.remove(1);
        match run(job, 5, job == 1, k) {
            WorkerEvent::Finished { result, .. } => {
                let outputs = result.unwrap().remove(0).outputs;
                assert_eq!(outputs.len(), 1, "the state output is kept, not answered");
                assert_eq!(outputs[0].data.bytes(), expected[0].data.bytes(), "chunk {k}: the state carried from the previous request");
            }
            other => panic!("{other:?}"),
        }
    }
    worker.release_sequence(5).unwrap();
    match run(4, 5, false, 3) {
        WorkerEvent::Finished { result: Err(error), .. } => {
            assert!(error.to_string().contains("sequence 5: this worker holds no state"), "{error}")
        }
        other => panic!("a released sequence's state is gone: {other:?}"),
    }
    match run(5, 6, false, 0) {
        WorkerEvent::Finished { result: Err(error), .. } => assert!(error.to_string().contains("sequence 6"), "{error}"),
        other => panic!("a sequence that never started has no state: {other:?}"),
    }
}
