//! Online tuning of the cut-off p (spec §3.8): ε-greedy over a grid, one arm per
//! epoch of frames, rewarded by the goodput credited in the epoch over the goodput
//! offered in it; the choice is restricted to the best arm and its grid neighbours.

use yardmaster_sdk::helpers::Ewma;

/// The grid of p values.
pub const GRID: [f64; 5] = [0.80, 0.85, 0.90, 0.95, 1.00];

/// The tuner.
#[derive(Debug, Clone)]
pub struct PTuner {
    arms: Vec<Ewma>,
    current: usize,
    epoch_frames: u32,
    epsilon: f64,
    frames: u32,
    credited: f64,
    offered: f64,
}

impl PTuner {
    /// Start at the grid value closest to `start`, epochs of `epoch_frames` frames,
    /// exploring with probability `epsilon`; `alpha` is the per-arm EWMA weight.
    pub fn new(start: f64, epoch_frames: u32, epsilon: f64, alpha: f64) -> Self {
        let current = (0..GRID.len()).min_by(|&a, &b| (GRID[a] - start).abs().total_cmp(&(GRID[b] - start).abs())).unwrap_or(3);
        Self {
            arms: vec![Ewma::new(alpha); GRID.len()],
            current,
            epoch_frames: epoch_frames.max(1),
            epsilon,
            frames: 0,
            credited: 0.0,
            offered: 0.0,
        }
    }

    /// The p in force.
    pub fn p(&self) -> f64 {
        GRID[self.current]
    }

    /// Goodput offered (arrived) in this epoch.
    pub fn offer(&mut self, tokens: f64) {
        self.offered += tokens;
    }

    /// Goodput credited (delivered within its SLO) in this epoch.
    pub fn credit(&mut self, tokens: f64) {
        self.credited += tokens;
    }

    /// A frame ended; at the end of an epoch, score the arm and pick the next one with
    /// the two uniform draws in [0, 1) given (`explore`, `pick`). Returns whether p changed.
    pub fn frame_done(&mut self, explore: f64, pick: f64) -> bool {
        self.frames += 1;
        if self.frames < self.epoch_frames {
            return false;
        }
        if self.offered > 0.0 {
            self.arms[self.current].update(self.credited / self.offered);
        }
        self.frames = 0;
        self.credited = 0.0;
        self.offered = 0.0;
        let score = |i: usize| self.arms[i].value().unwrap_or(f64::INFINITY);
        let best = (0..GRID.len()).max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a))).unwrap_or(self.current);
        let next = if explore < self.epsilon {
            let neighbours: Vec<usize> = [best.wrapping_sub(1), best, best + 1].into_iter().filter(|&i| i < GRID.len()).collect();
            neighbours[((pick * neighbours.len() as f64) as usize).min(neighbours.len() - 1)]
        } else {
            best
        };
        let changed = next != self.current;
        self.current = next;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_the_default_and_settles_on_the_best_arm() {
        let mut tuner = PTuner::new(0.95, 1, 0.1, 0.3);
        assert_eq!(tuner.p(), 0.95);
        // Reward: 1 − |p − 0.85|: the best arm is 0.85. Untried arms score +∞ (tried first).
        let mut state = 3u64;
        let mut uniform = || {
            let (next, word) = yardmaster_sdk::splitmix64(state);
            state = next;
            (word >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut visits = [0u32; 5];
        for _ in 0..400 {
            let p = tuner.p();
            tuner.offer(1.0);
            tuner.credit(1.0 - (p - 0.85).abs());
            let (e, k) = (uniform(), uniform());
            tuner.frame_done(e, k);
            visits[GRID.iter().position(|&g| g == tuner.p()).unwrap()] += 1;
        }
        assert_eq!(tuner.p(), 0.85, "visits {visits:?}");
        assert!(visits[1] > 300, "mostly the best arm: {visits:?}");
    }
}
