//! The shipped PP-OCR repository (`crates/serve/repositories/ocr`): an ensemble of
//! three built-in steps, served as any repository is. Laid out in a folder of its own,
//! beside ensembles that misuse built-in steps — each refused naming the model and the
//! reason while `ocr` serves; a model running a built-in program is described but
//! refuses requests of its own; the simulator reads the same repository.

use std::path::Path;
use std::process::Command;

use yardmaster::serve::builtin_repository::BuiltinRepository;
use yardmaster::serve::repository::default_profile_cache;

use super::serve_end_to_end::{http_get, scratch, toolchain};
use super::serve_model_control::http_post;
use super::serve_repository::serve_repository_with;

/// Write `text` as `models/<model>/config.pbtxt`, with its model file linked from
/// `like`'s (or an empty version folder for an ensemble).
fn model(models: &Path, name: &str, text: &str, like: Option<&str>) {
    let version = models.join(name).join("1");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::write(models.join(name).join("config.pbtxt"), text).unwrap();
    if let Some(like) = like {
        let target = std::fs::read_link(models.join(like).join("1/model.onnx")).unwrap();
        std::os::unix::fs::symlink(target, version.join("model.onnx")).unwrap();
    }
}

#[test]
fn the_shipped_ocr_repository_serves_as_any_repository_and_misused_builtin_steps_are_refused() {
    let dir = scratch("builtin");
    let models = BuiltinRepository::Ocr.lay_out_in(&dir, &default_profile_cache()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(models, dir.join("repositories/ocr"));
    let step = |name: &str, program: &str| {
        format!(
            "name: \"{name}\"\nmax_batch_size: 4\nparameters {{ key: \"yardmaster.program\" value {{ string_value: \"{program}\" }} }}\n"
        )
    };
    let ensemble = |name: &str, steps: &str| {
        format!(
            "name: \"{name}\"\nplatform: \"ensemble\"\ninput [ {{ name: \"image\" data_type: TYPE_UINT8 dims: [ -1, -1, 3 ] }} ]\noutput [ {{ name: \"texts\" data_type: TYPE_STRING dims: [ -1 ] }}, {{ name: \"scores\" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: \"boxes\" data_type: TYPE_FP32 dims: [ -1, 4, 2 ] }} ]\nensemble_scheduling {{ step [ {steps} ] }}\n"
        )
    };
    let rec_step = |model: &str, from: &str| {
        format!("{{ model_name: \"{model}\" input_map {{ key: \"crops\" value: \"{from}\" }} output_map {{ key: \"texts\" value: \"texts\" }} output_map {{ key: \"scores\" value: \"scores\" }} output_map {{ key: \"boxes\" value: \"boxes\" }} }}")
    };
    // A second ensemble of the same steps: a built-in step serves one ensemble.
    let again = format!(
        "{{ model_name: \"det\" input_map {{ key: \"image\" value: \"image\" }} output_map {{ key: \"crops\" value: \"c\" }} }}, {}",
        rec_step("rec", "c")
    );
    model(&models, "reuse", &ensemble("reuse", &again), None);
    // A step map naming tensors the program does not have.
    model(&models, "det_b", &step("det_b", "ocr-det"), Some("det"));
    model(&models, "rec_b", &step("rec_b", "ocr-rec"), Some("rec"));
    let wrong = format!(
        "{{ model_name: \"det_b\" input_map {{ key: \"x\" value: \"image\" }} output_map {{ key: \"crops\" value: \"c\" }} }}, {}",
        rec_step("rec_b", "c")
    );
    model(&models, "wrong_map", &ensemble("wrong_map", &wrong), None);
    // An unknown program.
    model(&models, "unknown", &step("unknown", "ocr-everything"), Some("det"));

    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let (status, config) = http_get(&server.address, "/v2/models/ocr/config");
    assert_eq!(status, 200, "{config}");
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["platform"], "ensemble", "{config}");
    assert_eq!(config["ensemble_scheduling"]["step"].as_array().unwrap().len(), 3, "{config}");
    // One blank image through the three steps: no text on it.
    let blank = format!(
        r#"{{"inputs":[{{"name":"image","shape":[32,48,3],"datatype":"UINT8","data":[{}]}}]}}"#,
        vec!["255"; 32 * 48 * 3].join(",")
    );
    let (status, answer) = http_post(&server.address, "/v2/models/ocr/infer", &blank);
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let names: Vec<&str> = answer["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["texts", "scores", "boxes"], "{answer}");
    assert_eq!(answer["outputs"][0]["shape"], serde_json::json!([0]), "a blank page has no line: {answer}");
    // A model running a built-in program is described (Triton's tools read an
    // ensemble's composing models) but serves only as its ensemble's step.
    let (status, body) = http_get(&server.address, "/v2/models/det/config");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"max_batch_size\":4") && body.contains("ocr-det"), "{body}");
    let (status, body) = http_post(
        &server.address,
        "/v2/models/det/infer",
        r#"{"inputs":[{"name":"x","shape":[1,3,1,1],"datatype":"FP32","data":[0,0,0]}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("serves only as a step of ensemble") && body.contains("ocr"), "{body}");

    // Triton's perf_analyzer reads the ensemble and its composing models' configurations
    // and statistics, and drives it with random images: no error at two concurrencies.
    let perf = Command::new(toolchain("perf/bin/perf_analyzer-run"))
        .args(["-m", "ocr", "-u", &server.address, "-i", "http", "--shape", "image:96,96,3", "--concurrency-range", "1:2"])
        // Windows of a few requests each, not of a fixed time: an OCR request on a busy
        // 2-core machine with a debug build may take longer than a short time window.
        .args(["--measurement-mode", "count_windows", "--measurement-request-count", "6"])
        .args(["--stability-percentage", "80", "--max-trials", "10"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&perf.stdout).into_owned() + &String::from_utf8_lossy(&perf.stderr);
    assert!(perf.status.success(), "perf_analyzer failed:\n{text}");
    assert!(text.contains("Composing models:") && text.contains("det, version: 1"), "{text}");
    assert_eq!(text.matches("Request concurrency:").count(), 2, "{text}");

    let log = std::fs::read_to_string(&stderr).unwrap();
    for (model, reason) in [
        ("reuse", "already a step of ensemble \"ocr\""),
        ("wrong_map", "input_map maps [\"x\"]; the program's tensors are [\"image\"]"),
        ("unknown", "no such built-in program"),
    ] {
        let line = log.lines().find(|l| l.starts_with("not served") && l.contains(&format!("model {model:?}")));
        let line = line.unwrap_or_else(|| panic!("no refusal of {model}:\n{log}"));
        assert!(line.contains(reason), "{model}: {line}");
    }

    // The simulator schedules the same three stages, with the shipped profiles.
    let sim = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "compare", "--policies", "fifo,edf", "--workload", "poisson", "--rate", "2", "--duration", "20"])
        .arg("--model-repository")
        .arg(&models)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&sim.stdout);
    assert!(sim.status.success(), "sim compare failed:\n{table}\n{}", String::from_utf8_lossy(&sim.stderr));
    assert_eq!(table.lines().filter(|l| l.starts_with("fifo") || l.starts_with("edf")).count(), 2, "{table}");
    drop(server);
}
