//! Per-task latency budgets of the hosted variants: how long a request may spend at
//! a task (queueing plus processing) before early dropping or rerouting kicks in.
//!
//! * `Multiple(f)`: `f·τ(y)` — the paper's rule with `f = 2` (the SLO is halved for
//!   queueing, so `2τ` along a path meeting `Σ τ ≤ L/2` adds up to at most `L`).
//! * `SloShare` (our default): the whole SLO split along each path in proportion to
//!   the batch latencies, `τ(y)·L / Σ_path τ`, taking for each task the slowest hosted
//!   variant. It is never below `2τ` on a path that meets the cap, still adds up to at
//!   most `L` along every hosted path, and leaves room for the burst of sub-requests
//!   a single frame fans out into, which `2τ` at small batches does not.
//! * `TaskShare`: an equal share `L/depth` per task (the Proteus-like baseline).

use crate::model::PipelineModel;
use crate::plan::Plan;

/// How budgets are set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BudgetRule {
    /// A multiple of the batch latency.
    Multiple(f64),
    /// The SLO split along each path in proportion to batch latency.
    SloShare,
    /// An equal share of the SLO per task of the deepest branch.
    TaskShare,
}

impl std::str::FromStr for BudgetRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "slo_share" => Ok(Self::SloShare),
            "task_share" => Ok(Self::TaskShare),
            other => match other.parse::<f64>() {
                Ok(f) if f > 0.0 => Ok(Self::Multiple(f)),
                _ => Err(format!("budget rule {other:?}: slo_share, task_share or a positive multiple of the batch latency")),
            },
        }
    }
}

fn latency_ms(model: &PipelineModel, task: usize, variant: usize, batch: u32) -> f64 {
    let b = model.batches.iter().position(|&x| x == batch).unwrap_or(0);
    model.tasks[task].variants[variant].latency_ms[b]
}

/// The batch latency (ms) of the slowest variant `plan` hosts for `task`, at its max
/// batch; the task's fastest variant at batch 1 when none is hosted.
pub fn hosted_latency_ms(model: &PipelineModel, plan: Option<&Plan>, task: usize) -> f64 {
    let hosted = plan.into_iter().flat_map(|p| &p.hosts).filter(|h| h.task == task && h.replicas > 0);
    let worst = hosted.map(|h| latency_ms(model, task, h.variant, h.batch)).fold(0.0, f64::max);
    if worst == 0.0 {
        model.fastest_ms(task)
    } else {
        worst
    }
}

/// How long (ns) a request takes from the end of `task` to its own end without
/// queueing: the slowest branch below `task`, each task at [`hosted_latency_ms`]
/// (0 at a leaf). Early dropping under `DropWhen::Deadline` asks whether a request's
/// deadline is still within reach with it.
pub fn below_ns(model: &PipelineModel, plan: Option<&Plan>, task: usize) -> u64 {
    fn below_ms(model: &PipelineModel, plan: Option<&Plan>, task: usize) -> f64 {
        model.tasks[task].children.iter().map(|&c| hosted_latency_ms(model, plan, c) + below_ms(model, plan, c)).fold(0.0, f64::max)
    }
    (below_ms(model, plan, task) * 1e6) as u64
}

/// The budget (ns) of variant `variant` of `task` at max batch `batch` under `plan`.
pub fn budget_ns(model: &PipelineModel, plan: Option<&Plan>, rule: BudgetRule, task: usize, variant: usize, batch: u32) -> u64 {
    let tau = latency_ms(model, task, variant, batch);
    let ms = match rule {
        BudgetRule::Multiple(f) => f * tau,
        BudgetRule::TaskShare => crate::proteus::task_share_ms(model),
        BudgetRule::SloShare => {
            // Slowest hosted variant per task (this one included).
            let slowest = |t: usize| -> f64 {
                let worst = hosted_latency_ms(model, plan, t);
                if t == task {
                    worst.max(tau)
                } else {
                    worst
                }
            };
            let path =
                model.branches.iter().filter(|b| b.contains(&task)).map(|b| b.iter().map(|&t| slowest(t)).sum::<f64>()).fold(0.0, f64::max);
            if path > 0.0 {
                tau * model.slo_ms / path
            } else {
                2.0 * tau
            }
        }
    };
    (ms * 1e6) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;
    use crate::planner::{resource_manager, PlanRequest, SolverLimits};

    #[test]
    fn budgets_along_every_hosted_path_add_up_to_at_most_the_slo() {
        // Property 6 (budget part), for both rules, across the regimes.
        let (model, factors) = toy::chain_model();
        for demand in [50.0, 400.0, 700.0, 1200.0, 2000.0] {
            let request = PlanRequest {
                model: &model,
                factors: &factors,
                demand,
                cluster: 10,
                cap_ms: 100.0,
                limits: SolverLimits::default(),
                previous: None,
                fill_spare: true,
                slack: 1.0,
            };
            let plan = resource_manager(&request).0;
            for rule in [BudgetRule::Multiple(2.0), BudgetRule::SloShare] {
                for a in plan.hosts.iter().filter(|h| h.task == 0) {
                    for b in plan.hosts.iter().filter(|h| h.task == 1) {
                        let path_latency = latency_ms(&model, 0, a.variant, a.batch) + latency_ms(&model, 1, b.variant, b.batch);
                        if path_latency > 100.0 + 1e-9 {
                            continue; // not a path the plan may use
                        }
                        let total = budget_ns(&model, Some(&plan), rule, 0, a.variant, a.batch)
                            + budget_ns(&model, Some(&plan), rule, 1, b.variant, b.batch);
                        assert!(total <= 200_000_000 + 2, "D = {demand} {rule:?}: {total} ns");
                        let own = budget_ns(&model, Some(&plan), rule, 1, b.variant, b.batch);
                        assert!(own as f64 >= 2e6 * latency_ms(&model, 1, b.variant, b.batch) - 2.0, "never below 2τ");
                    }
                }
            }
        }
    }
}
