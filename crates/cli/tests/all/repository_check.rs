//! `yardmaster repository check` on a repository laid out as Triton's users lay them
//! out: a model without `config.pbtxt` (completed from its ONNX graph), one with a
//! partial `config.pbtxt`, a malformed one and a folder with no versions — the good
//! models are printed, the bad ones refused with where and why, and the exit code says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use yardmaster_dataplane::assets;

/// A fresh repository under the temp directory.
fn repository(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yardmaster-repository-check-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn model(repo: &Path, name: &str, version: u32, onnx: &str, config: Option<&str>) {
    let folder = repo.join(name).join(version.to_string());
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(assets::model_path(onnx).unwrap_or_else(|e| panic!("{e}")), folder.join("model.onnx")).unwrap();
    if let Some(config) = config {
        std::fs::write(repo.join(name).join("config.pbtxt"), config).unwrap();
    }
}

fn check(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_yardmaster")).args(["repository", "check"]).args(args).output().unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8(output.stdout).unwrap())
}

#[test]
fn a_repository_is_checked_model_by_model() {
    let repo = repository("mixed");
    model(&repo, "cls", 1, assets::CLS_MODEL, None);
    let rec = "name: \"rec\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n\
               input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3, 48, -1 ] } ]\n\
               instance_group [ { count: 2 kind: KIND_CPU } ]\n\
               parameters { key: \"yardmaster.slo_ms\" value: { string_value: \"250\" } }\n";
    model(&repo, "rec", 3, assets::REC_MODEL, Some(rec));
    model(&repo, "broken", 1, assets::CLS_MODEL, Some("name: \"broken\"\ninput [ { name: \"x\" dims: [ 3 }\n"));
    std::fs::create_dir_all(repo.join("empty")).unwrap();

    let (code, out) = check(&[repo.to_str().unwrap()]);
    assert_eq!(code, 1, "a refused model fails the check:\n{out}");
    assert!(out.starts_with("4 models: 2 ready, 2 refused"), "{out}");
    assert!(out.contains("READY   cls: onnxruntime, versions [1], max_batch_size 4, 1 instance(s), SLO 1000 ms"), "{out}");
    assert!(out.contains("input  x TYPE_FP32 [3, -1, -1]") && out.contains("TYPE_FP32 [2]"), "cls completed from its graph:\n{out}");
    assert!(out.contains("READY   rec: onnxruntime, versions [3], max_batch_size 8, 2 instance(s), SLO 250 ms"), "{out}");
    assert!(out.contains("output softmax_11.tmp_0 TYPE_FP32 [-1, 6625]"), "rec's output comes from its graph:\n{out}");
    let broken = out.lines().find(|l| l.starts_with("REFUSED broken")).unwrap_or_else(|| panic!("{out}"));
    assert!(broken.contains("config.pbtxt:2:"), "the error names file and line: {broken}");
    assert!(out.lines().any(|l| l.starts_with("REFUSED empty")), "{out}");

    let (code, json) = check(&[repo.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["rec"]["max_batch_size"], 8);
    assert_eq!(json["cls"]["output"][0]["dims"], serde_json::json!([2]));
    assert!(json["broken"]["error"].as_str().unwrap().contains("config.pbtxt:2:"));

    // Only good models: exit 0.
    let good = repository("good");
    model(&good, "cls", 1, assets::CLS_MODEL, None);
    assert_eq!(check(&[good.to_str().unwrap()]).0, 0);
}

/// `repository check` and `serve` read a model's tensors by one rule: a model that
/// `serve` would refuse (here: an optional input, which the data plane does not leave
/// out, and `sequence_batching`, which would be served without its state) is refused by the check too, in the server's words — it used to say READY — and
/// ones it serves (`reshape`; a non-batching model whose input does not begin with a
/// dimension of 1: fed whole) are READY in both.
#[test]
fn check_refuses_what_serve_refuses_in_its_words() {
    let repo = repository("one-rule");
    let reshaped = "name: \"reshaped\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n\
                    input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3, 48, -1 ] reshape { shape: [ 3, 48, -1 ] } } ]\n";
    model(&repo, "reshaped", 1, assets::REC_MODEL, Some(reshaped));
    let unbatched = "name: \"unbatched\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 0\n\
                     input [ { name: \"x\" data_type: TYPE_FP32 dims: [ -1, 3, 48, -1 ] } ]\n";
    model(&repo, "unbatched", 1, assets::REC_MODEL, Some(unbatched));
    model(&repo, "plain", 1, assets::CLS_MODEL, None);
    let optional = "name: \"optional\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n\
                    input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3, 48, -1 ] optional: true } ]\n";
    model(&repo, "optional", 1, assets::REC_MODEL, Some(optional));
    // A sequence batcher whose START control fills an input the graph does not have.
    let stateful = "name: \"stateful\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n\
                    sequence_batching { control_input [ { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START \
                    int32_false_true: [ 0, 1 ] } ] } ] }\n";
    model(&repo, "stateful", 1, assets::CLS_MODEL, Some(stateful));
    let (code, out) = check(&[repo.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("5 models: 3 ready, 2 refused"), "{out}");
    let line = |name: &str| out.lines().find(|l| l.starts_with(&format!("REFUSED {name}:"))).unwrap_or_else(|| panic!("{out}")).to_string();
    assert!(line("optional").contains("serve refuses it: input \"x\": optional inputs are not supported"), "{out}");
    assert!(out.contains("READY   reshaped"), "{out}");
    assert!(line("stateful").contains("serve refuses it: sequence_batching fills input \"START\", which the graph does not have"), "{out}");
    assert!(out.contains("READY   unbatched"), "{out}");
    assert!(out.contains("READY   plain"), "{out}");
}
