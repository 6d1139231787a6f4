//! A/B runs on the real server (ONNX Runtime workers on the trivial model, HTTP/1.1)
//! through the admin API: a run splits requests in the asked proportion and gives each
//! arm workers of its own, every metric is labelled by arm, a split by key keeps a
//! key on one arm, each arm can be swapped on its own, promotion and roll-back end the
//! run without losing a request, bad commands are refused with the reason and
//! unauthenticated calls get 401.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::Value;
use yardmaster::serve::client::{Http1Client, Reply};
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::server::Server;

const TOKEN: &str = "test-admin-token";
const TINY_BODY: &[u8] = br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;

fn config() -> ServeConfig {
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        http3: false,
        pipeline: "tiny".into(),
        policy: "edf".into(),
        ..ServeConfig::default()
    };
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.token = Some(TOKEN.into());
    config
}

async fn call(address: SocketAddr, token: Option<&str>, method: Method, path: &str, body: &str) -> Reply {
    let mut headers = HeaderMap::new();
    if let Some(token) = token {
        headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
    }
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut client = Http1Client::connect(address).await.unwrap();
    client.request(method, path, &headers, Bytes::from(body.to_string())).await.unwrap()
}

/// An admin call that must succeed; its JSON answer.
async fn ok(admin: SocketAddr, method: Method, path: &str, body: &str) -> Value {
    let reply = call(admin, Some(TOKEN), method, path, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&reply.body));
    serde_json::from_slice(&reply.body).unwrap()
}

/// An admin call that must be refused with `status`; its reason.
async fn refused(admin: SocketAddr, method: Method, path: &str, body: &str, status: StatusCode) -> String {
    let reply = call(admin, Some(TOKEN), method, path, body).await;
    assert_eq!(reply.status, status, "{path}: {}", String::from_utf8_lossy(&reply.body));
    let value: Value = serde_json::from_slice(&reply.body).unwrap();
    value["error"].as_str().unwrap().to_string()
}

/// `count` requests over `connections` connections, with `key` as the split key; every
/// status.
async fn infer(address: SocketAddr, connections: usize, count: usize, key: Option<&'static str>) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            tokio::spawn(async move {
                let mut headers = HeaderMap::new();
                if let Some(key) = key {
                    headers.insert("x-yardmaster-key", HeaderValue::from_static(key));
                }
                let mut client = Http1Client::connect(address).await.unwrap();
                let mut statuses = Vec::new();
                for _ in 0..count / connections {
                    let reply =
                        client.request(Method::POST, "/v2/models/tiny/infer", &headers, Bytes::from_static(TINY_BODY)).await.unwrap();
                    if reply.status != StatusCode::OK {
                        eprintln!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body));
                    }
                    statuses.push(reply.status);
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    statuses
}

async fn metrics(address: SocketAddr) -> String {
    let mut client = Http1Client::connect(address).await.unwrap();
    let reply = client.request(Method::GET, "/metrics", &HeaderMap::new(), Bytes::new()).await.unwrap();
    String::from_utf8(reply.body.to_vec()).unwrap()
}

/// Wait until the run has ended (the loser drained); the final `GET /admin/ab`.
async fn until_ended(admin: SocketAddr) -> Value {
    let started = Instant::now();
    loop {
        let view = ok(admin, Method::GET, "/admin/ab", "").await;
        if view["status"]["state"] == "none" || started.elapsed() > Duration::from_secs(20) {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn requests(report: &Value, arm: &str) -> u64 {
    report[arm]["requests"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ab_run_splits_labels_swaps_and_promotes_on_the_real_server() {
    let server = Server::start(&config(), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());

    let reply = call(admin, None, Method::POST, "/admin/ab", r#"{"shipped":"fifo"}"#).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let reply = call(admin, Some("wrong"), Method::GET, "/admin/ab", "").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(refused(admin, Method::POST, "/admin/ab", r#"{"shipped":"fifo","share":1.5}"#, StatusCode::BAD_REQUEST)
        .await
        .contains("between 0 and 1"));
    assert!(refused(admin, Method::POST, "/admin/ab", r#"{"shipped":"nope"}"#, StatusCode::BAD_REQUEST)
        .await
        .contains("no shipped policy"));
    assert!(refused(admin, Method::POST, "/admin/ab/promote", "", StatusCode::CONFLICT).await.contains("no A/B run"));

    let status = ok(admin, Method::POST, "/admin/ab", r#"{"shipped":"fifo","share":0.3}"#).await;
    assert_eq!(status["state"], "running");
    let arms: Vec<&str> = status["arms"].as_array().unwrap().iter().map(|a| a["arm"].as_str().unwrap()).collect();
    assert_eq!(arms, ["edf", "fifo"]);
    assert!(status["arms"].as_array().unwrap().iter().all(|a| a["workers"] == serde_json::json!([1])), "each arm has a worker: {status}");
    assert!(refused(admin, Method::POST, "/admin/ab", r#"{"shipped":"fifo"}"#, StatusCode::CONFLICT).await.contains("already in progress"));
    let listed = ok(admin, Method::GET, "/admin/policies", "").await;
    assert_eq!(listed["arms"].as_array().unwrap().len(), 2);

    let statuses = infer(address, 8, 800, None).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    let report = ok(admin, Method::GET, "/admin/ab", "").await["report"].clone();
    assert_eq!(requests(&report, "control") + requests(&report, "candidate"), 800);
    let share = requests(&report, "candidate") as f64 / 800.0;
    assert!((share - 0.3).abs() < 0.07, "the candidate got {share} of the requests");
    assert_eq!(report["differences"].as_array().unwrap().len(), 3);
    let text = metrics(address).await;
    // Stable arm labels (the series go on across swaps and promotions), the arms'
    // names on the info series.
    for (arm, name) in [("primary", "edf"), ("candidate", "fifo")] {
        assert!(text.contains(&format!("yardmaster_requests_arrived_total{{arm=\"{arm}\"")), "{arm} has its series:\n{text}");
        assert!(text.contains(&format!("yardmaster_policy_info{{arm=\"{arm}\",name=\"{name}\"")), "{name} is named:\n{text}");
    }
    assert!(text.contains("yardmaster_ab_running 1"));

    // Each arm swaps on its own; an unknown arm is refused.
    let swapped = ok(admin, Method::POST, "/admin/swap?arm=fifo", r#"{"shipped":"edf"}"#).await;
    assert!(swapped["to"].as_str().unwrap().starts_with("edf"), "{swapped}");
    assert!(refused(admin, Method::POST, "/admin/swap?arm=nope", r#"{"shipped":"edf"}"#, StatusCode::CONFLICT)
        .await
        .contains("no arm named"));

    // Promote while requests flow: none is lost, the candidate ends up with every worker.
    let flowing = tokio::spawn(infer(address, 4, 400, None));
    tokio::time::sleep(Duration::from_millis(30)).await;
    ok(admin, Method::POST, "/admin/ab/promote", "").await;
    let statuses = flowing.await.unwrap();
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    let view = until_ended(admin).await;
    assert_eq!(view["status"]["state"], "none", "{view}");
    let arms = view["status"]["arms"].as_array().unwrap();
    assert_eq!((arms.len(), arms[0]["arm"].as_str(), &arms[0]["workers"]), (1, Some("fifo"), &serde_json::json!([1])));
    assert!(requests(&view["report"], "candidate") > 240, "the last run's report stays: {view}");
    let text = metrics(address).await;
    assert!(text.contains("yardmaster_ab_running 0"));
    // The winner's series go on as `primary`: a dashboard needs no change.
    assert!(text.contains("yardmaster_policy_info{arm=\"primary\",name=\"fifo\""), "{text}");
    assert!(text.contains("yardmaster_requests_arrived_total{arm=\"primary\"") && !text.contains("arm=\"candidate\""), "{text}");

    // A split by key keeps each key on one arm.
    ok(admin, Method::POST, "/admin/ab?by=key&arm=b", r#"{"shipped":"edf","share":0.5}"#).await;
    for key in ["tenant-a", "tenant-b", "tenant-c"] {
        let before = ok(admin, Method::GET, "/admin/ab", "").await["report"].clone();
        assert!(infer(address, 2, 40, Some(key)).await.iter().all(|s| *s == StatusCode::OK));
        let after = ok(admin, Method::GET, "/admin/ab", "").await["report"].clone();
        let moved: Vec<u64> = ["control", "candidate"].iter().map(|arm| requests(&after, arm) - requests(&before, arm)).collect();
        assert!(moved == [40, 0] || moved == [0, 40], "{key}: {moved:?}");
    }
    ok(admin, Method::POST, "/admin/ab/rollback", "").await;
    let view = until_ended(admin).await;
    assert_eq!(view["status"]["arms"][0]["arm"], "fifo", "rolled back to the control: {view}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_candidate_s_workers_are_started_and_warm_before_the_split_routes_a_request_to_it() {
    let server = Server::start(&config(), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());
    // Requests flow while the run starts: none may reach the candidate before its
    // workers are ready.
    let flowing = tokio::spawn(infer(address, 4, 400, None));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let status = ok(admin, Method::POST, "/admin/ab", r#"{"shipped":"fifo","share":0.5}"#).await;
    // The call answers once the split routes to the candidate: its workers are ready.
    assert_eq!(status["state"], "running", "{status}");
    let candidate = &status["arms"][1];
    assert_eq!(candidate["ready"], candidate["workers"], "every worker of the candidate is ready: {status}");
    assert!(status["warm_up_ms"].as_f64().is_some(), "{status}");
    let statuses = flowing.await.unwrap();
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    assert!(infer(address, 4, 200, None).await.iter().all(|s| *s == StatusCode::OK));
    let view = ok(admin, Method::GET, "/admin/ab", "").await;
    assert!(requests(&view["report"], "candidate") > 0, "{view}");
    assert_eq!(view["status"]["starting_at_first_request"], 0, "the candidate's first request found no worker starting: {view}");
    ok(admin, Method::POST, "/admin/ab/rollback", "").await;
    until_ended(admin).await;

    // Asked not to wait (the behaviour before warm-ups), the split routes at once and
    // the start's answer shows the candidate's workers still starting.
    let status = ok(admin, Method::POST, "/admin/ab?warm=false", r#"{"shipped":"fifo","share":0.5}"#).await;
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["arms"][1]["ready"], serde_json::json!([0]), "{status}");
    assert!(infer(address, 2, 40, None).await.iter().all(|s| *s == StatusCode::OK));
    ok(admin, Method::POST, "/admin/ab/rollback", "").await;
    until_ended(admin).await;
    server.stop().await;
}

/// `count` OCR requests (a rendered line of text) over `connections` connections.
async fn infer_ocr(address: SocketAddr, connections: usize, count: usize) -> Vec<StatusCode> {
    let image = yardmaster::dataplane::ocr::sample::render_text(&["WARM CANDIDATES"], 32.0, 480, 80, 10.0, 10.0).unwrap();
    let body = Bytes::from(
        serde_json::to_vec(&serde_json::json!({"parameters": {"timeout": 30_000_000}, "inputs": [{"name": "image",
            "datatype": "UINT8", "shape": [image.height, image.width, 3], "data": image.data}]}))
        .unwrap(),
    );
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut client = Http1Client::connect(address).await.unwrap();
                let mut statuses = Vec::new();
                for _ in 0..count / connections {
                    statuses
                        .push(client.request(Method::POST, "/v2/models/ocr/infer", &HeaderMap::new(), body.clone()).await.unwrap().status);
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    statuses
}

/// The p99 latency of the first requests an A/B candidate serves right after `ab
/// start`, requests flowing throughout, with its workers warmed up before the split
/// routes to it (`warm`) and without (`warm=false`: the split routes at once, as
/// before), alternating the two in one server, on the tiny pipeline and on PP-OCR. Run
/// it with `cargo test -p yardmaster --test all bench_first_requests_after_ab_start --
/// --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: run by hand"]
async fn bench_first_requests_after_ab_start() {
    let only = std::env::var("BENCH_PIPELINE").ok();
    for (pipeline, connections, count, rounds) in [("tiny", 4, 400, 7), ("ocr", 2, 12, 5)] {
        if only.as_deref().is_some_and(|p| p != pipeline) {
            continue;
        }
        let mut config = config();
        config.pipeline = pipeline.into();
        let server = Server::start(&config, Vec::new()).await.unwrap();
        let (address, admin) = (server.address(), server.admin_address().unwrap());
        let mut p99 = [Vec::new(), Vec::new()];
        // Round 0 warms the model cache for both and is not counted.
        for round in 0..rounds {
            for warm in [round % 2 == 0, round % 2 == 1] {
                let flowing = match pipeline {
                    "ocr" => tokio::spawn(infer_ocr(address, connections, count)),
                    _ => tokio::spawn(infer(address, connections, count, None)),
                };
                tokio::time::sleep(Duration::from_millis(if pipeline == "ocr" { 300 } else { 10 })).await;
                let path = if warm { "/admin/ab" } else { "/admin/ab?warm=false" };
                let started = Instant::now();
                ok(admin, Method::POST, path, r#"{"shipped":"fifo","share":0.5,"deadline_ms":1000}"#).await;
                let start_call = started.elapsed();
                let statuses = flowing.await.unwrap();
                assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
                let view = ok(admin, Method::GET, "/admin/ab", "").await;
                let candidate = &view["report"]["candidate"];
                let ms = candidate["p99_latency_ms"].as_f64().unwrap();
                eprintln!(
                    "{pipeline} round {round} warm={warm}: ab start answered in {:.1} ms (warm-up {:.1} ms); the candidate's first {} requests: p50 {:.2} ms, p99 {ms:.2} ms",
                    start_call.as_secs_f64() * 1e3,
                    view["status"]["warm_up_ms"].as_f64().unwrap_or(f64::NAN),
                    candidate["requests"],
                    candidate["p50_latency_ms"].as_f64().unwrap()
                );
                if round > 0 {
                    p99[usize::from(warm)].push(ms);
                }
                ok(admin, Method::POST, "/admin/ab/rollback", "").await;
                until_ended(admin).await;
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (cold, warm) = (median(&mut p99[0]), median(&mut p99[1]));
        eprintln!(
            "{pipeline}: the candidate's p99 over its first requests, median of {} rounds: cold {cold:.2} ms, warm {warm:.2} ms (ratio warm/cold {:.3}); cold {:?}, warm {:?}",
            rounds - 1,
            warm / cold,
            p99[0],
            p99[1]
        );
        server.stop().await;
    }
}
