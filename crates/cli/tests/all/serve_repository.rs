//! `yardmaster serve --model-repository DIR` on a Triton model repository, read by
//! clients no one here wrote: Triton's Python client (metadata, configuration,
//! inference, statistics) and Triton's `perf_analyzer` (random valid inputs from the
//! server's metadata alone, server-side statistics). The repository mixes good models
//! — one without `config.pbtxt`, one with the configuration Triton's documentation
//! shows — with bad ones, each of which must be refused naming the model and the
//! reason while the others serve. `sim compare --model-repository` then simulates the
//! same models with the profiles the server measured. Two of the models are real ones
//! no one here trained: Magika (INT32 in) and NudeNet (a YOLOv8n detector); one is an
//! ensemble of two others, whose steps are listed out of data order.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::serve_end_to_end::{http_get, read_banner, run_client, scratch, toolchain, Server};

/// Lay out the test repository under `dir/models`; returns it.
pub(crate) fn repository(dir: &Path) -> PathBuf {
    let tiny = yardmaster::serve::tiny_model::ensure(dir).expect("the tiny model is written");
    let models = dir.join("models");
    let model = |name: &str, version: u32, config: Option<&str>, file: Option<&[u8]>| {
        let folder = models.join(name).join(version.to_string());
        std::fs::create_dir_all(&folder).unwrap();
        if let Some(bytes) = file {
            std::fs::write(folder.join("model.onnx"), bytes).unwrap();
        }
        if let Some(text) = config {
            std::fs::write(models.join(name).join("config.pbtxt"), text).unwrap();
        }
    };
    let bytes = std::fs::read(&tiny).unwrap();
    // No configuration: completed from the graph (a dynamic first dimension: batching).
    model("add", 1, None, Some(&bytes));
    // As Triton's documentation writes one, with two versions (the latest serves).
    let documented = r#"
name: "add_cfg"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { all { } }
parameters { key: "yardmaster.slo_ms" value: { string_value: "250" } }
"#;
    model("add_cfg", 1, None, Some(&bytes));
    model("add_cfg", 2, Some(documented), Some(&bytes));
    // The same graph in half precision, no configuration: FP16 in and out.
    model("add_half", 1, None, Some(&yardmaster::serve::tiny_model::bytes_in(yardmaster::serve::tiny_model::Precision::Half)));
    // Bad ones.
    model("bad_config", 1, Some("name: \"bad_config\"\nmax_batch_size: [ 8\n"), Some(&bytes));
    model("no_file", 1, None, None);
    model("garbage", 1, None, Some(b"this is not an ONNX model"));
    let contradicting = "name: \"wrong_dims\"\nmax_batch_size: 8\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ 5 ] } ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n";
    model("wrong_dims", 1, Some(contradicting), Some(&bytes));
    // Two real models the set-up script fetches: Magika (INT32 bytes in, FP32 scores
    // out; no configuration) and NudeNet (a YOLOv8n detector whose graph leaves the
    // image size open; the configuration fixes 320×320, as a Triton user writes it).
    let magika = asset("magika-1.0.3/model.onnx");
    model("magika", 1, None, Some(&std::fs::read(magika).unwrap()));
    let nudenet = asset("nudenet-3.4.2/320n.onnx");
    let detector = "name: \"nudenet\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\ninput [ { name: \"images\" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]\noutput [ { name: \"output0\" data_type: TYPE_FP32 dims: [ 22, -1 ] } ]\n";
    model("nudenet", 1, Some(detector), Some(&std::fs::read(nudenet).unwrap()));
    // An ensemble of two models (y = (x + 1) + 1), and one whose step cannot serve.
    let ensemble = |name: &str, second: &str| {
        format!(
            r#"name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "add_cfg" model_version: -1 input_map {{ key: "x" value: "partial" }} output_map {{ key: "y" value: "y" }} }},
    {{ model_name: "{second}" model_version: -1 input_map {{ key: "x" value: "x" }} output_map {{ key: "y" value: "partial" }} }}
  ]
}}
"#
        )
    };
    model("add_twice", 1, Some(&ensemble("add_twice", "add")), None);
    model("bad_ensemble", 1, Some(&ensemble("bad_ensemble", "garbage")), None);
    models
}

/// A file of the assets folder the set-up script fills.
fn asset(relative: &str) -> PathBuf {
    let path = yardmaster::dataplane::assets::assets_dir().join(relative);
    assert!(path.exists(), "{} is missing: run `bash scripts/setup.sh --deps`", path.display());
    path
}

/// Start `yardmaster serve --model-repository` on a free port with `extra` flags;
/// stderr goes to a file.
pub(crate) fn serve_repository_with(dir: &Path, models: &Path, extra: &[&str]) -> (Server, PathBuf) {
    let config = dir.join("serve.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\npolicy = \"edf\"\nstate_dir = \"state\"\n").unwrap();
    let stderr = dir.join("stderr.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--model-repository")
        .arg(models)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("the yardmaster binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (banner, (address, grpc)) =
        read_banner(&mut lines, || format!("serve exited before listening:\n{}", std::fs::read_to_string(&stderr).unwrap_or_default()));
    std::thread::spawn(move || for _ in lines {});
    (Server { child, address, grpc, certificate: dir.join("state/tls/cert.pem"), dir: dir.to_path_buf(), banner }, stderr)
}

/// Start `yardmaster serve --model-repository` on a free port; stderr goes to a file.
fn serve_repository(dir: &Path, models: &Path) -> (Server, PathBuf) {
    serve_repository_with(dir, models, &[])
}

/// Triton's perf_analyzer, as `scripts/setup.sh --deps` installs it.
pub(crate) fn perf_analyzer() -> PathBuf {
    toolchain("perf/bin/perf_analyzer-run")
}

#[test]
fn a_triton_repository_serves_its_good_models_to_tritonclient_and_perf_analyzer_and_names_each_bad_one() {
    let dir = scratch("repository");
    let models = repository(&dir);
    let (server, stderr) = serve_repository(&dir, &models);

    let seen = run_client("triton_repository.py", &[&server.address, "add", "add_cfg", "magika", "nudenet", "add_twice", "add_half"]);
    let add = &seen["models"]["add"];
    assert_eq!(add["metadata"]["platform"], "onnxruntime_onnx", "{seen}");
    assert_eq!(add["metadata"]["inputs"][0]["shape"], serde_json::json!([-1, 4]), "batching: [-1] + dims: {seen}");
    assert!(add["config"]["max_batch_size"].as_u64().unwrap() > 0, "completed from the graph: {seen}");
    assert_eq!(add["outputs"]["y"]["data"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "y = x + 1: {seen}");
    let half = &seen["models"]["add_half"];
    assert_eq!(half["metadata"]["inputs"][0]["datatype"], "FP16", "{seen}");
    assert_eq!(half["metadata"]["outputs"][0]["datatype"], "FP16", "{seen}");
    assert_eq!(half["outputs"]["y"]["data"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "half precision in and out: {seen}");
    let magika = &seen["models"]["magika"];
    assert_eq!(magika["metadata"]["inputs"][0]["datatype"], "INT32", "{seen}");
    assert_eq!(magika["outputs"]["target_label"]["shape"], serde_json::json!([1, 214]), "{seen}");
    let scores: Vec<f64> = magika["outputs"]["target_label"]["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!(scores.iter().all(|p| (0.0..=1.0).contains(p)), "softmax scores: {scores:?}");
    let twice = &seen["models"]["add_twice"];
    assert_eq!(twice["metadata"]["platform"], "ensemble", "{seen}");
    assert_eq!(twice["outputs"]["y"]["data"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "the steps run in data order: {seen}");
    let nudenet = &seen["models"]["nudenet"];
    assert_eq!(nudenet["outputs"]["output0"]["shape"], serde_json::json!([1, 22, 2100]), "boxes and classes at 320×320: {seen}");
    let documented = &seen["models"]["add_cfg"];
    assert_eq!(documented["metadata"]["versions"], serde_json::json!(["1", "2"]), "version_policy all: {seen}");
    assert_eq!(documented["oldest_version_outputs"]["y"]["data"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "version 1 answers: {seen}");
    assert_eq!(documented["config"]["max_batch_size"], 8);
    assert_eq!(documented["config"]["dynamic_batching"]["preferred_batch_size"], serde_json::json!([4, 8]));
    assert_eq!(documented["config"]["instance_group"][0]["count"], 2);
    let stats = documented["stats"]["model_stats"].as_array().unwrap().iter().find(|s| s["version"] == "2").unwrap();
    assert_eq!(stats["name"], "add_cfg");
    assert!(stats["inference_stats"]["success"]["count"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(seen["wrong_shape"]["status"], "400", "a wrong shape is refused: {seen}");
    assert!(seen["wrong_shape"]["message"].as_str().unwrap().contains("shape"), "{seen}");
    let index = seen["index"].as_array().unwrap();
    let state = |name: &str| index.iter().find(|m| m["name"] == name).map(|m| (m["state"].clone(), m["reason"].clone()));
    assert_eq!(state("add").map(|s| s.0), Some(serde_json::json!("READY")), "{seen}");
    let (garbage, reason) = state("garbage").unwrap();
    assert_eq!(garbage, "UNAVAILABLE");
    assert!(reason.as_str().unwrap().contains("malformed ONNX"), "{reason}");
    assert_eq!(index.len(), 12, "every model folder is listed, each version of add_cfg: {seen}");
    assert!(seen["load"]["message"].as_str().unwrap().contains("does not load or unload"), "{seen}");
    let (status, body) = http_get(&server.address, "/v2/models/garbage");
    assert_eq!(status, 404, "a refused model is not served: {body}");

    // perf_analyzer from the metadata alone, at two concurrencies, no error.
    let perf = Command::new(perf_analyzer())
        .args(["-m", "add_cfg", "-u", &server.address, "-i", "http", "--concurrency-range", "1:2"])
        // Latency on a shared 2-core machine is noisy: accept looser stability, so
        // that what fails the test is an error, not a wobble.
        .args(["--measurement-interval", "1000", "--stability-percentage", "60", "--max-trials", "20"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&perf.stdout).into_owned() + &String::from_utf8_lossy(&perf.stderr);
    assert!(perf.status.success(), "perf_analyzer failed:\n{text}");
    assert_eq!(text.matches("Request concurrency:").count(), 2, "{text}");
    assert!(text.contains("Server:") && text.contains("Successful request count"), "the server-side section: {text}");
    assert!(!text.contains("error"), "{text}");

    let log = std::fs::read_to_string(stderr).unwrap();
    for (model, reason) in
        [("bad_config", "config.pbtxt"), ("no_file", "model.onnx"), ("garbage", "malformed ONNX"), ("wrong_dims", "dims")]
    {
        let line = log.lines().find(|l| l.starts_with("not served") && l.contains(&format!("model {model:?}")));
        let line = line.unwrap_or_else(|| panic!("no refusal of {model}:\n{log}"));
        assert!(line.contains(reason), "{model}: {line}");
    }

    // The simulator reads the same repository, with the profiles the server measured.
    let sim = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args([
            "sim",
            "compare",
            "--policies",
            "fifo,edf",
            "--workload",
            "poisson",
            "--rate",
            "50",
            "--duration",
            "5",
            "--model-repository",
        ])
        .arg(&models)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&sim.stdout);
    assert!(sim.status.success(), "sim compare failed:\n{table}\n{}", String::from_utf8_lossy(&sim.stderr));
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("fifo") || l.starts_with("edf")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let left_out = String::from_utf8_lossy(&sim.stderr);
    assert!(left_out.contains("left out: model \"garbage\""), "the unservable models are named: {left_out}");
    drop(server);
}

/// `reshape` as Triton's documentation describes it: clients send and receive the
/// declared `dims`, the model sees its `reshape`. The trivial model takes `[batch, 4]`;
/// its configuration declares `[2, 2]` both ways, reshaped to `[4]`.
#[test]
fn a_reshaped_model_takes_and_answers_its_declared_shapes() {
    let dir = scratch("reshape");
    let tiny = yardmaster::serve::tiny_model::ensure(&dir).expect("the tiny model is written");
    let models = dir.join("models");
    std::fs::create_dir_all(models.join("square/1")).unwrap();
    std::fs::copy(tiny, models.join("square/1/model.onnx")).unwrap();
    let config = "name: \"square\"\nbackend: \"onnxruntime\"\nmax_batch_size: 4\n\
                  input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]\n\
                  output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]\n";
    std::fs::write(models.join("square/config.pbtxt"), config).unwrap();
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let (status, metadata) = http_get(&server.address, "/v2/models/square");
    assert_eq!(status, 200, "{metadata}\n{}", std::fs::read_to_string(&stderr).unwrap_or_default());
    assert!(metadata.contains("\"shape\":[-1,2,2]"), "clients are told the declared shape: {metadata}");
    let body = r#"{"inputs":[{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}"#;
    let (status, answer) = super::serve_model_control::http_post(&server.address, "/v2/models/square/infer", body);
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["outputs"][0]["shape"], serde_json::json!([1, 2, 2]), "{answer}");
    assert_eq!(answer["outputs"][0]["data"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "{answer}");
    let flat = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    let (status, refused) = super::serve_model_control::http_post(&server.address, "/v2/models/square/infer", flat);
    assert_eq!(status, 400, "the model's own shape is not the declared one: {refused}");
}

/// `model_warmup` as Triton's documentation writes it: samples a worker runs at load,
/// before the model serves. A model with good samples serves; one whose sample the
/// model cannot run does not serve (its worker fails to start, as Triton fails the
/// load), and one whose data file does not fit its input is refused by `repository
/// check` and `serve` alike, naming the file.
#[test]
fn warm_up_samples_run_at_load_and_bad_ones_refuse_the_model() {
    let dir = scratch("warmup");
    let tiny = yardmaster::serve::tiny_model::ensure(&dir).expect("the tiny model is written");
    let models = dir.join("models");
    let model = |name: &str, warmup: &str| {
        std::fs::create_dir_all(models.join(name).join("1")).unwrap();
        std::fs::copy(&tiny, models.join(name).join("1/model.onnx")).unwrap();
        let config = format!(
            "name: \"{name}\"\nbackend: \"onnxruntime\"\nmax_batch_size: 4\n\
             input [ {{ name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n\
             output [ {{ name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n{warmup}"
        );
        std::fs::write(models.join(name).join("config.pbtxt"), config).unwrap();
    };
    model("warmed", "model_warmup [ { name: \"zeros\" batch_size: 2 count: 2 inputs { key: \"x\" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },\n { name: \"file\" batch_size: 1 inputs { key: \"x\" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: \"x.bin\" } } } ]\n");
    std::fs::create_dir_all(models.join("warmed/warmup")).unwrap();
    std::fs::write(models.join("warmed/warmup/x.bin"), [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
        .unwrap();
    model(
        "unrunnable",
        "model_warmup { name: \"five\" batch_size: 1 inputs { key: \"x\" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } }\n",
    );
    model("short_file", "model_warmup { name: \"short\" batch_size: 1 inputs { key: \"x\" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: \"x.bin\" } } }\n");
    std::fs::create_dir_all(models.join("short_file/warmup")).unwrap();
    std::fs::write(models.join("short_file/warmup/x.bin"), [0u8; 6]).unwrap();

    let check = Command::new(env!("CARGO_BIN_EXE_yardmaster")).args(["repository", "check"]).arg(&models).output().unwrap();
    let out = String::from_utf8_lossy(&check.stdout).into_owned() + &String::from_utf8_lossy(&check.stderr);
    assert!(out.contains("READY   warmed"), "{out}");
    let refused = out.lines().find(|l| l.starts_with("REFUSED short_file:")).unwrap_or_else(|| panic!("{out}"));
    assert!(refused.contains("x.bin has 6 bytes") && refused.contains("needs 16"), "{refused}");

    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(log.contains("short_file") && log.contains("x.bin has 6 bytes"), "serve refuses it in the same words:\n{log}");
    // Ready once its workers have run the samples.
    let started = std::time::Instant::now();
    while http_get(&server.address, "/v2/models/warmed/ready").0 != 200 {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "{}", std::fs::read_to_string(&stderr).unwrap_or_default());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let body = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    let (status, answer) = super::serve_model_control::http_post(&server.address, "/v2/models/warmed/infer", body);
    assert_eq!((status, answer.contains("[2.0,3.0,4.0,5.0]")), (200, true), "{answer}");
    // The sample the model cannot run: its worker never becomes ready, and the log says why.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(http_get(&server.address, "/v2/models/unrunnable/ready").0, 503);
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(log.contains("warm-up sample \"five\""), "{log}");
}
