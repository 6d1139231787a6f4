//! Applications nobody chose (issue 43): Loki and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].

use yardmaster::engine::Pipeline;
use yardmaster::policy::Limits;
use yardmaster::sim::sweep::LOW_LOAD_ON_TIME;
use yardmaster::sim::RunOutcome;

use super::random_apps::{generated, on_time, run_within, simulate, zero_time_entry_application};

#[test]
fn loki_is_on_time_at_half_the_bound_on_generated_fan_outs() {
    // `r17-mid-fan` and `r18-mid-fan-join` of seed 1. Loki routed each request to a
    // worker drawn from its MostAccurateFirst table, so alike workers of a variant
    // had queues of very different lengths, and the long ones overshot their
    // budgets: 95.1 % and 94.9 % on time at half the capacity bound (5 s, seed 1).
    // A request now joins the shortest queue among the workers of the variant its
    // table drew, and a task whose planned workers are still starting keeps its
    // present ones on their variants while they serve more there.
    for (index, expected) in [(17, "r17-mid-fan"), (18, "r18-mid-fan-join")] {
        let (name, app) = generated(1, index);
        assert_eq!(name, expected);
        let share = on_time("loki", &app, 0.5, 5.0);
        eprintln!("{name}: {:.2} % on time at 0.5×", 100.0 * share);
        assert!(share >= LOW_LOAD_ON_TIME, "{name} at 0.5×: {:.2} % on time", 100.0 * share);
    }
}

#[test]
fn loki_measures_the_fan_outs_below_a_fan_out_once_per_request() {
    // `r17-mid-fan` of seed 1: a task fanning out to the tasks below it. A sub-request
    // names its end-to-end request but not its parent, and Loki counted the
    // sub-requests of each processed request under its end-to-end request alone:
    // siblings of a fan-out processed in the same call (one batch) shared one entry,
    // and all their sub-requests were counted as one sibling's. The fan-outs below a
    // fan-out came out up to twice the traffic's, the plans were sized (and capped)
    // for sub-requests that never came, with cheaper variants, and the root dropped
    // what the capped plan did not serve: 97.4 % on time at half the bound over 10 s
    // (accuracy 0.53; 87.6 % over 30 s with seed 2, 88.2 % on `r03-mid-fan`).
    // Counted per task and end-to-end request, each sibling one sample of their mean:
    // 100 % (accuracy 0.67).
    let (name, app) = generated(1, 17);
    assert_eq!(name, "r17-mid-fan");
    let share = on_time("loki", &app, 0.5, 10.0);
    eprintln!("{name}: {:.2} % on time at 0.5× over 10 s", 100.0 * share);
    assert!(share >= LOW_LOAD_ON_TIME, "{name} at 0.5× over 10 s: {:.2} % on time", 100.0 * share);
}

#[test]
fn loki_loses_only_its_start_up_at_half_the_bound_on_its_worst_generated_application() {
    // `r09-root-fan-join` of seed 1 (a face recogniser fanning out to three branches
    // that join at a sink, SLO 73 ms), where Loki missed worst: 82.7 % on time at half
    // the bound. The plan was capped (1.5 × the demand passes the most the cluster
    // serves) and a capped plan dropped on the paper's per-task budget, though the
    // demand itself was well within reach: 470 requests a second at the root. The
    // budget rule now holds only once the measured demand passes what the plan
    // serves. What is left is the first second: the import starts the root with 11
    // workers where the plan runs 18 at batch 1 (the root's genderNet gains nothing
    // from batching), and the backlog until they start is dropped below it.
    let (name, app) = generated(1, 9);
    assert_eq!(name, "r09-root-fan-join");
    let stats = simulate("loki", &[], &app, 0.5, 5.0);
    let share = stats.outcomes.on_time as f64 / stats.arrivals.max(1) as f64;
    eprintln!("{name}: {:.2} % on time at 0.5×", 100.0 * share);
    assert!(share >= 0.98, "{name} at 0.5×: {:.2} % on time", 100.0 * share);
}

#[test]
fn the_proteus_like_baseline_serves_most_requests_on_time_at_a_quarter_of_capacity_behind_a_zero_time_entry() {
    // The zero-time-entry application (`source` feeding a classifier that fans out to
    // three branches, SLO 204 ms). The Proteus-like planner split the SLO equally over
    // the deepest branch counting the `source` (51 ms a task instead of 68) and, with
    // every worker always on, gave the workers no demand needed to the `source` (16 of
    // 56): 85 % on time at a quarter of the bound. A task that takes no time now has
    // no share and one worker (`proteus::tests`), and while its plan covers the demand
    // a request joins the shortest queue of its variant: 95 % here. The rest is its
    // per-task plan (docs/loki.md, "Proteus-like: an equal SLO split and per-task
    // planning"): the MILP's split over the detector's variants moves with the jobs'
    // noise, and 97.4–100 % in `sim compare` runs of the same load.
    let app = zero_time_entry_application();
    let share = on_time("loki-proteus", &app, 0.25, 4.0);
    eprintln!("loki-proteus: {:.2} % on time at 0.25×", 100.0 * share);
    assert!(share >= 0.95, "loki-proteus at 0.25×: {:.2} % on time", 100.0 * share);
}

/// Fuel per event call in the decision-cost test (the simulator gives each call 1e9, a
/// serving sandbox 5e7).
const EVENT_FUEL: u64 = 10_000_000;

/// `policy` on `pipeline` under Poisson load at `load` × its capacity bound for
/// `duration_s` simulated seconds, each event call within `fuel`; faults are the
/// caller's to check.
fn run_with_fuel(policy: &str, pipeline: &Pipeline, load: f64, duration_s: f64, fuel: u64) -> RunOutcome {
    // Ticks keep their default fuel: Loki's MILP slices run there.
    run_within(policy, &[], pipeline, load, duration_s, Limits { event_fuel: fuel, ..Limits::default() })
}

#[test]
fn loki_and_its_baselines_decide_within_a_bounded_budget_from_2x_to_10x_on_a_generated_application() {
    // `r09-root-fan-join` of seed 1 (5,528 req/s bound). Past capacity the queues fill
    // until their heads overshoot their budgets and are dropped; a call of request
    // events must cost about as much with the queues full at 10× as at 2×: batch
    // formation stops its scan at the first request within its budget, and a request
    // joins the shortest of its variant's queues in one pass over the workers.
    let (name, app) = generated(1, 9);
    assert_eq!(name, "r09-root-fan-join");
    for policy in ["loki", "loki-inferline", "loki-proteus"] {
        let low = run_with_fuel(policy, &app, 2.0, 2.0, EVENT_FUEL);
        let high = run_with_fuel(policy, &app, 10.0, 2.0, EVENT_FUEL);
        for (load, out) in [("2×", &low), ("10×", &high)] {
            assert!(out.arm.faults.is_empty() && out.arm.fallbacks == 0, "{policy} at {load}: {:?}", out.arm.faults);
        }
        let per_event = |out: &RunOutcome| out.arm.fuel as f64 / out.arm.events.max(1) as f64;
        eprintln!("{policy}: fuel per event {:.0} at 2×, {:.0} at 10×", per_event(&low), per_event(&high));
        assert!(per_event(&high) <= 2.0 * per_event(&low), "{policy}: {:.0} at 10× against {:.0} at 2×", per_event(&high), per_event(&low));
    }
}
