//! The downstream latency estimate `L_sub,k` (the State Planner's output, spec
//! §3.3–3.4): for every path from a successor of module k to a sink, the windowed
//! queueing delays and profiled durations of its modules plus the λ-quantile of
//! their summed batch waits; the maximum over paths.
//!
//! Batch waits are sampled: each module keeps a pool of its recent waits normalised
//! by its batch duration (u ∈ [0, 1]); a draw picks one at random and rescales it by
//! the module's *current* duration, or is U[0, 1]·d while the pool is small. Summing
//! independent draws along a path gives the aggregated wait; its λ-quantile is w.

use yardmaster_sdk::{splitmix64, StageId};

use crate::params::Estimate;

/// A module's recent batch waits, normalised to [0, 1] (a ring of fixed capacity).
#[derive(Debug, Clone, Default)]
pub struct WaitPool {
    values: Vec<f64>,
    next: usize,
    capacity: usize,
}

impl WaitPool {
    /// An empty pool holding at most `capacity` waits.
    pub fn new(capacity: usize) -> Self {
        Self { values: Vec::with_capacity(capacity.min(1 << 16)), next: 0, capacity: capacity.max(1) }
    }

    /// Record a normalised wait (clamped to [0, 1]).
    pub fn push(&mut self, u: f64) {
        let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) };
        if self.values.len() < self.capacity {
            self.values.push(u);
        } else {
            self.values[self.next] = u;
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// Waits held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no wait is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// The sampling source: SplitMix64, seeded per sync so draws replay exactly.
#[derive(Debug, Clone)]
pub struct Draws(u64);

impl Draws {
    /// A source for sync number `tick` of a policy seeded with `seed`.
    pub fn new(seed: u64, tick: u64) -> Self {
        Self(splitmix64(seed ^ tick.wrapping_mul(0xA24B_AED4_963E_E407)).1)
    }

    fn next(&mut self) -> u64 {
        let (state, out) = splitmix64(self.0);
        self.0 = state;
        out
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform index below `n` (> 0).
    pub fn index(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }
}

/// Fill `draws[i][j]` (j < `samples`) with module i's sampled batch wait (ns):
/// a normalised wait from its pool (or U[0, 1] below `pool_min` entries) times its
/// current batch duration `durations[i]`.
pub fn sample_waits(
    pools: &[&WaitPool],
    durations: &[f64],
    samples: usize,
    pool_min: usize,
    source: &mut Draws,
    draws: &mut Vec<Vec<f64>>,
) {
    draws.resize(pools.len(), Vec::new());
    for (i, pool) in pools.iter().enumerate() {
        let row = &mut draws[i];
        row.clear();
        let use_pool = pool.len() >= pool_min.max(1);
        for _ in 0..samples {
            let u = if use_pool { pool.values[source.index(pool.len())] } else { source.uniform() };
            row.push(u * durations[i]);
        }
    }
}

/// The λ-quantile of the summed waits along `path`: the ⌈λM⌉-th smallest of the M
/// sums; exactly 0 for λ = 0 and Σd for λ = 1.
pub fn path_wait_quantile(draws: &[Vec<f64>], durations: &[f64], path: &[StageId], lambda: f64, scratch: &mut Vec<f64>) -> f64 {
    if lambda <= 0.0 || path.is_empty() {
        return 0.0;
    }
    if lambda >= 1.0 {
        return path.iter().map(|&i| durations[i as usize]).sum();
    }
    let samples = draws.get(path[0] as usize).map_or(0, Vec::len);
    if samples == 0 {
        return 0.0;
    }
    scratch.clear();
    scratch.extend_from_slice(&draws[path[0] as usize]);
    for &i in &path[1..] {
        for (sum, x) in scratch.iter_mut().zip(&draws[i as usize]) {
            *sum += x;
        }
    }
    let rank = ((lambda * samples as f64).ceil() as usize).clamp(1, samples);
    let (_, value, _) = scratch.select_nth_unstable_by(rank - 1, f64::total_cmp);
    *value
}

/// `L_sub` from the per-module queueing delays `q` and durations `d` (ns) and the
/// per-path wait quantiles `w` (one per path, same order): the maximum over paths.
pub fn downstream_latency(estimate: Estimate, paths: &[Vec<StageId>], q: &[f64], d: &[f64], w: &[f64]) -> f64 {
    let sum = |path: &[StageId], f: &dyn Fn(usize) -> f64| path.iter().map(|&i| f(i as usize)).sum::<f64>();
    match estimate {
        Estimate::Back => 0.0,
        Estimate::ServiceOnly => paths.iter().map(|p| sum(p, &|i| d[i])).fold(0.0, f64::max),
        Estimate::Full => paths.iter().zip(w).map(|(p, &wp)| sum(p, &|i| q[i] + d[i]) + wp).fold(0.0, f64::max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty pools: every draw is U[0,1]·d.
    fn uniform_draws(modules: usize, d: f64, samples: usize, seed: u64) -> Vec<Vec<f64>> {
        let pools = vec![WaitPool::new(samples); modules];
        let mut draws = Vec::new();
        let pools: Vec<&WaitPool> = pools.iter().collect();
        sample_waits(&pools, &vec![d; modules], samples, 200, &mut Draws::new(seed, 0), &mut draws);
        draws
    }

    /// Property 1: the paper's worked example, 4 equal modules, λ = 0.1, M = 10 000:
    /// 0.10d, 0.447d, 0.843d, 1.245d for 1..4 downstream modules (±3 %).
    ///
    /// One sync's 0.1-quantile of 10 000 uniform draws has a relative standard error
    /// of 3 % itself, so the estimate is averaged over 10 syncs (1 %).
    #[test]
    fn worked_example_matches_irwin_hall() {
        let d = 40e6;
        let mut scratch = Vec::new();
        for (downstream, expected) in [(1, 0.10), (2, 0.447), (3, 0.843), (4, 1.245)] {
            let path: Vec<StageId> = (0..downstream as StageId).collect();
            let syncs = 10;
            let w = (0..syncs)
                .map(|sync| path_wait_quantile(&uniform_draws(4, d, 10_000, sync), &[d; 4], &path, 0.1, &mut scratch))
                .sum::<f64>()
                / (syncs as f64 * d);
            assert!((w - expected).abs() <= 0.03 * expected, "{downstream} modules: {w:.4}d, expected {expected}d");
        }
    }

    /// Property 2: λ = 0 gives 0, λ = 1 gives Σd, w is non-decreasing in λ, and with
    /// uniform pools and λ < 0.5, w/Σd rises toward 0.5 with more modules.
    #[test]
    fn quantile_bounds_monotonicity_and_concentration() {
        let d = 10e6;
        let draws = uniform_draws(8, d, 10_000, 3);
        let mut scratch = Vec::new();
        let path: Vec<StageId> = vec![0, 1, 2];
        assert_eq!(path_wait_quantile(&draws, &[d; 8], &path, 0.0, &mut scratch), 0.0);
        assert_eq!(path_wait_quantile(&draws, &[d; 8], &path, 1.0, &mut scratch), 3.0 * d);
        let mut last = 0.0;
        for lambda in [0.0, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 0.9, 1.0] {
            let w = path_wait_quantile(&draws, &[d; 8], &path, lambda, &mut scratch);
            assert!(w >= last, "λ={lambda}: {w} < {last}");
            last = w;
        }
        let mut last_share = 0.0;
        for n in 1..=8 {
            let path: Vec<StageId> = (0..n).collect();
            let share = path_wait_quantile(&draws, &[d; 8], &path, 0.1, &mut scratch) / (n as f64 * d);
            assert!(share > last_share && share < 0.5, "{n} modules: share {share}");
            last_share = share;
        }
    }

    #[test]
    fn pools_are_used_once_full_and_rescaled_to_the_current_duration() {
        let mut pool = WaitPool::new(4);
        for u in [0.5, 0.5, 2.0, -1.0, 0.5] {
            pool.push(u);
        }
        assert_eq!(pool.len(), 4);
        assert_eq!(pool.values, vec![0.5, 0.5, 1.0, 0.0]);
        let mut same = WaitPool::new(300);
        for _ in 0..300 {
            same.push(0.25);
        }
        let mut draws = Vec::new();
        sample_waits(&[&same], &[8e6], 100, 200, &mut Draws::new(1, 1), &mut draws);
        assert!(draws[0].iter().all(|&x| x == 2e6));
    }

    /// Property 3: in any fixed state L_back ≤ L_sf ≤ L_lower ≤ L_PARD ≤ L_upper,
    /// so the sets of requests each variant drops at a decision point are nested.
    #[test]
    fn estimate_ordering() {
        let mut source = Draws::new(11, 0);
        for case in 0..50 {
            let modules = 5;
            let q: Vec<f64> = (0..modules).map(|_| source.uniform() * 30e6).collect();
            let d: Vec<f64> = (0..modules).map(|_| 5e6 + source.uniform() * 40e6).collect();
            let mut pools = vec![WaitPool::new(1000); modules];
            for pool in &mut pools {
                for _ in 0..(case * 20) {
                    pool.push(source.uniform());
                }
            }
            let mut draws = Vec::new();
            let pools: Vec<&WaitPool> = pools.iter().collect();
            sample_waits(&pools, &d, 2000, 200, &mut source, &mut draws);
            // A diamond's paths from module 0, and a chain suffix.
            for paths in [vec![vec![1, 3, 4], vec![2, 3, 4]], vec![vec![2, 3, 4]]] {
                let mut scratch = Vec::new();
                let w_at = |lambda: f64, scratch: &mut Vec<f64>| -> Vec<f64> {
                    paths.iter().map(|p| path_wait_quantile(&draws, &d, p, lambda, scratch)).collect()
                };
                let back = downstream_latency(Estimate::Back, &paths, &q, &d, &w_at(0.1, &mut scratch));
                let sf = downstream_latency(Estimate::ServiceOnly, &paths, &q, &d, &w_at(0.1, &mut scratch));
                let lower = downstream_latency(Estimate::Full, &paths, &q, &d, &w_at(0.0, &mut scratch));
                let pard = downstream_latency(Estimate::Full, &paths, &q, &d, &w_at(0.1, &mut scratch));
                let upper = downstream_latency(Estimate::Full, &paths, &q, &d, &w_at(1.0, &mut scratch));
                assert!(back <= sf && sf <= lower && lower <= pard && pard <= upper, "{back} {sf} {lower} {pard} {upper}");
                assert!(sf < upper);
            }
        }
    }

    /// Property 15 (unit part): in the da diamond, the estimate at person detection is
    /// the slower branch's path; slowing the pose branch raises it to the pose path.
    #[test]
    fn dag_estimate_is_the_slower_path() {
        let paths = vec![vec![1, 3, 4], vec![2, 3, 4]];
        let d = [105e6, 57e6, 34e6, 27e6, 27e6];
        let w = [10e6, 10e6];
        let balanced = [0.0, 5e6, 5e6, 0.0, 0.0];
        let congested_pose = [0.0, 60e6, 5e6, 0.0, 0.0];
        let pose_path = |q: &[f64]| q[1] + d[1] + q[3] + d[3] + q[4] + d[4] + w[0];
        let l = downstream_latency(Estimate::Full, &paths, &balanced, &d, &w);
        assert_eq!(l, pose_path(&balanced), "pose is the longer branch already");
        let slower = downstream_latency(Estimate::Full, &paths, &congested_pose, &d, &w);
        assert_eq!(slower, pose_path(&congested_pose));
        assert!(slower > l);
        let face_congested = [0.0, 0.0, 100e6, 0.0, 0.0];
        let face_path = face_congested[2] + d[2] + d[3] + d[4] + w[1];
        assert_eq!(downstream_latency(Estimate::Full, &paths, &face_congested, &d, &w), face_path);
    }
}
