//! The simulator end to end: real policy components on the engine, deterministic under
//! a seed, policies telling apart under overload, every request ending once.

use std::sync::Arc;

use yardmaster::engine::EngineOptions;
use yardmaster::formats::{presets, WorkloadSpec};
use yardmaster::policy::{Limits, Mode, PolicyLoader, Sandbox};
use yardmaster::sim::executor::SimExecutorOptions;
use yardmaster::sim::{compare, PolicySpec, RunOutcome, SimSpec};

fn policies(names: &[&str]) -> Vec<PolicySpec> {
    names
        .iter()
        .map(|n| {
            let a = yardmaster_policy_artifacts::shipped(n).expect("shipped");
            PolicySpec { name: n.to_string(), bytes: Arc::new(a.bytes.to_vec()) }
        })
        .collect()
}

fn simulate(pipeline: &str, workload: WorkloadSpec, seconds: u64, seed: u64, names: &[&str]) -> Vec<RunOutcome> {
    simulate_capturing(pipeline, workload, seconds, seed, names, None)
}

fn simulate_capturing(
    pipeline: &str,
    workload: WorkloadSpec,
    seconds: u64,
    seed: u64,
    names: &[&str],
    capture_dir: Option<std::path::PathBuf>,
) -> Vec<RunOutcome> {
    let spec = SimSpec {
        pipeline: presets::pipeline(pipeline).unwrap(),
        seed,
        duration: seconds * 1_000_000_000,
        executor: SimExecutorOptions::default(),
        engine: EngineOptions::default(),
        decision_interval: 0,
        capture_dir,
    };
    let loader = PolicyLoader::new(Sandbox::new(Mode::Simulate, Limits::default()).unwrap(), None);
    compare(&spec, &workload, &policies(names), &loader, |_, _| {}).unwrap()
}

fn summary_json(outcome: &RunOutcome) -> String {
    serde_json::to_string(&outcome.report.summary).unwrap()
}

#[test]
fn the_same_seed_gives_the_same_report_and_another_seed_does_not() {
    let twitter = || WorkloadSpec::Preset { name: "twitter".into(), rate: 1_000.0 };
    let a = simulate("vision-chain", twitter(), 5, 7, &["edf"]);
    let b = simulate("vision-chain", twitter(), 5, 7, &["edf"]);
    let c = simulate("vision-chain", twitter(), 5, 8, &["edf"]);
    assert_eq!(summary_json(&a[0]), summary_json(&b[0]));
    assert_eq!(a[0].engine, b[0].engine);
    assert_ne!(summary_json(&a[0]), summary_json(&c[0]));
}

#[test]
fn every_request_ends_exactly_once_and_edf_beats_fifo_under_overload() {
    // Well past the chain's capacity (about 1,350 requests/s).
    let overload = WorkloadSpec::Preset { name: "poisson".into(), rate: 2_000.0 };
    let runs = simulate("vision-chain", overload, 8, 3, &["fifo", "edf"]);
    for run in &runs {
        let s = &run.report.summary;
        assert_eq!(run.unfinished, 0, "{}: requests left in flight", run.report.policy);
        assert_eq!(s.overall.arrivals, s.overall.ended, "{}: every arrival ended", run.report.policy);
        assert_eq!(run.arm.faults.values().sum::<u64>(), 0);
        assert_eq!(run.arm.rejected_total(), 0, "{}: {:?}", run.report.policy, run.arm.rejected);
    }
    let (fifo, edf) = (&runs[0].report.summary.overall, &runs[1].report.summary.overall);
    assert!(edf.goodput > fifo.goodput * 1.2, "edf {} vs fifo {}", edf.goodput, fifo.goodput);
    assert!(edf.invalid_rate < fifo.invalid_rate, "edf wastes less accelerator time");
}

#[test]
fn a_dag_with_fan_out_completes_and_counts_accuracy() {
    let runs = simulate("traffic-dag", WorkloadSpec::Preset { name: "poisson".into(), rate: 100.0 }, 5, 1, &["fifo"]);
    let s = &runs[0].report.summary.overall;
    assert_eq!(runs[0].unfinished, 0);
    assert!(s.completed > 400, "{}", s.completed);
    // detect (0.9) × cars (0.91) or faces (0.95), sink 1.0: between the two products.
    assert!(s.accuracy > 0.9 * 0.91 * 0.95 - 1e-9 && s.accuracy <= 0.9 + 1e-9, "{}", s.accuracy);
}

#[test]
fn the_llm_stage_serves_the_azure_trace() {
    let path = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/azure-llm-2023/code.csv"));
    let runs = simulate("llm", WorkloadSpec::AzureLlm { path, speedup: 20.0 }, 30, 1, &["fifo"]);
    let s = &runs[0].report.summary.overall;
    assert!(s.arrivals > 1_000, "{}", s.arrivals);
    assert_eq!(runs[0].unfinished, 0);
    assert!(s.tokens_completed > 0, "tokens are generated and counted");
}

#[test]
fn a_captured_trace_replays_to_the_same_report() {
    let dir = std::env::temp_dir().join(format!("yardmaster-capture-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bursty = WorkloadSpec::Preset { name: "azure-functions".into(), rate: 800.0 };
    let original = simulate_capturing("vision-chain", bursty, 4, 5, &["edf"], Some(dir.clone()));
    let trace = dir.join("trace-edf.jsonl");
    let text = std::fs::read_to_string(&trace).unwrap();
    let count = |kind: &str| text.lines().filter(|l| l.contains(&format!("\"kind\":\"{kind}\""))).count();
    let summary = &original[0].report.summary.overall;
    assert_eq!(count("arrival") as u64, summary.arrivals);
    assert_eq!(count("completion") as u64, summary.ended, "every end is captured once");
    assert!(count("batch") > 0);
    // Replaying the captured arrivals with the same seed gives the same decisions. The
    // replay starts at the first request, so every time is earlier by its arrival time:
    // the same requests, outcomes, latencies and accelerator time, the run that much shorter.
    let first: u64 = text
        .lines()
        .find(|l| l.contains("\"kind\":\"arrival\""))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["at"].as_u64().unwrap())
        .unwrap();
    assert!(first > 0, "the first request came after the run's start");
    let replayed = simulate("vision-chain", WorkloadSpec::Trace(trace), 4, 5, &["edf"]);
    let (a, b) = (&original[0].report.summary, &replayed[0].report.summary);
    let same = |s: &yardmaster::engine::metrics::Summary| {
        let o = &s.overall;
        (o.arrivals, serde_json::to_string(&o.outcomes).unwrap(), serde_json::to_string(&o.latency).unwrap(), o.accelerator_s.to_bits())
    };
    assert_eq!(same(a), same(b));
    assert_eq!(serde_json::to_string(&a.overall.queue_delay).unwrap(), serde_json::to_string(&b.overall.queue_delay).unwrap());
    assert_eq!(a.now - b.now, first, "{} vs {}", summary_json(&original[0]), summary_json(&replayed[0]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn goodput_never_exceeds_the_optimal_bound() {
    // Below, near and far above capacity, steady and bursty, on a chain and a DAG, with
    // policies that scale, drop and batch differently: the bound is an upper bound.
    let cases: [(&str, &str, f64); 3] =
        [("vision-chain", "twitter", 1_500.0), ("vision-chain", "azure-functions", 4_000.0), ("traffic-dag", "poisson", 200.0)];
    for (pipeline, workload, rate) in cases {
        let workload = WorkloadSpec::Preset { name: workload.into(), rate };
        for outcome in simulate(pipeline, workload, 4, 3, &["fifo", "edf", "pard"]) {
            let s = &outcome.report.summary;
            assert!(
                s.overall.goodput <= s.optimal_goodput * (1.0 + 1e-9),
                "{pipeline} at {rate}/s, {}: goodput {} over the bound {}",
                outcome.report.policy,
                s.overall.goodput,
                s.optimal_goodput
            );
            assert!(s.goodput_of_optimal <= 1.0 + 1e-9);
        }
    }
}
