//! Reproductions of the reference policies' papers in the simulator: each one runs
//! a paper's policy beside the baselines that paper compares against, on the
//! paper's pipelines and workloads, on one seed, and prints the comparison tables
//! and writes the plots that correspond to the paper's figures.
//!
//! A reproduction is one [`Reproduction`] in [`REPRODUCTIONS`], implemented in its
//! own module (one per paper); `yardmaster sim reproduce NAME` runs it. The helpers
//! here are what every reproduction needs: the shipped policies by name, a
//! fuel-metered loader, and progress output.

pub mod calm;
pub mod flex;
pub mod loki;
pub mod pard;
pub mod quart;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Result};

use super::{compare, PolicySpec, RunOutcome, SimSpec, WorkloadSpec};
use yardmaster_policy::contract::Param;
use yardmaster_policy::{Limits, Mode, PolicyLoader, Sandbox};

/// Options common to every reproduction.
#[derive(Debug, Clone)]
pub struct ReproduceOptions {
    /// Seed of every random choice.
    pub seed: u64,
    /// Directory for tables (CSV, JSON) and plots.
    pub out: PathBuf,
    /// A shorter run (fewer simulated seconds, fewer sweep points) for smoke tests;
    /// the tables keep their shape.
    pub quick: bool,
}

/// One paper's reproduction.
pub struct Reproduction {
    /// Name on the command line (`pard`, `flex`, …).
    pub name: &'static str,
    /// One line saying what it runs.
    pub about: &'static str,
    /// Runs it and returns the text to print (tables and a list of files written).
    pub run: fn(&ReproduceOptions) -> Result<String>,
}

/// Every reproduction, by name.
pub const REPRODUCTIONS: &[Reproduction] = &[
    pard::REPRODUCTION,
    Reproduction {
        name: "flex",
        about: "SHEPHERD: FLEX with preemption vs FLEX-NP, EDF, Clockwork, Nexus (Figs. 7, 9, 11a, 11b)",
        run: flex::run,
    },
    Reproduction {
        name: "loki",
        about: "Loki (HPDC'24): hardware then accuracy scaling on the traffic-analysis pipeline vs InferLine- and Proteus-like baselines",
        run: loki::reproduce,
    },
    Reproduction {
        name: "quart",
        about: "QUART (ICDCS'24): key-stage scaling of an 8-stage pipeline under bursty load, CV 0.1-8",
        run: quart::reproduce,
    },
    Reproduction { name: "calm", about: "CALM vs FCFS, EDF, SJF on the Azure LLM code trace", run: calm::reproduce },
];

/// The reproduction called `name`, or an error listing the known ones.
pub fn find(name: &str) -> Result<&'static Reproduction> {
    REPRODUCTIONS.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<&str> = REPRODUCTIONS.iter().map(|r| r.name).collect();
        anyhow!("no reproduction called {name:?} (known: {})", if known.is_empty() { "none yet".into() } else { known.join(", ") })
    })
}

/// A shipped policy (see `yardmaster policy list`) as a simulation input, named
/// `report_name` in reports (a policy run with different parameters gets a name of
/// its own).
pub fn shipped(policy: &str, report_name: &str) -> Result<PolicySpec> {
    let artifact = yardmaster_policy_artifacts::shipped(policy).ok_or_else(|| anyhow!("{policy:?} is not a shipped policy"))?;
    Ok(PolicySpec { name: report_name.to_string(), bytes: Arc::new(artifact.bytes.to_vec()) })
}

/// A policy of a comparison: its name in reports, the shipped policy it runs and the
/// parameters it runs with (one shipped policy may be several arms).
#[derive(Debug, Clone, Copy)]
pub struct Arm {
    /// Name in reports.
    pub name: &'static str,
    /// The shipped policy.
    pub policy: &'static str,
    /// Parameters, `(key, value)`.
    pub params: &'static [(&'static str, &'static str)],
}

impl Arm {
    /// The shipped policy as a simulation input, under the arm's name.
    pub fn policy_spec(&self) -> Result<PolicySpec> {
        shipped(self.policy, self.name)
    }

    /// The parameters as the engine passes them to the policy.
    pub fn engine_params(&self) -> Vec<Param> {
        self.params.iter().map(|(k, v)| Param { key: (*k).into(), value: (*v).into() }).collect()
    }
}

/// A loader for simulation: fuel-metered sandbox, the default compiled-code cache.
pub fn simulation_loader() -> Result<PolicyLoader> {
    // Overloaded runs hold thousands of requests, and a policy that ranks them all in
    // one call needs more than the serving budget; the fuel limit here only stops a
    // runaway policy, so every call gets the tick's budget.
    let limits = Limits { event_fuel: Limits::default().tick_fuel, ..Limits::default() };
    let sandbox = Sandbox::new(Mode::Simulate, limits)?;
    Ok(PolicyLoader::new(sandbox, PolicyLoader::default_cache_dir()))
}

/// [`compare`] with one progress line per run on standard error (`label` says which
/// setting of the reproduction is running).
pub fn compare_with_progress(
    label: &str,
    spec: &SimSpec,
    workload: &WorkloadSpec,
    policies: &[PolicySpec],
    loader: &PolicyLoader,
) -> Result<Vec<RunOutcome>> {
    let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
    eprintln!("  {label}: simulating {} …", names.join(", "));
    let started = std::time::Instant::now();
    let outcomes = compare(spec, workload, policies, loader, |_, _| {})?;
    eprintln!("  {label}: done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(outcomes)
}
