//! Loki and its baselines as components in the simulator, on Loki's
//! traffic-analysis pipeline.

use yardmaster::engine::EngineOptions;
use yardmaster::formats::workload::RateSchedule;
use yardmaster::policy::contract::Param;
use yardmaster::sim::executor::SimExecutorOptions;
use yardmaster::sim::reproduce::loki::{data_dir, traffic_pipeline, CLUSTER};
use yardmaster::sim::reproduce::{shipped, simulation_loader};
use yardmaster::sim::{run, RunOutcome, SimSpec};

fn simulate(policy: &str, rates: &[(f64, u64)], params: &[(&str, &str)]) -> RunOutcome {
    let pipeline = traffic_pipeline(&data_dir(), CLUSTER, 500.0).unwrap();
    let mut text = String::new();
    for &(rate, seconds) in rates {
        for _ in 0..seconds {
            text.push_str(&format!("{rate}\n"));
        }
    }
    let schedule = RateSchedule::parse(&text).unwrap();
    let engine = EngineOptions {
        params: params.iter().map(|(k, v)| Param { key: k.to_string(), value: v.to_string() }).collect(),
        ..EngineOptions::default()
    };
    let spec = SimSpec {
        pipeline,
        seed: 1,
        duration: schedule.duration(),
        executor: SimExecutorOptions::default(),
        engine,
        decision_interval: 0,
        capture_dir: None,
    };
    let loader = simulation_loader().unwrap();
    run::run(&spec, &shipped(policy, policy).unwrap(), &loader, schedule.arrivals(1), &mut |_| {}).unwrap()
}

fn violations(out: &RunOutcome) -> f64 {
    let o = &out.report.summary.overall.outcomes;
    1.0 - o.on_time as f64 / o.ended().max(1) as f64
}

#[test]
fn past_the_hardware_capacity_loki_trades_accuracy_for_throughput() {
    // Properties 2, 3 and 11 in simulation: 40 QPS, then twice the hardware-only
    // capacity of the 20-GPU cluster (≈ 200 QPS at 500 ms).
    // The paper's hardware scaling (no slack), as the reproduction runs it.
    let rates = [(40.0, 10), (420.0, 20)];
    let paper = [("headroom", "1.2"), ("hardware_slack", "1")];
    let loki = simulate("loki", &rates, &paper);
    let inferline = simulate("loki-inferline", &rates, &paper);
    let (l, i) = (&loki.report.summary.overall, &inferline.report.summary.overall);
    assert!(loki.arm.faults.is_empty() && inferline.arm.faults.is_empty(), "{:?} {:?}", loki.arm.faults, inferline.arm.faults);
    assert!(l.goodput > 1.5 * i.goodput, "Loki serves more: {} vs {}", l.goodput, i.goodput);
    assert!(violations(&loki) < violations(&inferline) / 2.0, "{} vs {}", violations(&loki), violations(&inferline));
    assert!(l.accuracy < i.accuracy, "Loki lowers accuracy: {} vs {}", l.accuracy, i.accuracy);
    assert!(i.accuracy > 0.99, "InferLine keeps the most accurate variants");
    // Off-peak Loki used few workers; at the peak, the whole cluster.
    let workers = |out: &RunOutcome, from: u64, to: u64| {
        let w: Vec<f64> = out
            .report
            .windows
            .iter()
            .filter(|w| w.start >= from * 1_000_000_000 && w.start < to * 1_000_000_000)
            .map(|w| w.active_workers)
            .collect();
        w.iter().sum::<f64>() / w.len().max(1) as f64
    };
    assert!(workers(&loki, 5, 10) < 10.0, "off-peak: {}", workers(&loki, 5, 10));
    assert!(workers(&loki, 20, 30) > 18.0, "peak: {}", workers(&loki, 20, 30));
}

// Byte-identical reports on a busy machine, Loki's flavours on their ramp past the
// hardware capacity included: `every_policy.rs`.

/// On-time requests per second and the on-time share of the requests that ended,
/// over the windows from `from_s` on.
fn steady(out: &RunOutcome, from_s: u64) -> (f64, f64) {
    let windows: Vec<_> = out.report.windows.iter().filter(|w| w.start >= from_s * 1_000_000_000 && w.duration >= 1_000_000_000).collect();
    let on_time: u64 = windows.iter().map(|w| w.outcomes.on_time).sum();
    let ended: u64 = windows.iter().map(|w| w.outcomes.ended()).sum();
    (on_time as f64 / windows.len().max(1) as f64, on_time as f64 / ended.max(1) as f64)
}

#[test]
fn loki_is_on_time_at_low_load() {
    // Low load (50 QPS, under 3 % of the cluster's capacity at the fastest variants):
    // at least 99 % on time once the first plan is in force.
    let low = simulate("loki", &[(50.0, 16)], &[]);
    let (_, attainment) = steady(&low, 6);
    assert!(attainment >= 0.99, "on time at 50 QPS: {attainment}");
}

#[test]
fn loki_is_on_time_at_150_qps() {
    let low = simulate("loki", &[(150.0, 16)], &[]);
    let (_, attainment) = steady(&low, 6);
    assert!(attainment >= 0.99, "on time at 150 QPS: {attainment}");
}

#[test]
fn loki_has_no_cliff_past_its_peak() {
    // Once and five times the cluster's capacity at the fastest variants (about 1,800
    // QPS): the fastest plan's capacity is served.
    let peak = simulate("loki", &[(1800.0, 10)], &[]);
    let over = simulate("loki", &[(9000.0, 10)], &[]);
    let (best, _) = steady(&peak, 5);
    let (overloaded, _) = steady(&over, 5);
    assert!(overloaded >= 0.9 * best, "no cliff: {overloaded} on-time QPS at 5× against {best}");
}

/// A sweep of `policy` on the traffic application at SLO `slo_ms`: one cell, 4 s of
/// Poisson arrivals at 0.05 × the capacity bound.
fn sweep_cell(policy: &str, slo_ms: f64) -> yardmaster::sim::sweep::CellResult {
    use yardmaster::sim::sweep::{run_sweep, Shape, SweepPlan, SweptPipeline};
    let pipeline = traffic_pipeline(&data_dir(), CLUSTER, slo_ms).unwrap();
    let base = SimSpec {
        pipeline: pipeline.clone(),
        seed: 1,
        duration: 0,
        executor: SimExecutorOptions::default(),
        engine: EngineOptions::default(),
        decision_interval: 0,
        capture_dir: None,
    };
    let plan = SweepPlan {
        policies: vec![shipped(policy, policy).unwrap()],
        pipelines: vec![SweptPipeline { name: format!("traffic-{slo_ms}ms"), pipeline }],
        loads: vec![0.05],
        shapes: vec![Shape::parse("poisson").unwrap()],
        seeds: vec![1],
        duration_s: 4.0,
        base,
    };
    let mut outcome = run_sweep(&plan, &simulation_loader().unwrap(), |_| {}).unwrap();
    assert_eq!(outcome.cells.len(), 1);
    outcome.cells.pop().unwrap()
}

#[test]
fn an_infeasible_plan_shows_in_the_compare_report_and_the_sweep() {
    // At an SLO of 20 ms no variant set meets the per-path cap (10 ms: the detector
    // alone takes longer at batch 1); at 500 ms every plan is feasible.
    let run = |slo_ms: f64| {
        let pipeline = traffic_pipeline(&data_dir(), CLUSTER, slo_ms).unwrap();
        let schedule = RateSchedule::parse(&"40\n".repeat(6)).unwrap();
        let spec = SimSpec {
            pipeline,
            seed: 1,
            duration: schedule.duration(),
            executor: SimExecutorOptions::default(),
            engine: EngineOptions::default(),
            decision_interval: 0,
            capture_dir: None,
        };
        let loader = simulation_loader().unwrap();
        run::run(&spec, &shipped("loki", "loki").unwrap(), &loader, schedule.arrivals(1), &mut |_| {}).unwrap()
    };
    let infeasible = run(20.0);
    let feasible = run(500.0);
    let (bad, good) = (&infeasible.report.health, &feasible.report.health);
    assert!(bad.faults.is_empty() && good.faults.is_empty(), "{:?} {:?}", bad.faults, good.faults);
    assert!(bad.plans > 0 && good.plans > 0, "both planned: {bad:?} {good:?}");
    assert_eq!(bad.infeasible_plans, bad.plans, "every plan at 20 ms is infeasible: {bad:?}");
    assert!(bad.fell_back());
    assert_eq!(good.infeasible_plans, 0, "{good:?}");
    assert!(!good.fell_back());
    assert_eq!(infeasible.arm.infeasible_plans(), bad.infeasible_plans);
    assert!(infeasible.arm.metrics.contains_key("loki.demand"), "the arm collects every metric: {:?}", infeasible.arm.metrics.keys());

    let mut bad_report = infeasible.report.clone();
    bad_report.policy = "loki-20ms".into();
    let table = yardmaster::sim::report::render_table(&[bad_report, feasible.report.clone()]);
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|h| !h.is_empty()).collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name:?} column:\n{table}"));
    let cells: Vec<Vec<&str>> = lines[2..].iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(cells[0][at("fell back")], "yes", "{table}");
    assert_eq!(cells[0][at("infeasible")], bad.infeasible_plans.to_string(), "{table}");
    assert_eq!(cells[1][at("fell back")], "no", "{table}");
    assert_eq!(cells[1][at("infeasible")], "0", "{table}");

    // The sweep's fallback flag counts it.
    let bad_cell = sweep_cell("loki", 20.0);
    assert!(bad_cell.fell_back && bad_cell.infeasible_plans > 0 && bad_cell.faults == 0, "{bad_cell:?}");
    let good_cell = sweep_cell("loki", 500.0);
    assert!(!good_cell.fell_back && good_cell.infeasible_plans == 0, "{good_cell:?}");
}
