//! CALM's parameters (spec §3.1), each with the thesis's default or the spec's choice.

use yardmaster_sdk::{Ctx, EvictMode};

/// How the frame's capacity is charged (spec §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Only requests with a positive quota compete for the B slots of a frame;
    /// requests that need nothing this frame join only as fillers. (The host runs
    /// every dispatched sequence for the whole frame, so each member costs one slot.)
    Paced,
    /// Literal Algorithm 4.1: every request competes; bp is the B-th highest P.
    Slots,
}

/// What the value term G counts (spec §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Token goodput.
    Token,
    /// Request goodput: G = 1 per request that can still meet its SLO.
    Request,
}

/// Where the output-length upper bound comes from (spec §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predictor {
    /// The in-policy conditional quantile estimator.
    Quantile,
    /// The client's hint (`expected-tokens`) as the exact length: Concord*.
    Oracle,
    /// The mean observed length, never refined (the "w/o analyzer" ablation).
    Mean,
    /// `g + max(1, ⌈m·(L_out − g)⌉)` with m ~ LogNormal(ln 1.5, 0.35) per request.
    NoisyUpperBound,
}

/// When a request that was never admitted is shed (spec §3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Once it can no longer meet its SLO even if it started now: a deadline request
    /// whose deadline is closer than its prefill and one decode step, a
    /// latency-sensitive request whose first token can no longer be on time.
    Slo,
    /// The thesis's rule: once it waited `waiting_time` (5 s), whatever its SLO.
    Fixed,
}

/// Eviction mode choice (spec §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictChoice {
    /// The cheaper of swap and recompute.
    Auto,
    /// Always this mode.
    Fixed(EvictMode),
}

/// Every CALM parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Δ: decode steps per frame until the host reports its own (`frame_steps`, 50).
    pub frame_steps: u32,
    /// p: the candidate cutoff (`p`, 0.95).
    pub p: f64,
    /// Tune p online, ε-greedy over {0.80, …, 1.00} (`p_tune`, true).
    pub p_tune: bool,
    /// Frames per tuning epoch (`tune_epoch_frames`, 100).
    pub tune_epoch_frames: u32,
    /// Exploration probability of the tuner (`tune_epsilon`, 0.1).
    pub tune_epsilon: f64,
    /// q_ub: quantile of the length upper bound (`q_ub`, 0.90).
    pub q_ub: f64,
    /// Re-predict L̂ every this many generated tokens (`refine_every`, 50).
    pub refine_every: u32,
    /// δ_age: goodput tokens added per unserved frame (`delta_age`, 10).
    pub delta_age: f64,
    /// δ_pre: preemption goodput-ratio threshold (`delta_pre`, 0.10).
    pub delta_pre: f64,
    /// Drop a request never admitted this long after arrival (`waiting_time_ms`, 5000),
    /// under the `fixed` admission timeout.
    pub waiting_time_ns: u64,
    /// When a never-admitted request is shed (`admission_timeout`, `slo` | `fixed`;
    /// `fixed` is the thesis's `waiting_time` rule).
    pub timeout: Timeout,
    /// The share of each frame's B slots and of the worker's KV cache kept for
    /// latency-sensitive requests that can still earn (`ls_share`, 0.5): they are
    /// planned first, those already streaming before new ones, up to this share,
    /// run every frame until they finish, and their KV is not evicted for other
    /// classes. Beyond it, LS requests compete by priority as in the thesis, where
    /// LS priority is far below DS priority: 1 − `ls_share` is the share of the
    /// capacity LS requests may lose to other classes under overload. 0 is the
    /// thesis's rule.
    ///
    /// `paper=true` sets `admission_timeout=fixed` and `ls_share=0` unless they are given.
    pub ls_share: f64,
    /// ε: division guard in seconds (`epsilon_ms`, 1).
    pub epsilon_s: f64,
    /// κ: look-ahead margin of LS quotas, in frames (`kappa`, 0.5).
    pub kappa: f64,
    /// α_v: EWMA weight of measured step times (`alpha_v`, 0.2).
    pub alpha_v: f64,
    /// Packing mode (`packing`, `paced` | `slots`).
    pub packing: Packing,
    /// Drop DS/CP requests whose deadline passed (`drop_expired`, true).
    pub drop_expired: bool,
    /// LS time between tokens (`tbt_ms`, 100).
    pub tbt_ns: u64,
    /// Deadline of best-effort requests after arrival (`be_deadline_ms`, 60000).
    pub be_deadline_ns: u64,
    /// ω_i, ω_o: value of an input and of an output token (`omega_in`, `omega_out`, 1).
    pub omega_in: f64,
    /// See `omega_in`.
    pub omega_out: f64,
    /// Objective (`objective`, `token` | `request`).
    pub objective: Objective,
    /// Length predictor (`predictor`, `quantile` | `oracle` | `mean` | `noisy-ub`).
    pub predictor: Predictor,
    /// Lengths kept per estimator pool (`length_window`, 2000).
    pub length_window: usize,
    /// The length bound before any request finished (`length_prior`, 512).
    pub length_prior: u32,
    /// Prefill time per prompt token, c_pf, in ns (`prefill_us_per_token`, 20).
    pub prefill_ns_per_token: f64,
    /// Swap time per KV byte in ns (`swap_ns_per_byte`, 0.05; 16 GB/s ≈ 0.06).
    pub swap_ns_per_byte: f64,
    /// KV bytes per token until a frame report measures it (`kv_bytes_per_token`, 819200).
    pub kv_bytes_per_token: f64,
    /// Eviction mode (`evict_mode`, `auto` | `swap` | `recompute`).
    pub evict: EvictChoice,
    /// Pattern graphs kept per application (`pattern_capacity`, 500).
    pub pattern_capacity: usize,
    /// Power-of-K: replicas sampled per request (`power_k`, 0 = every replica, K = M).
    pub power_k: u32,
    /// The waiting requests a frame plan considers, in batches of B (`plan_window`, 8):
    /// its residents, the LS share's next streams and the best-ranked `plan_window` × B
    /// of the others (see [`crate::window`]); 0 plans over every candidate.
    pub plan_window: usize,
    /// The waiting pool of a stage, in batches of B per replica (`queue_cap`, 8): past
    /// it, the never-dispatched deadline requests ranked lowest are dropped
    /// (`overload`) at the next plan, rather than held until their SLO passes (see
    /// [`crate::window::shed`]); 0 holds every request.
    pub queue_cap: usize,
}

impl Params {
    /// Read every parameter from `ctx` (defaults where absent).
    pub fn from_ctx(ctx: &Ctx) -> Result<Self, String> {
        let ms = |key: &str, default: f64| -> Result<u64, String> {
            let value: f64 = ctx.param_or(key, default)?;
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("parameter `{key}` must be a non-negative number of ms"));
            }
            Ok((value * 1e6) as u64)
        };
        let packing = match ctx.param_or("packing", "paced".to_string())?.as_str() {
            "paced" | "rect" => Packing::Paced,
            "slots" => Packing::Slots,
            other => return Err(format!("parameter `packing`: unknown mode {other:?} (paced, slots)")),
        };
        let objective = match ctx.param_or("objective", "token".to_string())?.as_str() {
            "token" => Objective::Token,
            "request" => Objective::Request,
            other => return Err(format!("parameter `objective`: unknown {other:?} (token, request)")),
        };
        let predictor = match ctx.param_or("predictor", "quantile".to_string())?.as_str() {
            "quantile" => Predictor::Quantile,
            "oracle" => Predictor::Oracle,
            "mean" => Predictor::Mean,
            "noisy-ub" => Predictor::NoisyUpperBound,
            other => return Err(format!("parameter `predictor`: unknown {other:?} (quantile, oracle, mean, noisy-ub)")),
        };
        let evict = match ctx.param_or("evict_mode", "auto".to_string())?.as_str() {
            "auto" => EvictChoice::Auto,
            "swap" => EvictChoice::Fixed(EvictMode::Swap),
            "recompute" => EvictChoice::Fixed(EvictMode::Recompute),
            other => return Err(format!("parameter `evict_mode`: unknown {other:?} (auto, swap, recompute)")),
        };
        // `paper=true`: the thesis's rules where the defaults depart from them.
        let paper: bool = ctx.param_or("paper", false)?;
        let timeout = match ctx.param_or("admission_timeout", if paper { "fixed" } else { "slo" }.to_string())?.as_str() {
            "slo" => Timeout::Slo,
            "fixed" => Timeout::Fixed,
            other => return Err(format!("parameter `admission_timeout`: unknown {other:?} (slo, fixed)")),
        };
        let params = Self {
            frame_steps: ctx.param_or("frame_steps", 50u32)?.max(1),
            p: ctx.param_or("p", 0.95)?,
            p_tune: ctx.param_or("p_tune", true)?,
            tune_epoch_frames: ctx.param_or("tune_epoch_frames", 100u32)?.max(1),
            tune_epsilon: ctx.param_or("tune_epsilon", 0.1)?,
            q_ub: ctx.param_or("q_ub", 0.90)?,
            refine_every: ctx.param_or("refine_every", 50u32)?.max(1),
            delta_age: ctx.param_or("delta_age", 10.0)?,
            delta_pre: ctx.param_or("delta_pre", 0.10)?,
            waiting_time_ns: ms("waiting_time_ms", 5000.0)?,
            timeout,
            ls_share: ctx.param_or("ls_share", if paper { 0.0 } else { 0.5 })?,
            epsilon_s: ctx.param_or::<f64>("epsilon_ms", 1.0)? / 1e3,
            kappa: ctx.param_or("kappa", 0.5)?,
            alpha_v: ctx.param_or("alpha_v", 0.2)?,
            packing,
            drop_expired: ctx.param_or("drop_expired", true)?,
            tbt_ns: ms("tbt_ms", 100.0)?,
            be_deadline_ns: ms("be_deadline_ms", 60_000.0)?,
            omega_in: ctx.param_or("omega_in", 1.0)?,
            omega_out: ctx.param_or("omega_out", 1.0)?,
            objective,
            predictor,
            length_window: ctx.param_or("length_window", 2000usize)?.max(1),
            length_prior: ctx.param_or("length_prior", 512u32)?.max(1),
            prefill_ns_per_token: ctx.param_or::<f64>("prefill_us_per_token", 20.0)? * 1e3,
            swap_ns_per_byte: ctx.param_or("swap_ns_per_byte", 0.05)?,
            kv_bytes_per_token: ctx.param_or("kv_bytes_per_token", 819_200.0)?,
            evict,
            pattern_capacity: ctx.param_or("pattern_capacity", 500usize)?.max(1),
            power_k: ctx.param_or("power_k", 0u32)?,
            plan_window: ctx.param_or("plan_window", crate::window::WINDOW)?,
            queue_cap: ctx.param_or("queue_cap", crate::window::WINDOW)?,
        };
        if !(params.p > 0.0 && params.p <= 1.0) {
            return Err(format!("parameter `p` must be in (0, 1], got {}", params.p));
        }
        if !(params.q_ub > 0.0 && params.q_ub <= 1.0) {
            return Err(format!("parameter `q_ub` must be in (0, 1], got {}", params.q_ub));
        }
        if !(0.0..=1.0).contains(&params.ls_share) {
            return Err(format!("parameter `ls_share` must be in [0, 1], got {}", params.ls_share));
        }
        if !(params.alpha_v > 0.0 && params.alpha_v <= 1.0) {
            return Err(format!("parameter `alpha_v` must be in (0, 1], got {}", params.alpha_v));
        }
        Ok(params)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The defaults (a configuration without parameters).
    pub fn defaults() -> Params {
        Params::from_ctx(&crate::testing::ctx(&[])).expect("defaults parse")
    }

    #[test]
    fn defaults_are_the_papers_but_for_the_ls_share_and_the_timeout() {
        let p = defaults();
        assert_eq!((p.frame_steps, p.p, p.q_ub, p.refine_every), (50, 0.95, 0.90, 50));
        assert_eq!((p.delta_pre, p.waiting_time_ns, p.tbt_ns), (0.10, 5_000_000_000, 100_000_000));
        assert_eq!((p.packing, p.predictor, p.objective), (Packing::Paced, Predictor::Quantile, Objective::Token));
    }

    #[test]
    fn one_switch_restores_the_papers_rules() {
        let paper = Params::from_ctx(&crate::testing::ctx(&[("paper", "true")])).expect("parses");
        assert_eq!((paper.timeout, paper.ls_share), (Timeout::Fixed, 0.0));
        assert_eq!((defaults().timeout, defaults().ls_share), (Timeout::Slo, 0.5));
        let mixed = Params::from_ctx(&crate::testing::ctx(&[("paper", "true"), ("ls_share", "0.25")])).expect("parses");
        assert_eq!((mixed.timeout, mixed.ls_share), (Timeout::Fixed, 0.25));
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        for (key, value) in [
            ("p", "0"),
            ("p", "1.5"),
            ("ls_share", "1.5"),
            ("admission_timeout", "never"),
            ("packing", "square"),
            ("predictor", "psychic"),
            ("waiting_time_ms", "-1"),
        ] {
            let err = Params::from_ctx(&crate::testing::ctx(&[(key, value)])).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }
}
