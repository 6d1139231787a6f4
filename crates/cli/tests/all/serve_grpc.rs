//! `yardmaster serve` over KServe v2 gRPC, driven by clients no one here wrote:
//! Triton's Python gRPC client (health, metadata, configuration, inference, a
//! bidirectional stream, statistics, the repository index, unload and load with a
//! changed configuration, refusals with their gRPC codes) and `perf_analyzer -i grpc`
//! (random inputs from the metadata alone, an ensemble's composing models read from
//! their configurations, the server-side statistics), on the Triton repository of
//! `serve_repository` served with explicit model control.

use std::process::Command;

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{perf_analyzer, repository, serve_repository_with};

#[test]
fn tritonclient_grpc_and_perf_analyzer_grpc_drive_a_repository() {
    let dir = scratch("grpc");
    let models = repository(&dir);
    let (server, _stderr) = serve_repository_with(&dir, &models, &["--model-control-mode", "explicit"]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    assert_ne!(grpc, server.address, "gRPC has a port of its own");

    let seen = run_client("triton_grpc.py", &[&grpc, "add_half", "add", "magika", "add_half", "add_twice", "add_cfg"]);
    assert_eq!(seen["server"]["name"], "yardmaster", "{seen}");
    let add = &seen["models"]["add"];
    assert_eq!(add["metadata"]["platform"], "onnxruntime_onnx", "{seen}");
    assert_eq!(add["outputs"]["y"]["data"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "y = x + 1 over gRPC: {seen}");
    assert_eq!(add["id"], "r-add", "the request id comes back: {seen}");
    let half = &seen["models"]["add_half"];
    assert_eq!(half["outputs"]["y"]["data"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "FP16 as raw contents: {seen}");
    let magika = &seen["models"]["magika"];
    assert_eq!(magika["metadata"]["inputs"][0]["datatype"], "INT32", "{seen}");
    assert_eq!(magika["outputs"]["target_label"]["shape"], serde_json::json!([1, 214]), "{seen}");
    let twice = &seen["models"]["add_twice"];
    assert_eq!(twice["config"]["platform"], "ensemble", "{seen}");
    assert_eq!(twice["config"]["ensemble_scheduling"]["step"].as_array().map(Vec::len), Some(2), "the steps: {seen}");
    assert_eq!(twice["outputs"]["y"]["data"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "{seen}");
    let documented = &seen["models"]["add_cfg"];
    assert_eq!(documented["metadata"]["versions"], serde_json::json!(["1", "2"]), "{seen}");
    assert_eq!(documented["config"]["max_batch_size"], 8, "{seen}");
    assert_eq!(documented["config"]["dynamic_batching"]["preferred_batch_size"], serde_json::json!([4, 8]), "{seen}");
    assert_eq!(documented["config"]["input"][0]["data_type"], "TYPE_FP32", "{seen}");
    let stats = documented["stats"]["model_stats"].as_array().unwrap();
    let latest = stats.iter().find(|s| s["version"] == "2").unwrap_or_else(|| panic!("version 2's statistics: {seen}"));
    let successes: u64 = latest["inference_stats"]["success"]["count"].as_str().unwrap_or("0").parse().unwrap();
    assert!(successes >= 1, "the inference counts (64-bit numbers are strings in protobuf's JSON): {latest}");

    assert_eq!(seen["wrong_shape"]["status"], "StatusCode.INVALID_ARGUMENT", "{seen}");
    assert!(seen["wrong_shape"]["message"].as_str().unwrap().contains("shape"), "{seen}");
    assert_eq!(seen["unknown_model"]["status"], "StatusCode.NOT_FOUND", "{seen}");
    let message = seen["unknown_model"]["message"].as_str().unwrap();
    assert!(message.starts_with("Request for unknown model: 'no_such_model' is not found"), "Triton's wording first: {seen}");
    let streamed = seen["streamed"].as_object().unwrap();
    assert_eq!(streamed.keys().cloned().collect::<Vec<_>>(), ["s0", "s1", "s2"], "one answer per streamed request: {seen}");
    let index = seen["index"].as_array().unwrap();
    let state = |name: &str| index.iter().find(|m| m["name"] == name).map(|m| m["state"].clone());
    assert_eq!(state("add"), Some(serde_json::json!("READY")), "{seen}");
    assert_eq!(state("garbage"), Some(serde_json::json!("UNAVAILABLE")), "{seen}");
    assert!(seen["unloaded_infer"]["status"].as_str().unwrap() != "StatusCode.OK", "{seen}");
    assert_eq!(seen["reloaded_config"]["max_batch_size"], 2, "the load's configuration holds: {seen}");
    assert_eq!(seen["bad_load"]["status"], "StatusCode.INVALID_ARGUMENT", "{seen}");
    assert!(seen["bad_load"]["message"].as_str().unwrap().contains("max_batch_size"), "{seen}");

    // perf_analyzer over gRPC: a plain model at two concurrencies, and the ensemble
    // (whose composing models it reads through ModelConfig) on a stream.
    for args in [&["-m", "add", "--concurrency-range", "1:2"][..], &["-m", "add_twice", "--streaming"][..]] {
        let perf = Command::new(perf_analyzer())
            .args(args)
            .args(["-u", &grpc, "-i", "grpc", "--measurement-interval", "1000", "--stability-percentage", "60", "--max-trials", "20"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&perf.stdout).into_owned() + &String::from_utf8_lossy(&perf.stderr);
        assert!(perf.status.success(), "perf_analyzer {args:?} failed:\n{text}");
        assert!(text.contains("Server:") && text.contains("Successful request count"), "the server-side section: {text}");
        assert!(!text.to_lowercase().contains("error"), "{text}");
        if args.contains(&"add_twice") {
            assert!(text.contains("Composing models:"), "the ensemble's steps are read: {text}");
        }
    }
    drop(server);
}
