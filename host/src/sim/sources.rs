//! Opening a [`WorkloadSpec`] as a stream of arrivals.

use anyhow::{anyhow, Context, Result};

use super::trace::{arrivals_from_trace, TraceReader};
use super::workload::{self, Arrival, AzureOptions, RateSchedule, SyntheticSpec};
use super::WorkloadSpec;

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
        WorkloadSpec::Trace(path) => {
            let file = std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
            let reader = TraceReader::new(std::io::BufReader::new(file)).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let arrivals: Vec<Arrival> =
                arrivals_from_trace(reader).collect::<Result<_, _>>().map_err(|e| anyhow!("{}: {e}", path.display()))?;
            Box::new(arrivals.into_iter())
        }
    })
}
