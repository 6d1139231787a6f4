//! Fault injection against the real server: the serving stack (engine actor, the
//! shipped `edf` policy, ONNX Runtime workers running the `tiny` model) behind the
//! real client API on HTTP/1.1 and HTTP/3, and the real `yardmaster node` binary for a
//! split across hosts. Each fault must end the requests it touches with a clear error
//! (or a cancellation), lose none, and leave the server serving:
//!
//! - an ONNX Runtime call that fails on its input;
//! - a worker that hangs (the executor's watchdog fails the job and restarts it);
//! - a client that disconnects mid-request, over HTTP/1.1 and over HTTP/3;
//! - a remote host (a `yardmaster node` process serving the only stage) that stops
//!   answering with requests on it, then is killed: they fail once with the loss,
//!   and later requests fail at once instead of waiting for their deadlines;
//! - a full disk under the trace capture (`capture = "/dev/full"` on the real
//!   `yardmaster serve` binary): the capture stops with one log line, serving goes on.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use yardmaster::cluster::pool::{RemoteConfig, RemotePool};
use yardmaster::cluster::transport::Fingerprint;
use yardmaster::engine::{EngineOptions, WorkerPhase};
use yardmaster::serve::api::{Api, Backend};
use yardmaster::serve::backend::EngineBackend;
use yardmaster::serve::client::{Http1Client, Http3Client, Reply};
use yardmaster::serve::executor::{Placement, ServeActor, WorkerStatus};
use yardmaster::serve::listeners::{ListenOptions, Listeners, TlsSource};
use yardmaster::serve::payload::Payload;
use yardmaster::serve::stack::{PolicyChoice, ServedPipeline, ServingStack};
use yardmaster::serve::stages::{StageProgram, TensorProgram};
use yardmaster::serve::tls;
use yardmaster::serve::watchdog::WatchdogConfig;
use yardmaster::serve::workers::Workers;
use yardmaster_dataplane::{Job, ModelKey, ModelSpec, Tensor, WorkerContext, WorkerPool};

/// A request whose first element is this is held by [`Holding`] workers.
const HOLD: f32 = 666.0;
/// A request whose first element is this is given a misshapen model input.
const MISSHAPEN: f32 = -13.5;

fn context() -> WorkerContext {
    WorkerContext { runtime: common::runtime(), cache: common::cache() }
}

/// A folder of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("yardmaster-faults-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The serving stack behind the real client API on both transports.
struct Running {
    actor: Option<ServeActor>,
    backend: Arc<EngineBackend>,
    api: Arc<Api>,
    listeners: Option<Listeners>,
    address: SocketAddr,
    certificate: PathBuf,
}

impl Running {
    async fn start(dir: &Scratch, served: ServedPipeline, placements: Vec<Placement>, watchdog: WatchdogConfig) -> Running {
        let policy = PolicyChoice::shipped("edf").unwrap();
        let (actor, backend) = ServingStack::start(served, policy, EngineOptions::default(), context(), placements).unwrap();
        actor.handle().inspect(move |engine| engine.executor().borrow().set_watchdog(watchdog)).unwrap();
        let backend = Arc::new(backend);
        let api = Arc::new(Api::new(Arc::clone(&backend) as Arc<dyn Backend>));
        let options = ListenOptions {
            address: "127.0.0.1:0".parse().unwrap(),
            http1: true,
            http3: true,
            tls: TlsSource::SelfSigned(dir.0.join("tls")),
            grpc: None,
        };
        let listeners = Listeners::start(&options, Arc::clone(&api)).await.unwrap();
        let address = listeners.http1.unwrap();
        let certificate = listeners.certificate.clone().unwrap();
        Running { actor: Some(actor), backend, api, listeners: Some(listeners), address, certificate }
    }

    fn actor(&self) -> &ServeActor {
        self.actor.as_ref().unwrap()
    }

    /// (arrivals, ended, completed, failed, in flight) as the engine counts them.
    fn counts(&self) -> (u64, u64, u64, u64, usize) {
        self.actor()
            .handle()
            .inspect(|engine| {
                let overall = engine.accounting().summary(engine.state().now()).overall;
                (overall.arrivals, overall.ended, overall.completed, overall.outcomes.failed, engine.in_flight())
            })
            .unwrap()
    }

    fn drop_reasons(&self) -> std::collections::BTreeMap<String, u64> {
        self.actor()
            .handle()
            .inspect(|engine| engine.accounting().summary(engine.state().now()).drop_reasons.into_iter().collect())
            .unwrap()
    }

    /// Wait until nothing is held: the engine, the payload store and the API are empty.
    async fn settled(&self, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let (arrivals, ended, _, _, in_flight) = self.counts();
            if in_flight == 0 && arrivals == ended && self.backend.store().is_empty() && self.api.in_flight() == 0 {
                return;
            }
            assert!(
                Instant::now() < until,
                "still held after {within:?}: {arrivals} arrived, {ended} ended, {in_flight} in the engine, {} parked, {} in the API",
                self.backend.store().len(),
                self.api.in_flight()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn http3(&self) -> Http3Client {
        let trusted = tls::read_certificates(&self.certificate).unwrap();
        Http3Client::connect(self.address, "localhost", &trusted).await.unwrap()
    }

    async fn stop(mut self) {
        self.listeners.take().unwrap().stop().await;
        let actor = self.actor.take().unwrap();
        tokio::task::spawn_blocking(move || actor.shutdown("test over")).await.unwrap();
    }
}

fn body(x: [f32; 4]) -> Bytes {
    Bytes::from(format!(r#"{{"inputs":[{{"name":"x","shape":[1,4],"datatype":"FP32","data":[{},{},{},{}]}}]}}"#, x[0], x[1], x[2], x[3]))
}

fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers
}

const INFER: &str = "/v2/models/tiny/infer";

async fn infer_h1(address: SocketAddr, x: [f32; 4]) -> Reply {
    infer_h1_body(address, body(x)).await
}

async fn infer_h1_body(address: SocketAddr, body: Bytes) -> Reply {
    let mut client = Http1Client::connect(address).await.unwrap();
    let headers = json_headers();
    let reply = client.request(Method::POST, INFER, &headers, body);
    tokio::time::timeout(Duration::from_secs(20), reply).await.expect("an answer: no request may hang").unwrap()
}

fn error_of(reply: &Reply) -> String {
    let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_else(|_| panic!("a JSON body: {reply:?}"));
    value["error"].as_str().unwrap_or_else(|| panic!("an error message: {value}")).to_string()
}

fn outputs_of(reply: &Reply) -> Vec<f32> {
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    value["outputs"][0]["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

/// `n` ordinary requests, all at once over HTTP/1.1: each gets `x + 1` back.
async fn served_normally(address: SocketAddr, n: usize) {
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(async move { (i, infer_h1(address, [i as f32, 1.0, 2.0, 3.0]).await) })).collect();
    for task in tasks {
        let (i, reply) = task.await.unwrap();
        assert_eq!(outputs_of(&reply), vec![i as f32 + 1.0, 2.0, 3.0, 4.0], "request {i}");
    }
}

// ---------------------------------------------------------------------------------
// An ONNX Runtime call that fails.

/// Protobuf field writers, just enough for [`broadcast_model`].
fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn int_field(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `y = x + [1, 1, 1, 1]` with `x` declared `[batch, width]`, both symbolic: the
/// model loads, the data plane passes any width, and ONNX Runtime itself refuses a
/// run whose width cannot broadcast against 4. (Field numbers as in
/// crates/serve/src/tiny_model.rs.)
fn broadcast_model() -> Vec<u8> {
    let value_info = |name: &str| {
        let mut shape = Vec::new();
        for dim in ["batch", "width"] {
            let mut d = Vec::new();
            bytes_field(&mut d, 2, dim.as_bytes());
            bytes_field(&mut shape, 1, &d);
        }
        let mut tensor = Vec::new();
        int_field(&mut tensor, 1, 1); // FLOAT
        bytes_field(&mut tensor, 2, &shape);
        let mut type_proto = Vec::new();
        bytes_field(&mut type_proto, 1, &tensor);
        let mut info = Vec::new();
        bytes_field(&mut info, 1, name.as_bytes());
        bytes_field(&mut info, 2, &type_proto);
        info
    };
    let mut ones = Vec::new();
    int_field(&mut ones, 1, 4); // dims [4]
    int_field(&mut ones, 2, 1); // FLOAT
    bytes_field(&mut ones, 4, &[1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    bytes_field(&mut ones, 8, b"ones");
    let mut node = Vec::new();
    for (field, text) in [(1, "x"), (1, "ones"), (2, "y"), (3, "add"), (4, "Add")] {
        bytes_field(&mut node, field, text.as_bytes());
    }
    let mut graph = Vec::new();
    bytes_field(&mut graph, 1, &node);
    bytes_field(&mut graph, 2, b"broadcast");
    bytes_field(&mut graph, 5, &ones);
    bytes_field(&mut graph, 11, &value_info("x"));
    bytes_field(&mut graph, 12, &value_info("y"));
    let mut opset = Vec::new();
    bytes_field(&mut opset, 1, b"");
    int_field(&mut opset, 2, 13);
    let mut model = Vec::new();
    int_field(&mut model, 1, 8);
    bytes_field(&mut model, 2, b"yardmaster-faults");
    bytes_field(&mut model, 7, &graph);
    bytes_field(&mut model, 8, &opset);
    model
}

/// The tiny model's program, except that a request whose first element is
/// [`MISSHAPEN`] gets a model input of 5 elements where the model adds 4: ONNX
/// Runtime refuses the run.
struct Misshapen(TensorProgram);

impl StageProgram for Misshapen {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        match payload {
            Payload::Tensors(tensors) if tensors[0].data.floats()[0] == MISSHAPEN => {
                Ok(vec![vec![Tensor::new(vec![5], vec![MISSHAPEN; 5]).unwrap()]])
            }
            _ => self.0.inputs(payload),
        }
    }
    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        self.0.apply(payload, outputs)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_onnx_runtime_call_ends_its_request_with_the_reason_and_serving_goes_on() {
    let dir = Scratch::new("ort-fails");
    let mut served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let model = dir.0.join("broadcast.onnx");
    std::fs::write(&model, broadcast_model()).unwrap();
    served.catalog.stages[0][0] = ModelSpec::new(ModelKey::new("tiny", "broadcast"), &model);
    served.programs[0] = Arc::new(Misshapen(TensorProgram { name: "tiny".into(), batching: true }));
    let server = Running::start(&dir, served, Vec::new(), WatchdogConfig::default()).await;
    served_normally(server.address, 4).await;

    let reply = infer_h1(server.address, [MISSHAPEN, 0.0, 0.0, 0.0]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
    let error = error_of(&reply);
    eprintln!("the failed run answered: {error}");
    // The engine's failure, the worker, and ONNX Runtime's own words about the input.
    assert!(error.starts_with("failed: worker 0"), "{error}");
    assert!(error.contains("Add") && error.contains("broadcast"), "ONNX Runtime says why: {error}");

    // The worker serves on, alone and among failures.
    served_normally(server.address, 16).await;
    let mixed: Vec<_> = (0..12)
        .map(|i| {
            let x = if i % 4 == 0 { MISSHAPEN } else { i as f32 };
            let address = server.address;
            tokio::spawn(async move { (x, infer_h1(address, [x, 0.0, 0.0, 0.0]).await) })
        })
        .collect();
    for task in mixed {
        let (x, reply) = task.await.unwrap();
        if x == MISSHAPEN {
            assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
        } else {
            // Batched with a misshapen request, a request fails with it (one run);
            // otherwise it is served.
            match reply.status {
                StatusCode::OK => assert_eq!(outputs_of(&reply)[0], x + 1.0),
                StatusCode::INTERNAL_SERVER_ERROR => {
                    let error = error_of(&reply);
                    assert!(error.starts_with("failed: worker 0"), "{error}")
                }
                other => panic!("{other}: {reply:?}"),
            }
        }
    }
    server.settled(Duration::from_secs(5)).await;
    let (arrivals, ended, completed, failed, _) = server.counts();
    assert_eq!(arrivals, 4 + 1 + 16 + 12);
    assert_eq!(ended, arrivals, "every request ended exactly once");
    assert!(failed >= 4 && completed >= 20, "{completed} completed, {failed} failed");
    assert_eq!(server.backend.board().status(0), Some(WorkerStatus::Ready));
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// A worker that hangs.

/// Real workers, except that a job carrying a request whose first element is
/// [`HOLD`] is never handed to them: the worker looks busy for ever, as one stuck in
/// a run would. Everything else goes to the real pool.
struct Holding {
    pool: WorkerPool,
    held: Arc<Mutex<Vec<u64>>>,
    provisions: Arc<Mutex<Vec<u32>>>,
}

/// What a test reads back from a [`Holding`] placement: the held requests and the
/// workers provisioned.
type HoldingProbes = (Arc<Mutex<Vec<u64>>>, Arc<Mutex<Vec<u32>>>);

impl Holding {
    fn placement(dir: &Scratch) -> (Placement, HoldingProbes) {
        let catalog = ServedPipeline::tiny(&dir.0, &context()).unwrap().catalog;
        let (pool, events) = WorkerPool::new(context(), catalog, 1);
        let (held, provisions) = (Arc::default(), Arc::default());
        let workers = Holding { pool, held: Arc::clone(&held), provisions: Arc::clone(&provisions) };
        (Placement { stages: vec![0], workers: Box::new(workers), events: events.into() }, (held, provisions))
    }
}

impl Workers for Holding {
    fn provision(&mut self, worker: u32, stage: u32, variant: u32) -> yardmaster_dataplane::Result<()> {
        self.provisions.lock().unwrap().push(worker);
        Workers::provision(&mut self.pool, worker, stage, variant)
    }
    fn start(&mut self, worker: u32, job: Job) -> yardmaster_dataplane::Result<()> {
        if job.requests.iter().any(|r| r.inputs[0].data.floats()[0] == HOLD) {
            self.held.lock().unwrap().push(job.id);
            return Ok(());
        }
        Workers::start(&mut self.pool, worker, job)
    }
    fn abort(&mut self, worker: u32) -> Option<u64> {
        Workers::abort(&mut self.pool, worker)
    }
    fn retire(&mut self, worker: u32) {
        Workers::retire(&mut self.pool, worker)
    }
    fn set_threads(&mut self, worker: u32, threads: u32) -> yardmaster_dataplane::Result<()> {
        Workers::set_threads(&mut self.pool, worker, threads)
    }
    fn set_variant(&mut self, worker: u32, variant: u32) -> yardmaster_dataplane::Result<()> {
        Workers::set_variant(&mut self.pool, worker, variant)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_fails_a_hung_job_and_restarts_its_worker() {
    let dir = Scratch::new("hang");
    let (placement, (held, provisions)) = Holding::placement(&dir);
    let watchdog = WatchdogConfig { min_ms: 400, ..WatchdogConfig::default() };
    let server = Running::start(&dir, ServedPipeline::tiny(&dir.0, &context()).unwrap(), vec![placement], watchdog).await;
    served_normally(server.address, 4).await;

    let begin = Instant::now();
    let reply = infer_h1(server.address, [HOLD, 0.0, 0.0, 0.0]).await;
    let took = begin.elapsed();
    assert_eq!(held.lock().unwrap().len(), 1, "the job reached the worker and hung there");
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
    let error = error_of(&reply);
    eprintln!("after {took:?} the hung request answered: {error}");
    assert!(error.starts_with("failed: worker 0 stalled: a job of 1 request ran"), "{error}");
    assert!(error.contains("limit of 400 ms") && error.contains("restarted"), "{error}");
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "failed after {took:?} with a 400 ms limit");
    assert_eq!(*provisions.lock().unwrap(), vec![0, 0], "the worker was provisioned afresh under its id");

    // The restarted worker (real ONNX Runtime) serves what follows.
    served_normally(server.address, 16).await;
    server.settled(Duration::from_secs(5)).await;
    let (arrivals, ended, completed, failed, _) = server.counts();
    assert_eq!((arrivals, ended, completed, failed), (21, 21, 20, 1));
    assert_eq!(server.backend.board().status(0), Some(WorkerStatus::Ready), "the replaced instance's retirement left the board alone");
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// A client that disconnects mid-request.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_request_ends_it_once_and_serving_goes_on() {
    let dir = Scratch::new("disconnect");
    let (placement, (held, _)) = Holding::placement(&dir);
    // A cancelled request's job runs on (other requests may share it): the held job
    // keeps its worker until the watchdog ends it. Its late failure must not count
    // again for the request the client cancelled.
    let watchdog = WatchdogConfig { min_ms: 500, ..WatchdogConfig::default() };
    let server = Running::start(&dir, ServedPipeline::tiny(&dir.0, &context()).unwrap(), vec![placement], watchdog).await;
    served_normally(server.address, 2).await;

    // HTTP/1.1: the request is sent, then the connection closed without reading.
    let mut stream = std::net::TcpStream::connect(server.address).unwrap();
    let payload = body([HOLD, 1.0, 1.0, 1.0]);
    write!(stream, "POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", payload.len())
        .unwrap();
    stream.write_all(&payload).unwrap();
    wait_for(|| held.lock().unwrap().len() == 1, "the HTTP/1.1 request reached the worker").await;
    drop(stream);
    server.settled(Duration::from_secs(5)).await;
    assert_eq!(server.drop_reasons().get("cancelled by the client"), Some(&1), "{:?}", server.drop_reasons());

    // HTTP/3: the request is sent, then the whole connection dropped.
    let mut client = server.http3().await;
    let request = tokio::spawn(async move { client.request(Method::POST, INFER, &json_headers(), body([HOLD, 2.0, 2.0, 2.0])).await });
    let reached = wait_until(|| held.lock().unwrap().len() == 2).await;
    assert!(reached, "the HTTP/3 request reached the worker: {:?}, {:?}", server.counts(), server.drop_reasons());
    request.abort();
    assert!(request.await.is_err(), "the client gave up");
    server.settled(Duration::from_secs(5)).await;
    assert_eq!(server.drop_reasons().get("cancelled by the client"), Some(&2), "{:?}", server.drop_reasons());

    // Both transports serve on (the restarted worker).
    served_normally(server.address, 4).await;
    let mut client = server.http3().await;
    let reply = client.request(Method::POST, INFER, &json_headers(), body([5.0, 0.0, 0.0, 0.0])).await.unwrap();
    assert_eq!(outputs_of(&reply), vec![6.0, 1.0, 1.0, 1.0]);
    server.settled(Duration::from_secs(5)).await;
    let (arrivals, ended, completed, failed, _) = server.counts();
    assert_eq!((arrivals, ended, completed, failed), (9, 9, 7, 0), "each request ended exactly once");
    server.stop().await;
}

async fn wait_for(condition: impl Fn() -> bool, what: &str) {
    assert!(wait_until(condition).await, "timed out waiting: {what}");
}

/// Whether `condition` came true within 10 s.
async fn wait_until(condition: impl Fn() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while !condition() {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

// ---------------------------------------------------------------------------------
// A remote host that disappears mid-request.

/// Silence after which either side of the node link counts the other as gone.
const NODE_IDLE: Duration = Duration::from_secs(2);

/// A `yardmaster node` process, killed on drop.
struct NodeProcess {
    child: Child,
    address: SocketAddr,
    pin: Fingerprint,
}

impl NodeProcess {
    fn start(dir: &Scratch) -> NodeProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["node", "--listen", "127.0.0.1:0", "--idle-timeout", &NODE_IDLE.as_secs().to_string(), "--tls-dir"])
            .arg(dir.0.join("node-tls"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut line = || lines.next().expect("the node prints its address and certificate").unwrap();
        let listening = line();
        let address = listening.strip_prefix("yardmaster node listening on ").unwrap_or_else(|| panic!("{listening}")).parse().unwrap();
        let certificate = line();
        let pin = Fingerprint::from_argument(certificate.strip_prefix("certificate ").unwrap().split_whitespace().next().unwrap()).unwrap();
        NodeProcess { child, address, pin }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} of the node");
    }

    /// Stop the node (SIGSTOP) and wait until every one of its threads is stopped:
    /// the signal is delivered to each thread as it next runs, and a thread still
    /// running could answer a request.
    async fn stop(&self) {
        self.signal("STOP");
        let tasks = PathBuf::from(format!("/proc/{}/task", self.child.id()));
        let stopped = || {
            std::fs::read_dir(&tasks).unwrap().flatten().all(|task| {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                // The state follows the command name, which is in parentheses.
                stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
            })
        };
        wait_for(stopped, "every thread of the node is stopped").await;
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get_h1(address: SocketAddr, path: &str) -> Reply {
    let mut client = Http1Client::connect(address).await.unwrap();
    client.request(Method::GET, path, &HeaderMap::new(), Bytes::new()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dies_mid_request_fails_its_requests_once_and_later_ones_at_once() {
    let dir = Scratch::new("node-loss");
    let node = NodeProcess::start(&dir);
    // The only stage's worker lives on the node (the model file is the one the
    // controller wrote: same machine, same path).
    let served = ServedPipeline::tiny(&dir.0, &context()).unwrap();
    let mut config = RemoteConfig::new(node.address, node.pin, served.catalog.clone());
    config.idle_timeout = NODE_IDLE;
    let (pool, events) = RemotePool::connect(config).await.unwrap();
    let placement = Placement { stages: vec![0], workers: Box::new(pool), events: events.into() };
    // The watchdog is kept out of the way: the requests must end by the node's loss.
    let watchdog = WatchdogConfig { min_ms: 60_000, ..WatchdogConfig::default() };
    let server = Running::start(&dir, served, vec![placement], watchdog).await;
    served_normally(server.address, 4).await;
    assert_eq!(get_h1(server.address, "/v2/health/ready").await.status, StatusCode::OK);

    // The node stops answering (SIGSTOP): what is sent now surely stays in flight.
    // These requests carry a 30 s deadline (Triton's `timeout`, µs), so only the
    // node's loss can end them: not the policy's drop at the tiny pipeline's 1 s SLO.
    node.stop().await;
    let stopped_at = Instant::now();
    let address = server.address;
    let requests: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(async move {
                let body = format!(
                    r#"{{"parameters":{{"timeout":30000000}},"inputs":[{{"name":"x","shape":[1,4],"datatype":"FP32","data":[{},0,0,0]}}]}}"#,
                    10 + i
                );
                let reply = infer_h1_body(address, Bytes::from(body)).await;
                (reply, Instant::now())
            })
        })
        .collect();
    let arrived = wait_until(|| server.counts().4 == 6).await;
    assert!(arrived, "the six requests are in the engine: {:?}, {:?}", server.counts(), server.drop_reasons());
    let on_the_node = server
        .actor()
        .handle()
        .inspect(|engine| engine.state().workers().values().any(|w| matches!(w.phase, WorkerPhase::Busy { .. })))
        .unwrap();
    assert!(on_the_node, "a job is out on the node's worker");
    // Then it dies without a word (SIGKILL): only the link's idle timeout can tell.
    node.signal("KILL");
    let mut last = stopped_at;
    for task in requests {
        let (reply, at) = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
        let error = error_of(&reply);
        assert!(error.contains("connection to the node lost") && error.contains("idle timeout"), "{error}");
        last = last.max(at);
    }
    let noticed = last - stopped_at;
    eprintln!("the node's loss ended the six requests {noticed:?} after it stopped answering");
    assert!(noticed >= NODE_IDLE / 2 && noticed < NODE_IDLE * 4, "ended after {noticed:?} with a {NODE_IDLE:?} idle timeout");

    // Later requests get a fast, clear answer, over both transports.
    for i in 0..3 {
        let begin = Instant::now();
        let reply = infer_h1(server.address, [20.0 + i as f32, 0.0, 0.0, 0.0]).await;
        let took = begin.elapsed();
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
        let error = error_of(&reply);
        assert!(error.starts_with("failed: stage tiny has no worker left: "), "{error}");
        assert!(error.contains("connection to the node lost"), "{error}");
        assert!(took < Duration::from_millis(500), "answered after {took:?}; the deadline is a second away");
        if i == 0 {
            eprintln!("a request after the loss answered in {took:?}: {error}");
        }
    }
    let mut client = server.http3().await;
    let reply = client.request(Method::POST, INFER, &json_headers(), body([30.0, 0.0, 0.0, 0.0])).await.unwrap();
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(error_of(&reply).contains("no worker left"), "{reply:?}");
    // The server says it cannot serve, and holds nothing.
    assert_eq!(get_h1(server.address, "/v2/health/ready").await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_ne!(server.backend.board().status(0), Some(WorkerStatus::Ready), "the lost worker is not counted ready");
    server.settled(Duration::from_secs(5)).await;
    let (arrivals, ended, completed, failed, _) = server.counts();
    assert_eq!((arrivals, ended, completed, failed), (14, 14, 4, 10), "each request ended exactly once");
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// A full disk while capturing a trace.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_capture_with_one_log_line_and_serving_goes_on() {
    let dir = Scratch::new("full-disk");
    let config = dir.0.join("serve.toml");
    // /dev/full takes the file's creation and fails every write with ENOSPC.
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\npipeline = \"tiny\"\nstate_dir = \"state\"\ncapture = \"/dev/full\"\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("YARDMASTER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut process = Kill(child);
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let collected = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            collected.lock().unwrap().push(line);
        }
    });
    let address: SocketAddr = loop {
        let line = stdout.next().expect("serve printed its address before exiting").unwrap();
        if let Some(rest) = line.strip_prefix("listening on ") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || for _ in stdout {});

    served_normally(address, 8).await;
    let stopped = |log: &[String]| log.iter().filter(|l| l.contains("trace capture /dev/full stopped")).cloned().collect::<Vec<_>>();
    wait_for(|| !stopped(&log.lock().unwrap()).is_empty(), "the capture reports that it stopped").await;
    // Serving goes on, the capture stays stopped and says so once.
    served_normally(address, 16).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = stopped(&log.lock().unwrap());
    eprintln!("{}", lines.join("\n"));
    assert_eq!(lines.len(), 1, "one log line: {:?}", log.lock().unwrap());
    assert!(lines[0].contains("No space left on device") && lines[0].contains("serving goes on"), "{}", lines[0]);
    assert!(process.0.try_wait().unwrap().is_none(), "the server runs on");
    // Every request was counted on time: none was lost to the capture.
    let metrics = String::from_utf8(get_h1(address, "/metrics").await.body.to_vec()).unwrap();
    let on_time = metrics
        .lines()
        .find(|l| l.starts_with("yardmaster_requests_ended_total{arm=\"primary\",stream=\"tiny\",outcome=\"on_time\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("an on-time counter: {metrics}"));
    assert_eq!(on_time, 24.0, "{metrics}");
}
