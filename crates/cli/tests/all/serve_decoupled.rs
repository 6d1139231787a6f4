//! Decoupled models with Triton's own clients: a model written the way Triton's
//! documentation describes its repeat example (an INT32 input of n values answered by n
//! responses, in ONNX plus a configuration with `model_transaction_policy { decoupled:
//! true }`), streamed over gRPC by tritonclient (exactly n responses and then the final
//! flag; the empty final response on request; an error on the stream for a bad
//! request), refused by unary calls as Triton refuses them, driven by `perf_analyzer
//! --streaming`, and a stream closed mid-answer with its request cancelled, which
//! ends exactly once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use yardmaster::dataplane::proto::Message;

use super::onnx_graph::{model, node, value_info};
use super::serve_end_to_end::{http_get, run_client, scratch};
use super::serve_repository::{perf_analyzer, serve_repository_with};

/// ONNX `TensorProto.DataType` values used here.
const INT32: i64 = 6;
const INT64: i64 = 7;
const UINT32: i64 = 12;

/// The repeat model: `OUT = IN` and `IDX = 0..n` (UINT32), both `[n]`.
fn repeat_model() -> Vec<u8> {
    let one = Message::default().int(2, INT32).bytes(9, &1i32.to_le_bytes()).string(8, "one");
    let axis = Message::default().int(2, INT64).bytes(9, &0i64.to_le_bytes()).string(8, "axis");
    // Cast's `to` attribute: AttributeProto { name = 1, i = 3, type = 20 (INT = 2) }.
    let to = Message::default().string(1, "to").int(3, UINT32).int(20, 2);
    let graph = Message::default()
        .message(1, &node("Identity", &["IN"], "OUT"))
        .message(1, &node("Sub", &["IN", "IN"], "zeros"))
        .message(1, &node("Add", &["zeros", "one"], "ones"))
        .message(1, &node("CumSum", &["ones", "axis"], "counts"))
        .message(1, &node("Sub", &["counts", "one"], "index"))
        .message(1, &node("Cast", &["index"], "IDX").message(5, &to))
        .string(2, "repeat")
        .message(5, &one)
        .message(5, &axis)
        .message(11, &value_info("IN", INT32, &["n"]))
        .message(12, &value_info("OUT", INT32, &["n"]))
        .message(12, &value_info("IDX", UINT32, &["n"]));
    model(&graph, 14)
}

const CONFIG: &str = r#"
name: "repeat_int32"
backend: "onnxruntime"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"#;

fn repository(dir: &Path) -> PathBuf {
    let models = dir.join("models");
    let folder = models.join("repeat_int32/1");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("model.onnx"), repeat_model()).unwrap();
    std::fs::write(models.join("repeat_int32/config.pbtxt"), CONFIG).unwrap();
    models
}

/// Every `name{…}` sample whose labels contain `label`, summed.
fn sum_of(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_decoupled_model_streams_one_response_per_row_then_the_final_flag() {
    let dir = scratch("decoupled");
    let models = repository(&dir);
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let (status, config) = http_get(&server.address, "/v2/models/repeat_int32/config");
    assert_eq!(status, 200, "{config}\n{}", std::fs::read_to_string(&stderr).unwrap_or_default());
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["model_transaction_policy"]["decoupled"], true, "{config}");

    let seen = run_client("triton_decoupled.py", &[&server.address, &grpc, "repeat_int32"]);
    let three = seen["three"].as_array().unwrap();
    assert_eq!(three.len(), 4, "three rows, then the empty final response: {seen}");
    for (i, row) in three[..3].iter().enumerate() {
        assert_eq!(row["final"], false, "{seen}");
        assert_eq!(row["OUT"], serde_json::json!([7 + i]), "{seen}");
        assert_eq!(row["IDX"], serde_json::json!([i]), "{seen}");
        assert_eq!(row["id"], "r3", "{seen}");
    }
    assert_eq!(three[3]["final"], true, "{seen}");
    assert_eq!(three[3]["outputs"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["one"].as_array().unwrap().len(), 2, "{seen}");
    assert_eq!(seen["zero"], serde_json::json!([{ "id": "r0", "final": true, "outputs": [] }]), "no rows: only the final flag: {seen}");
    let plain = seen["three_plain"].as_array().unwrap();
    assert_eq!(plain.iter().map(|r| r["final"].as_bool().unwrap()).collect::<Vec<_>>(), [false, false, true], "{seen}");
    assert!(seen["wrong_input"][0]["error"].as_str().unwrap().contains("NOT_AN_INPUT"), "{seen}");
    assert!(seen["unary"].as_str().unwrap().contains("doesn't support models with decoupled transaction policy"), "{seen}");
    assert_eq!(seen["http"]["status"], 400, "{seen}");
    assert!(seen["http"]["body"].as_str().unwrap().contains("decoupled transaction policy"), "{seen}");

    // The stream closed mid-answer: the client saw only part of the 20,000 rows, and
    // every request that reached the engine ended there exactly once (the wrong input
    // was refused before it): 3, 1, 0 and 3 rows, and the long one.
    assert_eq!(seen["cancelled"]["errors"], serde_json::json!([]), "{seen}");
    assert!(seen["cancelled"]["received_before_close"].as_u64().unwrap() < 20_001, "{seen}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = http_get(&server.address, "/metrics");
        let arrived = sum_of(&metrics, "yardmaster_requests_arrived_total", "repeat_int32");
        let ended = sum_of(&metrics, "yardmaster_requests_ended_total", "repeat_int32");
        if arrived == 5.0 && ended == arrived {
            break;
        }
        assert!(Instant::now() < deadline, "arrived {arrived}, ended {ended}:\n{metrics}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, _) = http_get(&server.address, "/v2/health/ready");
    assert_eq!(status, 200, "the server serves on after the closed stream");

    // perf_analyzer streams to the decoupled model and never stops with an error.
    let output = Command::new(perf_analyzer())
        .args(["-m", "repeat_int32", "-i", "grpc", "--streaming", "-u", &grpc, "--shape", "IN:4"])
        .args(["--measurement-interval", "1000", "--concurrency-range", "1:2", "--stability-percentage", "60", "--max-trials", "20"])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "perf_analyzer failed:\n{text}");
    assert!(text.contains("Concurrency: 2, throughput:"), "{text}");
}
