//! The inter-node transport on loopback, with real ONNX Runtime workers and the PP-OCR
//! models: a node endpoint in this process with its own worker pool (its own model
//! cache, as on another host) beside a local pool, and the real `yardmaster node`
//! binary. Jobs on remote workers must return exactly what the same jobs return
//! locally; abort, reconfiguration and retirement work across the link; a node that
//! goes away mid-job ends the job with an error instead of leaving it hanging; a
//! malformed frame closes only the connection it arrived on.
//!
//! The forwarding benchmark is `#[ignore]`d; run it by hand:
//! `cargo test --release -p yardmaster --test all serve_remote -- --ignored --nocapture`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::node_process::NodeProcess;
use yardmaster::cluster::framing::{self, Message};
use yardmaster::cluster::node::{HostOffer, Node, NodeConfig, ShutdownHandle};
use yardmaster::cluster::pool::{RemoteConfig, RemotePool};
use yardmaster::cluster::transport::{self, Fingerprint, CLOSE_PROTOCOL};
use yardmaster::serve::tls::Identity;
use yardmaster::serve::workers::Workers;
use yardmaster_dataplane::{
    assets, Job, ModelCache, ModelCatalog, ModelKey, ModelSpec, Request, RequestOutput, Runtime, Tensor, WorkerContext, WorkerEvent,
    WorkerPool,
};

const WAIT: Duration = Duration::from_secs(120);
const CLS: u32 = 0;
const REC: u32 = 1;
const DET: u32 = 2;

fn context() -> WorkerContext {
    let runtime = Runtime::global().unwrap_or_else(|e| panic!("{e}"));
    WorkerContext { runtime, cache: Arc::new(ModelCache::default()) }
}

fn model(file: &str, name: &str) -> ModelSpec {
    ModelSpec::new(ModelKey::new(name, "default"), assets::model_path(file).unwrap_or_else(|e| panic!("{e}")))
}

/// Stage 0: the direction classifier, 1: the recogniser, 2: the detector.
fn catalog() -> ModelCatalog {
    ModelCatalog {
        stages: vec![vec![model(assets::CLS_MODEL, "cls")], vec![model(assets::REC_MODEL, "rec")], vec![model(assets::DET_MODEL, "det")]],
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yardmaster-remote-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Deterministic pseudo-random input in [-1, 1] (the profiler's synthetic inputs).
fn input(shape: &[usize], seed: u64) -> Tensor {
    yardmaster_dataplane::profile::synthetic(shape, seed)
}

fn job(id: u64, shape: &[usize], n: usize) -> Job {
    Job { id, requests: (0..n).map(|i| Request::new(1000 + i as u64, vec![input(shape, id * 100 + i as u64)])).collect() }
}

/// A node in this process on a free loopback port, serving until shut down.
struct TestNode {
    address: SocketAddr,
    pin: Fingerprint,
    shutdown: ShutdownHandle,
}

fn start_node(name: &str) -> TestNode {
    let identity = Identity::load_or_generate(&temp_dir(name)).unwrap();
    let node = Node::bind(NodeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        identity,
        model_root: None,
        idle_timeout: Duration::from_secs(5),
        context: context(),
        offer: HostOffer { name: format!("node-{name}"), slots: 3, cache_bytes: 5 << 30, threads: 4 },
    })
    .unwrap();
    let test_node = TestNode { address: node.local_addr().unwrap(), pin: node.fingerprint(), shutdown: node.shutdown_handle() };
    tokio::spawn(node.serve());
    test_node
}

fn remote_config(node: &TestNode) -> RemoteConfig {
    let mut config = RemoteConfig::new(node.address, node.pin, catalog());
    config.idle_timeout = Duration::from_secs(5);
    config
}

fn next(events: &Receiver<WorkerEvent>) -> WorkerEvent {
    tokio::task::block_in_place(|| events.recv_timeout(WAIT).expect("an event within the wait"))
}

fn ready(events: &Receiver<WorkerEvent>, worker: u32) -> ModelKey {
    match next(events) {
        WorkerEvent::Ready { worker: w, model, .. } if w == worker => model,
        other => panic!("expected Ready of worker {worker}, got {other:?}"),
    }
}

fn finished(events: &Receiver<WorkerEvent>, job: u64) -> Vec<RequestOutput> {
    match next(events) {
        WorkerEvent::Finished { job: j, result, .. } if j == job => result.unwrap_or_else(|e| panic!("job {job}: {e}")),
        other => panic!("expected Finished of job {job}, got {other:?}"),
    }
}

/// Run `job` on a fresh local worker of `stage` and return its outputs.
fn run_locally(stage: u32, job: Job) -> Vec<RequestOutput> {
    let (mut pool, events) = WorkerPool::new(context(), catalog(), 1);
    Workers::provision(&mut pool, 1, stage, 0).unwrap();
    ready(&events, 1);
    let id = job.id;
    Workers::start(&mut pool, 1, job).unwrap();
    finished(&events, id)
}

fn assert_same_outputs(remote: &[RequestOutput], local: &[RequestOutput]) {
    assert_eq!(remote.len(), local.len());
    for (r, l) in remote.iter().zip(local) {
        assert_eq!(r.id, l.id);
        assert_eq!(r.outputs.len(), l.outputs.len());
        for (a, b) in r.outputs.iter().zip(&l.outputs) {
            assert_eq!(a.shape, b.shape, "request {}", r.id);
            let same_bits = a.data.floats().iter().zip(b.data.floats()).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same_bits, "request {}: remote and local outputs differ by up to {}", r.id, a.max_abs_diff(b));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_remote_worker_returns_what_it_returns_locally() {
    let node = start_node("same");
    let (mut remote, events) = RemotePool::connect(remote_config(&node)).await.unwrap();
    assert_eq!(remote.device(), "cpu");
    // The node is a host: its welcome names it, its slots and its cache.
    let welcome = remote.welcome();
    assert_eq!((welcome.name.as_str(), welcome.slots, welcome.cache_bytes), ("node-same", 3, 5 << 30));

    // Two workers on the node at once, each on its own stream.
    remote.provision(1, CLS, 0).unwrap();
    remote.provision(2, REC, 0).unwrap();
    let mut models = vec![ready_any(&events), ready_any(&events)];
    models.sort();
    assert_eq!(models, vec![(1, ModelKey::new("cls", "default")), (2, ModelKey::new("rec", "default"))]);

    // The classifier: a batch of 4. The recogniser: a batch of 2 whose outputs are
    // about a megabyte each (40 steps × 6625 classes).
    let cls_job = job(7, &[3, 48, 192], 4);
    let rec_job = job(8, &[3, 48, 320], 2);
    remote.start(1, cls_job.clone()).unwrap();
    remote.start(2, rec_job.clone()).unwrap();
    let mut results = std::collections::HashMap::new();
    for _ in 0..2 {
        match next(&events) {
            WorkerEvent::Finished { job, result, .. } => {
                results.insert(job, result.unwrap());
            }
            other => panic!("expected Finished, got {other:?}"),
        }
    }
    let rec_remote = &results[&8];
    assert_eq!(rec_remote[0].outputs[0].len() * 4, 40 * 6625 * 4);
    assert_same_outputs(&results[&7], &run_locally(CLS, cls_job));
    assert_same_outputs(rec_remote, &run_locally(REC, rec_job));
    // Distinct inputs give distinct outputs: the comparison is not vacuous.
    assert!(results[&7][0].outputs[0].max_abs_diff(&results[&7][1].outputs[0]) > 1e-4);

    // Reconfiguration and retirement cross the link too.
    remote.set_threads(1, 2).unwrap();
    match next(&events) {
        WorkerEvent::Reconfigured { worker: 1, threads: 2, model, .. } => assert_eq!(model.model, "cls"),
        other => panic!("expected Reconfigured, got {other:?}"),
    }
    let error = remote.set_variant(1, 5).unwrap_err().to_string();
    assert!(error.contains("no model for stage 0, variant 5"), "{error}");
    remote.retire(2);
    assert!(matches!(next(&events), WorkerEvent::Retired { worker: 2 }));
    let error = remote.start(2, job(9, &[3, 48, 320], 1)).unwrap_err().to_string();
    assert!(error.contains("worker 2 is not running"), "{error}");
    // A retired id can be provisioned again (on a new stream).
    remote.provision(2, CLS, 0).unwrap();
    assert_eq!(ready(&events, 2).model, "cls");
    remote.start(2, job(10, &[3, 48, 192], 1)).unwrap();
    assert_eq!(finished(&events, 10).len(), 1);
    assert!(remote.lost().is_none());
}

fn ready_any(events: &Receiver<WorkerEvent>) -> (u32, ModelKey) {
    match next(events) {
        WorkerEvent::Ready { worker, model, .. } => (worker, model),
        other => panic!("expected Ready, got {other:?}"),
    }
}

/// Time one detector image on `worker`, so a test can tell a long job from a short one.
fn calibrate_detector(pool: &mut dyn Workers, events: &Receiver<WorkerEvent>, worker: u32) -> Duration {
    let begin = Instant::now();
    pool.start(worker, job(1, &[3, 640, 640], 1)).unwrap();
    finished(events, 1);
    begin.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_stops_a_remote_job() {
    let node = start_node("abort");
    let (mut remote, events) = RemotePool::connect(remote_config(&node)).await.unwrap();
    remote.provision(3, DET, 0).unwrap();
    ready(&events, 3);
    let one = calibrate_detector(&mut remote, &events, 3);
    // A batch of 8 takes about eight times as long; abort it after a quarter of one.
    remote.start(3, job(2, &[3, 640, 640], 8)).unwrap();
    tokio::time::sleep(one / 4).await;
    let aborted_at = Instant::now();
    assert_eq!(remote.abort(3), Some(2));
    match next(&events) {
        WorkerEvent::Aborted { worker: 3, job: 2 } => {}
        other => panic!("expected Aborted, got {other:?}"),
    }
    let stop = aborted_at.elapsed();
    eprintln!("one image {one:?}; the remote abort took effect after {stop:?}");
    assert!(stop < one * 6, "the abort took {stop:?}; the whole batch takes about {:?}", one * 8);
    // Nothing left to abort; the worker carries on.
    assert_eq!(remote.abort(3), None);
    remote.start(3, job(4, &[3, 64, 64], 1)).unwrap();
    assert_eq!(finished(&events, 4).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_going_away_mid_job_ends_the_job_with_an_error() {
    let node = start_node("shutdown");
    let (mut remote, events) = RemotePool::connect(remote_config(&node)).await.unwrap();
    remote.provision(1, DET, 0).unwrap();
    ready(&events, 1);
    let one = calibrate_detector(&mut remote, &events, 1);
    remote.start(1, job(2, &[3, 640, 640], 8)).unwrap();
    remote.set_threads(1, 2).unwrap(); // queued behind the job: pending when the node goes
    tokio::time::sleep(one / 2).await;
    let gone_at = Instant::now();
    node.shutdown.shutdown("maintenance");
    match next(&events) {
        WorkerEvent::Finished { worker: 1, job: 2, result: Err(error), .. } => {
            let text = error.to_string();
            assert!(text.contains("connection to the node lost") && text.contains("maintenance"), "{text}");
        }
        other => panic!("expected the job to finish with an error, got {other:?}"),
    }
    assert!(gone_at.elapsed() < one * 4, "the loss took {:?} to reach the job", gone_at.elapsed());
    assert!(matches!(next(&events), WorkerEvent::ReconfigureFailed { worker: 1, .. }));
    // The worker itself is reported lost, with the cause.
    match next(&events) {
        WorkerEvent::StartFailed { worker: 1, error } => assert!(error.to_string().contains("maintenance"), "{error}"),
        other => panic!("expected the worker to be reported lost, got {other:?}"),
    }
    // Later calls say why.
    let error = remote.start(1, job(3, &[3, 64, 64], 1)).unwrap_err().to_string();
    assert!(error.contains("connection to the node lost"), "{error}");
    assert!(remote.provision(2, CLS, 0).unwrap_err().to_string().contains("lost"));
    assert_eq!(remote.abort(1), None);
    remote.retire(1);
    assert!(matches!(next(&events), WorkerEvent::Retired { worker: 1 }));
    assert!(remote.lost().unwrap().contains("the node shut down: maintenance"));
    // Nothing else arrives (no duplicate endings).
    assert!(tokio::task::block_in_place(|| events.recv_timeout(Duration::from_millis(300))).is_err());
}

/// A raw QUIC connection to a node, trusting `pin`.
async fn raw_connection(node: &TestNode) -> (quinn::Endpoint, quinn::Connection) {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(transport::client_config(node.pin, Duration::from_secs(5)).unwrap());
    let connection = endpoint.connect(node.address, transport::SERVER_NAME).unwrap().await.unwrap();
    (endpoint, connection)
}

async fn closed_for_protocol_error(connection: &quinn::Connection) -> String {
    match tokio::time::timeout(Duration::from_secs(10), connection.closed()).await.expect("the node closes the connection") {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, CLOSE_PROTOCOL);
            String::from_utf8(close.reason.to_vec()).unwrap()
        }
        other => panic!("expected a protocol close, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_closes_only_its_connection() {
    let node = start_node("malformed");
    let (mut remote, events) = RemotePool::connect(remote_config(&node)).await.unwrap();
    remote.provision(1, CLS, 0).unwrap();
    ready(&events, 1);

    // A frame of a version the node does not speak, as the hello.
    let (_endpoint, connection) = raw_connection(&node).await;
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    send.write_all(&[2, 0, 0, 0, 9, framing::kind::HELLO]).await.unwrap();
    let reason = closed_for_protocol_error(&connection).await;
    assert!(reason.contains("unsupported framing version 9"), "{reason}");

    // A valid hello, then an unknown kind on a worker stream.
    let (_endpoint, connection) = raw_connection(&node).await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    let hello = framing::encode(&Message::Hello { threads: 1, catalog: catalog() }).unwrap();
    send.write_all(&hello).await.unwrap();
    assert!(matches!(transport::read_frame(&mut recv).await.unwrap(), Some(Message::Welcome { .. })));
    let (mut worker_send, _worker_recv) = connection.open_bi().await.unwrap();
    worker_send.write_all(&[2, 0, 0, 0, framing::VERSION, 0x7f]).await.unwrap();
    let reason = closed_for_protocol_error(&connection).await;
    assert!(reason.contains("unknown message kind 0x7f"), "{reason}");

    // A well-formed command where it does not belong: a start before any provision.
    let (_endpoint, connection) = raw_connection(&node).await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    send.write_all(&hello).await.unwrap();
    transport::read_frame(&mut recv).await.unwrap();
    let (mut worker_send, _worker_recv) = connection.open_bi().await.unwrap();
    let start = framing::encode(&Message::Start { worker: 4, job: job(1, &[3, 48, 192], 1) }).unwrap();
    worker_send.write_all(&start).await.unwrap();
    let reason = closed_for_protocol_error(&connection).await;
    assert!(reason.contains("before that stream's provision"), "{reason}");

    // The well-behaved controller never noticed.
    remote.start(1, job(5, &[3, 48, 192], 2)).unwrap();
    assert_eq!(finished(&events, 5).len(), 2);
    assert!(remote.lost().is_none());
}

/// A node impostor that welcomes the controller and then answers the first command
/// on a worker stream with bytes that are not a frame.
async fn garbling_node() -> (SocketAddr, Fingerprint) {
    let identity = Identity::load_or_generate(&temp_dir("garbling")).unwrap();
    let pin = Fingerprint::of(&identity.chain[0]);
    let config = transport::server_config(&identity, Duration::from_secs(5)).unwrap();
    let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let address = endpoint.local_addr().unwrap();
    tokio::spawn(async move {
        let connection = endpoint.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = connection.accept_bi().await.unwrap();
        transport::read_frame(&mut recv).await.unwrap();
        let welcome =
            framing::encode(&Message::Welcome { device: "impostor".into(), name: "impostor".into(), slots: 1, cache_bytes: 0, threads: 1 })
                .unwrap();
        send.write_all(&welcome).await.unwrap();
        let (mut send, mut recv) = connection.accept_bi().await.unwrap();
        transport::read_frame(&mut recv).await.unwrap(); // the provision
        transport::read_frame(&mut recv).await.unwrap(); // the start
                                                         // A Finished frame that ends after its worker id.
        send.write_all(&[6, 0, 0, 0, framing::VERSION, framing::kind::FINISHED, 1, 0, 0, 0]).await.unwrap();
        connection.closed().await;
        drop(endpoint);
    });
    (address, pin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_from_a_node_ends_its_jobs_with_the_reason() {
    let (address, pin) = garbling_node().await;
    let (mut remote, events) = RemotePool::connect(RemoteConfig::new(address, pin, catalog())).await.unwrap();
    assert_eq!(remote.device(), "impostor");
    remote.provision(1, CLS, 0).unwrap();
    remote.start(1, job(6, &[3, 48, 192], 1)).unwrap();
    match next(&events) {
        WorkerEvent::Finished { job: 6, result: Err(error), .. } => {
            let text = error.to_string();
            assert!(text.contains("protocol error") && text.contains("truncated frame"), "{text}");
        }
        other => panic!("expected the job to end with the protocol error, got {other:?}"),
    }
    assert!(matches!(next(&events), WorkerEvent::StartFailed { worker: 1, .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalogue_the_node_cannot_serve_is_refused_with_the_missing_path() {
    let node = start_node("refused");
    let mut config = remote_config(&node);
    config.catalog.stages[1].push(ModelSpec::new(ModelKey::new("rec", "large"), "/nonexistent/rec-large.onnx"));
    let error = format!("{:#}", RemotePool::connect(config).await.unwrap_err());
    assert!(error.contains("refused") && error.contains("rec/large not found at /nonexistent/rec-large.onnx"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_certificate_is_refused() {
    let node = start_node("pin");
    let mut config = remote_config(&node);
    config.trust = Fingerprint([7; 32]).into();
    let error = format!("{:#}", RemotePool::connect(config).await.unwrap_err());
    assert!(error.contains("not the pinned sha256:0707"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_binary_serves_jobs_and_its_death_ends_them() {
    let tls_dir = temp_dir("binary");
    let mut process = NodeProcess::start(&tls_dir);
    let (address, printed) = (process.address, process.printed_pin.clone());
    // Pinning by the certificate file gives the fingerprint the node printed.
    let pin = Fingerprint::of_file(&tls_dir.join("cert.pem")).unwrap();
    assert_eq!(pin, Fingerprint::from_argument(&printed).unwrap());
    assert_eq!(pin, Fingerprint::from_argument(tls_dir.join("cert.pem").to_str().unwrap()).unwrap());

    let mut config = RemoteConfig::new(address, pin, catalog());
    config.idle_timeout = Duration::from_secs(2);
    let (mut remote, events) = RemotePool::connect(config).await.unwrap();
    remote.provision(1, CLS, 0).unwrap();
    remote.provision(2, DET, 0).unwrap();
    let mut started = vec![ready_any(&events).0, ready_any(&events).0];
    started.sort();
    assert_eq!(started, [1, 2]);
    let cls_job = job(11, &[3, 48, 192], 3);
    remote.start(1, cls_job.clone()).unwrap();
    assert_same_outputs(&finished(&events, 11), &run_locally(CLS, cls_job));

    let one = calibrate_detector(&mut remote, &events, 2);
    remote.start(2, job(12, &[3, 640, 640], 8)).unwrap();
    tokio::time::sleep(one / 2).await;
    let killed_at = Instant::now();
    process.kill();
    match next(&events) {
        WorkerEvent::Finished { job: 12, result: Err(error), .. } => {
            let text = error.to_string();
            assert!(text.contains("connection to the node lost") && text.contains("idle timeout"), "{text}");
        }
        other => panic!("expected the job to end with an error, got {other:?}"),
    }
    let noticed = killed_at.elapsed();
    eprintln!("the node's death ended the job after {noticed:?}");
    assert!(noticed < Duration::from_secs(10), "noticed after {noticed:?} with a 2 s idle timeout");
    // Every worker of the lost node is reported lost at once, the idle one too (not at
    // its next job).
    let mut lost = Vec::new();
    for _ in 0..2 {
        match next(&events) {
            WorkerEvent::StartFailed { worker, error } => {
                assert!(error.to_string().contains("connection to the node lost"), "{error}");
                lost.push(worker);
            }
            other => panic!("expected each worker reported lost, got {other:?}"),
        }
    }
    lost.sort();
    assert_eq!(lost, [1, 2], "the idle worker 1 and the busy worker 2");
    assert!(killed_at.elapsed() < Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------
// Benchmark (by hand).

/// Protobuf writer for a one-node ONNX model (just enough of the format).
fn field(out: &mut Vec<u8>, number: u64, wire: u64, payload: &[u8]) {
    varint(out, number << 3 | wire);
    if wire == 2 {
        varint(out, payload.len() as u64);
    }
    out.extend_from_slice(payload);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn int_field(out: &mut Vec<u8>, number: u64, value: u64) {
    let mut payload = Vec::new();
    varint(&mut payload, value);
    field(out, number, 0, &payload);
}

/// An ONNX model `y = Identity(x)` over float tensors of shape [batch, n].
fn identity_model() -> Vec<u8> {
    let value_info = |name: &str| {
        let mut dims = Vec::new();
        for param in ["batch", "n"] {
            let mut dim = Vec::new();
            field(&mut dim, 2, 2, param.as_bytes());
            field(&mut dims, 1, 2, &dim);
        }
        let mut tensor = Vec::new();
        int_field(&mut tensor, 1, 1); // FLOAT
        field(&mut tensor, 2, 2, &dims);
        let mut ty = Vec::new();
        field(&mut ty, 1, 2, &tensor);
        let mut info = Vec::new();
        field(&mut info, 1, 2, name.as_bytes());
        field(&mut info, 2, 2, &ty);
        info
    };
    let mut node = Vec::new();
    field(&mut node, 1, 2, b"x");
    field(&mut node, 2, 2, b"y");
    field(&mut node, 4, 2, b"Identity");
    let mut graph = Vec::new();
    field(&mut graph, 1, 2, &node);
    field(&mut graph, 2, 2, b"identity");
    field(&mut graph, 11, 2, &value_info("x"));
    field(&mut graph, 12, 2, &value_info("y"));
    let mut opset = Vec::new();
    int_field(&mut opset, 2, 13);
    let mut model = Vec::new();
    int_field(&mut model, 1, 8); // IR version
    field(&mut model, 8, 2, &opset);
    field(&mut model, 7, 2, &graph);
    model
}

fn round_trips(pool: &mut dyn Workers, events: &Receiver<WorkerEvent>, floats: usize, rounds: usize) -> Vec<Duration> {
    let tensor = input(&[floats], 3);
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds as u64 {
        let job = Job { id: round, requests: vec![Request::new(round, vec![tensor.clone()])] };
        let begin = Instant::now();
        pool.start(1, job).unwrap();
        let outputs = finished(events, round);
        times.push(begin.elapsed());
        assert_eq!(outputs[0].outputs[0].data.len(), floats);
    }
    times.sort();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand with --release --ignored --nocapture"]
async fn bench_forwarding_overhead_of_a_tensor_round_trip() {
    let dir = temp_dir("bench");
    let path = dir.join("identity.onnx");
    std::fs::write(&path, identity_model()).unwrap();
    let catalog = ModelCatalog { stages: vec![vec![ModelSpec::new(ModelKey::new("identity", "default"), &path)]] };
    let (mut local, local_events) = WorkerPool::new(context(), catalog.clone(), 1);
    Workers::provision(&mut local, 1, 0, 0).unwrap();
    ready(&local_events, 1);
    let node = start_node("bench-node");
    let (mut remote, remote_events) = RemotePool::connect(RemoteConfig::new(node.address, node.pin, catalog)).await.unwrap();
    remote.provision(1, 0, 0).unwrap();
    ready(&remote_events, 1);
    let percentile = |times: &[Duration], p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    for (label, floats, rounds) in [("1 KiB", 256, 2000), ("1 MiB", 262_144, 300)] {
        round_trips(&mut local, &local_events, floats, rounds / 10);
        round_trips(&mut remote, &remote_events, floats, rounds / 10);
        let l = round_trips(&mut local, &local_events, floats, rounds);
        let r = round_trips(&mut remote, &remote_events, floats, rounds);
        let (l50, r50) = (percentile(&l, 0.5), percentile(&r, 0.5));
        let (l99, r99) = (percentile(&l, 0.99), percentile(&r, 0.99));
        println!(
            "{label}: local p50 {l50:?} p99 {l99:?}; remote p50 {r50:?} p99 {r99:?}; \
             remote/local p50 {:.2}x, p99 {:.2}x; forwarding adds {:?} at p50",
            r50.as_secs_f64() / l50.as_secs_f64(),
            r99.as_secs_f64() / l99.as_secs_f64(),
            r50.saturating_sub(l50),
        );
        let stats = remote.stats();
        println!(
            "  QUIC: rtt {:?}, cwnd {} B, MTU {} B, {} packets lost of {} sent, {} congestion events",
            stats.path.rtt,
            stats.path.cwnd,
            stats.path.current_mtu,
            stats.path.lost_packets,
            stats.path.sent_packets,
            stats.path.congestion_events,
        );
    }
}
