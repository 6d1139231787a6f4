//! The data-plane benchmark: throughput of a model served through a [`Worker`] (jobs of
//! per-request tensors handed over a channel, stacked, run with abortable run options,
//! split back, reported as events) against a plain ONNX Runtime `Run` loop on one
//! pre-stacked batch of the same model, in the same process, in alternating rounds so
//! drift in the machine's load hits both alike; plus replica start cold and warm.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;

use crate::batch;
use crate::cache::ModelCache;
use crate::error::{DataplaneError, Result};
use crate::profile::{request_shapes, synthetic};
use crate::runtime::Runtime;
use crate::session::{register_device, BatchTiming, ModelSession, ModelSpec};
use crate::tensor::Tensor;
use crate::worker::{Job, Request, Worker, WorkerContext, WorkerEvent};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Requests per batch.
    pub batch: usize,
    /// Per-request input shapes (`None`: the model's own, fully fixed).
    pub shapes: Option<Vec<Vec<usize>>>,
    /// Batches per round and side.
    pub runs: usize,
    /// Rounds (each runs the plain loop, then the served path).
    pub rounds: usize,
    /// Intra-op threads for both sides.
    pub threads: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { batch: 6, shapes: None, runs: 20, rounds: 3, threads: 1 }
    }
}

/// Measured numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Requests per batch.
    pub batch: usize,
    /// Plain loop, requests per second (all rounds).
    pub plain_rps: f64,
    /// Served through a worker, requests per second (all rounds).
    pub served_rps: f64,
    /// Per-round served / plain ratios.
    pub round_ratios: Vec<f64>,
    /// Median replica start from disk.
    pub cold_start: Duration,
    /// Median replica start from the host-memory cache.
    pub warm_start: Duration,
    /// The device both sides ran on.
    pub device: String,
    /// Where a served batch's time goes (mean over one round of `run_batch` on the
    /// benchmark's thread): stacking, ONNX Runtime's `Run`, splitting the outputs.
    pub served_breakdown: BatchTiming,
    /// The plain loop's mean time per batch.
    pub plain_batch: Duration,
    /// The served side's mean time per batch, handing the job over to the result back.
    pub served_batch: Duration,
    /// Of that, the mean time the worker spent in the batch itself (as it reports it).
    pub worker_batch: Duration,
}

impl BenchReport {
    /// Served throughput over plain throughput (target ≥ 0.95).
    pub fn ratio(&self) -> f64 {
        self.served_rps / self.plain_rps
    }

    /// A human-readable summary.
    pub fn render(&self) -> String {
        format!(
            "{}, batch {}: plain ONNX Runtime Run loop {:.1} req/s, served through a worker {:.1} req/s, ratio {:.3} (per round {:?})\nserved batch: {:.3} ms round trip, {:.3} ms in the worker (on this thread: stack {:.3} ms, Run {:.3} ms, split {:.3} ms); plain Run {:.3} ms\nreplica start: cold {:.1} ms, warm {:.1} ms ({:.1}x faster)\n",
            self.device,
            self.batch,
            self.plain_rps,
            self.served_rps,
            self.ratio(),
            self.round_ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            self.served_batch.as_secs_f64() * 1e3,
            self.worker_batch.as_secs_f64() * 1e3,
            self.served_breakdown.stack.as_secs_f64() * 1e3,
            self.served_breakdown.run.as_secs_f64() * 1e3,
            self.served_breakdown.split.as_secs_f64() * 1e3,
            self.plain_batch.as_secs_f64() * 1e3,
            self.cold_start.as_secs_f64() * 1e3,
            self.warm_start.as_secs_f64() * 1e3,
            self.cold_start.as_secs_f64() / self.warm_start.as_secs_f64()
        )
    }
}

/// Run the benchmark on `spec`.
pub fn served_vs_plain(runtime: &Arc<Runtime>, spec: &ModelSpec, options: &BenchOptions) -> Result<BenchReport> {
    let cache = Arc::new(ModelCache::default());
    // Replica starts (median of three, each cold from a fresh cache, then warm).
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let fresh = ModelCache::default();
        cold.push(ModelSession::start(runtime, &fresh, spec, options.threads)?.took);
        warm.push(ModelSession::start(runtime, &fresh, spec, options.threads)?.took);
    }
    cold.sort();
    warm.sort();

    // The plain side: ONNX Runtime directly, one pre-stacked batch, `Run` in a loop, on
    // the same device with the same execution provider options as the workers.
    let mut builder = Session::builder(runtime.environment())
        .map_err(DataplaneError::ort)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(DataplaneError::ort)?;
    if options.threads > 0 {
        builder = builder.with_intra_threads(options.threads).map_err(DataplaneError::ort)?;
    }
    let mut builder = register_device(builder, runtime)?;
    let mut plain = builder.commit_from_file(&spec.path).map_err(DataplaneError::ort)?;
    let probe = ModelSession::start(runtime, &cache, spec, options.threads)?.session;
    let shapes = request_shapes(probe.inputs(), options.shapes.as_deref())?;
    let requests: Vec<Vec<Tensor>> =
        (0..options.batch).map(|i| shapes.iter().enumerate().map(|(k, s)| synthetic(s, (i * 31 + k) as u64 + 1)).collect()).collect();
    let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
    let stacked = batch::stack(probe.inputs(), &refs, 0.0)?;
    let names: Vec<String> = probe.inputs().iter().map(|i| i.name.clone()).collect();
    let outputs: Vec<String> = probe.outputs().to_vec();
    let mut probe = probe;
    let mut plain_run = || -> Result<f32> {
        let mut values = Vec::with_capacity(names.len());
        for (name, tensor) in names.iter().zip(&stacked.inputs) {
            values.push((
                name.as_str(),
                TensorRef::from_array_view((tensor.shape.clone(), tensor.data.floats())).map_err(DataplaneError::ort)?,
            ));
        }
        let out = plain.run(values).map_err(DataplaneError::ort)?;
        let (_, data) = out[outputs[0].as_str()].try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
        Ok(data[0])
    };

    // The served side: a worker, one job in flight at a time (as the engine runs them).
    let (tx, events) = mpsc::channel();
    let worker = Worker::provision(0, spec.clone(), options.threads, WorkerContext { runtime: Arc::clone(runtime), cache }, tx);
    match events.recv().map_err(|_| DataplaneError::WorkerGone(0))? {
        WorkerEvent::Ready { .. } => {}
        WorkerEvent::StartFailed { error, .. } => return Err(error),
        other => return Err(DataplaneError::Invalid(format!("unexpected {other:?}"))),
    }
    let jobs: Vec<Job> = (0..options.runs)
        .map(|j| Job {
            id: j as u64,
            requests: requests.iter().enumerate().map(|(i, inputs)| Request::new(i as u64, inputs.clone())).collect(),
        })
        .collect();
    let in_worker = std::cell::Cell::new(Duration::ZERO);
    let serve = |job: Job| -> Result<()> {
        worker.start(job)?;
        match events.recv().map_err(|_| DataplaneError::WorkerGone(0))? {
            WorkerEvent::Finished { result, duration, .. } => {
                in_worker.set(in_worker.get() + duration);
                result.map(|_| ())
            }
            other => Err(DataplaneError::Invalid(format!("unexpected {other:?}"))),
        }
    };
    // Warm both sides up.
    for _ in 0..3 {
        plain_run()?;
        serve(jobs[0].clone())?;
    }
    in_worker.set(Duration::ZERO);
    let (mut plain_time, mut served_time) = (Duration::ZERO, Duration::ZERO);
    let mut round_ratios = Vec::new();
    for _ in 0..options.rounds.max(1) {
        let begin = Instant::now();
        for _ in 0..options.runs {
            plain_run()?;
        }
        let plain_round = begin.elapsed();
        // The jobs' request tensors are built before the clock starts: a server
        // receives them from clients.
        let round_jobs = jobs.clone();
        let begin = Instant::now();
        for job in round_jobs {
            serve(job)?;
        }
        let served_round = begin.elapsed();
        round_ratios.push(plain_round.as_secs_f64() / served_round.as_secs_f64());
        plain_time += plain_round;
        served_time += served_round;
    }
    // Where a served batch's time goes, on a session like the worker's (warm, from the
    // cache), outside the timed rounds.
    for _ in 0..3 {
        probe.run_batch(&refs, None)?;
    }
    let mut sum = BatchTiming::default();
    for _ in 0..options.runs.max(1) {
        probe.run_batch(&refs, None)?;
        let t = probe.last_timing();
        sum.stack += t.stack;
        sum.run += t.run;
        sum.split += t.split;
    }
    let runs = options.runs.max(1) as u32;
    let served_breakdown = BatchTiming { stack: sum.stack / runs, run: sum.run / runs, split: sum.split / runs };
    let requests_done = (options.runs * options.rounds.max(1) * options.batch) as f64;
    let batches = (options.runs * options.rounds.max(1)).max(1) as u32;
    Ok(BenchReport {
        batch: options.batch,
        plain_rps: requests_done / plain_time.as_secs_f64(),
        served_rps: requests_done / served_time.as_secs_f64(),
        round_ratios,
        cold_start: cold[cold.len() / 2],
        warm_start: warm[warm.len() / 2],
        device: runtime.device().to_string(),
        served_breakdown,
        plain_batch: plain_time / batches,
        served_batch: served_time / batches,
        worker_batch: in_worker.get() / batches,
    })
}
