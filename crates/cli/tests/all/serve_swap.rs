//! Hot swap of the policy on the real server (ONNX Runtime workers on the trivial
//! model, HTTP/1.1) through the admin API and the watched directory: swaps while
//! requests flow lose or repeat none, a policy that traps at once is refused and the
//! running one keeps serving, bad files are refused with the loader's reason, calls without
//! the token get 401. The `#[ignore]`d benchmarks measure the swap pause with 10,000
//! held requests (and the snapshot and preparation off the engine's thread) and the
//! memory, threads and file descriptors over 1,000 swap cycles (run them with
//! `cargo test --release -p yardmaster --test all serve_swap -- --ignored --nocapture
//! --test-threads 1`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::Value;
use yardmaster::engine::Submission;
use yardmaster::serve::client::{Http1Client, Reply};
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::server::Server;
use yardmaster_policy_artifacts::fixtures;

const TOKEN: &str = "test-admin-token";
const TINY_BODY: &[u8] = br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;

fn config(policy: &str, params: &[(&str, &str)]) -> ServeConfig {
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        http3: false,
        pipeline: "tiny".into(),
        policy: policy.into(),
        params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..ServeConfig::default()
    };
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    config.admin.token = Some(TOKEN.into());
    config
}

/// One admin call with `token` (none: no `Authorization` header).
async fn admin_call(address: SocketAddr, token: Option<&str>, method: Method, path: &str, body: Bytes) -> Reply {
    let mut headers = HeaderMap::new();
    if let Some(token) = token {
        headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
    }
    let mut client = Http1Client::connect(address).await.unwrap();
    client.request(method, path, &headers, body).await.unwrap()
}

fn json(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply.body)))
}

async fn swap_shipped(admin: SocketAddr, name: &str) -> Value {
    let body = Bytes::from(format!(r#"{{"shipped":"{name}"}}"#));
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    json(&reply)
}

async fn policies(admin: SocketAddr) -> Value {
    let reply = admin_call(admin, Some(TOKEN), Method::GET, "/admin/policies", Bytes::new()).await;
    assert_eq!(reply.status, StatusCode::OK);
    json(&reply)["arms"][0].clone()
}

/// Send `count` inference requests over one connection; the statuses in order.
async fn infer(address: SocketAddr, count: usize) -> Vec<StatusCode> {
    let mut client = Http1Client::connect(address).await.unwrap();
    let mut statuses = Vec::new();
    for _ in 0..count {
        let reply = client.request(Method::POST, "/v2/models/tiny/infer", &HeaderMap::new(), Bytes::from_static(TINY_BODY)).await.unwrap();
        statuses.push(reply.status);
    }
    statuses
}

/// A metric's value from `/metrics` (the first sample whose line starts with `prefix`).
async fn metric(address: SocketAddr, prefix: &str) -> f64 {
    let mut client = Http1Client::connect(address).await.unwrap();
    let reply = client.request(Method::GET, "/metrics", &HeaderMap::new(), Bytes::new()).await.unwrap();
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let line = text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swaps_while_requests_flow_answer_every_request_exactly_once() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().expect("a token starts the admin API"));
    let (clients, per_client) = (30, 10);
    // Swap round a policy that holds every request, fifo, the holder again, edf, …
    // for as long as requests flow (at least 8 times): whatever the holder took is
    // replayed into the next policy, which must serve it. The holder goes first, so
    // the first requests are certainly held and replayed.
    let hold = Bytes::from(std::fs::read(fixtures::HOSTILE).unwrap());
    let mut tasks = Vec::new();
    let mut summaries = Vec::new();
    while summaries.len() < 8 || tasks.iter().any(|t: &tokio::task::JoinHandle<_>| !t.is_finished()) {
        let summary = match summaries.len() % 4 {
            1 => swap_shipped(admin, "fifo").await,
            3 => swap_shipped(admin, "edf").await,
            _ => {
                let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=holder", hold.clone()).await;
                if tasks.is_empty() {
                    tasks = (0..clients).map(|_| tokio::spawn(infer(address, per_client))).collect();
                }
                let started = Instant::now();
                while tasks.iter().any(|t| !t.is_finished())
                    && policies(admin).await["held"].as_u64() == Some(0)
                    && started.elapsed() < Duration::from_secs(10)
                {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                json(&reply)
            }
        };
        summaries.push(summary);
    }
    summaries.push(swap_shipped(admin, "edf").await);
    let swaps = summaries.len();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for task in tasks {
        for status in task.await.unwrap() {
            *statuses.entry(status.as_u16()).or_default() += 1;
        }
    }
    assert_eq!(statuses, BTreeMap::from([(200, clients * per_client)]), "every request completed");
    let replayed: u64 = summaries.iter().map(|s| s["replayed"].as_u64().unwrap()).sum();
    assert!(replayed > 0, "some swaps found requests queued and replayed them ({swaps} swaps)");
    for summary in &summaries {
        assert_eq!(summary["state"], "primary", "{summary}");
        assert!(summary["pause_us"].as_f64().unwrap() > 0.0, "{summary}");
        // Each new policy was replayed a snapshot beforehand and told the rest at the swap.
        assert_eq!(summary["handover"], "delta", "{summary}");
        assert!(summary["pre_replay_us"].as_f64().unwrap() > 0.0, "{summary}");
    }
    let arm = policies(admin).await;
    assert_eq!((arm["policy"].as_str(), arm["swaps"].as_u64()), (Some("edf"), Some(swaps as u64)), "{arm}");
    assert_eq!(arm["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(metric(address, "yardmaster_policy_swaps_total").await, swaps as f64);
    assert_eq!(metric(address, "yardmaster_policy_swap_pause_seconds_count").await, swaps as f64);
    let arrived = metric(address, "yardmaster_requests_arrived_total{arm=\"primary\",stream=\"tiny\"}").await;
    let ended = metric(address, "yardmaster_requests_ended_total{arm=\"primary\",stream=\"tiny\",outcome=\"on_time\"}").await
        + metric(address, "yardmaster_requests_ended_total{arm=\"primary\",stream=\"tiny\",outcome=\"late\"}").await;
    assert_eq!((arrived, ended), ((clients * per_client) as f64, (clients * per_client) as f64), "each request ended once");
    let summary = server.summary();
    server.stop().await;
    assert!(summary.contains(" 0 dropped, 0 failed"), "{summary}");
    eprintln!("{summary}; {replayed} held requests replayed over {swaps} swaps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swap_to_a_policy_that_traps_at_once_is_refused_and_the_running_one_keeps_serving() {
    // `mode` is the hostile fixture's parameter; edf and fifo ignore it.
    let server = Server::start(&config("edf", &[("mode", "trap-init")]), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());
    let bytes = std::fs::read(fixtures::HOSTILE).unwrap();
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=hostile", Bytes::from(bytes)).await;
    let reason = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reason}");
    assert!(reason.contains("faulted while being prepared") && reason.contains("trap"), "{reason}");
    assert!(reason.contains("the running policy is untouched"), "{reason}");
    // It trapped while being prepared, off the engine's thread: edf never stopped.
    let arm = policies(admin).await;
    assert_eq!((arm["policy"].as_str(), arm["state"].as_str(), arm["swaps"].as_u64()), (Some("edf"), Some("primary"), Some(0)), "{arm}");
    assert_eq!(arm["fallbacks"], 0);
    assert!(infer(address, 20).await.iter().all(|s| *s == StatusCode::OK), "edf serves");
    // And a good policy swaps in as ever.
    assert_eq!(swap_shipped(admin, "fifo").await["state"], "primary");
    assert!(infer(address, 5).await.iter().all(|s| *s == StatusCode::OK));
    let summary = server.summary();
    server.stop().await;
    assert!(summary.contains("served 25 requests") && summary.contains(" 0 failed"), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_in_policy_runs_with_its_own_parameters_limits_and_failure_mode() {
    let mut served = config("edf", &[("slack", "1")]);
    served.policy_settings.deadline_ms = Some(8.0);
    let server = Server::start(&served, Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());
    let arm = policies(admin).await;
    assert_eq!((arm["deadline_ms"].as_f64(), arm["failure"].as_str()), (Some(8.0), Some("fail-open")), "the [policy] settings: {arm}");
    // The candidate's own parameter reaches its init: the hostile fixture refuses to start.
    let hostile = Bytes::from(std::fs::read(fixtures::HOSTILE).unwrap());
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=hostile&param=mode%3Drefuse-init", hostile).await;
    let reason = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reason}");
    assert!(reason.contains("refuses to start"), "{reason}");
    // Its memory limit holds from instantiation on: 1 MiB is less than fifo starts with.
    let reply =
        admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap", Bytes::from_static(br#"{"shipped":"fifo","memory_mib":1}"#)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&reply.body));
    // Settings that fit: shown by the list, kept by the arm, and requests served.
    let body = br#"{"shipped":"fifo","params":{"note":"mine","slack":"2"},"deadline_ms":25,"memory_mib":32,"failure":"reload"}"#;
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap", Bytes::from_static(body)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    let arm = policies(admin).await;
    assert_eq!(
        (arm["policy"].as_str(), arm["deadline_ms"].as_f64(), arm["memory_mib"].as_u64()),
        (Some("fifo"), Some(25.0), Some(32)),
        "{arm}"
    );
    assert_eq!(arm["failure"], "reload");
    // Its own over the server's (which include the tiny model's dynamic_batching).
    assert_eq!((arm["params"]["note"].as_str(), arm["params"]["slack"].as_str()), (Some("mine"), Some("2")), "{arm}");
    assert_eq!(arm["params"]["tiny.max_queue_delay_us"], "0", "{arm}");
    assert!(infer(address, 10).await.iter().all(|s| *s == StatusCode::OK));
    // A policy swapped in without settings gets the server's, not the last policy's.
    swap_shipped(admin, "edf").await;
    let arm = policies(admin).await;
    assert_eq!(
        (arm["deadline_ms"].as_f64(), arm["memory_mib"].as_u64(), arm["failure"].as_str()),
        (Some(8.0), Some(64), Some("fail-open")),
        "{arm}"
    );
    assert_eq!((arm["params"]["slack"].as_str(), arm["params"].get("note")), (Some("1"), None), "{arm}");
    // Malformed settings are refused before anything is loaded.
    let reply =
        admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap", Bytes::from_static(br#"{"shipped":"fifo","failure":"panic"}"#)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(json(&reply)["error"].as_str().unwrap().contains("unknown failure mode"));
    // A shadow and an A/B candidate get theirs the same way.
    let hostile = Bytes::from(std::fs::read(fixtures::HOSTILE).unwrap());
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/shadow?name=hostile&param=mode%3Drefuse-init", hostile).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&reply.body));
    let body = br#"{"shipped":"fifo","share":0.5,"failure":"fail-closed","deadline_ms":12}"#;
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/ab", Bytes::from_static(body)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    let reply = admin_call(admin, Some(TOKEN), Method::GET, "/admin/policies", Bytes::new()).await;
    let candidate = json(&reply)["arms"][1].clone();
    assert_eq!((candidate["failure"].as_str(), candidate["deadline_ms"].as_f64()), (Some("fail-closed"), Some(12.0)), "{candidate}");
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/ab/rollback", Bytes::new()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_policy_is_refused_with_the_loader_s_reason_and_the_running_one_untouched() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    let cases: [(&str, Bytes, &str); 5] = [
        ("/admin/swap", Bytes::from_static(b"not a wasm file at all"), "magic bytes"),
        ("/admin/swap", Bytes::from_static(b"\0asm\x01\0\0\0"), "core WebAssembly module"),
        ("/admin/swap", Bytes::from(format!(r#"{{"path":"{}"}}"#, fixtures::FORBIDDEN_IMPORT)), "outside the yardmaster:policy"),
        ("/admin/swap", Bytes::from_static(br#"{"shipped":"no-such-policy"}"#), "no shipped policy named"),
        ("/admin/swap", Bytes::from_static(br#"{"path":"/nonexistent/p.wasm"}"#), "cannot read policy"),
    ];
    for (path, body, reason) in cases {
        let reply = admin_call(admin, Some(TOKEN), Method::POST, path, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&reply.body));
        let error = json(&reply)["error"].as_str().unwrap().to_string();
        assert!(error.contains(reason), "{error:?} should contain {reason:?}");
    }
    let arm = policies(admin).await;
    assert_eq!((arm["policy"].as_str(), arm["state"].as_str(), arm["swaps"].as_u64()), (Some("edf"), Some("primary"), Some(0)));
    assert!(infer(server.address(), 3).await.iter().all(|s| *s == StatusCode::OK));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_without_the_right_token_get_401_and_no_token_means_no_admin_api() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    for (token, method, path) in [
        (None, Method::GET, "/admin/policies"),
        (Some("wrong-token"), Method::GET, "/admin/policies"),
        (Some(""), Method::POST, "/admin/swap"),
        (None, Method::POST, "/admin/swap"),
        (Some("test-admin-toke"), Method::GET, "/admin/nothing"),
    ] {
        let reply = admin_call(admin, token, method.clone(), path, Bytes::from_static(br#"{"shipped":"fifo"}"#)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path} with {token:?}");
    }
    let mut headers = HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Basic {TOKEN}")).unwrap());
    let mut client = Http1Client::connect(admin).await.unwrap();
    let reply = client.request(Method::GET, "/admin/policies", &headers, Bytes::new()).await.unwrap();
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "only a bearer token counts");
    assert_eq!(policies(admin).await["swaps"], 0, "nothing was swapped");
    server.stop().await;

    let mut quiet = config("edf", &[]);
    quiet.admin.token = None;
    if std::env::var_os(yardmaster::serve::config::ADMIN_TOKEN_ENV).is_none() {
        let server = Server::start(&quiet, Vec::new()).await.unwrap();
        assert_eq!(server.admin_address(), None, "no token, no admin API");
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_is_fed_the_live_events_and_its_actions_are_counted_not_executed() {
    // `mode` is read by the hostile fixture only: it traps on its first call.
    let server = Server::start(&config("edf", &[("mode", "trap")]), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());
    let reply = admin_call(admin, Some(TOKEN), Method::GET, "/admin/shadow", Bytes::new()).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "no shadow yet");

    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/shadow", Bytes::from_static(br#"{"shipped":"fifo"}"#)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(json(&reply)["shadow"]["policy"], "fifo");
    assert!(infer(address, 30).await.iter().all(|s| *s == StatusCode::OK));
    let reply = admin_call(admin, Some(TOKEN), Method::GET, "/admin/shadow", Bytes::new()).await;
    let report = json(&reply)["shadow"].clone();
    assert_eq!(report["state"], "running", "{report}");
    assert!(report["events"].as_u64().unwrap() >= 30, "the shadow saw the arrivals: {report}");
    assert!(report["accepted"]["dispatch"].as_u64().unwrap() > 0, "{report}");
    // Only the live policy's dispatches ran.
    let live = metric(address, "yardmaster_policy_actions_accepted_total{arm=\"primary\",kind=\"dispatch\"}").await;
    assert_eq!(metric(address, "yardmaster_batches_total").await, live);

    // A shadow that traps is stopped and reported; serving goes on.
    let hostile = Bytes::from(std::fs::read(fixtures::HOSTILE).unwrap());
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/shadow?name=hostile", hostile).await;
    let report = json(&reply)["shadow"].clone();
    assert_eq!((report["policy"].as_str(), report["state"].as_str()), (Some("hostile"), Some("faulted")), "{report}");
    assert_eq!(report["faults"]["trap"], 1, "{report}");
    assert!(infer(address, 5).await.iter().all(|s| *s == StatusCode::OK));
    let arm = policies(admin).await;
    assert_eq!((arm["policy"].as_str(), arm["state"].as_str(), arm["fallbacks"].as_u64()), (Some("edf"), Some("primary"), Some(0)));

    let reply = admin_call(admin, Some(TOKEN), Method::DELETE, "/admin/shadow", Bytes::new()).await;
    assert_eq!((reply.status, json(&reply)["shadow"]["policy"].as_str()), (StatusCode::OK, Some("hostile")));
    let reply = admin_call(admin, Some(TOKEN), Method::GET, "/admin/shadow", Bytes::new()).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "stopped");
    server.stop().await;
}

/// Run `yardmaster admin ARGS` against `admin`: exit success, stdout, stderr.
async fn admin_cli(admin: SocketAddr, token: &str, args: &[&str]) -> (bool, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_yardmaster"));
    command.arg("admin").args(args).args(["--address", &admin.to_string(), "--token", token]);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_lists_and_swaps() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    let (ok, out, err) = admin_cli(admin, TOKEN, &["swap", "fifo"]).await;
    assert!(ok && out.starts_with("swapped in fifo (sha256 ") && out.contains("the engine paused"), "{out}{err}");
    let settings = ["--param", "mode=hold", "--param", "note=a b&c", "--deadline-ms", "9", "--memory-mib", "48", "--failure", "reload"];
    let (ok, out, err) = admin_cli(admin, TOKEN, &[&["swap", fixtures::HOSTILE][..], &settings].concat()).await;
    assert!(ok && out.contains("swapped in hostile"), "a file is sent and named after its stem: {out}{err}");
    let (ok, out, err) = admin_cli(admin, TOKEN, &["list"]).await;
    assert!(ok && out.contains("policy hostile (sha256 ") && out.contains(", primary,") && out.contains("2 swaps"), "{out}{err}");
    assert!(out.contains("deadline 9 ms, memory 48 MiB, reload") && out.contains("note=a b&c"), "its own settings: {out}");
    let (ok, _, err) = admin_cli(admin, TOKEN, &["swap", "fifo", "--param", "novalue"]).await;
    assert!(!ok && err.contains("KEY=VALUE"), "{err}");
    let (ok, _, err) = admin_cli(admin, TOKEN, &["swap", "no-such-policy"]).await;
    assert!(!ok && err.contains("400") && err.contains("no shipped policy named"), "{err}");
    let (ok, out, err) = admin_cli(admin, TOKEN, &["shadow", "start", "fifo"]).await;
    assert!(ok && out.starts_with("shadow fifo (sha256 ") && out.contains(", running:"), "{out}{err}");
    let (ok, out, err) = admin_cli(admin, TOKEN, &["shadow", "stop"]).await;
    assert!(ok && out.contains("accepted:") && out.contains("rejected:"), "{out}{err}");
    let (ok, _, err) = admin_cli(admin, TOKEN, &["shadow", "report"]).await;
    assert!(!ok && err.contains("404") && err.contains("no shadow policy is running"), "{err}");
    let (ok, _, err) = admin_cli(admin, "wrong", &["list"]).await;
    assert!(!ok && err.contains("401"), "{err}");
    server.stop().await;
}

/// The operation at `poll` once it is over (done or failed).
async fn finished_operation(admin: SocketAddr, poll: &str) -> Value {
    let started = Instant::now();
    loop {
        let operation = json(&admin_call(admin, Some(TOKEN), Method::GET, poll, Bytes::new()).await);
        if matches!(operation["state"].as_str(), Some("done" | "failed")) {
            return operation;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the operation never finished: {operation}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An admin call that must answer within 5 s (it must not wait for a compile).
async fn answers_at_once(admin: SocketAddr, method: Method, path: &str) -> Reply {
    tokio::time::timeout(Duration::from_secs(5), admin_call(admin, Some(TOKEN), method, path, Bytes::new()))
        .await
        .unwrap_or_else(|_| panic!("{path} waited for the compile"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_admin_calls_answer_while_a_component_compiles_and_the_swap_is_polled_to_its_end() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    let fifo = Bytes::from_static(yardmaster_policy_artifacts::shipped("fifo").unwrap().bytes);
    // Every compile of "held-compile" waits, in its compiling phase, until the hold goes.
    let hold = yardmaster::serve::swap::hold_compiles("held-compile");
    let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=held-compile&async=1", fifo.clone()).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&reply.body));
    let operation = json(&reply);
    assert_eq!((operation["kind"].as_str(), operation["state"].as_str()), (Some("swap"), Some("compiling")), "{operation}");
    assert_eq!(operation["size_bytes"].as_u64(), Some(fifo.len() as u64));
    let poll = operation["poll"].as_str().unwrap().to_string();
    // A synchronous swap of another policy, started meanwhile, waits for nothing either.
    let other = tokio::spawn(async move { swap_shipped(admin, "fifo").await });
    // Meanwhile every other call answers: the list, the A/B status, a roll-back (409:
    // no run), the operations, and the held swap says it is compiling.
    for _ in 0..3 {
        let listed = answers_at_once(admin, Method::GET, "/admin/policies").await;
        assert_eq!(listed.status, StatusCode::OK);
        assert_eq!(answers_at_once(admin, Method::GET, "/admin/ab").await.status, StatusCode::OK);
        assert_eq!(answers_at_once(admin, Method::POST, "/admin/ab/rollback").await.status, StatusCode::CONFLICT);
        let now = json(&answers_at_once(admin, Method::GET, &poll).await);
        assert_eq!(now["state"], "compiling", "held: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other =
        tokio::time::timeout(Duration::from_secs(20), other).await.expect("a swap of a cached policy waits for no compile").unwrap();
    assert_eq!(other["policy"], "fifo");
    assert_eq!(policies(admin).await["policy"], "fifo", "the other swap went in while the held one compiled");
    let listed = json(&answers_at_once(admin, Method::GET, "/admin/operations").await);
    assert!(listed["operations"].as_array().unwrap().iter().any(|o| o["poll"] == poll.as_str()), "{listed}");
    drop(hold);
    let done = finished_operation(admin, &poll).await;
    assert_eq!((done["state"].as_str(), done["status"].as_u64()), (Some("done"), Some(200)), "{done}");
    assert_eq!(done["result"]["policy"], "held-compile", "the answer a direct call gives: {done}");
    let phases: Vec<&str> = done["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["compiling", "preparing", "done"]);
    assert_eq!(policies(admin).await["policy"], "held-compile");
    // A refused policy fails its operation with the reason and the status a direct call gets.
    let reply =
        admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=broken&async=1", Bytes::from_static(b"\0asm\x0d\0\x01\0junk")).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    let failed = finished_operation(admin, json(&reply)["poll"].as_str().unwrap()).await;
    assert_eq!((failed["state"].as_str(), failed["status"].as_u64()), (Some("failed"), Some(400)), "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("broken"), "{failed}");
    let missing = admin_call(admin, Some(TOKEN), Method::GET, "/admin/operations/999999", Bytes::new()).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_prints_progress_while_the_server_compiles() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    let dir = scratch_dir("progress");
    let file = dir.join("cli-held.wasm");
    std::fs::write(&file, yardmaster_policy_artifacts::shipped("fifo").unwrap().bytes).unwrap();
    let hold = yardmaster::serve::swap::hold_compiles("cli-held");
    let path = file.to_string_lossy().into_owned();
    let cli = tokio::spawn(async move { admin_cli(admin, TOKEN, &["swap", &path]).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!cli.is_finished(), "the command waits for the swap");
    drop(hold);
    let (ok, out, err) = cli.await.unwrap();
    assert!(ok && out.starts_with("swapped in cli-held (sha256 "), "{out}{err}");
    assert!(err.lines().any(|l| l.starts_with("compiling cli-held (") && l.ends_with(" s")), "progress on stderr: {err}");
    let _ = std::fs::remove_dir_all(dir);
    server.stop().await;
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yardmaster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn wait_for_swaps(admin: SocketAddr, swaps: u64, within: Duration) -> Value {
    let started = Instant::now();
    loop {
        let arm = policies(admin).await;
        if arm["swaps"].as_u64() == Some(swaps) || started.elapsed() > within {
            return arm;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_off_policy_dropped_in_the_watched_directory_is_swapped_in() {
    let dir = scratch_dir("watch");
    let fifo = yardmaster_policy_artifacts::shipped("fifo").unwrap().bytes;
    let edf = yardmaster_policy_artifacts::shipped("edf").unwrap().bytes;
    let fifo_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(fifo))
    };
    std::fs::write(dir.join("already-here.wasm"), fifo).unwrap();
    let mut config = config("edf", &[]);
    config.admin.watch_dir = Some(dir.clone());
    config.admin.watch_sha256 = vec![fifo_sha.clone()];
    let server = Server::start(&config, Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();

    // Not on the allow-list: not swapped in.
    std::fs::write(dir.join("unsigned.wasm"), edf).unwrap();
    let arm = wait_for_swaps(admin, 1, Duration::from_secs(4)).await;
    assert_eq!((arm["swaps"].as_u64(), arm["policy"].as_str()), (Some(0), Some("edf")), "{arm}");

    // Written elsewhere and renamed in, as the docs advise.
    std::fs::write(dir.join(".incoming"), fifo).unwrap();
    std::fs::rename(dir.join(".incoming"), dir.join("signed.wasm")).unwrap();
    let arm = wait_for_swaps(admin, 1, Duration::from_secs(10)).await;
    assert_eq!((arm["swaps"].as_u64(), arm["policy"].as_str()), (Some(1), Some("signed")), "{arm}");
    assert_eq!(arm["sha256"].as_str(), Some(fifo_sha.as_str()));
    assert!(infer(server.address(), 3).await.iter().all(|s| *s == StatusCode::OK));
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Submit `count` requests straight to the engine, with deadlines an hour away.
fn hold_requests(server: &Server, count: usize) -> mpsc::Receiver<()> {
    let (done, ended) = mpsc::channel();
    for _ in 0..count {
        let done = done.clone();
        let submission = Submission { deadline: 3_600_000_000_000 * 1000, ..Submission::default() };
        server
            .handle
            .submit(
                submission,
                Box::new(|_| {}),
                Box::new(move |_| {
                    let _ = done.send(());
                }),
            )
            .unwrap();
    }
    ended
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand in a release build"]
async fn bench_swap_pause_with_10000_held_requests() {
    // The hostile fixture in its default mode holds every request and dispatches none.
    let server = Server::start(&config(fixtures::HOSTILE, &[("mode", "hold")]), Vec::new()).await.unwrap();
    let admin = server.admin_address().unwrap();
    let _ended = hold_requests(&server, 10_000);
    let started = Instant::now();
    while policies(admin).await["held"].as_u64() != Some(10_000) {
        assert!(started.elapsed() < Duration::from_secs(30), "the holder never held all 10,000");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let body = Bytes::from(std::fs::read(fixtures::HOSTILE).unwrap());
    let swaps = 200;
    let (mut pauses, mut prepares, mut snapshots, mut replays) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..swaps {
        let reply = admin_call(admin, Some(TOKEN), Method::POST, "/admin/swap?name=hostile", body.clone()).await;
        let summary = json(&reply);
        assert_eq!((summary["state"].as_str(), summary["replayed"].as_u64()), (Some("primary"), Some(10_000)), "{summary}");
        assert_eq!(summary["handover"], "delta", "{summary}");
        pauses.push(summary["pause_us"].as_f64().unwrap());
        prepares.push(summary["prepare_us"].as_f64().unwrap());
        snapshots.push(summary["snapshot_us"].as_f64().unwrap());
        replays.push(summary["pre_replay_us"].as_f64().unwrap());
    }
    let line = |name: &str, values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        format!(
            "{name}: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            percentile(values, 0.5),
            percentile(values, 0.99),
            values[values.len() - 1]
        )
    };
    eprintln!("with 10,000 held requests, over {swaps} swaps:");
    eprintln!("  {}", line("swap pause (engine held at the quiet point)", &mut pauses));
    eprintln!("  {}", line("snapshot (engine held to copy the ledger)", &mut snapshots));
    eprintln!("  {}", line("pre-replay (init + 10,000 arrivals, off the engine)", &mut replays));
    eprintln!("  {}", line("whole preparation (off the engine)", &mut prepares));
    server.stop().await;
}

fn proc_status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// VmRSS (kB), threads and open file descriptors, once the server has closed the
/// connections of the calls just made.
async fn settled_counts() -> (u64, u64, usize) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    (proc_status("VmRSS:"), proc_status("Threads:"), open_fds())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand in a release build"]
async fn bench_1000_swap_cycles_keep_memory_threads_and_fds_bounded() {
    let server = Server::start(&config("edf", &[]), Vec::new()).await.unwrap();
    let (address, admin) = (server.address(), server.admin_address().unwrap());
    let mut at_100 = (0, 0, 0);
    let mut pauses = Vec::new();
    let started = Instant::now();
    for cycle in 1..=1000 {
        // A cycle: fifo in, a request through it, edf back in.
        pauses.push(swap_shipped(admin, "fifo").await["pause_us"].as_f64().unwrap());
        assert_eq!(infer(address, 1).await, [StatusCode::OK]);
        pauses.push(swap_shipped(admin, "edf").await["pause_us"].as_f64().unwrap());
        if cycle == 100 {
            at_100 = settled_counts().await;
        }
    }
    let at_1000 = settled_counts().await;
    let growth = (at_1000.0 as f64 - at_100.0 as f64) / at_100.0 as f64 * 100.0;
    pauses.sort_by(f64::total_cmp);
    eprintln!(
        "swap pause with nothing held over 2,000 swaps: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        percentile(&pauses, 0.5),
        percentile(&pauses, 0.99),
        pauses[pauses.len() - 1]
    );
    eprintln!(
        "1,000 swap cycles (2,000 swaps) in {:.1} s: VmRSS {} kB at cycle 100, {} kB at cycle 1,000 ({growth:+.2}%); threads {} -> {}; fds {} -> {}",
        started.elapsed().as_secs_f64(),
        at_100.0,
        at_1000.0,
        at_100.1,
        at_1000.1,
        at_100.2,
        at_1000.2
    );
    server.stop().await;
    assert!(growth < 5.0, "RSS grew {growth:.2}% between cycle 100 and 1,000");
    assert!(at_1000.1 <= at_100.1 && at_1000.2 <= at_100.2, "threads or fds grew: {at_100:?} -> {at_1000:?}");
}
