//! QUART's placement on a live cluster: three `yardmaster node` processes
//! (127.0.0.2–4, two slots each, a static list trusted by a cluster CA) serve one
//! model of a Triton repository; the first replica on each node loads it from disk
//! (cold) and leaves it in that node's model cache. Under a burst QUART scales the
//! model up and names the node of every new replica; the test checks that the engine
//! accepted those placements, that each new worker ran on the node it was seated on,
//! and that every start was warm or cold exactly as the engine's model of the nodes'
//! caches predicted — with the warm ones really coming from the node's cache (the
//! node's own `Ready` says so).
//!
//! Needs the magika model the set-up script downloads (`scripts/setup.sh --deps`).

use std::process::Command;

use super::cluster_dns::{free_tcp_port, free_udp_port, metric, request, scratch, start_controller, start_node_with_slots, Process};

/// The model's profile: about 8 ms an item on one core (what `yardmaster profile`
/// measures for it on this machine), beside its configuration so the test does not
/// profile.
const PROFILE: &str = r#"name = "magika"
slo_ms = 100

[[stage]]
name = "magika"
max_batch = 4
replicas = 1
device = "cpu"
threads = 1

[[stage.variant]]
name = "default"
profile_ms = [[1, 8.0, 9.0], [2, 16.0, 18.0], [4, 32.0, 36.0]]
memory_mib = 4
cold_start_ms = 11.0
warm_start_ms = 5.0
"#;

#[test]
fn quart_places_new_replicas_live_and_they_start_warm_where_the_node_caches_the_model() {
    let model = yardmaster::dataplane::assets::assets_dir().join("magika-1.0.3/model.onnx");
    assert!(model.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", model.display());
    let dir = scratch("cluster-quart");
    let repository = dir.join("models");
    std::fs::create_dir_all(repository.join("magika/1")).unwrap();
    std::fs::copy(&model, repository.join("magika/1/model.onnx")).unwrap();
    std::fs::write(
        repository.join("magika/config.pbtxt"),
        "name: \"magika\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n\
         parameters { key: \"yardmaster.slo_ms\" value: { string_value: \"100\" } }\n\
         parameters { key: \"yardmaster.max_replicas\" value: { string_value: \"6\" } }\n",
    )
    .unwrap();
    std::fs::write(repository.join("magika/profile.toml"), PROFILE).unwrap();

    let name = "nodes.quart-test";
    let certs = dir.join("tls");
    yardmaster::cluster::tls::issue_cluster_certificates(&certs, name).unwrap();
    let port = free_udp_port("127.0.0.2");
    let _nodes: Vec<Process> =
        (2..=4).map(|i| start_node_with_slots(&format!("127.0.0.{i}"), port, &format!("node-{i}"), &certs, 2)).collect();
    let http = format!("127.0.0.1:{}", free_tcp_port());
    // A generous decision deadline: on a loaded two-core test machine a wall-clock
    // timeout would put QUART's fallback in charge, which does not scale.
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "model_repository = [\"{}\"]\nlisten = \"{http}\"\ngrpc = false\nhttp3 = false\n\n[policy]\nname = \"quart\"\ndeadline_ms = 1000\n\n[cluster]\n\
             nodes = \"static:127.0.0.2:{port},127.0.0.3:{port},127.0.0.4:{port}\"\nca = \"{}\"\nnode_name = \"{name}\"\nstartup_wait_secs = 30\n",
            repository.display(),
            certs.join("ca.pem").display()
        ),
    )
    .unwrap();
    let log = dir.join("controller.log");
    let _controller = start_controller(Command::new(env!("CARGO_BIN_EXE_yardmaster")), &config, &log, &http);

    // A burst past what three replicas serve: QUART scales the model up.
    let mut scaled = false;
    for round in 0..4 {
        let load = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["load", "--address", &http, "--model", "magika", "--transport", "h1", "--connections", "256"])
            .args(["--workload", "poisson", "--rate", "600", "--duration", "4", "--slo-ms", "100", "--seed", &(round + 1).to_string()])
            .output()
            .unwrap();
        assert!(load.status.success(), "{}", String::from_utf8_lossy(&load.stderr));
        let (_, metrics) = request(&http, "GET", "/metrics", "").unwrap();
        if metrics.lines().any(|l| l.starts_with("yardmaster_worker_starts_total{") && l.contains("kind=\"warm\"")) {
            scaled = true;
            break;
        }
    }
    let (_, metrics) = request(&http, "GET", "/metrics", "").unwrap();
    let series = |prefix: &str| -> Vec<String> { metrics.lines().filter(|l| l.starts_with(prefix)).map(String::from).collect() };
    assert!(scaled, "QUART started no replica warm under four bursts:\n{}", series("yardmaster_").join("\n"));
    assert!(metric(&metrics, "yardmaster_policy_actions_accepted_total{arm=\"primary\",kind=\"scale\"}").unwrap_or(0.0) >= 1.0);
    assert_eq!(
        metric(&metrics, "yardmaster_policy_actions_rejected_total{arm=\"primary\",reason=\"bad-placement\"}"),
        Some(0.0),
        "QUART's placements are accepted:\n{}",
        series("yardmaster_policy_actions_rejected_total").join("\n")
    );
    assert_eq!(metric(&metrics, "yardmaster_worker_starts_misplaced_total"), Some(0.0), "every worker ran where it was seated");
    let starts = series("yardmaster_worker_starts_total{");
    for line in &starts {
        let agrees = line.contains("kind=\"warm\",predicted=\"warm\"") || line.contains("kind=\"cold\",predicted=\"cold\"");
        assert!(agrees, "a start the engine predicted otherwise: {line}\n{}", starts.join("\n"));
    }
    // The first replica on each node was cold (the model was on disk only there).
    for node in ["node-2", "node-3", "node-4"] {
        let cold = format!("yardmaster_worker_starts_total{{host=\"{node}\",kind=\"cold\",predicted=\"cold\"}}");
        assert!(metric(&metrics, &cold).unwrap_or(0.0) >= 1.0, "{node}'s first start was cold: {starts:?}");
    }
    // The cluster view agrees: more workers than the three initial replicas, spread over the nodes.
    let (_, view) = request(&http, "GET", "/v2/cluster", "").unwrap();
    let view: serde_json::Value = serde_json::from_str(&view).unwrap();
    let workers: u64 = view["hosts"].as_array().unwrap().iter().map(|h| h["workers"].as_u64().unwrap_or(0)).sum();
    eprintln!("starts: {starts:?}\ncluster: {view}");
    assert!(workers >= 3, "{view}");
}
