//! One decoder worker: a thread owning a [`DecoderWorker`] (an ONNX Runtime session of
//! the decoder and the KV caches of its sequences), driven by [`WorkerCommand`]s in the
//! order they were sent, reporting through a callback. It knows nothing of the engine
//! or of where its commands come from: the LLM executor runs these threads on this
//! host, and a `yardmaster node` runs them for a controller on another one (the
//! callback then writes frames to the network).
//!
//! A frame arrives planned: each sequence's text and step count (see
//! [`super::executor`]). Abort is a generation number: [`DecoderThread::run`] makes a
//! frame's generation current and [`DecoderThread::abort`] clears it; a frame whose
//! generation is no longer current stops before its next step and reports
//! [`FrameOutcome::Aborted`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use yardmaster_dataplane::llm::{DecoderConfig, DecoderSession, DecoderWorker, Eviction, FrameRequest};
use yardmaster_dataplane::{DataplaneError, Runtime};

use crate::framing::FrameOutcome;

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

/// The decoder every worker loads.
#[derive(Debug, Clone)]
pub struct DecoderModel {
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Its dimensions (checked against the file's metadata at load).
    pub config: DecoderConfig,
}

/// What a decoder worker does next.
pub enum WorkerCommand {
    /// Run a frame (unless its generation is no longer current when it starts).
    Run {
        /// The frame's generation.
        generation: u64,
        /// Its sequences, planned.
        requests: Vec<FrameRequest>,
    },
    /// Take a sequence out of the KV budget.
    Evict(u64, Eviction),
    /// Drop whatever is held for a sequence.
    Forget(u64),
    /// Hand what the worker holds to the callback, once every command before is done.
    Holdings(Box<dyn FnOnce(Holdings) + Send>),
    /// Rebuild the session with this many intra-op threads (the caches stay).
    Threads(u32),
    /// End the thread.
    Stop,
}

/// What a decoder worker reports.
#[derive(Debug)]
pub enum WorkerReport {
    /// It loaded the decoder and takes frames.
    Ready {
        /// How long the load took.
        took: Duration,
    },
    /// It could not load the decoder (the reason); the thread has ended.
    LoadFailed(String),
    /// A frame ended.
    FrameDone {
        /// The frame's generation.
        generation: u64,
        /// Its wall time.
        duration: Duration,
        /// What came of it.
        outcome: FrameOutcome,
    },
}

/// The reporting callback of a worker.
pub type Reporter = Box<dyn FnMut(WorkerReport) + Send>;

/// A running decoder worker thread.
#[derive(Clone)]
pub struct DecoderThread {
    commands: Sender<WorkerCommand>,
    current: Arc<AtomicU64>,
}

impl DecoderThread {
    /// Start worker `worker`'s thread: it loads `model` on `runtime` with `threads`
    /// intra-op threads, then handles commands, reporting to `report`.
    pub fn spawn(runtime: Arc<Runtime>, model: DecoderModel, worker: u32, threads: u32, report: Reporter) -> std::io::Result<Self> {
        let (commands, receiver) = mpsc::channel();
        let current = Arc::new(AtomicU64::new(0));
        let generation = Arc::clone(&current);
        std::thread::Builder::new()
            .name(format!("yardmaster-decoder-{worker}"))
            .spawn(move || serve(&runtime, &model, worker, threads, &generation, receiver, report))?;
        Ok(Self { commands, current })
    }

    /// Make `generation` current and queue its frame; `Err` (why) when the thread has
    /// ended.
    pub fn run(&self, generation: u64, requests: Vec<FrameRequest>) -> Result<(), String> {
        self.current.store(generation, Ordering::SeqCst);
        if self.send(WorkerCommand::Run { generation, requests }) {
            Ok(())
        } else {
            Err("the decoder worker's thread has ended".into())
        }
    }

    /// Stop the current frame before its next step (no generation is current after).
    pub fn abort(&self) {
        self.current.store(0, Ordering::SeqCst);
    }

    /// Queue a command. False when the thread has ended.
    pub fn send(&self, command: WorkerCommand) -> bool {
        self.commands.send(command).is_ok()
    }
}

/// The thread: load the decoder, then handle commands until told to stop.
fn serve(
    runtime: &Runtime,
    model: &DecoderModel,
    worker: u32,
    threads: u32,
    current: &AtomicU64,
    commands: Receiver<WorkerCommand>,
    mut report: Reporter,
) {
    let began = Instant::now();
    let mut decoder = match DecoderSession::load(runtime, &model.path, model.config, threads as usize) {
        Ok(session) => DecoderWorker::new(session),
        Err(error) => {
            tracing::error!(worker, "decoder worker failed to start: {error}");
            report(WorkerReport::LoadFailed(format!("decoder worker {worker} could not load {}: {error}", model.path.display())));
            return;
        }
    };
    tracing::info!(worker, threads, "decoder worker ready");
    report(WorkerReport::Ready { took: began.elapsed() });
    while let Ok(command) = commands.recv() {
        match command {
            WorkerCommand::Run { generation, requests } => {
                let begin = Instant::now();
                let stop = || current.load(Ordering::SeqCst) != generation;
                let outcome = if stop() {
                    FrameOutcome::Aborted
                } else {
                    match decoder.run(&requests, &stop) {
                        Ok(frame) => FrameOutcome::Done { frame, resident_bytes: decoder.resident_bytes() },
                        Err(DataplaneError::Aborted) => FrameOutcome::Aborted,
                        Err(error) => FrameOutcome::Failed(format!("decoder worker {worker}: {error}")),
                    }
                };
                report(WorkerReport::FrameDone { generation, duration: begin.elapsed(), outcome });
            }
            WorkerCommand::Evict(sequence, how) => decoder.evict(sequence, how),
            WorkerCommand::Forget(sequence) => decoder.forget(sequence),
            WorkerCommand::Holdings(reply) => {
                reply(Holdings { resident: decoder.resident(), swapped: decoder.swapped(), resident_bytes: decoder.resident_bytes() })
            }
            WorkerCommand::Threads(threads) => match DecoderSession::load(runtime, &model.path, model.config, threads as usize) {
                Ok(session) => decoder.replace_session(session),
                Err(error) => tracing::warn!(worker, threads, "reloading the decoder failed: {error}; it keeps its session"),
            },
            WorkerCommand::Stop => return,
        }
    }
}
