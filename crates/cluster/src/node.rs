//! The worker-host side of the inter-node link: `yardmaster node --listen ADDR` runs a
//! QUIC endpoint; every controller that connects gets a [`WorkerPool`] of its own on
//! this host, serving the catalogue the controller sends in its hello, and drives it
//! with the commands of [`super::framing`]; the pool's events go back as frames.
//!
//! Per connection (see [`super`] for the stream layout): the first bidirectional
//! stream carries the hello and the node's welcome or refusal; every later one belongs
//! to one worker, from its provision on, and carries that worker's commands in and its
//! events out, in order. One task owns the pool and applies commands in the order
//! each stream delivers them; a blocking thread forwards the pool's events to it.
//!
//! Model paths in the hello are the node's paths: absolute ones are used as they are,
//! relative ones are resolved against the node's model folder (`--models`, by default
//! the PP-OCR folder the set-up script installs). A hello naming a file that is not
//! there is refused with the paths that are missing.
//!
//! A frame that does not decode, or a command that does not belong where it arrives
//! (a provision on the hello stream, a command for worker 3 on worker 4's stream),
//! closes that connection — and only that one — with [`CLOSE_PROTOCOL`] and the
//! reason. When a connection ends for any reason its workers' jobs are aborted and its
//! pool is dropped.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use yardmaster_dataplane::{
    assets, CacheConfig, DataplaneError, JobTiming, ModelCache, ModelCatalog, Runtime, WorkerContext, WorkerEvent, WorkerPool,
};

use super::decoder_host::{self, DecoderHost};
use super::framing::{self, DecoderMessage, FrameError, Message};
use super::transport::{self, Fingerprint, ReadError, CLOSE_PROTOCOL, CLOSE_SHUTDOWN};
use crate::tls::Identity;

/// How long a new connection has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused controller has to read the refusal before the node closes.
const REFUSAL_GRACE: Duration = Duration::from_secs(5);

/// `yardmaster node`: host workers for a controller on another machine.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// UDP address to listen on (`0.0.0.0:7443`; port 0 picks a free one, printed at
    /// start).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Folder of the node's TLS certificate and key, generated on first run (default:
    /// `node-tls` in the assets folder).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// Certificate (PEM) to present instead of the generated one; needs --key.
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// Folder that relative model paths are resolved against (default: the PP-OCR
    /// models folder of the set-up script).
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Seconds of silence after which a controller counts as gone (keep-alives are
    /// sent at a third of it).
    #[arg(long, default_value_t = 10.0)]
    pub idle_timeout: f64,
    /// The node's name as a host of the cluster (default: the machine's host name,
    /// which is the pod name on Kubernetes).
    #[arg(long)]
    pub name: Option<String>,
    /// Device slots this node offers: how many workers it runs at once. Default 1: one
    /// GPU (run one node per GPU, as a pod asking for one `nvidia.com/gpu`), or one
    /// CPU worker using every core; give more for a CPU node that should run several
    /// workers side by side.
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
    /// Host memory kept for cached model parameters, in bytes (default: 85 % of the
    /// machine's memory). A replica whose parameters are cached starts warm.
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Intra-op threads each worker may use, at most (default: the cores this process
    /// may use — its cgroup's CPU quota on Kubernetes — divided among its slots). The
    /// controller lets the policy give a worker no more; a request for more is capped.
    #[arg(long)]
    pub threads: Option<u32>,
}

/// The machine's host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else
/// `node`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|name| !name.is_empty()))
        .unwrap_or_else(|| "node".to_string())
}

/// What a node tells a controller about itself in its welcome: a host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOffer {
    /// Its name.
    pub name: String,
    /// Device slots.
    pub slots: u32,
    /// Parameter-cache capacity, bytes.
    pub cache_bytes: u64,
    /// Intra-op threads each worker may use.
    pub threads: u32,
}

impl HostOffer {
    /// The offer of `args`, with the defaults filled in.
    pub fn of(args: &NodeArgs) -> Result<HostOffer> {
        if args.slots == 0 {
            return Err(anyhow!("--slots must be at least 1"));
        }
        let cache_bytes = args.cache_bytes.unwrap_or_else(|| {
            // The share of memory above which the model cache evicts anyway.
            let share = CacheConfig::default().memory_threshold;
            yardmaster_dataplane::cache::system_memory().map_or(DEFAULT_CACHE_BYTES, |m| (m.total as f64 * share) as u64)
        });
        if args.threads == Some(0) {
            return Err(anyhow!("--threads must be at least 1"));
        }
        let threads = args.threads.unwrap_or_else(|| {
            let cores = yardmaster_dataplane::parallel::cores() as u32;
            (cores / args.slots).max(1)
        });
        Ok(HostOffer { name: args.name.clone().unwrap_or_else(host_name), slots: args.slots, cache_bytes, threads })
    }
}

/// Parameter-cache capacity where the machine's memory cannot be read.
pub const DEFAULT_CACHE_BYTES: u64 = 16 << 30;

/// Run `yardmaster node` until the process is stopped.
pub fn main(args: &NodeArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("yardmaster node: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &NodeArgs) -> Result<()> {
    let identity = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Identity::load(cert, key)?,
        _ => Identity::load_or_generate(&args.tls_dir.clone().unwrap_or_else(|| assets::assets_dir().join("node-tls")))?,
    };
    if !(args.idle_timeout.is_finite() && args.idle_timeout > 0.0) {
        return Err(anyhow!("--idle-timeout must be a positive number of seconds, not {}", args.idle_timeout));
    }
    let offer = HostOffer::of(args)?;
    let runtime = Runtime::global().context("bringing up ONNX Runtime")?;
    let cache = ModelCache::new(CacheConfig { budget_bytes: Some(offer.cache_bytes), ..CacheConfig::default() });
    let context = WorkerContext { runtime, cache: Arc::new(cache) };
    let model_root = args.models.clone().or_else(|| assets::models_dir().ok());
    let certificate = identity.certificate_path.clone();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("yardmaster-node")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    tokio.block_on(async move {
        let node = Node::bind(NodeConfig {
            listen: args.listen,
            identity,
            model_root,
            idle_timeout: Duration::from_secs_f64(args.idle_timeout),
            context,
            offer: offer.clone(),
        })?;
        // Controllers (and the tests) read these two lines.
        println!("yardmaster node listening on {}", node.local_addr()?);
        println!("certificate {} ({})", node.fingerprint(), certificate.display());
        use std::io::Write;
        std::io::stdout().flush()?;
        // What the node offers the cluster, for the operator (stderr: controllers and
        // tests read the two lines above and may close stdout after them).
        let _ = writeln!(
            std::io::stderr(),
            "host {}: {} slot(s), {} MiB of parameter cache, {} thread(s) per worker",
            offer.name,
            offer.slots,
            offer.cache_bytes >> 20,
            offer.threads
        );
        node.serve().await;
        Ok(())
    })
}

/// What a node needs.
pub struct NodeConfig {
    /// UDP address to listen on.
    pub listen: SocketAddr,
    /// Its certificate and key.
    pub identity: Identity,
    /// Folder that relative model paths resolve against (`None`: the working folder).
    pub model_root: Option<PathBuf>,
    /// Silence after which a controller counts as gone.
    pub idle_timeout: Duration,
    /// ONNX Runtime and the model cache shared by every connection's pool.
    pub context: WorkerContext,
    /// What the node offers the cluster (sent in its welcome).
    pub offer: HostOffer,
}

struct Shared {
    context: WorkerContext,
    model_root: Option<PathBuf>,
    device: String,
    offer: HostOffer,
}

/// A bound node endpoint, not yet serving.
pub struct Node {
    endpoint: quinn::Endpoint,
    fingerprint: Fingerprint,
    shared: Arc<Shared>,
}

/// Closes a serving node's endpoint (every connection ends with [`CLOSE_SHUTDOWN`]).
#[derive(Clone)]
pub struct ShutdownHandle(quinn::Endpoint);

impl ShutdownHandle {
    /// Close every connection with `reason` and stop accepting new ones.
    pub fn shutdown(&self, reason: &str) {
        self.0.close(CLOSE_SHUTDOWN, &transport::close_reason(reason));
    }
}

impl Node {
    /// Bind the QUIC endpoint. Must run inside a Tokio runtime.
    pub fn bind(config: NodeConfig) -> Result<Node> {
        let leaf = config.identity.chain.first().ok_or_else(|| anyhow!("the node's certificate chain is empty"))?;
        let fingerprint = Fingerprint::of(leaf);
        let server = transport::server_config(&config.identity, config.idle_timeout)?;
        let endpoint =
            transport::endpoint(config.listen, Some(server)).with_context(|| format!("binding the node endpoint on {}", config.listen))?;
        let device = config.context.runtime.device().to_string();
        Ok(Node {
            endpoint,
            fingerprint,
            shared: Arc::new(Shared { context: config.context, model_root: config.model_root, device, offer: config.offer }),
        })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.endpoint.local_addr().context("the node endpoint's address")
    }

    /// The fingerprint controllers pin.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// A handle that shuts the node down.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.endpoint.clone())
    }

    /// Accept controllers until the endpoint is closed.
    pub async fn serve(self) {
        while let Some(incoming) = self.endpoint.accept().await {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let connection = match incoming.await {
                    Ok(connection) => connection,
                    Err(error) => {
                        tracing::info!("node: handshake failed: {error}");
                        return;
                    }
                };
                let peer = connection.remote_address();
                tracing::info!("node: controller {peer} connected");
                let outcome = serve_connection(connection.clone(), shared).await;
                match outcome {
                    Ok(()) => tracing::info!(
                        "node: controller {peer} gone: {}",
                        connection.close_reason().map(|e| transport::describe_close(&e)).unwrap_or_default()
                    ),
                    Err(reason) => {
                        tracing::warn!("node: closing the connection of {peer}: {reason}");
                        connection.close(CLOSE_PROTOCOL, &transport::close_reason(&reason));
                    }
                }
            });
        }
    }
}

/// Serve one controller; `Err` is a protocol error to close the connection with.
async fn serve_connection(connection: Connection, shared: Arc<Shared>) -> Result<(), String> {
    let (mut send, mut recv) = match tokio::time::timeout(HELLO_TIMEOUT, connection.accept_bi()).await {
        Ok(Ok(streams)) => streams,
        Ok(Err(_)) => return Ok(()), // gone before saying anything
        Err(_) => return Err(format!("no hello within {HELLO_TIMEOUT:?}")),
    };
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, transport::read_frame(&mut recv)).await {
        Err(_) => return Err(format!("no hello within {HELLO_TIMEOUT:?}")),
        Ok(Ok(Some(hello @ (Message::Hello { .. } | Message::Decoder(DecoderMessage::Hello { .. }))))) => hello,
        Ok(Ok(Some(other))) => return Err(format!("expected a hello first, got a {}", other.name())),
        Ok(Ok(None)) => return Err("the hello stream ended before the hello".into()),
        Ok(Err(ReadError::Transport(_))) => return Ok(()),
        Ok(Err(error)) => return Err(format!("reading the hello: {error}")),
    };
    let (event_tx, events) = mpsc::unbounded_channel();
    let host = match open_host(hello, &shared, event_tx) {
        Ok(host) => host,
        Err(reason) => {
            tracing::warn!("node: refusing controller {}: {reason}", connection.remote_address());
            if let Ok(frame) = framing::encode(&Message::Refused { reason }) {
                let _ = transport::write_frame(&mut send, frame).await;
                let _ = send.finish();
            }
            let _ = tokio::time::timeout(REFUSAL_GRACE, connection.closed()).await;
            return Ok(());
        }
    };
    let offer = &shared.offer;
    let welcome = Message::Welcome {
        device: shared.device.clone(),
        name: offer.name.clone(),
        slots: offer.slots,
        cache_bytes: offer.cache_bytes,
        threads: offer.threads,
    };
    let welcome = framing::encode(&welcome).map_err(|e| e.to_string())?;
    if transport::write_frame(&mut send, welcome).await.is_err() {
        return Ok(());
    }
    let (inbound_tx, inbound) = mpsc::unbounded_channel();
    let max_threads = offer.threads;
    let mut session = Session { connection, host, streams: HashMap::new(), routes: HashMap::new(), next_key: 0, inbound_tx, max_threads };
    session.add_stream(send, recv, true);
    let outcome = session.run(events, inbound).await;
    session.host.stop();
    outcome
}

/// What serves a connection's workers: a batch worker pool or decoder threads.
enum Host {
    /// Batch stages: a worker pool and the workers provisioned on it.
    Pool(WorkerPool, HashSet<u32>),
    /// An LLM pipeline's iteration workers.
    Decoders(DecoderHost),
}

impl Host {
    /// Abort and stop everything (the connection ended).
    fn stop(&mut self) {
        match self {
            Host::Pool(pool, provisioned) => {
                for worker in provisioned.iter() {
                    pool.abort(*worker);
                }
            }
            Host::Decoders(host) => host.stop_all(),
        }
    }
}

/// The host a hello asks for, or why this node refuses it. Events of its workers go
/// to `events`, addressed by worker.
fn open_host(hello: Message, shared: &Shared, events: UnboundedSender<(u32, Message)>) -> Result<Host, String> {
    match hello {
        Message::Hello { threads, catalog } => {
            let catalog = resolve(catalog, shared.model_root.as_deref())?;
            let (pool, pool_events) = WorkerPool::new(shared.context.clone(), catalog, threads as usize);
            std::thread::Builder::new()
                .name("yardmaster-node-events".into())
                .spawn(move || {
                    while let Ok(event) = pool_events.recv() {
                        if events.send((event_worker(&event), Message::Event(event))).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| format!("spawning the event thread: {e}"))?;
            Ok(Host::Pool(pool, HashSet::new()))
        }
        Message::Decoder(DecoderMessage::Hello { model, config, .. }) => {
            let model = decoder_host::resolve(&model, config, shared.model_root.as_deref())?;
            Ok(Host::Decoders(DecoderHost::new(shared.context.runtime.clone(), model, events)))
        }
        other => Err(format!("expected a hello, got a {}", other.name())),
    }
}

/// `path` as this node sees it: relative paths resolve against `root` (the model
/// folder) when there is one, else against the working folder.
pub(super) fn node_path(path: &Path, root: Option<&Path>) -> PathBuf {
    match root {
        Some(root) if path.is_relative() => root.join(path),
        _ => path.to_path_buf(),
    }
}

/// Where this node resolves relative model paths, for refusals.
pub(super) fn relative_paths_note(root: Option<&Path>) -> String {
    match root {
        Some(root) => format!("relative paths resolve against {}", root.display()),
        None => "relative paths resolve against the node's working folder".to_string(),
    }
}

/// The catalogue with every path resolved on this node, or why it cannot be served.
fn resolve(mut catalog: ModelCatalog, root: Option<&Path>) -> Result<ModelCatalog, String> {
    let mut missing = Vec::new();
    for variants in &mut catalog.stages {
        for spec in variants {
            spec.path = node_path(&spec.path, root);
            if !spec.path.is_file() {
                missing.push(format!("model {} not found at {}", spec.key, spec.path.display()));
            }
        }
    }
    if missing.is_empty() {
        return Ok(catalog);
    }
    Err(format!("{} on this node ({})", missing.join("; "), relative_paths_note(root)))
}

/// What a stream's reader task reports.
enum Inbound {
    Frame(u64, Message),
    End(u64),
    Failed(ReadError),
}

struct StreamState {
    writer: UnboundedSender<Message>,
    worker: Option<u32>,
    hello: bool,
}

struct Session {
    connection: Connection,
    host: Host,
    streams: HashMap<u64, StreamState>,
    routes: HashMap<u32, u64>,
    next_key: u64,
    inbound_tx: UnboundedSender<Inbound>,
    /// The most intra-op threads a worker gets (the node's offer).
    max_threads: u32,
}

impl Session {
    async fn run(&mut self, mut events: UnboundedReceiver<(u32, Message)>, mut inbound: UnboundedReceiver<Inbound>) -> Result<(), String> {
        loop {
            tokio::select! {
                accepted = self.connection.accept_bi() => match accepted {
                    Ok((send, recv)) => self.add_stream(send, recv, false),
                    Err(_) => return Ok(()),
                },
                Some(message) = inbound.recv() => self.handle(message)?,
                Some((worker, event)) = events.recv() => self.route(worker, event),
            }
        }
    }

    fn add_stream(&mut self, send: SendStream, recv: RecvStream, hello: bool) {
        let key = self.next_key;
        self.next_key += 1;
        let (writer, outbox) = mpsc::unbounded_channel();
        tokio::spawn(transport::write_messages(send, outbox, unencodable_event));
        tokio::spawn(read_stream(key, recv, self.inbound_tx.clone()));
        self.streams.insert(key, StreamState { writer, worker: None, hello });
    }

    fn handle(&mut self, inbound: Inbound) -> Result<(), String> {
        let (key, message) = match inbound {
            Inbound::Frame(key, message) => (key, message),
            Inbound::End(key) => {
                // The controller is done with this worker: finish our side too (after
                // what is queued), and forget the route if it is still this stream.
                if let Some(state) = self.streams.remove(&key) {
                    if let Some(worker) = state.worker {
                        if self.routes.get(&worker) == Some(&key) {
                            self.routes.remove(&worker);
                        }
                    }
                }
                return Ok(());
            }
            Inbound::Failed(ReadError::Transport(error)) => {
                tracing::debug!("node: a worker stream failed: {error}");
                return Ok(());
            }
            Inbound::Failed(error) => return Err(error.to_string()),
        };
        let Some(state) = self.streams.get_mut(&key) else {
            return Err(format!("a {} on a stream the node had already closed", message.name()));
        };
        if state.hello {
            return Err(format!("a {} on the hello stream (commands go on worker streams)", message.name()));
        }
        let Some(worker) = message.command_worker() else {
            return Err(format!("a {} from a controller", message.name()));
        };
        match (state.worker, &message) {
            (None, message) if message.is_provision() => state.worker = Some(worker),
            (None, _) => return Err(format!("a {} for worker {worker} before that stream's provision", message.name())),
            (Some(own), _) if own != worker => {
                return Err(format!("a {} for worker {worker} on the stream of worker {own}", message.name()))
            }
            _ => {}
        }
        if message.is_provision() {
            self.routes.insert(worker, key);
        }
        let (pool, provisioned) = match &mut self.host {
            Host::Decoders(host) => return host.command(message),
            Host::Pool(pool, provisioned) => (pool, provisioned),
        };
        let writer = state.writer.clone();
        let reply = |event: WorkerEvent| {
            let _ = writer.send(Message::Event(event));
        };
        match message {
            Message::Provision { worker, stage, variant } => match pool.provision(worker, stage, variant) {
                Ok(()) => {
                    provisioned.insert(worker);
                }
                Err(error) => reply(WorkerEvent::StartFailed { worker, error }),
            },
            Message::Start { worker, job } => {
                let id = job.id;
                if let Err(error) = pool.start(worker, job) {
                    reply(WorkerEvent::Finished {
                        worker,
                        job: id,
                        duration: Duration::ZERO,
                        timing: JobTiming::default(),
                        result: Err(error),
                    });
                }
            }
            Message::Abort { worker } => {
                pool.abort(worker);
            }
            Message::Retire { worker } => {
                pool.retire(worker);
                provisioned.remove(&worker);
            }
            Message::SetThreads { worker, threads } => {
                // Never more than the node offered (a controller of an older build may ask).
                if let Err(error) = pool.set_threads(worker, threads.min(self.max_threads)) {
                    reply(WorkerEvent::ReconfigureFailed { worker, error });
                }
            }
            Message::SetVariant { worker, variant } => {
                if let Err(error) = pool.set_variant(worker, variant) {
                    reply(WorkerEvent::ReconfigureFailed { worker, error });
                }
            }
            other => return Err(format!("a {} from a controller", other.name())),
        }
        Ok(())
    }

    fn route(&mut self, worker: u32, event: Message) {
        match self.routes.get(&worker).and_then(|key| self.streams.get(key)) {
            Some(state) => {
                let _ = state.writer.send(event);
            }
            None => tracing::debug!("node: no stream for worker {worker}; dropped a {}", event.name()),
        }
    }
}

fn event_worker(event: &WorkerEvent) -> u32 {
    match event {
        WorkerEvent::Ready { worker, .. }
        | WorkerEvent::StartFailed { worker, .. }
        | WorkerEvent::Finished { worker, .. }
        | WorkerEvent::Aborted { worker, .. }
        | WorkerEvent::Reconfigured { worker, .. }
        | WorkerEvent::ReconfigureFailed { worker, .. }
        | WorkerEvent::Retired { worker } => *worker,
    }
}

async fn read_stream(key: u64, mut recv: RecvStream, inbound: UnboundedSender<Inbound>) {
    loop {
        let report = match transport::read_frame(&mut recv).await {
            Ok(Some(message)) => Inbound::Frame(key, message),
            Ok(None) => Inbound::End(key),
            Err(error) => Inbound::Failed(error),
        };
        let last = !matches!(report, Inbound::Frame(..));
        if inbound.send(report).is_err() || last {
            return;
        }
    }
}

/// What a worker stream sends instead of an event that does not encode: outputs too
/// large for one frame still end their job, with the reason.
fn unencodable_event(message: Message, error: FrameError) -> Option<Vec<u8>> {
    match message {
        Message::Event(WorkerEvent::Finished { worker, job, duration, timing, result: Ok(_) }) => {
            let error = DataplaneError::Invalid(format!("the job's outputs cannot be sent to the controller: {error}"));
            framing::encode(&Message::Event(WorkerEvent::Finished { worker, job, duration, timing, result: Err(error) })).ok()
        }
        other => {
            tracing::error!("node: cannot encode a {}: {error}", other.name());
            None
        }
    }
}
