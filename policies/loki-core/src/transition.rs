//! A plan in transition: while a task has fewer workers than the plan gives it (the
//! rest starting, or waiting for the stages that free theirs), the workers present
//! raise their batch to make up the throughput ([`short_handed_batch`]) or keep their
//! variants until the others come ([`hold_variants`]). Issue 43: on the random
//! applications at half the capacity bound, the first plan's start-up and later
//! re-plans were most of what Loki still dropped.

use std::collections::BTreeMap;

use yardmaster_sdk::WorkerId;

use crate::budgets::{budget_ns, BudgetRule};
use crate::model::PipelineModel;
use crate::plan::Plan;
use crate::runtime::Assigned;

/// The max batch of a variant's workers while it has `have` of the `n` workers the
/// plan gives it (the rest starting, or not yet freed by the stages they come from):
/// the smallest batch from the planned one up whose throughput on `have` workers
/// matches the plan's on `n`, among those that fit within the budget the planned batch
/// has (the largest of them when none matches); the planned batch once all are there.
///
/// A scale-up takes a worker's start-up time, and a plan that moves workers between
/// stages first waits for the ones it frees. Meanwhile the stage ran at the planned
/// batch on fewer workers, short of the demand: on `r09-root-fan-join` at half the
/// capacity bound the root ran on 11 of its 18 workers at batch 1 for 200 ms after the
/// first plan, and the backlog cost 2.7 % of the run's requests downstream, where their
/// deadlines ran out. A batch only fills with a backlog (no worker waits for a fuller
/// one), so the larger limit changes nothing while the queue is short.
///
/// Past the cluster's reach (`within_reach` false) the batch stays within the planned
/// batch's budget; within it, up to half of what the SLO leaves the task after the
/// others on its longest branch, if more.
pub fn short_handed_batch(
    model: &PipelineModel,
    plan: &Plan,
    rule: BudgetRule,
    task: usize,
    variant: usize,
    (batch, n, have): (u32, u32, u32),
    within_reach: bool,
) -> u32 {
    if have == 0 || have >= n {
        return batch;
    }
    let v = &model.tasks[task].variants[variant];
    let Some(planned) = model.batches.iter().position(|&b| b == batch) else { return batch };
    let needed = n as f64 * v.throughput(planned, &model.batches);
    // Within the planned batch's budget, or half of what the SLO leaves this task
    // after the others on its longest branch (hosted latencies, no queueing), if more:
    // the deadline rule still drops what cannot finish in time.
    let others = model
        .branches
        .iter()
        .filter(|b| b.contains(&task))
        .map(|b| b.iter().filter(|&&x| x != task).map(|&x| crate::budgets::hosted_latency_ms(model, Some(plan), x)).sum::<f64>())
        .fold(0.0, f64::max);
    let planned_ms = budget_ns(model, Some(plan), rule, task, variant, batch) as f64 / 1e6;
    let budget_ms = if within_reach { planned_ms.max((model.slo_ms - others) / 2.0) } else { planned_ms };
    let mut chosen = planned;
    for b in planned + 1..model.batches.len() {
        if v.latency_ms[b] > budget_ms {
            break;
        }
        chosen = b;
        if have as f64 * v.throughput(b, &model.batches) >= needed {
            break;
        }
    }
    model.batches[chosen]
}

/// The largest allowed batch of `variant` of `task` whose latency is within
/// `budget_ns` (the first when none is).
pub fn batch_within(model: &PipelineModel, task: usize, variant: usize, budget_ns: u64) -> u32 {
    let v = &model.tasks[task].variants[variant];
    let ms = budget_ns as f64 / 1e6;
    let b = (0..model.batches.len()).rev().find(|&b| v.latency_ms[b] <= ms).unwrap_or(0);
    model.batches[b]
}

/// Whether a task's present workers (`mine`) should keep their variants until the
/// workers the plan asks for start: switched now to the planned variants (`wanted`:
/// variant, replicas, batch), they would serve less than the task's planned load, and
/// less than they serve on the variants they run.
///
/// A plan that moves a task to a slower, more accurate variant switches its workers at
/// once, while the extra workers that variant needs take their start-up time (and
/// first wait for the stages that give theirs back). The import starts each task's
/// workers on its first variant: on `r20-src-mid-fan-join` at half the capacity bound
/// Loki's first plan switched a task's two workers to its most accurate variant, which
/// needs eight, and for 300 ms they served 400 of ~1,000 requests a second — 98
/// requests dropped there in the first second.
pub fn hold_variants(
    model: &PipelineModel,
    plan: &Plan,
    rule: BudgetRule,
    workers: &BTreeMap<WorkerId, Assigned>,
    (task, mine): (usize, &[WorkerId]),
    wanted: &[(usize, u32, u32)],
) -> bool {
    let load: f64 = plan.hosts.iter().filter(|h| h.task == task).map(|h| h.load).sum();
    if load <= 0.0 {
        return false;
    }
    let t = &model.tasks[task];
    let index = |b: u32| model.batches.iter().position(|&x| x == b).unwrap_or(0);
    // Switched: the present workers fill the planned variants in order.
    let mut left = mine.len() as u32;
    let mut switched = 0.0;
    for &(k, n, b) in wanted {
        let take = n.min(left);
        left -= take;
        switched += take as f64 * t.variants[k].throughput(index(b), &model.batches);
    }
    if switched >= load {
        return false;
    }
    // Held: each on its own variant (planned ones at their planned batch, the others at
    // their largest batch within the main planned variant's budget).
    let (k0, _, b0) = wanted[0];
    let budget = budget_ns(model, Some(plan), rule, task, k0, b0);
    let held: f64 = mine
        .iter()
        .filter_map(|w| workers.get(w))
        .map(|a| {
            let b = wanted.iter().find(|x| x.0 == a.variant).map_or_else(|| batch_within(model, task, a.variant, budget), |x| x.2);
            t.variants[a.variant].throughput(index(b), &model.batches)
        })
        .sum();
    held > switched
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;
    use crate::plan::{Hosting, Regime};

    fn plan_of(hosts: Vec<Hosting>) -> Plan {
        Plan { hosts, accuracy: 1.0, demand: 100.0, regime: Regime::Hardware }
    }

    #[test]
    fn a_short_handed_variant_batches_up_to_the_planned_throughput_and_no_further() {
        let (model, _) = toy::chain_model();
        let plan = plan_of(vec![
            Hosting { task: 0, variant: 0, batch: 1, replicas: 4, load: 100.0 },
            Hosting { task: 1, variant: 0, batch: 1, replicas: 4, load: 100.0 },
        ]);
        let v = &model.tasks[0].variants[0];
        // All there: the planned batch.
        assert_eq!(short_handed_batch(&model, &plan, BudgetRule::SloShare, 0, 0, (1, 4, 4), true), 1);
        // Half there: the smallest larger batch whose throughput on 2 matches 4 at batch 1.
        let b = short_handed_batch(&model, &plan, BudgetRule::SloShare, 0, 0, (1, 4, 2), true);
        let i = model.batches.iter().position(|&x| x == b).unwrap();
        assert!(b > 1, "{b}");
        assert!(
            2.0 * v.throughput(i, &model.batches) >= 4.0 * v.throughput(0, &model.batches)
                || v.latency_ms.get(i + 1).is_none_or(|&l| l > model.slo_ms / 2.0),
            "{b}"
        );
        assert!(
            i == 0 || 2.0 * v.throughput(i - 1, &model.batches) < 4.0 * v.throughput(0, &model.batches),
            "the smallest that matches: {b}"
        );
        // Past the cluster's reach: never past the planned batch's budget.
        let capped = short_handed_batch(&model, &plan, BudgetRule::SloShare, 0, 0, (1, 4, 2), false);
        let budget_ms = budget_ns(&model, Some(&plan), BudgetRule::SloShare, 0, 0, 1) as f64 / 1e6;
        let j = model.batches.iter().position(|&x| x == capped).unwrap();
        assert!(j == 0 || v.latency_ms[j] <= budget_ms, "{capped} at {budget_ms} ms");
    }

    #[test]
    fn present_workers_hold_a_faster_variant_only_while_switching_would_serve_less() {
        let (model, _) = toy::chain_model();
        let task = &model.tasks[0];
        assert!(task.variants.len() >= 2, "the toy task has a faster variant");
        let slow = task.most_accurate;
        let fast =
            (0..task.variants.len()).min_by(|&a, &b| task.variants[a].latency_ms[0].total_cmp(&task.variants[b].latency_ms[0])).unwrap();
        assert_ne!(slow, fast);
        let capacity = |k: usize, n: f64| n * task.variants[k].throughput(0, &model.batches);
        let mine: Vec<WorkerId> = vec![1, 2];
        let workers: BTreeMap<WorkerId, Assigned> = mine
            .iter()
            .map(|&w| (w, Assigned { stage: task.stage, task: Some(0), variant: fast, batch: 1, budget_ns: u64::MAX }))
            .collect();
        let wanted = [(slow, 8, 1)];
        // A load two slow workers cannot carry: hold the fast variant.
        let heavy = plan_of(vec![Hosting { task: 0, variant: slow, batch: 1, replicas: 8, load: capacity(slow, 6.0) }]);
        assert!(hold_variants(&model, &heavy, BudgetRule::SloShare, &workers, (0, &mine), &wanted));
        // A load two slow workers carry: switch.
        let light = plan_of(vec![Hosting { task: 0, variant: slow, batch: 1, replicas: 8, load: capacity(slow, 1.0) }]);
        assert!(!hold_variants(&model, &light, BudgetRule::SloShare, &workers, (0, &mine), &wanted));
    }
}
