//! Real ONNX models from a PyPI wheel, served from a Triton model repository laid out as
//! Triton's documentation shows (`<model>/config.pbtxt`, `<model>/1/model.onnx`): two of
//! the backend node-test models the `onnx` wheel ships (scripts/setup.sh extracts them
//! into the assets folder). `test_max_int64` takes two INT64 [3] inputs, fed pairs beyond
//! 2^24 and 2^53 that differ only in their last bit (the same number as a float or a
//! double); `test_split_equal_parts_2d` answers two
//! FP32 [2, 3] outputs from one FP32 [2, 6] input, fed signed zeros, a subnormal,
//! infinities and a NaN; `test_mod_mixed_sign_int64` takes the modulo of two INT64 [6]
//! inputs (an integer divisor: the server's profiling run measures it on ones, as it
//! cannot run on zeros). tritonclient sends them over HTTP (binary data, and JSON for the
//! integers) and gRPC; every output equals a plain ONNX Runtime run of the same inputs,
//! byte for byte, at the shape the configuration declares.

use std::path::PathBuf;

use yardmaster::dataplane::{ElementType, ModelKey, ModelSession, ModelSpec, Runtime, Tensor, TensorData};

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::serve_repository_with;

/// The `onnx` wheel scripts/setup.sh takes the models from.
const ONNX_VERSION: &str = "1.19.1";

const MAX_CONFIG: &str = r#"name: "max_int64"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "data_0"
    data_type: TYPE_INT64
    dims: [ 3 ]
  },
  {
    name: "data_1"
    data_type: TYPE_INT64
    dims: [ 3 ]
  }
]
output [
  {
    name: "result"
    data_type: TYPE_INT64
    dims: [ 3 ]
  }
]
"#;

const SPLIT_CONFIG: &str = r#"name: "split_equal_parts_2d"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "input"
    data_type: TYPE_FP32
    dims: [ 2, 6 ]
  }
]
output [
  {
    name: "output_1"
    data_type: TYPE_FP32
    dims: [ 2, 3 ]
  },
  {
    name: "output_2"
    data_type: TYPE_FP32
    dims: [ 2, 3 ]
  }
]
"#;

const MOD_CONFIG: &str = r#"name: "mod_int64"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "x"
    data_type: TYPE_INT64
    dims: [ 6 ]
  },
  {
    name: "y"
    data_type: TYPE_INT64
    dims: [ 6 ]
  }
]
output [
  {
    name: "z"
    data_type: TYPE_INT64
    dims: [ 6 ]
  }
]
"#;

/// A node-test model from the wheel, in the assets folder.
fn wheel_model(test: &str) -> PathBuf {
    yardmaster::dataplane::assets::assets_dir().join(format!("onnx-node-{ONNX_VERSION}/{test}/model.onnx"))
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn shape_of(described: &serde_json::Value) -> Vec<usize> {
    described["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

/// A tensor from the client's description of what it sent.
fn sent(described: &serde_json::Value, element: ElementType) -> Tensor {
    let shape = shape_of(described);
    let count = shape.iter().product();
    Tensor::new(shape, TensorData::from_bytes(element, &unhex(described["hex"].as_str().unwrap()), count).unwrap()).unwrap()
}

/// One model's check: the client's key for it, its name, its inputs' element types,
/// its outputs' configured shapes, and the transports the client used.
struct Case {
    key: &'static str,
    name: &'static str,
    inputs: &'static [(&'static str, ElementType)],
    outputs: &'static [(&'static str, &'static [usize])],
    transports: &'static [&'static str],
}

#[test]
fn wheel_node_test_models_answer_exactly_over_http_and_grpc() {
    let tests = [
        ("max_int64", "test_max_int64", MAX_CONFIG),
        ("split_equal_parts_2d", "test_split_equal_parts_2d", SPLIT_CONFIG),
        ("mod_int64", "test_mod_mixed_sign_int64", MOD_CONFIG),
    ];
    for (_, test, _) in tests {
        let file = wheel_model(test);
        assert!(file.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", file.display());
    }
    let dir = scratch("wheel-models");
    let models = dir.join("models");
    for (name, test, config) in tests {
        std::fs::create_dir_all(models.join(name).join("1")).unwrap();
        std::fs::copy(wheel_model(test), models.join(name).join("1/model.onnx")).unwrap();
        std::fs::write(models.join(name).join("config.pbtxt"), config).unwrap();
    }
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    let seen = run_client("triton_wheel_models.py", &[&server.address, &grpc, tests[0].0, tests[1].0, tests[2].0]);

    // The reference: a plain ONNX Runtime run of the same inputs.
    let runtime = Runtime::global().unwrap();
    let cases = [
        Case {
            key: "max",
            name: tests[0].0,
            inputs: &[("data_0", ElementType::I64), ("data_1", ElementType::I64)],
            outputs: &[("result", &[3])],
            transports: &["http_binary", "http_json", "grpc"],
        },
        Case {
            key: "split",
            name: tests[1].0,
            inputs: &[("input", ElementType::F32)],
            outputs: &[("output_1", &[2, 3]), ("output_2", &[2, 3])],
            transports: &["http_binary", "grpc"],
        },
        Case {
            key: "mod",
            name: tests[2].0,
            inputs: &[("x", ElementType::I64), ("y", ElementType::I64)],
            outputs: &[("z", &[6])],
            transports: &["http_binary", "http_json", "grpc"],
        },
    ];
    for Case { key, name, inputs, outputs, transports } in cases {
        let given = &seen[key]["inputs"];
        let tensors: Vec<Tensor> = inputs.iter().map(|(input, element)| sent(&given[*input], *element)).collect();
        let spec = ModelSpec::new(ModelKey::new(name, "1"), models.join(name).join("1/model.onnx"));
        let mut session = ModelSession::from_file(&runtime, &spec, 1).unwrap();
        let expected = session.run(&tensors, None).unwrap();
        assert_eq!(expected.len(), outputs.len(), "{name}: one tensor per output");
        for transport in transports {
            for ((output, dims), want) in outputs.iter().zip(&expected) {
                let got = &seen[key][*transport][*output];
                assert!(got.is_object(), "{name} over {transport}: no {output} in {seen}\n{}", log());
                assert_eq!(shape_of(got), *dims, "{name} over {transport}, {output}: the configured shape\n{}", log());
                assert_eq!(want.shape, *dims, "{name}, {output}: ONNX Runtime's own shape");
                assert_eq!(
                    unhex(got["hex"].as_str().unwrap()),
                    want.data.bytes(),
                    "{name} over {transport}, {output}: byte for byte\n{}",
                    log()
                );
            }
        }
    }
    // The integers came back as themselves, not through a float or a double.
    let ints = |hex: &serde_json::Value| -> Vec<i64> {
        unhex(hex.as_str().unwrap()).chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let given = &seen["max"]["inputs"];
    let want: Vec<i64> = ints(&given["data_0"]["hex"]).iter().zip(ints(&given["data_1"]["hex"])).map(|(a, b)| (*a).max(b)).collect();
    assert_eq!(want, [(1 << 53) + 1, -(1 << 62), (1 << 24) + 1]);
    for transport in ["http_binary", "http_json", "grpc"] {
        assert_eq!(ints(&seen["max"][transport]["result"]["hex"]), want, "{transport}");
    }
}
