//! Simulator throughput (`yardmaster sim bench`): events per second per core with
//! `edf`, and the wall time of simulated time on the 64-GPU five-stage pipeline at
//! 1,000 requests/s. The simulator is single-threaded, so events per second is per core.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Result;

use super::{compare, executor::SimExecutorOptions, PolicySpec, SimSpec};
use yardmaster_engine::EngineOptions;
use yardmaster_formats::{presets, WorkloadSpec};
use yardmaster_policy::{Limits, Mode, PolicyLoader, Sandbox};

/// Run both measurements and describe them.
pub fn run(cluster_seconds: u64) -> Result<String> {
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
    Ok(out)
}
