//! Client batches with Triton's own clients: a request carries N ≤ max_batch_size items
//! (its leading dimension), the policy counts them, and the answer carries the N rows.
//! tritonclient over HTTP and gRPC sends batches of 1, 3 and max_batch_size of INT64
//! values beyond 2^53, FP32 and BYTES that are not UTF-8; every output equals a plain
//! ONNX Runtime run of the same inputs byte for byte. perf_analyzer drives the model
//! with `-b 4` and `-b max_batch_size` at concurrency 1 to 4 with its default random
//! data, over both protocols, without an error; a batch over max_batch_size, inputs
//! whose batches disagree, or a string with a NUL byte get a 400 naming the model and
//! the input.

use std::process::Command;

use yardmaster::dataplane::proto::Message;
use yardmaster::dataplane::{ElementType, ModelKey, ModelSession, ModelSpec, Runtime, Tensor, TensorData};

use super::onnx_graph::{model, node, value_info};
use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{perf_analyzer, serve_repository_with};

/// The model's max_batch_size.
const MAX_BATCH: usize = 8;

/// `OUT_INT64 = IN_INT64 + IN_INT64`, `OUT_FP32 = IN_FP32 · IN_FP32`,
/// `OUT_BYTES = IN_BYTES`, every dimension symbolic.
fn rows_model() -> Vec<u8> {
    let graph = Message::default()
        .message(1, &node("Add", &["IN_INT64", "IN_INT64"], "OUT_INT64"))
        .message(1, &node("Mul", &["IN_FP32", "IN_FP32"], "OUT_FP32"))
        .message(1, &node("Identity", &["IN_BYTES"], "OUT_BYTES"))
        .string(2, "rows")
        .message(11, &value_info("IN_INT64", 7, &["batch", "a"]))
        .message(11, &value_info("IN_FP32", 1, &["batch", "b"]))
        .message(11, &value_info("IN_BYTES", 8, &["batch", "c"]))
        .message(12, &value_info("OUT_INT64", 7, &["batch", "a"]))
        .message(12, &value_info("OUT_FP32", 1, &["batch", "b"]))
        .message(12, &value_info("OUT_BYTES", 8, &["batch", "c"]));
    model(&graph, 14)
}

const CONFIG: &str = r#"name: "rows"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "IN_INT64" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "IN_FP32" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "IN_BYTES" data_type: TYPE_STRING dims: [ 2 ] }
]
output [
  { name: "OUT_INT64" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "OUT_FP32" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUT_BYTES" data_type: TYPE_STRING dims: [ 2 ] }
]
dynamic_batching { }
"#;

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// A tensor from the client's description of what it sent.
fn sent(described: &serde_json::Value, element: ElementType) -> Tensor {
    let shape: Vec<usize> = described["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    let count = shape.iter().product();
    Tensor::new(shape, TensorData::from_bytes(element, &unhex(described["hex"].as_str().unwrap()), count).unwrap()).unwrap()
}

#[test]
fn client_batches_answer_their_rows_exactly_and_perf_analyzer_sends_them() {
    let dir = scratch("batches");
    let models = dir.join("models");
    std::fs::create_dir_all(models.join("rows/1")).unwrap();
    std::fs::write(models.join("rows/1/model.onnx"), rows_model()).unwrap();
    std::fs::write(models.join("rows/config.pbtxt"), CONFIG).unwrap();
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();

    let sizes = ["1", "3", &MAX_BATCH.to_string()];
    let seen = run_client("triton_batches.py", &[&server.address, &grpc, "rows", sizes[0], sizes[1], sizes[2]]);

    // The reference: a plain ONNX Runtime run of the same inputs, batch and all.
    let runtime = Runtime::global().unwrap();
    let spec = ModelSpec::new(ModelKey::new("rows", "1"), models.join("rows/1/model.onnx"));
    let mut session = ModelSession::from_file(&runtime, &spec, 1).unwrap();
    for n in sizes {
        let given = &seen["inputs"][n];
        let inputs = [
            sent(&given["IN_INT64"], ElementType::I64),
            sent(&given["IN_FP32"], ElementType::F32),
            sent(&given["IN_BYTES"], ElementType::Bytes),
        ];
        let expected = session.run(&inputs, None).unwrap();
        for transport in ["http", "grpc"] {
            for (name, want) in ["OUT_INT64", "OUT_FP32", "OUT_BYTES"].iter().zip(&expected) {
                let got = &seen[transport][n][name];
                let shape: Vec<usize> = got["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                assert_eq!(shape, want.shape, "{transport} batch of {n}, {name}: the request's rows come back\n{}", log());
                assert_eq!(unhex(got["hex"].as_str().unwrap()), want.data.bytes(), "{transport} batch of {n}, {name}: byte for byte");
            }
        }
    }

    // A batch over max_batch_size, or inputs whose batches disagree: a 400 naming the
    // model and the input.
    let body = |ints: usize, floats: usize| {
        let int_data = vec!["1"; 3 * ints].join(",");
        let float_data = vec!["0.5"; 4 * floats].join(",");
        let strings = vec![r#""s""#; 2 * ints].join(",");
        format!(
            r#"{{"inputs":[{{"name":"IN_INT64","shape":[{ints},3],"datatype":"INT64","data":[{int_data}]}},{{"name":"IN_FP32","shape":[{floats},4],"datatype":"FP32","data":[{float_data}]}},{{"name":"IN_BYTES","shape":[{ints},2],"datatype":"BYTES","data":[{strings}]}}]}}"#
        )
    };
    let post = |body: &str| {
        let (status, answer) = super::serve_model_control::http_post(&server.address, "/v2/models/rows/infer", body);
        let error = serde_json::from_str::<serde_json::Value>(&answer).map(|a| a["error"].as_str().unwrap_or_default().to_string());
        (status, error.unwrap_or(answer))
    };
    let (status, answer) = post(&body(2, 2));
    assert_eq!(status, 200, "a good batch of two over JSON: {answer}");
    let (status, error) = post(&body(MAX_BATCH + 1, MAX_BATCH + 1));
    assert_eq!(status, 400, "{error}");
    assert_eq!(error, "model \"rows\": input \"IN_INT64\" carries a batch of 9, over max_batch_size 8");
    let (status, error) = post(&body(2, 3));
    assert!(status == 400 && error.starts_with("model \"rows\": input \"IN_FP32\" carries a batch of 3"), "{status} {error}");
    // A string ONNX Runtime cannot hold is the client's error too, not the worker's.
    let (status, error) = post(&body(1, 1).replace(r#""s","s""#, r#""s","a\u0000b""#));
    assert_eq!(
        (status, error.as_str()),
        (400, "model \"rows\": input \"IN_BYTES\": string 1 holds a NUL byte, which ONNX Runtime's strings cannot")
    );

    // perf_analyzer: batches of 4 and of max_batch_size, concurrency 1 to 4, its own
    // random data, over both protocols.
    for protocol in ["http", "grpc"] {
        let url = if protocol == "http" { server.address.clone() } else { grpc.clone() };
        for batch in ["4", &MAX_BATCH.to_string()] {
            let output = Command::new(perf_analyzer())
                .args(["-m", "rows", "-i", protocol, "-u", &url, "-b", batch, "--concurrency-range", "1:4"])
                .args(["--measurement-interval", "800", "--stability-percentage", "80", "--max-trials", "10"])
                .output()
                .unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            assert!(output.status.success(), "perf_analyzer -b {batch} over {protocol} failed:\n{text}\n{}", log());
            assert_eq!(text.matches("Throughput:").count(), 4, "one measurement per concurrency: {text}");
            assert!(text.contains(&format!("Batch size: {batch}")), "{text}");
        }
    }
}
