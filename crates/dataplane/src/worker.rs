//! Workers: one thread owning one session, driven by commands and answering with events.
//! This is the shape the server's engine executor drives — start a batch job, abort it,
//! provision a replica (warm from the cache or cold from disk), retire it, change its
//! thread count or its variant — with results coming back on an event channel.
//!
//! A worker reports [`WorkerEvent::Ready`] only once it can serve at its steady
//! latency: after loading its session it runs one warm-up inference ([`warm_up`]) on
//! synthetic inputs (ONNX Runtime allocates its buffers and initialises its kernels on
//! the first run); a model whose warm-up run fails (an input that is not `f32`, a
//! shape it refuses) reports ready without it. So the first request a ready worker
//! runs does not pay for the first run.
//!
//! Abort goes through ONNX Runtime's run options: every job gets its own
//! [`RunOptions`], created when the job is handed over, and [`Worker::abort`] sets its
//! terminate flag, which stops a run in progress or one about to start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ort::session::RunOptions;

use crate::cache::{ModelCache, ModelKey};
use crate::error::{DataplaneError, Result};
use crate::events::EventSink;
use crate::runtime::Runtime;
use crate::sequence::{SequenceStep, Sequences};
use crate::session::{BatchTiming, ModelSession, ModelSpec, StartKind};
use crate::tensor::{ElementType, Tensor};

/// One request of a job: one tensor per model input, without the batch dimension (for
/// a stateful model, one per input its clients send: the worker fills the control and
/// state inputs, see [`crate::sequence`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request (piece) id.
    pub id: u64,
    /// Its input tensors.
    pub inputs: Vec<Tensor>,
    /// Its place in a stateful sequence (a model with a sequence batcher).
    pub sequence: Option<SequenceStep>,
}

impl Request {
    /// A request that is no step of a sequence.
    pub fn new(id: u64, inputs: Vec<Tensor>) -> Self {
        Request { id, inputs, sequence: None }
    }
}

/// A batch of requests for one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The job id (echoed in its events).
    pub id: u64,
    /// The requests, stacked into one batch.
    pub requests: Vec<Request>,
}

/// The outputs of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// The request id.
    pub id: u64,
    /// One tensor per model output, without the batch dimension.
    pub outputs: Vec<Tensor>,
}

/// What a worker reports.
#[derive(Debug)]
pub enum WorkerEvent {
    /// The worker's session is loaded; it takes jobs.
    Ready {
        /// The worker.
        worker: u32,
        /// The model it loaded.
        model: ModelKey,
        /// Warm (from the cache) or cold (from disk).
        kind: StartKind,
        /// How long the start took.
        took: Duration,
    },
    /// The session could not be loaded; the worker has stopped.
    StartFailed {
        /// The worker.
        worker: u32,
        /// Why.
        error: DataplaneError,
    },
    /// A job ran to its end (successfully or not).
    Finished {
        /// The worker.
        worker: u32,
        /// The job.
        job: u64,
        /// Execution time (stack, run, split).
        duration: Duration,
        /// Where the job's time went on the worker (zero where the worker does not
        /// measure it: a remote host's).
        timing: JobTiming,
        /// Per-request outputs, in the job's order, or the job's error.
        result: Result<Vec<RequestOutput>>,
    },
    /// A job was stopped by [`Worker::abort`]; it has no result.
    Aborted {
        /// The worker.
        worker: u32,
        /// The job.
        job: u64,
    },
    /// The session was rebuilt with a new thread count or variant.
    Reconfigured {
        /// The worker.
        worker: u32,
        /// The model now loaded.
        model: ModelKey,
        /// Its intra-op threads.
        threads: usize,
        /// How long the rebuild took.
        took: Duration,
    },
    /// A reconfiguration failed; the previous session stays.
    ReconfigureFailed {
        /// The worker.
        worker: u32,
        /// Why.
        error: DataplaneError,
    },
    /// The worker has stopped after [`Worker::retire`] and released its model (its
    /// sessions and the device memory they held).
    Retired {
        /// The worker.
        worker: u32,
    },
}

/// Where one job's time went on its worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobTiming {
    /// From the hand-over ([`Worker::start`]) to the worker taking the job up: the
    /// wake-up of its thread, or the job before it.
    pub waited: Duration,
    /// Stacking, `Run` and the split of the job's batch (for a stateful model's job,
    /// of its last step).
    pub batch: BatchTiming,
}

impl JobTiming {
    /// Whether the worker measured the job (a remote host's report none: all zero).
    pub fn measured(&self) -> bool {
        *self != JobTiming::default()
    }

    /// What Triton counts as a job's compute input: the wait before the worker took
    /// the job up and the stacking of its inputs.
    pub fn input(&self) -> Duration {
        self.waited + self.batch.stack
    }
}

/// What workers share: the runtime and the parameter cache.
#[derive(Debug, Clone)]
pub struct WorkerContext {
    /// ONNX Runtime.
    pub runtime: Arc<Runtime>,
    /// The host-memory model cache.
    pub cache: Arc<ModelCache>,
}

enum Command {
    /// A job, its run options, and when it was handed over.
    Run(Job, Arc<RunOptions>, Instant),
    SetThreads(usize),
    SetModel(ModelSpec),
    ReleaseSequence(u64),
}

struct RunningJob {
    job: u64,
    options: Arc<RunOptions>,
}

/// A handle to one worker thread.
pub struct Worker {
    id: u32,
    commands: Option<Sender<Command>>,
    running: Arc<Mutex<Option<RunningJob>>>,
    retired: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish()
    }
}

impl Worker {
    /// Start a worker that loads `spec` with `threads` intra-op threads; a
    /// [`WorkerEvent::Ready`] (or `StartFailed`) follows on `events` (a channel's
    /// sender, or an [`EventSink`]). Jobs handed over before it is ready wait for the
    /// load.
    pub fn provision(id: u32, spec: ModelSpec, threads: usize, context: WorkerContext, events: impl Into<EventSink>) -> Worker {
        let events = events.into();
        let (commands, inbox) = mpsc::channel();
        let running = Arc::new(Mutex::new(None));
        let retired = Arc::new(AtomicBool::new(false));
        let loop_state = WorkerLoop { id, context, events, running: Arc::clone(&running), retired: Arc::clone(&retired) };
        let thread = std::thread::Builder::new()
            .name(format!("yardmaster-worker-{id}"))
            .spawn(move || loop_state.run(spec, threads, inbox))
            .expect("spawning a worker thread");
        Worker { id, commands: Some(commands), running, retired, thread: Some(thread) }
    }

    /// The worker's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Hand over a job; a [`WorkerEvent::Finished`] or [`WorkerEvent::Aborted`] follows.
    pub fn start(&self, job: Job) -> Result<()> {
        let options = Arc::new(RunOptions::new().map_err(DataplaneError::ort)?);
        *self.running.lock().unwrap() = Some(RunningJob { job: job.id, options: Arc::clone(&options) });
        self.send(Command::Run(job, options, Instant::now()))
    }

    /// Abort the job handed over last, if it has not finished: it stops as soon as
    /// ONNX Runtime notices and reports [`WorkerEvent::Aborted`]. Returns its id. A job
    /// that finished between the call and the flag reports `Finished` instead.
    pub fn abort(&self) -> Option<u64> {
        let running = self.running.lock().unwrap();
        let job = running.as_ref()?;
        let _ = job.options.terminate();
        Some(job.job)
    }

    /// Rebuild the session with a new intra-op thread count (warm, from the cache).
    pub fn set_threads(&self, threads: usize) -> Result<()> {
        self.send(Command::SetThreads(threads))
    }

    /// Load another model variant in place of the current one.
    pub fn set_model(&self, spec: ModelSpec) -> Result<()> {
        self.send(Command::SetModel(spec))
    }

    /// Drop the state this worker holds for stateful sequence `id` (the engine released
    /// it: it went idle past its time, or its END did not run), after the jobs handed
    /// over before.
    pub fn release_sequence(&self, id: u64) -> Result<()> {
        self.send(Command::ReleaseSequence(id))
    }

    /// Stop the worker once its current job is done (a starting worker stops without
    /// reporting ready); [`WorkerEvent::Retired`] follows once the worker has released
    /// its model. Jobs still queued are dropped. A retire does not wait for a load or a
    /// job: the worker's thread is returned, for a caller that must know when it has
    /// ended (before the process exits, say — see [`crate::WorkerPool::shutdown`]).
    pub fn retire(mut self) -> Option<JoinHandle<()>> {
        self.retired.store(true, Ordering::SeqCst);
        self.commands = None; // closing the channel ends the loop
        self.thread.take()
    }

    fn send(&self, command: Command) -> Result<()> {
        self.commands.as_ref().and_then(|c| c.send(command).ok()).ok_or(DataplaneError::WorkerGone(self.id))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.retired.store(true, Ordering::SeqCst);
        self.commands = None;
    }
}

/// What a dynamic dimension of a model input is in the warm-up run.
pub const WARM_UP_DIM: usize = 32;

/// One inference on synthetic inputs of each input's element type (a batch of one,
/// each dynamic dimension [`WARM_UP_DIM`]), so the first real job does not pay for ONNX
/// Runtime's first run; how long it took, or none when the run failed (a shape the
/// model refuses).
pub fn warm_up(session: &mut ModelSession) -> Option<Duration> {
    let types = session.input_types().to_vec();
    let inputs: Vec<Tensor> = session
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, spec)| {
            let shape: Vec<usize> = spec.dims.iter().skip(1).map(|d| d.unwrap_or(WARM_UP_DIM)).collect();
            crate::profile::synthetic_of(types[k], &shape, k as u64 + 1)
        })
        .collect();
    let begin = Instant::now();
    session.run_batch(&[inputs.as_slice()], None).ok()?;
    Some(begin.elapsed())
}

/// Run the model's warm-up samples (Triton's `model_warmup`), each `count` times; the
/// first error names the sample.
pub fn run_warm_up(session: &mut ModelSession, samples: &[crate::session::WarmUp]) -> Result<Duration, DataplaneError> {
    use crate::session::WarmUpData;
    let begin = Instant::now();
    let types = session.input_types().to_vec();
    // A stateful model's samples give the inputs its clients send.
    let sequence = session.spec().sequence.as_ref();
    let fed: Vec<ElementType> =
        session.inputs().iter().zip(&types).filter(|(spec, _)| !sequence.is_some_and(|s| s.fills(&spec.name))).map(|(_, &t)| t).collect();
    for sample in samples {
        let failed = |e: DataplaneError| DataplaneError::Invalid(format!("warm-up sample {:?}: {e}", sample.name));
        if sample.inputs.len() != fed.len() {
            return Err(failed(DataplaneError::Invalid(format!("{} inputs given, the model takes {}", sample.inputs.len(), fed.len()))));
        }
        let mut request = Vec::with_capacity(fed.len());
        for (k, (input, &element)) in sample.inputs.iter().zip(&fed).enumerate() {
            let count: usize = input.shape.iter().product();
            let data = match &input.data {
                WarmUpData::Zero => crate::tensor::Elements::zeros(element, count).into(),
                WarmUpData::Random => crate::profile::synthetic_of(element, &input.shape, k as u64 + 1).data,
                WarmUpData::Given(bytes) => crate::tensor::TensorData::from_bytes(element, bytes, count).map_err(failed)?,
            };
            request.push(Tensor::new(input.shape.clone(), data).map_err(failed)?);
        }
        let request = complete_warm_up(session, request).map_err(failed)?;
        let requests: Vec<&[Tensor]> = (0..sample.batch.max(1)).map(|_| request.as_slice()).collect();
        for _ in 0..sample.count.max(1) {
            session.run_batch(&requests, None).map_err(failed)?;
        }
    }
    Ok(begin.elapsed())
}

/// A warm-up request of a stateful model with its control and state inputs filled in,
/// as the first request of a sequence that is not kept; other models' as it is.
fn complete_warm_up(session: &ModelSession, request: Vec<Tensor>) -> Result<Vec<Tensor>, DataplaneError> {
    let Some(spec) = session.spec().sequence.clone() else { return Ok(request) };
    let names: Vec<String> = session.inputs().iter().map(|i| i.name.clone()).collect();
    Sequences::new(spec).complete(&names, request, &SequenceStep { id: 0, label: None, start: true, end: true })
}

/// A job of a stateful model: each request's control and state inputs filled in from
/// the sequences this worker holds, the batch run, each state output kept for its
/// sequence (or dropped on END). A request whose sequence's state is not here fails the
/// job, naming the sequence; so does a request that is no step of a sequence.
fn run_sequences(session: &mut ModelSession, sequences: &mut Sequences, job: &Job, options: &RunOptions) -> Result<Vec<Vec<Tensor>>> {
    let now = Instant::now();
    sequences.expire(now);
    let names: Vec<String> = session.inputs().iter().map(|i| i.name.clone()).collect();
    let mut steps = Vec::with_capacity(job.requests.len());
    let mut inputs = Vec::with_capacity(job.requests.len());
    for request in &job.requests {
        let step = request.sequence.as_ref().ok_or_else(|| {
            DataplaneError::Invalid(format!("request {}: the model is stateful and the request names no sequence", request.id))
        })?;
        inputs.push(sequences.complete(&names, request.inputs.clone(), step)?);
        steps.push(step);
    }
    let refs: Vec<&[Tensor]> = inputs.iter().map(|i| i.as_slice()).collect();
    let outputs = session.run_batch(&refs, Some(options))?;
    let names = session.outputs().to_vec();
    outputs.into_iter().zip(steps).map(|(outputs, step)| sequences.keep(&names, outputs, step, now)).collect()
}

struct WorkerLoop {
    id: u32,
    context: WorkerContext,
    events: EventSink,
    running: Arc<Mutex<Option<RunningJob>>>,
    retired: Arc<AtomicBool>,
}

impl WorkerLoop {
    fn run(self, spec: ModelSpec, threads: usize, inbox: Receiver<Command>) {
        let worker = self.id;
        let mut session = match ModelSession::start(&self.context.runtime, &self.context.cache, &spec, threads) {
            Ok(mut started) => {
                if !self.retired.load(Ordering::SeqCst) {
                    if spec.warm_up.is_empty() {
                        if let Some(took) = warm_up(&mut started.session) {
                            tracing::debug!(worker, model = %spec.key, warm_up_ms = took.as_secs_f64() * 1e3, "worker warmed up");
                        }
                    } else if let Err(error) = run_warm_up(&mut started.session, &spec.warm_up) {
                        // As Triton does, a model whose warm-up fails does not serve.
                        let _ = self.events.send(WorkerEvent::StartFailed { worker, error });
                        return;
                    }
                }
                if !self.retired.load(Ordering::SeqCst) {
                    let _ =
                        self.events.send(WorkerEvent::Ready { worker, model: spec.key.clone(), kind: started.kind, took: started.took });
                }
                started.session
            }
            Err(error) => {
                let _ = self.events.send(WorkerEvent::StartFailed { worker, error });
                return;
            }
        };
        let mut sequences = session.spec().sequence.clone().map(Sequences::new);
        while let Ok(command) = inbox.recv() {
            if self.retired.load(Ordering::SeqCst) {
                break;
            }
            match command {
                Command::Run(job, options, handed) => self.run_job(&mut session, sequences.as_mut(), job, &options, handed),
                Command::SetThreads(threads) => {
                    let spec = session.spec().clone();
                    self.rebuild(&mut session, &spec, threads);
                }
                Command::SetModel(spec) => {
                    let threads = session.threads();
                    self.rebuild(&mut session, &spec, threads);
                }
                Command::ReleaseSequence(id) => {
                    if let Some(sequences) = sequences.as_mut() {
                        sequences.release(id);
                    }
                }
            }
        }
        // Release the model before saying so: a process that exits once every worker
        // has retired must not tear ONNX Runtime down under a session still being
        // destroyed (on CUDA, one per recent input shape: that race crashed `serve` at
        // exit).
        drop(session);
        let _ = self.events.send(WorkerEvent::Retired { worker });
    }

    fn run_job(&self, session: &mut ModelSession, sequences: Option<&mut Sequences>, job: Job, options: &RunOptions, handed: Instant) {
        let begin = Instant::now();
        let result = match sequences {
            None => {
                let inputs: Vec<&[Tensor]> = job.requests.iter().map(|r| r.inputs.as_slice()).collect();
                session.run_batch(&inputs, Some(options))
            }
            Some(sequences) => run_sequences(session, sequences, &job, options),
        };
        let duration = begin.elapsed();
        {
            let mut running = self.running.lock().unwrap();
            if running.as_ref().is_some_and(|r| r.job == job.id) {
                *running = None;
            }
        }
        let event = match result {
            Err(DataplaneError::Aborted) => WorkerEvent::Aborted { worker: self.id, job: job.id },
            result => WorkerEvent::Finished {
                worker: self.id,
                job: job.id,
                duration,
                timing: JobTiming { waited: begin.saturating_duration_since(handed), batch: session.last_timing() },
                result: result
                    .map(|outputs| job.requests.iter().zip(outputs).map(|(r, outputs)| RequestOutput { id: r.id, outputs }).collect()),
            },
        };
        let _ = self.events.send(event);
    }

    fn rebuild(&self, session: &mut ModelSession, spec: &ModelSpec, threads: usize) {
        match ModelSession::start(&self.context.runtime, &self.context.cache, spec, threads) {
            Ok(started) => {
                *session = started.session;
                let _ =
                    self.events.send(WorkerEvent::Reconfigured { worker: self.id, model: spec.key.clone(), threads, took: started.took });
            }
            Err(error) => {
                let _ = self.events.send(WorkerEvent::ReconfigureFailed { worker: self.id, error });
            }
        }
    }
}
