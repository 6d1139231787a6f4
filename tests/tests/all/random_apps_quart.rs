//! Applications nobody chose (issue 43): QUART and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].

use yardmaster::engine::{EngineOptions, Pipeline};
use yardmaster::formats::WorkloadSpec;
use yardmaster::policy::{Limits, Mode};
use yardmaster::sim::executor::SimExecutorOptions;
use yardmaster::sim::reproduce::shipped;
use yardmaster::sim::sweep::{capacity, LOW_LOAD_ON_TIME};
use yardmaster::sim::{run, RunOutcome, SimSpec};
use yardmaster_tests::loader;

use super::random_apps::generated;

/// Fuel per event call in the decision-cost test (the simulator gives each call 1e9, a
/// serving sandbox 5e7; `decision_cost.rs` uses the same).
const EVENT_FUEL: u64 = 10_000_000;

/// `policy` on `pipeline` under Poisson load at `load` × its capacity bound for
/// `duration_s` simulated seconds, each call within `fuel`; faults are the caller's to
/// check.
fn run_with_fuel(policy: &str, pipeline: &Pipeline, load: f64, duration_s: f64, fuel: u64) -> RunOutcome {
    let duration = (duration_s * 1e9) as u64;
    let rate = load * capacity(pipeline).unwrap();
    let spec = SimSpec {
        pipeline: pipeline.clone(),
        seed: 1,
        duration,
        executor: SimExecutorOptions::default(),
        engine: EngineOptions::default(),
        decision_interval: 0,
        capture_dir: None,
    };
    let arrivals = WorkloadSpec::Preset { name: "poisson".into(), rate }.arrivals(duration, spec.seed).unwrap();
    let loader = loader(Mode::Simulate, Limits { event_fuel: fuel, tick_fuel: fuel, ..Limits::default() });
    run::run(&spec, &shipped(policy, policy).unwrap(), &loader, arrivals, &mut |_| {}).unwrap()
}

#[test]
fn quart_s_baselines_decide_within_a_bounded_budget_from_2x_to_10x_on_a_generated_application() {
    // `r09-root-fan-join` of seed 1 (a face recogniser fanning out to three branches
    // that join at a sink, 5,528 req/s bound). The fixed, reactive and uniform
    // baselines never drop, and the host expires a request only 5 s past its deadline,
    // so past capacity their queues hold every arrival of the run. The queues' ids were
    // kept in a hash map, which grows by rehashing every entry in one insert: at 10×
    // one event call rehashed tens of thousands of ids and ran out of this budget (in
    // the random sweep, of the default 5e7 from 2×: `fell back` on 9 rows each). The
    // ids are now in B-trees (a logarithm per insert at worst).
    let (name, app) = generated(1, 9);
    assert_eq!(name, "r09-root-fan-join");
    for policy in ["quart-fixed", "quart-reactive", "quart-uniform"] {
        let low = run_with_fuel(policy, &app, 2.0, 1.5, EVENT_FUEL);
        let high = run_with_fuel(policy, &app, 10.0, 1.5, EVENT_FUEL);
        for (load, out) in [("2×", &low), ("10×", &high)] {
            assert!(out.arm.faults.is_empty() && out.arm.fallbacks == 0, "{policy} at {load}: {:?}", out.arm.faults);
        }
        let per_call = |out: &RunOutcome| out.arm.fuel as f64 / out.arm.calls.max(1) as f64;
        eprintln!("{policy}: fuel per call {:.0} at 2×, {:.0} at 10×", per_call(&low), per_call(&high));
        assert!(per_call(&high) <= 2.0 * per_call(&low), "{policy}: {:.0} at 10× against {:.0} at 2×", per_call(&high), per_call(&low));
    }
}

#[test]
fn quart_keeps_below_capacity_the_requests_its_later_stages_have_time_for() {
    // QUART drops a request taken out of its queue with less time left than its own
    // batch and two batches of every later stage. Counted at every stage's batch limit
    // (full batches, as past capacity) that asked `r07-chain` (SLO 209 ms) to leave its
    // entry with 199 ms left: 96 % on time at 0.25× and 84 % at 0.5×, every miss a drop
    // at the entry, and `r05-diamond` 96 % at 0.5×. The batches now count at the size
    // each stage runs (a moving average) while under 5 % of the pieces are dropped.
    use super::random_apps::simulate;
    for (index, expected, load) in [(7, "r07-chain", 0.25), (5, "r05-diamond", 0.5)] {
        let (name, app) = generated(1, index);
        assert_eq!(name, expected);
        let share = |params: &[(&str, &str)]| {
            let stats = simulate("quart", params, &app, load, 3.0);
            stats.outcomes.on_time as f64 / stats.arrivals.max(1) as f64
        };
        let (measured, at_limits) = (share(&[]), share(&[("measured_batches", "false")]));
        eprintln!("{name} at {load}×: {:.1} % on time, {:.1} % counting full batches", 100.0 * measured, 100.0 * at_limits);
        assert!(measured >= LOW_LOAD_ON_TIME, "{name} at {load}×: {:.1} % on time", 100.0 * measured);
        assert!(at_limits < LOW_LOAD_ON_TIME, "{name} at {load}× counting full batches: {:.1} % on time", 100.0 * at_limits);
    }
}
