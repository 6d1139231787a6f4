//! Plans that route every query down one path per branch (one variant per task):
//! the exact hardware-scaling step (STEP1: the most accurate variants, per-task batch
//! sizes searched exactly over the tree's Pareto frontiers, fewest workers), the greedy accuracy-scaling fallback (the
//! most accurate variant choice that fits the cluster), the served fraction of a
//! fixed choice on the whole cluster (the InferLine-like baseline), and the
//! `FASTEST` fallback.

use crate::model::{multiplier, Factors, PipelineModel};
use crate::plan::{Hosting, Plan, Regime};
use crate::vectors::{cheapest, quickest, Vectors, NOT_ALLOWED};
use yardmaster_sdk::helpers::bottleneck_fill;

/// The cheapest batch sizes for a fixed variant choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizing {
    /// Batch index per task.
    pub batch: Vec<usize>,
    /// Workers per task.
    pub replicas: Vec<u32>,
    /// Sub-requests per root query reaching each task.
    pub per_query: Vec<f64>,
    /// Longest branch latency (ms) at the chosen batches.
    pub max_latency: f64,
}

impl Sizing {
    /// Workers in all.
    pub fn workers(&self) -> u32 {
        self.replicas.iter().sum()
    }
}

/// Sub-requests per root query reaching each task when every task runs `choice`.
pub fn per_query_load(model: &PipelineModel, factors: &Factors, choice: &[usize]) -> Vec<f64> {
    let mut load = vec![0.0; model.tasks.len()];
    for (b, tasks) in model.branches.iter().enumerate() {
        let path: Vec<usize> = tasks.iter().map(|&t| choice[t]).collect();
        for (pos, &t) in tasks.iter().enumerate() {
            load[t] = multiplier(model, factors, b, &path, pos);
        }
    }
    load
}

/// Fewest workers serving `demand` with one variant per task (`choice`) within the
/// per-path latency cap; ties go to the lower longest-branch latency, then to the
/// first batch vector in odometer order (task 0's index turning fastest). `None` when
/// no batch vector meets the cap.
pub fn cheapest_sizing(model: &PipelineModel, factors: &Factors, choice: &[usize], demand: f64, cap_ms: f64) -> Option<Sizing> {
    cheapest_sizing_within(model, factors, choice, demand, cap_ms, u64::MAX)
}

/// [`cheapest_sizing`] among the sizings of at most `limit` workers.
fn cheapest_sizing_within(
    model: &PipelineModel,
    factors: &Factors,
    choice: &[usize],
    demand: f64,
    cap_ms: f64,
    limit: u64,
) -> Option<Sizing> {
    Tables::new(model, factors, choice, demand, cap_ms).sizing(limit, |_| true)
}

/// What sizing one variant choice for a demand needs.
struct Tables<'a> {
    vectors: Vectors<'a>,
    per_query: Vec<f64>,
    /// Workers each task needs at each batch index ([`NOT_ALLOWED`] above its cap).
    replicas_at: Vec<Vec<u64>>,
}

impl<'a> Tables<'a> {
    fn new(model: &'a PipelineModel, factors: &Factors, choice: &[usize], demand: f64, cap_ms: f64) -> Self {
        let per_query = per_query_load(model, factors, choice);
        let replicas_at = (0..model.tasks.len())
            .map(|t| {
                let v = &model.tasks[t].variants[choice[t]];
                (0..model.batches.len())
                    .map(|b| {
                        let need = demand * per_query[t] / v.throughput(b, &model.batches);
                        let r = (need - 1e-9).ceil().max(1.0);
                        if r <= model.tasks[t].max_replicas as f64 {
                            r as u64
                        } else {
                            NOT_ALLOWED
                        }
                    })
                    .collect()
            })
            .collect();
        Self { vectors: Vectors::new(model, choice, cap_ms), per_query, replicas_at }
    }

    /// The cheapest sizing of at most `limit` workers, if `wanted` takes its worker
    /// count (asked before the batch vector is picked out).
    fn sizing(self, limit: u64, wanted: impl FnOnce(u32) -> bool) -> Option<Sizing> {
        let fixed = vec![None; self.replicas_at.len()];
        let (workers, _) = cheapest(&self.vectors.frontier(&self.replicas_at, &fixed, limit))?;
        if !wanted(workers as u32) {
            return None;
        }
        let batch = self.vectors.first_with(&self.replicas_at, limit, cheapest)?;
        let replicas = batch.iter().enumerate().map(|(t, &b)| self.replicas_at[t][b] as u32).collect();
        let max_latency = self.vectors.longest(&batch);
        Some(Sizing { batch, replicas, per_query: self.per_query, max_latency })
    }
}

/// A plan from a single-path sizing.
pub fn plan_from_sizing(model: &PipelineModel, choice: &[usize], sizing: &Sizing, demand: f64, regime: Regime) -> Plan {
    let hosts = (0..model.tasks.len())
        .map(|t| Hosting {
            task: t,
            variant: choice[t],
            batch: model.batches[sizing.batch[t]],
            replicas: sizing.replicas[t],
            load: demand * sizing.per_query[t],
        })
        .collect();
    Plan { hosts, accuracy: choice_accuracy(model, choice), demand, regime }
}

/// Branch-averaged accuracy of a single-path choice.
pub fn choice_accuracy(model: &PipelineModel, choice: &[usize]) -> f64 {
    // Each branch's product taken from the root down, as `path_accuracy` takes it.
    let total: f64 =
        model.branches.iter().map(|branch| branch.iter().map(|&t| model.tasks[t].variants[choice[t]].accuracy).product::<f64>()).sum();
    total / model.branches.len() as f64
}

/// STEP1, hardware scaling: the most accurate variants with the fewest workers, or
/// `None` when that needs more than `cluster` workers (or no batch meets the cap).
pub fn hardware_scaling(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64, cluster: u32) -> Option<Plan> {
    let choice: Vec<usize> = model.tasks.iter().map(|t| t.most_accurate).collect();
    let sizing = Tables::new(model, factors, &choice, demand, cap_ms).sizing(cluster as u64, |_| true)?;
    Some(plan_from_sizing(model, &choice, &sizing, demand, Regime::Hardware))
}

/// Greedy accuracy scaling: among every single-path variant choice, the most
/// accurate one whose cheapest sizing fits the cluster (ties: fewer workers, then the
/// first choice in odometer order, task 0's variant turning fastest).
///
/// Only the choices that can fit whatever their batches ([`fewest_workers`] within
/// the cluster) are listed ([`fitting_choices`], which passes over the rest a family
/// at a time); they are sized from the most accurate down, and the search stops at
/// the first accuracy below the best that fits. Listing every choice, each with its
/// accuracy and its bound, was what ran out of an event call's fuel on a random
/// seven-task application (21,000 choices, of which one or none can fit). More than
/// [`MAX_ORDERED_CHOICES`] fitting choices are sized in the order they are found.
pub fn best_single_path(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64, cluster: u32) -> Option<Plan> {
    let mut best: Option<(f64, u32, Plan)> = None;
    let consider = |choice: &[usize], accuracy: f64, best: &mut Option<(f64, u32, Plan)>| {
        // Sized only when it would replace the best (the fewest workers come first).
        let better = |workers: u32| best.as_ref().is_none_or(|(a, w, _)| accuracy > *a + 1e-12 || (accuracy >= *a - 1e-12 && workers < *w));
        if let Some(sizing) = Tables::new(model, factors, choice, demand, cap_ms).sizing(cluster as u64, better) {
            *best = Some((accuracy, sizing.workers(), plan_from_sizing(model, choice, &sizing, demand, Regime::Accuracy)));
        }
    };
    // Each fitting choice by its accuracy and odometer rank (its variants decoded
    // from the rank when it is sized).
    let mut choices: Vec<(f64, u64)> = Vec::new();
    let listed = fitting_choices(model, factors, demand, cluster, &mut |choice, rank| {
        if choices.len() == MAX_ORDERED_CHOICES {
            return false;
        }
        choices.push((choice_accuracy(model, choice), rank));
        true
    });
    if listed {
        // The most accurate first; equal accuracies in odometer order.
        choices.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut choice = vec![0usize; model.tasks.len()];
        for &(accuracy, rank) in &choices {
            if best.as_ref().is_some_and(|(a, _, _)| accuracy < *a - 1e-12) {
                break;
            }
            let mut left = rank;
            for (t, task) in model.tasks.iter().enumerate() {
                let n = task.variants.len() as u64;
                choice[t] = (left % n) as usize;
                left /= n;
            }
            consider(&choice, accuracy, &mut best);
        }
    } else {
        fitting_choices(model, factors, demand, cluster, &mut |choice, _| {
            let accuracy = choice_accuracy(model, choice);
            if best.as_ref().is_none_or(|(a, _, _)| accuracy >= *a - 1e-12) {
                consider(choice, accuracy, &mut best);
            }
            true
        });
    }
    best.map(|(_, _, plan)| plan)
}

/// The most fitting variant choices [`best_single_path`] lists to size from the most
/// accurate down (beyond, it sizes them in the order they are found).
pub const MAX_ORDERED_CHOICES: usize = 1 << 16;

/// The most root-level sub-requests a second one worker of each task's each variant
/// serves, at its most productive batch.
fn best_throughput(model: &PipelineModel) -> Vec<Vec<f64>> {
    model
        .tasks
        .iter()
        .map(|task| {
            task.variants.iter().map(|v| (0..model.batches.len()).map(|b| v.throughput(b, &model.batches)).fold(0.0, f64::max)).collect()
        })
        .collect()
}

/// Workers a variant serving `best` sub-requests a second per worker needs for
/// `demand` root queries with `per_query` sub-requests each (at least one).
fn least_workers(best: f64, demand: f64, per_query: f64) -> u64 {
    let need = demand * per_query / best;
    if need.is_finite() {
        ((need - 1e-9).ceil().max(1.0)) as u64
    } else {
        u64::MAX / 64
    }
}

/// The fewest workers `choice` needs for `demand`, every task at its most productive
/// batch and the latency cap aside: a lower bound on its [`cheapest_sizing`].
pub fn fewest_workers(model: &PipelineModel, factors: &Factors, choice: &[usize], demand: f64) -> u64 {
    let per_query = per_query_load(model, factors, choice);
    let best = best_throughput(model);
    (0..model.tasks.len()).map(|t| least_workers(best[t][choice[t]], demand, per_query[t])).fold(0u64, u64::saturating_add)
}

/// Every variant choice whose [`fewest_workers`] fit `cluster`, with its rank in
/// odometer order (task 0's variant turning fastest), handed to `visit` until it
/// returns `false`; `true` when every one was handed over.
///
/// Depth first over the tasks, parents first, so a task's sub-requests per query are
/// known when its variant is fixed: a family of choices (the variants fixed so far)
/// is passed over as soon as the fixed tasks' workers and the least the others can
/// need (each at the fewest sub-requests any choice above it sends, on its most
/// productive variant) pass the cluster.
pub fn fitting_choices(
    model: &PipelineModel,
    factors: &Factors,
    demand: f64,
    cluster: u32,
    visit: &mut dyn FnMut(&[usize], u64) -> bool,
) -> bool {
    let tasks = model.tasks.len();
    if tasks == 0 {
        return true;
    }
    // Each task's parent and its slot there.
    let mut parent: Vec<Option<(usize, usize)>> = vec![None; tasks];
    for (t, task) in model.tasks.iter().enumerate() {
        for (slot, &c) in task.children.iter().enumerate() {
            parent[c] = Some((t, slot));
        }
    }
    // The fewest sub-requests per query any choice sends each task, and the fewest
    // workers it can need; `rest[t]`: those of tasks `t..` together.
    let mut least_per_query = vec![1.0f64; tasks];
    for t in 1..tasks {
        if let Some((p, slot)) = parent[t] {
            let factor = factors[p].iter().map(|f| f[slot]).fold(f64::INFINITY, f64::min);
            least_per_query[t] = least_per_query[p] * factor;
        }
    }
    let best = best_throughput(model);
    let mut rest = vec![0u64; tasks + 1];
    for t in (0..tasks).rev() {
        let least = best[t].iter().map(|&b| least_workers(b, demand, least_per_query[t])).min().unwrap_or(u64::MAX / 64);
        rest[t] = rest[t + 1].saturating_add(least);
    }
    let mut stride = vec![1u64; tasks];
    for t in 1..tasks {
        stride[t] = stride[t - 1].saturating_mul(model.tasks[t - 1].variants.len() as u64);
    }
    let search = Search { model, factors, demand, cluster: cluster as u64, parent, best, rest, stride };
    let mut choice = vec![0usize; tasks];
    let mut per_query = vec![0.0f64; tasks];
    search.down(0, 0, 0, &mut choice, &mut per_query, visit)
}

/// The depth-first search of [`fitting_choices`].
struct Search<'a> {
    model: &'a PipelineModel,
    factors: &'a Factors,
    demand: f64,
    cluster: u64,
    parent: Vec<Option<(usize, usize)>>,
    /// [`best_throughput`].
    best: Vec<Vec<f64>>,
    rest: Vec<u64>,
    stride: Vec<u64>,
}

impl Search<'_> {
    /// Fix task `t`'s variant (tasks before it fixed, using `used` workers, at odometer
    /// rank `rank` so far); `false` once `visit` asks to stop.
    fn down(
        &self,
        t: usize,
        used: u64,
        rank: u64,
        choice: &mut [usize],
        per_query: &mut [f64],
        visit: &mut dyn FnMut(&[usize], u64) -> bool,
    ) -> bool {
        if t == choice.len() {
            return visit(choice, rank);
        }
        // As `multiplier` computes it: 1 at the root, the factors above multiplied in
        // from the root down.
        per_query[t] = match self.parent[t] {
            Some((p, slot)) => per_query[p] * self.factors[p][choice[p]][slot],
            None => 1.0,
        };
        for v in 0..self.model.tasks[t].variants.len() {
            let used = used.saturating_add(least_workers(self.best[t][v], self.demand, per_query[t]));
            if used.saturating_add(self.rest[t + 1]) > self.cluster {
                continue;
            }
            choice[t] = v;
            if !self.down(t + 1, used, rank.saturating_add((v as u64).saturating_mul(self.stride[t])), choice, per_query, visit) {
                return false;
            }
        }
        true
    }
}

/// The largest fraction of `demand` (at most 1) that `cluster` workers serve with a
/// fixed variant choice, with the plan that does it: the best of every batch vector
/// meeting the cap, workers added one at a time to the bottleneck task (found as the
/// highest capacity some vector's cheapest sizing fits the cluster at; ties to the
/// lowest longest-branch latency, then the first vector in odometer order).
pub fn max_served_fraction(
    model: &PipelineModel,
    factors: &Factors,
    choice: &[usize],
    demand: f64,
    cap_ms: f64,
    cluster: u32,
) -> Option<(f64, Plan)> {
    let per_query = per_query_load(model, factors, choice);
    let tasks = model.tasks.len();
    if cluster < tasks as u32 {
        return None;
    }
    // Capacity of one worker in root queries per second, per task and batch index.
    let unit_table: Vec<Vec<f64>> = (0..tasks)
        .map(|t| {
            (0..model.batches.len())
                .map(|b| {
                    let q = model.tasks[t].variants[choice[t]].throughput(b, &model.batches);
                    if per_query[t] > 0.0 {
                        q / per_query[t]
                    } else {
                        f64::INFINITY
                    }
                })
                .collect()
        })
        .collect();
    let caps: Vec<u32> = model.tasks.iter().map(|t| t.max_replicas).collect();
    // Workers each task needs to serve `capacity` root queries per second at each
    // batch index: a vector serves it on `cluster` workers exactly when spreading them
    // one at a time to the bottleneck reaches it (the spread maximises the lowest
    // capacity), so the best vectors are the cheapest at the capacity they reach.
    let need = |capacity: f64| -> Vec<Vec<u64>> {
        (0..tasks)
            .map(|t| {
                unit_table[t]
                    .iter()
                    .map(|&unit| {
                        let r = if unit.is_infinite() { 1.0 } else { (capacity / unit - 1e-9).ceil().max(1.0) };
                        if r <= caps[t] as f64 {
                            r as u64
                        } else {
                            NOT_ALLOWED
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let vectors = Vectors::new(model, choice, cap_ms);
    let none_fixed = vec![None; tasks];
    let serves = |capacity: f64| !vectors.frontier(&need(capacity), &none_fixed, cluster as u64).is_empty();
    if !serves(0.0) {
        return None;
    }
    // The largest share of `demand` a vector serves: 1 if one serves it all, else
    // the highest capacity level `r × unit` some vector reaches.
    let best = if demand <= 0.0 || serves(demand) {
        1.0
    } else {
        let mut levels: Vec<f64> = (0..tasks)
            .flat_map(|t| {
                let top = caps[t].min(cluster);
                unit_table[t].iter().filter(|u| u.is_finite() && **u > 0.0).flat_map(move |&u| (1..=top).map(move |r| r as f64 * u))
            })
            .filter(|&c| c < demand)
            .collect();
        levels.sort_by(f64::total_cmp);
        levels.dedup();
        // `serves` falls with the capacity: the last level it holds at.
        let (mut low, mut high) = (0usize, levels.len());
        while low < high {
            let mid = (low + high) / 2;
            if serves(levels[mid]) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        if low == 0 {
            0.0
        } else {
            levels[low - 1] / demand
        }
    };
    // Among the vectors within a hair of the best share, the lowest longest-branch
    // latency, then the first in odometer order.
    let target = if demand > 0.0 { (best - 1e-12).max(0.0) * demand } else { 0.0 };
    let batch = vectors.first_with(&need(target), cluster as u64, quickest)?;
    let unit: Vec<f64> = (0..tasks).map(|t| unit_table[t][batch[t]]).collect();
    let floors = vec![1u32; tasks];
    let mut replicas = vec![1u32; tasks];
    bottleneck_fill(&unit, &floors, &caps, cluster, &mut replicas);
    let capacity = (0..tasks).map(|t| replicas[t] as f64 * unit[t]).fold(f64::INFINITY, f64::min);
    let fraction = if demand > 0.0 { (capacity / demand).min(1.0) } else { 1.0 };
    let sizing = Sizing { batch, replicas, per_query, max_latency: 0.0 };
    Some((fraction, plan_from_sizing(model, choice, &sizing, demand * fraction, Regime::Capped)))
}

/// Each task's variant with the lowest batch-1 latency.
pub fn fastest_choice(model: &PipelineModel) -> Vec<usize> {
    model
        .tasks
        .iter()
        .map(|t| {
            (0..t.variants.len()).min_by(|&a, &b| t.variants[a].latency_ms[0].total_cmp(&t.variants[b].latency_ms[0])).expect("variants")
        })
        .collect()
}

/// The largest root demand a single path of the fastest variants serves on the whole
/// cluster within the latency cap (best batch sizes), with its plan; `None` when no
/// batch vector of the fastest variants meets the cap.
pub fn fastest_capacity(model: &PipelineModel, factors: &Factors, cap_ms: f64, cluster: u32) -> Option<(f64, Plan)> {
    let choice = fastest_choice(model);
    // A demand no cluster serves, so the fraction is capacity / demand.
    let (fraction, plan) = max_served_fraction(model, factors, &choice, 1e12, cap_ms, cluster)?;
    let capacity = fraction * 1e12;
    (capacity > 0.0 && capacity.is_finite()).then_some((capacity, plan))
}

/// `FASTEST`: each task's lowest batch-1 latency variant at batch 1, the cluster
/// split in proportion to the load (at least one worker per task).
pub fn fastest(model: &PipelineModel, factors: &Factors, demand: f64, cluster: u32) -> Plan {
    let choice = fastest_choice(model);
    let per_query = per_query_load(model, factors, &choice);
    let tasks = model.tasks.len();
    let need: Vec<f64> = (0..tasks).map(|t| per_query[t] / model.tasks[t].variants[choice[t]].throughput(0, &model.batches)).collect();
    let mut replicas = vec![1u32; tasks];
    for _ in (tasks as u32)..cluster.max(tasks as u32) {
        let open = (0..tasks).filter(|&t| replicas[t] < model.tasks[t].max_replicas);
        let Some(t) = open.max_by(|&a, &b| (need[a] / replicas[a] as f64).total_cmp(&(need[b] / replicas[b] as f64))) else { break };
        replicas[t] += 1;
    }
    let sizing = Sizing { batch: vec![0; tasks], replicas, per_query, max_latency: 0.0 };
    plan_from_sizing(model, &choice, &sizing, demand, Regime::Fastest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;

    #[test]
    fn hardware_scaling_matches_the_spec_reference_values() {
        let (model, factors) = toy::chain_model();
        // Σx = 2, 4, 5, 7, 9, 10 at D = 50, 200, 300, 400, 500, 600 (spec §7).
        for (demand, workers) in [(50.0, 2), (200.0, 4), (300.0, 5), (400.0, 7), (500.0, 9), (600.0, 10)] {
            let plan = hardware_scaling(&model, &factors, demand, 100.0, 10).expect("feasible");
            assert_eq!(plan.workers(), workers, "D = {demand}");
            assert_eq!(plan.accuracy, 1.0);
            assert!(plan.hosts.iter().all(|h| h.variant == 0), "most accurate only");
        }
        // Feasible up to 640 QPS, not at 645.
        assert!(hardware_scaling(&model, &factors, 640.0, 100.0, 10).is_some());
        assert!(hardware_scaling(&model, &factors, 645.0, 100.0, 10).is_none());
    }

    #[test]
    fn served_fraction_falls_like_capacity_over_demand() {
        let (model, factors) = toy::chain_model();
        let (f1, _) = max_served_fraction(&model, &factors, &[0, 0], 600.0, 100.0, 10).unwrap();
        let (f2, plan) = max_served_fraction(&model, &factors, &[0, 0], 1300.0, 100.0, 10).unwrap();
        assert_eq!(f1, 1.0);
        assert!(f2 < 0.55 && f2 > 0.4, "about 640/1300: {f2}");
        assert_eq!(plan.workers(), 10);
    }

    #[test]
    fn the_fewest_workers_bound_every_sizing_and_the_greedy_plan_is_unchanged_by_it() {
        let (model, factors) = toy::chain_model();
        let mut greedy_sizings = 0;
        for demand in [50.0, 200.0, 400.0, 640.0, 900.0, 1300.0, 5000.0] {
            for a in 0..model.tasks[0].variants.len() {
                for b in 0..model.tasks[1].variants.len() {
                    let choice = [a, b];
                    let least = fewest_workers(&model, &factors, &choice, demand);
                    if let Some(sizing) = cheapest_sizing(&model, &factors, &choice, demand, 100.0) {
                        assert!(least <= sizing.workers() as u64, "D = {demand}, {choice:?}: {least} > {}", sizing.workers());
                        greedy_sizings += 1;
                    }
                }
            }
            // The greedy plan is the most accurate choice whose sizing fits: the bound
            // only passes over choices that cannot fit.
            let plan = best_single_path(&model, &factors, demand, 100.0, 10);
            let mut fitting: Vec<(f64, u32)> = Vec::new();
            for a in 0..model.tasks[0].variants.len() {
                for b in 0..model.tasks[1].variants.len() {
                    if let Some(sizing) = cheapest_sizing(&model, &factors, &[a, b], demand, 100.0).filter(|s| s.workers() <= 10) {
                        fitting.push((choice_accuracy(&model, &[a, b]), sizing.workers()));
                    }
                }
            }
            let best = fitting.iter().map(|f| f.0).fold(f64::NEG_INFINITY, f64::max);
            match plan {
                Some(plan) => assert!((plan.accuracy - best).abs() < 1e-12, "D = {demand}"),
                None => assert!(fitting.is_empty(), "D = {demand}"),
            }
        }
        assert!(greedy_sizings > 4);
    }

    #[test]
    fn fastest_uses_batch_one_and_the_whole_cluster() {
        let (model, factors) = toy::chain_model();
        let plan = fastest(&model, &factors, 1000.0, 10);
        assert_eq!(plan.workers(), 10);
        assert!(plan.hosts.iter().all(|h| h.batch == 1 && h.variant == 1));
    }
}
