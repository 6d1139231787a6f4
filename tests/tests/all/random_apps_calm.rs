//! Applications nobody chose (issue 43): CALM and its baselines on conversation
//! traffic (the bounded decision cost is tested in [`super::decision_cost`]).

use std::sync::Arc;

use yardmaster::sim::reproduce::shipped;
use yardmaster::sim::PolicySpec;

use super::decision_cost::{conversation, fuel_per_call};

/// A shipped policy, or the `.wasm` file `$CALM_WASM_DIR/policy_NAME.wasm` when that
/// variable is set and the file exists (to measure a build before it ships).
fn policy(name: &str) -> PolicySpec {
    let file = std::env::var("CALM_WASM_DIR").ok().map(|dir| format!("{dir}/policy_{}.wasm", name.replace('-', "_")));
    match file.and_then(|path| std::fs::read(path).ok()) {
        Some(bytes) => PolicySpec { name: name.into(), bytes: Arc::new(bytes) },
        None => shipped(name, name).unwrap(),
    }
}

/// By hand: the fuel per call of CALM and its baselines at 2×, 4×, 8× and 12× the
/// `llm` preset's capacity on conversation-sized arrivals (docs/calm.md, issue 43).
#[test]
#[ignore]
fn fuel_per_call_of_calm_and_its_baselines_by_load() {
    let names = std::env::var("CALM_POLICIES").unwrap_or_else(|_| "calm,calm-fcfs,calm-edf,calm-sjf".into());
    for name in names.split(',') {
        let spec = policy(name);
        let row: Vec<String> = [2.0, 4.0, 8.0, 12.0]
            .iter()
            .map(|load| {
                let out = conversation(&spec, 20.0 * load, 1_000_000_000);
                let metrics: Vec<String> = out
                    .arm
                    .metrics
                    .iter()
                    .map(|(k, m)| format!("{k} n={} mean={:.1} max={:.0}", m.count, m.sum / m.count.max(1) as f64, m.max))
                    .collect();
                format!(
                    "{load}×: {:.0} ({} calls, {} events, longest {:?}, faults {:?}) {}",
                    fuel_per_call(&out),
                    out.arm.calls,
                    out.arm.events,
                    out.arm.max_call_time,
                    out.arm.faults,
                    metrics.join("; ")
                )
            })
            .collect();
        eprintln!("{name}:\n  {}", row.join("\n  "));
    }
}
