//! Typed tensors end to end, with Triton's own clients: a model that echoes one input of
//! each element type (the integers of every width, FP64, BOOL and BYTES) answers every
//! value exactly — integers beyond 2^24 and 2^53, doubles beyond float range, byte
//! strings that are not UTF-8 — over HTTP with binary data, over HTTP as JSON, and over
//! gRPC; and perf_analyzer's default random data drives it without an error.

use std::process::Command;

use yardmaster::dataplane::proto::Message;

use super::onnx_graph::{model, node, value_info};
use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{perf_analyzer, serve_repository_with};

/// Each type's name on the wire and its ONNX `TensorProto.DataType`.
const TYPES: [(&str, i64); 9] =
    [("INT64", 7), ("UINT64", 13), ("INT32", 6), ("UINT32", 12), ("FP64", 11), ("BOOL", 9), ("INT8", 3), ("UINT16", 4), ("BYTES", 8)];

/// `OUT_T = Identity(IN_T)` for every type.
fn echo_model() -> Vec<u8> {
    let mut graph = Message::default();
    for (name, _) in TYPES {
        graph = graph.message(1, &node("Identity", &[&format!("IN_{name}")], &format!("OUT_{name}")));
    }
    graph = graph.string(2, "echo");
    for (name, elem_type) in TYPES {
        graph = graph.message(11, &value_info(&format!("IN_{name}"), elem_type, &["batch", "n"]));
    }
    for (name, elem_type) in TYPES {
        graph = graph.message(12, &value_info(&format!("OUT_{name}"), elem_type, &["batch", "n"]));
    }
    model(&graph, 14)
}

#[test]
fn every_element_type_travels_exactly_over_http_and_grpc() {
    let dir = scratch("typed");
    let models = dir.join("models");
    std::fs::create_dir_all(models.join("echo/1")).unwrap();
    std::fs::write(models.join("echo/1/model.onnx"), echo_model()).unwrap();
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let seen = run_client("triton_typed.py", &[&server.address, &grpc, "echo"]);
    for transport in ["http_binary", "http_json", "grpc"] {
        let results = seen[transport].as_object().unwrap_or_else(|| panic!("{transport}: {seen}"));
        assert!(!results.is_empty());
        for (name, exact) in results {
            assert_eq!(exact, true, "{transport} {name}: {seen}\n{}", std::fs::read_to_string(&stderr).unwrap_or_default());
        }
    }
    assert_eq!(seen["grpc"].as_object().unwrap().len(), TYPES.len());

    // Bad input gets a 400 naming the model and the input: strings that do not match
    // their shape, and a batch over max_batch_size (4, completed from the graph).
    let inputs = |bytes_shape: &str, batch: usize| {
        let mut tensors: Vec<String> = TYPES
            .iter()
            .filter(|(name, _)| *name != "BYTES")
            .map(|(name, _)| {
                let value = if *name == "BOOL" { "true" } else { "1" };
                let data = vec![value; 3 * batch].join(",");
                format!(r#"{{"name":"IN_{name}","shape":[{batch},3],"datatype":"{name}","data":[{data}]}}"#)
            })
            .collect();
        let strings = vec![r#""a""#; 3 * batch].join(",");
        tensors.push(format!(r#"{{"name":"IN_BYTES","shape":{bytes_shape},"datatype":"BYTES","data":[{strings}]}}"#));
        format!(r#"{{"inputs":[{}]}}"#, tensors.join(","))
    };
    let post = |body: &str| super::serve_model_control::http_post(&server.address, "/v2/models/echo/infer", body);
    let (status, answer) = post(&inputs("[1,3]", 1));
    assert_eq!(status, 200, "a good request first: {answer}");
    let refusal = |body: &str| {
        let (status, answer) = post(body);
        let error = serde_json::from_str::<serde_json::Value>(&answer).map(|a| a["error"].as_str().unwrap_or_default().to_string());
        (status, error.unwrap_or(answer))
    };
    let (status, error) = refusal(&inputs("[1,4]", 1));
    assert!(status == 400 && error.starts_with("model \"echo\": input \"IN_BYTES\""), "{status} {error}");
    let (status, error) = refusal(&inputs("[5,3]", 5));
    assert!(status == 400 && error.starts_with("model \"echo\"") && error.contains("a batch of 5"), "{status} {error}");

    // perf_analyzer's default random data, every type, over both protocols.
    for protocol in ["http", "grpc"] {
        let url = if protocol == "http" { server.address.clone() } else { grpc.clone() };
        let mut shapes = Vec::new();
        for (name, _) in TYPES {
            shapes.extend(["--shape".to_string(), format!("IN_{name}:3")]);
        }
        let output = Command::new(perf_analyzer())
            .args(["-m", "echo", "-i", protocol, "-u", &url])
            .args(&shapes)
            .args(["--measurement-interval", "1000", "--stability-percentage", "60", "--max-trials", "20"])
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "perf_analyzer over {protocol} failed:\n{text}");
        assert!(text.contains("Throughput:"), "{text}");
    }
}
