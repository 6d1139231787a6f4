//! The simulator's only source of randomness: a small, seedable, portable generator.
//!
//! [`SimRng`] is xoshiro256++ (Blackman & Vigna) whose 256-bit state is filled from a
//! single `u64` seed by SplitMix64, as its authors recommend. It never touches the OS
//! or the clock, so a run is a pure function of its seed on every platform. On top of
//! the raw 64-bit output it offers the few distributions the simulator needs, and
//! [`SimRng::fork`] derives independent child streams so that each consumer (workload,
//! executor noise, fan-out, ...) owns its own generator and adding a consumer does not
//! change what the others draw.

/// The golden-ratio increment of SplitMix64 (a non-zero fallback state).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One step of SplitMix64 (the SDK's, shared with the policies' random source):
/// advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    let (next, output) = yardmaster_sdk::splitmix64(*state);
    *state = next;
    output
}

/// A log-normal distribution given by its mean and coefficient of variation, its
/// parameters worked out once (see [`SimRng::lognormal`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    /// The distribution of mean `mean` and coefficient of variation `cv`
    /// (`sigma² = ln(1 + cv²)`, `mu = ln(mean) − sigma² / 2`); `None` when `cv ≤ 0`
    /// (no spread: the value is the mean).
    pub fn with_mean_cv(mean: f64, cv: f64) -> Option<Self> {
        if cv <= 0.0 {
            return None;
        }
        let sigma2 = cv.mul_add(cv, 1.0).ln();
        Some(Self { mu: mean.ln() - sigma2 / 2.0, sigma: sigma2.sqrt() })
    }
}

/// A deterministic pseudo-random generator (xoshiro256++ seeded through SplitMix64).
///
/// Not cryptographically secure; meant for simulation only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRng {
    s: [u64; 4],
}

impl SimRng {
    /// A generator whose whole output is determined by `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        Self::from_state([splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm)])
    }

    /// A generator with this exact state (SplitMix64 output is never all zero in
    /// practice; an all-zero state would be a fixed point, so it is nudged).
    fn from_state(s: [u64; 4]) -> Self {
        if s == [0; 4] {
            Self { s: [GOLDEN_GAMMA, 0, 0, 0] }
        } else {
            Self { s }
        }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform `f64` in `[0, 1)`, with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform `f64` in `[lo, hi)` (returns `lo` when `hi == lo`).
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        debug_assert!(hi >= lo, "uniform_range: hi ({hi}) < lo ({lo})");
        lo + (hi - lo) * self.uniform()
    }

    /// A uniform `f64` in `(0, 1]`: safe to take the logarithm of.
    fn uniform_open_zero(&mut self) -> f64 {
        1.0 - self.uniform()
    }

    /// An exponentially distributed value with the given mean (0 when `mean` is 0).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.uniform_open_zero().ln()
    }

    /// A normally distributed value (Box–Muller; uses two uniforms per call).
    pub fn normal(&mut self, mean: f64, std: f64) -> f64 {
        let radius = (-2.0 * self.uniform_open_zero().ln()).sqrt();
        let angle = std::f64::consts::TAU * self.uniform();
        mean + std * radius * angle.cos()
    }

    /// A log-normally distributed value with the given mean and coefficient of
    /// variation (standard deviation / mean). `cv == 0` returns `mean` exactly.
    ///
    /// Uses `sigma² = ln(1 + cv²)` and `mu = ln(mean) − sigma² / 2`.
    pub fn lognormal_with_mean_cv(&mut self, mean: f64, cv: f64) -> f64 {
        match LogNormal::with_mean_cv(mean, cv) {
            Some(distribution) => self.lognormal(distribution),
            None => mean,
        }
    }

    /// A value drawn from `distribution` (for a caller drawing many from one: its
    /// parameters are worked out once, and the draws are those of
    /// [`SimRng::lognormal_with_mean_cv`]).
    pub fn lognormal(&mut self, distribution: LogNormal) -> f64 {
        self.normal(distribution.mu, distribution.sigma).exp()
    }

    /// A gamma-distributed value with the given shape (`k > 0`) and scale
    /// (mean `k·scale`, coefficient of variation `1/√k`); Marsaglia & Tsang's method.
    ///
    /// # Panics
    /// If `shape` is not positive.
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        assert!(shape > 0.0, "gamma: shape must be positive, got {shape}");
        if shape < 1.0 {
            // Boost: Gamma(k) = Gamma(k + 1) · U^(1/k).
            let boost = self.uniform_open_zero().powf(1.0 / shape);
            return self.gamma(shape + 1.0, scale) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal(0.0, 1.0);
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform_open_zero();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }

    /// A uniform integer in `[0, n)` without modulo bias (Lemire's method).
    ///
    /// # Panics
    /// If `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below: n must be positive");
        let threshold = n.wrapping_neg() % n;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(n);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }

    /// An independent child generator for consumer number `stream`.
    ///
    /// The child is a function of this generator's current state and `stream` only:
    /// forking does not advance `self`, so adding a fork (or a consumer of one) shifts
    /// neither the parent's output nor any other fork. Forking the same state with the
    /// same `stream` twice yields the same child; distinct streams yield unrelated
    /// children (their seeds are hashed through SplitMix64). Takes `&mut self` so that
    /// a generator is forked from where its owner holds it exclusively.
    pub fn fork(&mut self, stream: u64) -> SimRng {
        let mut state_hash = self.s[0] ^ self.s[1].rotate_left(16) ^ self.s[2].rotate_left(32) ^ self.s[3].rotate_left(48);
        let mut stream_key = stream;
        let seed = splitmix64(&mut state_hash) ^ splitmix64(&mut stream_key).rotate_left(1);
        SimRng::new(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_and_std(samples: &[f64]) -> (f64, f64) {
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt())
    }

    fn draw(n: usize, seed: u64, mut f: impl FnMut(&mut SimRng) -> f64) -> Vec<f64> {
        let mut rng = SimRng::new(seed);
        (0..n).map(|_| f(&mut rng)).collect()
    }

    #[test]
    fn splitmix64_matches_reference_vector() {
        let mut state = 0;
        let out: Vec<u64> = (0..3).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(out, [0xE220_A839_7B1D_CDAF, 0x6E78_9E6A_A1B9_65F4, 0x06C4_5D18_8009_454F]);
    }

    #[test]
    fn xoshiro256plusplus_matches_reference_vector() {
        // Reference output for state [1, 2, 3, 4] (as in rand_xoshiro's tests).
        let mut rng = SimRng::from_state([1, 2, 3, 4]);
        let expected: [u64; 10] = [
            41943041,
            58720359,
            3588806011781223,
            3591011842654386,
            9228616714210784205,
            9973669472204895162,
            14011001112246962877,
            12406186145184390807,
            15849039046786891736,
            10450023813501588000,
        ];
        let out: Vec<u64> = (0..10).map(|_| rng.next_u64()).collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn same_seed_same_sequence_different_seed_different() {
        let a: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = SimRng::new(8);
            (0..100).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().zip(&c).all(|(x, y)| x != y));
    }

    #[test]
    fn zero_seed_and_zero_state_are_usable() {
        for mut rng in [SimRng::new(0), SimRng::from_state([0; 4])] {
            let mut out: Vec<u64> = (0..32).map(|_| rng.next_u64()).collect();
            out.sort_unstable();
            out.dedup();
            assert!(out.len() >= 30, "{out:?}");
        }
    }

    #[test]
    fn uniform_is_in_unit_interval_with_right_moments() {
        let xs = draw(100_000, 1, SimRng::uniform);
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let (mean, std) = mean_and_std(&xs);
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert!((std - (1.0f64 / 12.0).sqrt()).abs() < 0.005, "std {std}");
    }

    #[test]
    fn uniform_range_stays_in_range() {
        let xs = draw(10_000, 2, |r| r.uniform_range(-3.0, 5.0));
        assert!(xs.iter().all(|&x| (-3.0..5.0).contains(&x)));
        let (mean, _) = mean_and_std(&xs);
        assert!((mean - 1.0).abs() < 0.1, "mean {mean}");
        assert_eq!(SimRng::new(2).uniform_range(4.0, 4.0), 4.0);
    }

    #[test]
    fn exponential_has_mean_and_cv_one() {
        let xs = draw(200_000, 3, |r| r.exponential(2.5));
        assert!(xs.iter().all(|&x| x >= 0.0 && x.is_finite()));
        let (mean, std) = mean_and_std(&xs);
        assert!((mean / 2.5 - 1.0).abs() < 0.01, "mean {mean}");
        assert!((std / mean - 1.0).abs() < 0.02, "cv {}", std / mean);
    }

    #[test]
    fn normal_has_requested_moments() {
        let xs = draw(200_000, 4, |r| r.normal(10.0, 3.0));
        let (mean, std) = mean_and_std(&xs);
        assert!((mean - 10.0).abs() < 0.03, "mean {mean}");
        assert!((std - 3.0).abs() < 0.03, "std {std}");
        let within_one = xs.iter().filter(|&&x| (x - 10.0).abs() < 3.0).count() as f64 / xs.len() as f64;
        assert!((within_one - 0.6827).abs() < 0.01, "P(|z|<1) = {within_one}");
    }

    #[test]
    fn lognormal_has_requested_mean_and_cv() {
        for (mean, cv) in [(1.0, 0.05), (4.0, 0.5), (100.0, 1.5)] {
            let xs = draw(400_000, 5, |r| r.lognormal_with_mean_cv(mean, cv));
            assert!(xs.iter().all(|&x| x > 0.0));
            let (m, s) = mean_and_std(&xs);
            assert!((m / mean - 1.0).abs() < 0.02, "mean {m} for {mean}");
            assert!((s / m / cv - 1.0).abs() < 0.1, "cv {} for {cv}", s / m);
        }
        assert_eq!(SimRng::new(5).lognormal_with_mean_cv(3.0, 0.0), 3.0);
    }

    #[test]
    fn gamma_has_requested_mean_and_cv() {
        for shape in [0.5, 1.0, 4.0, 11.0] {
            let xs = draw(200_000, 6, |r| r.gamma(shape, 2.0));
            let (m, s) = mean_and_std(&xs);
            assert!((m / (2.0 * shape) - 1.0).abs() < 0.02, "mean {m} for shape {shape}");
            assert!((s / m * shape.sqrt() - 1.0).abs() < 0.03, "cv {} for shape {shape}", s / m);
        }
    }

    #[test]
    fn below_is_unbiased_and_in_range() {
        let mut rng = SimRng::new(9);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[rng.below(7) as usize] += 1;
        }
        // Chi-square with 6 degrees of freedom: 22.5 is the 0.999 quantile.
        let chi2: f64 = counts.iter().map(|&c| (c as f64 - 10_000.0).powi(2) / 10_000.0).sum();
        assert!(chi2 < 22.5, "chi2 {chi2}, counts {counts:?}");
        assert_eq!(rng.below(1), 0);
        let big = 1u64 << 63 | 1;
        assert!((0..1000).all(|_| rng.below(big) < big));
    }

    #[test]
    #[should_panic(expected = "n must be positive")]
    fn below_zero_panics() {
        SimRng::new(0).below(0);
    }

    #[test]
    fn fork_does_not_advance_parent_and_is_reproducible() {
        let mut parent = SimRng::new(11);
        let untouched = parent.clone();
        let mut a = parent.fork(1);
        assert_eq!(parent, untouched, "forking must not advance the parent");
        let mut again = parent.fork(1);
        assert_eq!(a, again);
        assert_eq!(a.next_u64(), again.next_u64());
    }

    #[test]
    fn forks_are_distinct_from_each_other_and_the_parent() {
        let mut parent = SimRng::new(12);
        let mut children: Vec<SimRng> = (0..16).map(|s| parent.fork(s)).collect();
        let mut firsts: Vec<u64> = children.iter_mut().map(SimRng::next_u64).collect();
        firsts.push(parent.clone().next_u64());
        firsts.sort_unstable();
        firsts.dedup();
        assert_eq!(firsts.len(), 17);
        // A child's stream is not the parent's stream shifted by a few steps.
        let parent_out: Vec<u64> = (0..64).map(|_| parent.next_u64()).collect();
        let mut child = SimRng::new(12).fork(0);
        assert!((0..64).all(|_| !parent_out.contains(&child.next_u64())));
    }

    #[test]
    fn adding_a_fork_does_not_shift_another() {
        let mut with_one = SimRng::new(13);
        let only = with_one.fork(2);
        let mut with_two = SimRng::new(13);
        let _extra = with_two.fork(1);
        assert_eq!(only, with_two.fork(2));
    }

    #[test]
    fn forks_of_different_seeds_differ() {
        assert_ne!(SimRng::new(1).fork(1), SimRng::new(2).fork(1));
    }
}
