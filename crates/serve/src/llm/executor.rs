//! The iteration-level executor: the engine's LLM frames run on decoder workers.
//!
//! [`LlmExecutor`] implements [`Executor`] for pipelines of iteration stages. Each
//! engine worker is a thread owning a [`DecoderWorker`] (an ONNX Runtime session of the
//! decoder and the KV caches of its sequences), driven by commands in the order the
//! engine issued them: run a frame, evict a sequence, forget one, report what it holds,
//! reload with other threads, stop. The engine's `evict` becomes a command, so an
//! eviction always lands between frames.
//!
//! A frame ([`BatchJob`] with `frame_steps`) gives each sequence
//! `min(frame_steps, remaining)` steps, where the length is the request's
//! `expected_tokens` (its `max_tokens`; [`DEFAULT_MAX_TOKENS`] when 0): the first step
//! prefills a fresh or recompute-evicted sequence (its prompt and the tokens it already
//! generated) or feeds a resident or swapped one its last token. The sequence's text
//! lives in the [`Transcripts`], so any worker can recompute it; each job cuts the text
//! to the `generated` count the engine holds (tokens of an aborted frame are not kept).
//! A sequence's result is its tokens of this frame and whether it reached its length.
//!
//! Abort: every job carries a generation number; [`Executor::abort`] bumps the worker's,
//! which stops the running frame before its next step and keeps its result from being
//! reported (the check and the report happen under one lock).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use yardmaster_dataplane::llm::{DecoderConfig, DecoderSession, DecoderWorker, Eviction, FrameRequest, StepTiming};
use yardmaster_dataplane::{DataplaneError, Runtime};

use super::service::Transcripts;
use crate::actor::{Actor, ActorHandle};
use yardmaster_engine::{BatchJob, Executor, ItemResult, JobResult, MonotonicClock, Pipeline, Resume, WorkerStart};
use yardmaster_policy::contract::EvictMode;

/// Output tokens of a request that gives no `expected_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 128;

/// The engine actor with the decoder executor.
pub type LlmActor = Actor<MonotonicClock, LlmExecutor>;
/// A handle to it.
pub type LlmHandle = ActorHandle<MonotonicClock, LlmExecutor>;

/// What a worker thread does next.
enum Command {
    /// Run a frame, reporting unless the generation moved on.
    Run(BatchJob, u64),
    /// Take a sequence out of the KV budget.
    Evict(u64, Eviction),
    /// Drop whatever is held for a sequence.
    Forget(u64),
    /// Answer with the resident and swapped sequences and their cached positions.
    Holdings(Sender<Holdings>),
    /// Rebuild the session with this many intra-op threads (the caches stay).
    Threads(u32),
    /// End the thread.
    Stop,
}

/// What a decoder worker holds, by sequence id with cached positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Sequences whose caches count against the worker's KV budget.
    pub resident: Vec<(u64, usize)>,
    /// Sequences whose caches are swapped out.
    pub swapped: Vec<(u64, usize)>,
    /// Bytes of the resident caches.
    pub resident_bytes: u64,
}

/// Counters over every frame the executor ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlmStats {
    /// Frames reported.
    pub frames: u64,
    /// Frames aborted.
    pub aborted: u64,
    /// Model calls (steps).
    pub steps: u64,
    /// Tokens generated and reported.
    pub tokens: u64,
    /// Positions prefilled (fresh prompts and recomputes).
    pub prefilled: u64,
    /// Sequences prefilled because a cache they should have had was missing.
    pub recomputed: u64,
    /// Cached positions cut because a cache was longer than the engine's count (only
    /// after an aborted frame).
    pub trimmed: u64,
    /// Caches found for sequences the engine had evicted by recompute (an eviction
    /// that never reached the worker).
    pub stale: u64,
    /// Sequences swapped out, and evicted by recompute, by the engine's order.
    pub swaps: u64,
    /// See `swaps`.
    pub recompute_evictions: u64,
    /// The most bytes of resident caches a worker held after a frame.
    pub peak_resident_bytes: u64,
    /// Per batch size: decode steps (one new position) and their summed time.
    pub decode_steps_by_batch: Vec<(usize, u64, Duration)>,
}

impl LlmStats {
    fn record(&mut self, steps: &[StepTiming]) {
        self.steps += steps.len() as u64;
        for step in steps.iter().filter(|s| s.new_positions == 1) {
            self.add_decode_steps(step.batch, 1, step.duration);
        }
    }

    fn add_decode_steps(&mut self, batch: usize, n: u64, time: Duration) {
        match self.decode_steps_by_batch.iter_mut().find(|(b, ..)| *b == batch) {
            Some((_, count, total)) => {
                *count += n;
                *total += time;
            }
            None => {
                self.decode_steps_by_batch.push((batch, n, time));
                self.decode_steps_by_batch.sort_by_key(|(b, ..)| *b);
            }
        }
    }

    fn merge(&mut self, other: &LlmStats) {
        self.frames += other.frames;
        self.aborted += other.aborted;
        self.steps += other.steps;
        self.tokens += other.tokens;
        self.prefilled += other.prefilled;
        self.recomputed += other.recomputed;
        self.trimmed += other.trimmed;
        self.swaps += other.swaps;
        self.recompute_evictions += other.recompute_evictions;
        self.stale += other.stale;
        self.peak_resident_bytes = self.peak_resident_bytes.max(other.peak_resident_bytes);
        for &(batch, n, time) in &other.decode_steps_by_batch {
            self.add_decode_steps(batch, n, time);
        }
    }
}

/// The decoder every worker loads.
#[derive(Debug, Clone)]
pub struct DecoderModel {
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Its dimensions (checked against the file's metadata at load).
    pub config: DecoderConfig,
}

/// A worker thread's end of the shared state.
struct WorkerLink {
    commands: Sender<Command>,
    /// The current job generation; bumped by an abort.
    generation: Arc<Mutex<u64>>,
}

/// A poisoned lock still holds consistent data here, so a panic elsewhere must not
/// stop serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The worker threads, reachable from the actor thread and from the request-end hook.
#[derive(Clone, Default)]
pub struct WorkerDirectory {
    links: Arc<Mutex<HashMap<u32, Sender<Command>>>>,
}

impl WorkerDirectory {
    /// Every worker drops what it holds for `sequence` (it ended).
    pub fn forget(&self, sequence: u64) {
        for commands in lock(&self.links).values() {
            let _ = commands.send(Command::Forget(sequence));
        }
    }
}

/// What the worker threads share.
struct Shared {
    handle: LlmHandle,
    runtime: Arc<Runtime>,
    model: DecoderModel,
    transcripts: Transcripts,
    stats: Mutex<LlmStats>,
}

/// The engine's executor over decoder workers.
pub struct LlmExecutor {
    shared: Arc<Shared>,
    workers: HashMap<u32, WorkerLink>,
    directory: WorkerDirectory,
    /// Intra-op threads of each stage's workers.
    stage_threads: Vec<u32>,
    next_generation: u64,
}

impl std::fmt::Debug for LlmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmExecutor").field("model", &self.shared.model.path).field("workers", &self.workers.len()).finish()
    }
}

impl LlmExecutor {
    /// An executor for `pipeline` (iteration stages) reporting to `handle`, running
    /// `model` on `runtime`, with the texts in `transcripts`; the workers register in
    /// `directory`. Provisions the pipeline's initial workers (the engine counts them as
    /// serving at once; frames sent before a worker has loaded wait for the load).
    pub fn new(
        handle: LlmHandle,
        pipeline: &Pipeline,
        runtime: Arc<Runtime>,
        model: DecoderModel,
        transcripts: Transcripts,
        directory: WorkerDirectory,
    ) -> Self {
        let shared = Arc::new(Shared { handle, runtime, model, transcripts, stats: Mutex::default() });
        let stage_threads = pipeline.stages.iter().map(|s| s.threads).collect();
        let mut executor = Self { shared, workers: HashMap::new(), directory, stage_threads, next_generation: 1 };
        for (worker, stage) in pipeline.initial_workers() {
            // The engine seats these workers itself; here they only need to run.
            executor.provision(worker, stage, 0, WorkerStart { host: 0, slot: worker, warm: false });
        }
        executor
    }

    /// The counters so far.
    pub fn stats(&self) -> LlmStats {
        lock(&self.shared.stats).clone()
    }

    /// What `worker` holds, once it has handled every command sent before (a frame
    /// running included); `None` for an unknown or stopped worker.
    pub fn holdings(&self, worker: u32) -> Option<Holdings> {
        let link = self.workers.get(&worker)?;
        let (reply, answer) = mpsc::channel();
        link.commands.send(Command::Holdings(reply)).ok()?;
        answer.recv().ok()
    }

    fn send(&self, worker: u32, command: Command) -> bool {
        self.workers.get(&worker).is_some_and(|link| link.commands.send(command).is_ok())
    }
}

impl Executor for LlmExecutor {
    fn start(&mut self, job: BatchJob) {
        let generation = self.next_generation;
        self.next_generation += 1;
        if let Some(link) = self.workers.get(&job.worker) {
            *lock(&link.generation) = generation;
        }
        let (worker, ids): (u32, Vec<u64>) = (job.worker, job.items.iter().map(|i| i.id).collect());
        if !self.send(worker, Command::Run(job, generation)) {
            let error = format!("decoder worker {worker} is not running");
            let items = ids.into_iter().map(|id| failed(id, &error)).collect();
            let _ = self.shared.handle.job_finished(JobResult { worker, duration: 0, items });
        }
    }

    fn abort(&mut self, worker: u32) {
        if let Some(link) = self.workers.get(&worker) {
            // Job generations start at 1: no frame is current after this.
            *lock(&link.generation) = 0;
        }
    }

    fn provision(&mut self, worker: u32, stage: u32, _variant: u32, _start: WorkerStart) {
        let threads = self.stage_threads.get(stage as usize).copied().unwrap_or(1);
        let (commands, receiver) = mpsc::channel();
        let generation = Arc::new(Mutex::new(0));
        let (shared, current) = (Arc::clone(&self.shared), Arc::clone(&generation));
        let spawned = std::thread::Builder::new()
            .name(format!("yardmaster-decoder-{worker}"))
            .spawn(move || serve(&shared, worker, threads, &current, receiver));
        match spawned {
            Ok(_) => {
                lock(&self.directory.links).insert(worker, commands.clone());
                self.workers.insert(worker, WorkerLink { commands, generation });
            }
            Err(error) => {
                let _ = self.shared.handle.worker_lost(worker, format!("starting decoder worker {worker}: {error}"));
            }
        }
    }

    fn retire(&mut self, worker: u32) {
        self.send(worker, Command::Stop);
        self.workers.remove(&worker);
        lock(&self.directory.links).remove(&worker);
    }

    fn set_threads(&mut self, worker: u32, threads: u32) {
        self.send(worker, Command::Threads(threads));
    }

    fn set_variant(&mut self, worker: u32, variant: u32) {
        // Every variant of an LLM stage runs the one decoder.
        tracing::debug!(worker, variant, "variant change: decoder workers serve one model");
    }

    fn evict(&mut self, worker: u32, sequence: u64, mode: EvictMode) {
        let how = match mode {
            EvictMode::Recompute => Eviction::Recompute,
            EvictMode::Swap => Eviction::Swap,
        };
        self.send(worker, Command::Evict(sequence, how));
    }
}

impl Drop for LlmExecutor {
    fn drop(&mut self) {
        for link in self.workers.values() {
            let _ = link.commands.send(Command::Stop);
        }
    }
}

fn failed(id: u64, error: &str) -> ItemResult {
    ItemResult { id, error: Some(error.to_string()), tokens: 0, finished: false, fan_out: Vec::new() }
}

/// A worker thread: load the decoder, then handle commands until told to stop.
fn serve(shared: &Shared, worker: u32, threads: u32, generation: &Mutex<u64>, commands: Receiver<Command>) {
    let model = &shared.model;
    let mut decoder = match DecoderSession::load(&shared.runtime, &model.path, model.config, threads as usize) {
        Ok(session) => DecoderWorker::new(session),
        Err(error) => {
            tracing::error!(worker, "decoder worker failed to start: {error}");
            let reason = format!("decoder worker {worker} could not load {}: {error}", model.path.display());
            // Frames already sent fail with the reason, then the engine removes the worker.
            while let Ok(command) = commands.try_recv() {
                if let Command::Run(job, _) = command {
                    let items = job.items.iter().map(|i| failed(i.id, &reason)).collect();
                    let _ = shared.handle.job_finished(JobResult { worker, duration: 0, items });
                }
            }
            let _ = shared.handle.worker_lost(worker, reason);
            return;
        }
    };
    tracing::info!(worker, threads, "decoder worker ready");
    let _ = shared.handle.worker_ready(worker);
    while let Ok(command) = commands.recv() {
        match command {
            Command::Run(job, mine) => run(shared, &mut decoder, job, mine, generation),
            Command::Evict(sequence, how) => {
                decoder.evict(sequence, how);
                let mut stats = lock(&shared.stats);
                match how {
                    Eviction::Swap => stats.swaps += 1,
                    Eviction::Recompute => stats.recompute_evictions += 1,
                }
            }
            Command::Forget(sequence) => decoder.forget(sequence),
            Command::Holdings(reply) => {
                let _ = reply.send(Holdings {
                    resident: decoder.resident(),
                    swapped: decoder.swapped(),
                    resident_bytes: decoder.resident_bytes(),
                });
            }
            Command::Threads(threads) => match DecoderSession::load(&shared.runtime, &model.path, model.config, threads as usize) {
                Ok(session) => decoder.replace_session(session),
                Err(error) => tracing::warn!(worker, threads, "reloading the decoder failed: {error}; it keeps its session"),
            },
            Command::Stop => return,
        }
    }
}

/// One sequence of a frame, prepared.
struct Planned {
    id: u64,
    steps: u32,
    finished: bool,
}

/// Run one frame and report it (unless it was aborted).
fn run(shared: &Shared, decoder: &mut DecoderWorker, job: BatchJob, mine: u64, generation: &Mutex<u64>) {
    let begin = Instant::now();
    let max_positions = decoder.session().config().max_positions as u32;
    let mut requests = Vec::with_capacity(job.items.len());
    let mut planned = Vec::with_capacity(job.items.len());
    let mut items = Vec::with_capacity(job.items.len());
    {
        let mut transcripts = shared.transcripts.lock();
        for item in &job.items {
            let Some(text) = transcripts.get_mut(&item.id) else {
                items.push(failed(item.id, &format!("no prompt is held for request {}", item.id)));
                continue;
            };
            text.generated.truncate(item.generated as usize);
            if (text.generated.len() as u32) < item.generated {
                items.push(failed(
                    item.id,
                    &format!("request {}: {} tokens were reported but {} are held", item.id, item.generated, text.generated.len()),
                ));
                continue;
            }
            // The length: what the client asked for, within the decoder's context (the
            // cache holds the prompt and all but the last generated token).
            let asked = if item.expected_tokens == 0 { DEFAULT_MAX_TOKENS } else { item.expected_tokens };
            let room = (max_positions + 1).saturating_sub(text.prompt.len() as u32);
            let target = asked.min(room);
            if target == 0 || text.prompt.is_empty() {
                items.push(failed(
                    item.id,
                    &format!(
                        "request {}: a prompt of {} tokens leaves no room in the decoder's {max_positions} positions",
                        item.id,
                        text.prompt.len()
                    ),
                ));
                continue;
            }
            if item.generated >= target {
                items.push(ItemResult { id: item.id, error: None, tokens: 0, finished: true, fan_out: Vec::new() });
                continue;
            }
            let steps = job.frame_steps.max(1).min(target - item.generated);
            let finished = item.generated + steps >= target;
            let reuse = matches!(item.resume, Resume::Continue | Resume::SwapIn);
            requests.push(FrameRequest { id: item.id, text: text.text(), reuse, steps: steps as usize, last: finished });
            planned.push(Planned { id: item.id, steps, finished });
        }
    }
    let stop = || *lock(generation) != mine;
    let outcome = if requests.is_empty() { Ok(None) } else { decoder.run(&requests, &stop).map(Some) };
    let mut stats = LlmStats { frames: 1, ..LlmStats::default() };
    match outcome {
        Ok(frame) => {
            if let Some(frame) = frame {
                let mut transcripts = shared.transcripts.lock();
                for (plan, result) in planned.iter().zip(&frame.results) {
                    if let Some(text) = transcripts.get_mut(&plan.id) {
                        text.generated.extend(&result.tokens);
                    }
                    stats.tokens += result.tokens.len() as u64;
                    stats.prefilled += result.prefilled as u64;
                    stats.recomputed += u64::from(result.recomputed);
                    stats.trimmed += result.trimmed as u64;
                    stats.stale += u64::from(result.stale);
                    items.push(ItemResult { id: plan.id, error: None, tokens: plan.steps, finished: plan.finished, fan_out: Vec::new() });
                }
                stats.record(&frame.steps);
                stats.peak_resident_bytes = decoder.resident_bytes();
            }
        }
        Err(DataplaneError::Aborted) => {
            lock(&shared.stats).aborted += 1;
            return;
        }
        Err(error) => {
            let error = format!("decoder worker {}: {error}", job.worker);
            items.extend(planned.iter().map(|p| failed(p.id, &error)));
        }
    }
    let duration = begin.elapsed().as_nanos() as u64;
    let current = lock(generation);
    if *current != mine {
        // Aborted after the last step: the engine has taken the sequences back.
        lock(&shared.stats).aborted += 1;
        return;
    }
    lock(&shared.stats).merge(&stats);
    let _ = shared.handle.job_finished(JobResult { worker: job.worker, duration: duration.max(1), items });
    drop(current);
}
