//! Exponentially weighted moving averages.
//!
//! * [`Ewma`] decays by a fixed factor per sample, for series sampled at a
//!   steady cadence (one value per batch, per tick).
//! * [`TimeEwma`] decays by elapsed time, for irregularly spaced samples (one
//!   value per completed request): a sample `dt` after the previous one gets
//!   weight `1 - exp(-dt / tau)`.
//!
//! Both start at the first sample rather than at zero, so they carry no
//! start-up bias.

/// Moving average that gives each new sample weight `alpha` and the previous
/// average weight `1 - alpha`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    /// Creates an average with smoothing factor `alpha` (1 keeps only the
    /// latest sample; values near 0 smooth heavily).
    ///
    /// # Panics
    /// Unless `0 < alpha <= 1`.
    pub fn new(alpha: f64) -> Self {
        assert!(alpha > 0.0 && alpha <= 1.0, "EWMA alpha must satisfy 0 < alpha <= 1, got {alpha}");
        Self { alpha, value: None }
    }

    /// Creates an average in which a sample's weight halves every
    /// `samples` later samples: `alpha = 1 - 2^(-1 / samples)`.
    ///
    /// # Panics
    /// Unless `samples` is positive and finite.
    pub fn with_half_life(samples: f64) -> Self {
        assert!(samples > 0.0 && samples.is_finite(), "EWMA half-life must be positive and finite, got {samples}");
        // 1 - exp(-ln 2 / h), computed without cancellation for large h.
        Self::new(-(-std::f64::consts::LN_2 / samples).exp_m1())
    }

    /// The smoothing factor.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Folds in a sample and returns the new average. The first sample
    /// becomes the average as is.
    pub fn update(&mut self, x: f64) -> f64 {
        let next = match self.value {
            Some(current) => current + self.alpha * (x - current),
            None => x,
        };
        self.value = Some(next);
        next
    }

    /// The current average, or `None` before the first sample.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// Forgets all samples, keeping `alpha`.
    pub fn reset(&mut self) {
        self.value = None;
    }
}

/// Moving average over irregularly timed samples: a sample arriving `dt`
/// nanoseconds after the previous one gets weight `1 - exp(-dt / tau)`, so the
/// influence of old samples decays with time constant `tau` regardless of how
/// many samples arrive.
///
/// A sample with the same timestamp as (or earlier than) the previous one gets
/// weight zero; only the passage of time lets new samples in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeEwma {
    tau_ns: u64,
    value: Option<f64>,
    last_ns: u64,
}

impl TimeEwma {
    /// Creates an average with time constant `tau_ns` nanoseconds.
    ///
    /// # Panics
    /// If `tau_ns` is zero.
    pub fn new(tau_ns: u64) -> Self {
        assert!(tau_ns > 0, "TimeEwma time constant must be positive, got 0 ns");
        Self { tau_ns, value: None, last_ns: 0 }
    }

    /// The time constant in nanoseconds.
    pub fn tau_ns(&self) -> u64 {
        self.tau_ns
    }

    /// Folds in a sample taken at `t_ns` and returns the new average. The
    /// first sample becomes the average as is.
    pub fn update(&mut self, t_ns: u64, x: f64) -> f64 {
        let next = match self.value {
            Some(current) => {
                let dt = t_ns.saturating_sub(self.last_ns) as f64;
                let alpha = -(-dt / self.tau_ns as f64).exp_m1();
                current + alpha * (x - current)
            }
            None => x,
        };
        self.value = Some(next);
        self.last_ns = self.last_ns.max(t_ns);
        next
    }

    /// The current average, or `None` before the first sample.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// Forgets all samples, keeping `tau`.
    pub fn reset(&mut self) {
        self.value = None;
        self.last_ns = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::helpers::test_rng::XorShift;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn ewma_matches_explicit_weighted_sum() {
        let mut rng = XorShift(0xDEAD_BEEF);
        for alpha in [0.05, 0.3, 0.9, 1.0] {
            let mut ewma = Ewma::new(alpha);
            assert_eq!(ewma.value(), None);
            let mut samples = Vec::new();
            for _ in 0..200 {
                let x = rng.unit() * 100.0 - 50.0;
                samples.push(x);
                let got = ewma.update(x);
                // Closed form: the first sample carries weight (1-a)^(n-1),
                // sample i >= 1 carries a (1-a)^(n-1-i).
                let n = samples.len();
                let expected: f64 = samples
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| {
                        let weight = if i == 0 { 1.0 } else { alpha };
                        weight * (1.0 - alpha).powi((n - 1 - i) as i32) * s
                    })
                    .sum();
                assert!(close(got, expected), "alpha {alpha}: {got} vs {expected}");
                assert_eq!(ewma.value(), Some(got));
            }
        }
    }

    #[test]
    fn ewma_basics() {
        let mut ewma = Ewma::new(0.5);
        assert_eq!(ewma.update(10.0), 10.0);
        assert_eq!(ewma.update(20.0), 15.0);
        assert_eq!(ewma.update(20.0), 17.5);
        assert_eq!(ewma.alpha(), 0.5);
        ewma.reset();
        assert_eq!(ewma.value(), None);
        assert_eq!(ewma.update(4.0), 4.0);
        let mut latest = Ewma::new(1.0);
        latest.update(1.0);
        assert_eq!(latest.update(9.0), 9.0);
    }

    #[test]
    fn half_life_halves_weight() {
        for half_life in [1.0, 2.0, 10.0, 123.4] {
            let ewma = Ewma::with_half_life(half_life);
            let retained = (1.0 - ewma.alpha()).powf(half_life);
            assert!(close(retained, 0.5), "half-life {half_life}: {retained}");
        }
        // A step input covers half the distance after `half_life` samples.
        let mut ewma = Ewma::with_half_life(4.0);
        ewma.update(0.0);
        let after = (0..4).map(|_| ewma.update(1.0)).last().unwrap();
        assert!(close(after, 0.5));
        assert!(Ewma::with_half_life(1e300).alpha() > 0.0);
    }

    #[test]
    #[should_panic(expected = "EWMA alpha must satisfy 0 < alpha <= 1")]
    fn zero_alpha_panics() {
        let _ = Ewma::new(0.0);
    }

    #[test]
    #[should_panic(expected = "EWMA alpha must satisfy 0 < alpha <= 1")]
    fn large_alpha_panics() {
        let _ = Ewma::new(1.5);
    }

    #[test]
    #[should_panic(expected = "EWMA alpha must satisfy 0 < alpha <= 1")]
    fn nan_alpha_panics() {
        let _ = Ewma::new(f64::NAN);
    }

    #[test]
    #[should_panic(expected = "EWMA half-life must be positive")]
    fn negative_half_life_panics() {
        let _ = Ewma::with_half_life(-1.0);
    }

    #[test]
    fn time_ewma_matches_explicit_recursion() {
        let mut rng = XorShift(77);
        let tau = 1_000_000u64;
        let mut ewma = TimeEwma::new(tau);
        let mut t = 5u64;
        let mut expected: Option<f64> = None;
        let mut last = 0u64;
        for _ in 0..500 {
            t += rng.next() % 3_000_000;
            let x = rng.unit() * 10.0;
            expected = Some(match expected {
                None => x,
                Some(e) => {
                    let w = 1.0 - (-((t - last) as f64) / tau as f64).exp();
                    w * x + (1.0 - w) * e
                }
            });
            last = t;
            let got = ewma.update(t, x);
            assert!(close(got, expected.unwrap()), "{got} vs {expected:?}");
        }
        assert_eq!(ewma.tau_ns(), tau);
    }

    #[test]
    fn time_ewma_decays_with_elapsed_time() {
        let tau = 1_000;
        let mut ewma = TimeEwma::new(tau);
        assert_eq!(ewma.value(), None);
        assert_eq!(ewma.update(100, 0.0), 0.0);
        // Same timestamp: no time has passed, the sample has no weight.
        assert_eq!(ewma.update(100, 50.0), 0.0);
        // After exactly tau, the new sample has weight 1 - 1/e.
        let got = ewma.update(1_100, 1.0);
        assert!(close(got, 1.0 - (-1.0f64).exp()));
        // After a long gap the new sample dominates.
        let got = ewma.update(1_000_000, 5.0);
        assert!(close(got, 5.0));
        // Time going backwards does not count as elapsed time.
        assert_eq!(ewma.update(10, -100.0), got);
        // ... nor does it rewind the clock: the next sample is tau later.
        let expected = got + (1.0 - (-1.0f64).exp()) * (6.0 - got);
        assert!(close(ewma.update(1_001_000, 6.0), expected));
        ewma.reset();
        assert_eq!(ewma.value(), None);
        assert_eq!(ewma.update(3, 7.0), 7.0);
    }

    #[test]
    fn time_ewma_is_invariant_to_sampling_rate() {
        // A step from 0 to 1 seen through dense and sparse samples covers the
        // same distance after the same elapsed time.
        let tau = 1_000_000;
        let mut dense = TimeEwma::new(tau);
        let mut sparse = TimeEwma::new(tau);
        dense.update(0, 0.0);
        sparse.update(0, 0.0);
        for i in 1..=100 {
            dense.update(i * 20_000, 1.0);
        }
        let sparse_value = sparse.update(2_000_000, 1.0);
        let dense_value = dense.value().unwrap();
        assert!(close(dense_value, sparse_value), "{dense_value} vs {sparse_value}");
        assert!(close(sparse_value, 1.0 - (-2.0f64).exp()));
    }

    #[test]
    #[should_panic(expected = "TimeEwma time constant must be positive")]
    fn zero_tau_panics() {
        let _ = TimeEwma::new(0);
    }
}
