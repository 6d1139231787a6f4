//! Models loaded and unloaded while serving (`--model-control-mode explicit`), as
//! Triton's repository extension does it: Triton's own Python client loads, unloads
//! (with and without its dependents) and reads the index; then one model is unloaded
//! and loaded again 100 times while another serves under load and clients keep asking
//! for the one that comes and goes — every request is answered exactly once, the
//! steady model never fails, and the server's memory stays flat.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::serve_repository_with;

/// `add` and `keep` (both y = x + 1, no configuration) and the ensemble `twice`
/// (`add`, then `keep`).
fn repository(dir: &Path) -> PathBuf {
    let tiny = yardmaster::serve::tiny_model::ensure(dir).expect("the tiny model is written");
    let models = dir.join("models");
    for name in ["add", "keep"] {
        std::fs::create_dir_all(models.join(name).join("1")).unwrap();
        std::fs::copy(&tiny, models.join(name).join("1/model.onnx")).unwrap();
    }
    std::fs::create_dir_all(models.join("twice/1")).unwrap();
    let ensemble = r#"name: "twice"
platform: "ensemble"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add" model_version: -1 input_map { key: "x" value: "x" } output_map { key: "y" value: "mid" } },
    { model_name: "keep" model_version: -1 input_map { key: "x" value: "mid" } output_map { key: "y" value: "y" } }
  ]
}
"#;
    std::fs::write(models.join("twice/config.pbtxt"), ensemble).unwrap();
    models
}

/// One HTTP/1.1 POST; the status and body.
pub(crate) fn http_post(address: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

const INFER: &str = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,1,2,3]}]}"#;

/// The server process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn tritonclient_loads_and_unloads_and_a_hundred_cycles_lose_nothing() {
    let dir = scratch("model-control");
    let models = repository(&dir);
    let (server, stderr) = serve_repository_with(&dir, &models, &["--model-control-mode", "explicit"]);

    let seen = run_client("triton_model_control.py", &[&server.address]);
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    assert_eq!(seen["before"], serde_json::json!({"add": "READY", "keep": "READY", "twice": "READY"}), "{seen}");
    assert_eq!(seen["twice"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "{seen}");
    assert_eq!(seen["unload_alone"]["status"], "409", "a step of a loaded ensemble: {seen}");
    assert!(seen["unload_alone"]["message"].as_str().unwrap().contains("twice"), "{seen}");
    assert_eq!(seen["unloaded"], serde_json::json!({"add": "UNAVAILABLE", "keep": "READY", "twice": "UNAVAILABLE"}), "{seen}");
    assert_eq!(seen["add_ready"], false);
    assert!(seen["infer_unloaded"]["message"].as_str().unwrap().contains("add"), "{seen}");
    assert_eq!(seen["keep_meanwhile"], serde_json::json!([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(seen["reloaded"], seen["before"], "{seen}\n{}", log());
    assert_eq!(seen["add_again"], serde_json::json!([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(seen["twice_again"], serde_json::json!([2.0, 3.0, 4.0, 5.0]));
    assert_eq!(seen["load_missing"]["status"], "400", "{seen}");
    let before = seen["keep_batch_before"].as_u64().unwrap();
    assert_ne!(before, 2, "{seen}");
    assert_eq!(seen["keep_configured"]["max_batch_size"], 2, "the request's configuration serves: {seen}");
    assert_eq!(seen["keep_configured"]["parameters"]["yardmaster.slo_ms"]["string_value"], "321", "{seen}");
    assert_eq!(seen["keep_configured_infer"], serde_json::json!([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(seen["twice_after_config"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "the ensemble follows its step: {seen}");
    assert_eq!(seen["bad_config"]["status"], "400", "{seen}");
    assert!(seen["bad_config"]["message"].as_str().unwrap().contains("max_batch_size: expected an integer"), "{seen}");
    assert_eq!(seen["keep_after_bad_config"], 2, "a refused configuration changes nothing: {seen}");
    assert_eq!(seen["keep_batch_reloaded"].as_u64(), Some(before), "a plain load reads config.pbtxt again: {seen}");

    // 100 cycles of `add` while `keep` serves under load and clients keep asking
    // for `add` too.
    let (status, body) = http_post(&server.address, "/v2/repository/models/twice/unload", "");
    assert_eq!(status, 200, "{body}");
    let stop = Arc::new(AtomicBool::new(false));
    let load = |model: &'static str| {
        let (address, stop) = (server.address.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut statuses: Vec<u16> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let (status, body) = http_post(&address, &format!("/v2/models/{model}/infer"), INFER);
                if status == 200 {
                    assert!(body.contains("[1.0,2.0,3.0,4.0]"), "{model}: {body}");
                }
                statuses.push(status);
            }
            statuses
        })
    };
    let steady = load("keep");
    let coming_and_going = load("add");
    let pid = server.child.id();
    let mut early = 0;
    for cycle in 1..=100 {
        let (status, body) = http_post(&server.address, "/v2/repository/models/add/unload", "");
        assert_eq!(status, 200, "cycle {cycle}: unload: {body}\n{}", log());
        let (status, body) = http_post(&server.address, "/v2/repository/models/add/load", "");
        assert_eq!(status, 200, "cycle {cycle}: load: {body}\n{}", log());
        if cycle == 20 {
            early = rss_kib(pid);
        }
    }
    let late = rss_kib(pid);
    // A model unloaded is unknown; loaded again, it is ready once its worker is.
    let ready = || super::serve_end_to_end::http_get(&server.address, "/v2/models/add/ready").0;
    assert_eq!(http_post(&server.address, "/v2/repository/models/add/unload", "").0, 200);
    assert_eq!(ready(), 404);
    assert_eq!(http_post(&server.address, "/v2/repository/models/add/load", "").0, 200);
    let mut waited = 0;
    while ready() != 200 {
        assert!(waited < 200, "add never became ready after its load");
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    stop.store(true, Ordering::Release);
    let steady = steady.join().expect("the steady client saw only right answers");
    let moving = coming_and_going.join().expect("the other client saw only right answers");
    assert!(steady.len() > 100 && steady.iter().all(|&s| s == 200), "keep never fails: {:?}", steady.iter().filter(|&&s| s != 200).count());
    // `add` answers, or says it is being unloaded or was dropped as it went (503), or
    // that it is not served (404): every request got exactly one answer (a lost one
    // would hang the client).
    assert!(moving.iter().all(|s| [200, 404, 503].contains(s)), "{moving:?}");
    assert!(moving.iter().filter(|&&s| s == 200).count() > 10, "{moving:?}");
    let growth = late as f64 / early as f64;
    eprintln!(
        "RSS after 20 cycles {early} KiB, after 100 {late} KiB ({growth:.3}×); keep: {} requests; add: {}",
        steady.len(),
        moving.len()
    );
    assert!(growth < 1.10, "memory grows with load/unload cycles: {early} KiB → {late} KiB");
    let (status, body) = super::serve_end_to_end::http_get(&server.address, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("keep"), "{body}");
    drop(server);
}

#[test]
fn in_poll_mode_a_model_added_to_the_repository_loads_and_a_removed_one_unloads() {
    let dir = scratch("model-control-poll");
    let models = repository(&dir);
    std::fs::remove_dir_all(models.join("twice")).unwrap();
    let (server, stderr) =
        serve_repository_with(&dir, &models, &["--model-control-mode", "poll", "--repository-poll-secs", "0.2", "--load-model", "keep"]);
    let state = |model: &str| -> Option<String> {
        let (status, body) = http_post(&server.address, "/v2/repository/index", "");
        assert_eq!(status, 200, "{body}");
        let index: serde_json::Value = serde_json::from_str(&body).unwrap();
        index.as_array().unwrap().iter().find(|m| m["name"] == model).map(|m| m["state"].as_str().unwrap().to_string())
    };
    let wait_for = |model: &str, wanted: &str| {
        for _ in 0..200 {
            if state(model).as_deref() == Some(wanted) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{model} never became {wanted}:\n{}", std::fs::read_to_string(&stderr).unwrap_or_default());
    };
    // `add` was not named at start, so the first poll finds it and loads it.
    wait_for("add", "READY");
    let tiny = models.join("keep/1/model.onnx");
    std::fs::create_dir_all(models.join("later/1")).unwrap();
    std::fs::copy(&tiny, models.join("later/1/model.onnx")).unwrap();
    wait_for("later", "READY");
    let (status, body) = http_post(&server.address, "/v2/models/later/infer", INFER);
    assert_eq!((status, body.contains("[1.0,2.0,3.0,4.0]")), (200, true), "{body}");
    std::fs::remove_dir_all(models.join("add")).unwrap();
    wait_for("add", "UNAVAILABLE");
    let (status, _) = http_post(&server.address, "/v2/models/keep/infer", INFER);
    assert_eq!(status, 200);
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("repository poll: model later: loaded"), "{log}");
    drop(server);
}
