//! Triton's trace extension with Triton's own clients: tracing turned on over HTTP,
//! requests over HTTP and gRPC traced into the server's trace file in Triton's format
//! (a JSON array: each traced request named, then its timestamps in order), the count
//! honoured, a model's own settings over gRPC, and settings the server cannot honour
//! refused.

use super::serve_end_to_end::{http_get, run_client, scratch};
use super::serve_repository::{repository, serve_repository_with};

#[test]
fn tritonclient_turns_tracing_on_and_the_trace_file_has_each_requests_timestamps() {
    let dir = scratch("trace");
    let models = repository(&dir);
    let trace = dir.join("trace.json");
    let (server, _stderr) = serve_repository_with(&dir, &models, &["--trace-file", trace.to_str().unwrap()]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let seen = run_client("triton_trace.py", &[&server.address, &grpc, "add"]);
    assert_eq!(seen["initial"]["trace_level"], serde_json::json!(["OFF"]), "{seen}");
    assert_eq!(seen["initial"]["trace_file"], trace.to_str().unwrap(), "{seen}");
    assert_eq!(seen["on"]["trace_level"], serde_json::json!(["TIMESTAMPS"]), "{seen}");
    assert_eq!(seen["after"]["settings"]["trace_count"]["value"], serde_json::json!(["0"]), "three of five traced: {seen}");
    assert_eq!(seen["model_set"]["settings"]["trace_rate"]["value"], serde_json::json!(["7"]), "{seen}");
    assert_eq!(seen["model_read"]["trace_rate"], "7", "{seen}");
    assert_eq!(seen["server_read"]["trace_rate"], "1", "the model's rate is its own: {seen}");
    assert!(seen["refused_file"].as_str().unwrap().contains("set when the server starts"), "{seen}");
    assert!(seen["refused_tensors"].as_str().unwrap().contains("TENSORS"), "{seen}");

    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let entries = written.as_array().unwrap();
    assert_eq!(entries.len(), 6, "three traces, two entries each: {written}");
    for pair in entries.chunks(2) {
        assert_eq!(pair[0]["model_name"], "add", "{written}");
        assert_eq!(pair[0]["id"], pair[1]["id"], "{written}");
        let stamps = pair[1]["timestamps"].as_array().unwrap();
        let names: Vec<&str> = stamps.iter().map(|s| s["name"].as_str().unwrap()).collect();
        // The worker's own measures split the compute span: the hand-over and the
        // stacking, the run, the split and the report back.
        let expected =
            ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"];
        assert_eq!(names, expected, "{written}");
        let times: Vec<u64> = stamps.iter().map(|s| s["ns"].as_u64().unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order: {times:?}");
        assert!(times[6] > times[0], "the request took time: {times:?}");
        assert!(times[4] > times[3], "the run took time: {times:?}");
    }

    // The statistics extension splits compute time the same way, so perf_analyzer's
    // server-side section shows each part.
    let (status, body) = http_get(&server.address, "/v2/models/add/stats");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let inference = &stats["model_stats"][0]["inference_stats"];
    for part in ["compute_input", "compute_infer", "compute_output"] {
        assert!(inference[part]["count"].as_u64().unwrap() > 0, "{part}: {stats}");
        assert!(inference[part]["ns"].as_u64().unwrap() > 0, "{part} is measured: {stats}");
    }
}
