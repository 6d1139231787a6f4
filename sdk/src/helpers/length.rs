//! An online, survival-conditioned quantile estimator of LLM output lengths: the
//! in-policy stand-in for a quantile regression forest (CALM spec §4.1).
//!
//! Finished requests are filed under a key (service class × log₂ prompt-length
//! bucket), each key keeping the last `capacity` observed output lengths. The upper
//! bound for a request that has generated `g` tokens is the `q`-quantile of the
//! lengths *greater than `g`* in the most specific pool with enough samples (key,
//! then class, then all), so the bound tightens as generation proceeds: conditioning
//! on survival past `g` is the refinement.
//!
//! A bound costs a pass over its pool (up to `capacity` lengths). A scheduler that
//! ranks every waiting request by its bound at every frame (`calm-sjf`) asked for
//! thousands of them per decision under overload — out of an event call's fuel on a
//! conversation trace at 36× its speed (issue 43). Bounds are a function of the class,
//! the prompt's bucket, `g`, `q` and the cap until the next observation, so they are
//! remembered until then: a decision costs one pass per distinct (class, bucket, `g`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use super::window::CountWindow;

/// Samples a key needs before it is trusted over its class pool (and a class pool
/// before it is trusted over the global one).
pub const MIN_POOL_SAMPLES: usize = 30;
/// Samples above `g` a pool needs for a conditional quantile; with fewer, the bound
/// is `2g` (spec §4.1).
pub const MIN_TAIL_SAMPLES: usize = 10;

/// What a bound depends on until the next observation: class, prompt bucket,
/// generated tokens, the quantile's bits and the cap.
type BoundKey = (u8, u8, u32, u64, u32);

/// The conditional quantile estimator of output lengths.
#[derive(Debug, Clone)]
pub struct LengthEstimator {
    capacity: usize,
    prior: u32,
    keyed: BTreeMap<(u8, u8), CountWindow>,
    by_class: BTreeMap<u8, CountWindow>,
    global: CountWindow,
    /// Bounds computed since the last observation.
    remembered: RefCell<HashMap<BoundKey, u32>>,
}

/// The log₂ bucket of a prompt length (0 for prompts of 0 or 1 token).
pub fn prompt_bucket(prompt: u32) -> u8 {
    (32 - prompt.max(1).leading_zeros() - 1) as u8
}

impl LengthEstimator {
    /// An empty estimator keeping `capacity` lengths per pool; `prior` is the bound
    /// before anything was observed (a fresh request with no history).
    ///
    /// # Panics
    /// If `capacity` is zero.
    pub fn new(capacity: usize, prior: u32) -> Self {
        Self {
            capacity,
            prior: prior.max(1),
            keyed: BTreeMap::new(),
            by_class: BTreeMap::new(),
            global: CountWindow::new(capacity),
            remembered: RefCell::new(HashMap::new()),
        }
    }

    /// Record a finished request: its class (any small code), prompt and output length.
    pub fn observe(&mut self, class: u8, prompt: u32, output: u32) {
        let value = output as f64;
        let capacity = self.capacity;
        self.remembered.get_mut().clear();
        self.keyed.entry((class, prompt_bucket(prompt))).or_insert_with(|| CountWindow::new(capacity)).push(value);
        self.by_class.entry(class).or_insert_with(|| CountWindow::new(capacity)).push(value);
        self.global.push(value);
    }

    /// Observations held in total (at most `capacity`).
    pub fn len(&self) -> usize {
        self.global.len()
    }

    /// Mean of every observation held, or `None` before the first.
    pub fn mean(&self) -> Option<f64> {
        self.global.mean()
    }

    /// Whether nothing was observed yet.
    pub fn is_empty(&self) -> bool {
        self.global.is_empty()
    }

    /// The `q`-quantile upper bound of the total output length of a request of
    /// `class` with `prompt` tokens that has generated `generated` tokens: always in
    /// `[generated + 1, max_tokens]` (`max_tokens` 0 means no cap).
    pub fn upper_bound(&self, class: u8, prompt: u32, generated: u32, q: f64, max_tokens: u32) -> u32 {
        let key = (class, prompt_bucket(prompt), generated, q.to_bits(), max_tokens);
        if let Some(&bound) = self.remembered.borrow().get(&key) {
            return bound;
        }
        let bound = self.compute_upper_bound(class, prompt, generated, q, max_tokens);
        self.remembered.borrow_mut().insert(key, bound);
        bound
    }

    /// [`Self::upper_bound`] computed afresh: one pass over the pool.
    fn compute_upper_bound(&self, class: u8, prompt: u32, generated: u32, q: f64, max_tokens: u32) -> u32 {
        let pool = [self.keyed.get(&(class, prompt_bucket(prompt))), self.by_class.get(&class), Some(&self.global)]
            .into_iter()
            .flatten()
            .find(|w| w.len() >= MIN_POOL_SAMPLES)
            .or_else(|| Some(&self.global).filter(|w| !w.is_empty()));
        let doubled = generated.saturating_mul(2);
        let bound = match pool {
            None => doubled.max(self.prior),
            Some(window) => {
                let mut tail: Vec<f64> = window.iter().filter(|&l| l > generated as f64).collect();
                if tail.len() < MIN_TAIL_SAMPLES {
                    doubled.max(if generated == 0 { self.prior } else { 0 })
                } else {
                    let rank = ((q.clamp(0.0, 1.0) * tail.len() as f64).ceil() as usize).clamp(1, tail.len());
                    let (_, value, _) = tail.select_nth_unstable_by(rank - 1, f64::total_cmp);
                    value.ceil() as u32
                }
            }
        };
        let cap = if max_tokens == 0 { u32::MAX } else { max_tokens };
        bound.max(generated.saturating_add(1)).min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(prompt_bucket(0), 0);
        assert_eq!(prompt_bucket(1), 0);
        assert_eq!(prompt_bucket(2), 1);
        assert_eq!(prompt_bucket(1023), 9);
        assert_eq!(prompt_bucket(1024), 10);
    }

    #[test]
    fn without_history_the_prior_then_doubling() {
        let e = LengthEstimator::new(100, 256);
        assert_eq!(e.upper_bound(0, 10, 0, 0.9, 0), 256);
        assert_eq!(e.upper_bound(0, 10, 300, 0.9, 0), 600);
        assert_eq!(e.upper_bound(0, 10, 300, 0.9, 400), 400, "capped by max_tokens");
    }

    #[test]
    fn the_bound_is_the_conditional_quantile_and_tightens_with_progress() {
        let mut e = LengthEstimator::new(2000, 256);
        for l in 1..=100 {
            e.observe(1, 500, l * 10);
        }
        // Unconditional 0.9-quantile of 10..=1000 is 900.
        assert_eq!(e.upper_bound(1, 500, 0, 0.9, 0), 900);
        // Survived past 500: the tail is 510..=1000 (50 values), its 0.9-quantile (rank 45) 950.
        assert_eq!(e.upper_bound(1, 500, 500, 0.9, 0), 950);
        // Fewer than 10 samples above g: 2g.
        assert_eq!(e.upper_bound(1, 500, 950, 0.9, 0), 1900);
        // Never below g + 1.
        assert!(e.upper_bound(1, 500, 5000, 0.9, 0) > 5000);
    }

    #[test]
    fn sparse_keys_fall_back_to_the_class_then_global_pool() {
        let mut e = LengthEstimator::new(2000, 256);
        for _ in 0..40 {
            e.observe(0, 4000, 50);
        }
        for _ in 0..5 {
            e.observe(0, 10, 7);
        }
        // Key (0, bucket of 10) has 5 samples: the class pool (45 values, mostly 50) answers.
        assert_eq!(e.upper_bound(0, 10, 0, 0.9, 0), 50);
        // An unseen class falls back to the global pool.
        assert_eq!(e.upper_bound(3, 10, 0, 0.5, 0), 50);
    }
}
