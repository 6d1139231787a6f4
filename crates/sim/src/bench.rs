//! Simulator throughput (`yardmaster sim bench`): events per second per core with
//! `edf`, and the wall time of simulated time on the 64-GPU five-stage pipeline at
//! 1,000 requests/s. The simulator is single-threaded, so events per second is per core.
//!
//! Beside them, the same run times a fixed native loop ([`native_reference`]): the
//! cluster hour's policy events per second divided by the loop's operations per second
//! is a ratio that does not move with the machine's speed, which `sim bench --check`
//! compares against the floor written in the repository.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Result;

use super::{compare, executor::SimExecutorOptions, PolicySpec, SimSpec};
use yardmaster_engine::EngineOptions;
use yardmaster_formats::{presets, WorkloadSpec};
use yardmaster_policy::{Limits, Mode, PolicyLoader, Sandbox};

/// What one `sim bench` run measured.
#[derive(Debug, Clone)]
pub struct BenchOutcome {
    /// The lines to print.
    pub text: String,
    /// Policy events per second of the exact cluster hour (no decision interval).
    pub cluster_policy_events_per_s: f64,
    /// Operations per second of [`native_reference`] in the same run.
    pub native_ops_per_s: f64,
}

impl BenchOutcome {
    /// Policy events per second ÷ the native loop's operations per second.
    pub fn ratio(&self) -> f64 {
        self.cluster_policy_events_per_s / self.native_ops_per_s.max(1e-9)
    }
}

/// A fixed native loop standing in for the machine's speed: pops and pushes on a binary
/// heap of 4,096 pseudo-random times (the shape of an event queue's work), for about a
/// third of a second; returns operations per second.
pub fn native_reference() -> f64 {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<u64>> = (0..4096).map(|_| std::cmp::Reverse(next() >> 16)).collect();
    let started = std::time::Instant::now();
    let mut operations = 0u64;
    while started.elapsed() < std::time::Duration::from_millis(330) {
        for _ in 0..10_000 {
            let std::cmp::Reverse(at) = heap.pop().expect("never empty");
            heap.push(std::cmp::Reverse(at + (next() >> 40)));
        }
        operations += 10_000;
    }
    std::hint::black_box(&heap);
    operations as f64 / started.elapsed().as_secs_f64()
}

/// Run both measurements and describe them.
pub fn run(cluster_seconds: u64) -> Result<String> {
    measure(cluster_seconds).map(|outcome| outcome.text)
}

/// Run both measurements and the native reference.
pub fn measure(cluster_seconds: u64) -> Result<BenchOutcome> {
    let native_before = native_reference();
    let mut cluster_policy_events_per_s = 0.0;
    let sandbox = Sandbox::new(Mode::Simulate, Limits::default())?;
    let loader = PolicyLoader::new(sandbox, None);
    let artifact = yardmaster_policy_artifacts::shipped("edf").expect("edf is shipped");
    let policy = PolicySpec { name: "edf".into(), bytes: Arc::new(artifact.bytes.to_vec()) };
    let mut out = String::new();

    for (label, pipeline, rate, seconds, decision_interval) in [
        ("throughput", "vision-chain", 1_500.0, 120u64, 0),
        ("cluster hour", "five-stage", 1_000.0, cluster_seconds, 0),
        ("cluster hour", "five-stage", 1_000.0, cluster_seconds, 1_000_000),
    ] {
        let spec = SimSpec {
            pipeline: presets::pipeline(pipeline).map_err(anyhow::Error::msg)?,
            seed: 1,
            duration: seconds * 1_000_000_000,
            executor: SimExecutorOptions::default(),
            engine: EngineOptions::default(),
            decision_interval,
            capture_dir: None,
        };
        let workload = WorkloadSpec::Preset { name: "poisson".into(), rate };
        eprintln!("{label}: {pipeline}, {rate} req/s for {seconds} simulated s …");
        let outcome = compare(&spec, &workload, std::slice::from_ref(&policy), &loader, |_, _| {})?.pop().expect("one run");
        let wall = outcome.wall.as_secs_f64();
        if label == "cluster hour" && decision_interval == 0 {
            cluster_policy_events_per_s = outcome.engine.events as f64 / wall;
        }
        let workers = spec.pipeline.stages.iter().map(|s| s.replicas).sum::<u32>();
        writeln!(
            out,
            "{label:<13} {pipeline} ({workers} workers), {rate} req/s, {seconds} s simulated, decision interval {} µs: {:.2} s wall, \
             {} simulator events ({:.2} M/s), {} policy events in {} calls ({:.2} M/s), goodput {:.0}/s",
            decision_interval / 1_000,
            wall,
            outcome.events,
            outcome.events as f64 / wall / 1e6,
            outcome.engine.events,
            outcome.engine.flushes,
            outcome.engine.events as f64 / wall / 1e6,
            outcome.report.summary.overall.goodput,
        )?;
    }
    // Before and after, so a machine that changed speed mid-run shows in the figure.
    let native_ops_per_s = (native_before + native_reference()) / 2.0;
    let outcome = BenchOutcome { text: out, cluster_policy_events_per_s, native_ops_per_s };
    let ratio = outcome.ratio();
    let mut text = outcome.text.clone();
    writeln!(
        text,
        "native reference: {:.2} M heap operations/s; cluster-hour policy events ÷ native operations = {ratio:.4}",
        native_ops_per_s / 1e6
    )?;
    Ok(BenchOutcome { text, ..outcome })
}
