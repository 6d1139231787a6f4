//! The spec's testable properties (§7) on its toy chain (`T1 → T2`, `S = 10`,
//! `L = 200 ms`), checked against the planners and, for the control cadence, the
//! policy driven natively by scripted events.

use yardmaster_sdk::{Driver, Event, NullHost, Request, Snapshot, Worker};

use crate::model::{toy, Factors, PipelineModel};
use crate::plan::{Plan, Regime};
use crate::planner::{resource_manager, PlanRequest, SolverLimits};
use crate::runtime::{LokiFlavour, LokiPolicy};
use crate::single_path::hardware_scaling;
use crate::step2::{Goal, Step2};

fn exact_plan(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64) -> Plan {
    let request = PlanRequest {
        model,
        factors,
        demand,
        cluster: 10,
        cap_ms,
        limits: SolverLimits { max_nodes: 100_000, max_pivots: 50_000_000, ..SolverLimits::default() },
        previous: None,
        fill_spare: false,
        slack: 1.0,
    };
    resource_manager(&request).0
}

fn uses(plan: &Plan, task: usize, variant: usize) -> bool {
    plan.hosts.iter().any(|h| h.task == task && h.variant == variant && h.replicas > 0 && h.load > 1e-6)
}

#[test]
fn hardware_scaling_is_monotone_and_below_the_cluster() {
    // Property 1.
    let (model, factors) = toy::chain_model();
    let mut last = 0;
    for demand in (1..=128).map(|i| i as f64 * 5.0) {
        let plan = hardware_scaling(&model, &factors, demand, 100.0, 10).expect("feasible up to 640 QPS");
        assert!(plan.workers() >= last, "D = {demand}");
        assert!(plan.workers() <= 10);
        assert_eq!(plan.accuracy, 1.0);
        last = plan.workers();
    }
}

#[test]
fn accuracy_scaling_starts_where_hardware_scaling_ends_and_uses_the_whole_cluster() {
    // Property 2.
    let (model, factors) = toy::chain_model();
    let before = exact_plan(&model, &factors, 640.0, 100.0);
    assert_eq!((before.regime, before.accuracy), (Regime::Hardware, 1.0));
    let after = exact_plan(&model, &factors, 645.0, 100.0);
    assert_eq!(after.regime, Regime::Accuracy);
    assert!(after.accuracy < 1.0);
    assert_eq!(after.workers(), 10);
}

#[test]
fn accuracy_falls_with_demand_downstream_first_and_feasibility_is_downward_closed() {
    // Properties 3 and 4, and 6 (constraint soundness) on every plan of the sweep.
    let (model, factors) = toy::chain_model();
    let mut last_accuracy = 1.0;
    let mut first_c_lo = None;
    let mut first_d_lo = None;
    let mut previous: Option<Plan> = None;
    for demand in (26..=52).map(|i| i as f64 * 25.0) {
        let plan = exact_plan(&model, &factors, demand, 100.0);
        assert!(plan.accuracy <= last_accuracy + 1e-9, "D = {demand}: {} after {last_accuracy}", plan.accuracy);
        last_accuracy = plan.accuracy;
        if uses(&plan, 1, 1) {
            first_c_lo.get_or_insert(demand);
        }
        if uses(&plan, 0, 1) {
            first_d_lo.get_or_insert(demand);
        }
        // Soundness: capacity covers the planned load, Σx ≤ S, used paths meet L/2.
        assert!(plan.workers() <= 10);
        for h in &plan.hosts {
            let b = model.batches.iter().position(|&x| x == h.batch).unwrap();
            let capacity = h.replicas as f64 * model.tasks[h.task].variants[h.variant].throughput(b, &model.batches);
            assert!(h.load <= capacity * (1.0 + 1e-6) + 1e-6, "D = {demand}: {h:?} over capacity {capacity}");
        }
        for a in plan.hosts.iter().filter(|h| h.task == 0 && h.load > 1e-6) {
            for c in plan.hosts.iter().filter(|h| h.task == 1 && h.load > 1e-6) {
                let latency = |h: &crate::plan::Hosting| {
                    model.tasks[h.task].variants[h.variant].latency_ms[model.batches.iter().position(|&x| x == h.batch).unwrap()]
                };
                let both = latency(a) + latency(c);
                // Both carry load; in a chain some flow goes from each upstream to some
                // downstream variant, so at least the combination through the slower
                // pair must be a permitted path whenever both are on every path.
                if plan.hosts.iter().filter(|h| h.task == 1 && h.load > 1e-6).count() == 1 {
                    assert!(both <= 100.0 + 1e-9, "D = {demand}: used path of {both} ms");
                }
            }
        }
        // A plan feasible at D is feasible at a lower demand.
        if let Some(prev) = &previous {
            let step = Step2::build(&model, &factors, 10, 100.0, Goal::Accuracy { demand: demand - 25.0 }).unwrap();
            if prev.regime == Regime::Accuracy {
                let point = step.point_of(&model, 100.0, &plan).expect("the plan serves a lower demand too");
                assert!(step.problem.is_feasible(&point, 1e-6));
            }
        }
        previous = Some(plan);
    }
    let (c, d) = (first_c_lo.expect("C_lo used"), first_d_lo.expect("D_lo used"));
    assert!(c <= d, "the downstream stage downgrades first ({c} vs {d})");
    // The spec's exact solve first uses C_lo at 645 QPS (we: at the first step past
    // the hardware capacity). It first uses D_lo at 890 QPS; our optimum already
    // routes 40 QPS through D_lo at 675 QPS (accuracy 0.949, above the 0.946 the spec
    // gives at 700 QPS), a different optimum of the integer program.
    assert_eq!(c, 650.0, "C_lo from the first step past 640 QPS");
}

#[test]
fn the_cluster_runs_out_near_3_4_times_the_hardware_capacity() {
    // Property 11 on the toy: STEP2 infeasible from about 2225 QPS (≈ 3.4 × 640).
    let (model, factors) = toy::chain_model();
    assert_eq!(exact_plan(&model, &factors, 2150.0, 100.0).regime, Regime::Accuracy);
    let beyond = exact_plan(&model, &factors, 2300.0, 100.0);
    assert_eq!(beyond.regime, Regime::Capped);
    assert!(beyond.demand > 2150.0 && beyond.demand < 2300.0, "largest feasible demand {}", beyond.demand);
}

#[test]
fn fewer_sub_requests_need_fewer_downstream_workers() {
    // Property 5: halving the observed factor lowers T2's replicas at the next solve.
    let (model, factors) = toy::chain_model();
    let mut halved = factors.clone();
    for v in &mut halved[0] {
        for r in v.iter_mut() {
            *r /= 2.0;
        }
    }
    let full = hardware_scaling(&model, &factors, 400.0, 100.0, 10).unwrap();
    let half = hardware_scaling(&model, &halved, 400.0, 100.0, 10).unwrap();
    assert!(half.task_workers(1) < full.task_workers(1), "{} vs {}", half.task_workers(1), full.task_workers(1));
    assert_eq!(half.task_workers(0), full.task_workers(0));
    // T2's planned load is D · Σ c · r.
    let h = full.hosts.iter().find(|h| h.task == 1).unwrap();
    assert!((h.load - 400.0 * 4.0).abs() < 1e-9);
}

#[test]
fn tighter_slos_cost_workers_first_then_accuracy_then_everything() {
    // Property 7 (Fig. 8): sweep L downwards at a fixed demand.
    let (model, factors) = toy::chain_model();
    let mut last_accuracy = 1.0;
    let mut accuracy_fell_at = None;
    let mut workers_at_full_accuracy = Vec::new();
    for slo in [400.0, 300.0, 200.0, 150.0, 100.0, 80.0, 60.0, 50.0, 40.0, 30.0] {
        let plan = exact_plan(&model, &factors, 300.0, slo / 2.0);
        assert!(plan.accuracy <= last_accuracy + 1e-9, "L = {slo}");
        last_accuracy = plan.accuracy;
        if plan.accuracy >= 1.0 - 1e-9 {
            workers_at_full_accuracy.push(plan.workers());
        } else {
            accuracy_fell_at.get_or_insert(slo);
        }
    }
    assert!(workers_at_full_accuracy.windows(2).all(|w| w[1] >= w[0]), "replicas rise first: {workers_at_full_accuracy:?}");
    assert!(workers_at_full_accuracy.last() > workers_at_full_accuracy.first());
    assert!(accuracy_fell_at.is_some());
    // 2 · (fastest path at batch 1: 6 + 3 ms) > L: nothing is feasible.
    assert_eq!(exact_plan(&model, &factors, 300.0, 16.0 / 2.0).regime, Regime::Fastest);
}

fn driven() -> Driver<LokiPolicy<LokiFlavour>> {
    let mut config = toy::chain();
    let worker = |id: u32| Worker {
        id,
        stage: id,
        variant: 0,
        device: yardmaster_sdk::DeviceKind::Gpu,
        threads: 1,
        memory_bytes: 1 << 30,
        host: 0,
        slot: id,
    };
    config.workers = vec![worker(0), worker(1)];
    let (driver, _) = Driver::new(config, Box::new(NullHost::new(0, 1))).expect("init");
    driver
}

fn arrival(id: u64, at: u64) -> Event {
    Event::Arrival(Request { input_size: 1, ..yardmaster_sdk::testing::request(id, 0, at, at + 200_000_000) })
}

fn tick(at: u64) -> Event {
    Event::Tick(Snapshot { at, stages: Vec::new(), workers: Vec::new(), host_memory_used: 0, host_memory_capacity: 0, hosts: Vec::new() })
}

/// Drive `seconds` of ticks with `rate(second)` root arrivals each second.
fn drive(driver: &mut Driver<LokiPolicy<LokiFlavour>>, from: u64, seconds: u64, rate: impl Fn(u64) -> u64, next_id: &mut u64) {
    for s in from..from + seconds {
        let at = s * 1_000_000_000;
        let n = rate(s);
        let mut events = Vec::new();
        for i in 0..n {
            events.push(arrival(*next_id, at + i * (1_000_000_000 / n.max(1))));
            *next_id += 1;
        }
        driver.handle(at, events);
        driver.handle(at + 999_999_999, vec![tick(at + 999_999_999)]);
    }
}

#[test]
fn the_resource_manager_runs_every_ten_seconds_and_on_demand_jumps_and_keeps_a_steady_plan() {
    // Properties 13 and 14.
    let mut driver = driven();
    let mut id = 1;
    drive(&mut driver, 0, 12, |_| 100, &mut id);
    let runtime = driver.policy().runtime();
    let settled_plans = runtime.stats().plans;
    let plan = runtime.plan().cloned().unwrap();
    let switches = runtime.stats().switches;
    // Constant demand: periodic runs only, the same plan, no swaps.
    drive(&mut driver, 12, 30, |_| 100, &mut id);
    let runtime = driver.policy().runtime();
    let periodic = runtime.stats().plans - settled_plans;
    assert!((2..=4).contains(&periodic), "about one run per 10 s: {periodic}");
    assert!(runtime.plan().unwrap().same_allocation(&plan));
    assert_eq!(runtime.stats().switches, switches, "no variant swaps under constant demand");
    // A step up: D̂ covers 90 % of it within about 5 s, and the jump re-plans early.
    let before = runtime.stats().plans;
    drive(&mut driver, 42, 3, |_| 300, &mut id);
    let runtime = driver.policy().runtime();
    assert!(runtime.stats().plans > before, "a +20 % jump triggers the Resource Manager");
    drive(&mut driver, 45, 3, |_| 300, &mut id);
    assert!(driver.policy().runtime().demand_estimate() > 280.0, "{}", driver.policy().runtime().demand_estimate());
    assert!(driver.policy().runtime().plan().unwrap().workers() > plan.workers());
}

/// A host whose clock runs on by `step_ns` at every read, as wall time does on a busy
/// machine while a call computes.
struct RacingHost {
    now: std::sync::atomic::AtomicU64,
    step_ns: u64,
    inner: NullHost,
}

impl yardmaster_sdk::Host for RacingHost {
    fn now(&self) -> u64 {
        self.now.fetch_add(self.step_ns, std::sync::atomic::Ordering::Relaxed)
    }
    fn log(&self, level: yardmaster_sdk::Level, message: &str) {
        self.inner.log(level, message)
    }
    fn profile(&self, stage: u32, variant: u32, batch: u32) -> Option<u64> {
        self.inner.profile(stage, variant, batch)
    }
    fn emit(&self, name: &str, value: f64) {
        self.inner.emit(name, value)
    }
    fn random(&self) -> u64 {
        self.inner.random()
    }
}

/// Every action of a run past the hardware capacity (the MILP runs), with a clock
/// that advances `step_ns` per read.
fn actions_under_clock(step_ns: u64) -> (Vec<String>, crate::runtime::RuntimeStats) {
    let mut config = toy::chain();
    config.workers = driven().ctx().config().workers.clone();
    let host = RacingHost { now: 0.into(), step_ns, inner: NullHost::new(0, 1) };
    let (mut driver, first) = Driver::<LokiPolicy<LokiFlavour>>::new(config, Box::new(host)).expect("init");
    let mut log = vec![format!("{first:?}")];
    let mut id = 1;
    for s in 0..25u64 {
        let at = s * 1_000_000_000;
        let n = if s < 5 { 300 } else { 1200 };
        let events = (0..n).map(|i| arrival(id + i, at + i * (1_000_000_000 / n))).collect();
        id += n;
        log.push(format!("{:?}", driver.handle(at, events)));
        log.push(format!("{:?}", driver.handle(at + 999_999_999, vec![tick(at + 999_999_999)])));
    }
    (log, driver.policy().runtime().stats().clone())
}

#[test]
fn the_milp_budget_is_work_not_time_so_a_run_does_not_depend_on_the_machine() {
    // The same inputs give the same actions whether the host's clock stands still
    // within a call (the simulator) or races ahead (1 ms per read: a busy machine).
    let (frozen, stats) = actions_under_clock(0);
    assert!(stats.solves > 0 && stats.slices > 0, "the MILP ran: {stats:?}");
    let (racing, racing_stats) = actions_under_clock(1_000_000);
    assert_eq!(stats, racing_stats);
    assert!(frozen == racing, "actions differ under a racing clock");
}

/// A host that keeps the log lines and metrics a policy sends it.
#[derive(Default)]
struct RecordingHost {
    logs: std::sync::Arc<std::sync::Mutex<Vec<(yardmaster_sdk::Level, String)>>>,
    metrics: std::sync::Arc<std::sync::Mutex<Vec<(String, f64)>>>,
}

impl yardmaster_sdk::Host for RecordingHost {
    fn now(&self) -> u64 {
        0
    }
    fn log(&self, level: yardmaster_sdk::Level, message: &str) {
        self.logs.lock().unwrap().push((level, message.to_string()));
    }
    fn profile(&self, _: u32, _: u32, _: u32) -> Option<u64> {
        None
    }
    fn emit(&self, name: &str, value: f64) {
        self.metrics.lock().unwrap().push((name.to_string(), value));
    }
    fn random(&self) -> u64 {
        7
    }
}

/// Drive flavour `F` on the toy chain with SLO `slo_ms` at 100 QPS for 12 s: its
/// infeasible-plan count, warnings and `loki.plan_infeasible` values.
fn infeasibility<F: crate::runtime::Flavour>(slo_ms: u64) -> (u64, Vec<String>, Vec<f64>) {
    let mut config = toy::chain();
    config.streams[0].slo = slo_ms * 1_000_000;
    config.workers = driven().ctx().config().workers.clone();
    let host = RecordingHost::default();
    let (logs, metrics) = (host.logs.clone(), host.metrics.clone());
    let (mut driver, _) = Driver::<LokiPolicy<F>>::new(config, Box::new(host)).expect("init");
    let mut id = 1;
    for s in 0..12u64 {
        let at = s * 1_000_000_000;
        let events = (0..100).map(|i| arrival(id + i, at + i * 10_000_000)).collect();
        id += 100;
        driver.handle(at, events);
        driver.handle(at + 999_999_999, vec![tick(at + 999_999_999)]);
    }
    let warnings = logs
        .lock()
        .unwrap()
        .iter()
        .filter(|(l, m)| *l == yardmaster_sdk::Level::Warn && m.contains("infeasible"))
        .map(|(_, m)| m.clone())
        .collect();
    let values = metrics.lock().unwrap().iter().filter(|(n, _)| n == "loki.plan_infeasible").map(|(_, v)| *v).collect();
    (driver.policy().runtime().stats().infeasible_plans, warnings, values)
}

#[test]
fn a_plan_that_cannot_meet_the_slo_is_reported_never_silent() {
    use crate::runtime::{InferLineFlavour, ProteusFlavour};
    // SLO 30 ms (per-path cap 15 ms): the most accurate path takes 15 + 7 = 22 ms at
    // batch 1, so the InferLine-like baseline has no plan and runs the fastest
    // variants; Loki still has one (D_lo with C_hi, 6 + 7 ms).
    let (count, warnings, values) = infeasibility::<InferLineFlavour>(30);
    assert!(count > 0 && values.contains(&1.0), "{count} {values:?}");
    assert_eq!(warnings.len(), 1, "one warning when it starts: {warnings:?}");
    assert!(warnings[0].contains("30 ms"), "{}", warnings[0]);
    let (count, warnings, values) = infeasibility::<LokiFlavour>(30);
    assert_eq!((count, warnings.len()), (0, 0));
    assert!(!values.is_empty() && values.iter().all(|&v| v == 0.0));
    // SLO 16 ms (cap 8 ms): not even the fastest path (6 + 3 ms) fits; every flavour says so.
    for (count, warnings, _) in [infeasibility::<LokiFlavour>(16), infeasibility::<ProteusFlavour>(4)] {
        assert!(count > 0 && !warnings.is_empty(), "{count} {warnings:?}");
    }
    // A feasible SLO: no report.
    let (count, warnings, _) = infeasibility::<InferLineFlavour>(200);
    assert_eq!((count, warnings.len()), (0, 0));
}
