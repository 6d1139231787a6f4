//! Triton's classification extension with Triton's own clients, on a real classifier no
//! one here trained: Google's Magika file-type model (from its PyPI wheel), served from
//! a repository whose configuration names a labels file written from the wheel's own
//! label list. tritonclient asks for the top three classes over HTTP (JSON and binary)
//! and gRPC; each answer must be the top three of a plain ONNX Runtime run of the same
//! input (indices and labels exactly, scores to six decimals within a rounding step).

use yardmaster::dataplane::{ModelKey, ModelSession, ModelSpec, Runtime, Tensor};

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::serve_repository_with;

/// Magika's input for `content`: its first and last 1,024 bytes, padded with 256.
fn magika_input(content: &[u8]) -> Vec<i32> {
    const SIDE: usize = 1024;
    const PADDING: i32 = 256;
    let begin: Vec<i32> = content.iter().take(SIDE).map(|&b| b as i32).chain(std::iter::repeat(PADDING)).take(SIDE).collect();
    let tail = &content[content.len().saturating_sub(SIDE)..];
    let end: Vec<i32> = std::iter::repeat_n(PADDING, SIDE - tail.len()).chain(tail.iter().map(|&b| b as i32)).collect();
    [begin, end].concat()
}

#[test]
fn tritonclient_gets_the_top_classes_of_a_real_classifier_with_labels() {
    let dir = scratch("classification");
    let assets = yardmaster::dataplane::assets::assets_dir().join("magika-1.0.3");
    let labels: Vec<String> = {
        let config: serde_json::Value = serde_json::from_slice(&std::fs::read(assets.join("config.min.json")).unwrap()).unwrap();
        config["target_labels_space"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect()
    };
    let models = dir.join("models");
    std::fs::create_dir_all(models.join("magika/1")).unwrap();
    std::fs::copy(assets.join("model.onnx"), models.join("magika/1/model.onnx")).unwrap();
    std::fs::write(models.join("magika/labels.txt"), labels.join("\n") + "\n").unwrap();
    std::fs::write(
        models.join("magika/config.pbtxt"),
        r#"name: "magika"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "bytes" data_type: TYPE_INT32 dims: [ 2048 ] } ]
output [ { name: "target_label" data_type: TYPE_FP32 dims: [ 214 ] label_filename: "labels.txt" } ]
"#,
    )
    .unwrap();

    // A real file: the client script (Python).
    let inputs = [magika_input(include_str!("../../../../tests/clients/triton_classification.py").as_bytes())];

    // The reference: a plain ONNX Runtime run of the same batch, top three by score.
    let runtime = Runtime::global().unwrap();
    let spec = ModelSpec::new(ModelKey::new("magika", "1"), models.join("magika/1/model.onnx"));
    let mut session = ModelSession::from_file(&runtime, &spec, 1).unwrap();
    let batch = Tensor::new(vec![1, 2048], inputs.concat().iter().map(|&v| v as f32).collect::<Vec<f32>>()).unwrap();
    let scores = session.run(&[batch], None).unwrap().remove(0);
    let expected: Vec<Vec<(usize, f32)>> = scores
        .data
        .floats()
        .chunks(labels.len())
        .map(|row| {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
            order[..3].iter().map(|&i| (i, row[i])).collect()
        })
        .collect();

    let (server, _stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let request = serde_json::json!({
        "input": "bytes", "datatype": "INT32", "shape": [1, 2048], "data": inputs.concat(),
        "output": "target_label", "class_count": 3,
    });
    let request_file = dir.join("request.json");
    std::fs::write(&request_file, request.to_string()).unwrap();
    let seen = run_client("triton_classification.py", &[&server.address, &grpc, "magika", request_file.to_str().unwrap()]);

    for answer in ["http_json", "http_binary", "grpc"] {
        let rows = seen[answer].as_array().unwrap_or_else(|| panic!("{answer}: {seen}"));
        assert_eq!(rows.len(), 1, "{answer}: one row per item: {seen}");
        for (row, want) in rows.iter().zip(&expected) {
            let classes: Vec<&str> = row.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            assert_eq!(classes.len(), 3, "{answer}: {seen}");
            for (class, (index, score)) in classes.iter().zip(want) {
                let parts: Vec<&str> = class.split(':').collect();
                assert_eq!(parts.len(), 3, "score:index:label: {class}");
                assert_eq!((parts[1].parse::<usize>().unwrap(), parts[2]), (*index, labels[*index].as_str()), "{answer}: {seen}");
                let served: f32 = parts[0].parse().unwrap();
                assert!((served - score).abs() < 2e-6, "{answer}: {class} against {score}");
            }
            assert_eq!(classes[0].split(':').nth(2), Some("python"), "Magika knows the script for Python: {seen}");
        }
    }
    assert_eq!(seen["bad"]["status"], 400, "{seen}");
    assert!(seen["bad"]["body"].as_str().unwrap().contains("classification"), "{seen}");
}
