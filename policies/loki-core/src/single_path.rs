//! Plans that route every query down one path per branch (one variant per task):
//! the exact hardware-scaling step (STEP1: the most accurate variants, per-task batch
//! sizes by enumeration, fewest workers), the greedy accuracy-scaling fallback (the
//! most accurate variant choice that fits the cluster), the served fraction of a
//! fixed choice on the whole cluster (the InferLine-like baseline), and the
//! `FASTEST` fallback.

use crate::model::{multiplier, Factors, PipelineModel};
use crate::plan::{Hosting, Plan, Regime};
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

/// Every batch vector (one batch index per task) whose branches meet `cap_ms`, in
/// odometer order (task 0's index turning fastest), less the families of vectors
/// that `skip` rules out; `f` gets each vector and its longest branch latency. Before
/// fixing the tasks below `from`, `skip(vector, from)` is asked (tasks `from..` fixed
/// in `vector`, the others still free) and a `true` passes over every vector that
/// shares those indices; it is asked of each whole vector too (`from` 0) before `f`.
/// Families none of whose vectors can meet the cap are passed over as well, so `f`
/// sees exactly the vectors of the full scan that `skip` does not rule out, in the
/// same order.
fn search_batch_vectors(
    model: &PipelineModel,
    choice: &[usize],
    cap_ms: f64,
    mut skip: impl FnMut(&[usize], usize) -> bool,
    f: &mut dyn FnMut(&[usize], f64),
) {
    let tasks = model.tasks.len();
    if tasks == 0 {
        return;
    }
    let latency = |t: usize, b: usize| model.tasks[t].variants[choice[t]].latency_ms[b];
    // Each task's lowest latency over the batch sizes: what a free task adds at least.
    let fastest: Vec<f64> = (0..tasks).map(|t| (0..model.batches.len()).map(|b| latency(t, b)).fold(f64::INFINITY, f64::min)).collect();
    let mut vector = vec![0usize; tasks];
    // Depth-first with the highest task outermost: the leaves come in odometer order.
    let mut stack: Vec<(usize, usize)> = vec![(tasks - 1, 0)];
    while let Some((t, b)) = stack.pop() {
        if b >= model.batches.len() {
            continue;
        }
        stack.push((t, b + 1));
        vector[t] = b;
        if t == 0 {
            let mut worst: f64 = 0.0;
            let mut ok = true;
            for branch in &model.branches {
                let total: f64 = branch.iter().map(|&task| latency(task, vector[task])).sum();
                if total.is_nan() || total > cap_ms {
                    ok = false;
                    break;
                }
                worst = worst.max(total);
            }
            if ok && !skip(&vector, 0) {
                f(&vector, worst);
            }
            continue;
        }
        let hopeless = model.branches.iter().any(|branch| {
            let least: f64 = branch.iter().map(|&task| if task >= t { latency(task, vector[task]) } else { fastest[task] }).sum();
            least.is_nan() || least > cap_ms * (1.0 + 1e-9)
        });
        if hopeless || skip(&vector, t) {
            continue;
        }
        stack.push((t - 1, 0));
    }
}

/// Fewest workers serving `demand` with one variant per task (`choice`) within the
/// per-path latency cap; ties go to the lower longest-branch latency. `None` when no
/// batch vector meets the cap.
pub fn cheapest_sizing(model: &PipelineModel, factors: &Factors, choice: &[usize], demand: f64, cap_ms: f64) -> Option<Sizing> {
    let per_query = per_query_load(model, factors, choice);
    // Workers each task needs at each batch index; above its cap where it cannot.
    let replicas_at: Vec<Vec<u32>> = (0..model.tasks.len())
        .map(|t| {
            let v = &model.tasks[t].variants[choice[t]];
            (0..model.batches.len())
                .map(|b| {
                    let need = demand * per_query[t] / v.throughput(b, &model.batches);
                    ((need - 1e-9).ceil().max(1.0)) as u32
                })
                .collect()
        })
        .collect();
    // Each task's fewest workers at any batch size: what a free task needs at least.
    let fewest: Vec<u32> = replicas_at.iter().map(|r| r.iter().copied().min().unwrap_or(u32::MAX)).collect();
    let best = std::cell::RefCell::new(None::<(u32, f64, Vec<usize>)>);
    // A family whose fewest workers exceed the best's cannot replace it.
    let skip = |vector: &[usize], from: usize| {
        let Some((w, ..)) = &*best.borrow() else { return false };
        let least: u32 =
            (0..vector.len()).map(|t| if t >= from { replicas_at[t][vector[t]] } else { fewest[t] }).fold(0u32, u32::saturating_add);
        least > *w
    };
    search_batch_vectors(model, choice, cap_ms, skip, &mut |vector, latency| {
        let mut best = best.borrow_mut();
        let mut workers = 0u32;
        for (t, &b) in vector.iter().enumerate() {
            let r = replicas_at[t][b];
            if r > model.tasks[t].max_replicas {
                return;
            }
            workers = workers.saturating_add(r);
        }
        if best.as_ref().is_none_or(|(w, l, _)| workers < *w || workers == *w && latency < *l - 1e-9) {
            *best = Some((workers, latency, vector.to_vec()));
        }
    });
    let (_, max_latency, batch) = best.into_inner()?;
    let replicas = batch.iter().enumerate().map(|(t, &b)| replicas_at[t][b]).collect();
    Some(Sizing { batch, replicas, per_query, max_latency })
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
    let total: f64 = (0..model.branches.len())
        .map(|b| {
            let path: Vec<usize> = model.branches[b].iter().map(|&t| choice[t]).collect();
            model.path_accuracy(b, &path)
        })
        .sum();
    total / model.branches.len() as f64
}

/// STEP1, hardware scaling: the most accurate variants with the fewest workers, or
/// `None` when that needs more than `cluster` workers (or no batch meets the cap).
pub fn hardware_scaling(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64, cluster: u32) -> Option<Plan> {
    let choice: Vec<usize> = model.tasks.iter().map(|t| t.most_accurate).collect();
    let sizing = cheapest_sizing(model, factors, &choice, demand, cap_ms)?;
    (sizing.workers() <= cluster).then(|| plan_from_sizing(model, &choice, &sizing, demand, Regime::Hardware))
}

/// Greedy accuracy scaling: among every single-path variant choice, the most
/// accurate one whose cheapest sizing fits the cluster (ties: fewer workers).
///
/// The choices are tried from the most accurate down, and the search stops at the
/// first accuracy below the best that fits: past STEP1's reach the most accurate
/// choices fit rarely, but the cheapest fit early, so trying them from the cheapest
/// up (as before) sized nearly every choice, each a search over every batch vector
/// (on a random eight-task application, out of an event call's fuel). Choices that
/// cannot fit whatever their batches ([`fewest_workers`]) are passed over unsized.
/// More than [`MAX_ORDERED_CHOICES`] choices are tried in odometer order instead.
pub fn best_single_path(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64, cluster: u32) -> Option<Plan> {
    let count = model.tasks.iter().try_fold(1usize, |n, t| n.checked_mul(t.variants.len().max(1)));
    let mut choices: Vec<(f64, Vec<usize>)> = Vec::new();
    let ordered = count.is_some_and(|n| n <= MAX_ORDERED_CHOICES);
    let mut choice = vec![0usize; model.tasks.len()];
    let mut best: Option<(f64, u32, Plan)> = None;
    let consider = |choice: &[usize], accuracy: f64, best: &mut Option<(f64, u32, Plan)>| {
        if fewest_workers(model, factors, choice, demand) > cluster as u64 {
            return;
        }
        if let Some(sizing) = cheapest_sizing(model, factors, choice, demand, cap_ms) {
            let workers = sizing.workers();
            let better = best.as_ref().is_none_or(|(a, w, _)| accuracy > *a + 1e-12 || (accuracy >= *a - 1e-12 && workers < *w));
            if workers <= cluster && better {
                *best = Some((accuracy, workers, plan_from_sizing(model, choice, &sizing, demand, Regime::Accuracy)));
            }
        }
    };
    loop {
        let accuracy = choice_accuracy(model, &choice);
        if ordered {
            choices.push((accuracy, choice.clone()));
        } else if best.as_ref().is_none_or(|(a, _, _)| accuracy >= *a - 1e-12) {
            consider(&choice, accuracy, &mut best);
        }
        let mut slot = 0;
        loop {
            if slot == choice.len() {
                break;
            }
            choice[slot] += 1;
            if choice[slot] < model.tasks[slot].variants.len() {
                break;
            }
            choice[slot] = 0;
            slot += 1;
        }
        if slot == choice.len() {
            break;
        }
    }
    if ordered {
        // Stable: equal accuracies keep the odometer order.
        choices.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (accuracy, choice) in &choices {
            if best.as_ref().is_some_and(|(a, _, _)| *accuracy < *a - 1e-12) {
                break;
            }
            consider(choice, *accuracy, &mut best);
        }
    }
    best.map(|(_, _, plan)| plan)
}

/// The most variant choices [`best_single_path`] lists to try from the most accurate
/// down (beyond, it tries them in odometer order).
pub const MAX_ORDERED_CHOICES: usize = 1 << 16;

/// The fewest workers `choice` needs for `demand`, every task at its most productive
/// batch and the latency cap aside: a lower bound on its [`cheapest_sizing`].
pub fn fewest_workers(model: &PipelineModel, factors: &Factors, choice: &[usize], demand: f64) -> u64 {
    let per_query = per_query_load(model, factors, choice);
    (0..model.tasks.len())
        .map(|t| {
            let v = &model.tasks[t].variants[choice[t]];
            let best = (0..model.batches.len()).map(|b| v.throughput(b, &model.batches)).fold(0.0, f64::max);
            let need = demand * per_query[t] / best;
            if need.is_finite() {
                ((need - 1e-9).ceil().max(1.0)) as u64
            } else {
                u64::MAX / 64
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// The largest fraction of `demand` (at most 1) that `cluster` workers serve with a
/// fixed variant choice, with the plan that does it: every batch vector meeting the
/// cap, workers added one at a time to the bottleneck task.
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
    // Each task's best unit at any batch size: what a free task gives at most.
    let best_unit: Vec<f64> = unit_table.iter().map(|u| u.iter().copied().fold(0.0, f64::max)).collect();
    // The share of `demand` units could serve at most: the capacity passes neither
    // `cluster / Σ 1/unit` (every task needs capacity/unit workers) nor any task's
    // cap × unit (a hair of slack for rounding).
    let reach = |unit: &dyn Fn(usize) -> f64| {
        let spread = cluster as f64 / (0..tasks).map(|t| 1.0 / unit(t)).sum::<f64>();
        let capped = (0..tasks).map(|t| caps[t] as f64 * unit(t)).fold(f64::INFINITY, f64::min);
        let bound = spread.min(capped) * (1.0 + 1e-9);
        if demand > 0.0 {
            (bound / demand).min(1.0)
        } else {
            1.0
        }
    };
    let mut unit = vec![0.0; tasks];
    let floors = vec![1u32; tasks];
    let mut replicas = vec![1u32; tasks];
    let best = std::cell::RefCell::new(None::<(f64, f64, Vec<usize>, Vec<u32>)>);
    // A family that cannot come within the tie margin of the best cannot replace it.
    let skip = |vector: &[usize], from: usize| {
        let Some((f, ..)) = &*best.borrow() else { return false };
        reach(&|t| if t >= from { unit_table[t][vector[t]] } else { best_unit[t] }) < *f - 1e-12
    };
    search_batch_vectors(model, choice, cap_ms, skip, &mut |vector, latency| {
        let mut best = best.borrow_mut();
        for t in 0..tasks {
            unit[t] = unit_table[t][vector[t]];
        }
        bottleneck_fill(&unit, &floors, &caps, cluster, &mut replicas);
        let capacity = (0..tasks).map(|t| replicas[t] as f64 * unit[t]).fold(f64::INFINITY, f64::min);
        let fraction = if demand > 0.0 { (capacity / demand).min(1.0) } else { 1.0 };
        if best.as_ref().is_none_or(|(f, l, _, _)| fraction > *f + 1e-12 || (fraction >= *f - 1e-12 && latency < *l)) {
            *best = Some((fraction, latency, vector.to_vec(), replicas.clone()));
        }
    });
    let (fraction, _, batch, replicas) = best.into_inner()?;
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
