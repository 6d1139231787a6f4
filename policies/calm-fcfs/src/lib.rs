//! `calm-fcfs`: the vLLM default the CALM thesis compares against (spec §7): requests
//! run in arrival order with continuous batching; running sequences keep running;
//! waiting requests are admitted in order while the KV cache and `max_num_seqs`
//! allow (head-of-line: the first that does not fit stops admission); when the
//! residents' growth no longer fits, the most recently arrived one is evicted by
//! recompute and re-queued at its arrival position (the head). Nothing is dropped.

use yardmaster_sdk::helpers::{LlmRequest, Preemption, RankedLlm, Ranking};
use yardmaster_sdk::{Ctx, Instant};

/// First come, first served.
#[derive(Debug, Default)]
pub struct Fcfs;

impl Ranking for Fcfs {
    const PREEMPTION: Preemption = Preemption::NewestOnOverflow;

    fn init(_ctx: &Ctx) -> Result<Self, String> {
        Ok(Self)
    }

    fn key(&self, request: &LlmRequest, _now: Instant) -> f64 {
        request.sent_at as f64
    }
}

/// The exported policy.
pub type CalmFcfs = RankedLlm<Fcfs>;

yardmaster_sdk::export_policy!(CalmFcfs);
