//! Replica bounds a policy may ask for at a stage: its own limits (parameters such as
//! `r_min` and `r_max`) narrowed to the stage's `[min_replicas, max_replicas]`.
//!
//! A stage whose model is out of service — *offline*, as a model unloaded while a
//! model repository is served leaves it (`min_replicas = max_replicas = 0`) — allows
//! no replica at all, whatever floor the policy keeps elsewhere: scaling it to one is
//! rejected. Its stage and stream keep their ids, and loading the model again brings
//! the bounds back (the policy is then initialised again with the new configuration).
//!
//! [`bottleneck_fill`] spreads a cluster that cannot serve the demand over the stages
//! so that the rate it serves is the highest: each worker goes to the stage that is
//! then the bottleneck.

use crate::Stage;

/// Whether `stage` is offline: no replica allowed (its model is out of service).
pub fn is_offline(stage: &Stage) -> bool {
    stage.max_replicas == 0
}

/// The replica bounds `(low, high)` at `stage` for a policy whose own limits are
/// `[low, high]`: never outside the stage's own bounds (an offline stage gets
/// `(0, 0)`); where the policy's floor is above its ceiling, the floor wins (within
/// the stage's bounds).
pub fn replica_bounds(stage: &Stage, low: u32, high: u32) -> (u32, u32) {
    let low = low.max(stage.min_replicas).min(stage.max_replicas);
    (low, high.min(stage.max_replicas).max(low))
}

/// Spread `cluster` workers over stages whose one worker serves `unit[s]` requests
/// per second (of whatever the caller counts: entry requests, root queries), each
/// stage starting at `floors[s]` and taking at most `caps[s]`: each further worker
/// goes to the open stage whose capacity (`replicas × unit`) is then the lowest, the
/// first such stage on ties, until the workers or the open stages run out. The
/// lowest capacity is then as high as any spread within the bounds makes it. The
/// result is written to `replicas`.
///
/// One worker at a time, that is a merge of every stage's capacity levels
/// `r × unit` in order (level, stage). So every level under a threshold `x` whose
/// count stays under the workers to hand out is taken at once, and only the last few
/// workers go one at a time: the cost is a few passes over the stages whatever the
/// cluster's size, and the result is the one-at-a-time result exactly.
pub fn bottleneck_fill(unit: &[f64], floors: &[u32], caps: &[u32], cluster: u32, replicas: &mut [u32]) {
    let stages = unit.len();
    replicas.copy_from_slice(floors);
    let mut left = cluster.saturating_sub(floors.iter().sum());
    let open = |s: usize, replicas: &[u32]| replicas[s] < caps[s];
    // An open stage has fewer than x/unit levels below x from its second worker on
    // (one more from its first, where its floor is none), so the levels below
    // x = (left − stages without a floor) / Σ 1/unit number fewer than `left` (x a
    // hair lower, so rounding cannot push the count over). A stage of infinite unit
    // has no level below x, nor counts here (0 × ∞ is no number).
    let (mut inverse, mut unfloored) = (0.0f64, 0i64);
    for s in (0..stages).filter(|&s| open(s, replicas) && unit[s].is_finite()) {
        inverse += 1.0 / unit[s];
        unfloored += (replicas[s] == 0) as i64;
    }
    let x = (left as i64 - unfloored) as f64 / inverse * (1.0 - 1e-9);
    if left > 0 && x.is_finite() && x > 0.0 {
        for s in 0..stages {
            if !open(s, replicas) || !unit[s].is_finite() {
                continue;
            }
            // Workers r < caps[s] whose level r × unit is below x, from r = 0.
            let top = caps[s] - 1;
            let mut below = (x / unit[s]).floor().min(top as f64) as u32;
            while below >= 1 && below as f64 * unit[s] >= x {
                below -= 1;
            }
            while below < top && (below + 1) as f64 * unit[s] < x {
                below += 1;
            }
            if below + 1 > replicas[s] {
                left -= below + 1 - replicas[s];
                replicas[s] = below + 1;
            }
        }
    }
    for _ in 0..left {
        let candidates = (0..stages).filter(|&s| open(s, replicas));
        let Some(bottleneck) = candidates.min_by(|&a, &b| (replicas[a] as f64 * unit[a]).total_cmp(&(replicas[b] as f64 * unit[b]))) else {
            break;
        };
        replicas[bottleneck] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageKind;

    fn stage(min_replicas: u32, max_replicas: u32) -> Stage {
        Stage {
            id: 0,
            name: "s".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants: vec![],
            max_batch: 4,
            min_replicas,
            max_replicas,
        }
    }

    #[test]
    fn bottleneck_fill_gives_the_one_worker_at_a_time_result() {
        // The rule itself: one worker at a time to the lowest capacity, first on ties.
        fn one_at_a_time(unit: &[f64], floors: &[u32], caps: &[u32], cluster: u32) -> Vec<u32> {
            let mut replicas = floors.to_vec();
            for _ in floors.iter().sum::<u32>()..cluster {
                let open = (0..unit.len()).filter(|&t| replicas[t] < caps[t]);
                let Some(t) = open.min_by(|&a, &b| (replicas[a] as f64 * unit[a]).total_cmp(&(replicas[b] as f64 * unit[b]))) else {
                    break;
                };
                replicas[t] += 1;
            }
            replicas
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..5_000 {
            let tasks = (next() % 7) as usize;
            // Integer-valued units make exact ties between tasks' levels common.
            let unit: Vec<f64> = (0..tasks)
                .map(|_| match next() % 8 {
                    0 => f64::INFINITY,
                    1 => 0.0,
                    2 | 3 => (1 + next() % 6) as f64 * 10.0,
                    _ => (next() % 100_000) as f64 / 97.0 + 0.01,
                })
                .collect();
            let caps: Vec<u32> = (0..tasks).map(|_| (next() % 30) as u32).collect();
            // Floors of 0 to 3, some above their caps (kept, never added to).
            let floors: Vec<u32> = (0..tasks).map(|_| (next() % 4) as u32).collect();
            let cluster = (next() % 140) as u32;
            let mut replicas = vec![0; tasks];
            bottleneck_fill(&unit, &floors, &caps, cluster, &mut replicas);
            let expected = one_at_a_time(&unit, &floors, &caps, cluster);
            assert_eq!(replicas, expected, "case {case}: unit {unit:?} floors {floors:?} caps {caps:?} cluster {cluster}");
        }
    }

    #[test]
    fn the_policys_limits_are_narrowed_to_the_stages() {
        assert_eq!(replica_bounds(&stage(1, 8), 1, 4), (1, 4));
        assert_eq!(replica_bounds(&stage(2, 3), 1, 8), (2, 3));
        // A floor above the ceiling: the floor, within the stage's bounds.
        assert_eq!(replica_bounds(&stage(1, 8), 3, 2), (3, 3));
        assert_eq!(replica_bounds(&stage(1, 2), 3, 8), (2, 2));
    }

    #[test]
    fn an_offline_stage_allows_no_replica_whatever_the_policys_floor() {
        let offline = stage(0, 0);
        assert!(is_offline(&offline) && !is_offline(&stage(0, 1)));
        assert_eq!(replica_bounds(&offline, 1, 8), (0, 0));
        assert_eq!(replica_bounds(&offline, 0, 0), (0, 0));
    }
}
