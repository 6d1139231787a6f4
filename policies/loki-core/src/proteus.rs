//! The Proteus-like baseline's planner (per-task accuracy scaling, pipeline-agnostic):
//! each task is planned on its own measured demand with an equal share `L/depth` of
//! the SLO; each variant runs its largest batch whose latency is under half that
//! share; every worker of the cluster hosts a variant (no hardware scaling); a MILP
//! maximises the demand-weighted single-model accuracy of the served load, which
//! must cover a fraction `β` of the demand, `β` lowered from 1 until it is feasible.

use yardmaster_sdk::helpers::milp::{self, Budget, Problem, Relation, Sense};

use crate::model::PipelineModel;
use crate::plan::{Hosting, Plan, Regime};

/// Per-task latency share (ms): the SLO split equally over the deepest branch.
pub fn task_share_ms(model: &PipelineModel) -> f64 {
    let depth = model.branches.iter().map(Vec::len).max().unwrap_or(1).max(1);
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

/// Plan `cluster` workers for per-task demands `demand[t]` (QPS).
pub fn plan(model: &PipelineModel, demand: &[f64], cluster: u32, max_nodes: u64) -> Plan {
    let points = operating_points(model);
    let total: f64 = demand.iter().sum();
    let mut beta = 1.0;
    loop {
        let mut problem = Problem::new(Sense::Maximize);
        let mut vars = Vec::new();
        for (t, task) in model.tasks.iter().enumerate() {
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
        let room: u32 = model.tasks.iter().map(|t| t.max_replicas).sum();
        problem.add_constraint(vars.iter().map(|v| (v.3, 1.0)).collect(), Relation::Eq, cluster.min(room) as f64);
        for (t, task) in model.tasks.iter().enumerate() {
            problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.3, 1.0)).collect(), Relation::Le, task.max_replicas as f64);
            problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.4, 1.0)).collect(), Relation::Le, demand[t]);
            problem.add_constraint(vars.iter().filter(|v| v.0 == t).map(|v| (v.3, 1.0)).collect(), Relation::Ge, 1.0);
        }
        problem.add_constraint(vars.iter().map(|v| (v.4, 1.0)).collect(), Relation::Ge, beta * total);
        let solution = milp::solve(&problem, &Budget { max_nodes, ..Budget::default() }, None);
        if solution.has_point() || beta <= 0.2 + 1e-9 {
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
            if hosts.is_empty() {
                // Nothing feasible even at β = 0.2: one worker per task on its
                // fastest operating point, the rest on the root.
                for (t, task_points) in points.iter().enumerate() {
                    let (k, (b, _)) = task_points.iter().enumerate().find_map(|(k, p)| p.map(|p| (k, p))).expect("a point per task");
                    let extra =
                        if t == 0 { cluster.saturating_sub(model.tasks.len() as u32).min(model.tasks[0].max_replicas - 1) } else { 0 };
                    hosts.push(Hosting { task: t, variant: k, batch: model.batches[b], replicas: 1 + extra, load: 0.0 });
                }
            }
            let accuracy = if total > 0.0 { served_accuracy / total } else { 1.0 };
            // A task with no variant under half its share runs its fastest one anyway:
            // no plan meets the SLO.
            let half = task_share_ms(model) / 2.0;
            let infeasible = model.tasks.iter().any(|task| task.variants.iter().all(|v| !v.latency_ms.iter().any(|&l| l < half)));
            let regime = if infeasible { Regime::Fastest } else { Regime::Accuracy };
            return Plan { hosts, accuracy, demand: demand.first().copied().unwrap_or(0.0), regime };
        }
        beta -= if beta > 1.5 { 0.1 } else { 0.05 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;

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
