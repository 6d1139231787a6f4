//! The discrete-event simulator: the scheduling engine on a virtual clock, with a
//! latency-model executor, workloads and traces, running the very same policy
//! components the server runs (metered by fuel, so runs replay exactly).
//!
//! - [`rng`]: the seeded random source;
//! - [`workload`]: arrival processes (Poisson, bursty with a target CV, diurnal,
//!   presets, per-second rate files, the Azure LLM trace);
//! - [`rate_series`]: per-second rate series shaped like the Wikipedia, Twitter and
//!   Azure Functions traces, replayed Poisson within each second;
//! - [`trace`]: our JSON-lines trace format (written by the server, replayed here);
//! - [`executor`]: jobs take their profiled latency, LLM frames, fan-out, warm/cold starts;
//! - [`presets`]: built-in pipelines;
//! - [`compound`]: compound LLM jobs submitted stage by stage as their calls complete;
//! - [`run`]: one run; [`compare`] runs several policies on the same workload and seed
//!   ([`per_core`] runs independent jobs in parallel);
//! - [`reproduce`]: the reference policies' papers re-run against their baselines.

pub mod bench;
pub mod compound;
pub mod executor;
pub mod presets;
pub mod rate_series;
pub mod reproduce;
pub mod rng;
pub mod run;
mod sources;
pub mod trace;
pub mod workload;

use std::path::PathBuf;

use anyhow::{anyhow, Result};

pub use run::{PolicySpec, RunOutcome, SimSpec};
use workload::Arrival;

/// Where arrivals come from.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadSpec {
    /// A named arrival process at a mean rate (requests per second): `poisson`,
    /// `wikipedia`, `twitter`, `azure-functions`.
    Preset {
        /// Preset name.
        name: String,
        /// Mean rate.
        rate: f64,
    },
    /// A per-second rate file.
    RateFile(PathBuf),
    /// The Azure LLM 2023 CSV, sped up by a factor.
    AzureLlm {
        /// The CSV.
        path: PathBuf,
        /// Time compression (2 = twice as fast).
        speedup: f64,
    },
    /// Arrivals of one of our JSON-lines traces.
    Trace(PathBuf),
}

impl WorkloadSpec {
    /// Parse `NAME` (a preset, with `rate`), `rates:FILE`, `azure-llm:FILE` or `trace:FILE`.
    pub fn parse(text: &str, rate: f64, speedup: f64) -> Result<Self> {
        Ok(match text.split_once(':') {
            Some(("rates", path)) => WorkloadSpec::RateFile(path.into()),
            Some(("azure-llm", path)) => WorkloadSpec::AzureLlm { path: path.into(), speedup },
            Some(("trace", path)) => WorkloadSpec::Trace(path.into()),
            Some((kind, _)) => {
                return Err(anyhow!("unknown workload kind {kind:?} (rates:FILE, azure-llm:FILE, trace:FILE, or a preset name)"))
            }
            None => WorkloadSpec::Preset { name: text.into(), rate },
        })
    }

    /// The arrivals, for `duration` nanoseconds, seeded.
    pub fn arrivals(&self, duration: u64, seed: u64) -> Result<Box<dyn Iterator<Item = Arrival>>> {
        sources::open(self, duration, seed)
    }
}

/// Run every policy on the same pipeline, workload and seed. Runs are independent
/// (each has its own engine, executor and random streams), so they go in parallel, one
/// per core; the outcomes come back in the order of `policies`.
pub fn compare(
    spec: &SimSpec,
    workload: &WorkloadSpec,
    policies: &[PolicySpec],
    loader: &crate::policy::PolicyLoader,
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
