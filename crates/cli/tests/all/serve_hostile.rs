//! Hostile policies as one arm of an A/B run on the real server (ONNX Runtime workers
//! on the trivial model, HTTP/1.1): a policy that loops forever, recurses without end,
//! allocates until memory runs out, traps, traps in `init`, floods the host with
//! actions, answers invalid actions, or reaches for the other arm's requests. Each is
//! contained within its call's bound, its arm falls back (or its bad actions are
//! rejected), every request ends exactly once, and the other arm serves on untouched.
//! A component importing outside the policy world is refused before it runs.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::Value;
use yardmaster::serve::client::{Http1Client, Reply};
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::server::Server;
use yardmaster_policy_artifacts::fixtures;

const TOKEN: &str = "test-admin-token";
const TINY_BODY: &[u8] = br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
const REQUESTS: usize = 120;

/// The trivial pipeline under `edf`; `mode` is read by the hostile fixture only.
fn config(mode: &str) -> ServeConfig {
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        http3: false,
        pipeline: "tiny".into(),
        policy: "edf".into(),
        params: [("mode".to_string(), mode.to_string())].into_iter().collect(),
        ..ServeConfig::default()
    };
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.token = Some(TOKEN.into());
    config
}

async fn admin(address: SocketAddr, method: Method, path: &str, body: String) -> Reply {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap());
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut client = Http1Client::connect(address).await.unwrap();
    client.request(method, path, &headers, Bytes::from(body)).await.unwrap()
}

fn json(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply.body)))
}

/// `REQUESTS` requests over 4 connections: each answer's status and body.
async fn infer(address: SocketAddr) -> Vec<(StatusCode, String)> {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut client = Http1Client::connect(address).await.unwrap();
                let mut answers = Vec::new();
                for _ in 0..REQUESTS / 4 {
                    let reply = client
                        .request(Method::POST, "/v2/models/tiny/infer", &HeaderMap::new(), Bytes::from_static(TINY_BODY))
                        .await
                        .unwrap();
                    answers.push((reply.status, String::from_utf8_lossy(&reply.body).into_owned()));
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers
}

/// A sample's value from the exposition (0 when absent).
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_arm_is_contained_and_the_other_arm_serves_on() {
    // (mode, whether the arm must have fallen back, whether its requests may be dropped)
    let cases = [
        ("spin", true, false),
        ("recurse", true, false),
        ("membomb", true, false),
        ("trap", true, false),
        ("flood", true, false),
        ("invalid", false, true),
        ("poach", false, false),
    ];
    // A candidate that traps in `init` never becomes an arm: it is refused with the
    // reason, and the server goes on with its one arm.
    {
        let server = Server::start(&config("trap-init"), Vec::new()).await.unwrap();
        let (address, admin_address) = (server.address(), server.admin_address().unwrap());
        let body = format!(r#"{{"path":"{}","share":0.5,"arm":"hostile"}}"#, fixtures::HOSTILE);
        let reply = admin(admin_address, Method::POST, "/admin/ab", body).await;
        let reason = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reason}");
        assert!(reason.contains("faulted while being prepared") && reason.contains("trap"), "{reason}");
        let arms = json(&admin(admin_address, Method::GET, "/admin/policies", String::new()).await);
        assert_eq!(arms["arms"].as_array().map(Vec::len), Some(1), "no candidate arm: {arms}");
        assert!(infer(address).await.iter().all(|(status, _)| *status == StatusCode::OK), "the one arm serves");
        server.stop().await;
    }
    for (mode, falls_back, may_drop) in cases {
        let server = Server::start(&config(mode), Vec::new()).await.unwrap();
        let (address, admin_address) = (server.address(), server.admin_address().unwrap());
        let body = format!(r#"{{"path":"{}","share":0.5,"arm":"hostile"}}"#, fixtures::HOSTILE);
        let reply = admin(admin_address, Method::POST, "/admin/ab", body).await;
        assert_eq!(reply.status, StatusCode::OK, "{mode}: {}", String::from_utf8_lossy(&reply.body));

        let answers = infer(address).await;
        assert_eq!(answers.len(), REQUESTS, "{mode}: every request is answered");
        for (status, body) in &answers {
            let dropped = *status == StatusCode::SERVICE_UNAVAILABLE && body.contains("dropped by the scheduler: dropped by the policy");
            assert!(*status == StatusCode::OK || (may_drop && dropped), "{mode}: {status} {body}");
        }

        let view = json(&admin(admin_address, Method::GET, "/admin/ab", String::new()).await);
        let report = &view["report"];
        let control = &report["control"];
        assert_eq!(control["requests"], control["on_time"], "{mode}: the other arm served everything on time: {report}");
        assert!(control["requests"].as_u64().unwrap() > 20, "{mode}: {report}");
        let candidate = report["candidate"]["requests"].as_u64().unwrap();
        assert_eq!(control["requests"].as_u64().unwrap() + candidate, REQUESTS as u64, "{mode}: each request ended once");

        let arms = json(&admin(admin_address, Method::GET, "/admin/policies", String::new()).await);
        let (edf, hostile) = (&arms["arms"][0], &arms["arms"][1]);
        assert_eq!((edf["state"].as_str(), edf["fallbacks"].as_u64()), (Some("primary"), Some(0)), "{mode}: {arms}");
        let expected = if falls_back { "fallback" } else { "primary" };
        assert_eq!(hostile["state"].as_str(), Some(expected), "{mode}: {arms}");

        let mut client = Http1Client::connect(address).await.unwrap();
        let text = String::from_utf8(client.request(Method::GET, "/metrics", &HeaderMap::new(), Bytes::new()).await.unwrap().body.to_vec())
            .unwrap();
        if !falls_back {
            let rejected: f64 = text
                .lines()
                .filter(|l| l.starts_with("yardmaster_policy_actions_rejected_total{arm=\"candidate\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            assert!(rejected > 0.0, "{mode}: the bad actions were rejected and counted");
        }
        // The host stops a runaway call near its deadline (5 ms for events, 50 ms for
        // init and ticks, plus the epoch ticker's millisecond); loaded debug builds
        // get slack here, tests/tests/all/containment.rs holds the tight bound.
        let longest = sample(&text, "yardmaster_policy_decision_max_seconds{arm=\"candidate\"}");
        assert!(longest < 0.25, "{mode}: the longest call took {longest} s");
        eprintln!("{mode}: arm {expected}, longest call {:.2} ms, {candidate} of {REQUESTS} requests on the hostile arm", longest * 1e3);
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_importing_outside_the_world_is_refused_as_an_arm() {
    let server = Server::start(&config("hold"), Vec::new()).await.unwrap();
    let body = format!(r#"{{"path":"{}"}}"#, fixtures::FORBIDDEN_IMPORT);
    let reply = admin(server.admin_address().unwrap(), Method::POST, "/admin/ab", body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(json(&reply)["error"].as_str().unwrap().contains("outside the yardmaster:policy"), "{}", String::from_utf8_lossy(&reply.body));
    let view = json(&admin(server.admin_address().unwrap(), Method::GET, "/admin/ab", String::new()).await);
    assert_eq!(view["status"]["state"], "none", "nothing started");
    server.stop().await;
}
