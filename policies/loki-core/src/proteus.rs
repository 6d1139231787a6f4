//! The Proteus-like baseline's planner (per-task accuracy scaling, pipeline-agnostic):
//! each task is planned on its own measured demand with an equal share `L/depth` of
//! the SLO; each variant runs its largest batch whose latency is under half that
//! share; every worker of the cluster hosts a variant (no hardware scaling); a MILP
//! maximises the demand-weighted single-model accuracy of the served load, which
//! must cover a fraction `β` of the demand, `β` lowered from 1 until it is feasible.

use yardmaster_sdk::helpers::milp::{self, Budget, Problem, Relation, Sense};

use crate::model::PipelineModel;
use crate::plan::{Hosting, Plan, Regime};

/// Per-task latency share (ms): the SLO split equally over the deepest branch, in
/// tasks that take time (a pseudo-task root needs no share: counted, it cut every
/// task's budget by a quarter on a three-task branch behind a `source`).
pub fn task_share_ms(model: &PipelineModel) -> f64 {
    let depth = model.branches.iter().map(|b| b.iter().filter(|&&t| !model.tasks[t].takes_no_time()).count()).max().unwrap_or(1).max(1);
    model.slo_ms / depth as f64
}

/// Batch index and throughput (QPS) each variant runs at: the largest batch under
/// half the task share; the fastest variant at batch 1 if none fits.
fn operating_points(model: &PipelineModel) -> Vec<Vec<Option<(usize, f64)>>> {
    let half = task_share_ms(model) / 2.0;
    model
        .tasks
        .iter()
        .map(|task| {
            let mut points: Vec<Option<(usize, f64)>> = task
                .variants
                .iter()
                .map(|v| (0..model.batches.len()).rev().find(|&b| v.latency_ms[b] < half).map(|b| (b, v.throughput(b, &model.batches))))
                .collect();
            if points.iter().all(Option::is_none) {
                let fastest = (0..task.variants.len())
                    .min_by(|&a, &b| task.variants[a].latency_ms[0].total_cmp(&task.variants[b].latency_ms[0]))
                    .expect("variants");
                points[fastest] = Some((0, task.variants[fastest].throughput(0, &model.batches)));
            }
            points
        })
        .collect()
}

/// One variant's variables in the planning MILP: task, variant, batch index, workers,
/// served load.
type PlanVars = Vec<(usize, usize, usize, usize, usize)>;

/// The planning MILP at coverage `beta`, solved. Tasks that take no time are left
/// out (their one worker is added to the plan): in the MILP a zero-time variant's
/// throughput (millions of requests a second) left the solver with no point at any
/// coverage once such a task was held to one worker.
fn solve_at(
    model: &PipelineModel,
    points: &[Vec<Option<(usize, f64)>>],
    demand: &[f64],
    cluster: u32,
    max_nodes: u64,
    beta: f64,
) -> (milp::Solution, PlanVars) {
    let planned = |t: usize| !model.tasks[t].takes_no_time();
    let total: f64 = demand.iter().enumerate().filter(|&(t, _)| planned(t)).map(|(_, d)| d).sum();
    let mut problem = Problem::new(Sense::Maximize);
    let mut vars = Vec::new();
    for (t, task) in model.tasks.iter().enumerate().filter(|&(t, _)| planned(t)) {
        for (k, v) in task.variants.iter().enumerate() {
            let Some((b, q)) = points[t][k] else { continue };
            // Tie-break with no demand: more accurate workers.
            let x = problem.add_var(0.0, cluster as f64, true, 1e-6 * v.accuracy);
            let weight = if total > 0.0 { v.accuracy / total } else { 0.0 };
            let y = problem.add_var(0.0, f64::INFINITY, false, weight);
            problem.add_constraint(vec![(y, 1.0), (x, -q)], Relation::Le, 0.0);
            vars.push((t, k, b, x, y));
        }
    }
    let free = model.tasks.iter().filter(|t| t.takes_no_time()).count() as u32;
    let room: u32 = model.tasks.iter().filter(|t| !t.takes_no_time()).map(|t| t.max_replicas).sum();
    problem.add_constraint(vars.iter().map(|v| (v.3, 1.0)).collect(), Relation::Eq, cluster.saturating_sub(free).min(room) as f64);
    for (t, task) in model.tasks.iter().enumerate().filter(|&(t, _)| planned(t)) {
        problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.3, 1.0)).collect(), Relation::Le, task.max_replicas as f64);
        problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.4, 1.0)).collect(), Relation::Le, demand[t]);
        problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.3, 1.0)).collect(), Relation::Ge, 1.0);
    }
    problem.add_constraint(vars.iter().map(|v| (v.4, 1.0)).collect(), Relation::Ge, beta * total);
    (milp::solve(&problem, &Budget { max_nodes, ..Budget::default() }, None), vars)
}

/// The coverages `β` tried, from 1 down in steps of 0.05 to 0.2.
const BETA_STEPS: usize = 16;

/// Plan `cluster` workers for per-task demands `demand[t]` (QPS).
///
/// `β` is the largest of 1, 0.95, …, 0.2 at which the MILP has a point (0.2 if none
/// has). Feasibility only grows as `β` falls, so it is found by bisection over those
/// steps: at most six solves, where lowering `β` one step at a time took up to 17, each
/// an infeasible MILP that spends its node budget — past an event call's fuel when the
/// first plan, 100 ms after the first request, came at twice the capacity bound.
pub fn plan(model: &PipelineModel, demand: &[f64], cluster: u32, max_nodes: u64) -> Plan {
    let points = operating_points(model);
    let total: f64 = demand.iter().sum();
    let beta = |step: usize| 1.0 - 0.05 * step as f64;
    let mut found = solve_at(model, &points, demand, cluster, max_nodes, beta(0));
    let covered = found.0.has_point();
    if !covered {
        // The lowest step with a point, the last step if none has.
        let (mut lo, mut hi) = (1, BETA_STEPS);
        let mut at_hi = None;
        while lo < hi {
            let mid = (lo + hi) / 2;
            let tried = solve_at(model, &points, demand, cluster, max_nodes, beta(mid));
            if tried.0.has_point() {
                hi = mid;
                at_hi = Some(tried);
            } else {
                lo = mid + 1;
            }
        }
        found = at_hi.unwrap_or_else(|| solve_at(model, &points, demand, cluster, max_nodes, beta(hi)));
    }
    let (solution, vars) = found;
    let mut hosts = Vec::new();
    let mut served_accuracy = 0.0;
    for &(t, k, b, x, y) in &vars {
        let values = &solution.values;
        let replicas = values.get(x).map_or(0, |v| v.round() as u32);
        let load = values.get(y).copied().unwrap_or(0.0);
        served_accuracy += load * model.tasks[t].variants[k].accuracy;
        if replicas > 0 {
            hosts.push(Hosting { task: t, variant: k, batch: model.batches[b], replicas, load });
        }
    }
    // A task that takes no time: one worker on its first variant, serving its demand
    // (left to the MILP's tie-break, the workers no demand needed went to it: 16 of
    // 56 behind a `source`).
    let zero_time: Vec<usize> = (0..model.tasks.len()).filter(|&t| model.tasks[t].takes_no_time()).collect();
    if hosts.is_empty() {
        // Nothing feasible even at β = 0.2: one worker per task on its fastest
        // operating point, the rest on the first task that takes time.
        let first = (0..model.tasks.len()).find(|t| !zero_time.contains(t)).unwrap_or(0);
        for (t, task_points) in points.iter().enumerate() {
            let (k, (b, _)) = task_points.iter().enumerate().find_map(|(k, p)| p.map(|p| (k, p))).expect("a point per task");
            let extra =
                if t == first { cluster.saturating_sub(model.tasks.len() as u32).min(model.tasks[first].max_replicas - 1) } else { 0 };
            hosts.push(Hosting { task: t, variant: k, batch: model.batches[b], replicas: 1 + extra, load: 0.0 });
        }
    }
    for &t in &zero_time {
        if !hosts.iter().any(|h| h.task == t) {
            let b = points[t].iter().find_map(|p| p.map(|p| p.0)).unwrap_or(0);
            hosts.push(Hosting { task: t, variant: 0, batch: model.batches[b], replicas: 1, load: demand[t] });
            served_accuracy += demand[t] * model.tasks[t].variants[0].accuracy;
        }
    }
    let accuracy = if total > 0.0 { served_accuracy / total } else { 1.0 };
    // A task with no variant under half its share runs its fastest one anyway: no
    // plan meets the SLO.
    let half = task_share_ms(model) / 2.0;
    let infeasible = model.tasks.iter().any(|task| task.variants.iter().all(|v| !v.latency_ms.iter().any(|&l| l < half)));
    // Capped: the plan serves less than the whole demand (β < 1).
    let regime = if infeasible {
        Regime::Fastest
    } else if covered {
        Regime::Accuracy
    } else {
        Regime::Capped
    };
    Plan { hosts, accuracy, demand: demand.first().copied().unwrap_or(0.0), regime }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;

    /// The toy chain behind a `source` that takes no time (the Loki authors' root
    /// pseudo-task): source → T1 → T2.
    fn behind_a_source() -> PipelineModel {
        use yardmaster_sdk::LatencyTable;
        let mut config = toy::chain();
        for stage in &mut config.stages {
            stage.id += 1;
            stage.successors.iter_mut().for_each(|s| *s += 1);
            stage.predecessors.iter_mut().for_each(|s| *s += 1);
        }
        config.stages[0].predecessors = vec![0];
        let b = [1, 2, 4, 8, 16];
        config
            .stages
            .insert(0, toy::stage(0, "source", vec![1], vec![], vec![toy::variant(0, "source", 1.0, toy::linear(0.0, 0.0, &b), 1.0)], 16));
        config.max_workers = 12;
        PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4, 8, 16]).unwrap()
    }

    #[test]
    fn a_task_that_takes_no_time_gets_no_share_of_the_slo_and_one_worker() {
        // Counted, a `source` cut every task's share by a third here (200 ms over three
        // tasks instead of two), and the workers no demand needed went to it.
        let model = behind_a_source();
        assert!(model.tasks[0].takes_no_time() && !model.tasks[1].takes_no_time());
        assert_eq!(task_share_ms(&model), 100.0);
        for demand in [[0.0, 0.0, 0.0], [40.0, 40.0, 160.0], [900.0, 900.0, 3600.0]] {
            let plan = plan(&model, &demand, 11, 1000);
            assert_eq!(plan.task_workers(0), 1, "{demand:?}: {plan:?}");
            assert_eq!(plan.workers(), 11, "every worker on: {plan:?}");
        }
    }

    #[test]
    fn uses_the_whole_cluster_and_downgrades_per_task_under_load() {
        let (model, _) = toy::chain_model();
        assert_eq!(task_share_ms(&model), 100.0);
        let light = plan(&model, &[10.0, 40.0], 10, 1000);
        assert_eq!(light.workers(), 10, "Proteus keeps every worker on");
        assert!(light.hosts.iter().all(|h| h.variant == 0), "light load: most accurate only: {light:?}");
        assert!((light.accuracy - 1.0).abs() < 1e-9);
        let heavy = plan(&model, &[900.0, 3600.0], 10, 1000);
        assert_eq!(heavy.workers(), 10);
        assert!(heavy.accuracy < 1.0, "{heavy:?}");
    }
}
