//! The discrete-event simulator: the scheduling engine on a virtual clock, with a
//! latency-model executor, workloads and traces, running the very same policy
//! components the server runs (metered by fuel, so runs replay exactly).
//!
//! Its inputs — pipelines, workloads, traces — are the files of `yardmaster_formats`,
//! which the server reads and writes too.
//!
//! - [`executor`]: jobs take their profiled latency, LLM frames, fan-out, warm/cold starts;
//! - [`report`]: text table, CSV, JSON and charts comparing runs ([`report::RunReport`]);
//! - [`compound`]: compound LLM jobs submitted stage by stage as their calls complete;
//! - [`run`]: one run; [`compare`] runs several policies on the same workload and seed
//!   ([`per_core`] runs independent jobs in parallel);
//! - [`reproduce`]: the reference policies' papers re-run against their baselines;
//! - [`sweep`]: policies × pipelines × load multiples of capacity × workload shapes,
//!   with the cliffs and low-load misses flagged and a heatmap per policy;
//!   [`documented_breaks`]: where a baseline breaks by its own doc, which the sweep
//!   labels rather than fails.

#![warn(missing_docs)]

pub mod bench;
pub mod compound;
pub mod documented_breaks;
pub mod executor;
pub mod report;
pub mod reproduce;
pub mod run;
pub mod sweep;

use anyhow::{anyhow, Result};

pub use run::{PolicySpec, RunOutcome, SimSpec};
use yardmaster_formats::WorkloadSpec;

/// Run every policy on the same pipeline, workload and seed. Runs are independent
/// (each has its own engine, executor and random streams), so they go in parallel, one
/// per core; the outcomes come back in the order of `policies`.
pub fn compare(
    spec: &SimSpec,
    workload: &WorkloadSpec,
    policies: &[PolicySpec],
    loader: &yardmaster_policy::PolicyLoader,
    progress: impl Fn(&str, f64) + Sync,
) -> Result<Vec<RunOutcome>> {
    per_core(policies, |policy| {
        let arrivals = workload.arrivals(spec.duration, spec.seed)?;
        run::run(spec, policy, loader, arrivals, &mut |done| progress(&policy.name, done))
    })
}

/// Run `job` on every item in parallel, one thread per core: the items go in groups
/// of as many as there are cores, a group at a time. The results come back in the
/// order of `items`; the first error in that order (a panicking job is one) ends it
/// once its group has finished.
pub fn per_core<T: Sync, R: Send>(items: &[T], job: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut outcomes = Vec::with_capacity(items.len());
    for group in items.chunks(cores) {
        let results: Vec<Result<R>> = std::thread::scope(|scope| {
            let handles: Vec<_> = group.iter().map(|item| scope.spawn(|| job(item))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a simulation thread panicked")))).collect()
        });
        for result in results {
            outcomes.push(result?);
        }
    }
    Ok(outcomes)
}
