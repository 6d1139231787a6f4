//! Applications nobody chose (issue 43): QUART and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].

use yardmaster::engine::Pipeline;
use yardmaster::policy::Limits;
use yardmaster::sim::sweep::LOW_LOAD_ON_TIME;
use yardmaster::sim::RunOutcome;

use super::random_apps::{generated, run_within};

/// Fuel per event call in the decision-cost test (the simulator gives each call 1e9, a
/// serving sandbox 5e7; `decision_cost.rs` uses the same).
const EVENT_FUEL: u64 = 10_000_000;

/// `policy` on `pipeline` under Poisson load at `load` × its capacity bound for
/// `duration_s` simulated seconds, each call within `fuel`; faults are the caller's to
/// check.
fn run_with_fuel(policy: &str, pipeline: &Pipeline, load: f64, duration_s: f64, fuel: u64) -> RunOutcome {
    run_within(policy, &[], pipeline, load, duration_s, Limits { event_fuel: fuel, tick_fuel: fuel, ..Limits::default() })
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

#[test]
fn quart_drops_at_the_entry_what_a_generated_fan_out_s_branch_would_drop() {
    // `r20-src-mid-fan-join` of seed 1: a source, two recognisers in a chain, then an
    // EfficientNet and a detector side by side that join at a sink (SLO 135 ms). Past
    // capacity the detector is the bottleneck; QUART checked each request's time at
    // the stage it was at, so the stages above served requests the detector then
    // dropped: 48 % of accelerator time wasted at 2×, 965 on-time requests a second
    // against 1,279 at 1× (a cliff). The entry now admits the share the later stages
    // keep (SDK `EntryShedder`, as FLEX).
    use super::random_apps::simulate;
    use yardmaster::sim::sweep::CLIFF_FRACTION;
    let (name, app) = generated(1, 20);
    assert_eq!(name, "r20-src-mid-fan-join");
    let goodput = |params: &[(&str, &str)], load: f64| simulate("quart", params, &app, load, 3.0).goodput;
    let (at_capacity, past) = (goodput(&[], 1.0), goodput(&[], 2.0));
    let unshed = [("shed_period_ms", "0")];
    let (unshed_at_capacity, unshed_past) = (goodput(&unshed, 1.0), goodput(&unshed, 2.0));
    eprintln!("{name}: {at_capacity:.0}/s at 1×, {past:.0}/s at 2×; without shedding {unshed_at_capacity:.0} and {unshed_past:.0}");
    assert!(past >= CLIFF_FRACTION * at_capacity, "{name}: {past:.0}/s at 2× against {at_capacity:.0}/s at 1×");
    assert!(
        unshed_past < CLIFF_FRACTION * unshed_at_capacity,
        "{name} without shedding: {unshed_past:.0}/s at 2× against {unshed_at_capacity:.0}/s"
    );
}

#[test]
fn quart_s_baselines_batch_within_the_slo_on_a_generated_application() {
    // `r04-mid-fan-join` of seed 1 (seven tasks; its detector's largest profiled batch
    // is 64). The fixed, reactive and uniform baselines took every request waiting up
    // to that batch: a queue that grew made the batches longer than the SLO and, past
    // a profile's sweet spot, slower, until every request was late — 2 % on time at
    // half the capacity bound. Their batch limits are now the most productive batch
    // within half of what the SLO leaves a stage beyond the other stages' single
    // requests (`fit_batches`, on by default).
    use super::random_apps::simulate;
    let (name, app) = generated(1, 4);
    assert_eq!(name, "r04-mid-fan-join");
    let share = |policy: &str, params: &[(&str, &str)]| {
        let stats = simulate(policy, params, &app, 0.5, 3.0);
        stats.outcomes.on_time as f64 / stats.arrivals.max(1) as f64
    };
    for policy in ["quart-fixed", "quart-reactive"] {
        let (fitted, unfitted) = (share(policy, &[]), share(policy, &[("fit_batches", "false")]));
        eprintln!("{policy} on {name} at 0.5×: {:.1} % on time, {:.1} % with the pipeline's batches", 100.0 * fitted, 100.0 * unfitted);
        assert!(fitted >= LOW_LOAD_ON_TIME, "{policy} on {name} at 0.5×: {:.1} % on time", 100.0 * fitted);
        assert!(unfitted < 0.5, "{policy} on {name} at 0.5× with the pipeline's batches: {:.1} % on time", 100.0 * unfitted);
    }
}
