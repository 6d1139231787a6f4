//! Pipelines: the graph of stages a request passes through, the model variants of
//! each stage with their accuracy and latency profile, and the streams that feed it.
//!
//! The files that describe pipelines (our TOML, Loki's application JSON) are read by
//! `yardmaster_formats::pipeline`; this module is the model they are read into.

use std::collections::HashMap;

use yardmaster_policy::contract::{self, DeviceKind, LatencyPoint, StageKind};

pub use crate::hosts::HostDef;

/// Batch latency of a variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Profile {
    /// `alpha · batch + beta` (the linear model of Clockwork, Shepherd and PARD).
    Linear {
        /// Nanoseconds per request in the batch.
        alpha_ns: f64,
        /// Fixed nanoseconds per batch.
        beta_ns: f64,
    },
    /// Measured points, sorted by batch size; interpolated linearly between them and
    /// extrapolated from the last two.
    Points(Vec<LatencyPoint>),
}

impl Profile {
    /// Mean latency of a batch of `batch`.
    pub fn mean(&self, batch: u32) -> u64 {
        self.lookup(batch, |p| p.mean)
    }

    /// Tail (p99, or the worst profiled percentile) latency of a batch of `batch`.
    pub fn tail(&self, batch: u32) -> u64 {
        self.lookup(batch, |p| p.tail)
    }

    fn lookup(&self, batch: u32, value: impl Fn(&LatencyPoint) -> u64) -> u64 {
        let batch = batch.max(1);
        match self {
            Profile::Linear { alpha_ns, beta_ns } => (alpha_ns * batch as f64 + beta_ns).max(0.0) as u64,
            Profile::Points(points) => yardmaster_sdk::interpolate(points, batch, |p| p.batch, value).unwrap_or(0),
        }
    }

    /// The profile as the contract's points, for batch sizes 1, 2, 4, … up to `max_batch`.
    pub fn to_points(&self, max_batch: u32) -> Vec<LatencyPoint> {
        match self {
            Profile::Points(points) => points.clone(),
            Profile::Linear { .. } => {
                let mut sizes = Vec::new();
                let mut b = 1;
                while b < max_batch {
                    sizes.push(b);
                    b = b.saturating_mul(2);
                }
                sizes.push(max_batch.max(1));
                sizes.into_iter().map(|b| LatencyPoint { batch: b, mean: self.mean(b), tail: self.tail(b) }).collect()
            }
        }
    }
}

/// One way of serving a stage.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantDef {
    /// Name (for logs and reports).
    pub name: String,
    /// Accuracy in [0, 1].
    pub accuracy: f64,
    /// Batch latency (iteration stages: latency of one decode step of the batch).
    pub profile: Profile,
    /// Accelerator memory of a replica.
    pub memory_bytes: u64,
    /// Mean pieces each input yields per successor stage; a successor not listed
    /// receives exactly one.
    pub fan_out: Vec<(u32, f64)>,
    /// Start-up of a replica whose parameters must be read from disk.
    pub cold_start_ns: u64,
    /// Start-up of a replica whose parameters are cached in host memory.
    pub warm_start_ns: u64,
}

impl VariantDef {
    /// Mean pieces per input sent to `successor`.
    pub fn fan_out_to(&self, successor: u32) -> f64 {
        self.fan_out.iter().find(|(s, _)| *s == successor).map_or(1.0, |(_, f)| *f)
    }

    /// Mean pieces per input over all successors (the contract's `fan-out`).
    pub fn total_fan_out(&self, successors: &[u32]) -> f64 {
        successors.iter().map(|s| self.fan_out_to(*s)).sum::<f64>().max(if successors.is_empty() { 1.0 } else { 0.0 })
    }
}

/// LLM costs of an iteration-level stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmCosts {
    /// Prefill time per prompt token.
    pub prefill_ns_per_token: f64,
    /// KV-cache bytes per token (prompt and generated).
    pub kv_bytes_per_token: u64,
    /// Swapping a sequence out or in: nanoseconds per KV byte.
    pub swap_ns_per_byte: f64,
    /// Extra decode-step time per unit of the batch's input-length spread (the
    /// coefficient of variation of prompt lengths), as a fraction of the step.
    pub spread_penalty: f64,
}

impl Default for LlmCosts {
    fn default() -> Self {
        Self { prefill_ns_per_token: 20_000.0, kv_bytes_per_token: 800 << 10, swap_ns_per_byte: 0.05, spread_penalty: 0.3 }
    }
}

/// One stage of a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StageDef {
    /// Name.
    pub name: String,
    /// Batch or iteration-level.
    pub kind: StageKind,
    /// Stages fed by this one.
    pub successors: Vec<u32>,
    /// Stages feeding this one.
    pub predecessors: Vec<u32>,
    /// Variants (at least one).
    pub variants: Vec<VariantDef>,
    /// Largest batch.
    pub max_batch: u32,
    /// Replicas at start.
    pub replicas: u32,
    /// Replica bounds for scaling.
    pub min_replicas: u32,
    /// Replica bounds for scaling.
    pub max_replicas: u32,
    /// Device of the stage's workers.
    pub device: DeviceKind,
    /// Intra-op threads of a worker at start.
    pub threads: u32,
    /// Share of a job's time that divides among the worker's threads (Amdahl's law;
    /// the profile is taken at `threads`), for stages whose CPU-side work (transfer,
    /// serialisation, control flow) speeds up with cores even on a GPU. `None`: GPU
    /// workers ignore threads and CPU workers speed up sub-linearly.
    pub parallel_fraction: Option<f64>,
    /// Accelerator memory of a worker (KV capacity for iteration stages).
    pub worker_memory_bytes: u64,
    /// LLM costs (iteration stages).
    pub llm: LlmCosts,
}

impl StageDef {
    /// Whether every variant takes no time at all (a pseudo stage such as the `sink`
    /// that merges a Loki application's branches).
    pub fn takes_no_time(&self) -> bool {
        self.variants.iter().all(|v| v.profile.mean(self.max_batch.max(1)) == 0)
    }
}

/// A stream of requests entering the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamDef {
    /// Name.
    pub name: String,
    /// Entry stage.
    pub entry: u32,
    /// End-to-end SLO.
    pub slo_ns: u64,
}

/// A pipeline graph with its streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Name.
    pub name: String,
    /// Stages, indexed by stage id.
    pub stages: Vec<StageDef>,
    /// Streams, indexed by stream id.
    pub streams: Vec<StreamDef>,
    /// Most workers the cluster can run.
    pub max_workers: u32,
    /// The cluster's hosts; none: one implicit host with `max_workers` slots (see
    /// [`crate::hosts`]). A host with no slot is one that left the cluster (it keeps
    /// its place).
    pub hosts: Vec<HostDef>,
}

/// Most workers a pipeline may ask for (`max_workers`, and so its initial replicas):
/// the host keeps an entry per worker, so a file must not be able to ask for billions.
pub const MAX_WORKERS: u32 = 65_536;

/// Why a pipeline description was refused.
#[derive(Debug, thiserror::Error)]
#[error("pipeline {source_name}: {message}")]
pub struct PipelineError {
    /// The file or preset.
    pub source_name: String,
    /// What is wrong.
    pub message: String,
}

impl Pipeline {
    /// The initial workers as the engine numbers them: `(worker, stage)`, stage by
    /// stage from worker 0 (executors that start these workers themselves follow it).
    pub fn initial_workers(&self) -> Vec<(u32, u32)> {
        let stages = self.stages.iter().enumerate().flat_map(|(stage, def)| std::iter::repeat_n(stage as u32, def.replicas as usize));
        stages.enumerate().map(|(worker, stage)| (worker as u32, stage)).collect()
    }

    /// Check the graph: names unique, edges valid and symmetric, acyclic, bounds sane.
    pub fn validate(&self, source_name: &str) -> Result<(), PipelineError> {
        let fail = |message: String| Err(PipelineError { source_name: source_name.into(), message });
        if self.stages.is_empty() {
            return fail("no stages".into());
        }
        if self.streams.is_empty() {
            return fail("no streams".into());
        }
        let mut names = HashMap::new();
        for (i, stage) in self.stages.iter().enumerate() {
            if names.insert(stage.name.as_str(), i).is_some() {
                return fail(format!("two stages are named {:?}", stage.name));
            }
            if stage.variants.is_empty() {
                return fail(format!("stage {:?} has no variant", stage.name));
            }
            if stage.max_batch == 0 {
                return fail(format!("stage {:?}: max_batch must be at least 1", stage.name));
            }
            if stage.min_replicas > stage.max_replicas || stage.replicas > stage.max_replicas || stage.replicas < stage.min_replicas {
                return fail(format!(
                    "stage {:?}: replicas {} outside [{}, {}]",
                    stage.name, stage.replicas, stage.min_replicas, stage.max_replicas
                ));
            }
            for &s in &stage.successors {
                let Some(next) = self.stages.get(s as usize) else {
                    return fail(format!("stage {:?} feeds a stage that does not exist ({s})", stage.name));
                };
                if !next.predecessors.contains(&(i as u32)) {
                    return fail(format!("edge {:?} → {:?} is missing its reverse", stage.name, next.name));
                }
            }
            for variant in &stage.variants {
                if !(0.0..=1.0).contains(&variant.accuracy) {
                    return fail(format!("variant {:?}: accuracy {} outside [0, 1]", variant.name, variant.accuracy));
                }
                if let Profile::Points(points) = &variant.profile {
                    if points.is_empty() || points.windows(2).any(|w| w[0].batch >= w[1].batch) {
                        return fail(format!("variant {:?}: profile points must be non-empty and sorted by batch", variant.name));
                    }
                }
            }
        }
        if let Some(cycle_at) = self.find_cycle() {
            return fail(format!("the graph has a cycle through stage {:?}", self.stages[cycle_at].name));
        }
        for stream in &self.streams {
            if stream.entry as usize >= self.stages.len() {
                return fail(format!("stream {:?} enters at a stage that does not exist", stream.name));
            }
        }
        let initial: u64 = self.stages.iter().map(|s| s.replicas as u64).sum();
        if initial > MAX_WORKERS as u64 {
            return fail(format!("{initial} initial replicas exceed the host's limit of {MAX_WORKERS} workers"));
        }
        if self.max_workers > MAX_WORKERS {
            return fail(format!("max_workers = {} is over the host's limit of {MAX_WORKERS}", self.max_workers));
        }
        if initial > self.max_workers as u64 {
            return fail(format!("{initial} initial replicas exceed max_workers = {}", self.max_workers));
        }
        let mut host_names = HashMap::new();
        for host in &self.hosts {
            if host_names.insert(host.name.as_str(), ()).is_some() {
                return fail(format!("two hosts are named {:?}", host.name));
            }
        }
        let slots: u64 = self.hosts.iter().map(|h| h.slots as u64).sum();
        if !self.hosts.is_empty() && slots == 0 {
            return fail("no host has a slot".into());
        }
        // Workers may outnumber slots: they share them (several models on one GPU, as
        // Triton runs them), which the hosts' model allows (see `crate::hosts`).
        Ok(())
    }

    fn find_cycle(&self) -> Option<usize> {
        // Kahn's algorithm: whatever is left with in-degree > 0 lies on a cycle.
        let mut indegree: Vec<usize> = self.stages.iter().map(|s| s.predecessors.len()).collect();
        let mut ready: Vec<usize> = (0..self.stages.len()).filter(|&i| indegree[i] == 0).collect();
        let mut seen = 0;
        while let Some(i) = ready.pop() {
            seen += 1;
            for &s in &self.stages[i].successors {
                indegree[s as usize] -= 1;
                if indegree[s as usize] == 0 {
                    ready.push(s as usize);
                }
            }
        }
        (seen < self.stages.len()).then(|| indegree.iter().position(|&d| d > 0).unwrap_or(0))
    }

    /// Stage id by name.
    pub fn stage_id(&self, name: &str) -> Option<u32> {
        self.stages.iter().position(|s| s.name == name).map(|i| i as u32)
    }

    /// The stages as the policy contract describes them.
    pub fn contract_stages(&self) -> Vec<contract::Stage> {
        self.stages
            .iter()
            .enumerate()
            .map(|(i, s)| contract::Stage {
                id: i as u32,
                name: s.name.clone(),
                kind: s.kind,
                successors: s.successors.clone(),
                predecessors: s.predecessors.clone(),
                variants: s
                    .variants
                    .iter()
                    .enumerate()
                    .map(|(v, variant)| contract::Variant {
                        id: v as u32,
                        name: variant.name.clone(),
                        accuracy: variant.accuracy,
                        profile: variant.profile.to_points(s.max_batch),
                        memory_bytes: variant.memory_bytes,
                        fan_out: variant.total_fan_out(&s.successors),
                    })
                    .collect(),
                max_batch: s.max_batch,
                min_replicas: s.min_replicas,
                max_replicas: s.max_replicas,
            })
            .collect()
    }

    /// The streams as the policy contract describes them.
    pub fn contract_streams(&self) -> Vec<contract::Stream> {
        self.streams
            .iter()
            .enumerate()
            .map(|(i, s)| contract::Stream { id: i as u32, name: s.name.clone(), entry: s.entry, slo: s.slo_ns })
            .collect()
    }
}

/// Fill every stage's predecessors from the successors.
pub fn link_predecessors(stages: &mut [StageDef]) {
    for stage in stages.iter_mut() {
        stage.predecessors.clear();
    }
    for i in 0..stages.len() {
        for s in stages[i].successors.clone() {
            if let Some(next) = stages.get_mut(s as usize) {
                next.predecessors.push(i as u32);
            }
        }
    }
}
