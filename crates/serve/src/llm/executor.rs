//! The iteration-level executor: the engine's LLM frames run on decoder workers.
//!
//! [`LlmExecutor`] implements [`Executor`] for pipelines of iteration stages. Each
//! engine worker is a decoder worker ([`super::worker`]): a thread here, or one on a
//! `yardmaster node` when a `[[remote]]` section places the stage there
//! ([`super::remote`]). Either is driven by commands in the order the engine issued
//! them: run a frame, evict a sequence, forget one, report what it holds, reload with
//! other threads, stop. The engine's `evict` becomes a command, so an eviction always
//! lands between frames.
//!
//! A frame ([`BatchJob`] with `frame_steps`) is planned here, where the texts are: it
//! gives each sequence `min(frame_steps, remaining)` steps, where the length is the
//! request's `expected_tokens` (its `max_tokens`; [`DEFAULT_MAX_TOKENS`] when 0). The
//! first step prefills a fresh or recompute-evicted sequence (its prompt and the tokens
//! it already generated) or feeds a resident or swapped one its last token. The
//! sequence's text lives in the [`Transcripts`], so any worker can recompute it; each
//! job cuts the text to the `generated` count the engine holds (tokens of an aborted
//! frame are never kept). A sequence's result is its tokens of this frame and whether
//! it reached its length.
//!
//! Abort: every frame carries a generation number. [`Executor::abort`] clears the
//! worker's current generation here (so a result of that frame, whenever it comes, is
//! dropped: the check and the report happen under one lock) and on the worker (so the
//! frame stops before its next step).

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use yardmaster_dataplane::llm::{Eviction, FrameRequest, StepTiming};
use yardmaster_dataplane::Runtime;

use super::remote::{RemoteDecoders, RemoteWorker};
use super::service::Transcripts;
use crate::actor::{Actor, ActorHandle};
pub use yardmaster_cluster::decoder_thread::{DecoderModel, Holdings};
use yardmaster_cluster::decoder_thread::{DecoderThread, Reporter, WorkerCommand, WorkerReport};
use yardmaster_cluster::framing::FrameOutcome;
use yardmaster_engine::{BatchJob, Executor, ItemResult, JobResult, MonotonicClock, Pipeline, Resume, WorkerStart};
use yardmaster_policy::contract::EvictMode;

/// Output tokens of a request that gives no `expected_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 128;

/// The engine actor with the decoder executor.
pub type LlmActor = Actor<MonotonicClock, LlmExecutor>;
/// A handle to it.
pub type LlmHandle = ActorHandle<MonotonicClock, LlmExecutor>;

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

/// How the executor reaches one worker.
#[derive(Clone)]
enum Link {
    /// A thread of this process.
    Local(DecoderThread),
    /// A worker on a node.
    Remote(RemoteWorker),
}

impl Link {
    fn run(&self, generation: u64, requests: Vec<FrameRequest>) -> Result<(), String> {
        match self {
            Link::Local(thread) => thread.run(generation, requests),
            Link::Remote(worker) => worker.run(generation, requests),
        }
    }

    fn abort(&self) {
        match self {
            Link::Local(thread) => thread.abort(),
            Link::Remote(worker) => worker.abort(),
        }
    }

    fn send(&self, command: WorkerCommand) -> bool {
        match self {
            Link::Local(thread) => thread.send(command),
            Link::Remote(worker) => worker.send(command),
        }
    }
}

/// The frame a worker runs, as planned here.
struct PlannedFrame {
    /// The sequences sent to the worker.
    planned: Vec<Planned>,
    /// Results decided while planning (failures, sequences already at their length).
    decided: Vec<ItemResult>,
}

/// A worker's current frame: the one whose result is accepted.
#[derive(Default)]
struct Current {
    /// 0: none (after an abort).
    generation: u64,
    frame: Option<PlannedFrame>,
}

/// One worker as the executor knows it.
struct WorkerLink {
    link: Link,
    current: Arc<Mutex<Current>>,
}

/// A poisoned lock still holds consistent data here, so a panic elsewhere must not
/// stop serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The workers, reachable from the engine's turn and from the request-end hook.
#[derive(Clone, Default)]
pub struct WorkerDirectory {
    links: Arc<Mutex<HashMap<u32, Link>>>,
}

impl WorkerDirectory {
    /// Every worker drops what it holds for `sequence` (it ended).
    pub fn forget(&self, sequence: u64) {
        for link in lock(&self.links).values() {
            link.send(WorkerCommand::Forget(sequence));
        }
    }
}

/// What the executor and its workers' reports share.
struct Shared {
    handle: LlmHandle,
    transcripts: Transcripts,
    stats: Mutex<LlmStats>,
}

/// Where a stage's workers run.
#[derive(Clone)]
pub struct DecoderPlacement {
    /// The stages (indices) whose workers run on the node.
    pub stages: Vec<u32>,
    /// The node's connection.
    pub node: Arc<RemoteDecoders>,
}

/// The engine's executor over decoder workers.
pub struct LlmExecutor {
    shared: Arc<Shared>,
    runtime: Arc<Runtime>,
    model: DecoderModel,
    placements: Vec<DecoderPlacement>,
    workers: HashMap<u32, WorkerLink>,
    directory: WorkerDirectory,
    /// Intra-op threads of each stage's workers.
    stage_threads: Vec<u32>,
    next_generation: u64,
}

impl std::fmt::Debug for LlmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmExecutor").field("model", &self.model.path).field("workers", &self.workers.len()).finish()
    }
}

impl LlmExecutor {
    /// An executor for `pipeline` (iteration stages) reporting to `handle`, running
    /// `model` on `runtime` here and on the nodes of `placements` for their stages,
    /// with the texts in `transcripts`; the workers register in `directory`.
    /// Provisions the pipeline's initial workers (the engine counts them as serving at
    /// once; frames sent before a worker has loaded wait for the load).
    pub fn new(
        handle: LlmHandle,
        pipeline: &Pipeline,
        runtime: Arc<Runtime>,
        model: DecoderModel,
        transcripts: Transcripts,
        directory: WorkerDirectory,
        placements: Vec<DecoderPlacement>,
    ) -> Self {
        let shared = Arc::new(Shared { handle, transcripts, stats: Mutex::default() });
        let stage_threads = pipeline.stages.iter().map(|s| s.threads).collect();
        let mut executor =
            Self { shared, runtime, model, placements, workers: HashMap::new(), directory, stage_threads, next_generation: 1 };
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
    /// running included); `None` for an unknown or stopped worker, or one whose node
    /// does not answer within 10 s.
    pub fn holdings(&self, worker: u32) -> Option<Holdings> {
        let link = self.workers.get(&worker)?;
        let (reply, answer) = mpsc::channel();
        let sent = link.link.send(WorkerCommand::Holdings(Box::new(move |held| {
            let _ = reply.send(held);
        })));
        if !sent {
            return None;
        }
        answer.recv_timeout(Duration::from_secs(10)).ok()
    }

    fn send(&self, worker: u32, command: WorkerCommand) -> bool {
        self.workers.get(&worker).is_some_and(|w| w.link.send(command))
    }

    /// Start a worker's link: on the node its stage is placed on, or a thread here.
    fn start_link(&self, worker: u32, stage: u32, threads: u32, report: Reporter) -> Result<Link, String> {
        match self.placements.iter().find(|p| p.stages.contains(&stage)) {
            Some(placement) => placement.node.provision(worker, threads, report).map(Link::Remote),
            None => DecoderThread::spawn(Arc::clone(&self.runtime), self.model.clone(), worker, threads, report)
                .map(Link::Local)
                .map_err(|e| format!("starting decoder worker {worker}: {e}")),
        }
    }
}

impl Executor for LlmExecutor {
    fn start(&mut self, job: BatchJob) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let worker = job.worker;
        let max_positions = self.model.config.max_positions as u32;
        let (requests, frame) = plan(&self.shared.transcripts, &job, max_positions);
        let Some(link) = self.workers.get(&worker) else {
            let error = format!("decoder worker {worker} is not running");
            let items = job.items.iter().map(|i| failed(i.id, &error)).collect();
            let _ = self.shared.handle.job_finished(JobResult { worker, duration: 0, items });
            return;
        };
        if requests.is_empty() {
            *lock(&link.current) = Current::default();
            let _ = self.shared.handle.job_finished(JobResult { worker, duration: 1, items: frame.decided });
            return;
        }
        *lock(&link.current) = Current { generation, frame: Some(frame) };
        if let Err(error) = link.link.run(generation, requests) {
            // Unless the worker's loss already ended the frame, end it here.
            if let Some(frame) = std::mem::take(&mut *lock(&link.current)).frame {
                let mut items = frame.decided;
                items.extend(frame.planned.iter().map(|p| failed(p.id, &error)));
                let _ = self.shared.handle.job_finished(JobResult { worker, duration: 0, items });
            }
        }
    }

    fn abort(&mut self, worker: u32) {
        if let Some(link) = self.workers.get(&worker) {
            // Generations start at 1: no frame is current after this.
            *lock(&link.current) = Current::default();
            link.link.abort();
        }
    }

    fn provision(&mut self, worker: u32, stage: u32, _variant: u32, _start: WorkerStart) {
        let threads = self.stage_threads.get(stage as usize).copied().unwrap_or(1);
        let current = Arc::new(Mutex::new(Current::default()));
        let report = reporter(Arc::clone(&self.shared), worker, Arc::clone(&current));
        match self.start_link(worker, stage, threads, report) {
            Ok(link) => {
                lock(&self.directory.links).insert(worker, link.clone());
                self.workers.insert(worker, WorkerLink { link, current });
            }
            Err(error) => {
                let _ = self.shared.handle.worker_lost(worker, error);
            }
        }
    }

    fn retire(&mut self, worker: u32) {
        self.send(worker, WorkerCommand::Stop);
        self.workers.remove(&worker);
        lock(&self.directory.links).remove(&worker);
    }

    fn set_threads(&mut self, worker: u32, threads: u32) {
        self.send(worker, WorkerCommand::Threads(threads));
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
        if self.send(worker, WorkerCommand::Evict(sequence, how)) {
            let mut stats = lock(&self.shared.stats);
            match how {
                Eviction::Swap => stats.swaps += 1,
                Eviction::Recompute => stats.recompute_evictions += 1,
            }
        }
    }
}

impl Drop for LlmExecutor {
    fn drop(&mut self) {
        for worker in self.workers.values() {
            worker.link.send(WorkerCommand::Stop);
        }
    }
}

fn failed(id: u64, error: &str) -> ItemResult {
    ItemResult { id, error: Some(error.to_string()), tokens: 0, finished: false, fan_out: Vec::new() }
}

/// One sequence of a frame, as planned.
struct Planned {
    id: u64,
    steps: u32,
    finished: bool,
}

/// Plan `job`: each sequence's text (cut to the tokens the engine counts) and steps,
/// and the results decided without running (failures, sequences at their length).
fn plan(transcripts: &Transcripts, job: &BatchJob, max_positions: u32) -> (Vec<FrameRequest>, PlannedFrame) {
    let mut requests = Vec::with_capacity(job.items.len());
    let mut frame = PlannedFrame { planned: Vec::with_capacity(job.items.len()), decided: Vec::new() };
    let mut transcripts = transcripts.lock();
    for item in &job.items {
        let Some(text) = transcripts.get_mut(&item.id) else {
            frame.decided.push(failed(item.id, &format!("no prompt is held for request {}", item.id)));
            continue;
        };
        text.generated.truncate(item.generated as usize);
        if (text.generated.len() as u32) < item.generated {
            frame.decided.push(failed(
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
            frame.decided.push(failed(
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
            frame.decided.push(ItemResult { id: item.id, error: None, tokens: 0, finished: true, fan_out: Vec::new() });
            continue;
        }
        let steps = job.frame_steps.max(1).min(target - item.generated);
        let finished = item.generated + steps >= target;
        let reuse = matches!(item.resume, Resume::Continue | Resume::SwapIn);
        requests.push(FrameRequest { id: item.id, text: text.text(), reuse, steps: steps as usize, last: finished });
        frame.planned.push(Planned { id: item.id, steps, finished });
    }
    (requests, frame)
}

/// The callback a worker reports to: readiness and losses go to the engine; a frame's
/// result is accepted only while its generation is current.
fn reporter(shared: Arc<Shared>, worker: u32, current: Arc<Mutex<Current>>) -> Reporter {
    Box::new(move |report| match report {
        WorkerReport::Ready { .. } => {
            let _ = shared.handle.worker_ready(worker);
        }
        WorkerReport::LoadFailed(reason) => {
            // A frame already sent fails with the reason, then the engine removes the worker.
            let mut current = lock(&current);
            if let Some(frame) = current.frame.take() {
                let mut items = frame.decided;
                items.extend(frame.planned.iter().map(|p| failed(p.id, &reason)));
                let _ = shared.handle.job_finished(JobResult { worker, duration: 0, items });
            }
            current.generation = 0;
            let _ = shared.handle.worker_lost(worker, reason);
        }
        WorkerReport::FrameDone { generation, duration, outcome } => finish(&shared, worker, &current, generation, duration, outcome),
    })
}

/// Apply a frame's result: keep its tokens and report it, if it is still current.
fn finish(shared: &Shared, worker: u32, current: &Mutex<Current>, generation: u64, duration: Duration, outcome: FrameOutcome) {
    let mut current = lock(current);
    if current.generation != generation || current.frame.is_none() {
        // Aborted: the engine has taken the sequences back.
        lock(&shared.stats).aborted += 1;
        return;
    }
    let Some(frame) = current.frame.take() else { return };
    current.generation = 0;
    let mut items = frame.decided;
    let mut stats = LlmStats { frames: 1, ..LlmStats::default() };
    match outcome {
        FrameOutcome::Done { frame: run, resident_bytes } => {
            let mut transcripts = shared.transcripts.lock();
            for (plan, result) in frame.planned.iter().zip(&run.results) {
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
            // A worker that answered for fewer sequences than it was sent fails the rest.
            for plan in frame.planned.iter().skip(run.results.len()) {
                items.push(failed(plan.id, &format!("decoder worker {worker} returned no result for request {}", plan.id)));
            }
            stats.record(&run.steps);
            stats.peak_resident_bytes = resident_bytes;
        }
        FrameOutcome::Failed(error) => items.extend(frame.planned.iter().map(|p| failed(p.id, &error))),
        FrameOutcome::Aborted => {
            let error = format!("decoder worker {worker} stopped the frame on its own");
            items.extend(frame.planned.iter().map(|p| failed(p.id, &error)));
        }
    }
    lock(&shared.stats).merge(&stats);
    let duration = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX).max(1);
    let _ = shared.handle.job_finished(JobResult { worker, duration, items });
}
