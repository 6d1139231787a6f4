//! Stateful sequences (Triton's sequence batcher) with Triton's own clients.
//!
//! Two stateful models, each served from a repository written as Triton's
//! documentation shows:
//! - `vad`: Silero's voice-activity detector from the `silero-vad` wheel on PyPI (no one
//!   here trained it), whose recurrent state is an input (`state`) and an output
//!   (`stateN`): an implicit state the server carries from one request of a sequence to
//!   the next. It has no batch dimension (its state's batch axis is not the first).
//! - `acc`: an accumulator written here (`OUT = INPUT + STATE_IN`, the next state `OUT`),
//!   which batches and takes every control input — START as INT32, END as BOOL, READY
//!   as FP32, CORRID as UINT64 — and echoes them, with an initial state from a file.
//!
//! tritonclient sends sequences over HTTP and gRPC: a sequence interleaved with a
//! second one answers exactly what it answers alone, and what a plain ONNX Runtime run
//! carrying the state by hand gives. Bad requests — no correlation id, a START for a
//! running sequence, a request for a sequence that is not running, a state input sent by
//! the client, BYTES where the configuration says FP32, a batch of two in a sequence —
//! each get a 400 naming the model and the field, and every request that reached the
//! engine ended exactly once. A sequence idle past `max_sequence_idle_microseconds`
//! has ended: its next request is refused, and a new START begins from the initial
//! state. perf_analyzer drives both with `--sequence-length 8` over
//! both protocols without an error.

use std::process::Command;

use serde_json::{json, Value};
use yardmaster::dataplane::proto::Message;
use yardmaster::dataplane::{ModelKey, ModelSession, ModelSpec, Runtime, Tensor, TensorData};

use super::onnx_graph::{model, node, value_info};
use super::serve_end_to_end::{http_get, run_client, scratch};
use super::serve_repository::{perf_analyzer, serve_repository_with};

/// The accumulator with every control echoed.
fn accumulator() -> Vec<u8> {
    let graph = Message::default()
        .message(1, &node("Add", &["INPUT", "STATE_IN"], "OUT"))
        .message(1, &node("Identity", &["OUT"], "STATE_OUT"))
        .message(1, &node("Identity", &["START"], "START_OUT"))
        .message(1, &node("Identity", &["END"], "END_OUT"))
        .message(1, &node("Identity", &["READY"], "READY_OUT"))
        .message(1, &node("Identity", &["CORRID"], "CORR_OUT"))
        .string(2, "acc")
        .message(11, &value_info("INPUT", 1, &["batch", "one"]))
        .message(11, &value_info("START", 6, &["batch", "one"]))
        .message(11, &value_info("END", 9, &["batch", "one"]))
        .message(11, &value_info("READY", 1, &["batch", "one"]))
        .message(11, &value_info("CORRID", 13, &["batch", "one"]))
        .message(11, &value_info("STATE_IN", 1, &["batch", "one"]))
        .message(12, &value_info("OUT", 1, &["batch", "one"]))
        .message(12, &value_info("STATE_OUT", 1, &["batch", "one"]))
        .message(12, &value_info("START_OUT", 6, &["batch", "one"]))
        .message(12, &value_info("END_OUT", 9, &["batch", "one"]))
        .message(12, &value_info("READY_OUT", 1, &["batch", "one"]))
        .message(12, &value_info("CORR_OUT", 13, &["batch", "one"]));
    model(&graph, 14)
}

const ACC_CONFIG: &str = r#"name: "acc"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "END_OUT" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "READY_OUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORR_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 20000000
  oldest { max_candidate_sequences: 4 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ 1 ]
      initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "hundred" name: "start at 100" }
    }
  ]
}
"#;

/// Samples per chunk the 16 kHz detector takes.
const CHUNK: usize = 512;

const VAD_CONFIG: &str = r#"name: "vad"
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "input" data_type: TYPE_FP32 dims: [ 1, 512 ] },
  { name: "sr" data_type: TYPE_INT64 dims: [ 1 ] reshape { shape: [ ] } }
]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]
sequence_batching {
  direct { }
  state [
    {
      input_name: "state"
      output_name: "stateN"
      data_type: TYPE_FP32
      dims: [ 2, 1, 128 ]
      initial_state { data_type: TYPE_FP32 dims: [ 2, 1, 128 ] zero_data: true name: "silence" }
    }
  ]
}
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// A sound: a tone that comes and goes, chunk by chunk, different per `voice`.
fn chunk(voice: usize, k: usize) -> Vec<f32> {
    let loud = if (k + voice).is_multiple_of(3) { 0.0 } else { 0.6 };
    (0..CHUNK).map(|i| loud * ((i as f32) * (0.05 + 0.01 * voice as f32)).sin()).collect()
}

fn floats_hex(values: &[f32]) -> String {
    hex(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
}

/// One step of the client's plan.
fn step(transport: &str, model: &str, id: Value, start: bool, end: bool, inputs: Value, outputs: &[&str]) -> Value {
    json!({"transport": transport, "model": model, "sequence_id": id, "start": start, "end": end, "inputs": inputs, "outputs": outputs})
}

fn acc_input(value: f32) -> Value {
    json!({"INPUT": {"datatype": "FP32", "shape": [1, 1], "hex": floats_hex(&[value])}})
}

fn vad_input(voice: usize, k: usize) -> Value {
    json!({
        "input": {"datatype": "FP32", "shape": [1, CHUNK], "hex": floats_hex(&chunk(voice, k))},
        "sr": {"datatype": "INT64", "shape": [1], "hex": hex(&16000i64.to_le_bytes())},
    })
}

const ACC_OUTPUTS: [&str; 5] = ["OUT", "START_OUT", "END_OUT", "READY_OUT", "CORR_OUT"];

/// Sequence `id` of `values` on `acc`, every request over `transport`.
fn acc_sequence(transport: &str, id: Value, values: &[f32]) -> Vec<Value> {
    let last = values.len() - 1;
    values.iter().enumerate().map(|(k, &v)| step(transport, "acc", id.clone(), k == 0, k == last, acc_input(v), &ACC_OUTPUTS)).collect()
}

/// Sequence `id` of `chunks` chunks of `voice` on `vad`.
fn vad_sequence(transport: &str, id: Value, voice: usize, chunks: usize) -> Vec<Value> {
    (0..chunks).map(|k| step(transport, "vad", id.clone(), k == 0, k == chunks - 1, vad_input(voice, k), &["output"])).collect()
}

/// `a` and `b` taken in turns.
fn interleave(a: Vec<Value>, b: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    let (mut a, mut b) = (a.into_iter(), b.into_iter());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

/// The f32 values of an answered output.
fn f32s(answer: &Value, name: &str) -> Vec<f32> {
    let bytes = unhex(answer["outputs"][name]["hex"].as_str().unwrap_or_else(|| panic!("no {name} in {answer}")));
    bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn prometheus_value(metrics: &str, prefix: &str) -> f64 {
    metrics.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[test]
fn sequences_keep_their_state_over_http_and_grpc_and_perf_analyzer_drives_them() {
    let vad_file = yardmaster::dataplane::assets::assets_dir().join("silero-vad-6.2.3/silero_vad_16k_op15.onnx");
    assert!(vad_file.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", vad_file.display());
    let dir = scratch("sequences");
    let models = dir.join("models");
    std::fs::create_dir_all(models.join("acc/1")).unwrap();
    std::fs::create_dir_all(models.join("acc/initial_state")).unwrap();
    std::fs::write(models.join("acc/1/model.onnx"), accumulator()).unwrap();
    std::fs::write(models.join("acc/initial_state/hundred"), 100f32.to_le_bytes()).unwrap();
    std::fs::write(models.join("acc/config.pbtxt"), ACC_CONFIG).unwrap();
    // The accumulator again, its sequences ending after 300 ms without a request.
    std::fs::create_dir_all(models.join("acc_idle/1")).unwrap();
    std::fs::create_dir_all(models.join("acc_idle/initial_state")).unwrap();
    std::fs::write(models.join("acc_idle/1/model.onnx"), accumulator()).unwrap();
    std::fs::write(models.join("acc_idle/initial_state/hundred"), 100f32.to_le_bytes()).unwrap();
    let idle_config = ACC_CONFIG.replace("name: \"acc\"", "name: \"acc_idle\"").replace("20000000", "300000");
    std::fs::write(models.join("acc_idle/config.pbtxt"), idle_config).unwrap();
    std::fs::create_dir_all(models.join("vad/1")).unwrap();
    std::fs::copy(&vad_file, models.join("vad/1/model.onnx")).unwrap();
    std::fs::write(models.join("vad/config.pbtxt"), VAD_CONFIG).unwrap();
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    let run = |plan: Vec<Value>| -> Vec<Value> {
        let file = dir.join("plan.json");
        std::fs::write(&file, Value::Array(plan).to_string()).unwrap();
        let seen = run_client("triton_sequences.py", &[&server.address, &grpc, file.to_str().unwrap()]);
        seen.as_array().unwrap().clone()
    };

    // The accumulator: alone, then interleaved with another sequence, over each transport.
    let values = [1.0, 2.0, 3.0, 4.0, 5.0];
    for transport in ["http", "grpc"] {
        let alone = run(acc_sequence(transport, json!(11), &values));
        let sums: Vec<f32> = alone.iter().map(|a| f32s(a, "OUT")[0]).collect();
        assert_eq!(
            sums,
            [101.0, 103.0, 106.0, 110.0, 115.0],
            "{transport}: the state starts at the file's 100 and accumulates: {alone:?}\n{}",
            log()
        );
        let mixed =
            run(interleave(acc_sequence(transport, json!(21), &values), acc_sequence(transport, json!("user-7"), &[10.0, 20.0, 30.0])));
        let first: Vec<&Value> = mixed.iter().filter(|a| a["outputs"]["CORR_OUT"]["hex"] == json!(hex(&21u64.to_le_bytes()))).collect();
        assert_eq!(first.len(), values.len(), "{transport}: {mixed:?}");
        for (k, (answer, lone)) in first.iter().zip(&alone).enumerate() {
            assert_eq!(answer["outputs"]["OUT"], lone["outputs"]["OUT"], "{transport}: step {k} interleaved answers what it answers alone");
            let start = i32::from_le_bytes(unhex(answer["outputs"]["START_OUT"]["hex"].as_str().unwrap()).try_into().unwrap());
            let end = unhex(answer["outputs"]["END_OUT"]["hex"].as_str().unwrap())[0];
            assert_eq!((start, end), (i32::from(k == 0), u8::from(k == values.len() - 1)), "{transport}: START and END at step {k}");
            assert_eq!(f32s(answer, "READY_OUT"), [1.0], "{transport}: READY");
        }
        let other: Vec<f32> = mixed.iter().filter(|a| !first.contains(a)).map(|a| f32s(a, "OUT")[0]).collect();
        assert_eq!(other, [110.0, 130.0, 160.0], "{transport}: the string-named sequence keeps its own state");
    }

    // A sequence idle past max_sequence_idle_microseconds has ended: its next request
    // is refused, and a START begins it afresh from the initial state.
    let idle_step = |id: u64, start: bool, value: f32| step("http", "acc_idle", json!(id), start, false, acc_input(value), &["OUT"]);
    let begun = run(vec![idle_step(41, true, 1.0), idle_step(41, false, 2.0)]);
    assert_eq!((f32s(&begun[0], "OUT"), f32s(&begun[1], "OUT")), (vec![101.0], vec![103.0]), "{begun:?}");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let after = run(vec![idle_step(41, false, 3.0), idle_step(41, true, 5.0), idle_step(41, false, 1.0)]);
    let error = after[0]["error"].as_str().unwrap_or_else(|| panic!("the idle sequence still ran: {after:?}"));
    assert!(error.contains("model \"acc_idle\"") && error.contains("sequence 41 is not running"), "{error}");
    assert_eq!(f32s(&after[1], "OUT"), [105.0], "a new START begins from the initial state, not the old sum: {after:?}\n{}", log());
    assert_eq!(f32s(&after[2], "OUT"), [106.0], "{after:?}");

    // The detector: a sequence alone, interleaved, and a plain ONNX Runtime run that
    // carries the state by hand.
    let runtime = Runtime::global().unwrap();
    let spec = ModelSpec::new(ModelKey::new("vad", "1"), &vad_file);
    let mut session = ModelSession::from_file(&runtime, &spec, 1).unwrap();
    let chunks = 6;
    let mut state = Tensor::new(vec![2, 1, 128], vec![0.0f32; 256]).unwrap();
    let mut expected = Vec::new();
    for k in 0..chunks {
        let input = Tensor::new(vec![1, CHUNK], chunk(1, k)).unwrap();
        let sr = Tensor::new(vec![], TensorData::from_vec(vec![16000i64])).unwrap();
        let mut outputs = session.run(&[input, state, sr], None).unwrap();
        state = outputs.remove(1);
        expected.push(outputs.remove(0).data.bytes().to_vec());
    }
    assert!(expected.windows(2).any(|w| w[0] != w[1]), "the chunks give different answers");
    for transport in ["http", "grpc"] {
        let alone = run(vad_sequence(transport, json!(5), 1, chunks));
        let mixed = run(interleave(vad_sequence(transport, json!(6), 1, chunks), vad_sequence(transport, json!(7), 2, chunks)));
        let first: Vec<&Value> = mixed.iter().step_by(2).collect();
        for k in 0..chunks {
            let lone = unhex(alone[k]["outputs"]["output"]["hex"].as_str().unwrap_or_else(|| panic!("{:?}\n{}", alone[k], log())));
            assert_eq!(lone, expected[k], "{transport}: chunk {k} alone equals ONNX Runtime with the state carried by hand");
            assert_eq!(first[k]["outputs"]["output"], alone[k]["outputs"]["output"], "{transport}: chunk {k} interleaved equals alone");
        }
    }

    // Bad requests: a 400 naming the model and the field, over each transport.
    let refusals = run(vec![
        step("http", "acc", Value::Null, false, false, acc_input(1.0), &["OUT"]),
        step("grpc", "acc", Value::Null, true, false, acc_input(1.0), &["OUT"]),
        step("http", "acc", json!(31), true, false, acc_input(1.0), &["OUT"]),
        step("http", "acc", json!(31), true, false, acc_input(1.0), &["OUT"]),
        step("grpc", "acc", json!(31), true, false, acc_input(1.0), &["OUT"]),
        step("grpc", "acc", json!(32), false, false, acc_input(1.0), &["OUT"]),
        step("http", "acc", json!(31), false, true, acc_input(1.0), &["OUT"]),
        step("http", "acc", json!(31), false, false, acc_input(1.0), &["OUT"]),
        step(
            "http",
            "acc",
            json!(33),
            true,
            false,
            json!({"INPUT": {"datatype": "BYTES", "shape": [1, 1], "hex": hex(&[1, 0, 0, 0, b'x'])}}),
            &["OUT"],
        ),
        step(
            "grpc",
            "acc",
            json!(34),
            true,
            false,
            json!({"INPUT": {"datatype": "FP32", "shape": [1, 1], "hex": floats_hex(&[1.0])}, "STATE_IN": {"datatype": "FP32", "shape": [1, 1], "hex": floats_hex(&[5.0])}}),
            &["OUT"],
        ),
        step(
            "http",
            "acc",
            json!(35),
            true,
            false,
            json!({"INPUT": {"datatype": "FP32", "shape": [2, 1], "hex": floats_hex(&[1.0, 2.0])}}),
            &["OUT"],
        ),
    ]);
    let expect = |k: usize, field: &str| {
        let error = refusals[k]["error"].as_str().unwrap_or_else(|| panic!("step {k} was not refused: {:?}", refusals[k]));
        assert!(error.contains("model \"acc\"") && error.contains(field), "step {k}: {error}");
        assert!(
            refusals[k]["status"].as_str().is_some_and(|s| s.contains("400") || s.contains("INVALID_ARGUMENT")),
            "step {k}: {:?}",
            refusals[k]
        );
    };
    expect(0, "sequence_id");
    expect(1, "sequence_id");
    assert!(refusals[2]["outputs"].is_object(), "sequence 31 starts: {:?}", refusals[2]);
    expect(3, "sequence_start");
    expect(4, "sequence_start");
    expect(5, "sequence_start");
    assert!(refusals[6]["outputs"].is_object(), "sequence 31 ends: {:?}", refusals[6]);
    expect(7, "sequence_start");
    expect(8, "INPUT");
    expect(9, "STATE_IN");
    expect(10, "one item");

    // perf_analyzer: sequences of 8 over both protocols, on both models.
    for model in ["acc", "vad"] {
        for protocol in ["http", "grpc"] {
            let url = if protocol == "http" { server.address.clone() } else { grpc.clone() };
            let output = Command::new(perf_analyzer())
                .args(["-m", model, "-i", protocol, "-u", &url, "--sequence-length", "8", "--sequence-id-range", "1000:100000"])
                .args([
                    "--concurrency-range",
                    "1:4:3",
                    "--measurement-interval",
                    "800",
                    "--stability-percentage",
                    "80",
                    "--max-trials",
                    "10",
                ])
                .output()
                .unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            assert!(output.status.success(), "perf_analyzer --sequence-length 8 on {model} over {protocol} failed:\n{text}\n{}", log());
            assert!(text.contains("Throughput:"), "{text}");
        }
    }

    // Every request that reached the engine ended exactly once.
    let (_, metrics) = http_get(&server.address, "/metrics");
    let arrived = prometheus_value(&metrics, "yardmaster_requests_arrived_total");
    let ended = prometheus_value(&metrics, "yardmaster_requests_ended_total");
    assert!(arrived > 0.0 && arrived == ended, "arrived {arrived}, ended {ended}:\n{metrics}");
}
