//! `calm-sjf`: shortest predicted job first (the thesis's "w/o CALM" ablation, spec
//! §7): the key is the remaining output predicted by the same conditional quantile
//! estimator CALM uses (L̂ − g, re-predicted every frame), smallest first; no length
//! grouping, no bandwidth, no drops; preemptive at frame boundaries (paused residents
//! are evicted by recompute from the longest end when a shorter job needs the room).
//!
//! Parameters: `q_ub` (0.90), `length_window` (2000), `length_prior` (512), as CALM.

use yardmaster_sdk::helpers::{Finished, LengthEstimator, LlmRequest, Preemption, RankedLlm, Ranking};
use yardmaster_sdk::{Ctx, Instant};

/// Shortest predicted remaining output first.
#[derive(Debug)]
pub struct Sjf {
    estimator: LengthEstimator,
    q_ub: f64,
}

impl Ranking for Sjf {
    const PREEMPTION: Preemption = Preemption::Unguarded;

    fn init(ctx: &Ctx) -> Result<Self, String> {
        let window: usize = ctx.param_or("length_window", 2000)?;
        Ok(Self { estimator: LengthEstimator::new(window.max(1), ctx.param_or("length_prior", 512)?), q_ub: ctx.param_or("q_ub", 0.90)? })
    }

    fn key(&self, request: &LlmRequest, _now: Instant) -> f64 {
        let bound = self.estimator.upper_bound(request.class.code(), request.prompt, request.generated, self.q_ub, 0);
        (bound - request.generated) as f64
    }

    fn finished(&mut self, finished: &Finished) {
        self.estimator.observe(finished.class.code(), finished.prompt, finished.output);
    }
}

/// The exported policy.
pub type CalmSjf = RankedLlm<Sjf>;

yardmaster_sdk::export_policy!(CalmSjf);
