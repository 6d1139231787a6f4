//! The serving stack end to end on the real ONNX Runtime library and models:
//! `EngineBackend` → engine actor → a shipped policy (`edf`) → `OnnxExecutor` →
//! workers, and back. Covers a real OCR request, concurrency and batching, a dropped
//! request, malformed input, a worker that cannot start, and a client that goes away.

use crate::common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Map;
use yardmaster::engine::EngineOptions;
use yardmaster::serve::api::{Backend, InferError};
use yardmaster::serve::backend::EngineBackend;
use yardmaster::serve::executor::{Placement, ServeActor, WorkerStatus};
use yardmaster::serve::kserve::{DataType, InferRequest, Schedule, Tensor, TensorData};
use yardmaster::serve::stack::{PolicyChoice, ServedPipeline, ServingStack};
use yardmaster::serve::workers::Workers;
use yardmaster_dataplane::ocr::RgbImage;
use yardmaster_dataplane::{Job, ModelKey, ModelSpec, WorkerContext, WorkerEvent};

fn context() -> WorkerContext {
    WorkerContext { runtime: common::runtime(), cache: common::cache() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A folder of this test's own for the trivial model, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("yardmaster-serve-executor-{}-{name}", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(served: ServedPipeline, placements: Vec<Placement>) -> (ServeActor, Arc<EngineBackend>) {
    let policy = PolicyChoice::shipped("edf").unwrap();
    let (actor, backend) = ServingStack::start(served, policy, EngineOptions::default(), context(), placements).unwrap();
    (actor, Arc::new(backend))
}

fn request(inputs: Vec<Tensor>, timeout_us: Option<u64>) -> InferRequest {
    InferRequest {
        id: Some("r".into()),
        schedule: Schedule { priority: None, timeout_us, split_key: None, sequence: None },
        parameters: Map::new(),
        inputs,
        outputs: Vec::new(),
    }
}

fn image_tensor(image: &RgbImage) -> Tensor {
    Tensor::raw("image", DataType::U8, vec![image.height as u64, image.width as u64, 3], image.data.clone()).unwrap()
}

fn tiny_input(values: [f32; 4]) -> Tensor {
    Tensor::f32("x", vec![1, 4], &values).unwrap()
}

fn normalised(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_uppercase()
}

/// Run a future with a bound: a request that hangs fails the test instead.
fn bounded<F: Future>(rt: &tokio::runtime::Runtime, seconds: u64, future: F) -> F::Output {
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(seconds), future).await.expect("no answer in time: a request hangs") })
}

/// (arrivals, ended, completed, jobs started, requests in flight) as the engine counts them.
fn counts(actor: &ServeActor) -> (u64, u64, u64, u64, usize) {
    actor
        .handle()
        .inspect(|engine| {
            let overall = engine.accounting().summary(engine.state().now()).overall;
            (overall.arrivals, overall.ended, overall.completed, engine.stats().jobs, engine.in_flight())
        })
        .unwrap()
}

#[test]
fn images_are_read_through_the_whole_stack() {
    let context = context();
    let served = ServedPipeline::ocr(&context).unwrap_or_else(|e| panic!("{e}"));
    let stages: Vec<&str> = served.pipeline.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(stages, ["det", "cls", "rec"], "the shipped repository's steps keep their models' names");
    let models: Vec<(&str, u32)> = served.models.iter().map(|m| (m.name.as_str(), m.stream)).collect();
    assert_eq!(models, [("ocr", 0), ("cls", 0), ("det", 0), ("rec", 0)], "the steps are described, on the ensemble's stream");
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let pages: [(&[&str], usize, usize); 2] =
        [(&["INVOICE 2026-11", "Total due 1234", "Thank you"], 736, 736), (&["Second page 42"], 520, 200)];
    let begin = Instant::now();
    // Both at once, so detection may batch a large and a small image together.
    let answers = bounded(&rt, 120, async {
        let tasks: Vec<_> = pages
            .iter()
            .map(|(lines, width, height)| {
                let image = common::render(lines, 36.0, *width, *height, 40.0, 40.0);
                let backend = Arc::clone(&backend);
                tokio::spawn(async move { backend.infer("ocr", request(vec![image_tensor(&image)], Some(60_000_000))).await })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        answers
    });
    eprintln!("two OCR requests through the stack: {:?}", begin.elapsed());
    for ((lines, _, _), answer) in pages.iter().zip(answers) {
        let response = answer.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(response.model_name, "ocr");
        assert_eq!(response.id.as_deref(), Some("r"));
        let TensorData::Strings(texts) = &response.outputs[0].data else { panic!("texts are BYTES") };
        let texts: Vec<String> = texts.iter().map(|t| normalised(&String::from_utf8_lossy(t))).collect();
        let expected: Vec<String> = lines.iter().map(|l| normalised(l)).collect();
        assert_eq!(texts, expected);
        let scores = response.outputs[1].as_f32().unwrap();
        assert!(scores.len() == lines.len() && scores.iter().all(|&s| s > 0.5), "{scores:?}");
        assert_eq!(response.outputs[2].shape, vec![lines.len() as u64, 4, 2]);
    }
    assert!(backend.store().is_empty(), "answered requests leave nothing behind");
    let (arrivals, ended, completed, _, in_flight) = counts(&actor);
    assert_eq!((arrivals, ended, completed, in_flight), (2, 2, 2, 0));
    actor.shutdown("test over");
}

#[test]
fn concurrent_tiny_requests_end_once_each_and_are_batched() {
    let dir = Scratch::new("batched");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let answers = bounded(&rt, 60, async {
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let backend = Arc::clone(&backend);
                let x = [i as f32, i as f32 + 0.5, -(i as f32), 2.0];
                tokio::spawn(async move { (x, backend.infer("tiny", request(vec![tiny_input(x)], None)).await) })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        answers
    });
    for (x, answer) in answers {
        let response = answer.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(response.outputs[0].name, "y");
        let expected: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
        assert_eq!(response.outputs[0].as_f32().unwrap(), expected, "each request gets its own row back");
    }
    let (arrivals, ended, completed, jobs, in_flight) = counts(&actor);
    assert_eq!((arrivals, ended, completed, in_flight), (32, 32, 32, 0), "each request ended exactly once");
    eprintln!("32 concurrent requests ran in {jobs} jobs");
    assert!(jobs < 32, "32 requests arriving together ran in {jobs} jobs: they were batched");
    assert!(backend.store().is_empty());
    actor.shutdown("test over");
}

#[test]
fn one_request_at_a_time_measures_the_overhead_beyond_the_model() {
    let dir = Scratch::new("latency");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let mut took = Vec::new();
    for i in 0..300 {
        let begin = Instant::now();
        let response = bounded(&rt, 10, backend.infer("tiny", request(vec![tiny_input([i as f32; 4])], None))).unwrap();
        took.push(begin.elapsed());
        assert_eq!(response.outputs[0].as_f32().unwrap(), vec![i as f32 + 1.0; 4]);
    }
    // The first requests wait for the model to load.
    let mut steady = took[50..].to_vec();
    steady.sort();
    let (p50, p99) = (steady[steady.len() / 2], steady[steady.len() * 99 / 100]);
    eprintln!("tiny model through backend, engine, policy and worker, one at a time: p50 {p50:?}, p99 {p99:?} (model alone: ~8 µs)");
    assert!(p50 < Duration::from_millis(50), "p50 {p50:?}");
    actor.shutdown("test over");
}

#[test]
fn an_impossible_deadline_is_dropped_with_its_reason() {
    let dir = Scratch::new("deadline");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let answer = bounded(&rt, 30, backend.infer("tiny", request(vec![tiny_input([1.0; 4])], Some(1))));
    match answer {
        Err(InferError::Dropped(reason)) => assert!(reason.contains("deadline"), "{reason}"),
        other => panic!("a 1 µs deadline must be dropped, got {other:?}"),
    }
    // The stack serves on.
    let ok = bounded(&rt, 30, backend.infer("tiny", request(vec![tiny_input([1.0; 4])], None))).unwrap();
    assert_eq!(ok.outputs[0].as_f32().unwrap(), vec![2.0; 4]);
    assert!(backend.store().is_empty());
    actor.shutdown("test over");
}

#[test]
fn malformed_requests_are_refused_with_the_reason() {
    let dir = Scratch::new("malformed");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let cases = [
        ("tiny", vec![Tensor::f32("z", vec![4], &[0.0; 4]).unwrap()], "no input \"z\""),
        ("tiny", vec![Tensor::raw("x", DataType::I32, vec![4], vec![0; 16]).unwrap()], "must be FP32"),
        ("tiny", vec![Tensor::f32("x", vec![2, 2], &[0.0; 4]).unwrap()], "must have shape [-1, 4]"),
        ("tiny", vec![], "input \"x\" is missing"),
        ("nope", vec![tiny_input([0.0; 4])], "Request for unknown model: 'nope' is not found"),
    ];
    for (model, inputs, reason) in cases {
        match bounded(&rt, 10, backend.infer(model, request(inputs, None))) {
            Err(InferError::Invalid(message)) => assert!(message.contains(reason), "{message:?} should say {reason:?}"),
            other => panic!("expected Invalid({reason:?}), got {other:?}"),
        }
    }
    let (arrivals, ..) = counts(&actor);
    assert_eq!(arrivals, 0, "nothing malformed reaches the engine");
    actor.shutdown("test over");
}

#[test]
fn a_worker_that_cannot_start_fails_requests_with_the_error() {
    let dir = Scratch::new("missing");
    let mut served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let missing = dir.0.join("no-such-model.onnx");
    served.catalog.stages[0][0] = ModelSpec::new(ModelKey::new("tiny", "missing"), &missing);
    let (actor, backend) = start(served, Vec::new());
    let rt = runtime();
    let answers = bounded(&rt, 30, async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let backend = Arc::clone(&backend);
                tokio::spawn(async move { backend.infer("tiny", request(vec![tiny_input([0.0; 4])], None)).await })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        answers
    });
    for answer in answers {
        match answer {
            Err(InferError::Failed(error)) => {
                assert!(error.contains("could not start") && error.contains("no-such-model.onnx"), "{error}")
            }
            other => panic!("expected a failure naming the missing model, got {other:?}"),
        }
    }
    assert!(!backend.ready(), "a stage without a working worker is not ready");
    assert!(matches!(backend.board().status(0), Some(WorkerStatus::Failed(_))));
    let (arrivals, ended, completed, _, in_flight) = counts(&actor);
    assert_eq!((arrivals, ended, completed, in_flight), (4, 4, 0, 0));
    actor.shutdown("test over");
}

/// Workers that take jobs and never finish them (a stalled remote host, say).
struct Stalled {
    jobs: Arc<Mutex<Vec<u64>>>,
    _events: mpsc::Sender<WorkerEvent>,
}

impl Workers for Stalled {
    fn provision(&mut self, _: u32, _: u32, _: u32) -> yardmaster_dataplane::Result<()> {
        Ok(())
    }
    fn start(&mut self, _: u32, job: Job) -> yardmaster_dataplane::Result<()> {
        self.jobs.lock().unwrap().push(job.id);
        Ok(())
    }
    fn abort(&mut self, _: u32) -> Option<u64> {
        None
    }
    fn retire(&mut self, _: u32) {}
    fn set_threads(&mut self, _: u32, _: u32) -> yardmaster_dataplane::Result<()> {
        Ok(())
    }
    fn set_variant(&mut self, _: u32, _: u32) -> yardmaster_dataplane::Result<()> {
        Ok(())
    }
}

#[test]
fn a_client_that_goes_away_cancels_its_request() {
    let dir = Scratch::new("cancel");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (sender, events) = mpsc::channel();
    let jobs = Arc::new(Mutex::new(Vec::new()));
    let stalled = Stalled { jobs: Arc::clone(&jobs), _events: sender };
    let (actor, backend) = start(served, vec![Placement { stages: vec![0], workers: Box::new(stalled), events: events.into() }]);
    let rt = runtime();
    let gave_up = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(200), backend.infer("tiny", request(vec![tiny_input([0.0; 4])], None))).await
    });
    assert!(gave_up.is_err(), "the stalled worker never answers");
    assert_eq!(jobs.lock().unwrap().len(), 1, "the request reached the worker");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (reasons, in_flight) =
            actor.handle().inspect(|e| (e.accounting().summary(e.state().now()).drop_reasons, e.in_flight())).unwrap();
        // The answer (which releases the data) follows the engine's end within the
        // actor's turn, so wait for both.
        if in_flight == 0 && backend.store().is_empty() {
            assert_eq!(reasons.get("cancelled by the client"), Some(&1), "{reasons:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned request is still held (in flight: {in_flight}, data parked: {})",
            backend.store().len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    actor.shutdown("test over");
}

#[test]
fn a_pipeline_file_serves_pp_ocr_with_its_own_profiles_and_refuses_other_stages() {
    let scratch = Scratch::new("pipeline-file");
    std::fs::create_dir_all(&scratch.0).unwrap();
    let context = context();
    // The preset with the detector's profile of another machine (as scripts/gpu-check.sh
    // writes one from `yardmaster profile` on a GPU).
    let preset = yardmaster_formats::presets::OCR_PRESET;
    let measured = preset.replace(
        "profile_ms = [[1, 160.4, 191.7], [2, 336.0, 486.4], [4, 737.6, 923.7]]",
        "profile_ms = [[1, 4.0, 5.0], [2, 6.0, 7.5], [4, 10.0, 12.0], [8, 18.0, 21.0]]",
    );
    assert_ne!(measured, preset, "the preset's detector profile changed: update this test");
    let file = scratch.0.join("ocr-measured.toml");
    std::fs::write(&file, measured.replace("max_batch = 4", "max_batch = 8")).unwrap();
    let served = yardmaster::serve::server::served_pipeline(file.to_str().unwrap(), &context).unwrap_or_else(|e| panic!("{e}"));
    let det = &served.pipeline.stages[0];
    assert_eq!((det.name.as_str(), det.max_batch), ("det", 8));
    assert_eq!(det.variants[0].profile.mean(8), 18_000_000, "the file's own points, in nanoseconds");
    assert_eq!(served.models[0].name, "ocr");
    let cls = &served.pipeline.stages[1];
    assert_eq!((cls.name.as_str(), cls.successors.clone(), cls.predecessors.clone()), ("cls", vec![2], vec![0]), "edges kept");

    let other = scratch.0.join("other.toml");
    std::fs::write(&other, preset.replace("name = \"det\"", "name = \"detect\"").replace("\"det\"", "\"detect\"")).unwrap();
    let error = yardmaster::serve::server::served_pipeline(other.to_str().unwrap(), &context).unwrap_err().to_string();
    assert!(error.contains("stage \"detect\" is not served") && error.contains("other.toml"), "{error}");
    let missing = yardmaster::serve::server::served_pipeline("/nonexistent/ocr.toml", &context).unwrap_err().to_string();
    assert!(missing.contains("reading the pipeline file /nonexistent/ocr.toml"), "{missing}");
}

/// A preemption that comes after the worker's job result was already claimed (on its
/// way to the engine) leaves that result to be refused: it must not end the worker's
/// next job (which once failed requests with "the worker reported no result for it").
/// An abort that claims the running job leaves nothing to refuse.
#[test]
fn a_preempted_job_s_late_result_is_refused_once() {
    use yardmaster::engine::{Executor, JobResult};
    let dir = Scratch::new("late-result");
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let (actor, backend) = start(served, Vec::new());
    // One request first: the worker has loaded its model (and no job runs after it).
    let rt = runtime();
    let answer = bounded(&rt, 60, backend.infer("tiny", request(vec![tiny_input([1.0, 2.0, 3.0, 4.0])], None)));
    assert!(answer.is_ok(), "{answer:?}");
    let answers = actor
        .handle()
        .inspect(|engine| {
            let worker = *engine.state().workers().keys().next().expect("the tiny stage has a worker");
            let late = JobResult { worker, duration: 1_000, items: Vec::new() };
            let mut executor = engine.executor().borrow_mut();
            // No job runs on the worker: its last result is on its way.
            executor.abort(worker);
            let first = executor.accept_result(&late);
            let second = executor.accept_result(&late);
            (first, second)
        })
        .unwrap();
    assert_eq!(answers, (false, true), "the late result is refused, the next one accepted");
    actor.shutdown("test over");
}
