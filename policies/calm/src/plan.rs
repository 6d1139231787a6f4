//! FRAME_PLAN (spec §3.3, F4–F10) and the preemption guard (§3.5), as a pure function
//! of the analysed candidates of one worker: the priority cut-off, the
//! input-length window with the highest summed priority, guarded evictions for the
//! KV cache the window needs, and the work-conserving top-up.
//!
//! The host runs every dispatched sequence for the whole frame, so each member of
//! the plan costs one of the B slots: the capacity is B·Δ slot-iterations, charged Δ
//! per member. In `paced` packing only requests with a positive quota compete for
//! the slots (the others can only be fillers); `slots` packing is Algorithm 4.1.

use std::cmp::Ordering;

use yardmaster_sdk::{EvictMode, RequestId};

use crate::analyze::Analysis;
use crate::params::Packing;

/// One request a worker could run this frame, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The request.
    pub id: RequestId,
    /// ℓ: the grouping key (prompt length).
    pub key: u32,
    /// When it arrived (ties).
    pub arrival: u64,
    /// Whether its KV cache is on this worker.
    pub resident: bool,
    /// KV bytes it holds on this worker now.
    pub held: u64,
    /// KV bytes it needs to run one more frame (context plus a frame of growth).
    pub footprint: u64,
    /// ANALYZE's outputs.
    pub analysis: Analysis,
    /// Seconds of stall if it were evicted (the cheaper allowed mode).
    pub stall_s: f64,
    /// The mode that stall is for.
    pub evict_mode: EvictMode,
    /// Whether it is latency-sensitive (it may use the LS share).
    pub latency: bool,
    /// Whether it was dispatched before (an LS request's stream is under way).
    pub admitted: bool,
}

/// The worker-wide settings of one plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameSetting {
    /// B: most sequences per iteration.
    pub batch: usize,
    /// KV-cache capacity of the worker, bytes.
    pub kv_capacity: u64,
    /// p: the candidate cut-off.
    pub p: f64,
    /// Packing mode.
    pub packing: Packing,
    /// δ_pre: the preemption goodput-ratio threshold.
    pub delta_pre: f64,
    /// T_Δ: the frame's duration, seconds.
    pub frame_s: f64,
    /// The worker's token rate (active sequences / v_w), tokens per second.
    pub token_rate: f64,
    /// The share of the slots and of the KV cache kept for LS requests that need
    /// service this frame (0: none, the thesis's rule).
    pub ls_share: f64,
}

/// Why a member is in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A latency-sensitive request planned first, within the LS share.
    Reserved,
    /// Chosen by the window (it needs service this frame).
    Funded,
    /// Added by the top-up to use a slot that would stay idle.
    Filler,
}

/// The plan of one frame.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Members, funded ones first in descending P, then fillers.
    pub run: Vec<(RequestId, Role)>,
    /// Resident sequences to evict first.
    pub evict: Vec<(RequestId, EvictMode)>,
    /// bp: the capacity cut-off priority (0 when the funded demand is below B).
    pub cutoff: f64,
}

fn by_priority(a: &Candidate, b: &Candidate) -> Ordering {
    b.analysis.priority.total_cmp(&a.analysis.priority).then(a.arrival.cmp(&b.arrival)).then(a.id.cmp(&b.id))
}

/// The KV bytes a candidate adds when it runs (a resident only grows).
fn extra_kv(c: &Candidate) -> u64 {
    c.footprint.saturating_sub(c.held)
}

/// Goodput per frame of a candidate (spec §3.5 condition 3).
fn goodput_per_frame(c: &Candidate, frame_s: f64) -> f64 {
    let value = if c.analysis.feasible { c.analysis.value } else { 0.0 };
    value * frame_s / c.analysis.t_rem.max(frame_s)
}

/// GUARD(A, V): evict `victims` for `incoming` only if A ranks above each, earns
/// more than (1+δ_pre)× each one's goodput, and gains more than the stall loses.
pub fn guard(incoming: &Candidate, victims: &[&Candidate], setting: &FrameSetting) -> bool {
    let (p_a, g_a) = (incoming.analysis.priority, incoming.analysis.value);
    if victims.iter().any(|b| p_a <= b.analysis.priority || g_a <= (1.0 + setting.delta_pre) * b.analysis.value) {
        return false;
    }
    let gain = goodput_per_frame(incoming, setting.frame_s) - victims.iter().map(|b| goodput_per_frame(b, setting.frame_s)).sum::<f64>();
    let loss = victims.iter().map(|b| b.stall_s).sum::<f64>() * setting.token_rate;
    gain > loss
}

/// The LS share of a plan: the latency-sensitive requests planned first and the LS
/// residents whose KV cache other classes may not evict.
struct LsShare<'a> {
    members: Vec<&'a Candidate>,
    protected: Vec<RequestId>,
}

/// The LS share (before F4): the feasible LS requests, those already streaming
/// first (resident, then evicted), then the waiting ones by arrival, as long as
/// they fit in `ls_share` of the B slots and of
/// the KV capacity (counting the KV every LS resident holds). The LS residents
/// within that KV share, in the same order, are protected from evictions for
/// other classes, so that a stream under way keeps its cache while it runs ahead of
/// its timeline.
fn ls_share<'a>(candidates: &'a [Candidate], setting: &FrameSetting) -> LsShare<'a> {
    let mut share = LsShare { members: Vec::new(), protected: Vec::new() };
    if setting.ls_share <= 0.0 {
        return share;
    }
    let slots = (setting.ls_share * setting.batch as f64).floor() as usize;
    let kv_share = (setting.ls_share * setting.kv_capacity as f64) as u64;
    let mut ls: Vec<&Candidate> = candidates.iter().filter(|c| c.latency && c.analysis.feasible).collect();
    ls.sort_by(|a, b| b.resident.cmp(&a.resident).then(b.admitted.cmp(&a.admitted)).then(a.arrival.cmp(&b.arrival)).then(a.id.cmp(&b.id)));
    let mut kv = 0u64;
    for c in ls.iter().filter(|c| c.resident) {
        if kv + c.held <= kv_share {
            kv += c.held;
            share.protected.push(c.id);
        }
    }
    for c in ls {
        if share.members.len() >= slots {
            break;
        }
        // A stream under way keeps running ahead of its timeline (a paused one holds
        // its KV cache idle, and a frame longer than planned would make its next
        // token late); a new one is admitted at once, so that its first token
        // cannot be late behind a long frame.
        if c.resident && !share.protected.contains(&c.id) {
            continue;
        }
        if kv + extra_kv(c) <= kv_share {
            kv += extra_kv(c);
            share.members.push(c);
        }
    }
    share
}

/// F4–F10 over `candidates` (every request the worker may run: its residents and
/// the unbound waiting requests), after the LS share (see [`FrameSetting::ls_share`]).
pub fn plan_frame(candidates: &[Candidate], setting: &FrameSetting) -> Selection {
    let share = ls_share(candidates, setting);
    let in_share = |id: RequestId| share.members.iter().any(|m| m.id == id);
    let held: u64 = candidates.iter().filter(|c| c.resident).map(|c| c.held).sum();
    let mut free = setting.kv_capacity.saturating_sub(held);
    let mut selection = Selection::default();
    let mut evicted: Vec<RequestId> = Vec::new();
    // The LS share's KV: free KV first, then paused residents of other classes, the
    // lowest priority first (the share is kept for LS, so no guard applies).
    for a in &share.members {
        let need = extra_kv(a);
        if need > free {
            let mut victims: Vec<&Candidate> =
                candidates.iter().filter(|c| c.resident && !c.latency && !in_share(c.id) && !evicted.contains(&c.id)).collect();
            victims.sort_by(|x, y| by_priority(y, x));
            let (mut freed, mut taken) = (0u64, Vec::new());
            for v in victims {
                if free + freed >= need {
                    break;
                }
                freed += v.held;
                taken.push(v);
            }
            if free + freed < need {
                continue;
            }
            for v in taken {
                evicted.push(v.id);
                selection.evict.push((v.id, v.evict_mode));
            }
            free += freed;
        }
        free -= need;
        selection.run.push((a.id, Role::Reserved));
    }
    let batch = setting.batch.max(1).saturating_sub(selection.run.len());
    if batch == 0 {
        return selection;
    }
    let candidates: Vec<Candidate> = candidates.iter().filter(|c| !in_share(c.id) && !evicted.contains(&c.id)).cloned().collect();
    let candidates = &candidates[..];
    // F4–F5: the funded set and the capacity cut-off.
    let mut funded: Vec<&Candidate> = candidates.iter().filter(|c| setting.packing == Packing::Slots || c.analysis.quota > 0).collect();
    funded.sort_by(|a, b| by_priority(a, b));
    let cutoff = if funded.len() >= batch { funded[batch - 1].analysis.priority } else { 0.0 };
    // F6: candidates within a factor p of the cut-off.
    let mut cand: Vec<&Candidate> = funded.into_iter().filter(|c| c.analysis.priority >= setting.p * cutoff).collect();
    // F7–F8: the input-length window with the largest summed priority.
    cand.sort_by(|a, b| a.key.cmp(&b.key).then(a.id.cmp(&b.id)));
    let window = best_window(&cand, batch, setting.kv_capacity);
    let mut members: Vec<&Candidate> = cand[window.0..window.1].to_vec();
    members.sort_by(|a, b| by_priority(a, b));

    // F10: reserve KV for each member, evicting guarded victims when short (never an
    // LS resident the share protects).
    selection.cutoff = cutoff;
    let chosen = |id: RequestId, members: &[&Candidate]| members.iter().any(|m| m.id == id) || share.protected.contains(&id);
    let mut kept: Vec<&Candidate> = Vec::new();
    for a in &members {
        if evicted.contains(&a.id) {
            continue;
        }
        let need = extra_kv(a);
        if need <= free {
            free -= need;
            kept.push(a);
            continue;
        }
        if a.resident {
            // KV exhaustion (§3.4): a resident short of its frame's growth force-evicts,
            // without GUARD, the paused residents of lowest P below it (members not
            // yet kept included). Residents that ran last frame used up their
            // reservation, so once the cache is full none of them could grow and the
            // worker stood idle with its cache held until deadlines passed.
            let mut victims: Vec<&Candidate> = candidates
                .iter()
                .filter(|c| c.resident && c.id != a.id && !share.protected.contains(&c.id) && !evicted.contains(&c.id))
                .filter(|c| !kept.iter().any(|k| k.id == c.id) && by_priority(a, c) == Ordering::Less)
                .collect();
            victims.sort_by(|x, y| by_priority(y, x));
            let (freed, taken) = take_until_freed(victims, free, need);
            if free + freed >= need {
                for v in &taken {
                    evicted.push(v.id);
                    selection.evict.push((v.id, v.evict_mode));
                }
                free = free + freed - need;
                kept.push(a);
            }
            continue;
        }
        let mut victims: Vec<&Candidate> =
            candidates.iter().filter(|c| c.resident && !chosen(c.id, &members) && !evicted.contains(&c.id)).collect();
        victims.sort_by(|x, y| by_priority(y, x));
        let (freed, taken) = take_until_freed(victims, free, need);
        if free + freed >= need && guard(a, &taken, setting) {
            for v in &taken {
                evicted.push(v.id);
                selection.evict.push((v.id, v.evict_mode));
            }
            free = free + freed - need;
            kept.push(a);
        }
    }
    selection.run.extend(kept.iter().map(|c| (c.id, Role::Funded)));
    let batch = setting.batch.max(1);

    // F9: top-up with fillers that fit in what is left, residents first.
    if selection.run.len() < batch {
        let mut rest: Vec<&Candidate> =
            candidates.iter().filter(|c| !selection.run.iter().any(|(id, _)| *id == c.id) && !evicted.contains(&c.id)).collect();
        rest.sort_by(|a, b| b.resident.cmp(&a.resident).then(by_priority(a, b)));
        for c in rest {
            if selection.run.len() >= batch {
                break;
            }
            let need = extra_kv(c);
            if need <= free {
                free -= need;
                selection.run.push((c.id, Role::Filler));
            }
        }
    }
    selection
}

/// F8: over candidates sorted by key, the window [i, j) of at most `batch` members
/// whose footprints fit in `kv_capacity` with the largest summed priority (ties:
/// smaller key spread, then smaller i).
pub fn best_window(sorted: &[&Candidate], batch: usize, kv_capacity: u64) -> (usize, usize) {
    let n = sorted.len();
    let (mut best, mut best_score, mut best_spread) = ((0, 0), f64::NEG_INFINITY, u32::MAX);
    let (mut j, mut score, mut kv) = (0usize, 0.0f64, 0u64);
    for i in 0..n {
        if j < i {
            j = i;
            score = 0.0;
            kv = 0;
        }
        while j < n && j - i < batch && kv + sorted[j].footprint <= kv_capacity {
            score += sorted[j].analysis.priority;
            kv += sorted[j].footprint;
            j += 1;
        }
        if j > i {
            let spread = sorted[j - 1].key - sorted[i].key;
            if score > best_score || (score == best_score && spread < best_spread) {
                (best, best_score, best_spread) = ((i, j), score, spread);
            }
            score -= sorted[i].analysis.priority;
            kv -= sorted[i].footprint;
        }
    }
    best
}

/// The first of `victims` (most evictable first) whose held cache, with `free`
/// already free, covers `need`: the bytes they free and the victims taken (all of them,
/// freeing less than needed, when they cannot).
fn take_until_freed(victims: Vec<&Candidate>, free: u64, need: u64) -> (u64, Vec<&Candidate>) {
    let mut freed = 0u64;
    let mut taken = Vec::new();
    for v in victims {
        if free + freed >= need {
            break;
        }
        freed += v.held;
        taken.push(v);
    }
    (freed, taken)
}
