//! Batch formation with early dropping (the paper's §3.5 as the spec fixes it): a
//! worker runs its FIFO queue in batches of at most its max batch, never waiting for
//! a fuller one; before a batch starts, each head request whose projected finish
//! overshoots its per-task latency budget is dropped, or — in `reroute` mode — kept
//! and pinned to a faster backup worker of every child task that can make up the
//! overshoot.
//!
//! [`DropWhen`] says what an overshoot that no backup can make up costs. The paper
//! drops the request ([`DropWhen::Budget`]). By default ([`DropWhen::Deadline`]) it is
//! dropped only when it cannot meet its end-to-end deadline any more: its projected
//! finish here plus the path below this task (the hosted variants' batch latencies)
//! is past the deadline. Per-task
//! budgets split the SLO evenly among requests, so a burst of sub-requests (one frame
//! fanning out into many) overshoots them while most of the burst would still finish
//! on time; dropping those cost Loki 4 % of its requests at 13 % of its capacity.

use std::collections::VecDeque;

use yardmaster_sdk::{Instant, RequestId, WorkerId};

use crate::balancer::Backup;

/// When requests are dropped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropMode {
    /// Never.
    None,
    /// Only at a leaf task, when the end-to-end deadline would be missed.
    LastTask,
    /// At every task, when the per-task budget would be overshot.
    PerTask,
    /// As `PerTask`, unless a faster downstream worker can take it (the default).
    Reroute,
}

impl std::str::FromStr for DropMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "last_task" => Ok(Self::LastTask),
            "per_task" => Ok(Self::PerTask),
            "reroute" => Ok(Self::Reroute),
            other => Err(format!("unknown drop mode {other:?} (none, last_task, per_task, reroute)")),
        }
    }
}

/// What an overshoot of the per-task budget that no backup can make up costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropWhen {
    /// The request is dropped (the paper's rule).
    Budget,
    /// The request is dropped only when its projected finish plus the path below the
    /// task misses its end-to-end deadline (the default).
    Deadline,
}

impl std::str::FromStr for DropWhen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "budget" => Ok(Self::Budget),
            "deadline" => Ok(Self::Deadline),
            other => Err(format!("unknown drop rule {other:?} (budget, deadline)")),
        }
    }
}

/// A request waiting in a worker's queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Queued {
    /// The request (piece) id.
    pub id: RequestId,
    /// Its end-to-end request.
    pub origin: RequestId,
    /// When it reached this task.
    pub arrived_at: Instant,
    /// End-to-end deadline.
    pub deadline: Instant,
    /// Already checked (or pinned) for early dropping.
    pub examined: bool,
    /// The worker holding its stateful sequence (`request.correlation.worker`): a step
    /// runs there and nowhere else.
    pub holder: Option<WorkerId>,
}

/// What the worker forming the batch is like.
pub struct Worker<'a> {
    /// Its max batch size.
    pub max_batch: u32,
    /// Its per-task latency budget `β` (ns).
    pub budget_ns: u64,
    /// Whether its task is a leaf.
    pub leaf: bool,
    /// Batch latency of its variant (ns) by batch size.
    pub latency: &'a dyn Fn(u32) -> u64,
    /// How long a request takes from the end of this task to its end without queueing
    /// (ns; `budgets::below_ns`).
    pub downstream_ns: u64,
    /// What an overshoot that no backup makes up costs.
    pub drop_when: DropWhen,
}

/// Child workers a request is pinned to: (child task, worker).
pub type Pins = Vec<(usize, WorkerId)>;

/// What became of the queue's head requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Formed {
    /// The batch to run (possibly empty).
    pub batch: Vec<RequestId>,
    /// The end-to-end request of each batch member.
    pub origins: Vec<RequestId>,
    /// Requests to drop.
    pub dropped: Vec<RequestId>,
    /// Requests pinned to child workers: (request, [(child task, worker)]).
    pub pinned: Vec<(Queued, Pins)>,
}

/// Form the next batch from `queue`. `reroute(request, overshoot_ns)` looks for
/// child workers to pin the request to (only in `Reroute` mode).
pub fn form_batch(
    queue: &mut VecDeque<Queued>,
    worker: &Worker,
    now: Instant,
    mode: DropMode,
    reroute: &mut dyn FnMut(&Queued, u64) -> Option<Pins>,
) -> Formed {
    let mut formed = Formed::default();
    let mut index = 0;
    while index < queue.len() && mode != DropMode::None {
        let size = (queue.len() as u32).min(worker.max_batch.max(1));
        let finish = now.saturating_add((worker.latency)(size));
        if queue[index].examined {
            index += 1;
            continue;
        }
        let request = &queue[index];
        if mode == DropMode::LastTask {
            if worker.leaf && finish > request.deadline {
                formed.dropped.push(queue.remove(index).expect("index").id);
                continue;
            }
            break;
        }
        let checkpoint = request.arrived_at.saturating_add(worker.budget_ns);
        if finish <= checkpoint {
            break;
        }
        let overshoot = finish - checkpoint;
        // Under `DropWhen::Deadline` an overshoot alone does not drop a request that
        // can still make its deadline: the scan stops there, as at a request within
        // its budget, and the requests behind it are checked when they reach the head.
        // (Scanning past it re-examined the whole queue before every batch: at 4,800
        // requests/s on five-stage one call of events ran out of fuel.)
        let reachable = worker.drop_when == DropWhen::Deadline && finish.saturating_add(worker.downstream_ns) <= request.deadline;
        if mode == DropMode::PerTask {
            if reachable {
                break;
            }
            formed.dropped.push(queue.remove(index).expect("index").id);
            continue;
        }
        if worker.leaf {
            if finish > request.deadline {
                formed.dropped.push(queue.remove(index).expect("index").id);
                continue;
            }
            break;
        }
        match reroute(request, overshoot) {
            Some(pins) => {
                queue[index].examined = true;
                formed.pinned.push((queue[index].clone(), pins));
                index += 1;
            }
            None if reachable => break,
            None => {
                formed.dropped.push(queue.remove(index).expect("index").id);
            }
        }
    }
    let size = (queue.len() as u32).min(worker.max_batch.max(1)) as usize;
    // The scan above stops at the first request within its budget: the ones behind it
    // arrived later, so their budgets end later — but not their deadlines (a request
    // that spent longer upstream may have an earlier one). With early dropping on, a
    // request this batch would finish past its deadline is dropped here rather than
    // served late: it would only take a place in this batch and in the ones below (on
    // vision-chain at 1.25× its bound, 17 % of the completed requests ended late, all
    // within 6 % of the SLO).
    let finish = now.saturating_add((worker.latency)(size as u32));
    while formed.batch.len() < size {
        let Some(q) = queue.pop_front() else { break };
        let hopeless = matches!(mode, DropMode::PerTask | DropMode::Reroute) && !q.examined && finish > q.deadline;
        if hopeless {
            formed.dropped.push(q.id);
        } else {
            formed.batch.push(q.id);
            formed.origins.push(q.origin);
        }
    }
    formed
}

/// The rerouting rule for one child task: the most accurate backup worker, other
/// than the planned one, with `spare ≥ need` and a budget that makes up the
/// overshoot (`β(u) ≤ Y − x`); ties are broken by `unit` ∈ [0, 1). Takes `need` off
/// the chosen worker's spare capacity.
pub fn choose_reroute(
    backups: &mut [Backup],
    planned: WorkerId,
    planned_budget_ns: u64,
    overshoot_ns: u64,
    need: f64,
    unit: f64,
) -> Option<WorkerId> {
    let limit = planned_budget_ns.checked_sub(overshoot_ns)?;
    let eligible = |b: &Backup| b.worker != planned && b.spare >= need && b.budget_ns <= limit;
    let best = backups.iter().filter(|b| eligible(b)).map(|b| b.accuracy).fold(f64::NEG_INFINITY, f64::max);
    let ties: Vec<usize> = (0..backups.len()).filter(|&i| eligible(&backups[i]) && backups[i].accuracy >= best - 1e-12).collect();
    if ties.is_empty() {
        return None;
    }
    let pick = ties[((unit * ties.len() as f64) as usize).min(ties.len() - 1)];
    backups[pick].spare -= need;
    Some(backups[pick].worker)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(id: u64, arrived_at: u64, deadline: u64) -> Queued {
        Queued { id, origin: id, arrived_at, deadline, examined: false, holder: None }
    }

    fn backup(worker: u32, accuracy: f64, budget_ns: u64, spare: f64) -> Backup {
        Backup { worker, accuracy, budget_ns, spare }
    }

    #[test]
    fn rerouting_picks_the_most_accurate_backup_that_makes_up_the_overshoot() {
        // Property 9. Planned worker 9 with budget Y = 100; overshoot x = 30 → β ≤ 70.
        let mut backups = vec![backup(1, 0.9, 60, 5.0), backup(2, 1.0, 80, 5.0), backup(3, 0.95, 70, 5.0), backup(9, 1.0, 10, 5.0)];
        assert_eq!(choose_reroute(&mut backups, 9, 100, 30, 2.0, 0.0), Some(3), "2 is too slow, 9 is the planned one");
        assert_eq!(backups[2].spare, 3.0);
        assert_eq!(choose_reroute(&mut backups, 9, 100, 30, 2.0, 0.0), Some(3));
        assert_eq!(choose_reroute(&mut backups, 9, 100, 30, 2.0, 0.0), Some(1), "3 has no spare left");
        // No candidate: none.
        assert_eq!(choose_reroute(&mut backups, 9, 100, 95, 1.0, 0.0), None);
        assert_eq!(choose_reroute(&mut backups, 9, 20, 30, 1.0, 0.0), None);
    }

    #[test]
    fn drop_modes_decide_on_the_projected_finish() {
        let latency = |b: u32| 10 * b as u64;
        let worker = Worker { max_batch: 2, budget_ns: 25, leaf: false, latency: &latency, downstream_ns: 0, drop_when: DropWhen::Budget };
        // Projected finish at now = 10 with a batch of 2: 30. Request 1 (checkpoint 0 + 25)
        // overshoots by 5; request 2 (checkpoint 30) is on track.
        let queue = || VecDeque::from(vec![queued(1, 0, 1000), queued(2, 5, 1000), queued(3, 6, 1000)]);
        let mut q = queue();
        let f = form_batch(&mut q, &worker, 10, DropMode::None, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![1, 2], vec![]));
        let mut q = queue();
        let f = form_batch(&mut q, &worker, 10, DropMode::PerTask, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![2, 3], vec![1]));
        let mut q = queue();
        let mut seen = Vec::new();
        let f = form_batch(&mut q, &worker, 10, DropMode::Reroute, &mut |r, x| {
            seen.push((r.id, x));
            Some(vec![(1, 7)])
        });
        assert_eq!(seen, vec![(1, 5)]);
        assert_eq!((f.batch, f.dropped.len(), f.pinned.len()), (vec![1, 2], 0, 1));
        let mut q = queue();
        let f = form_batch(&mut q, &worker, 10, DropMode::Reroute, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![2, 3], vec![1]), "no target: dropped before it runs");
        // Last-task mode only drops at a leaf, on the end-to-end deadline.
        let leaf = Worker { leaf: true, ..worker };
        let mut q = VecDeque::from(vec![queued(1, 0, 20), queued(2, 0, 1000)]);
        let f = form_batch(&mut q, &leaf, 10, DropMode::LastTask, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![2], vec![1]));
        let mut q = VecDeque::from(vec![queued(1, 0, 20)]);
        let f = form_batch(&mut q, &worker, 10, DropMode::LastTask, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![1], vec![]), "not a leaf: kept");
    }

    #[test]
    fn a_request_behind_the_head_that_the_batch_would_finish_late_is_dropped_not_served() {
        // Request 1 is within its budget (checkpoint 0 + 25 ≥ finish 10 + 20), so the
        // scan stops there; request 2 behind it has the earlier deadline (29) and the
        // batch ends at 30.
        let latency = |b: u32| 10 * b as u64;
        let worker = Worker { max_batch: 2, budget_ns: 25, leaf: false, latency: &latency, downstream_ns: 0, drop_when: DropWhen::Budget };
        for mode in [DropMode::PerTask, DropMode::Reroute] {
            let mut q = VecDeque::from(vec![queued(1, 5, 1000), queued(2, 6, 29), queued(3, 7, 1000)]);
            let f = form_batch(&mut q, &worker, 10, mode, &mut |_, _| None);
            assert_eq!((f.batch, f.dropped), (vec![1, 3], vec![2]), "{mode:?}");
        }
        // Without early dropping (the ablation's `none`) it is served, late.
        let mut q = VecDeque::from(vec![queued(1, 5, 1000), queued(2, 6, 29)]);
        let f = form_batch(&mut q, &worker, 10, DropMode::None, &mut |_, _| None);
        assert_eq!((f.batch, f.dropped), (vec![1, 2], vec![]));
    }

    #[test]
    fn the_deadline_rule_drops_an_overshooting_request_only_when_its_deadline_is_out_of_reach() {
        let latency = |b: u32| 10 * b as u64;
        let worker =
            Worker { max_batch: 2, budget_ns: 25, leaf: false, latency: &latency, downstream_ns: 40, drop_when: DropWhen::Deadline };
        // Projected finish 30 here, + 40 below = 70. Request 1 overshoots its budget by
        // 5: with a deadline of 70 it is kept, with 69 it is dropped.
        for mode in [DropMode::PerTask, DropMode::Reroute] {
            let mut q = VecDeque::from(vec![queued(1, 0, 70), queued(2, 5, 1000)]);
            let f = form_batch(&mut q, &worker, 10, mode, &mut |_, _| None);
            assert_eq!((f.batch, f.dropped), (vec![1, 2], vec![]), "{mode:?}: the deadline is reachable");
            let mut q = VecDeque::from(vec![queued(1, 0, 69), queued(2, 5, 1000)]);
            let f = form_batch(&mut q, &worker, 10, mode, &mut |_, _| None);
            assert_eq!((f.batch, f.dropped), (vec![2], vec![1]), "{mode:?}: 1 ns short");
        }
        // A backup that makes up the overshoot is still preferred.
        let mut q = VecDeque::from(vec![queued(1, 0, 1000), queued(2, 5, 1000)]);
        let f = form_batch(&mut q, &worker, 10, DropMode::Reroute, &mut |_, _| Some(vec![(1, 7)]));
        assert_eq!(f.pinned.len(), 1);
        // The paper's rule drops it whatever the deadline.
        let paper = Worker { drop_when: DropWhen::Budget, ..worker };
        let mut q = VecDeque::from(vec![queued(1, 0, 1000), queued(2, 5, 1000)]);
        let f = form_batch(&mut q, &paper, 10, DropMode::PerTask, &mut |_, _| None);
        assert_eq!(f.dropped, vec![1]);
    }
}
