//! The pipeline as Loki's planners see it: a rooted tree of tasks, each with model
//! variants (normalised accuracy, batch latency per allowed batch size, total
//! fan-out), the root-to-leaf branches, and the augmented-graph paths (one variant
//! per task along a branch).
//!
//! Pseudo stages (a sink that merges branches, any stage whose every variant runs in
//! under a microsecond) are left out of the tree: they cost nothing, get one worker
//! and are served first come, first served.

use yardmaster_sdk::helpers::is_offline;
use yardmaster_sdk::{Config, LatencyTable, StageId, Stream, VariantId};

/// Default allowed batch sizes `B`.
pub const DEFAULT_BATCHES: &[u32] = &[1, 2, 4, 8, 16, 32, 64];

/// One model variant of a task.
#[derive(Clone, Debug, PartialEq)]
pub struct VariantModel {
    /// The variant's id in its stage.
    pub id: VariantId,
    /// Accuracy normalised by the most accurate variant of the task (max 1).
    pub accuracy: f64,
    /// Mean sub-requests emitted per request, over all children (offline profile).
    pub fan_out: f64,
    /// Batch latency in ms per entry of [`PipelineModel::batches`]; infinite where the
    /// batch is not allowed on the stage.
    pub latency_ms: Vec<f64>,
}

impl VariantModel {
    /// Throughput in requests per second at batch index `b`.
    pub fn throughput(&self, b: usize, batches: &[u32]) -> f64 {
        batches[b] as f64 * 1000.0 / self.latency_ms[b]
    }
}

/// One task (a stage that does real work).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskModel {
    /// The stage.
    pub stage: StageId,
    /// The stage's name.
    pub name: String,
    /// Parent task (none for the root).
    pub parent: Option<usize>,
    /// Child tasks.
    pub children: Vec<usize>,
    /// Variants, in the stage's order.
    pub variants: Vec<VariantModel>,
    /// Index of the most accurate variant (`k_max`).
    pub most_accurate: usize,
    /// Most workers the host lets the stage have.
    pub max_replicas: u32,
}

impl TaskModel {
    /// Whether every variant takes no time (a pseudo-task at the root, as the Loki
    /// authors' `source`: its latencies are clamped to a microsecond).
    pub fn takes_no_time(&self) -> bool {
        self.variants.iter().all(|v| v.latency_ms.iter().filter(|l| l.is_finite()).all(|&l| l <= PSEUDO_LATENCY_NS as f64 / 1e6))
    }
}

/// The pipeline tree with its branches.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineModel {
    /// Tasks, parents before children (index 0 is the root).
    pub tasks: Vec<TaskModel>,
    /// Root-to-leaf task lists.
    pub branches: Vec<Vec<usize>>,
    /// Pseudo stages (no cost, outside the optimisation).
    pub pseudo: Vec<StageId>,
    /// Allowed batch sizes.
    pub batches: Vec<u32>,
    /// End-to-end SLO in ms.
    pub slo_ms: f64,
    /// Task index of each stage id (none for pseudo stages).
    task_of_stage: Vec<Option<usize>>,
}

/// Latency below which a stage counts as a pseudo stage.
const PSEUDO_LATENCY_NS: u64 = 1_000;

impl PipelineModel {
    /// Build the model from the policy configuration (the entry of the first stream
    /// whose entry stage is online is the root and its SLO the pipeline's; a stage is
    /// offline while its model is out of service), allowing `batches` (capped per
    /// stage by its `max-batch`).
    pub fn from_config(config: &Config, latency: &LatencyTable, batches: &[u32]) -> Result<Self, String> {
        let online = |stream: &&Stream| config.stages.iter().any(|s| s.id == stream.entry && !is_offline(s));
        let stream = config.streams.iter().find(online).or(config.streams.first()).ok_or("Loki needs a stream")?;
        let stage_count = config.stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut pseudo = Vec::new();
        for stage in &config.stages {
            let free = stage
                .variants
                .iter()
                .all(|v| latency.mean(stage.id, v.id, stage.max_batch.max(1)).is_none_or(|ns| ns <= PSEUDO_LATENCY_NS));
            if free && stage.id != stream.entry {
                pseudo.push(stage.id);
            }
        }
        let mut task_of_stage = vec![None; stage_count];
        let mut tasks: Vec<TaskModel> = Vec::new();
        // Breadth-first from the entry over real stages.
        let mut frontier = vec![(stream.entry, None::<usize>)];
        while let Some((stage_id, parent)) = frontier.first().copied() {
            frontier.remove(0);
            if let Some(existing) = task_of_stage[stage_id as usize] {
                let _ = existing;
                return Err(format!("stage {stage_id} has two parents: Loki needs a tree of tasks"));
            }
            let stage = config.stages.iter().find(|s| s.id == stage_id).ok_or("unknown stage")?;
            if stage.variants.is_empty() {
                return Err(format!("stage {} has no variants", stage.name));
            }
            let best = stage.variants.iter().map(|v| v.accuracy).fold(0.0, f64::max);
            let variants = stage
                .variants
                .iter()
                .map(|v| VariantModel {
                    id: v.id,
                    accuracy: if best > 0.0 { v.accuracy / best } else { 1.0 },
                    fan_out: v.fan_out,
                    latency_ms: batches
                        .iter()
                        .map(|&b| match latency.mean(stage.id, v.id, b) {
                            Some(ns) if b <= stage.max_batch => (ns as f64 / 1e6).max(1e-3),
                            _ => f64::INFINITY,
                        })
                        .collect(),
                })
                .collect::<Vec<_>>();
            let most_accurate = (0..variants.len())
                .max_by(|&a, &b| variants[a].accuracy.total_cmp(&variants[b].accuracy).then(b.cmp(&a)))
                .expect("variants");
            let index = tasks.len();
            task_of_stage[stage_id as usize] = Some(index);
            tasks.push(TaskModel {
                stage: stage_id,
                name: stage.name.clone(),
                parent,
                children: Vec::new(),
                variants,
                most_accurate,
                max_replicas: stage.max_replicas.max(1),
            });
            if let Some(p) = parent {
                tasks[p].children.push(index);
            }
            for &next in &stage.successors {
                if !pseudo.contains(&next) {
                    frontier.push((next, Some(index)));
                }
            }
        }
        let mut branches = Vec::new();
        let mut stack = vec![vec![0usize]];
        while let Some(branch) = stack.pop() {
            let last = *branch.last().expect("non-empty");
            if tasks[last].children.is_empty() {
                branches.push(branch);
            } else {
                for &child in tasks[last].children.iter().rev() {
                    let mut next = branch.clone();
                    next.push(child);
                    stack.push(next);
                }
            }
        }
        Ok(Self { tasks, branches, pseudo, batches: batches.to_vec(), slo_ms: stream.slo as f64 / 1e6, task_of_stage })
    }

    /// The task a stage holds, if it is not a pseudo stage.
    pub fn task_of(&self, stage: StageId) -> Option<usize> {
        self.task_of_stage.get(stage as usize).copied().flatten()
    }

    /// Position of `child` among `task`'s children.
    pub fn child_slot(&self, task: usize, child: usize) -> Option<usize> {
        self.tasks[task].children.iter().position(|&c| c == child)
    }

    /// Every path of a branch: one variant index per task of the branch.
    pub fn paths(&self, branch: usize) -> Vec<Vec<usize>> {
        let tasks = &self.branches[branch];
        let mut paths = vec![Vec::new()];
        for &t in tasks {
            let mut next = Vec::new();
            for p in &paths {
                for k in 0..self.tasks[t].variants.len() {
                    let mut q = p.clone();
                    q.push(k);
                    next.push(q);
                }
            }
            paths = next;
        }
        paths
    }

    /// Accuracy of a path: the product of its normalised accuracies.
    pub fn path_accuracy(&self, branch: usize, path: &[usize]) -> f64 {
        self.branches[branch].iter().zip(path).map(|(&t, &k)| self.tasks[t].variants[k].accuracy).product()
    }

    /// For each task, the branch whose paths count its load (the first that holds it).
    pub fn counting_branch(&self, task: usize) -> usize {
        self.branches.iter().position(|b| b.contains(&task)).expect("every task lies on a branch")
    }

    /// Smallest batch-1 latency of any variant of a task (ms).
    pub fn fastest_ms(&self, task: usize) -> f64 {
        self.tasks[task].variants.iter().map(|v| v.latency_ms[0]).fold(f64::INFINITY, f64::min)
    }
}

/// Multiplicative factors `r(i,k→j)`: per task, per variant, per child slot.
pub type Factors = Vec<Vec<Vec<f64>>>;

/// Offline factors: a variant's total fan-out split across the children in
/// proportion to `shares[task][child slot]` (equal shares when unknown).
pub fn offline_factors(model: &PipelineModel, shares: &[Vec<f64>]) -> Factors {
    model
        .tasks
        .iter()
        .enumerate()
        .map(|(t, task)| {
            let children = task.children.len();
            task.variants
                .iter()
                .map(|v| {
                    (0..children)
                        .map(|slot| {
                            let share = shares.get(t).and_then(|s| s.get(slot)).copied().unwrap_or(1.0 / children as f64);
                            v.fan_out * share
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Sub-requests reaching position `pos` of a branch per root query routed along
/// `path` (1 at the root; the product of the factors above).
pub fn multiplier(model: &PipelineModel, factors: &Factors, branch: usize, path: &[usize], pos: usize) -> f64 {
    let tasks = &model.branches[branch];
    let mut m = 1.0;
    for q in 0..pos {
        let slot = model.child_slot(tasks[q], tasks[q + 1]).expect("branch follows the tree");
        m *= factors[tasks[q]][path[q]][slot];
    }
    m
}

#[cfg(test)]
pub(crate) mod toy {
    //! The spec's toy chain (§7) and small variants of it, as policy configurations.

    use yardmaster_sdk::{Config, LatencyPoint, LatencyTable, Stage, StageKind, Stream, Variant};

    use super::{offline_factors, Factors, PipelineModel};

    /// The toy chain as a planning model (batch sizes 1 to 16) with its offline
    /// factors (no measured branch shares).
    pub fn chain_model() -> (PipelineModel, Factors) {
        let config = chain();
        let model = PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4, 8, 16]).unwrap();
        let factors = offline_factors(&model, &[]);
        (model, factors)
    }

    /// A linear profile `alpha + beta·b` ms at the given batch sizes.
    pub fn linear(alpha: f64, beta: f64, batches: &[u32]) -> Vec<LatencyPoint> {
        batches
            .iter()
            .map(|&b| {
                let ns = ((alpha + beta * b as f64) * 1e6) as u64;
                LatencyPoint { batch: b, mean: ns, tail: ns }
            })
            .collect()
    }

    /// A variant.
    pub fn variant(id: u32, name: &str, accuracy: f64, profile: Vec<LatencyPoint>, fan_out: f64) -> Variant {
        Variant { id, name: name.into(), accuracy, profile, memory_bytes: 1 << 30, fan_out }
    }

    /// A stage.
    pub fn stage(id: u32, name: &str, successors: Vec<u32>, predecessors: Vec<u32>, variants: Vec<Variant>, max_batch: u32) -> Stage {
        Stage {
            id,
            name: name.into(),
            kind: StageKind::Batch,
            successors,
            predecessors,
            variants,
            max_batch,
            min_replicas: 1,
            max_replicas: 64,
        }
    }

    /// The toy chain T1 → T2 of the spec, `S = 10`, `L = 200 ms`.
    pub fn chain() -> Config {
        let b = [1, 2, 4, 8, 16];
        Config {
            arm: "toy".into(),
            stages: vec![
                stage(
                    0,
                    "T1",
                    vec![1],
                    vec![],
                    vec![variant(0, "D_hi", 1.0, linear(10.0, 5.0, &b), 4.0), variant(1, "D_lo", 0.7, linear(4.0, 2.0, &b), 2.0)],
                    16,
                ),
                stage(
                    1,
                    "T2",
                    vec![],
                    vec![0],
                    vec![variant(0, "C_hi", 1.0, linear(5.0, 2.0, &b), 0.0), variant(1, "C_lo", 0.9, linear(2.0, 1.0, &b), 0.0)],
                    16,
                ),
            ],
            workers: Vec::new(),
            streams: vec![Stream { id: 0, name: "toy".into(), entry: 0, slo: 200_000_000 }],
            params: Vec::new(),
            tick_interval: 1_000_000_000,
            max_workers: 10,
            seed: 1,
            now: 0,
            hosts: Vec::new(),
        }
    }

    /// A tree: detect → {cars, faces} → sink.
    pub fn tree() -> Config {
        let b = [1, 2, 4, 8, 16];
        Config {
            arm: "tree".into(),
            stages: vec![
                stage(
                    0,
                    "detect",
                    vec![1, 2],
                    vec![],
                    vec![variant(0, "det_lo", 0.8, linear(4.0, 2.0, &b), 2.0), variant(1, "det_hi", 1.0, linear(8.0, 4.0, &b), 4.0)],
                    16,
                ),
                stage(
                    1,
                    "cars",
                    vec![3],
                    vec![0],
                    vec![variant(0, "car_lo", 0.9, linear(2.0, 1.0, &b), 0.0), variant(1, "car_hi", 1.0, linear(4.0, 2.0, &b), 0.0)],
                    16,
                ),
                stage(2, "faces", vec![3], vec![0], vec![variant(0, "face", 1.0, linear(3.0, 1.0, &b), 0.0)], 16),
                stage(3, "sink", vec![], vec![1, 2], vec![variant(0, "sink", 1.0, linear(0.0, 0.0, &b), 0.0)], 64),
            ],
            workers: Vec::new(),
            streams: vec![Stream { id: 0, name: "tree".into(), entry: 0, slo: 300_000_000 }],
            params: Vec::new(),
            tick_interval: 1_000_000_000,
            max_workers: 12,
            seed: 1,
            now: 0,
            hosts: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_toy_chain_and_a_tree_with_a_pseudo_sink() {
        let config = toy::chain();
        let model = PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4, 8, 16]).unwrap();
        assert_eq!(model.tasks.len(), 2);
        assert_eq!(model.branches, vec![vec![0, 1]]);
        assert_eq!(model.tasks[0].most_accurate, 0);
        assert_eq!(model.tasks[0].variants[1].latency_ms[2], 12.0, "D_lo at b = 4: 4 + 2·4");
        assert_eq!(model.paths(0).len(), 4);
        assert!((model.path_accuracy(0, &[1, 1]) - 0.63).abs() < 1e-12);
        let config = toy::tree();
        let model = PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4]).unwrap();
        assert_eq!(model.pseudo, vec![3]);
        assert_eq!(model.branches, vec![vec![0, 1], vec![0, 2]]);
        assert_eq!(model.task_of(3), None);
        assert_eq!(model.tasks[0].most_accurate, 1);
        let factors = offline_factors(&model, &[vec![0.75, 0.25]]);
        assert_eq!(factors[0][1], vec![3.0, 1.0]);
        assert_eq!(multiplier(&model, &factors, 1, &[1, 0], 1), 1.0);
        assert_eq!(multiplier(&model, &factors, 0, &[1, 0], 1), 3.0);
    }

    #[test]
    fn the_tree_is_rooted_at_the_first_stream_whose_model_is_in_service() {
        // The toy chain beside an independent model with a stream of its own.
        let mut config = toy::chain();
        let profile = toy::linear(3.0, 1.0, &[1, 2, 4]);
        config.stages.push(toy::stage(2, "other", vec![], vec![], vec![toy::variant(0, "v", 1.0, profile, 1.0)], 4));
        config.streams.push(Stream { id: 1, name: "other".into(), entry: 2, slo: 300_000_000 });
        let build = |config: &Config| PipelineModel::from_config(config, &LatencyTable::from_config(config), &[1, 2, 4]).unwrap();
        let served = build(&config);
        assert_eq!((served.tasks.len(), served.tasks[0].stage, served.slo_ms), (2, 0, 200.0));
        // The chain's model unloaded (its entry offline): the other model's stream roots
        // the tree, and no task of an offline stage is planned.
        config.stages[0].min_replicas = 0;
        config.stages[0].max_replicas = 0;
        let unloaded = build(&config);
        assert_eq!((unloaded.tasks.len(), unloaded.tasks[0].stage, unloaded.slo_ms), (1, 2, 300.0));
        assert_eq!(unloaded.task_of(0), None);
    }
}
