//! Root demand estimation: arrivals counted per tick, smoothed by an exponentially
//! weighted mean over the last `window` samples in its adjusted form
//! (`D̂ = Σ w_j d_{t−j} / Σ w_j`, `w_j = (1−α)^j`), as pandas' `ewm(com)` computes it.

use std::collections::VecDeque;

/// Windowed, adjusted EWMA of per-tick demand.
#[derive(Clone, Debug, PartialEq)]
pub struct DemandEstimator {
    alpha: f64,
    window: usize,
    samples: VecDeque<f64>,
}

impl DemandEstimator {
    /// An estimator with centre of mass `com` (`α = 1/(1+com)`) over `window` samples.
    pub fn new(com: f64, window: usize) -> Self {
        Self { alpha: 1.0 / (1.0 + com.max(0.0)), window: window.max(1), samples: VecDeque::new() }
    }

    /// Add the demand (QPS) measured over the last tick.
    pub fn push(&mut self, rate: f64) {
        if self.samples.len() == self.window {
            self.samples.pop_front();
        }
        self.samples.push_back(rate);
    }

    /// The smoothed demand (0 before any sample).
    pub fn estimate(&self) -> f64 {
        let (mut sum, mut weights, mut w) = (0.0, 0.0, 1.0);
        for &d in self.samples.iter().rev() {
            sum += w * d;
            weights += w;
            w *= 1.0 - self.alpha;
        }
        if weights > 0.0 {
            sum / weights
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_90_percent_covered_within_about_five_ticks() {
        // Spec property 13: α ≈ 0.385 covers 90 % of a step in about 5 s.
        let mut e = DemandEstimator::new(1.6, 20);
        for _ in 0..20 {
            e.push(100.0);
        }
        let mut ticks = 0;
        while e.estimate() < 190.0 {
            e.push(200.0);
            ticks += 1;
            assert!(ticks < 20);
        }
        assert!((4..=6).contains(&ticks), "{ticks} ticks");
        assert_eq!(DemandEstimator::new(1.6, 20).estimate(), 0.0);
    }
}
