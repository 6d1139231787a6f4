//! The controller side of the inter-node link: [`RemotePool`] is a [`Workers`] whose
//! workers run on a `yardmaster node` reached over QUIC. Commands become frames on the
//! worker's stream; the node's event frames become [`WorkerEvent`]s on the same kind of
//! channel a local [`yardmaster_dataplane::WorkerPool`] gives, so the executor cannot
//! tell the two apart.
//!
//! The [`Workers`] methods are synchronous and never wait for the network: they check
//! what can be checked here (the catalogue, whether the worker exists, the frame
//! limits), queue the frame for the worker's writer task and return. Errors the node
//! meets later come back as events: a job the node cannot start ends as `Finished`
//! with the error, a failed reconfiguration as `ReconfigureFailed`.
//!
//! The pool mirrors each worker's state (starting, retiring, jobs in flight, pending
//! reconfigurations) from the commands it sends and the events it receives. When the
//! connection is lost — the node died, the network went away for the idle timeout, the
//! node shut down or either side closed it for a protocol error — every job in flight
//! ends as `Finished` with an error naming the cause, every pending reconfiguration as
//! `ReconfigureFailed`, every retirement as `Retired`, and every other worker —
//! starting, idle or busy — as `StartFailed` with the cause (the executor's sign that a
//! worker is lost: it tells the engine, which stops counting it); no request is
//! stranded and no worker is left looking alive. Later calls return that error.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{self as std_mpsc, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Result;
use quinn::{Connection, RecvStream};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use yardmaster_dataplane::{DataplaneError, Job, JobTiming, ModelCatalog, WorkerEvent};

use super::framing::{self, Message};
use super::transport::{self, ReadError, Trust, Welcome, CLOSE_DONE, CLOSE_PROTOCOL};
use crate::workers::Workers;

/// How to reach a node and what to ask of it.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The node's UDP address.
    pub address: SocketAddr,
    /// How the node is recognised: its certificate's fingerprint, or the cluster CA
    /// (see [`transport`]).
    pub trust: Trust,
    /// The models the node's pool serves, `stages[stage][variant]`, with paths as the
    /// node sees them (relative ones resolve against the node's model folder).
    pub catalog: ModelCatalog,
    /// Intra-op threads of new workers (0: ONNX Runtime's default).
    pub threads: u32,
    /// Silence after which the node counts as gone (also the connect timeout).
    pub idle_timeout: Duration,
}

impl RemoteConfig {
    /// A configuration with one intra-op thread per worker and a 10 s idle timeout.
    pub fn new(address: SocketAddr, trust: impl Into<Trust>, catalog: ModelCatalog) -> Self {
        RemoteConfig { address, trust: trust.into(), catalog, threads: 1, idle_timeout: Duration::from_secs(10) }
    }
}

/// Workers on a remote node.
pub struct RemotePool {
    address: SocketAddr,
    connection: Connection,
    _endpoint: quinn::Endpoint,
    runtime: Handle,
    catalog: ModelCatalog,
    welcome: Welcome,
    shared: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for RemotePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePool")
            .field("node", &self.address)
            .field("host", &self.welcome.name)
            .field("device", &self.welcome.device)
            .finish()
    }
}

/// One worker as the controller knows it.
struct WorkerState {
    stage: u32,
    stream: UnboundedSender<Message>,
    starting: bool,
    retiring: bool,
    jobs: Vec<u64>,
    reconfigs: u32,
}

/// What the tasks of a connection and the pool's methods share.
struct Shared {
    node: SocketAddr,
    workers: HashMap<u32, WorkerState>,
    events: std_mpsc::Sender<WorkerEvent>,
    lost: Option<String>,
    /// Workers known when the connection was lost (a later retire reports `Retired`).
    gone: HashSet<u32>,
}

impl Shared {
    fn lost_error(&self) -> Option<DataplaneError> {
        self.lost.as_ref().map(|reason| lost_error(self.node, reason))
    }

    /// Pass on an event from the node, updating the mirror. Events after a loss are
    /// dropped: the loss already ended everything.
    fn deliver(&mut self, event: WorkerEvent) {
        if self.lost.is_some() {
            return;
        }
        match &event {
            WorkerEvent::Ready { worker, .. } | WorkerEvent::StartFailed { worker, .. } => {
                if let Some(state) = self.workers.get_mut(worker) {
                    state.starting = false;
                }
            }
            WorkerEvent::Finished { worker, job, .. } | WorkerEvent::Aborted { worker, job } => {
                if let Some(state) = self.workers.get_mut(worker) {
                    state.jobs.retain(|j| j != job);
                }
            }
            WorkerEvent::Reconfigured { worker, .. } | WorkerEvent::ReconfigureFailed { worker, .. } => {
                if let Some(state) = self.workers.get_mut(worker) {
                    state.reconfigs = state.reconfigs.saturating_sub(1);
                }
            }
            WorkerEvent::Retired { worker } => {
                // Dropping the state drops the stream's sender: the writer finishes the
                // stream and the node forgets it.
                if self.workers.get(worker).is_some_and(|s| s.retiring) {
                    self.workers.remove(worker);
                }
            }
        }
        let _ = self.events.send(event);
    }

    /// The connection is gone: end everything in flight with `reason`.
    fn lose(&mut self, reason: String) {
        if self.lost.is_some() {
            return;
        }
        tracing::warn!("remote pool: node {} lost: {reason}", self.node);
        let error = lost_error(self.node, &reason);
        self.lost = Some(reason);
        let mut workers: Vec<_> = self.workers.drain().collect();
        workers.sort_by_key(|(worker, _)| *worker);
        // Jobs first: their requests are what clients wait on.
        for (worker, state) in &workers {
            for &job in &state.jobs {
                let _ = self.events.send(WorkerEvent::Finished {
                    worker: *worker,
                    job,
                    duration: Duration::ZERO,
                    timing: JobTiming::default(),
                    result: Err(error.clone()),
                });
            }
        }
        for (worker, state) in workers {
            for _ in 0..state.reconfigs {
                let _ = self.events.send(WorkerEvent::ReconfigureFailed { worker, error: error.clone() });
            }
            if state.retiring {
                let _ = self.events.send(WorkerEvent::Retired { worker });
            } else {
                // Idle and busy workers are lost as much as starting ones.
                let _ = self.events.send(WorkerEvent::StartFailed { worker, error: error.clone() });
                self.gone.insert(worker);
            }
        }
    }
}

fn lost_error(node: SocketAddr, reason: &str) -> DataplaneError {
    DataplaneError::Io { path: PathBuf::from(format!("quic://{node}")), message: format!("connection to the node lost: {reason}") }
}

impl RemotePool {
    /// Connect to a node, send it the catalogue and wait for its welcome. The pool's
    /// tasks run on the current Tokio runtime, which must outlive the pool. Events of
    /// every worker arrive on the returned receiver.
    pub async fn connect(config: RemoteConfig) -> Result<(RemotePool, Receiver<WorkerEvent>)> {
        let address = config.address;
        let hello = Message::Hello { threads: config.threads, catalog: config.catalog.clone() };
        let (endpoint, connection, welcome) =
            transport::handshake(address, config.trust, config.idle_timeout, &hello, "the catalogue").await?;

        let (events, receiver) = std_mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared { node: address, workers: HashMap::new(), events, lost: None, gone: HashSet::new() }));
        let runtime = Handle::current();
        let watched = connection.clone();
        let watcher_shared = shared.clone();
        runtime.spawn(async move {
            let error = watched.closed().await;
            let reason = match error {
                quinn::ConnectionError::LocallyClosed => "the controller closed the connection".to_string(),
                other => transport::describe_close(&other),
            };
            lock(&watcher_shared).lose(reason);
        });
        tracing::info!("remote pool: connected to node {} at {address} ({}, {} slots)", welcome.name, welcome.device, welcome.slots);
        let pool = RemotePool { address, connection, _endpoint: endpoint, runtime, catalog: config.catalog, welcome, shared };
        Ok((pool, receiver))
    }

    /// [`RemotePool::connect`] from synchronous code, running its tasks on `runtime`.
    /// Must not be called from inside a runtime's own threads.
    pub fn connect_blocking(runtime: &Handle, config: RemoteConfig) -> Result<(RemotePool, Receiver<WorkerEvent>)> {
        runtime.block_on(Self::connect(config))
    }

    /// The node's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The node's device, in words (from its welcome).
    pub fn device(&self) -> &str {
        &self.welcome.device
    }

    /// What the node said of itself: its name, slots and cache capacity.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// The QUIC connection to the node (to watch for its end: `closed().await`).
    pub fn connection(&self) -> Connection {
        self.connection.clone()
    }

    /// QUIC statistics of the connection (round-trip time, congestion window, packets
    /// lost), for metrics and benchmarks.
    pub fn stats(&self) -> quinn::ConnectionStats {
        self.connection.stats()
    }

    /// Why the connection was lost, once it is.
    pub fn lost(&self) -> Option<String> {
        lock(&self.shared).lost.clone()
    }

    /// The worker's stream, opening it (and its writer and reader tasks) if needed.
    fn stream(&self, shared: &mut Shared, worker: u32) -> UnboundedSender<Message> {
        if let Some(state) = shared.workers.get(&worker) {
            return state.stream.clone();
        }
        let (stream, outbox) = mpsc::unbounded_channel();
        self.runtime.spawn(worker_stream(self.connection.clone(), outbox, self.shared.clone(), worker));
        stream
    }

    /// The state of a worker that takes commands (provisioned, not retiring).
    fn live<'a>(shared: &'a mut MutexGuard<'_, Shared>, worker: u32) -> Result<&'a mut WorkerState, DataplaneError> {
        if let Some(error) = shared.lost_error() {
            return Err(error);
        }
        shared.workers.get_mut(&worker).filter(|s| !s.retiring).ok_or(DataplaneError::WorkerGone(worker))
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Workers for RemotePool {
    fn serves(&self, stage: u32) -> bool {
        // A stateful model's replicas run on this server's own workers: the wire
        // protocol does not carry a request's place in its sequence, nor the model's
        // sequence settings.
        self.catalog
            .stages
            .get(stage as usize)
            .is_some_and(|variants| !variants.is_empty() && variants.iter().all(|v| v.sequence.is_none()))
    }

    fn provision(&mut self, worker: u32, stage: u32, variant: u32) -> yardmaster_dataplane::Result<()> {
        let mut shared = lock(&self.shared);
        if let Some(error) = shared.lost_error() {
            return Err(error);
        }
        self.catalog.get(stage, variant)?;
        let stream = self.stream(&mut shared, worker);
        let state = shared.workers.entry(worker).or_insert_with(|| WorkerState {
            stage,
            stream,
            starting: false,
            retiring: false,
            jobs: Vec::new(),
            reconfigs: 0,
        });
        state.stage = stage;
        state.starting = true;
        state.retiring = false;
        shared.gone.remove(&worker);
        let _ = shared.workers[&worker].stream.send(Message::Provision { worker, stage, variant });
        Ok(())
    }

    fn start(&mut self, worker: u32, job: Job) -> yardmaster_dataplane::Result<()> {
        let mut shared = lock(&self.shared);
        let state = Self::live(&mut shared, worker)?;
        let id = job.id;
        let message = Message::Start { worker, job };
        framing::encoded_len(&message)
            .map_err(|e| DataplaneError::Invalid(format!("job {id} cannot be sent to node {}: {e}", self.address)))?;
        state.jobs.push(id);
        // A send that fails means the writer is gone with the connection: the loss
        // ends the job.
        let _ = state.stream.send(message);
        Ok(())
    }

    fn abort(&mut self, worker: u32) -> Option<u64> {
        let mut shared = lock(&self.shared);
        let state = Self::live(&mut shared, worker).ok()?;
        let job = state.jobs.last().copied()?;
        let _ = state.stream.send(Message::Abort { worker });
        Some(job)
    }

    fn retire(&mut self, worker: u32) {
        let mut shared = lock(&self.shared);
        if shared.lost.is_some() {
            if shared.gone.remove(&worker) {
                let _ = shared.events.send(WorkerEvent::Retired { worker });
            }
            return;
        }
        if let Some(state) = shared.workers.get_mut(&worker) {
            state.retiring = true;
            state.starting = false;
            let _ = state.stream.send(Message::Retire { worker });
        }
    }

    fn set_threads(&mut self, worker: u32, threads: u32) -> yardmaster_dataplane::Result<()> {
        let mut shared = lock(&self.shared);
        let state = Self::live(&mut shared, worker)?;
        state.reconfigs += 1;
        let _ = state.stream.send(Message::SetThreads { worker, threads });
        Ok(())
    }

    fn set_variant(&mut self, worker: u32, variant: u32) -> yardmaster_dataplane::Result<()> {
        let mut shared = lock(&self.shared);
        let state = Self::live(&mut shared, worker)?;
        self.catalog.get(state.stage, variant)?;
        state.reconfigs += 1;
        let _ = state.stream.send(Message::SetVariant { worker, variant });
        Ok(())
    }
}

impl Drop for RemotePool {
    fn drop(&mut self) {
        self.connection.close(CLOSE_DONE, b"the controller closed its pool");
    }
}

/// A worker's stream: open it, start its reader, then write the worker's commands in
/// order until the pool drops the worker (which finishes the stream).
async fn worker_stream(connection: Connection, outbox: UnboundedReceiver<Message>, shared: Arc<Mutex<Shared>>, worker: u32) {
    let (send, recv) = match connection.open_bi().await {
        Ok(streams) => streams,
        Err(_) => return, // the connection is gone; its watcher ends everything
    };
    tokio::spawn(read_events(recv, connection.clone(), shared.clone()));
    transport::write_messages(send, outbox, |message, error| {
        // Checked in `start`; should it still fail, the job ends here.
        if let Message::Start { job, .. } = message {
            lock(&shared).deliver(WorkerEvent::Finished {
                worker,
                job: job.id,
                duration: Duration::ZERO,
                timing: JobTiming::default(),
                result: Err(DataplaneError::Invalid(format!("the job cannot be sent to the node: {error}"))),
            });
        }
        None
    })
    .await;
}

/// Turn the node's frames on one worker stream into events.
async fn read_events(mut recv: RecvStream, connection: Connection, shared: Arc<Mutex<Shared>>) {
    loop {
        let problem = match transport::read_frame(&mut recv).await {
            Ok(Some(Message::Event(event))) => {
                lock(&shared).deliver(event);
                continue;
            }
            Ok(Some(other)) => format!("the node sent a {} on a worker stream", other.name()),
            Ok(None) | Err(ReadError::Transport(_)) => return,
            Err(error) => format!("{error} (from the node)"),
        };
        // Record the reason before closing: the watcher only sees a local close.
        lock(&shared).lose(format!("protocol error: {problem}"));
        connection.close(CLOSE_PROTOCOL, &transport::close_reason(&problem));
        return;
    }
}
