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

/// The JSON and CSV reports of the three Loki policies on a ramp past the hardware
/// capacity (the MILP runs), with `spinners` threads keeping the cores busy meanwhile.
fn loki_reports(spinners: usize) -> Vec<(String, Vec<u8>)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let spinning: Vec<_> = (0..spinners)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let rates = [(60.0, 3), (900.0, 7)];
    let reports: Vec<_> = ["loki", "loki-inferline", "loki-proteus"]
        .iter()
        .map(|p| {
            let out = simulate(p, &rates, &[]);
            assert!(out.arm.faults.is_empty(), "{p}: {:?}", out.arm.faults);
            out.report
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for t in spinning {
        t.join().unwrap();
    }
    let dir = std::env::temp_dir().join(format!("yardmaster-loki-determinism-{}-{spinners}", std::process::id()));
    let mut files = yardmaster::sim::report::write_csv(&dir, &reports).unwrap();
    files.push(yardmaster::sim::report::write_json(&dir, &reports).unwrap());
    let read = files.iter().map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(f).unwrap())).collect();
    let _ = std::fs::remove_dir_all(&dir);
    read
}

#[test]
fn the_same_seed_gives_byte_identical_loki_reports_on_a_busy_machine() {
    let quiet = loki_reports(0);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy = loki_reports(2 * cores);
    assert_eq!(quiet.len(), busy.len());
    for ((name, a), (other, b)) in quiet.iter().zip(&busy) {
        assert_eq!(name, other);
        assert!(a == b, "{name} differs between a quiet and a busy machine");
    }
}

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
