//! Where arrivals come from: a [`WorkloadSpec`] names them, [`open`] streams them.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};

use super::trace::{arrivals_from_trace, TraceReader};
use super::workload::{self, Arrival, AzureOptions, RateSchedule, SyntheticSpec};

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
    /// Another workload's arrivals dealt round-robin over `streams` streams (the n-th
    /// arrival to stream `n mod streams`): a preset's single stream spread over the
    /// models of a repository.
    Spread {
        /// The workload dealt.
        inner: Box<WorkloadSpec>,
        /// Number of streams.
        streams: u32,
    },
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
        open(self, duration, seed)
    }
}

/// The arrivals of `spec` for `duration` nanoseconds, seeded by `seed`.
pub fn open(spec: &WorkloadSpec, duration: u64, seed: u64) -> Result<Box<dyn Iterator<Item = Arrival>>> {
    Ok(match spec {
        WorkloadSpec::Preset { name, rate } if name == "poisson" => {
            Box::new(SyntheticSpec::poisson(*rate, duration).build(seed).map_err(|e| anyhow!(e))?)
        }
        WorkloadSpec::Preset { name, rate } => {
            Box::new(workload::preset(name, *rate, duration, seed).map_err(|e| anyhow!("{e} (or poisson)"))?)
        }
        WorkloadSpec::RateFile(path) => Box::new(RateSchedule::from_path(path).map_err(|e| anyhow!(e))?.arrivals(seed)),
        WorkloadSpec::AzureLlm { path, speedup } => {
            let options = AzureOptions { speed_up: *speedup, ..AzureOptions::default() };
            Box::new(workload::read_azure_llm_trace(path, &options).map_err(|e| anyhow!(e))?.into_iter())
        }
        WorkloadSpec::Spread { inner, streams } => {
            let streams = (*streams).max(1);
            Box::new(open(inner, duration, seed)?.enumerate().map(move |(n, a)| Arrival { stream: (n % streams as usize) as u32, ..a }))
        }
        WorkloadSpec::Trace(path) => {
            let file = std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
            let reader = TraceReader::new(std::io::BufReader::new(file)).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let arrivals: Vec<Arrival> =
                arrivals_from_trace(reader).collect::<Result<_, _>>().map_err(|e| anyhow!("{}: {e}", path.display()))?;
            Box::new(arrivals.into_iter())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_workload_deals_the_arrivals_round_robin_over_the_streams() {
        let inner = WorkloadSpec::Preset { name: "poisson".into(), rate: 100.0 };
        let plain: Vec<Arrival> = inner.arrivals(1_000_000_000, 3).unwrap().collect();
        let spread = WorkloadSpec::Spread { inner: Box::new(inner), streams: 3 };
        let dealt: Vec<Arrival> = spread.arrivals(1_000_000_000, 3).unwrap().collect();
        assert_eq!(dealt.len(), plain.len());
        assert!(dealt.len() > 30);
        for (n, (a, b)) in plain.iter().zip(&dealt).enumerate() {
            assert_eq!((a.at, b.stream), (b.at, (n % 3) as u32));
        }
    }
}
