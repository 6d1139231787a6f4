//! The length upper bound L̂ of each request (spec §4.1, A1): predicted at arrival,
//! re-predicted every `refine_every` generated tokens, always in `[g+1, …]`.

use yardmaster_sdk::helpers::{LengthEstimator, ServiceClass};
use yardmaster_sdk::splitmix64;

use crate::params::{Params, Predictor};

/// A request's current bound and when it was made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// L̂: upper bound on total output tokens.
    pub tokens: u32,
    /// g when L̂ was last predicted.
    pub at_generated: u32,
    /// The noisy-ub multiplier m (1 for the other predictors).
    pub multiplier: f64,
}

/// What the predictor knows about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthQuery {
    /// Its class.
    pub class: ServiceClass,
    /// L_in.
    pub prompt: u32,
    /// g.
    pub generated: u32,
    /// The client's hint (the true length in the simulator), 0 when none.
    pub hint: u32,
}

/// The predictor: the estimator learned from finished requests, and the mode.
#[derive(Debug, Clone)]
pub struct LengthPredictor {
    estimator: LengthEstimator,
    mode: Predictor,
    q_ub: f64,
    refine_every: u32,
}

impl LengthPredictor {
    /// A predictor per `params`.
    pub fn new(params: &Params) -> Self {
        Self {
            estimator: LengthEstimator::new(params.length_window, params.length_prior),
            mode: params.predictor,
            q_ub: params.q_ub,
            refine_every: params.refine_every,
        }
    }

    /// Learn from a finished request.
    pub fn observe(&mut self, class: ServiceClass, prompt: u32, output: u32) {
        self.estimator.observe(class.code(), prompt, output);
    }

    /// The multiplier m ~ LogNormal(ln 1.5, 0.35) of a new request, from a random word.
    pub fn draw_multiplier(&self, random: u64) -> f64 {
        if self.mode != Predictor::NoisyUpperBound {
            return 1.0;
        }
        // Box–Muller on two uniforms drawn from the word.
        let (state, a) = splitmix64(random);
        let (_, b) = splitmix64(state);
        let u1 = ((a >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (b >> 11) as f64 / (1u64 << 53) as f64;
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        (1.5f64.ln() + 0.35 * z).exp()
    }

    /// The bound for `query`, refreshing `current` when it is unset or stale.
    pub fn bound(&self, query: LengthQuery, current: Option<Bound>, multiplier: f64) -> Bound {
        let g = query.generated;
        if let Some(b) = current {
            let stale = g.saturating_sub(b.at_generated) >= self.refine_every && self.mode != Predictor::Mean;
            if !stale {
                return Bound { tokens: b.tokens.max(g + 1), ..b };
            }
        }
        let tokens = match self.mode {
            Predictor::Oracle if query.hint > 0 => query.hint,
            Predictor::NoisyUpperBound if query.hint > 0 => g + ((multiplier * query.hint.saturating_sub(g) as f64).ceil() as u32).max(1),
            Predictor::Mean => self.estimator.mean().map_or(0, |m| m.ceil() as u32).max(1),
            _ => self.estimator.upper_bound(query.class.code(), query.prompt, g, self.q_ub, 0),
        };
        Bound { tokens: tokens.max(g + 1), at_generated: g, multiplier }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::defaults;

    fn query(generated: u32, hint: u32) -> LengthQuery {
        LengthQuery { class: ServiceClass::Deadline, prompt: 100, generated, hint }
    }

    /// Property 10: L̂ ≥ g+1 always; with oracle or noisy-ub with m ≥ 1, L̂ − g never
    /// increases with g.
    #[test]
    fn refinement_monotonicity() {
        for (mode, multiplier) in [(Predictor::Oracle, 1.0), (Predictor::NoisyUpperBound, 1.0), (Predictor::NoisyUpperBound, 2.7)] {
            let predictor = LengthPredictor::new(&Params { predictor: mode, ..defaults() });
            let truth = 1000;
            let mut bound = None;
            let mut last_gap = u32::MAX;
            for g in (0..truth).step_by(7) {
                let b = predictor.bound(query(g, truth), bound, multiplier);
                assert!(b.tokens > g, "L̂ ≥ g+1");
                let gap = b.tokens - g;
                assert!(gap <= last_gap, "{mode:?} m={multiplier}: L̂−g rose from {last_gap} to {gap} at g={g}");
                last_gap = gap;
                bound = Some(b);
            }
        }
    }

    #[test]
    fn quantile_bounds_stay_above_generated_and_tighten() {
        let mut predictor = LengthPredictor::new(&defaults());
        for l in 1..=200 {
            predictor.observe(ServiceClass::Deadline, 100, l * 5);
        }
        let fresh = predictor.bound(query(0, 0), None, 1.0);
        assert_eq!(fresh.tokens, 900, "0.9-quantile of 5..=1000");
        // Not yet stale: unchanged.
        assert_eq!(predictor.bound(query(20, 0), Some(fresh), 1.0).tokens, 900);
        // After 800 tokens: the conditional quantile of lengths > 800 (805..=1000, 40 values).
        let late = predictor.bound(query(800, 0), Some(fresh), 1.0);
        assert_eq!(late.tokens, 980);
        // Past every observation: 2g.
        assert_eq!(predictor.bound(query(1200, 0), Some(late), 1.0).tokens, 2400);
    }

    #[test]
    fn noisy_multipliers_are_lognormal_around_one_and_a_half() {
        let predictor = LengthPredictor::new(&Params { predictor: Predictor::NoisyUpperBound, ..defaults() });
        let mut state = 7u64;
        let mut logs = Vec::new();
        for _ in 0..4000 {
            let (next, word) = splitmix64(state);
            state = next;
            logs.push(predictor.draw_multiplier(word).ln());
        }
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        let sd = (logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
        assert!((mean - 1.5f64.ln()).abs() < 0.03, "{mean}");
        assert!((sd - 0.35).abs() < 0.03, "{sd}");
        let conservative = logs.iter().filter(|&&x| x >= 0.0).count() as f64 / logs.len() as f64;
        assert!((0.84..0.92).contains(&conservative), "≈88% conservative, got {conservative}");
    }
}
