//! The LLM pipeline served over the network: `LlmServer` (what `yardmaster serve
//! --pipeline llm-tiny` runs) with real HTTP/1.1 and HTTP/3 clients. Each stream is a
//! KServe model of token ids; CALM schedules the tiny decoder's real decode steps. A
//! completed request must return exactly the tokens its prompt generates alone, bad
//! requests get a 4xx with the reason, and the metrics count what was served.

use std::net::SocketAddr;

use crate::node_process::NodeProcess;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};
use yardmaster::serve::client::{Http1Client, Http3Client, Reply};
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::llm::LlmServer;
use yardmaster::serve::tls;
use yardmaster_dataplane::llm::{tiny_decoder, DecoderSession};
use yardmaster_dataplane::Runtime;

fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers
}

fn body(prompt: &[i64], max_tokens: Option<u64>) -> Bytes {
    let mut request = json!({"inputs": [{"name": "input_ids", "shape": [prompt.len()], "datatype": "INT64", "data": prompt}]});
    if let Some(n) = max_tokens {
        request["parameters"] = json!({"max_tokens": n});
    }
    Bytes::from(request.to_string())
}

fn output_ids(reply: &Reply) -> Vec<i64> {
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    let value: Value = serde_json::from_slice(&reply.body).unwrap();
    let output = &value["outputs"][0];
    assert_eq!((output["name"].as_str(), output["datatype"].as_str()), (Some("output_ids"), Some("INT64")));
    output["data"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
}

fn reason(reply: &Reply, status: StatusCode) -> String {
    assert_eq!(reply.status, status, "{}", String::from_utf8_lossy(&reply.body));
    let value: Value = serde_json::from_slice(&reply.body).unwrap();
    value["error"].as_str().unwrap().to_string()
}

fn prompt(len: usize, seed: u64) -> Vec<i64> {
    (0..len as u64).map(|i| ((i * 2_654_435_761 + seed * 7_919 + 3) % 512) as i64).collect()
}

async fn post(address: SocketAddr, path: &str, body: Bytes) -> Reply {
    let mut client = Http1Client::connect(address).await.unwrap();
    client.request(Method::POST, path, &headers(), body).await.unwrap()
}

/// [`post`], sent once more if the scheduler expired it: on a test machine whose cores
/// other tests share, a 2 s deadline can pass in the queue, which is the scheduler
/// doing its job; this test checks the tokens a completed request returns.
async fn post_until_served(address: SocketAddr, path: &str, body: Bytes) -> Reply {
    let reply = post(address, path, body.clone()).await;
    if reply.status == StatusCode::SERVICE_UNAVAILABLE && String::from_utf8_lossy(&reply.body).contains("expired") {
        return post(address, path, body).await;
    }
    reply
}

/// What each (model, prompt, max tokens) case generates alone (greedy decoding is
/// deterministic).
fn generated_alone(cases: &[(&str, Vec<i64>, u64)]) -> Vec<Vec<i64>> {
    let (path, decoder) = tiny_decoder().unwrap();
    let mut session = DecoderSession::load(&Runtime::global().unwrap(), &path, decoder, 1).unwrap();
    cases.iter().map(|(_, p, n)| session.generate(p, *n as usize, *n as usize).unwrap()).collect()
}

/// Send every case at once over HTTP/1.1 (each once more if it expired).
fn send_all(address: SocketAddr, cases: &[(&str, Vec<i64>, u64)]) -> Vec<tokio::task::JoinHandle<Reply>> {
    cases
        .iter()
        .map(|(model, p, n)| {
            let (path, body) = (format!("/v2/models/{model}/infer"), body(p, Some(*n)));
            tokio::spawn(async move { post_until_served(address, &path, body).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_ids_in_generated_ids_out_over_http1_and_http3() {
    let state = std::env::temp_dir().join(format!("yardmaster-llm-http-{}", std::process::id()));
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pipeline: "llm-tiny".into(),
        state_dir: Some(state.clone()),
        ..ServeConfig::default()
    };
    let server = LlmServer::start(&config).await.unwrap();
    assert_eq!(server.policy, "calm", "the default policy of an LLM pipeline");
    assert_eq!(server.models, ["ls", "ds"]);
    let address = server.address();
    let banner = server.banner();
    assert!(banner.contains("serving ls, ds with policy calm"), "{banner}");

    let cases: Vec<(&str, Vec<i64>, u64)> =
        (0..8).map(|i| (if i % 2 == 0 { "ls" } else { "ds" }, prompt(8 + 23 * i, i as u64), 4 + 5 * i as u64)).collect();
    let expected = generated_alone(&cases);

    // Concurrent requests over HTTP/1.1, so CALM batches them.
    let tasks = send_all(address, &cases);
    for (task, want) in tasks.into_iter().zip(&expected) {
        assert_eq!(&output_ids(&task.await.unwrap()), want);
    }

    // The same over HTTP/3.
    let trusted = tls::read_certificates(server.listeners.certificate.as_ref().unwrap()).unwrap();
    let mut three = Http3Client::connect(address, "localhost", &trusted).await.unwrap();
    let reply = three.request(Method::POST, "/v2/models/ds/infer", &headers(), body(&cases[1].1, Some(cases[1].2))).await.unwrap();
    assert_eq!(output_ids(&reply), expected[1]);

    // Without max_tokens, the executor's default length.
    let reply = post(address, "/v2/models/ls/infer", body(&[1, 2, 3], None)).await;
    assert_eq!(output_ids(&reply).len(), yardmaster::serve::llm::DEFAULT_MAX_TOKENS as usize);

    // Refusals, each with its reason.
    let out_of_vocabulary = post(address, "/v2/models/ls/infer", body(&[1, 9_999], Some(3))).await;
    assert!(reason(&out_of_vocabulary, StatusCode::BAD_REQUEST).contains("outside the vocabulary"));
    let zero = post(address, "/v2/models/ls/infer", body(&[1, 2], Some(0))).await;
    assert!(reason(&zero, StatusCode::BAD_REQUEST).contains("max_tokens"));
    let empty = post(address, "/v2/models/ls/infer", body(&[], Some(3))).await;
    assert!(reason(&empty, StatusCode::BAD_REQUEST).contains("no tokens"));
    let floats = json!({"inputs": [{"name": "input_ids", "shape": [1], "datatype": "FP32", "data": [1.0]}]});
    let floats = post(address, "/v2/models/ls/infer", Bytes::from(floats.to_string())).await;
    assert!(reason(&floats, StatusCode::BAD_REQUEST).contains("INT64"));
    let unknown = post(address, "/v2/models/chat/infer", body(&[1], Some(1))).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", String::from_utf8_lossy(&unknown.body));

    // Model metadata and metrics.
    let mut client = Http1Client::connect(address).await.unwrap();
    let metadata = client.request(Method::GET, "/v2/models/ls", &HeaderMap::new(), Bytes::new()).await.unwrap();
    let metadata: Value = serde_json::from_slice(&metadata.body).unwrap();
    assert_eq!(metadata["inputs"][0]["name"], "input_ids");
    let metrics = client.request(Method::GET, "/metrics", &HeaderMap::new(), Bytes::new()).await.unwrap();
    let metrics = String::from_utf8(metrics.body.to_vec()).unwrap();
    let completed: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("yardmaster_requests_ended_total{arm=\"primary\",stream=")
                && (l.contains("outcome=\"on_time\"") || l.contains("outcome=\"late\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(completed, 10.0, "ten requests completed:\n{metrics}");

    let summary = server.summary();
    assert!(summary.starts_with("served 10 requests: 10 on time") || summary.starts_with("served 10 requests: "), "{summary}");
    server.stop().await;
    let _ = std::fs::remove_dir_all(&state);
}

const ADMIN_TOKEN: &str = "llm-admin-token";

async fn admin(address: SocketAddr, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
    let mut headers = headers();
    headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).unwrap());
    let mut client = Http1Client::connect(address).await.unwrap();
    let reply = client.request(method, path, &headers, Bytes::from(body.to_string())).await.unwrap();
    let value = serde_json::from_slice(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply.body)));
    (reply.status, value)
}

/// The LLM pipeline has the pipeline server's admin API: while requests flow, a hot
/// swap, a shadow, an A/B run (each arm with its share of the decoders) and its
/// promotion; every request is answered exactly once, none fails, and completed ones
/// return the tokens their prompt generates alone, whichever policy served them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_pipeline_swaps_shadows_and_runs_an_ab_test_while_serving() {
    let state = std::env::temp_dir().join(format!("yardmaster-llm-admin-{}", std::process::id()));
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        grpc: false,
        pipeline: "llm-tiny".into(),
        state_dir: Some(state.clone()),
        ..ServeConfig::default()
    };
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.token = Some(ADMIN_TOKEN.into());
    std::fs::create_dir_all(&state).unwrap();
    let trace = state.join("llm.jsonl");
    config.capture = Some(trace.clone());
    let server = LlmServer::start(&config).await.unwrap();
    let (address, admin_address) = (server.address(), server.admin_address().expect("the admin API runs"));
    assert!(server.banner().contains("admin API at"), "{}", server.banner());

    let (path, decoder) = tiny_decoder().unwrap();
    let mut session = DecoderSession::load(&Runtime::global().unwrap(), &path, decoder, 1).unwrap();
    let prompts: Vec<Vec<i64>> = (0..6).map(|i| prompt(6 + 5 * i, 100 + i as u64)).collect();
    let expected: Vec<Vec<i64>> = prompts.iter().map(|p| session.generate(p, 6, 6).unwrap()).collect();

    // Traffic for the whole test: four clients in turn over the prompts, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, prompts, expected) = (stop.clone(), prompts.clone(), expected.clone());
            tokio::spawn(async move {
                let (mut sent, mut completed, mut dropped) = (0u32, 0u32, 0u32);
                let mut i = c;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || sent < 3 {
                    let k = i % prompts.len();
                    let model = if i % 2 == 0 { "ls" } else { "ds" };
                    let reply = post(address, &format!("/v2/models/{model}/infer"), body(&prompts[k], Some(6))).await;
                    sent += 1;
                    match reply.status {
                        StatusCode::OK => {
                            assert_eq!(output_ids(&reply), expected[k], "a completed request generates its own tokens");
                            completed += 1;
                        }
                        StatusCode::SERVICE_UNAVAILABLE => dropped += 1,
                        other => panic!("request failed with {other}: {}", String::from_utf8_lossy(&reply.body)),
                    }
                    i += 4;
                }
                (sent, completed, dropped)
            })
        })
        .collect();

    let (status, policies) = admin(admin_address, Method::GET, "/admin/policies", "").await;
    assert_eq!(status, StatusCode::OK, "{policies}");
    assert_eq!(policies["arms"][0]["policy"], "calm", "{policies}");
    let (status, swapped) = admin(admin_address, Method::POST, "/admin/swap", r#"{"shipped": "calm-fcfs"}"#).await;
    assert_eq!(status, StatusCode::OK, "{swapped}");
    let (_, policies) = admin(admin_address, Method::GET, "/admin/policies", "").await;
    assert_eq!(policies["arms"][0]["policy"], "calm-fcfs", "{policies}");
    let (status, shadow) = admin(admin_address, Method::POST, "/admin/shadow", r#"{"shipped": "calm-edf"}"#).await;
    assert_eq!(status, StatusCode::OK, "{shadow}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, report) = admin(admin_address, Method::DELETE, "/admin/shadow", "").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let (status, started) = admin(admin_address, Method::POST, "/admin/ab", r#"{"shipped": "calm", "share": 0.5}"#).await;
    assert_eq!(status, StatusCode::OK, "{started}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, view) = admin(admin_address, Method::GET, "/admin/ab", "").await;
        let candidate = &view["report"]["candidate"];
        if candidate["on_time"].as_u64().unwrap_or(0) + candidate["late"].as_u64().unwrap_or(0) >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the candidate arm served nothing in 60 s: {view}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, promoted) = admin(admin_address, Method::POST, "/admin/ab/promote", "").await;
    assert_eq!(status, StatusCode::OK, "{promoted}");
    // The control drains what it holds, then hands its decoders over.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let policies = loop {
        let (_, policies) = admin(admin_address, Method::GET, "/admin/policies", "").await;
        if policies["arms"].as_array().map(Vec::len) == Some(1) {
            break policies;
        }
        assert!(std::time::Instant::now() < deadline, "the control arm still there 60 s after the promotion: {policies}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(policies["arms"][0]["policy"], "calm", "{policies}");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut sent, mut completed) = (0, 0);
    for client in clients {
        let (s, c, _) = client.await.unwrap();
        sent += s;
        completed += c;
    }
    assert!(completed > 0 && sent >= 12, "{completed} of {sent} completed");
    server.stop().await;

    // The captured trace: every request with its prompt length and tokens asked for,
    // the decode frames; the simulator replays it on the same pipeline.
    let text = std::fs::read_to_string(&trace).unwrap();
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let arrivals: Vec<&Value> = records.iter().filter(|r| r["kind"] == "arrival").collect();
    assert_eq!(arrivals.len() as u32, sent, "every request is in the trace: {}", &text[..text.len().min(600)]);
    assert!(text.contains("\"expected_tokens\":6"), "{}", &text[..text.len().min(600)]);
    let pipeline = state.join("llm-tiny.toml");
    std::fs::write(&pipeline, yardmaster::serve::llm::LLM_TINY_PRESET).unwrap();
    let replay = std::process::Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "compare", "--policies", "calm,calm-fcfs", "--pipeline"])
        .arg(&pipeline)
        .arg("--workload")
        .arg(format!("trace:{}", trace.display()))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&replay.stdout);
    assert!(replay.status.success(), "{table}\n{}", String::from_utf8_lossy(&replay.stderr));
    assert!(table.lines().any(|l| l.starts_with("calm ")), "{table}");
    let _ = std::fs::remove_dir_all(&state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_pipeline_decodes_on_a_node_and_its_requests_end_once_when_the_node_dies() {
    let tls_dir = std::env::temp_dir().join(format!("yardmaster-llm-node-serve-{}", std::process::id()));
    let mut node = NodeProcess::start(&tls_dir);
    let (node_address, pin) = (node.address, node.printed_pin.clone());
    let state = std::env::temp_dir().join(format!("yardmaster-llm-remote-{}", std::process::id()));
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pipeline: "llm-tiny".into(),
        state_dir: Some(state.clone()),
        remote: vec![yardmaster::serve::config::RemotePlacement { stages: vec!["generate".into()], node: node_address, pin: pin.clone() }],
        ..ServeConfig::default()
    };
    // A stage the pipeline does not have is refused with the stages it has.
    let mut wrong = config.clone();
    wrong.remote[0].stages = vec!["decode".into()];
    let Err(error) = LlmServer::start(&wrong).await else { panic!("an unknown stage is refused") };
    let error = error.to_string();
    assert!(error.contains("\"decode\"") && error.contains("generate"), "{error}");

    let server = LlmServer::start(&config).await.unwrap();
    assert!(server.banner().contains(&format!("\nstage generate on node {node_address}\n")), "{}", server.banner());
    let address = server.address();
    let cases: Vec<(&str, Vec<i64>, u64)> =
        (0..6).map(|i| (if i % 2 == 0 { "ls" } else { "ds" }, prompt(5 + 17 * i, 100 + i as u64), 3 + 4 * i as u64)).collect();
    let expected = generated_alone(&cases);
    let tasks = send_all(address, &cases);
    for (task, want) in tasks.into_iter().zip(&expected) {
        assert_eq!(&output_ids(&task.await.unwrap()), want, "a remote decoder generates what the decoder generates here");
    }
    let frames = server.handle.inspect(|engine| engine.executor().borrow().stats().frames).unwrap();
    assert!(frames > 0, "frames ran");

    // Long requests, then the node dies (SIGKILL: no goodbye) while they decode.
    let long: Vec<_> = (0..4)
        .map(|i| {
            let body = body(&prompt(40, 900 + i), Some(1_500));
            tokio::spawn(async move { post(address, "/v2/models/ds/infer", body).await })
        })
        .collect();
    let started = std::time::Instant::now();
    loop {
        let tokens = server.handle.inspect(|engine| engine.executor().borrow().stats().tokens).unwrap();
        if tokens > 0 && tokens > expected.iter().map(|e| e.len() as u64).sum::<u64>() {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "the long requests never started decoding");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let killed_at = std::time::Instant::now();
    node.kill();
    let mut lost = 0;
    for task in long {
        let reply = tokio::time::timeout(std::time::Duration::from_secs(30), task).await.expect("a request outlived its node").unwrap();
        let text = String::from_utf8_lossy(&reply.body).to_string();
        assert_ne!(reply.status, StatusCode::OK, "a 1,500-token request finished before its node died: {text}");
        lost += usize::from(text.contains("decoder node lost"));
    }
    assert!(lost > 0, "at least one decoding request names the lost node");
    eprintln!("the node's death ended its requests within {:?}", killed_at.elapsed());
    // The server still answers: a new request ends (with no decoder left, not 200).
    let reply = tokio::time::timeout(std::time::Duration::from_secs(30), post(address, "/v2/models/ls/infer", body(&[1, 2, 3], Some(3))))
        .await
        .expect("a request after the node's death ends");
    assert_ne!(reply.status, StatusCode::OK);
    server.stop().await;
    let _ = std::fs::remove_dir_all(state);
}
