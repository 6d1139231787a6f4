//! The controller side of a decoder connection: [`RemoteDecoders`] runs an LLM
//! pipeline's iteration workers on a `yardmaster node`, so a `[[remote]]` section can
//! place a decoder stage on another host. The stream layout is the batch link's (see
//! [`crate::remote`]): a hello stream (a decoder hello naming the model file, as the
//! node sees it, and its dimensions; the node answers welcome or refused), then one
//! bidirectional stream per worker carrying its commands in order and its events back.
//!
//! A [`RemoteWorker`] takes the same [`WorkerCommand`]s as a local decoder thread and
//! reports through the same callback, so the executor treats both alike. The texts
//! stay here: a frame carries each sequence's text, the node keeps the KV caches.
//!
//! When the connection is lost (the node died, the network was silent for the idle
//! timeout, a protocol error), every worker that is not retiring reports
//! [`WorkerReport::LoadFailed`] with the cause: the executor ends its current frame
//! with that error and the engine stops counting the worker. Later commands are
//! refused, so no request waits on a node that is gone.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Result;
use quinn::{Connection, RecvStream};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use yardmaster_dataplane::llm::FrameRequest;
use yardmaster_dataplane::WorkerEvent;

use super::executor::{DecoderModel, Holdings};
use yardmaster_cluster::decoder_thread::{Reporter, WorkerCommand, WorkerReport};
use yardmaster_cluster::framing::{self, DecoderMessage, Message};
use yardmaster_cluster::transport::{self, Fingerprint, ReadError, CLOSE_DONE, CLOSE_PROTOCOL};

/// How to reach a node and what decoder to run there.
#[derive(Debug, Clone)]
pub struct RemoteDecoderConfig {
    /// The node's UDP address.
    pub address: SocketAddr,
    /// The node's certificate fingerprint.
    pub pin: Fingerprint,
    /// The decoder, with its path as the node sees it (relative paths resolve against
    /// the node's model folder).
    pub model: DecoderModel,
    /// Intra-op threads of new workers.
    pub threads: u32,
    /// Silence after which the node counts as gone (also the connect timeout).
    pub idle_timeout: Duration,
}

/// A reporting callback shared between the stream reader and a loss.
type SharedReporter = Arc<Mutex<Reporter>>;

/// A callback waiting for a holdings report.
type HoldingsReply = Box<dyn FnOnce(Holdings) + Send>;

/// One worker as the controller knows it.
struct WorkerState {
    outbox: UnboundedSender<Message>,
    report: SharedReporter,
    holdings: VecDeque<HoldingsReply>,
    retiring: bool,
}

/// What a connection's tasks and its workers share.
struct State {
    node: SocketAddr,
    workers: HashMap<u32, WorkerState>,
    lost: Option<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Record the loss of the connection and report every live worker lost.
fn lose(state: &Mutex<State>, reason: String) {
    let reporters: Vec<SharedReporter> = {
        let mut state = lock(state);
        if state.lost.is_some() {
            return;
        }
        tracing::warn!("remote decoders: node {} lost: {reason}", state.node);
        state.lost = Some(reason.clone());
        let mut workers: Vec<_> = state.workers.drain().collect();
        workers.sort_by_key(|(worker, _)| *worker);
        workers.into_iter().filter(|(_, w)| !w.retiring).map(|(_, w)| w.report).collect()
    };
    let reason = format!("connection to the decoder node lost: {reason}");
    for report in reporters {
        (lock(&report))(WorkerReport::LoadFailed(reason.clone()));
    }
}

/// Decoder workers on a remote node.
pub struct RemoteDecoders {
    address: SocketAddr,
    connection: Connection,
    _endpoint: quinn::Endpoint,
    runtime: Handle,
    device: String,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for RemoteDecoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDecoders").field("node", &self.address).field("device", &self.device).finish()
    }
}

impl RemoteDecoders {
    /// Connect to a node, send it the decoder hello and wait for its welcome. The
    /// connection's tasks run on the current Tokio runtime, which must outlive it.
    pub async fn connect(config: RemoteDecoderConfig) -> Result<RemoteDecoders> {
        let address = config.address;
        let hello = Message::Decoder(DecoderMessage::Hello {
            threads: config.threads,
            model: config.model.path.clone(),
            config: config.model.config,
        });
        let (endpoint, connection, welcome) = transport::handshake(address, config.pin, config.idle_timeout, &hello, "the decoder").await?;
        let device = welcome.device;
        let state = Arc::new(Mutex::new(State { node: address, workers: HashMap::new(), lost: None }));
        let runtime = Handle::current();
        let (watched, watcher_state) = (connection.clone(), state.clone());
        runtime.spawn(async move {
            let reason = match watched.closed().await {
                quinn::ConnectionError::LocallyClosed => "the controller closed the connection".to_string(),
                other => transport::describe_close(&other),
            };
            lose(&watcher_state, reason);
        });
        tracing::info!("remote decoders: connected to node {address} ({device})");
        Ok(RemoteDecoders { address, connection, _endpoint: endpoint, runtime, device, state })
    }

    /// The node's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The node's device, in words (from its welcome).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Why the connection was lost, once it is.
    pub fn lost(&self) -> Option<String> {
        lock(&self.state).lost.clone()
    }

    /// Start decoder worker `worker` on the node with `threads` intra-op threads,
    /// reporting to `report`.
    pub fn provision(&self, worker: u32, threads: u32, report: Reporter) -> Result<RemoteWorker, String> {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.lost {
            return Err(format!("decoder node {} is gone: {reason}", self.address));
        }
        let (outbox, queue) = mpsc::unbounded_channel();
        let _ = outbox.send(Message::Decoder(DecoderMessage::Provision { worker, threads }));
        self.runtime.spawn(worker_stream(self.connection.clone(), queue, self.state.clone()));
        // A new provision of the same id replaces the old stream (dropping its sender
        // finishes it).
        state
            .workers
            .insert(worker, WorkerState { outbox, report: Arc::new(Mutex::new(report)), holdings: VecDeque::new(), retiring: false });
        Ok(RemoteWorker { worker, node: self.address, state: self.state.clone() })
    }
}

impl Drop for RemoteDecoders {
    fn drop(&mut self) {
        self.connection.close(CLOSE_DONE, b"the controller closed its decoder connection");
    }
}

/// A decoder worker on a node: takes the commands a local decoder thread takes.
#[derive(Clone)]
pub struct RemoteWorker {
    worker: u32,
    node: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl RemoteWorker {
    /// Send a frame; `Err` (why) when the worker or its node is gone or the frame is
    /// too large to send.
    pub fn run(&self, generation: u64, requests: Vec<FrameRequest>) -> Result<(), String> {
        let message = Message::Decoder(DecoderMessage::Frame { worker: self.worker, generation, requests });
        framing::encoded_len(&message).map_err(|e| format!("the frame cannot be sent to decoder node {}: {e}", self.node))?;
        self.deliver(message)
    }

    /// Stop the worker's current frame.
    pub fn abort(&self) {
        let _ = self.deliver(Message::Abort { worker: self.worker });
    }

    /// Send a command; false when the worker or its node is gone.
    pub fn send(&self, command: WorkerCommand) -> bool {
        let worker = self.worker;
        let message = match command {
            WorkerCommand::Run { generation, requests } => return self.run(generation, requests).is_ok(),
            WorkerCommand::Evict(sequence, eviction) => Message::Decoder(DecoderMessage::Evict { worker, sequence, eviction }),
            WorkerCommand::Forget(sequence) => Message::Decoder(DecoderMessage::Forget { worker, sequence }),
            WorkerCommand::Holdings(reply) => {
                let mut state = lock(&self.state);
                if state.lost.is_some() {
                    return false;
                }
                let Some(entry) = state.workers.get_mut(&worker) else { return false };
                entry.holdings.push_back(reply);
                return entry.outbox.send(Message::Decoder(DecoderMessage::Holdings { worker })).is_ok();
            }
            WorkerCommand::Threads(threads) => Message::SetThreads { worker, threads },
            WorkerCommand::Stop => {
                let mut state = lock(&self.state);
                return match state.workers.get_mut(&worker) {
                    Some(entry) => {
                        entry.retiring = true;
                        entry.outbox.send(Message::Retire { worker }).is_ok()
                    }
                    None => false,
                };
            }
        };
        self.deliver(message).is_ok()
    }

    fn deliver(&self, message: Message) -> Result<(), String> {
        let state = lock(&self.state);
        if let Some(reason) = &state.lost {
            return Err(format!("decoder node {} is gone: {reason}", self.node));
        }
        let entry = state.workers.get(&self.worker).ok_or_else(|| format!("decoder worker {} is not running", self.worker))?;
        entry.outbox.send(message).map_err(|_| format!("decoder worker {}'s stream to node {} has ended", self.worker, self.node))
    }
}

/// A worker's stream: open it, start its reader, then write the worker's commands in
/// order until the worker is dropped (which finishes the stream).
async fn worker_stream(connection: Connection, outbox: UnboundedReceiver<Message>, state: Arc<Mutex<State>>) {
    let (send, recv) = match connection.open_bi().await {
        Ok(streams) => streams,
        Err(_) => return, // the connection is gone; its watcher reports the loss
    };
    tokio::spawn(read_events(recv, connection.clone(), state.clone()));
    transport::write_messages(send, outbox, |message, error| {
        // Frames are checked before they are queued; anything else is a bug.
        tracing::error!("remote decoders: cannot encode a {}: {error}", message.name());
        None
    })
    .await;
}

/// Turn the node's frames on one worker stream into reports.
async fn read_events(mut recv: RecvStream, connection: Connection, state: Arc<Mutex<State>>) {
    loop {
        let problem = match transport::read_frame(&mut recv).await {
            Ok(Some(message)) => match handle_event(&state, message) {
                Ok(()) => continue,
                Err(problem) => problem,
            },
            Ok(None) | Err(ReadError::Transport(_)) => return,
            Err(error) => format!("{error} (from the node)"),
        };
        // Record the reason before closing: the watcher only sees a local close.
        lose(&state, format!("protocol error: {problem}"));
        connection.close(CLOSE_PROTOCOL, &transport::close_reason(&problem));
        return;
    }
}

/// Pass one event from the node on; `Err` is a protocol error.
fn handle_event(state: &Mutex<State>, message: Message) -> Result<(), String> {
    let (worker, report) = match message {
        Message::Decoder(DecoderMessage::Ready { worker, took }) => (worker, WorkerReport::Ready { took }),
        Message::Decoder(DecoderMessage::FrameDone { worker, generation, duration, outcome }) => {
            (worker, WorkerReport::FrameDone { generation, duration, outcome })
        }
        Message::Decoder(DecoderMessage::HoldingsReport { worker, holdings }) => {
            let reply = lock(state).workers.get_mut(&worker).and_then(|w| w.holdings.pop_front());
            if let Some(reply) = reply {
                reply(holdings);
            }
            return Ok(());
        }
        Message::Event(WorkerEvent::StartFailed { worker, error }) => {
            let node = lock(state).node;
            (worker, WorkerReport::LoadFailed(format!("decoder node {node}: {error}")))
        }
        Message::Event(WorkerEvent::Retired { worker }) => {
            let mut state = lock(state);
            if state.workers.get(&worker).is_some_and(|w| w.retiring) {
                // Dropping the sender finishes the stream.
                state.workers.remove(&worker);
            }
            return Ok(());
        }
        other => return Err(format!("the node sent a {} on a decoder worker stream", other.name())),
    };
    let reporter = lock(state).workers.get(&worker).map(|w| w.report.clone());
    if let Some(reporter) = reporter {
        (lock(&reporter))(report);
    }
    Ok(())
}
