//! The node side of a decoder connection: the decoder worker threads one controller
//! runs on this host ([`crate::llm::worker`]), driven by the commands of
//! [`super::framing::decoder`]. Each worker's reports become event frames on its
//! stream: `decoder ready`, `frame done`, `holdings report`, and `start failed` when the
//! decoder does not load.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use yardmaster_dataplane::llm::DecoderConfig;
use yardmaster_dataplane::{DataplaneError, Runtime, WorkerEvent};

use super::framing::{DecoderMessage, FrameOutcome, Message};
use super::node::{node_path, relative_paths_note};
use crate::decoder_thread::{DecoderModel, DecoderThread, WorkerCommand, WorkerReport};

/// An event for the stream of the worker it names.
pub(super) type Routed = (u32, Message);

/// One controller's decoder workers on this node.
pub(super) struct DecoderHost {
    runtime: Arc<Runtime>,
    model: DecoderModel,
    workers: HashMap<u32, DecoderThread>,
    events: UnboundedSender<Routed>,
}

/// The decoder a hello names, with its path resolved on this node (relative paths
/// against `root`), or why it cannot be served.
pub(super) fn resolve(path: &Path, config: DecoderConfig, root: Option<&Path>) -> Result<DecoderModel, String> {
    config.check().map_err(|e| format!("the decoder's dimensions are not valid: {e}"))?;
    let path = node_path(path, root);
    if !path.is_file() {
        return Err(format!("decoder model not found at {} on this node ({})", path.display(), relative_paths_note(root)));
    }
    Ok(DecoderModel { path, config })
}

impl DecoderHost {
    /// A host running `model` on `runtime`, sending its events to `events`.
    pub(super) fn new(runtime: Arc<Runtime>, model: DecoderModel, events: UnboundedSender<Routed>) -> Self {
        Self { runtime, model, workers: HashMap::new(), events }
    }

    /// Apply one command from the controller (its stream was checked to belong to the
    /// worker it names); `Err` is a protocol error.
    pub(super) fn command(&mut self, message: Message) -> Result<(), String> {
        let event = |worker: u32, message: DecoderMessage| {
            let _ = self.events.send((worker, Message::Decoder(message)));
        };
        match message {
            Message::Decoder(DecoderMessage::Provision { worker, threads }) => {
                if let Some(old) = self.workers.remove(&worker) {
                    old.send(WorkerCommand::Stop);
                }
                let events = self.events.clone();
                let report = Box::new(move |report: WorkerReport| {
                    let message = match report {
                        WorkerReport::Ready { took } => Message::Decoder(DecoderMessage::Ready { worker, took }),
                        WorkerReport::LoadFailed(reason) => {
                            Message::Event(WorkerEvent::StartFailed { worker, error: DataplaneError::Invalid(reason) })
                        }
                        WorkerReport::FrameDone { generation, duration, outcome } => {
                            Message::Decoder(DecoderMessage::FrameDone { worker, generation, duration, outcome })
                        }
                    };
                    let _ = events.send((worker, message));
                });
                match DecoderThread::spawn(self.runtime.clone(), self.model.clone(), worker, threads, report) {
                    Ok(thread) => {
                        self.workers.insert(worker, thread);
                    }
                    Err(error) => {
                        let error = DataplaneError::Invalid(format!("starting decoder worker {worker} on the node: {error}"));
                        let _ = self.events.send((worker, Message::Event(WorkerEvent::StartFailed { worker, error })));
                    }
                }
            }
            Message::Decoder(DecoderMessage::Frame { worker, generation, requests }) => {
                let started = match self.workers.get(&worker) {
                    Some(thread) => thread.run(generation, requests),
                    None => Err(format!("decoder worker {worker} is not running on the node")),
                };
                if let Err(reason) = started {
                    let outcome = FrameOutcome::Failed(reason);
                    event(worker, DecoderMessage::FrameDone { worker, generation, duration: Default::default(), outcome });
                }
            }
            Message::Decoder(DecoderMessage::Evict { worker, sequence, eviction }) => {
                self.send(worker, WorkerCommand::Evict(sequence, eviction))
            }
            Message::Decoder(DecoderMessage::Forget { worker, sequence }) => self.send(worker, WorkerCommand::Forget(sequence)),
            Message::Decoder(DecoderMessage::Holdings { worker }) => {
                let events = self.events.clone();
                let reply = Box::new(move |holdings| {
                    let _ = events.send((worker, Message::Decoder(DecoderMessage::HoldingsReport { worker, holdings })));
                });
                if !self.send_checked(worker, WorkerCommand::Holdings(reply)) {
                    event(worker, DecoderMessage::HoldingsReport { worker, holdings: Default::default() });
                }
            }
            Message::Abort { worker } => {
                if let Some(thread) = self.workers.get(&worker) {
                    thread.abort();
                }
            }
            Message::SetThreads { worker, threads } => self.send(worker, WorkerCommand::Threads(threads)),
            Message::Retire { worker } => {
                if let Some(thread) = self.workers.remove(&worker) {
                    thread.abort();
                    thread.send(WorkerCommand::Stop);
                }
                let _ = self.events.send((worker, Message::Event(WorkerEvent::Retired { worker })));
            }
            other => return Err(format!("a {} on a decoder connection", other.name())),
        }
        Ok(())
    }

    fn send(&self, worker: u32, command: WorkerCommand) {
        self.send_checked(worker, command);
    }

    fn send_checked(&self, worker: u32, command: WorkerCommand) -> bool {
        self.workers.get(&worker).is_some_and(|thread| thread.send(command))
    }

    /// Stop every worker (the connection ended).
    pub(super) fn stop_all(&mut self) {
        for (_, thread) in self.workers.drain() {
            thread.abort();
            thread.send(WorkerCommand::Stop);
        }
    }
}
