//! No cliffs off the papers' setups (issue 23): for PARD, FLEX, QUART and Loki on the shipped
//! pipelines `vision-chain` (a chain) and `traffic-dag` (fan-out and fan-in), goodput
//! far past capacity stays at least 90 % of the best goodput at a lower load, and at
//! half capacity under Poisson load at least 99 % of the requests are on time.
//!
//! Loads are multiples of each pipeline's capacity bound (as in `yardmaster sim
//! sweep`). The runs are short (1.5 simulated seconds; PARD on traffic-dag 4) so that a debug build runs each
//! test in seconds: the scaling policies keep the replicas they start with (their
//! first scaling epoch is later), so what is tested is how each policy's queues and
//! drops behave past what its workers serve — where the cliffs were. Before the fixes,
//! FLEX and QUART on both pipelines fell to 1–8 % of their goodput at half capacity
//! (FLEX: every stage checked the end-to-end deadline only, so the first stage used up
//! the budget of the later ones; QUART: its FIFO queues never dropped, so past capacity
//! nearly every request was late). See docs/flex.md, docs/quart.md and docs/pard.md.

use yardmaster::engine::{EngineOptions, Pipeline};
use yardmaster::formats::{presets, WorkloadSpec};
use yardmaster::policy::{Limits, Mode};
use yardmaster::sim::executor::SimExecutorOptions;
use yardmaster::sim::reproduce::shipped;
use yardmaster::sim::sweep::{capacity, CLIFF_FRACTION, LOW_LOAD_ON_TIME};
use yardmaster::sim::{run, SimSpec};
use yardmaster_tests::loader;

/// Simulated seconds of arrivals per run.
const DURATION_NS: u64 = 1_500_000_000;

/// Load multiples run by the no-cliff tests: half capacity, capacity, and far past it.
const LOADS: [f64; 3] = [0.5, 1.0, 5.0];

/// What one run gave.
#[derive(Debug, Clone, Copy)]
struct Point {
    load: f64,
    goodput: f64,
    on_time: f64,
}

impl Point {
    /// On-time requests per second of arrivals, as a share of the capacity bound
    /// (goodput divides by the elapsed time, whose drain differs between short runs).
    fn served(&self) -> f64 {
        self.on_time * self.load
    }
}

fn pipeline(name: &str) -> Pipeline {
    presets::pipeline(name).unwrap()
}

/// Loki's traffic-analysis application, imported from the shared data.
fn loki_application() -> Pipeline {
    pipeline(&format!("{}/sim__traffic_analysis.json", yardmaster::sim::reproduce::loki::data_dir().display()))
}

/// Loki's application started as the import started it before issue 43, eight workers
/// a task (the sink one), rather than spread by need (15, 6, 1, 3): what QUART's own
/// controller must then make up for.
fn loki_application_eight_a_task() -> Pipeline {
    let mut application = loki_application();
    for stage in &mut application.stages {
        stage.replicas = if stage.takes_no_time() { 1 } else { 8 };
    }
    application
}

/// `policy` on `pipeline` under Poisson load at `load` × its capacity bound for
/// `duration` ns, with `params`.
fn run_at(policy: &str, pipeline: &Pipeline, load: f64, duration: u64, params: &[(&str, &str)]) -> Point {
    let rate = load * capacity(pipeline).unwrap();
    let engine = EngineOptions { params: yardmaster_tests::params(params), ..EngineOptions::default() };
    let spec = SimSpec {
        pipeline: pipeline.clone(),
        seed: 3,
        duration,
        executor: SimExecutorOptions::default(),
        engine,
        decision_interval: 0,
        capture_dir: None,
    };
    let arrivals = WorkloadSpec::Preset { name: "poisson".into(), rate }.arrivals(duration, spec.seed).unwrap();
    let loader = loader(Mode::Simulate, Limits::default());
    let out = run::run(&spec, &shipped(policy, policy).unwrap(), &loader, arrivals, &mut |_| {}).unwrap();
    assert!(out.arm.faults.is_empty() && out.arm.fallbacks == 0, "{policy} faulted: {:?}", out.arm.faults);
    let overall = &out.report.summary.overall;
    let on_time = overall.outcomes.on_time as f64 / overall.arrivals.max(1) as f64;
    Point { load, goodput: overall.goodput, on_time }
}

/// Assert both properties for `policy` on `pipeline`: at half capacity at least
/// [`LOW_LOAD_ON_TIME`] on time, and at every load goodput at least [`CLIFF_FRACTION`]
/// of the best at a lower load.
fn holds(policy: &str, pipeline_name: &str, duration: u64, params: &[(&str, &str)]) {
    let pipeline = pipeline(pipeline_name);
    let points: Vec<Point> = LOADS.iter().map(|&load| run_at(policy, &pipeline, load, duration, params)).collect();
    eprintln!("{policy} on {pipeline_name}: {points:?}");
    let half = points[0];
    assert!(
        half.on_time >= LOW_LOAD_ON_TIME,
        "{policy} on {pipeline_name} at 0.5× capacity: {:.2} % on time, under {} % ({points:?})",
        100.0 * half.on_time,
        100.0 * LOW_LOAD_ON_TIME
    );
    for (i, point) in points.iter().enumerate().skip(1) {
        let best = points[..i].iter().map(|p| p.goodput).fold(0.0, f64::max);
        assert!(
            point.goodput >= CLIFF_FRACTION * best,
            "{policy} on {pipeline_name}: a cliff at {}× capacity, goodput {:.0}/s against {:.0}/s at a lower load ({points:?})",
            point.load,
            point.goodput,
            best
        );
    }
}

#[test]
fn flex_has_no_cliff_on_the_vision_chain() {
    // Before: 1,633/s at 0.5×, 55/s (1.7 % on time) at 1×.
    holds("flex", "vision-chain", DURATION_NS, &[]);
}

#[test]
fn flex_has_no_cliff_on_the_traffic_dag() {
    holds("flex", "traffic-dag", DURATION_NS, &[]);
}

#[test]
fn quart_has_no_cliff_on_the_vision_chain() {
    // Before: 94/s (3 % on time) at 1×: its FIFO queues kept every request.
    holds("quart", "vision-chain", DURATION_NS, &[]);
}

#[test]
fn quart_has_no_cliff_on_the_traffic_dag() {
    holds("quart", "traffic-dag", DURATION_NS, &[]);
}

#[test]
fn pard_has_no_cliff_on_the_vision_chain() {
    holds("pard", "vision-chain", DURATION_NS, &[]);
}

#[test]
fn pard_has_no_cliff_on_the_traffic_dag() {
    // PARD's estimates are windowed (queueing delays over 5 s, its state synchronised
    // every second): its first second past capacity admits at the detector frames whose
    // pieces fail downstream (1.5 s: 968/s at 1×, 868/s at 5×). Over 4 s it holds.
    holds("pard", "traffic-dag", 4_000_000_000, &[]);
}

#[test]
fn flex_spreads_the_whole_cluster_over_the_stages() {
    // vision-chain starts 4 + 2 + 3 workers, half its bound; FLEX never scaled, so at
    // 0.9× of the bound it served about half of what was offered. It now asks for the
    // cluster's workers, each stage in proportion to its need.
    let chain = pipeline("vision-chain");
    let offered = 0.9 * capacity(&chain).unwrap();
    let spread = run_at("flex", &chain, 0.9, DURATION_NS, &[]);
    let given = run_at("flex", &chain, 0.9, DURATION_NS, &[("spread", "false")]);
    assert!(spread.goodput >= 0.9 * offered, "spread: {spread:?} of {offered:.0}/s offered");
    assert!(given.goodput < 0.7 * offered, "the host's workers only: {given:?} of {offered:.0}/s offered");
}

#[test]
fn flex_is_on_time_at_low_load_on_loki_s_application() {
    // The imported application started one worker per task (the bound counts 32):
    // FLEX was 6.9 % on time at a quarter of capacity, dropping nine requests in ten as
    // unreachable (it now starts eight a task, and FLEX still spreads them by need).
    // With the cluster spread (and its window no longer reading the whole queue: past
    // 2× it ran out of fuel and fell back) it is on time over 10 s, the new workers'
    // start included (97 % over the first 3 s).
    let app = loki_application();
    let quarter = run_at("flex", &app, 0.25, 10_000_000_000, &[]);
    assert!(quarter.on_time >= LOW_LOAD_ON_TIME, "{quarter:?}");
    let over = run_at("flex", &app, 2.0, 1_000_000_000, &[]);
    assert!(over.goodput > 0.0, "{over:?}");
}

#[test]
fn flex_has_no_cliff_on_loki_s_application() {
    // Loki's detector `yolov5n` serves 176 frames/s in batches of 3 (17 ms) and 94 in
    // batches of 12 (128 ms): FLEX's largest window grew its batches with the queue, past that
    // sweet spot, and fell from 1,680 on-time requests/s at half the bound to 966 at
    // twice it. Capped at each model's most productive batch (`productive_batches`) it
    // serves more at 2× than at 0.5×. Since the downstream reserve counts each later
    // stage's largest batch within the SLO (issue 43), not its largest (yolov5x at 64
    // frames, 2 s), the detector's own budget caps its batches too, and either fix
    // alone holds: the paper's rules for both (batches up to B_max, no reserve) are the
    // failing arm.
    let app = loki_application();
    for (param, holds) in [("true", true), ("false", false)] {
        let reserve = if holds { "2" } else { "0" };
        let params = [("productive_batches", param), ("downstream_reserve", reserve)];
        let half = run_at("flex", &app, 0.5, 3_000_000_000, &params);
        let over = run_at("flex", &app, 2.0, 3_000_000_000, &params);
        let held = over.served() >= CLIFF_FRACTION * half.served();
        assert_eq!(held, holds, "productive_batches={param}: {half:?} then {over:?}");
    }
}

#[test]
fn the_papers_rules_stay_parameters_away_and_fall_off() {
    // FLEX checking the end-to-end deadline at every stage with the paper's window, and
    // QUART never dropping, as their papers do (single-stage GPUs; pipelines that are
    // never overloaded for long): the cliff the defaults avoid. (Twice the capacity:
    // FLEX serves the bound itself now that it spreads the whole cluster. Since issue
    // 43's freshest window and one dispatch per stage and instant, either keeps FLEX
    // off the cliff here without the reserve: the paper's rules are all three.)
    let chain = pipeline("vision-chain");
    let flex: &[(&str, &str)] = &[("downstream_reserve", "0"), ("fresh_window", "false"), ("coalesce", "false")];
    let quart: &[(&str, &str)] = &[("drop_unreachable", "false")];
    for (policy, params) in [("flex", flex), ("quart", quart)] {
        let half = run_at(policy, &chain, 0.5, DURATION_NS, params);
        let over = run_at(policy, &chain, 2.0, DURATION_NS, params);
        assert!(over.goodput < CLIFF_FRACTION * half.goodput, "{policy} with {params:?}: {half:?} then {over:?}");
    }
}

#[test]
fn pard_provisions_each_branch_of_a_fan_out_for_what_it_receives() {
    // traffic-dag's detector sends 3 cars and 0.5 faces per frame, but a policy only
    // sees its total fan-out (3.5): the shared planner split it evenly (1.75 each) and
    // gave the cars branch one replica at a quarter of capacity (373 frames/s for 400
    // offered). It now plans each stage for the pieces it measured there. Before: 95.3 %
    // on time over 30 s; here 12 s, two scaling epochs.
    let dag = pipeline("traffic-dag");
    let point = run_at("pard", &dag, 0.25, 12_000_000_000, &[]);
    assert!(point.on_time >= LOW_LOAD_ON_TIME, "{point:?}");
}

#[test]
fn loki_has_no_cliff_on_the_vision_chain() {
    // Before: 3,206/s at 1×, 104/s at 2× and 63/s at 5× (20 s runs): its deadline rule
    // kept every request the path below could serve on time *without queueing*, so
    // past capacity they ended late at the next stage. Past the cluster's reach (a
    // capped plan) it now drops on the per-task budget, as the paper does. (Its
    // low-load property is tested on its own application, `loki_sim`: the preset starts
    // with half the bound's workers, all busy at 0.5×, and over 20 s Loki is 99.2 % on
    // time there.)
    let chain = pipeline("vision-chain");
    let points: Vec<Point> = [1.0, 2.0, 5.0].iter().map(|&load| run_at("loki", &chain, load, 4_000_000_000, &[])).collect();
    for point in &points[1..] {
        assert!(point.goodput >= CLIFF_FRACTION * points[0].goodput, "a cliff: {points:?}");
    }
}

#[test]
fn loki_plans_its_first_traffic_within_an_event_call_s_budget() {
    // Loki plans 100 ms after the first request, in a call of request events (a
    // fiftieth of a tick's fuel under the default limits). At a quarter of the traffic
    // application's bound (875 requests/s) that plan needs the MILP; its first slice
    // used to run in that call, ran out of fuel, and the host's FIFO fallback served
    // the rest of the run (0.2 requests/s on time). The slice now waits for the tick.
    let application = loki_application();
    let point = run_at("loki", &application, 0.25, 5_000_000_000, &[]);
    assert!(point.on_time >= 0.9, "{point:?}");
}

#[test]
fn loki_replans_once_a_guessed_fan_out_is_measured() {
    // A variant not yet seen serving gets its task's observed child shares as its
    // fan-out split; on the traffic application those were the start-up detectors'
    // (0.04 of the detections are faces), so the first plan, which picked the small
    // detector (0.23 are faces: 0.6 a frame), gave face recognition one worker for
    // 0.09 faces a frame. Past the cluster's reach it kept that plan (its demand said
    // it served the most the cluster could): 0.54 of the bound at 5×. Loki now
    // re-plans once the hosted variant's fan-out is measured and a task below it gets
    // more than the plan was sized for.
    let application = loki_application();
    let point = run_at("loki", &application, 5.0, 4_000_000_000, &[]);
    let bound = capacity(&application).unwrap();
    assert!(point.goodput >= 0.7 * bound, "{:.0} on-time requests/s of a bound of {bound:.0}: {point:?}", point.goodput);
}

#[test]
fn loki_keeps_the_cluster_s_first_workers_until_it_has_planned_for_traffic() {
    // Loki's plan at start is for no demand (one worker per task): it retired all but
    // five of five-stage's 64 start-up workers, then 100 ms later planned for the
    // traffic and started 45 again — the first second dropped 240 of ~1,700 requests
    // at a quarter of the bound (98.5 % on time over 10 s). It now scales down only
    // once it has planned for traffic.
    let point = run_at("loki", &pipeline("five-stage"), 0.25, 2_000_000_000, &[]);
    assert!(point.on_time >= LOW_LOAD_ON_TIME, "{point:?}");
}

#[test]
fn loki_and_quart_are_on_time_at_low_load_on_loki_s_application() {
    // The import started one worker per task, 4 of the 32 the bound counts, so every
    // policy's first seconds went to starting the rest: over 10 s at a quarter of the
    // bound Loki was 97.1 % on time and QUART 89.8 % (at half, Loki 93.9 %). Loki's
    // cluster is a fixed set of GPUs serving from the start; the import now starts
    // eight workers a task (the sink one). (At half the bound Loki dips while a re-plan
    // switches variants, 99.3 % over 20 s with this seed; QUART's detectors start
    // below what half the bound needs, docs/quart.md.)
    let application = loki_application();
    for (policy, load) in [("loki", 0.25), ("quart", 0.25)] {
        let point = run_at(policy, &application, load, 8_000_000_000, &[]);
        assert!(point.on_time >= LOW_LOAD_ON_TIME, "{policy} at {load}×: {point:?}");
    }
}

#[test]
fn quart_fits_its_batches_to_the_slo() {
    // Loki's traffic application allows batches of 64 frames (959 ms at the detector)
    // under a 250 ms SLO: with its batch limits at the pipeline's largest batch, QUART
    // held every request unreachable and dropped all of them. It now caps each stage's
    // batch at the largest that fits the stage's share of the SLO; `fit_batches=false`
    // runs the configured batches, as the paper does.
    let application = loki_application();
    // Over 3 s its start-up weighs: 40 % on time (60 % over 5 s, 73 % over 10 s).
    let configured = run_at("quart", &application, 0.25, 3_000_000_000, &[("fit_batches", "false")]);
    let fitted = run_at("quart", &application, 0.25, 3_000_000_000, &[]);
    assert!(configured.on_time < 0.01, "{configured:?}");
    assert!(fitted.on_time > 0.3, "{fitted:?}");
}

#[test]
fn quart_batches_at_the_detector_s_sweet_spot() {
    // The largest batch that fits the detector's share of the SLO (12 frames of
    // `yolov5n`, 94 frames/s a replica) serves fewer than a batch of 3 (176 frames/s):
    // QUART at r_max replicas served about 600 requests/s at every load. Capped at the
    // most productive batch it serves about 1,200; over 3 s at 2× (start-up included)
    // 0.21 of the bound, 0.07 before.
    let application = loki_application();
    let over = run_at("quart", &application, 2.0, 3_000_000_000, &[]);
    let bound = capacity(&application).unwrap();
    assert!(over.goodput >= 0.15 * bound, "{over:?} of a bound of {bound:.0}/s");
}

#[test]
fn quart_scales_a_stage_past_the_authors_r_max() {
    // The authors' code caps every stage at 8 replicas: on Loki's traffic application
    // that holds the detector at 8 × 176 frames/s, 0.40 of the bound at any load past
    // half of it (80.7 % on time at 0.5×). QUART's `r_max` is now the cluster's size
    // (the stage's own bound and the free workers cap it): 0.58 of the bound past
    // capacity. `r_max=8` is the failing arm. (Started eight a task, as the import did:
    // spread by need, the import starts 15 detectors, and the cap does not bind.)
    let application = loki_application_eight_a_task();
    let bound = capacity(&application).unwrap();
    let authors = run_at("quart", &application, 2.0, 3_000_000_000, &[("r_max", "8")]);
    let cluster = run_at("quart", &application, 2.0, 3_000_000_000, &[]);
    assert!(authors.served() < 0.45, "r_max=8: {authors:?} of a bound of {bound:.0}/s");
    assert!(cluster.served() >= 0.5, "{cluster:?} of a bound of {bound:.0}/s");
}

#[test]
fn quart_scales_at_its_first_arrivals_not_its_first_tick() {
    // The host's first tick comes one tick interval (1 s) after start: until then QUART
    // served half of Loki's traffic application's bound on the eight detectors the
    // import starts (1,408 frames/s of 1,754), 98.0 % on time over 10 s. Its first
    // control now runs 100 ms after the first arrival; `first_control_ms=0` (the
    // paper's periodic controller only) is the failing arm. (Started eight a task, as
    // the import did: spread by need, the start alone serves the first second.)
    let application = loki_application_eight_a_task();
    let early = run_at("quart", &application, 0.5, 3_000_000_000, &[]);
    let at_tick = run_at("quart", &application, 0.5, 3_000_000_000, &[("first_control_ms", "0")]);
    assert!(early.on_time >= LOW_LOAD_ON_TIME, "{early:?}");
    assert!(at_tick.on_time < LOW_LOAD_ON_TIME, "first_control_ms=0: {at_tick:?}");
}

#[test]
fn loki_plans_and_serves_five_stage_within_an_event_call_s_budget() {
    // On `five-stage` from 0.63× its bound, Loki and the InferLine-like baseline ran out
    // of an event call's fuel and the host's FIFO fallback served: the first plan
    // (100 ms after the first request, in a call of request events) searched every
    // batch vector for the fastest plan's capacity (148 M fuel of 50 M), and later the
    // per-query routing memory, a hash map emptied every few seconds, re-hashed all
    // its entries at each doubling in one call (63 M at 4,800 requests/s after 5 s).
    // The search now passes over batch vectors that cannot beat the best so far, and
    // the memory is a B-tree. `run_at` asserts neither policy faulted.
    let five = pipeline("five-stage");
    for policy in ["loki", "loki-inferline"] {
        let point = run_at(policy, &five, 0.75, 9_000_000_000, &[]);
        assert!(point.on_time >= 0.9, "{policy}: {point:?}");
    }
}
