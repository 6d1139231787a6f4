//! The bounded candidate set of a frame plan (issue 43): a plan's cost must not grow
//! with the queue. ANALYZE still runs over every candidate (one pass, no sort), but
//! FRAME_PLAN's sorts, window search, victim searches and top-up run over the worker's
//! residents (its only eviction victims), the latency-sensitive requests the LS share
//! would take next, and the best-ranked `window` × B of the other waiting requests —
//! those with a quota first, by priority. A request ranked past them waits for a later
//! frame: with B slots a frame, the funded cut-off is the B-th of them, and only the
//! members within p of it (p ≥ 0.8) compete in the length window, so the plan differs
//! from the unbounded one only when more than `window` × B requests are within p of
//! the cut-off.

use std::cmp::Ordering;

use yardmaster_sdk::RequestId;

use crate::plan::Candidate;

/// The default `plan_window`: batches of waiting requests a plan considers beyond its
/// residents (the baselines' `ranked::WINDOW`).
pub const WINDOW: usize = 8;

/// Rank of a waiting request for the window: priority, arrival and id (the plan's
/// own order).
fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.analysis.priority.total_cmp(&a.analysis.priority).then(a.arrival.cmp(&b.arrival)).then(a.id.cmp(&b.id))
}

/// The LS share's order among waiting LS requests: streams under way (evicted) first,
/// then by arrival (as [`crate::plan`]'s share takes them).
fn ls_order(a: &Candidate, b: &Candidate) -> Ordering {
    b.admitted.cmp(&a.admitted).then(a.arrival.cmp(&b.arrival)).then(a.id.cmp(&b.id))
}

/// Keep the `n` first of `indices` (into `all`) in `order`, unsorted, in linear time.
fn first(all: &[Candidate], indices: &mut Vec<usize>, n: usize, order: fn(&Candidate, &Candidate) -> Ordering) {
    if indices.len() > n {
        if n > 0 {
            indices.select_nth_unstable_by(n - 1, |a, b| order(&all[*a], &all[*b]));
        }
        indices.truncate(n);
    }
}

/// The candidates a plan for a worker of `batch` slots considers: every resident, the
/// first `window` × the LS share's slots of the feasible waiting LS requests, and of
/// the other waiting requests (LS ones included: beyond the share they compete by
/// priority) the best-ranked `window` × `batch` with a positive quota (the funded
/// set's contenders) and as many without (the top-up's; together they hold the
/// best-ranked `window` × `batch` of all, `slots` packing's contenders). `window` = 0
/// keeps every candidate. Linear in the number of candidates; the order is kept.
pub fn bounded(mut candidates: Vec<Candidate>, batch: usize, ls_slots: usize, window: usize) -> Vec<Candidate> {
    let keep = window.saturating_mul(batch.max(1));
    if window == 0 || candidates.len() <= keep {
        return candidates;
    }
    let (mut share, mut funded, mut unfunded) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in candidates.iter().enumerate() {
        if c.resident {
            continue;
        }
        if c.latency && c.analysis.feasible && ls_slots > 0 {
            share.push(i);
        } else if c.analysis.quota > 0 {
            funded.push(i);
        } else {
            unfunded.push(i);
        }
    }
    // LS requests past the share's next streams compete by priority like the others.
    let share_keep = window.saturating_mul(ls_slots);
    if share.len() > share_keep {
        if share_keep > 0 {
            share.select_nth_unstable_by(share_keep - 1, |a, b| ls_order(&candidates[*a], &candidates[*b]));
        }
        for i in share.split_off(share_keep) {
            if candidates[i].analysis.quota > 0 {
                funded.push(i);
            } else {
                unfunded.push(i);
            }
        }
    }
    first(&candidates, &mut funded, keep, rank);
    first(&candidates, &mut unfunded, keep, rank);
    let mut kept: Vec<bool> = candidates.iter().map(|c| c.resident).collect();
    for i in share.into_iter().chain(funded).chain(unfunded) {
        kept[i] = true;
    }
    let mut flags = kept.into_iter();
    candidates.retain(|_| flags.next().unwrap_or(false));
    candidates
}

/// Shed the waiting requests ranked past the `cap` best of those `exempt` does not
/// keep (a stage's pool of `queue_cap` batches per replica): they leave `candidates`
/// and are returned, to be dropped. `cap` = 0 sheds nothing. Linear in the number of
/// candidates.
pub fn shed(candidates: &mut Vec<Candidate>, cap: usize, exempt: impl Fn(&Candidate) -> bool) -> Vec<RequestId> {
    if cap == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<&Candidate> = candidates.iter().filter(|c| !exempt(c)).collect();
    if ranked.len() <= cap {
        return Vec::new();
    }
    ranked.select_nth_unstable_by(cap - 1, |a, b| rank(a, b));
    let last = ranked[cap - 1].clone();
    let mut shed = Vec::new();
    candidates.retain(|c| {
        let keep = exempt(c) || rank(c, &last) != Ordering::Greater;
        if !keep {
            shed.push(c.id);
        }
        keep
    });
    shed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::Analysis;
    use crate::params::Packing;
    use crate::plan::{plan_frame, FrameSetting};
    use yardmaster_sdk::EvictMode;

    /// Deterministic candidates: `n` waiting requests of scattered keys, priorities and
    /// footprints, some LS, some without a quota, and `residents` residents.
    fn scattered(n: u64, residents: u64, seed: u64) -> Vec<Candidate> {
        let mut state = seed;
        (0..n)
            .map(|id| {
                let (next, word) = yardmaster_sdk::splitmix64(state);
                state = next;
                let priority = ((word >> 20) % 1000) as f64 + 1.0;
                let resident = id < residents;
                Candidate {
                    id,
                    key: (word % 4000) as u32 + 1,
                    arrival: id,
                    resident,
                    held: if resident { 900 } else { 0 },
                    footprint: 1000 + (word >> 40) % 500,
                    analysis: Analysis {
                        value: priority * 10.0,
                        t_gen: 10.0,
                        t_rem: 20.0,
                        bandwidth: 0.5,
                        feasible: (word >> 8) % 7 != 0,
                        quota: if (word >> 12) % 5 == 0 { 0 } else { 10 },
                        priority,
                    },
                    stall_s: 0.01,
                    evict_mode: EvictMode::Swap,
                    latency: (word >> 16) % 3 == 0,
                    admitted: resident || (word >> 24) % 4 == 0,
                }
            })
            .collect()
    }

    fn setting(batch: usize, p: f64, ls_share: f64, kv_capacity: u64) -> FrameSetting {
        FrameSetting { batch, kv_capacity, p, packing: Packing::Paced, delta_pre: 0.1, frame_s: 1.0, token_rate: 100.0, ls_share }
    }

    #[test]
    fn the_pool_keeps_its_best_ranked_and_every_exempt_request() {
        let all = scattered(3000, 20, 3);
        let mut kept = all.clone();
        let shed = shed(&mut kept, 500, |c| c.resident || c.latency);
        assert_eq!(kept.iter().filter(|c| !c.resident && !c.latency).count(), 500);
        assert_eq!(kept.len() + shed.len(), all.len());
        let worst = kept.iter().filter(|c| !c.resident && !c.latency).max_by(|a, b| rank(a, b)).unwrap();
        for id in &shed {
            let c = all.iter().find(|c| c.id == *id).unwrap();
            assert!(!c.resident && !c.latency && rank(worst, c) == Ordering::Less, "{id}");
        }
        let mut whole = all.clone();
        assert!(super::shed(&mut whole, 0, |_| false).is_empty() && whole == all);
    }

    #[test]
    fn a_short_queue_is_planned_whole() {
        let all = scattered(100, 10, 1);
        assert_eq!(bounded(all.clone(), 32, 16, WINDOW), all);
    }

    #[test]
    fn the_window_keeps_residents_and_the_best_ranked_and_is_bounded() {
        let all = scattered(5000, 20, 2);
        let kept = bounded(all.clone(), 32, 16, WINDOW);
        assert!(kept.len() <= 20 + WINDOW * 16 + 2 * WINDOW * 32, "{}", kept.len());
        assert_eq!(kept.iter().filter(|c| c.resident).count(), 20);
        // With quota and without, every waiting request left out ranks below every one
        // kept (apart from the LS share's).
        let share: Vec<u64> = {
            let mut ls: Vec<&Candidate> = all.iter().filter(|c| !c.resident && c.latency && c.analysis.feasible).collect();
            ls.sort_by(|a, b| ls_order(a, b));
            ls.iter().take(WINDOW * 16).map(|c| c.id).collect()
        };
        for funded in [true, false] {
            let group = |c: &&Candidate| !c.resident && !share.contains(&c.id) && (c.analysis.quota > 0) == funded;
            let worst_kept = kept.iter().filter(group).max_by(|a, b| rank(a, b)).unwrap();
            for c in all.iter().filter(group) {
                if !kept.iter().any(|k| k.id == c.id) {
                    assert_eq!(rank(worst_kept, c), Ordering::Less, "{} left out before {}", c.id, worst_kept.id);
                }
            }
        }
    }

    #[test]
    fn the_bounded_plan_is_the_unbounded_plan_when_the_band_within_p_fits_the_window() {
        // Priorities spread over 1–1,000: with p = 1 the length window is over the top
        // B, with p = 0.95 (the default) over the ~5 % of the funded within p of the
        // cut-off (about 120 of 2,400); with the LS share on and off, the KV cache binding or not,
        // over several seeds and residents.
        for seed in 1..=20 {
            for (n, residents, kv) in [(3000u64, 30u64, 40_000u64), (1000, 0, 1_000_000), (600, 5, 10_000)] {
                let all = scattered(n, residents, seed);
                for (p, ls_share) in [(1.0, 0.0), (1.0, 0.5), (0.95, 0.0), (0.95, 0.5)] {
                    let s = setting(32, p, ls_share, kv);
                    let slots = (ls_share * 32.0) as usize;
                    let unbounded = plan_frame(&all, &s);
                    let windowed = plan_frame(&bounded(all.clone(), 32, slots, WINDOW), &s);
                    assert_eq!(windowed, unbounded, "seed {seed}, n {n}, p {p}, ls_share {ls_share}");
                }
            }
        }
    }
}
