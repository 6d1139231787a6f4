//! Routing tables. MostAccurateFirst (the paper's Algorithm 1): root queries and
//! each worker's sub-requests fill the most accurate workers of the next task first,
//! replicas of equal accuracy in proportion to their remaining capacity, with any
//! overflow split equally; the workers left with spare capacity form the backup
//! list that opportunistic rerouting draws on. Also the planned-load routing of the
//! Proteus-like baseline.

use std::collections::BTreeMap;

use yardmaster_sdk::WorkerId;

use crate::model::PipelineModel;

/// A worker as the balancer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct BalancerWorker {
    /// Its id.
    pub id: WorkerId,
    /// Its task.
    pub task: usize,
    /// Normalised accuracy of its variant.
    pub accuracy: f64,
    /// Capacity at its max batch (requests per second).
    pub capacity: f64,
    /// Its latency budget (ns).
    pub budget_ns: u64,
    /// Sub-requests it sends to each child slot per request.
    pub factors: Vec<f64>,
    /// Planned load (requests per second) for proportional routing.
    pub planned_load: f64,
}

/// A child worker with spare capacity, for rerouting.
#[derive(Clone, Debug, PartialEq)]
pub struct Backup {
    /// The worker.
    pub worker: WorkerId,
    /// Its normalised accuracy.
    pub accuracy: f64,
    /// Its latency budget (ns).
    pub budget_ns: u64,
    /// Requests it can still take before the next balancer run.
    pub spare: f64,
}

/// Weighted targets.
pub type Table = Vec<(WorkerId, f64)>;

/// Every routing table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// Root queries over root workers.
    pub front: Table,
    /// `(source worker, child task)` → child workers.
    pub tables: BTreeMap<(WorkerId, usize), Table>,
    /// Per task: capacity-proportional table (when no source table applies).
    pub by_task: Vec<Table>,
    /// Per task: workers with spare capacity.
    pub backup: Vec<Vec<Backup>>,
}

/// How equal-accuracy workers are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ties {
    /// In proportion to remaining capacity (equal utilisation).
    Proportional,
    /// One after the other (Algorithm 1 taken literally).
    Sequential,
}

/// Workers of a task, most accurate first (ties by id).
fn order(workers: &[BalancerWorker], task: usize) -> Vec<usize> {
    let mut list: Vec<usize> = (0..workers.len()).filter(|&w| workers[w].task == task).collect();
    list.sort_by(|&a, &b| workers[b].accuracy.total_cmp(&workers[a].accuracy).then(workers[a].id.cmp(&workers[b].id)));
    list
}

/// Greedy fill of `amount` over `list`, consuming `remaining` capacity.
fn fill(workers: &[BalancerWorker], list: &[usize], amount: f64, remaining: &mut [f64], ties: Ties) -> Vec<f64> {
    let mut out = vec![0.0; list.len()];
    let mut rest = amount;
    let mut start = 0;
    while start < list.len() && rest > 1e-12 {
        let mut end = start + 1;
        if ties == Ties::Proportional {
            while end < list.len() && (workers[list[end]].accuracy - workers[list[start]].accuracy).abs() < 1e-12 {
                end += 1;
            }
        }
        let group: f64 = list[start..end].iter().map(|&w| remaining[w]).sum();
        let take = group.min(rest);
        if take > 0.0 {
            for slot in start..end {
                let share = take * remaining[list[slot]] / group;
                out[slot] += share;
                remaining[list[slot]] -= share;
            }
            rest -= take;
        }
        start = end;
    }
    if rest > 1e-12 && !list.is_empty() {
        for o in &mut out {
            *o += rest / list.len() as f64;
        }
    }
    out
}

fn normalised(list: &[usize], workers: &[BalancerWorker], amounts: &[f64]) -> Table {
    let total: f64 = amounts.iter().sum();
    if total > 0.0 {
        list.iter().zip(amounts).map(|(&w, a)| (workers[w].id, a / total)).collect()
    } else {
        proportional(list, workers, |w| w.capacity)
    }
}

fn proportional(list: &[usize], workers: &[BalancerWorker], weight: impl Fn(&BalancerWorker) -> f64) -> Table {
    let total: f64 = list.iter().map(|&w| weight(&workers[w]).max(0.0)).sum();
    if total > 0.0 {
        list.iter().map(|&w| (workers[w].id, weight(&workers[w]).max(0.0) / total)).collect()
    } else {
        list.iter().map(|&w| (workers[w].id, 1.0 / list.len() as f64)).collect()
    }
}

/// MostAccurateFirst for root demand `demand` (QPS); backups hold `spare·tick_s`
/// requests each.
pub fn most_accurate_first(model: &PipelineModel, workers: &[BalancerWorker], demand: f64, tick_s: f64, ties: Ties) -> Routing {
    let mut remaining: Vec<f64> = workers.iter().map(|w| w.capacity).collect();
    let mut incoming = vec![0.0; workers.len()];
    let mut routing = Routing::default();
    let root = order(workers, 0);
    let front = fill(workers, &root, demand, &mut remaining, ties);
    for (slot, &w) in root.iter().enumerate() {
        incoming[w] += front[slot];
    }
    routing.front = normalised(&root, workers, &front);
    for (t, task) in model.tasks.iter().enumerate() {
        for (slot, &child) in task.children.iter().enumerate() {
            let targets = order(workers, child);
            if targets.is_empty() {
                continue;
            }
            for w in order(workers, t) {
                let out = incoming[w] * workers[w].factors.get(slot).copied().unwrap_or(0.0);
                let amounts = if out > 0.0 { fill(workers, &targets, out, &mut remaining, ties) } else { vec![0.0; targets.len()] };
                for (i, &u) in targets.iter().enumerate() {
                    incoming[u] += amounts[i];
                }
                routing.tables.insert((workers[w].id, child), normalised(&targets, workers, &amounts));
            }
        }
    }
    for t in 0..model.tasks.len() {
        let list = order(workers, t);
        routing.by_task.push(proportional(&list, workers, |w| w.capacity));
        routing.backup.push(
            list.iter()
                .filter(|&&w| remaining[w] > 1e-9)
                .map(|&w| Backup {
                    worker: workers[w].id,
                    accuracy: workers[w].accuracy,
                    budget_ns: workers[w].budget_ns,
                    spare: remaining[w] * tick_s,
                })
                .collect(),
        );
    }
    routing
}

/// Per-task routing in proportion to each worker's planned load (capacity when no
/// load is planned); no source tables and no backups.
pub fn planned_load_routing(model: &PipelineModel, workers: &[BalancerWorker]) -> Routing {
    let mut routing = Routing::default();
    for t in 0..model.tasks.len() {
        let list = order(workers, t);
        let planned: f64 = list.iter().map(|&w| workers[w].planned_load).sum();
        let table =
            if planned > 0.0 { proportional(&list, workers, |w| w.planned_load) } else { proportional(&list, workers, |w| w.capacity) };
        if t == 0 {
            routing.front = table.clone();
        }
        routing.by_task.push(table);
        routing.backup.push(Vec::new());
    }
    routing
}

/// Draw a target from a table with a uniform number in [0, 1).
pub fn sample(table: &Table, unit: f64) -> Option<WorkerId> {
    let total: f64 = table.iter().map(|(_, p)| p).sum();
    let mut point = unit * total;
    for &(w, p) in table {
        if point < p {
            return Some(w);
        }
        point -= p;
    }
    table.iter().rev().find(|(_, p)| *p > 0.0).or(table.last()).map(|(w, _)| *w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;
    use yardmaster_sdk::LatencyTable;

    fn worker(id: u32, task: usize, accuracy: f64, capacity: f64, factor: f64) -> BalancerWorker {
        BalancerWorker { id, task, accuracy, capacity, budget_ns: 10, factors: vec![factor], planned_load: 0.0 }
    }

    fn model() -> PipelineModel {
        let config = toy::chain();
        PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4]).unwrap()
    }

    #[test]
    fn fills_the_most_accurate_workers_first_and_backs_up_the_rest() {
        let model = model();
        // Root: an accurate worker (100 QPS) and a less accurate one (100 QPS);
        // children: two accurate replicas (150 each) and a cheap one (500).
        let workers = vec![
            worker(0, 0, 1.0, 100.0, 2.0),
            worker(1, 0, 0.7, 100.0, 1.0),
            worker(2, 1, 1.0, 150.0, 0.0),
            worker(3, 1, 1.0, 150.0, 0.0),
            worker(4, 1, 0.9, 500.0, 0.0),
        ];
        let r = most_accurate_first(&model, &workers, 150.0, 1.0, Ties::Proportional);
        assert_eq!(r.front, vec![(0, 100.0 / 150.0), (1, 50.0 / 150.0)]);
        // Worker 0 sends 200/s: both accurate replicas at equal shares.
        let t0 = &r.tables[&(0, 1)];
        assert!((t0[0].1 - 0.5).abs() < 1e-12 && (t0[1].1 - 0.5).abs() < 1e-12 && t0[2].1 == 0.0, "{t0:?}");
        // Worker 1 sends 50/s: the accurate replicas have 100 left, so they take it.
        let t1 = &r.tables[&(1, 1)];
        assert!((t1[0].1 + t1[1].1 - 1.0).abs() < 1e-12, "{t1:?}");
        // Every table sums to 1.
        for table in r.tables.values().chain([&r.front]) {
            assert!((table.iter().map(|(_, p)| p).sum::<f64>() - 1.0).abs() < 1e-9);
        }
        // Property 8: no traffic to a less accurate worker while a more accurate one has
        // spare; the backups are the least accurate workers holding the leftover.
        let backup: Vec<u32> = r.backup[1].iter().map(|b| b.worker).collect();
        assert_eq!(backup, vec![2, 3, 4]);
        assert!((r.backup[1][2].spare - 500.0).abs() < 1e-9);
        let accurate_left: f64 = r.backup[1][..2].iter().map(|b| b.spare).sum();
        assert!((accurate_left - 50.0).abs() < 1e-9);
    }

    #[test]
    fn overflow_is_split_equally_and_sequential_ties_saturate_in_order() {
        let model = model();
        let workers = vec![worker(0, 0, 1.0, 100.0, 0.0), worker(1, 0, 1.0, 100.0, 0.0), worker(2, 1, 1.0, 1.0, 0.0)];
        let r = most_accurate_first(&model, &workers, 300.0, 1.0, Ties::Proportional);
        assert_eq!(r.front, vec![(0, 0.5), (1, 0.5)]);
        assert!(r.backup[0].is_empty());
        let r = most_accurate_first(&model, &workers, 100.0, 1.0, Ties::Sequential);
        assert_eq!(r.front, vec![(0, 1.0), (1, 0.0)]);
        assert_eq!(sample(&r.front, 0.99), Some(0));
    }
}
