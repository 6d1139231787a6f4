//! What the engine needs from the world it runs in: a clock, and an executor that runs
//! batches on workers and provisions them. The simulator implements both with a
//! virtual clock and latency models; the server with the monotonic clock and ONNX
//! Runtime sessions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use yardmaster_policy::contract::EvictMode;

pub use crate::hosts::WorkerStart;

/// A source of the current time in nanoseconds; clones read the same clock.
pub trait Clock: Clone {
    /// Now.
    fn now(&self) -> u64;
}

/// A clock the driver moves by hand (the simulator's virtual time).
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// Move the clock to `t` (never backwards).
    pub fn set(&self, t: u64) {
        self.0.fetch_max(t, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The monotonic clock, in nanoseconds since the clock was made.
#[derive(Debug, Clone)]
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// How a sequence of an iteration-level job resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Not started: prefill its prompt.
    Fresh,
    /// Resident on the worker: continue decoding.
    Continue,
    /// Evicted by recompute: prefill prompt and generated tokens again.
    Recompute,
    /// Evicted by swap: copy its KV cache back in.
    SwapIn,
}

/// One request of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobItem {
    /// The request (piece) id.
    pub id: u64,
    /// Input size (prompt tokens for LLM stages).
    pub input_size: u32,
    /// Tokens generated so far (iteration stages).
    pub generated: u32,
    /// Output tokens the client expects (0 when unknown).
    pub expected_tokens: u32,
    /// How it resumes (iteration stages).
    pub resume: Resume,
}

/// Work for one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchJob {
    /// The worker.
    pub worker: u32,
    /// Its stage.
    pub stage: u32,
    /// The variant to run.
    pub variant: u32,
    /// The requests.
    pub items: Vec<JobItem>,
    /// Decode steps of a frame (iteration stages); 0 for a batch stage.
    pub frame_steps: u32,
}

/// How one request of a finished job did.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemResult {
    /// The request (piece) id.
    pub id: u64,
    /// The error, if the worker failed on it.
    pub error: Option<String>,
    /// Tokens generated in this job (iteration stages).
    pub tokens: u32,
    /// The sequence produced its last token (iteration stages).
    pub finished: bool,
    /// Pieces it yields per successor stage (fan-out), when the model decides; a
    /// successor not listed receives exactly one.
    pub fan_out: Vec<(u32, u32)>,
}

/// A finished job, as the executor reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    /// The worker.
    pub worker: u32,
    /// Measured execution time.
    pub duration: u64,
    /// Per-request results.
    pub items: Vec<ItemResult>,
}

/// Runs the engine's decisions.
pub trait Executor {
    /// Start a job; its result comes back through `Engine::job_finished`.
    fn start(&mut self, job: BatchJob);
    /// Abort the job running on a worker (preemption); no result will come for it.
    fn abort(&mut self, worker: u32);
    /// Start a new worker where `start` says (host, slot, and whether its parameters
    /// are in that host's cache: a warm start); readiness comes back through
    /// `Engine::worker_ready`.
    fn provision(&mut self, worker: u32, stage: u32, variant: u32, start: WorkerStart);
    /// Cancel a worker that is still starting, or remove an idle one.
    fn retire(&mut self, worker: u32);
    /// Change a worker's intra-op thread count.
    fn set_threads(&mut self, worker: u32, threads: u32);
    /// Change a worker's model variant.
    fn set_variant(&mut self, worker: u32, variant: u32);
    /// A sequence leaves a worker's memory (iteration stages).
    fn evict(&mut self, worker: u32, sequence: u64, mode: EvictMode);
    /// A stateful sequence's state on `worker` is no longer needed (the sequence went
    /// idle past its timeout, or its END request did not run): free it. A worker frees
    /// a sequence's state itself when its END request runs. By default nothing is kept.
    fn sequence_released(&mut self, worker: u32, sequence: u64) {
        let _ = (worker, sequence);
    }
    /// Whether `result` belongs to the job the engine holds the worker busy with. An
    /// executor whose results travel to the engine on their own (another thread) may
    /// have one on its way when [`Executor::abort`] comes too late to stop it: it says
    /// no to that one, so a preempted job's late result never ends the worker's next
    /// job. By default every result is accepted.
    fn accept_result(&mut self, result: &JobResult) -> bool {
        let _ = result;
        true
    }
    /// Whether the workers of an engine that serves at once (`Engine::new`) still load
    /// their models and report `Engine::worker_ready` when done (a live executor), so
    /// that until then their parameters are not yet in their host's cache. By default
    /// they are already loaded (the simulator's).
    fn initial_workers_report_ready(&self) -> bool {
        false
    }
}

/// One executor driven by several engines: the arms of an A/B run each schedule their
/// own workers, all of which live in this one executor. Cloning gives another handle
/// to the same executor. Worker and request ids must not collide between the engines
/// ([`super::IdSpace`] sees to that). The engines and their executor move between
/// threads together (the server runs an engine's turn on whichever thread brings it
/// work), so the executor is behind a mutex; it is never contended, since only the
/// thread running a turn reaches it.
pub struct SharedExecutor<X>(std::sync::Arc<std::sync::Mutex<X>>);

impl<X> SharedExecutor<X> {
    /// Share `executor`.
    pub fn new(executor: X) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(executor)))
    }

    /// The executor, for reading (held until the guard drops: do not take it twice).
    pub fn borrow(&self) -> std::sync::MutexGuard<'_, X> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The executor, for changing (held until the guard drops: do not take it twice).
    pub fn borrow_mut(&self) -> std::sync::MutexGuard<'_, X> {
        self.borrow()
    }
}

impl<X> Clone for SharedExecutor<X> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<X: std::fmt::Debug> std::fmt::Debug for SharedExecutor<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedExecutor").field(&*self.borrow()).finish()
    }
}

impl<X: Executor> Executor for SharedExecutor<X> {
    fn start(&mut self, job: BatchJob) {
        self.borrow_mut().start(job)
    }
    fn abort(&mut self, worker: u32) {
        self.borrow_mut().abort(worker)
    }
    fn provision(&mut self, worker: u32, stage: u32, variant: u32, start: WorkerStart) {
        self.borrow_mut().provision(worker, stage, variant, start)
    }
    fn initial_workers_report_ready(&self) -> bool {
        self.borrow().initial_workers_report_ready()
    }
    fn retire(&mut self, worker: u32) {
        self.borrow_mut().retire(worker)
    }
    fn set_threads(&mut self, worker: u32, threads: u32) {
        self.borrow_mut().set_threads(worker, threads)
    }
    fn set_variant(&mut self, worker: u32, variant: u32) {
        self.borrow_mut().set_variant(worker, variant)
    }
    fn evict(&mut self, worker: u32, sequence: u64, mode: EvictMode) {
        self.borrow_mut().evict(worker, sequence, mode)
    }
    fn sequence_released(&mut self, worker: u32, sequence: u64) {
        self.borrow_mut().sequence_released(worker, sequence)
    }
    fn accept_result(&mut self, result: &JobResult) -> bool {
        self.borrow_mut().accept_result(result)
    }
}

/// Where an engine takes new request and worker ids from. Engines that share one
/// (the arms of an A/B run, over one [`SharedExecutor`]) never hand out the same id
/// twice; a lone engine has its own, counting requests from 1 and workers from 0.
#[derive(Debug, Clone)]
pub struct IdSpace(Arc<(AtomicU64, AtomicU64)>);

impl Default for IdSpace {
    fn default() -> Self {
        Self(Arc::new((AtomicU64::new(1), AtomicU64::new(0))))
    }
}

impl IdSpace {
    /// A new request (or piece) id.
    pub fn request(&self) -> u64 {
        self.0 .0.fetch_add(1, Ordering::Relaxed)
    }

    /// A new worker id.
    pub fn worker(&self) -> u32 {
        self.0 .1.fetch_add(1, Ordering::Relaxed) as u32
    }

    /// Make sure worker ids from now on are at least `next`.
    pub(super) fn reserve_workers(&self, next: u32) {
        self.0 .1.fetch_max(next as u64, Ordering::Relaxed);
    }
}

/// An executor that runs nothing: it records the jobs it is asked to start, for the
/// driver to finish by hand ([`Engine::job_finished`](crate::Engine::job_finished)),
/// and the workers it provisions. For drivers that script what workers do — the
/// fuzz targets and tests.
#[derive(Debug, Default)]
pub struct RecordingExecutor {
    started: Vec<BatchJob>,
    provisioned: Vec<u32>,
}

impl RecordingExecutor {
    /// The jobs started since the last call, in the order they started.
    pub fn take_started(&mut self) -> Vec<BatchJob> {
        std::mem::take(&mut self.started)
    }

    /// The workers provisioned since the last call and not retired since, for the
    /// driver to report ready ([`Engine::worker_ready`](crate::Engine::worker_ready)).
    pub fn take_provisioned(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.provisioned)
    }
}

impl Executor for RecordingExecutor {
    fn start(&mut self, job: BatchJob) {
        self.started.push(job);
    }
    fn abort(&mut self, worker: u32) {
        self.started.retain(|j| j.worker != worker);
    }
    fn provision(&mut self, worker: u32, _stage: u32, _variant: u32, _start: WorkerStart) {
        self.provisioned.push(worker);
    }
    fn retire(&mut self, worker: u32) {
        self.provisioned.retain(|w| *w != worker);
    }
    fn set_threads(&mut self, _worker: u32, _threads: u32) {}
    fn set_variant(&mut self, _worker: u32, _variant: u32) {}
    fn evict(&mut self, _worker: u32, _sequence: u64, _mode: EvictMode) {}
}
