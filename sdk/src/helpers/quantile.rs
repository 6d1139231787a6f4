//! Quantile estimation over streams of observations.
//!
//! * [`P2Quantile`] estimates one quantile of an unbounded stream in O(1)
//!   memory and time per observation with the P² algorithm (Jain and
//!   Chlamtac, "The P² algorithm for dynamic calculation of quantiles and
//!   histograms without storing observations", CACM 28(10), 1985).
//! * [`WindowQuantile`] answers exact quantiles over the last `N`
//!   observations.
//!
//! Exact quantiles here use the nearest-rank definition: the `q`-quantile of
//! `n` sorted values is the value at rank `max(1, ceil(q * n))`, so `q = 0`
//! gives the minimum and `q = 1` the maximum.

use super::window::CountWindow;

/// Panics with a clear message unless `q` is a probability in `[0, 1]`.
fn assert_probability(q: f64) {
    assert!((0.0..=1.0).contains(&q), "quantile must be in [0, 1], got {q}");
}

/// Exact nearest-rank `q`-quantile of `values` (by sorting a copy), or `None`
/// when there are none.
///
/// # Panics
/// If `q` is not in `[0, 1]`.
pub(crate) fn exact_quantile(values: impl IntoIterator<Item = f64>, q: f64) -> Option<f64> {
    assert_probability(q);
    let mut sorted: Vec<f64> = values.into_iter().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_unstable_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Number of markers the P² algorithm maintains.
const MARKERS: usize = 5;

/// Streaming estimate of the `p`-quantile of a stream with the P² algorithm:
/// five markers whose heights track the minimum, the `p/2`-, `p`- and
/// `(1+p)/2`-quantiles and the maximum, adjusted with piecewise-parabolic
/// interpolation as observations arrive. O(1) memory and time per
/// observation.
#[derive(Clone, Debug)]
pub struct P2Quantile {
    p: f64,
    count: u64,
    /// Marker heights. Until five observations have arrived, the first
    /// `count` entries hold the raw observations.
    heights: [f64; MARKERS],
    /// Actual marker positions (1-based ranks; whole numbers).
    positions: [f64; MARKERS],
    /// Desired marker positions.
    desired: [f64; MARKERS],
    /// Growth of the desired positions per observation.
    increments: [f64; MARKERS],
}

impl P2Quantile {
    /// Creates an estimator for the `p`-quantile.
    ///
    /// # Panics
    /// If `p` is not in `[0, 1]`.
    pub fn new(p: f64) -> Self {
        assert_probability(p);
        Self {
            p,
            count: 0,
            heights: [0.0; MARKERS],
            positions: [1.0, 2.0, 3.0, 4.0, 5.0],
            desired: [1.0, 1.0 + 2.0 * p, 1.0 + 4.0 * p, 3.0 + 2.0 * p, 5.0],
            increments: [0.0, p / 2.0, p, (1.0 + p) / 2.0, 1.0],
        }
    }

    /// The quantile being estimated.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Number of observations so far (NaNs excluded).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds an observation. NaN observations are ignored.
    pub fn observe(&mut self, x: f64) {
        if x.is_nan() {
            return;
        }
        if self.count < MARKERS as u64 {
            self.heights[self.count as usize] = x;
            self.count += 1;
            if self.count == MARKERS as u64 {
                self.heights.sort_unstable_by(f64::total_cmp);
            }
            return;
        }
        self.count += 1;

        // Find the cell holding x, extending the extreme markers if needed.
        let cell = if x < self.heights[0] {
            self.heights[0] = x;
            0
        } else if x >= self.heights[MARKERS - 1] {
            self.heights[MARKERS - 1] = x;
            MARKERS - 2
        } else {
            self.heights[1..MARKERS - 1].iter().take_while(|&&h| h <= x).count()
        };

        for position in &mut self.positions[cell + 1..] {
            *position += 1.0;
        }
        for (desired, increment) in self.desired.iter_mut().zip(self.increments) {
            *desired += increment;
        }
        for i in 1..MARKERS - 1 {
            self.adjust_marker(i);
        }
    }

    /// Moves marker `i` by one position towards its desired position if it
    /// lags by at least one and the move keeps positions distinct.
    fn adjust_marker(&mut self, i: usize) {
        let n = &self.positions;
        let offset = self.desired[i] - n[i];
        let step = if offset >= 1.0 && n[i + 1] - n[i] > 1.0 {
            1.0
        } else if offset <= -1.0 && n[i - 1] - n[i] < -1.0 {
            -1.0
        } else {
            return;
        };
        let parabolic = self.parabolic(i, step);
        self.heights[i] = if self.heights[i - 1] < parabolic && parabolic < self.heights[i + 1] { parabolic } else { self.linear(i, step) };
        self.positions[i] += step;
    }

    /// Piecewise-parabolic (P²) prediction of marker `i`'s height after moving
    /// it by `step` (±1).
    fn parabolic(&self, i: usize, step: f64) -> f64 {
        let (q, n) = (&self.heights, &self.positions);
        q[i] + step / (n[i + 1] - n[i - 1])
            * ((n[i] - n[i - 1] + step) * (q[i + 1] - q[i]) / (n[i + 1] - n[i])
                + (n[i + 1] - n[i] - step) * (q[i] - q[i - 1]) / (n[i] - n[i - 1]))
    }

    /// Linear prediction of marker `i`'s height after moving it by `step`
    /// (±1), used when the parabolic one would break the height order.
    fn linear(&self, i: usize, step: f64) -> f64 {
        let (q, n) = (&self.heights, &self.positions);
        let neighbour = if step > 0.0 { i + 1 } else { i - 1 };
        q[i] + step * (q[neighbour] - q[i]) / (n[neighbour] - n[i])
    }

    /// The current estimate, or `None` before any observation. Exact while at
    /// most five observations have arrived.
    pub fn estimate(&self) -> Option<f64> {
        match self.count {
            0 => None,
            n if n <= MARKERS as u64 => exact_quantile(self.heights[..n as usize].iter().copied(), self.p),
            // The extreme markers track the minimum and maximum exactly.
            _ if self.p == 0.0 => Some(self.heights[0]),
            _ if self.p == 1.0 => Some(self.heights[MARKERS - 1]),
            _ => Some(self.heights[2]),
        }
    }
}

/// Exact quantiles over the last `capacity` observations: a ring buffer that
/// sorts a copy on each query (O(capacity log capacity)).
#[derive(Clone, Debug)]
pub struct WindowQuantile {
    window: CountWindow,
}

impl WindowQuantile {
    /// Creates an empty window over the last `capacity` observations.
    ///
    /// # Panics
    /// If `capacity` is zero.
    pub fn new(capacity: usize) -> Self {
        Self { window: CountWindow::new(capacity) }
    }

    /// The most observations the window holds.
    pub fn capacity(&self) -> usize {
        self.window.capacity()
    }

    /// Adds an observation, evicting the oldest one when full.
    pub fn observe(&mut self, x: f64) {
        self.window.push(x);
    }

    /// Exact nearest-rank `q`-quantile of the observations held, or `None`
    /// when empty.
    ///
    /// # Panics
    /// If `q` is not in `[0, 1]`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        exact_quantile(self.window.iter(), q)
    }

    /// Number of observations held.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// `true` if no observation is held.
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::helpers::test_rng::XorShift;

    /// Reference nearest-rank quantile by counting: the smallest value `v`
    /// such that at least `q * n` of the values are `<= v`.
    fn reference_quantile(values: &[f64], q: f64) -> Option<f64> {
        let n = values.len() as f64;
        let mut candidates: Vec<f64> = values.to_vec();
        candidates.sort_by(f64::total_cmp);
        candidates.into_iter().find(|&v| values.iter().filter(|&&x| x <= v).count() as f64 >= (q * n).max(1.0))
    }

    /// Fraction of `values` that are `<= x`.
    fn rank_of(values: &[f64], x: f64) -> f64 {
        values.iter().filter(|&&v| v <= x).count() as f64 / values.len() as f64
    }

    #[test]
    fn exact_quantile_matches_counting_definition() {
        let mut rng = XorShift::new(1);
        for len in 1..60 {
            // Few distinct values, so ties are common.
            let values: Vec<f64> = (0..len).map(|_| (rng.next() % 10) as f64).collect();
            for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
                assert_eq!(exact_quantile(values.iter().copied(), q), reference_quantile(&values, q), "len {len} q {q}");
            }
        }
        assert_eq!(exact_quantile([], 0.5), None);
        assert_eq!(exact_quantile([3.0, 1.0, 2.0], 0.0), Some(1.0));
        assert_eq!(exact_quantile([3.0, 1.0, 2.0], 1.0), Some(3.0));
        assert_eq!(exact_quantile([4.0, 1.0, 3.0, 2.0], 0.5), Some(2.0));
    }

    #[test]
    #[should_panic(expected = "quantile must be in [0, 1]")]
    fn negative_quantile_panics() {
        let _ = exact_quantile([1.0], -0.1);
    }

    #[test]
    #[should_panic(expected = "quantile must be in [0, 1]")]
    fn nan_p_panics() {
        let _ = P2Quantile::new(f64::NAN);
    }

    #[test]
    fn p2_is_exact_for_the_first_five() {
        let mut rng = XorShift::new(2);
        for p in [0.0, 0.2, 0.5, 0.9, 1.0] {
            let mut estimator = P2Quantile::new(p);
            assert_eq!(estimator.estimate(), None);
            let mut seen = Vec::new();
            for _ in 0..5 {
                let x = rng.unit_nonzero();
                estimator.observe(x);
                seen.push(x);
                assert_eq!(estimator.estimate(), reference_quantile(&seen, p), "p {p}");
            }
            assert_eq!(estimator.count(), 5);
            assert_eq!(estimator.p(), p);
        }
    }

    #[test]
    fn p2_reproduces_the_worked_example_of_the_paper() {
        // Jain and Chlamtac (1985), table I: the median of these 20
        // observations, with the final marker heights.
        let observations = [
            0.02, 0.15, 0.74, 3.39, 0.83, 22.37, 10.15, 15.43, 38.62, 15.92, 34.60, 10.28, 1.47, 0.40, 0.05, 11.39, 0.27, 0.42, 0.09, 11.37,
        ];
        let mut estimator = P2Quantile::new(0.5);
        for x in observations {
            estimator.observe(x);
        }
        let expected_heights = [0.02, 0.49, 4.44, 17.20, 38.62];
        for (got, expected) in estimator.heights.iter().zip(expected_heights) {
            assert!((got - expected).abs() < 0.005, "{:?}", estimator.heights);
        }
        assert_eq!(estimator.positions, [1.0, 6.0, 10.0, 16.0, 20.0]);
        assert!((estimator.estimate().unwrap() - 4.44).abs() < 0.005);
    }

    /// Feeds 10 000 samples to estimators for each `(p, relative_tolerance)`
    /// and compares their estimates with the exact quantiles.
    fn check_p2(name: &str, mut sample: impl FnMut() -> f64, cases: &[(f64, f64)]) {
        let values: Vec<f64> = (0..10_000).map(|_| sample()).collect();
        for &(p, relative_tolerance) in cases {
            let mut estimator = P2Quantile::new(p);
            for &x in &values {
                estimator.observe(x);
            }
            assert_eq!(estimator.count(), 10_000);
            let estimate = estimator.estimate().unwrap();
            let exact = reference_quantile_fast(&values, p);
            let relative_error = (estimate - exact).abs() / exact.abs();
            assert!(
                relative_error <= relative_tolerance,
                "{name} p={p}: estimate {estimate} vs exact {exact} ({:.2}%)",
                relative_error * 100.0
            );
            // The estimate also sits at about the right rank.
            let rank = rank_of(&values, estimate);
            assert!((rank - p).abs() <= 0.01, "{name} p={p}: rank {rank}");
        }
    }

    /// Exact quantile for large inputs (the counting reference is quadratic).
    fn reference_quantile_fast(values: &[f64], q: f64) -> f64 {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted[rank - 1]
    }

    #[test]
    fn p2_tracks_uniform_quantiles() {
        let mut rng = XorShift::new(3);
        let cases = [(0.25, 0.03), (0.5, 0.03), (0.75, 0.03), (0.9, 0.03), (0.99, 0.03)];
        check_p2("uniform", || rng.unit_nonzero(), &cases);
    }

    #[test]
    fn p2_tracks_exponential_quantiles() {
        let mut rng = XorShift::new(4);
        // Far in a long tail few samples land near the marker, so the error in
        // value is larger there (up to about 6% over many seeds) while the
        // error in rank stays small.
        let cases = [(0.5, 0.03), (0.9, 0.03), (0.95, 0.03), (0.99, 0.08)];
        check_p2("exponential", || rng.exponential(), &cases);
    }

    #[test]
    fn p2_tracks_shifted_normal_and_lognormal_quantiles() {
        let mut rng = XorShift::new(5);
        let cases = [(0.1, 0.03), (0.5, 0.03), (0.9, 0.03), (0.99, 0.03)];
        check_p2("normal(10, 1)", || 10.0 + rng.normal(), &cases);
        let mut rng = XorShift::new(6);
        check_p2("lognormal", || rng.normal().exp(), &[(0.5, 0.03), (0.9, 0.05), (0.95, 0.05)]);
    }

    #[test]
    fn p2_extremes_are_exact() {
        let mut rng = XorShift::new(7);
        let values: Vec<f64> = (0..1_000).map(|_| rng.normal()).collect();
        let mut low = P2Quantile::new(0.0);
        let mut high = P2Quantile::new(1.0);
        for &x in &values {
            low.observe(x);
            high.observe(x);
        }
        assert_eq!(low.estimate(), values.iter().copied().reduce(f64::min));
        assert_eq!(high.estimate(), values.iter().copied().reduce(f64::max));
    }

    #[test]
    fn p2_handles_constant_and_sorted_streams() {
        let mut constant = P2Quantile::new(0.9);
        for _ in 0..1_000 {
            constant.observe(7.0);
        }
        assert_eq!(constant.estimate(), Some(7.0));

        let values: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let mut ascending = P2Quantile::new(0.5);
        values.iter().for_each(|&x| ascending.observe(x));
        let estimate = ascending.estimate().unwrap();
        assert!((estimate - 5_000.0).abs() < 150.0, "ascending median {estimate}");

        let mut descending = P2Quantile::new(0.5);
        values.iter().rev().for_each(|&x| descending.observe(x));
        let estimate = descending.estimate().unwrap();
        assert!((estimate - 5_000.0).abs() < 150.0, "descending median {estimate}");
    }

    #[test]
    fn p2_ignores_nan() {
        let mut estimator = P2Quantile::new(0.5);
        for x in [1.0, f64::NAN, 2.0, 3.0, f64::NAN] {
            estimator.observe(x);
        }
        assert_eq!(estimator.count(), 3);
        assert_eq!(estimator.estimate(), Some(2.0));
    }

    #[test]
    fn window_quantile_matches_brute_force() {
        let mut rng = XorShift::new(8);
        for capacity in [1, 3, 10, 100] {
            let mut window = WindowQuantile::new(capacity);
            assert!(window.is_empty());
            assert_eq!(window.quantile(0.5), None);
            assert_eq!(window.capacity(), capacity);
            let mut all = Vec::new();
            for step in 0..400 {
                let x = (rng.next() % 1_000) as f64 / 10.0;
                window.observe(x);
                all.push(x);
                let last = &all[all.len().saturating_sub(capacity)..];
                assert_eq!(window.len(), last.len());
                if step % 7 == 0 {
                    for q in [0.0, 0.05, 0.5, 0.95, 1.0] {
                        assert_eq!(window.quantile(q), reference_quantile(last, q), "cap {capacity} q {q}");
                    }
                }
            }
        }
    }
}
