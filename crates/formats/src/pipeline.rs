//! Pipeline files, read into the engine's [`Pipeline`] model:
//! - our own TOML ([`from_toml`]), documented in the README;
//! - Loki's application JSON ([`from_loki_app`]), with latency profiles from Loki's
//!   profile CSVs and accuracies from its variant lists ([`LokiProfiles`]).

use std::collections::HashMap;

use serde::Deserialize;

use yardmaster_engine::hosts::DEFAULT_HOST_CACHE_BYTES;
use yardmaster_engine::pipeline::*;
use yardmaster_policy::contract::{DeviceKind, LatencyPoint, StageKind};

/// Nanoseconds in a millisecond.
const MS: f64 = 1e6;

/// Read our own TOML format (documented in the README), validated.
pub fn from_toml(text: &str, source_name: &str) -> Result<Pipeline, PipelineError> {
    let file: toml_format::PipelineFile =
        toml::from_str(text).map_err(|e| PipelineError { source_name: source_name.into(), message: e.to_string() })?;
    let pipeline = file.into_pipeline().map_err(|message| PipelineError { source_name: source_name.into(), message })?;
    pipeline.validate(source_name)?;
    Ok(pipeline)
}

/// Read Loki's application JSON, with profiles and accuracies from `profiles`, validated.
pub fn from_loki_app(json: &str, profiles: &LokiProfiles, source_name: &str) -> Result<Pipeline, PipelineError> {
    let pipeline = loki::import(json, profiles).map_err(|message| PipelineError { source_name: source_name.into(), message })?;
    pipeline.validate(source_name)?;
    Ok(pipeline)
}

pub use loki::LokiProfiles;

/// Read a cluster's hosts: a TOML file of `[[host]]` tables (`name`, `slots`,
/// `cache_gib`, `speed`, `threads`), as in a pipeline file and as `yardmaster cluster hosts`
/// writes them from a live controller. At least one host; names unique.
pub fn hosts_from_toml(text: &str, source_name: &str) -> Result<Vec<HostDef>, PipelineError> {
    let error = |message: String| PipelineError { source_name: source_name.into(), message };
    let file: toml_format::HostsFile = toml::from_str(text).map_err(|e| error(e.to_string()))?;
    let hosts = file.hosts.iter().map(|h| h.to_def()).collect::<Result<Vec<_>, _>>().map_err(error)?;
    if hosts.is_empty() {
        return Err(error("no [[host]] table: give each server of the cluster as [[host]] name, slots".into()));
    }
    for (i, host) in hosts.iter().enumerate() {
        if hosts[..i].iter().any(|h| h.name == host.name) {
            return Err(error(format!("host {:?} is given twice", host.name)));
        }
    }
    Ok(hosts)
}

/// Hosts as `[[host]]` tables that [`hosts_from_toml`] reads back.
pub fn hosts_to_toml(hosts: &[HostDef]) -> String {
    let mut out = String::new();
    for host in hosts {
        out.push_str(&format!(
            "[[host]]\nname = {}\nslots = {}\ncache_gib = {}\nspeed = {}\n",
            toml_string(&host.name),
            host.slots,
            host.cache_bytes as f64 / (1u64 << 30) as f64,
            host.speed
        ));
        if host.threads > 0 {
            out.push_str(&format!("threads = {}\n", host.threads));
        }
        out.push('\n');
    }
    out
}

/// One stage of a pipeline as a one-stage pipeline file in our TOML format (what
/// `yardmaster profile` writes and a model repository's profile cache holds): the
/// stage's batch stage settings and variants, without its edges; `slo_ms` is the
/// file's SLO. [`from_toml`] reads it back to the same stage.
pub fn stage_to_toml(stage: &StageDef, slo_ms: f64) -> String {
    use std::fmt::Write as _;
    let ms = |ns: f64| ns / MS;
    let mut out = String::new();
    let _ = writeln!(out, "name = {}\nslo_ms = {slo_ms}\n", toml_string(&stage.name));
    let _ = writeln!(out, "[[stage]]\nname = {}", toml_string(&stage.name));
    let _ = writeln!(out, "max_batch = {}\nreplicas = {}", stage.max_batch, stage.replicas);
    let _ = writeln!(out, "min_replicas = {}\nmax_replicas = {}", stage.min_replicas, stage.max_replicas);
    let device = if stage.device == DeviceKind::Cpu { "cpu" } else { "gpu" };
    let _ = writeln!(out, "device = \"{device}\"\nthreads = {}", stage.threads);
    for variant in &stage.variants {
        let _ = writeln!(out, "\n[[stage.variant]]\nname = {}\naccuracy = {}", toml_string(&variant.name), variant.accuracy);
        match &variant.profile {
            Profile::Linear { alpha_ns, beta_ns } => {
                let _ = writeln!(out, "alpha_ms = {}\nbeta_ms = {}", ms(*alpha_ns), ms(*beta_ns));
            }
            Profile::Points(points) => {
                let points: Vec<String> =
                    points.iter().map(|p| format!("[{}, {}, {}]", p.batch, ms(p.mean as f64), ms(p.tail as f64))).collect();
                let _ = writeln!(out, "# [batch, mean_ms, p99_ms]\nprofile_ms = [{}]", points.join(", "));
            }
        }
        let _ = writeln!(out, "memory_mib = {}", variant.memory_bytes >> 20);
        let _ = writeln!(out, "cold_start_ms = {}\nwarm_start_ms = {}", ms(variant.cold_start_ns as f64), ms(variant.warm_start_ns as f64));
    }
    out
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

mod toml_format {
    //! The serde shape of our TOML pipeline files.

    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct PipelineFile {
        name: String,
        /// Default end-to-end SLO for streams that do not give one.
        slo_ms: Option<f64>,
        max_workers: Option<u32>,
        #[serde(rename = "stage")]
        stages: Vec<StageFile>,
        #[serde(rename = "stream", default)]
        streams: Vec<StreamFile>,
        #[serde(rename = "host", default)]
        hosts: Vec<HostFile>,
    }

    /// A `[[host]]` table: a server of the cluster.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct HostFile {
        name: String,
        /// Device slots (GPUs).
        slots: u32,
        /// Host memory for cached model parameters, GiB.
        cache_gib: Option<f64>,
        /// Speed relative to the stages' profiles (default 1).
        speed: Option<f64>,
        /// Intra-op threads each of its workers may use (default: not stated).
        threads: Option<u32>,
    }

    impl HostFile {
        /// The host it defines, checked.
        pub fn to_def(&self) -> Result<HostDef, String> {
            let gib = self.cache_gib.unwrap_or((DEFAULT_HOST_CACHE_BYTES >> 30) as f64);
            if !(gib.is_finite() && gib >= 0.0) {
                return Err(format!("host {:?}: cache_gib must be a number of GiB, at least 0", self.name));
            }
            if self.slots == 0 {
                return Err(format!("host {:?} has no slot", self.name));
            }
            let speed = self.speed.unwrap_or(1.0);
            if !(speed.is_finite() && speed > 0.0) {
                return Err(format!("host {:?}: speed must be a positive number (1 runs jobs in their profiled time)", self.name));
            }
            let threads = self.threads.unwrap_or(0);
            Ok(HostDef { speed, threads, ..HostDef::new(self.name.clone(), self.slots, (gib * (1u64 << 30) as f64) as u64) })
        }
    }

    /// A file of `[[host]]` tables only: a cluster to simulate a pipeline on.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct HostsFile {
        #[serde(rename = "host", default)]
        pub hosts: Vec<HostFile>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct StageFile {
        name: String,
        #[serde(default)]
        kind: KindFile,
        #[serde(default)]
        successors: Vec<String>,
        #[serde(default = "one")]
        max_batch: u32,
        #[serde(default = "one")]
        replicas: u32,
        min_replicas: Option<u32>,
        max_replicas: Option<u32>,
        #[serde(default)]
        device: DeviceFile,
        #[serde(default = "one")]
        threads: u32,
        parallel_fraction: Option<f64>,
        #[serde(default)]
        worker_memory_mib: u64,
        #[serde(rename = "variant")]
        variants: Vec<VariantFile>,
    }

    #[derive(Deserialize, Default, Clone, Copy)]
    #[serde(rename_all = "lowercase")]
    enum KindFile {
        #[default]
        Batch,
        Iteration,
    }

    #[derive(Deserialize, Default, Clone, Copy)]
    #[serde(rename_all = "lowercase")]
    enum DeviceFile {
        #[default]
        Gpu,
        Cpu,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct VariantFile {
        name: String,
        #[serde(default = "full")]
        accuracy: f64,
        /// Linear profile: milliseconds per request and per batch.
        alpha_ms: Option<f64>,
        beta_ms: Option<f64>,
        /// Measured profile: `[[batch, mean_ms, tail_ms], …]` (tail optional).
        profile_ms: Option<Vec<Vec<f64>>>,
        #[serde(default)]
        memory_mib: u64,
        /// Mean pieces per input, by successor name.
        #[serde(default)]
        fan_out: HashMap<String, f64>,
        #[serde(default = "default_cold_ms")]
        cold_start_ms: f64,
        #[serde(default = "default_warm_ms")]
        warm_start_ms: f64,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct StreamFile {
        name: String,
        entry: String,
        slo_ms: Option<f64>,
    }

    fn one() -> u32 {
        1
    }

    /// Mebibytes to bytes, refusing sizes that do not fit in 64 bits.
    fn mib_to_bytes(mib: u64, what: &str) -> Result<u64, String> {
        mib.checked_mul(1 << 20).ok_or_else(|| format!("{what} = {mib} is too large"))
    }
    fn full() -> f64 {
        1.0
    }
    fn default_cold_ms() -> f64 {
        2_000.0
    }
    fn default_warm_ms() -> f64 {
        200.0
    }

    impl PipelineFile {
        pub fn into_pipeline(self) -> Result<Pipeline, String> {
            let ids: HashMap<String, u32> = self.stages.iter().enumerate().map(|(i, s)| (s.name.clone(), i as u32)).collect();
            let lookup =
                |name: &str, what: &str| ids.get(name).copied().ok_or_else(|| format!("{what} names stage {name:?}, which is not defined"));
            let mut stages = Vec::with_capacity(self.stages.len());
            for stage in &self.stages {
                let successors = stage
                    .successors
                    .iter()
                    .map(|s| lookup(s, &format!("stage {:?}'s successors", stage.name)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut variants = Vec::new();
                for v in &stage.variants {
                    let profile = match (&v.profile_ms, v.alpha_ms, v.beta_ms) {
                        (Some(points), None, None) => Profile::Points(
                            points
                                .iter()
                                .map(|p| match p.as_slice() {
                                    [b, mean] => Ok(LatencyPoint { batch: *b as u32, mean: (mean * MS) as u64, tail: (mean * MS) as u64 }),
                                    [b, mean, tail] => {
                                        Ok(LatencyPoint { batch: *b as u32, mean: (mean * MS) as u64, tail: (tail * MS) as u64 })
                                    }
                                    _ => Err(format!(
                                        "variant {:?}: each profile_ms entry is [batch, mean_ms] or [batch, mean_ms, tail_ms]",
                                        v.name
                                    )),
                                })
                                .collect::<Result<_, _>>()?,
                        ),
                        (None, Some(alpha), Some(beta)) => Profile::Linear { alpha_ns: alpha * MS, beta_ns: beta * MS },
                        _ => return Err(format!("variant {:?}: give either profile_ms or both alpha_ms and beta_ms", v.name)),
                    };
                    let mut fan_out = v
                        .fan_out
                        .iter()
                        .map(|(name, f)| Ok((lookup(name, &format!("variant {:?}'s fan_out", v.name))?, *f)))
                        .collect::<Result<Vec<_>, String>>()?;
                    // In successor order: the map's own order differs from run to run,
                    // and the simulator draws each successor's pieces in this order.
                    fan_out.sort_by_key(|&(successor, _)| successor);
                    variants.push(VariantDef {
                        name: v.name.clone(),
                        accuracy: v.accuracy,
                        profile,
                        memory_bytes: mib_to_bytes(v.memory_mib, &format!("variant {:?}: memory_mib", v.name))?,
                        fan_out,
                        cold_start_ns: (v.cold_start_ms * MS) as u64,
                        warm_start_ns: (v.warm_start_ms * MS) as u64,
                    });
                }
                stages.push(StageDef {
                    name: stage.name.clone(),
                    kind: match stage.kind {
                        KindFile::Batch => StageKind::Batch,
                        KindFile::Iteration => StageKind::Iteration,
                    },
                    successors,
                    predecessors: Vec::new(),
                    variants,
                    max_batch: stage.max_batch,
                    replicas: stage.replicas,
                    min_replicas: stage.min_replicas.unwrap_or(1).min(stage.replicas),
                    max_replicas: stage.max_replicas.unwrap_or(stage.replicas.max(1).saturating_mul(4)),
                    device: match stage.device {
                        DeviceFile::Gpu => DeviceKind::Gpu,
                        DeviceFile::Cpu => DeviceKind::Cpu,
                    },
                    threads: stage.threads,
                    parallel_fraction: stage.parallel_fraction.map(|f| f.clamp(0.0, 1.0)),
                    worker_memory_bytes: if stage.worker_memory_mib == 0 {
                        16 << 30
                    } else {
                        mib_to_bytes(stage.worker_memory_mib, &format!("stage {:?}: worker_memory_mib", stage.name))?
                    },
                    llm: LlmCosts::default(),
                });
            }
            link_predecessors(&mut stages);
            let default_slo = self.slo_ms;
            let mut streams = Vec::new();
            for s in &self.streams {
                let slo =
                    s.slo_ms.or(default_slo).ok_or_else(|| format!("stream {:?} has no slo_ms and the pipeline none either", s.name))?;
                streams.push(StreamDef {
                    name: s.name.clone(),
                    entry: lookup(&s.entry, &format!("stream {:?}", s.name))?,
                    slo_ns: (slo * MS) as u64,
                });
            }
            if streams.is_empty() {
                let slo = default_slo.ok_or("no [[stream]] and no pipeline slo_ms")?;
                streams.push(StreamDef { name: self.name.clone(), entry: 0, slo_ns: (slo * MS) as u64 });
            }
            let initial = stages.iter().map(|s| s.replicas as u64).sum::<u64>().min(u32::MAX as u64) as u32;
            let mut hosts = Vec::new();
            for h in &self.hosts {
                hosts.push(h.to_def()?);
            }
            let slots = hosts.iter().map(|h| h.slots as u64).sum::<u64>().min(MAX_WORKERS as u64) as u32;
            let max_workers = self.max_workers.unwrap_or_else(|| {
                let bounds = stages.iter().map(|s| s.max_replicas as u64).sum::<u64>().min(MAX_WORKERS as u64) as u32;
                let wanted = bounds.max(initial);
                if hosts.is_empty() {
                    wanted
                } else {
                    wanted.min(slots)
                }
            });
            if !hosts.is_empty() && max_workers > slots {
                // A described cluster asks for no more workers than it has slots (a live
                // one may share slots; see `yardmaster_engine::hosts`).
                return Err(format!("max_workers = {max_workers} exceeds the {slots} slots of the hosts"));
            }
            Ok(Pipeline { name: self.name, stages, streams, max_workers, hosts })
        }
    }
}

mod loki {
    //! Import of Loki's published application graph and profiles.

    use super::*;
    use std::path::Path;

    /// Profiled points of one model: (batch, p50 ms, p90 ms).
    type Points = Vec<(u32, f64, f64)>;

    /// Profiles and accuracies published with Loki.
    #[derive(Debug, Clone, Default)]
    pub struct LokiProfiles {
        /// (model, accelerator) → profiled points.
        runtimes: HashMap<(String, String), Points>,
        /// model (without checkpoint suffix) → profiled points, from the serving
        /// system's own profiles.
        serving_runtimes: HashMap<String, Points>,
        /// model → accuracy in [0, 1].
        accuracy: HashMap<String, f64>,
        /// detector model → (total pieces per frame, share per child task).
        branching: HashMap<String, (f64, HashMap<String, f64>)>,
        /// Accelerator whose profiles are used.
        pub accelerator: String,
        /// Profile of models with no published profile (refused when `None`).
        pub fallback: Option<Profile>,
    }

    impl LokiProfiles {
        /// Read `profiling__simulator_runtimes.csv`, the
        /// `traces__model_variants__*` accuracy lists and `profiled__branching.csv`
        /// from Loki's data directory, choosing one accelerator
        /// (e.g. `onnxruntime_gpu_ampere`).
        pub fn load(dir: &Path, accelerator: &str) -> Result<Self, String> {
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{}: {e}", dir.join(name).display()));
            let mut profiles = LokiProfiles { accelerator: accelerator.into(), ..Default::default() };
            let runtimes = read("profiling__simulator_runtimes.csv")?;
            let mut lines = runtimes.lines();
            let runtimes_path = dir.join("profiling__simulator_runtimes.csv");
            let header: Vec<&str> =
                lines.next().ok_or_else(|| format!("{}: empty runtimes file", runtimes_path.display()))?.split(',').collect();
            let col =
                |name: &str| header.iter().position(|h| *h == name).ok_or_else(|| format!("{}: no {name} column", runtimes_path.display()));
            let (model, accel, batch, p50, p90) = (col("Model")?, col("Accel")?, col("batchsize")?, col("50th_pct")?, col("90th_pct")?);
            for (n, line) in lines.enumerate() {
                let f: Vec<&str> = line.split(',').collect();
                let parse = |i: usize| {
                    f.get(i)
                        .and_then(|v| v.parse::<f64>().ok())
                        .ok_or_else(|| format!("{} line {}: bad field {i}", runtimes_path.display(), n + 2))
                };
                let text = |i: usize| {
                    f.get(i).map(|v| v.to_string()).ok_or_else(|| format!("{} line {}: no field {i}", runtimes_path.display(), n + 2))
                };
                profiles.runtimes.entry((text(model)?, text(accel)?)).or_default().push((parse(batch)? as u32, parse(p50)?, parse(p90)?));
            }
            for points in profiles.runtimes.values_mut() {
                points.sort_by_key(|p| p.0);
                points.dedup_by_key(|p| p.0);
            }
            for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("traces__model_variants__") {
                    for line in read(&name)?.lines() {
                        if let Some((model, acc)) = line.split_once(',') {
                            if let Ok(acc) = acc.trim().parse::<f64>() {
                                profiles.accuracy.insert(model.trim().to_string(), acc / 100.0);
                            }
                        }
                    }
                }
            }
            // The serving system's profiles (seconds, one GPU type), for the models the
            // simulator file lacks; their names carry a checkpoint suffix (`eb0_…`).
            if let Ok(serving) = read("profiled__runtimes_all.csv") {
                for (n, line) in serving.lines().enumerate().skip(1) {
                    let f: Vec<&str> = line.split(',').collect();
                    let parse = |i: usize| {
                        f.get(i)
                            .and_then(|v| v.parse::<f64>().ok())
                            .ok_or_else(|| format!("{} line {}: bad field {i}", dir.join("profiled__runtimes_all.csv").display(), n + 1))
                    };
                    if f.len() < 8 {
                        continue;
                    }
                    let model = f[1].split('_').next().unwrap_or(f[1]).to_string();
                    profiles.serving_runtimes.entry(model).or_default().push((parse(3)? as u32, parse(5)? * 1e3, parse(6)? * 1e3));
                }
                for points in profiles.serving_runtimes.values_mut() {
                    points.sort_by_key(|p| p.0);
                    points.dedup_by_key(|p| p.0);
                }
            }
            if let Ok(branching) = read("profiled__branching.csv") {
                let mut lines = branching.lines();
                let header: Vec<String> = lines.next().unwrap_or("").split(',').map(str::to_string).collect();
                for line in lines {
                    let f: Vec<&str> = line.split(',').collect();
                    if f.len() < 3 {
                        continue;
                    }
                    let total = f[2].parse::<f64>().unwrap_or(1.0);
                    let shares =
                        header.iter().zip(&f).skip(3).filter_map(|(task, v)| Some((task.clone(), v.parse::<f64>().ok()?))).collect();
                    profiles.branching.insert(f[1].to_string(), (total, shares));
                }
            }
            Ok(profiles)
        }

        /// The published accuracy of `model` in [0, 1], if any.
        pub fn accuracy(&self, model: &str) -> Option<f64> {
            self.accuracy.get(model).copied()
        }

        /// The latency profile of `model` on the chosen accelerator (else the serving
        /// system's profile, else the fallback); an error naming the model when none.
        pub fn profile(&self, model: &str) -> Result<Profile, String> {
            let points = self.runtimes.get(&(model.to_string(), self.accelerator.clone())).or_else(|| self.serving_runtimes.get(model));
            let Some(points) = points else {
                return match &self.fallback {
                    Some(fallback) => {
                        tracing::warn!(model, "no published profile: using the fallback profile");
                        Ok(fallback.clone())
                    }
                    None => Err(format!("no profile of {model:?} on {:?} (set a fallback profile to accept it)", self.accelerator)),
                };
            };
            Ok(Profile::Points(
                points
                    .iter()
                    .map(|&(batch, p50, p90)| LatencyPoint { batch, mean: (p50 * MS) as u64, tail: (p90.max(p50) * MS) as u64 })
                    .collect(),
            ))
        }
    }

    #[derive(Deserialize)]
    struct App {
        #[serde(rename = "appName")]
        name: String,
        #[serde(rename = "latencySLOInMSec")]
        slo_ms: f64,
        root: Task,
    }

    #[derive(Deserialize)]
    struct Task {
        task: String,
        model_variants: Vec<String>,
        /// Yardmaster's extension of the format: mean pieces this task receives per
        /// query its parent serves (on this edge), for every variant of the parent.
        /// Absent: the parent's published branching (a detector's), else one.
        #[serde(default)]
        fan_out: Option<f64>,
        #[serde(default)]
        children: Vec<Task>,
    }

    /// Workers per task of an imported application (its JSON names no cluster size).
    const WORKERS_PER_TASK: u32 = 8;

    /// Build the pipeline: one stage per task (a task named by several parents, like
    /// `sink`, is one fan-in stage), variants from the task's list.
    pub fn import(json: &str, profiles: &LokiProfiles) -> Result<Pipeline, String> {
        let app: App = serde_json::from_str(json).map_err(|e| format!("not a Loki application JSON: {e}"))?;
        let mut stages: Vec<StageDef> = Vec::new();
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut edges: HashMap<(u32, u32), f64> = HashMap::new();
        visit(&app.root, profiles, &mut stages, &mut ids, &mut edges)?;
        link_predecessors(&mut stages);
        // Detector fan-out: pieces per frame split between the child tasks.
        for i in 0..stages.len() {
            let successors = stages[i].successors.clone();
            let child_names: Vec<String> = successors.iter().map(|s| stages[*s as usize].name.clone()).collect();
            for variant in &mut stages[i].variants {
                if let Some((total, shares)) = profiles.branching.get(&variant.name) {
                    variant.fan_out = successors
                        .iter()
                        .zip(&child_names)
                        .map(|(s, name)| (*s, total * shares.get(name).copied().unwrap_or(0.0)))
                        .collect();
                }
                // A fan-out the application states on an edge is the edge's.
                for s in &successors {
                    if let Some(&stated) = edges.get(&(i as u32, *s)) {
                        match variant.fan_out.iter_mut().find(|(t, _)| t == s) {
                            Some(entry) => entry.1 = stated,
                            None => variant.fan_out.push((*s, stated)),
                        }
                    }
                }
                variant.fan_out.sort_by_key(|&(successor, _)| successor);
            }
        }
        // Loki's application JSON names no cluster size: eight workers per task, said
        // once, and every task may scale up to all of them. Loki's cluster is a fixed
        // set of GPUs, all serving from the start: the pseudo-tasks one each, the real
        // tasks the rest by need (`spread_by_need`).
        let max_workers = stages.len() as u32 * WORKERS_PER_TASK;
        tracing::warn!(
            application = %app.name,
            max_workers,
            "Loki's application names no cluster size: {WORKERS_PER_TASK} workers per task, all started (a pseudo-task's one, the rest by need); batches up to the largest profiled size"
        );
        let largest_batch = stages.iter().map(|s| s.max_batch).max().unwrap_or(0).max(1);
        for stage in &mut stages {
            stage.max_replicas = max_workers;
            if stage.max_batch == 0 {
                stage.max_batch = largest_batch;
            }
        }
        let mut pipeline = Pipeline {
            name: app.name.clone(),
            stages,
            streams: vec![StreamDef { name: app.name, entry: 0, slo_ns: (app.slo_ms * MS) as u64 }],
            max_workers,
            hosts: Vec::new(),
        };
        let spread = spread_by_need(&pipeline);
        for (stage, replicas) in pipeline.stages.iter_mut().zip(spread) {
            stage.replicas = replicas;
        }
        Ok(pipeline)
    }

    /// The cluster's workers at start: one for each pseudo-task (it takes no time),
    /// and eight per real task spread over the real tasks in proportion to what
    /// each needs to carry the same query rate — its pieces per query over what one
    /// worker of its first variant (the one workers start with) serves at its best
    /// batch within the SLO — at least one each (largest remainders first, ties to the
    /// earlier task).
    pub(super) fn spread_by_need(pipeline: &Pipeline) -> Vec<u32> {
        let slo = pipeline.streams.iter().map(|s| s.slo_ns).max().unwrap_or(u64::MAX);
        let pieces = yardmaster_engine::pieces_per_request(pipeline);
        let need: Vec<f64> = pipeline
            .stages
            .iter()
            .zip(&pieces)
            .map(|(stage, &pieces)| {
                if stage.takes_no_time() {
                    return 0.0;
                }
                let first = &stage.variants[0].profile;
                let rate = (1..=stage.max_batch.max(1))
                    .filter(|&b| b == 1 || first.mean(b) <= slo)
                    .map(|b| b as f64 / first.mean(b).max(1) as f64)
                    .fold(0.0, f64::max);
                pieces.max(0.0) / rate.max(f64::MIN_POSITIVE)
            })
            .collect();
        let pseudo = pipeline.stages.iter().filter(|s| s.takes_no_time()).count() as u32;
        let real = pipeline.stages.len() as u32 - pseudo;
        // As many as eight a real task (the rest of the cluster, a pseudo-task's share
        // less its one, is left free for the policies that scale).
        let workers = (WORKERS_PER_TASK * real).min(pipeline.max_workers.saturating_sub(pseudo)).max(real);
        let total: f64 = need.iter().sum();
        let mut replicas: Vec<u32> = pipeline.stages.iter().map(|s| u32::from(s.takes_no_time())).collect();
        if real == 0 {
            return replicas;
        }
        if !(total.is_finite() && total > 0.0) {
            // Nothing to go by: an even split.
            for (r, stage) in replicas.iter_mut().zip(&pipeline.stages) {
                if !stage.takes_no_time() {
                    *r = workers / real;
                }
            }
            return replicas;
        }
        // Each real task its floor share (at least one), then the rest one at a time by
        // largest remainder.
        let share: Vec<f64> = need.iter().map(|n| workers as f64 * n / total).collect();
        for (i, stage) in pipeline.stages.iter().enumerate() {
            if !stage.takes_no_time() {
                replicas[i] = (share[i].floor() as u32).max(1);
            }
        }
        let mut given: u32 = (0..replicas.len()).filter(|&i| !pipeline.stages[i].takes_no_time()).map(|i| replicas[i]).sum();
        while given < workers {
            let next = (0..replicas.len())
                .filter(|&i| !pipeline.stages[i].takes_no_time())
                .max_by(|&a, &b| (share[a] - replicas[a] as f64).total_cmp(&(share[b] - replicas[b] as f64)).then(b.cmp(&a)))
                .expect("a real task");
            replicas[next] += 1;
            given += 1;
        }
        while given > workers {
            // The floors of one each overshot: take from the task furthest over its share.
            let next = (0..replicas.len())
                .filter(|&i| !pipeline.stages[i].takes_no_time() && replicas[i] > 1)
                .max_by(|&a, &b| (replicas[a] as f64 - share[a]).total_cmp(&(replicas[b] as f64 - share[b])))
                .expect("more than one worker somewhere");
            replicas[next] -= 1;
            given -= 1;
        }
        replicas
    }

    /// The pseudo-tasks of Loki's format: `source`, a root that only hands each query
    /// to the real tasks below it, and `sink`, where branches end. Neither runs a model,
    /// so both take no time and count as fully accurate.
    pub const PSEUDO_TASKS: [&str; 2] = ["source", "sink"];

    /// Whether `task` is one of [`PSEUDO_TASKS`] (by its task name, or when its only
    /// variants carry such a name, as the authors' files list them).
    fn is_pseudo_task(task: &Task) -> bool {
        PSEUDO_TASKS.contains(&task.task.as_str())
            || (!task.model_variants.is_empty() && task.model_variants.iter().all(|m| PSEUDO_TASKS.contains(&m.as_str())))
    }

    fn visit(
        task: &Task,
        profiles: &LokiProfiles,
        stages: &mut Vec<StageDef>,
        ids: &mut HashMap<String, u32>,
        edges: &mut HashMap<(u32, u32), f64>,
    ) -> Result<u32, String> {
        if let Some(&id) = ids.get(&task.task) {
            return Ok(id);
        }
        let mut variants = Vec::new();
        let mut missing = None;
        let pseudo = is_pseudo_task(task);
        for model in &task.model_variants {
            let profile = if pseudo {
                Profile::Linear { alpha_ns: 0.0, beta_ns: 0.0 }
            } else {
                match profiles.profile(model) {
                    Ok(profile) => profile,
                    Err(error) => {
                        // A variant with no published profile is left out (never given
                        // a made-up one); a task left with none is refused.
                        tracing::warn!(task = %task.task, %error, "leaving out a variant");
                        missing = Some(error);
                        continue;
                    }
                }
            };
            // Likewise a variant with no published accuracy: it would otherwise count
            // as perfectly accurate.
            let accuracy = match profiles.accuracy.get(model) {
                Some(&accuracy) => accuracy,
                None if pseudo => 1.0,
                None => {
                    let error = format!("no published accuracy of {model:?}");
                    tracing::warn!(task = %task.task, %error, "leaving out a variant");
                    missing = Some(error);
                    continue;
                }
            };
            variants.push(VariantDef {
                name: model.clone(),
                accuracy,
                profile,
                memory_bytes: 1 << 30,
                fan_out: Vec::new(),
                cold_start_ns: 2_000_000_000,
                warm_start_ns: 200_000_000,
            });
        }
        if variants.is_empty() {
            return Err(missing.unwrap_or_else(|| format!("task {:?} has no model variants", task.task)));
        }
        // Loki lists variants from cheapest to most accurate; keep that order.
        let id = stages.len() as u32;
        // The largest batch any variant was measured at: batches beyond the data would
        // run on extrapolated latencies. A task without measured points (the sink) is
        // given the application's largest by `import` (0 until then).
        let measured_batch = variants
            .iter()
            .filter_map(|v| match &v.profile {
                Profile::Points(points) => points.iter().map(|p| p.batch).max(),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        ids.insert(task.task.clone(), id);
        stages.push(StageDef {
            name: task.task.clone(),
            kind: StageKind::Batch,
            successors: Vec::new(),
            predecessors: Vec::new(),
            variants,
            max_batch: measured_batch,
            replicas: 1,
            min_replicas: 1,
            // The application names no per-task limit: `import` gives every task the
            // whole cluster once its size is known.
            max_replicas: 1,
            device: DeviceKind::Gpu,
            threads: 1,
            parallel_fraction: None,
            worker_memory_bytes: 16 << 30,
            llm: LlmCosts::default(),
        });
        for child in &task.children {
            let child_id = visit(child, profiles, stages, ids, edges)?;
            if let Some(fan_out) = child.fan_out {
                if !(fan_out.is_finite() && fan_out >= 0.0) {
                    return Err(format!("task {:?}: fan_out {fan_out} is not a number of pieces (at least 0)", child.task));
                }
                edges.insert((id, child_id), fan_out);
            }
            if !stages[id as usize].successors.contains(&child_id) {
                stages[id as usize].successors.push(child_id);
            }
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_cluster_written_as_hosts_reads_back_the_same_and_bad_hosts_are_refused_with_the_file() {
        let hosts = vec![HostDef { speed: 0.75, ..HostDef::new("node-0", 2, 8 << 30) }, HostDef::new("node \"1\"", 1, 0)];
        assert_eq!(hosts_from_toml(&hosts_to_toml(&hosts), "hosts.toml").unwrap(), hosts);
        let refused = |text: &str| hosts_from_toml(text, "cluster.toml").unwrap_err().to_string();
        assert!(refused("").contains("no [[host]]"));
        assert!(refused("[[host]]\nname = \"a\"\nslots = 1\nspeed = 0\n").contains("speed must be a positive"));
        assert!(refused("[[host]]\nname = \"a\"\nslots = 0\n").contains("has no slot"));
        let twice = refused("[[host]]\nname = \"a\"\nslots = 1\n[[host]]\nname = \"a\"\nslots = 2\n");
        assert!(twice.contains("given twice") && twice.contains("cluster.toml"), "{twice}");
    }

    #[test]
    fn a_fan_out_lists_its_successors_in_stage_order_every_time() {
        // The per-successor fan-out is a map in the file; its iteration order differs
        // from one map to the next, and the simulator draws each successor's pieces in
        // the listed order, so `traffic-dag` gave another report on each run of one
        // seed. Parsed many times, the order is always the successors' own.
        let text = "name = \"fan\"\nslo_ms = 100\n[[stage]]\nname = \"root\"\nsuccessors = [\"a\", \"b\", \"c\", \"d\"]\n\
                    [[stage.variant]]\nname = \"v\"\nalpha_ms = 1.0\nbeta_ms = 1.0\nfan_out = { d = 4.0, b = 2.0, c = 3.0, a = 1.0 }\n"
            .to_string()
            + &["a", "b", "c", "d"]
                .iter()
                .map(|n| format!("[[stage]]\nname = \"{n}\"\n[[stage.variant]]\nname = \"w\"\nalpha_ms = 1.0\nbeta_ms = 1.0\n"))
                .collect::<String>();
        for _ in 0..32 {
            let p = from_toml(&text, "fan").unwrap();
            assert_eq!(p.stages[0].variants[0].fan_out, vec![(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]);
        }
    }

    #[test]
    fn a_stage_written_as_toml_reads_back_the_same() {
        for (text, name) in [(crate::presets::OCR_PRESET, "ocr"), (crate::presets::TINY_PRESET, "tiny")] {
            let pipeline = from_toml(text, name).unwrap();
            for stage in &pipeline.stages {
                let written = stage_to_toml(stage, 123.0);
                let back = from_toml(&written, "written").unwrap_or_else(|e| panic!("{e}\n{written}"));
                let expected = StageDef { successors: Vec::new(), predecessors: Vec::new(), ..stage.clone() };
                assert_eq!(back.stages, vec![expected], "{written}");
                assert_eq!(back.streams[0].slo_ns, 123_000_000);
            }
        }
    }
    use super::*;

    const TOML: &str = r#"
        name = "vision"
        slo_ms = 200
        [[stage]]
        name = "detect"
        successors = ["classify", "faces"]
        max_batch = 8
        replicas = 2
        [[stage.variant]]
        name = "small"
        accuracy = 0.8
        alpha_ms = 1.0
        beta_ms = 4.0
        fan_out = { classify = 3.0, faces = 0.5 }
        [[stage]]
        name = "classify"
        successors = ["sink"]
        [[stage.variant]]
        name = "c"
        profile_ms = [[1, 2.0, 3.0], [8, 9.0, 12.0]]
        [[stage]]
        name = "faces"
        successors = ["sink"]
        [[stage.variant]]
        name = "f"
        alpha_ms = 0.5
        beta_ms = 1.0
        [[stage]]
        name = "sink"
        [[stage.variant]]
        name = "sink"
        alpha_ms = 0.0
        beta_ms = 0.0
    "#;

    /// A one-stage pipeline with `stage` and `variant` lines added.
    fn one_stage(stage: &str, variant: &str) -> String {
        format!("name = \"h\"\nslo_ms = 10\n[[stage]]\nname = \"a\"\n{stage}\n[[stage.variant]]\nname = \"v\"\nalpha_ms = 1.0\nbeta_ms = 1.0\n{variant}\n")
    }

    #[test]
    fn huge_numbers_are_refused_or_saturate_never_overflow() {
        // Found by fuzzing: replicas · 4, the replica sums and the batch sizes of the
        // profile points overflowed; memory sizes wrapped silently.
        // Found by fuzzing: two billion initial replicas were accepted, and describing
        // them to the policy allocated an entry for each.
        let err = from_toml(&one_stage("replicas = 2000000000", ""), "t").unwrap_err();
        assert!(err.message.contains("2000000000 initial replicas exceed the host's limit of 65536 workers"), "{err}");
        let err = from_toml(&format!("max_workers = 100000\n{}", one_stage("", "")), "t").unwrap_err();
        assert!(err.message.contains("max_workers = 100000 is over"), "{err}");
        let p = from_toml(&one_stage("replicas = 1000\nmax_replicas = 4294967295", ""), "t").unwrap();
        assert_eq!(p.max_workers, MAX_WORKERS, "the default max_workers is capped");
        let two = one_stage("replicas = 4294967295\nmax_replicas = 4294967295", "")
            + "[[stage]]\nname = \"b\"\nreplicas = 4294967295\nmax_replicas = 4294967295\n[[stage.variant]]\nname = \"w\"\nalpha_ms = 1.0\nbeta_ms = 1.0\n";
        let err = from_toml(&two, "t").unwrap_err();
        assert!(err.message.contains("8589934590 initial replicas exceed the host's limit"), "{err}");
        let err = from_toml(&one_stage("", "memory_mib = 18446744073709551615"), "t").unwrap_err();
        assert!(err.message.contains("memory_mib = 18446744073709551615 is too large"), "{err}");
        let err = from_toml(&one_stage("worker_memory_mib = 17592186044416", ""), "t").unwrap_err();
        assert!(err.message.contains("worker_memory_mib = 17592186044416 is too large"), "{err}");
        let p = from_toml(&one_stage("max_batch = 4294967295", ""), "t").unwrap();
        let points = p.stages[0].variants[0].profile.to_points(u32::MAX);
        assert_eq!(points.len(), 33, "1, 2, 4, … 2^31 and the largest batch");
        assert_eq!(points.last().unwrap().batch, u32::MAX);
    }

    #[test]
    fn reads_our_toml_dag() {
        let p = from_toml(TOML, "test").unwrap();
        assert_eq!(p.stages.len(), 4);
        assert_eq!(p.stages[0].successors, vec![1, 2]);
        assert_eq!(p.stages[3].predecessors, vec![1, 2], "sink is a fan-in stage");
        assert_eq!(p.streams[0].slo_ns, 200_000_000);
        assert_eq!(p.stages[0].variants[0].profile.mean(4), 8_000_000);
        assert_eq!(p.stages[0].variants[0].fan_out_to(1), 3.0);
        assert_eq!(p.stages[1].variants[0].profile.mean(8), 9_000_000);
        assert_eq!(p.stages[1].variants[0].profile.tail(1), 3_000_000);
        let contract = p.contract_stages();
        assert_eq!(contract[0].variants[0].fan_out, 3.5);
        assert_eq!(contract[0].variants[0].profile.last().unwrap().batch, 8);
    }

    #[test]
    fn refuses_bad_graphs_with_reasons() {
        let cyclic = TOML.replace(
            "name = \"sink\"\n        [[stage.variant]]",
            "name = \"sink\"\n        successors = [\"detect\"]\n        [[stage.variant]]",
        );
        let error = from_toml(&cyclic, "cyclic.toml").unwrap_err().to_string();
        assert!(error.contains("cycle") && error.contains("cyclic.toml"), "{error}");
        let dangling = TOML.replace("successors = [\"sink\"]", "successors = [\"nowhere\"]");
        let error = from_toml(&dangling, "t").unwrap_err().to_string();
        assert!(error.contains("nowhere"), "{error}");
        let no_profile = TOML.replace("alpha_ms = 0.5\n", "");
        let error = from_toml(&no_profile, "t").unwrap_err().to_string();
        assert!(error.contains("alpha_ms"), "{error}");
        let unknown = format!("{TOML}\nbogus = 1\n");
        assert!(from_toml(&unknown, "t").is_err());
    }

    #[test]
    fn profiles_interpolate_and_extrapolate() {
        let p = Profile::Points(vec![LatencyPoint { batch: 1, mean: 10, tail: 20 }, LatencyPoint { batch: 4, mean: 40, tail: 50 }]);
        assert_eq!(p.mean(2), 20);
        assert_eq!(p.mean(8), 80);
        assert_eq!(p.tail(1), 20);
        let linear = Profile::Linear { alpha_ns: 2.0, beta_ns: 5.0 };
        assert_eq!(linear.mean(10), 25);
        assert_eq!(linear.to_points(6).iter().map(|p| p.batch).collect::<Vec<_>>(), vec![1, 2, 4, 6]);
    }

    /// Loki's published data directory, beside the clone.
    fn loki_dir() -> std::path::PathBuf {
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki")).to_path_buf()
    }

    #[test]
    fn a_root_pseudo_task_and_the_sink_both_take_no_time() {
        // The authors' format allows a pseudo-task at the root (`source`) as well as the
        // sink; the import refused it ("no published accuracy of \"source\"").
        let profiles = LokiProfiles::load(&loki_dir(), "onnxruntime_gpu_ampere").unwrap();
        let app = r#"{"appName": "rooted", "latencySLOInMSec": 300, "root": {"task": "source", "model_variants": ["source"],
            "children": [{"task": "a", "model_variants": ["yolov5n", "yolov5s"], "children": [{"task": "sink", "model_variants": ["sink"]}]},
                         {"task": "b", "model_variants": ["efficientnet-b0"], "children": [{"task": "sink", "model_variants": ["sink"]}]}]}}"#;
        let p = from_loki_app(app, &profiles, "rooted.json").unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = p.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["source", "a", "sink", "b"]);
        assert_eq!(p.streams[0].entry, 0, "requests enter at the pseudo root");
        for pseudo in [0, 2] {
            let stage = &p.stages[pseudo];
            assert!(stage.takes_no_time(), "{} takes no time", stage.name);
            assert_eq!(stage.variants[0].accuracy, 1.0);
            assert_eq!(stage.replicas, 1, "a pseudo-task keeps one worker");
        }
        assert!(!p.stages[1].takes_no_time());
        assert_eq!(p.stages[1].replicas + p.stages[3].replicas, 16, "eight a real task, spread by need");
        assert_eq!(p.stages[0].successors, vec![1, 3], "the root hands each query to both tasks");
        // A real task of the same name as no model is still refused with its file named.
        let bad = app.replace("\"efficientnet-b0\"", "\"no-such-model\"");
        let error = from_loki_app(&bad, &profiles, "rooted.json").unwrap_err().to_string();
        assert!(error.contains("rooted.json") && error.contains("no-such-model"), "{error}");
    }

    #[test]
    fn the_start_spreads_eight_workers_a_task_by_need() {
        // A cheap task feeding an expensive one: eight workers each left the expensive
        // one short at a quarter of the capacity bound (the fixed baselines of QUART and
        // PARD, which keep the start, missed there; docs/loki.md).
        let profiles = LokiProfiles::load(&loki_dir(), "onnxruntime_gpu_ampere").unwrap();
        let app = r#"{"appName": "s", "latencySLOInMSec": 400, "root": {"task": "source", "model_variants": ["source"],
            "children": [{"task": "cheap", "model_variants": ["genderNet_11"],
                "children": [{"task": "dear", "model_variants": ["yolov5x"], "fan_out": 2.0}]}]}}"#;
        let p = from_loki_app(app, &profiles, "s.json").unwrap();
        let started: Vec<u32> = p.stages.iter().map(|s| s.replicas).collect();
        assert_eq!(started[0], 1, "the source keeps one");
        assert_eq!(started[1] + started[2], 16);
        assert!(started[2] >= 14 && started[1] >= 1, "{started:?}");
        assert_eq!(p.max_workers, 24, "the cluster is eight a task, pseudo-tasks counted");
        // Every worker of the start is within the cluster and each bound.
        assert!(started.iter().sum::<u32>() <= p.max_workers);
    }

    #[test]
    fn every_import_error_names_the_file() {
        let profiles = LokiProfiles::load(&loki_dir(), "onnxruntime_gpu_ampere").unwrap();
        for (text, why) in [
            ("{", "not a Loki application JSON"),
            (r#"{"appName": "x", "latencySLOInMSec": 100, "root": {"task": "t", "model_variants": []}}"#, "no model variants"),
            (r#"{"appName": "x", "latencySLOInMSec": 100, "root": {"task": "t", "model_variants": ["nope"]}}"#, "no profile of"),
        ] {
            let error = from_loki_app(text, &profiles, "some/app.json").unwrap_err().to_string();
            assert!(error.contains("some/app.json") && error.contains(why), "{error}");
        }
        let missing = std::env::temp_dir().join(format!("ym-no-profiles-{}", std::process::id()));
        let error = LokiProfiles::load(&missing, "onnxruntime_gpu_ampere").unwrap_err();
        assert!(error.contains(&missing.join("profiling__simulator_runtimes.csv").display().to_string()), "{error}");
    }

    #[test]
    fn imports_lokis_traffic_analysis_application() {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki"));
        let json = std::fs::read_to_string(dir.join("sim__traffic_analysis.json")).expect("shared data present");
        let profiles = LokiProfiles::load(dir, "onnxruntime_gpu_ampere").unwrap();
        let p = from_loki_app(&json, &profiles, "sim__traffic_analysis.json").unwrap();
        let names: Vec<&str> = p.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["object_detection", "car_classification", "sink", "facial_recognition"]);
        assert_eq!(p.stages[2].predecessors.len(), 2, "sink merges both branches");
        assert_eq!(p.streams[0].slo_ns, 250_000_000);
        let detector = &p.stages[0];
        assert_eq!(detector.variants.len(), 5);
        // efficientnet-b7 has no published profile: left out.
        assert_eq!(p.stages[1].variants.len(), 7);
        let yolov5x = detector.variants.iter().find(|v| v.name == "yolov5x").unwrap();
        assert_eq!(yolov5x.accuracy, 1.0);
        let cars = yolov5x.fan_out_to(1);
        assert!(cars > 10.0 && cars < 30.0, "yolov5x yields many cars per frame: {cars}");
        assert!(detector.variants[0].profile.mean(1) > 0);
        // Caps come from the data: batches up to the largest profiled size (64), and
        // every task may scale to the whole (stated) cluster.
        assert!(
            p.stages.iter().filter(|s| s.name != "sink").all(|s| s.max_batch == 64),
            "{:?}",
            p.stages.iter().map(|s| s.max_batch).collect::<Vec<_>>()
        );
        assert!(p.stages.iter().all(|s| s.max_replicas == p.max_workers));
        // The cluster serves from the start: eight workers a task, one for the sink,
        // spread by need: yolov5n serves ~110 frames/s a worker at its best batch, its
        // 2.0 cars and 0.6 faces a frame far more each on efficientnet-b0 and genderNet_11.
        let started: Vec<u32> = p.stages.iter().map(|s| s.replicas).collect();
        assert_eq!(started, [15, 6, 1, 3]);
        assert_eq!(p.max_workers, 32);
        // A task whose variants have no published profile is refused with the model
        // named, never given a made-up one.
        let unprofiled = r#"{"appName": "x", "latencySLOInMSec": 100, "root": {"task": "t", "model_variants": ["nope"]}}"#;
        let error = from_loki_app(unprofiled, &profiles, "unprofiled").unwrap_err().to_string();
        assert!(error.contains("no profile of \"nope\""), "{error}");
        // The serving system's version of the app names its classifiers "eb0" … "eb6",
        // profiled under those names but with no accuracy published for them: refused,
        // with or without a fallback profile (an explicit opt-in for latencies, which
        // does not make up accuracies).
        let serving = std::fs::read_to_string(dir.join("traces__apps__traffic_analysis.json")).unwrap();
        let error = from_loki_app(&serving, &profiles, "serving").unwrap_err().to_string();
        assert!(error.contains("no published accuracy of \"eb"), "{error}");
        let mut with_fallback = profiles;
        with_fallback.fallback = Some(Profile::Linear { alpha_ns: 2e6, beta_ns: 5e6 });
        let error = from_loki_app(&serving, &with_fallback, "serving").unwrap_err().to_string();
        assert!(error.contains("no published accuracy of \"eb"), "{error}");
    }
}
