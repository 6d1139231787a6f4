//! ANALYZE (spec §3.2): for one request at one instant, its remaining-work upper
//! bound, value G, bandwidth, feasibility, frame quota and priority P = G / t_gen.

use yardmaster_sdk::helpers::ServiceClass;

use crate::params::{Objective, Params};

/// The worker-side quantities ANALYZE needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerRates {
    /// v_w: measured decode-step time, seconds.
    pub step_s: f64,
    /// Δ: decode steps per frame.
    pub frame_steps: u32,
}

impl WorkerRates {
    /// T_Δ: the frame's duration, seconds.
    pub fn frame_s(&self) -> f64 {
        self.step_s * self.frame_steps as f64
    }
}

/// What ANALYZE needs to know about a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestView {
    /// Its class.
    pub class: ServiceClass,
    /// a_r, seconds.
    pub arrival_s: f64,
    /// d_r (DS/BE/CP) or the first-token deadline a_r + TTFT (LS), seconds.
    pub deadline_s: f64,
    /// L_in.
    pub prompt: u32,
    /// g.
    pub generated: u32,
    /// L̂, the upper bound on total output tokens (> g).
    pub bound: u32,
    /// Prompt tokens still to (re)fill.
    pub prefill: u32,
    /// Extra restore time (swap-in), seconds.
    pub restore_s: f64,
    /// Frames it was a candidate and was not served.
    pub frames_unserved: u32,
    /// For a call of a compound job: the job's terms (its `deadline_s` is then the
    /// stage's sub-deadline d_s).
    pub job: Option<JobTerms>,
}

/// What a compound call shares with its job (spec §3.2 A4, A9).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobTerms {
    /// Ĝ_R: tokens of the job's finished calls, its live calls' L_in + L̂, and the
    /// matched pattern's stages after the current one.
    pub value: f64,
    /// t_gen of the stage: Σ t_gen over the job's live calls of the current stage.
    pub stage_t_gen: f64,
    /// d_R: the job's end-to-end deadline, seconds.
    pub job_deadline_s: f64,
}

/// ANALYZE's outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Analysis {
    /// G: the goodput still achievable (before aging; 0 when infeasible is *not* applied here).
    pub value: f64,
    /// t_gen: the upper bound on remaining compute, seconds.
    pub t_gen: f64,
    /// t_rem: time left to the (last token's) deadline, seconds (may be negative).
    pub t_rem: f64,
    /// bw = t_gen / t_rem: the minimum serving bandwidth.
    pub bandwidth: f64,
    /// Whether it can still earn goodput under the bound.
    pub feasible: bool,
    /// q: decode iterations it needs this frame (0..=Δ).
    pub quota: u32,
    /// P = G_x / (t_gen + ε), with G_x the aged value (0 value when infeasible).
    pub priority: f64,
}

/// t_gen (A2–A3): the upper bound on `r`'s remaining compute, seconds.
pub fn remaining_compute(r: &RequestView, rates: WorkerRates, params: &Params) -> f64 {
    let len_rem = r.bound.saturating_sub(r.generated).max(1);
    r.prefill as f64 * params.prefill_ns_per_token / 1e9 + len_rem as f64 * rates.step_s + r.restore_s
}

/// Analyse `r` at `now_s` on a worker with `rates`.
pub fn analyze(r: &RequestView, now_s: f64, rates: WorkerRates, params: &Params) -> Analysis {
    let v = rates.step_s;
    let frame = rates.frame_steps;
    let len_rem = r.bound.saturating_sub(r.generated).max(1);
    let prefill_s = r.prefill as f64 * params.prefill_ns_per_token / 1e9;
    let t_gen = remaining_compute(r, rates, params);
    let (value, t_rem, feasible, quota);
    match r.class {
        ServiceClass::Latency => {
            let tbt = params.tbt_ns as f64 / 1e9;
            let first_due = r.deadline_s;
            t_rem = first_due + (r.bound.saturating_sub(1)) as f64 * tbt - now_s;
            let on_time = achievable_tokens(first_due, tbt, r.generated, r.bound, now_s, prefill_s, v);
            value = match params.objective {
                Objective::Token => params.omega_out * on_time as f64,
                Objective::Request => (on_time > 0) as u32 as f64,
            };
            feasible = on_time > 0;
            // Tokens due by the look-ahead horizon h.
            let horizon = now_s + (1.0 + params.kappa) * rates.frame_s() + prefill_s;
            let due = tokens_due(first_due, tbt, r.bound, horizon);
            let mut q = due.saturating_sub(r.generated).min(frame);
            if r.prefill > 0 && due >= 1 {
                q = q.max(1);
            }
            quota = q;
        }
        ServiceClass::Deadline | ServiceClass::BestEffort | ServiceClass::Compound => {
            t_rem = r.deadline_s - now_s;
            value = match (params.objective, r.job) {
                (Objective::Request, _) => 1.0,
                (Objective::Token, Some(job)) => job.value,
                (Objective::Token, None) => params.omega_in * r.prompt as f64 + params.omega_out * (r.generated + len_rem) as f64,
            };
            let bw = t_gen / t_rem.max(params.epsilon_s);
            feasible = match r.job {
                // A compound call paces to d_s but can still earn while the job can
                // finish: only d_R makes it hopeless (a missed d_s is re-amortised).
                Some(job) => {
                    let left = job.job_deadline_s - now_s;
                    left > 0.0 && t_gen <= left
                }
                None => t_rem > 0.0 && bw <= 1.0,
            };
            quota = (frame as f64 * bw.min(1.0)).ceil() as u32;
        }
    }
    let bandwidth = t_gen / t_rem.max(params.epsilon_s);
    let aged = if feasible { value } else { 0.0 } + params.delta_age * r.frames_unserved as f64;
    // A9: every call of a compound stage shares the stage's P (Ĝ_R over the stage's t_gen).
    let charged = r.job.map_or(t_gen, |job| job.stage_t_gen.max(t_gen));
    let priority = aged / (charged + params.epsilon_s);
    Analysis { value, t_gen, t_rem, bandwidth, feasible, quota, priority }
}

/// #{ j ∈ [g, L̂) : τ_j ≥ now + prefill + (j − g + 1)·v } with τ_j = first_due + j·tbt,
/// in closed form: τ_j − (now + prefill + (j−g+1)v) = j·(tbt − v) + k.
pub fn achievable_tokens(first_due: f64, tbt: f64, g: u32, bound: u32, now: f64, prefill: f64, v: f64) -> u32 {
    if bound <= g {
        return 0;
    }
    let k = first_due - now - prefill + (g as f64 - 1.0) * v;
    let slope = tbt - v;
    let (lo, hi) = (g as f64, (bound - 1) as f64);
    let (first, last) = if slope > 0.0 {
        ((-k / slope).ceil().max(lo), hi)
    } else if slope < 0.0 {
        (lo, (k / -slope).floor().min(hi))
    } else if k >= 0.0 {
        (lo, hi)
    } else {
        return 0;
    };
    if last < first {
        0
    } else {
        (last - first + 1.0) as u32
    }
}

/// n_due(τ): output tokens due by `at` (at most the bound).
pub fn tokens_due(first_due: f64, tbt: f64, bound: u32, at: f64) -> u32 {
    if at < first_due {
        return 0;
    }
    let due = if tbt > 0.0 { ((at - first_due) / tbt).floor() as u64 + 1 } else { u64::from(bound) };
    due.min(u64::from(bound)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::defaults;

    fn ds(prompt: u32, generated: u32, bound: u32, deadline_s: f64) -> RequestView {
        RequestView {
            class: ServiceClass::Deadline,
            arrival_s: 0.0,
            deadline_s,
            prompt,
            generated,
            bound,
            prefill: 0,
            restore_s: 0.0,
            frames_unserved: 0,
            job: None,
        }
    }

    const RATES: WorkerRates = WorkerRates { step_s: 0.01, frame_steps: 50 };

    #[test]
    fn achievable_tokens_matches_a_direct_count() {
        for &(first, tbt, g, bound, now, prefill, v) in &[
            (2.0, 0.1, 0, 100, 0.0, 0.05, 0.02),
            (2.0, 0.1, 10, 100, 5.0, 0.0, 0.02),
            (1.0, 0.01, 0, 50, 0.5, 0.1, 0.03),
            (1.0, 0.03, 5, 50, 0.5, 0.1, 0.03),
            (0.0, 0.1, 0, 10, 3.0, 0.0, 0.01),
        ] {
            let direct = (g..bound).filter(|&j| first + j as f64 * tbt >= now + prefill + (j - g + 1) as f64 * v - 1e-12).count() as u32;
            assert_eq!(achievable_tokens(first, tbt, g, bound, now, prefill, v), direct, "{first} {tbt} {g} {bound} {now}");
        }
    }

    #[test]
    fn delta_invariance_of_priority_order() {
        // Property 1: P does not depend on Δ, so the P order is the same when Δ doubles.
        let params = defaults();
        let requests = [ds(100, 0, 200, 10.0), ds(4000, 20, 60, 6.0), ds(50, 100, 1000, 30.0), ds(800, 0, 30, 1.0)];
        let order = |rates: WorkerRates| {
            let mut v: Vec<(usize, f64)> =
                requests.iter().enumerate().map(|(i, r)| (i, analyze(r, 0.5, rates, &params).priority)).collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            v
        };
        let single = order(RATES);
        let double = order(WorkerRates { frame_steps: 100, ..RATES });
        assert_eq!(single, double);
        // The quotas rescale with Δ (within rounding).
        for r in &requests {
            let q1 = analyze(r, 0.5, RATES, &params).quota as f64;
            let q2 = analyze(r, 0.5, WorkerRates { frame_steps: 100, ..RATES }, &params).quota as f64;
            assert!((q2 - 2.0 * q1).abs() <= 2.0, "{q1} {q2}");
        }
    }

    #[test]
    fn compound_calls_share_their_stages_priority_and_pace_to_the_sub_deadline() {
        let params = defaults();
        let call = |prompt, bound| RequestView {
            class: ServiceClass::Compound,
            job: Some(JobTerms { value: 5000.0, stage_t_gen: 3.0, job_deadline_s: 12.0 }),
            ..ds(prompt, 0, bound, 4.0)
        };
        let (a, b) = (analyze(&call(100, 100), 0.0, RATES, &params), analyze(&call(900, 200), 0.0, RATES, &params));
        assert_eq!(a.priority, b.priority, "one P per stage");
        assert!((a.priority - 5000.0 / 3.001).abs() < 1e-9);
        assert_eq!(a.value, 5000.0);
        // Each call's bandwidth is its own t_gen over the stage's time left.
        assert!((a.bandwidth - a.t_gen / 4.0).abs() < 1e-12 && b.bandwidth > a.bandwidth);
        assert!(b.quota > a.quota);
        // Past its sub-deadline pace (bw > 1) a call is still worth serving while the
        // job's deadline can be met; past d_R it is not.
        let behind = analyze(&call(900, 600), 0.0, RATES, &params);
        assert!(behind.bandwidth > 1.0 && behind.feasible && behind.priority > 0.0);
        let hopeless = analyze(&call(900, 600), 11.0, RATES, &params);
        assert!(!hopeless.feasible);
    }

    #[test]
    fn infeasible_requests_keep_only_their_aging() {
        let params = defaults();
        let late = ds(100, 0, 500, 1.0); // needs 5 s, has 1 s
        let a = analyze(&late, 0.0, RATES, &params);
        assert!(!a.feasible && a.bandwidth > 1.0);
        assert_eq!(a.priority, 0.0);
        let aged = analyze(&RequestView { frames_unserved: 3, ..late }, 0.0, RATES, &params);
        assert!((aged.priority - 30.0 / (a.t_gen + 0.001)).abs() < 1e-9);
    }

    #[test]
    fn ls_quota_follows_the_token_timeline() {
        let params = defaults();
        let ls = RequestView { class: ServiceClass::Latency, deadline_s: 2.0, ..ds(100, 0, 100, 2.0) };
        // Far ahead of the first token's due time: nothing needed this frame.
        assert_eq!(analyze(&ls, 0.0, RATES, &params).quota, 0);
        // At the due time with nothing generated: ≈ the tokens due over 1.5 frames.
        let q = analyze(&ls, 2.0, RATES, &params).quota;
        assert_eq!(q, tokens_due(2.0, 0.1, 100, 2.0 + 1.5 * 0.5));
        // A request with enough lead needs nothing.
        let ahead = RequestView { generated: 40, ..ls };
        assert_eq!(analyze(&ahead, 2.0, RATES, &params).quota, 0);
    }

    #[test]
    fn refinement_with_oracle_bounds_makes_bandwidth_non_increasing() {
        // Property 10 (second half): a DS request served at least its quota each frame,
        // constant v_w, exact bound: bw never increases from frame to frame.
        let params = defaults();
        let (mut now, mut g) = (0.0, 0u32);
        let total = 400;
        let mut last = f64::INFINITY;
        while g < total {
            let a = analyze(&ds(100, g, total, 12.0), now, RATES, &params);
            assert!(a.bandwidth <= last + 1e-12, "bw rose from {last} to {}", a.bandwidth);
            last = a.bandwidth;
            g += RATES.frame_steps.max(a.quota);
            now += RATES.frame_s();
        }
    }
}
