//! `calm-edf`: earliest deadline first for LLM serving (spec §7), goodput-agnostic.
//! Each frame the key is the absolute deadline of the next thing due: for a
//! latency-sensitive request its next token (τ_g = first-token deadline + g·TBT),
//! otherwise its deadline (best-effort: arrival + `be_deadline_ms`). The B earliest
//! keys that fit run; paused residents are evicted (recompute) from the latest-key
//! end, unguarded, when an earlier one needs the KV cache. Nothing is dropped.

use yardmaster_sdk::helpers::{LlmRequest, Preemption, RankedLlm, Ranking, ServiceClass};
use yardmaster_sdk::{Ctx, Instant};

/// Earliest deadline first.
#[derive(Debug)]
pub struct Edf {
    tbt_ns: f64,
    be_deadline_ns: u64,
}

impl Ranking for Edf {
    const PREEMPTION: Preemption = Preemption::Unguarded;

    fn init(ctx: &Ctx) -> Result<Self, String> {
        Ok(Self {
            tbt_ns: ctx.param_or::<f64>("tbt_ms", 100.0)? * 1e6,
            be_deadline_ns: (ctx.param_or::<f64>("be_deadline_ms", 60_000.0)? * 1e6) as u64,
        })
    }

    fn key(&self, request: &LlmRequest, _now: Instant) -> f64 {
        match request.class {
            ServiceClass::Latency => request.deadline as f64 + request.generated as f64 * self.tbt_ns,
            ServiceClass::BestEffort => request.sent_at.saturating_add(self.be_deadline_ns) as f64,
            ServiceClass::Deadline | ServiceClass::Compound => request.deadline as f64,
        }
    }
}

/// The exported policy.
pub type CalmEdf = RankedLlm<Edf>;

yardmaster_sdk::export_policy!(CalmEdf);
