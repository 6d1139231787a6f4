//! `yardmaster policy new`: a project in each language, written into a directory outside
//! the repository, builds with its own `build.sh` and passes `yardmaster policy check`
//! through its own `test.sh` — and its starter policy decides as the shipped `edf` on the
//! conformance script. A language whose toolchain is not installed is skipped with the
//! reason printed (its build script exits 3); `scripts/setup.sh` installs all of them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Exit status of a project's build script when its toolchain is not installed.
const TOOLCHAIN_MISSING: i32 = 3;

fn yardmaster() -> Command {
    Command::new(env!("CARGO_BIN_EXE_yardmaster"))
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A fresh directory outside the repository (so cargo never takes a Rust project for a
/// member of Yardmaster's workspace).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yardmaster-policy-new-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// The `requests` lines of a check's report: how every request of each scenario ended.
fn outcomes(report: &str) -> Vec<String> {
    report.lines().filter(|l| l.trim_start().starts_with("requests")).map(|l| l.trim().to_string()).collect()
}

/// Scaffold a `lang` project, run its `test.sh` (build, then `yardmaster policy check`)
/// and compare its decisions with `edf`'s.
fn scaffold_builds_and_passes_the_check(lang: &str) {
    let scratch = scratch(lang);
    let dir = scratch.join(format!("my-{lang}-policy"));
    let output = yardmaster().args(["policy", "new", "--lang", lang]).arg(&dir).output().expect("yardmaster runs");
    assert!(output.status.success(), "policy new --lang {lang}:\n{}", text(&output));
    for file in ["README.md", "build.sh", "test.sh"] {
        assert!(dir.join(file).is_file(), "{lang}: no {file}");
    }

    let mut test = Command::new("bash");
    test.arg(dir.join("test.sh")).env("YARDMASTER", env!("CARGO_BIN_EXE_yardmaster"));
    if lang == "rust" {
        // A target directory of its own (kept between runs, so warm runs are quick), never
        // the one of the `cargo test` running this.
        test.env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-new-target"));
    }
    let output = test.output().expect("bash runs");
    let log = text(&output);
    if output.status.code() == Some(TOOLCHAIN_MISSING) && lang != "rust" {
        eprintln!("SKIPPED {lang}: {}", log.trim());
        let _ = std::fs::remove_dir_all(&scratch);
        return;
    }
    assert!(output.status.success(), "{lang}: test.sh failed ({}):\n{log}", output.status);
    assert!(dir.join("policy.wasm").is_file(), "{lang}: no policy.wasm:\n{log}");
    assert!(log.contains("PASS  policy"), "{lang}: the check did not pass:\n{log}");
    assert!(!log.contains("FAIL"), "{lang}:\n{log}");

    // The starter is earliest deadline first: it ends every request as `edf` does.
    let edf = yardmaster().args(["policy", "check", "edf"]).output().expect("yardmaster runs");
    assert!(edf.status.success(), "{}", text(&edf));
    let expected = outcomes(&text(&edf));
    let scenarios = text(&edf).lines().filter(|l| l.trim_start().starts_with("scenario")).count();
    assert!(scenarios >= 2 && expected.len() == scenarios, "one requests line per scenario:\n{}", text(&edf));
    let (mut found, mut expected) = (outcomes(&log), expected);
    if lang != "rust" {
        // The Python, JavaScript and Zig starters are built against a contract before
        // 0.3.0: the batches scenario does not apply to them (the host gives them no
        // client batch or sequence), and says so.
        assert!(log.contains("note        not applicable: the policy speaks contract 0."), "{lang}:\n{log}");
        found.pop();
        expected.pop();
    }
    assert_eq!(found, expected, "{lang}: the starter ends requests unlike edf:\n{log}");
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn policy_new_rust_builds_outside_the_workspace_and_passes_the_check() {
    scaffold_builds_and_passes_the_check("rust");
}

#[test]
fn policy_new_python_builds_and_passes_the_check() {
    scaffold_builds_and_passes_the_check("python");
}

#[test]
fn policy_new_js_builds_and_passes_the_check() {
    scaffold_builds_and_passes_the_check("js");
}

#[test]
fn policy_new_zig_builds_and_passes_the_check() {
    scaffold_builds_and_passes_the_check("zig");
}

#[test]
fn policy_new_refuses_a_directory_with_anything_in_it() {
    let scratch = scratch("refuse");
    let dir = scratch.join("taken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let output = yardmaster().args(["policy", "new", "--lang", "python"]).arg(&dir).output().expect("yardmaster runs");
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already exists and is not empty"), "{stderr}");
    // Nothing written, nothing touched.
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("notes.txt")]);
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");

    // A file is no directory.
    let output = yardmaster().args(["policy", "new", "--lang", "zig"]).arg(dir.join("notes.txt")).output().expect("yardmaster runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not a directory"), "{}", text(&output));

    // An empty directory is fine, and a missing one is created; the name comes from it.
    let empty = scratch.join("Empty Dir");
    std::fs::create_dir_all(&empty).unwrap();
    let output = yardmaster().args(["policy", "new", "--lang", "rust"]).arg(&empty).output().expect("yardmaster runs");
    assert!(output.status.success(), "{}", text(&output));
    let manifest = std::fs::read_to_string(empty.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"empty-dir\""), "{manifest}");
    assert!(empty.join("sdk/src/lib.rs").is_file() && empty.join("wit").is_dir());
    let _ = std::fs::remove_dir_all(&scratch);
}
