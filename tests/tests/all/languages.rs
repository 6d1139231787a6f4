//! The example policy of `policy-examples/`, written in Rust, Python, JavaScript and
//! Zig: each builds from the repository with its own toolchain, passes the conformance
//! harness, and all four make the same decisions — action for action on the engine
//! over the scripted cluster, batch for batch and drop for drop in the simulator — on
//! the same seed.
//!
//! The tests build the examples with `policy-examples/LANG/build.sh` (a no-op when the
//! sources did not change). A language whose toolchain is not installed is skipped with
//! the reason printed; `scripts/setup.sh` (and so CI) installs all of them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use yardmaster::conformance::scripted::MS;
use yardmaster::conformance::{check_component, CheckOptions, CheckReport};
use yardmaster::engine::EngineOptions;
use yardmaster::formats::WorkloadSpec;
use yardmaster::policy::contract::{Action, DropReason};
use yardmaster::policy::{FailureMode, Limits, Mode, PolicyLoader, Sandbox};
use yardmaster::sim::executor::SimExecutorOptions;
use yardmaster::sim::{compare, PolicySpec, SimSpec};
use yardmaster_tests::{chat, params, vision, Driver};

/// The languages, Rust (the reference) first.
const LANGUAGES: &[&str] = &["rust", "python", "js", "zig"];

/// Exit status of a build script whose toolchain is not installed.
const TOOLCHAIN_MISSING: i32 = 3;

/// One language's build of the example.
struct Example {
    language: &'static str,
    bytes: Arc<Vec<u8>>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Build every example once per test run; languages without a toolchain are left out
/// with the reason printed.
fn examples() -> &'static [Example] {
    static BUILT: OnceLock<Vec<Example>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = root();
        let out = root.join("policy-examples/build");
        let mut built = Vec::new();
        for &language in LANGUAGES {
            let script = root.join("policy-examples").join(language).join("build.sh");
            let output = Command::new("bash").arg(&script).env("YARDMASTER_EXAMPLES_OUT", &out).output().expect("bash runs");
            let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            match output.status.code() {
                Some(0) => {}
                Some(TOOLCHAIN_MISSING) if language != "rust" => {
                    eprintln!("SKIPPED {language}: {}", log.trim());
                    continue;
                }
                _ => panic!("building the {language} example failed ({}):\n{log}", output.status),
            }
            let path = out.join(format!("deadline-scaler-{language}.wasm"));
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            built.push(Example { language, bytes: Arc::new(bytes) });
        }
        assert_eq!(built[0].language, "rust", "the reference always builds");
        built
    })
}

/// Compiled components are cached across test runs (the Python and JavaScript
/// components are 12–18 MB and take a while to compile).
fn cache_dir() -> Option<PathBuf> {
    Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy-examples-cache"))
}

/// One simulate-mode loader for the tests, so each component is compiled once.
fn loader() -> &'static PolicyLoader {
    static LOADER: OnceLock<PolicyLoader> = OnceLock::new();
    LOADER.get_or_init(|| PolicyLoader::new(Sandbox::new(Mode::Simulate, Limits::default()).expect("engine"), cache_dir()))
}

#[test]
fn every_language_passes_the_conformance_harness_with_the_same_outcomes() {
    let options = CheckOptions { cache_dir: cache_dir(), ..CheckOptions::default() };
    let reports: Vec<(&str, CheckReport)> =
        examples().iter().map(|e| (e.language, check_component(e.language, &e.bytes, &options).expect("loads"))).collect();
    for (language, report) in &reports {
        eprintln!("{}", report.render());
        assert!(report.passed(), "{language}:\n{}", report.render());
        assert_eq!(report.deterministic, Some(true), "{language}");
        let o = &report.outcomes;
        assert!(o.dropped > 0, "{language}: the script has deadlines no schedule can meet");
        assert_eq!(o.late, 0, "{language}: what cannot finish in time is dropped");
    }
    let (_, reference) = &reports[0];
    for (language, report) in &reports[1..] {
        assert_eq!(report.outcomes, reference.outcomes, "{language} ends requests unlike rust");
        assert_eq!(report.actions, reference.actions, "{language} takes other actions than rust");
        assert_eq!(report.events, reference.events, "{language} was delivered other events than rust");
    }
}

/// Every action a policy takes on the engine over the conformance cluster in a
/// scripted two seconds: bursts on the vision chain (a third of them with deadlines
/// no batch can meet, a third tight) and chat requests on the LLM stage, with the
/// engine's tick every 100 ms; the load is sustained, so the detector stage is scaled
/// up. The run goes on to 10 s, until every request has ended.
fn scripted_actions(example: &Example, loader: &PolicyLoader) -> Vec<Action> {
    let module = loader.load(example.language, &example.bytes).expect("loads");
    let tuning = params(&[("window-ms", "300"), ("sustain-ticks", "2")]);
    let mut driver = Driver::start(loader, module, tuning, FailureMode::FailClosed);
    for round in 0..20u64 {
        let start = round * 100 * MS;
        // The engine's tick at `start` comes after this round's requests.
        driver.run_up_to(start);
        for third in 0..3 {
            driver.submit((0..20).map(|i| vision(start, [2, 40, 150][(i + third) % 3])).collect());
        }
        if round % 4 == 0 {
            driver.submit((0..3).map(|i| chat(start, 8 + 8 * i)).collect());
        }
    }
    driver.advance_to(10_000 * MS);
    for output in driver.outputs() {
        assert!(output.fault.is_none(), "{}: {:?}", example.language, output.fault);
        assert!(output.rejected.is_empty(), "{}: {:?}", example.language, output.rejected);
    }
    assert!(driver.unfinished().is_empty(), "{}: {:?}", example.language, driver.unfinished());
    driver.outputs().iter().flat_map(|o| o.actions.iter().cloned()).collect()
}

#[test]
fn every_language_takes_the_same_actions_in_the_scripted_cluster() {
    let loader = loader();
    let examples = examples();
    let reference = scripted_actions(&examples[0], loader);
    let count = |pick: fn(&Action) -> bool| reference.iter().filter(|a| pick(a)).count();
    assert!(count(|a| matches!(a, Action::Scale(s) if s.stage == 0)) >= 1, "sustained overload scales the detector");
    assert!(count(|a| matches!(a, Action::Drop(d) if d.reason == DropReason::DeadlineUnreachable)) > 100);
    assert!(count(|a| matches!(a, Action::Dispatch(d) if d.worker == 3)) > 3, "the LLM worker runs frames");
    for example in &examples[1..] {
        let actions = scripted_actions(example, loader);
        assert_eq!(actions.len(), reference.len(), "{} took {} actions, rust {}", example.language, actions.len(), reference.len());
        if let Some(at) = actions.iter().zip(&reference).position(|(a, b)| a != b) {
            panic!("{} differs from rust at action {at}: {:?} vs {:?}", example.language, actions[at], reference[at]);
        }
    }
}

/// A two-stage chain whose detector (one replica of three) cannot keep up with 450
/// requests per second.
const TWO_STEP: &str = r#"
name = "two-step"
slo_ms = 120
max_workers = 5

[[stage]]
name = "detect"
successors = ["classify"]
max_batch = 4
replicas = 1
max_replicas = 3
[[stage.variant]]
name = "detector"
alpha_ms = 2.0
beta_ms = 6.0

[[stage]]
name = "classify"
max_batch = 8
replicas = 1
max_replicas = 2
[[stage.variant]]
name = "classifier"
alpha_ms = 0.5
beta_ms = 3.0
"#;

#[test]
fn every_language_makes_the_same_decisions_in_the_simulator() {
    let capture = std::env::temp_dir().join(format!("yardmaster-languages-{}", std::process::id()));
    let spec = SimSpec {
        pipeline: yardmaster::formats::pipeline::from_toml(TWO_STEP, "two-step").expect("pipeline"),
        seed: 3,
        duration: 4_000 * MS,
        executor: SimExecutorOptions::default(),
        engine: EngineOptions { params: params(&[("sustain-ticks", "2")]), ..EngineOptions::default() },
        decision_interval: 0,
        capture_dir: Some(capture.clone()),
    };
    let workload = WorkloadSpec::Preset { name: "poisson".into(), rate: 450.0 };
    let policies: Vec<PolicySpec> = examples().iter().map(|e| PolicySpec { name: e.language.into(), bytes: e.bytes.clone() }).collect();
    let runs = compare(&spec, &workload, &policies, loader(), |_, _| {}).expect("runs");

    // The trace records every batch a policy dispatched (worker, requests in order) and
    // how every request ended (with the drop reason): the decisions, in time order.
    let decisions = |language: &str| {
        let text = std::fs::read_to_string(capture.join(format!("trace-{language}.jsonl"))).expect("trace");
        text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
    };
    let reference = decisions("rust");
    let kind = |k: &str| reference.iter().filter(|l| l.contains(&format!("\"kind\":\"{k}\""))).count();
    assert!(kind("batch") > 500 && kind("completion") > 1_500, "a real run");
    assert!(reference.iter().any(|l| l.contains("deadline is unreachable")), "the overload forces drops");
    let rust = &runs[0];
    assert!(rust.arm.accepted.get("scale").copied().unwrap_or(0) >= 1, "sustained overload scales up: {:?}", rust.arm.accepted);
    assert!(reference.iter().any(|l| l.contains("\"worker\":2")), "the new replica serves");
    for (example, run) in examples().iter().zip(&runs).skip(1) {
        let lines = decisions(example.language);
        if let Some(at) = lines.iter().zip(&reference).position(|(a, b)| a != b) {
            panic!("{} differs from rust at trace line {}: {}\nvs {}", example.language, at + 2, lines[at], reference[at]);
        }
        assert_eq!(lines.len(), reference.len(), "{}", example.language);
        assert_eq!(run.arm.accepted, rust.arm.accepted, "{}", example.language);
        assert_eq!(run.arm.faults, rust.arm.faults, "{}", example.language);
        assert_eq!(run.engine, rust.engine, "{}", example.language);
    }
    std::fs::remove_dir_all(&capture).ok();
}
