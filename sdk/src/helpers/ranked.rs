//! A complete LLM (iteration-level) baseline policy parameterised by a ranking: at
//! every frame boundary of an idle worker it runs the best-ranked requests that fit
//! in the worker's KV cache (see [`plan_by_rank`]), among its residents and the
//! best-ranked [`WINDOW`] batches of the others, so that a decision costs about the
//! same however long the queue (issue 43). FCFS, EDF and shortest-predicted-
//! job-first differ only in the key and in how they free KV cache.
//!
//! Parameters read here: `kv_bytes_per_token` (KV footprint until measured, 819200)
//! and `frame_steps` (growth reserved per sequence until the host reports its frames, 50).

use std::cmp::Ordering;

use super::llm::{idle_iteration_workers, plan_by_rank, BatchStageFifo, Finished, LlmBook, LlmRequest, Preemption, Residence};
use crate::{Ctx, EndReason, FrameReport, Instant, Policy, Request, RequestId, WorkerId};

/// Requests not resident on the worker that a frame's plan considers, in batches: the
/// best-ranked `WINDOW × batch` (a request ranked past them waits for a later frame).
pub const WINDOW: usize = 8;

/// A candidate's key, arrival, id and whether it is resident on the worker.
type Keyed = (f64, Instant, RequestId, bool);

/// Rank order: key, then arrival, then id.
fn rank_order(a: &Keyed, b: &Keyed) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

/// The ordering of a rank-based LLM baseline.
pub trait Ranking: Sized + 'static {
    /// How KV cache is freed for better-ranked requests.
    const PREEMPTION: Preemption;
    /// Build from the configuration (parameters).
    fn init(ctx: &Ctx) -> Result<Self, String>;
    /// The request's key at `now`: smaller runs first.
    fn key(&self, request: &LlmRequest, now: Instant) -> f64;
    /// A request finished generating (to learn lengths).
    fn finished(&mut self, _finished: &Finished) {}
}

/// A baseline policy running requests in the order of `R`.
pub struct RankedLlm<R: Ranking> {
    ranking: R,
    book: LlmBook,
    frame_steps: u32,
    batch_stages: BatchStageFifo,
}

impl<R: Ranking> RankedLlm<R> {
    /// The ranking.
    pub fn ranking(&self) -> &R {
        &self.ranking
    }

    fn plan(&mut self, ctx: &mut Ctx, worker: WorkerId) {
        let now = ctx.now();
        let Some(info) = ctx.worker(worker).map(|w| w.info) else { return };
        let batch = ctx.batch_limit(info.stage) as usize;
        // The worker's residents (its eviction victims) and the best-ranked
        // [`WINDOW`] × batch of the others, in rank order: sorting every waiting
        // request at every frame made a decision's cost grow with the queue.
        let (mut keyed, mut waiting): (Vec<Keyed>, Vec<Keyed>) = self
            .book
            .candidates(worker, info.stage)
            .map(|r| (self.ranking.key(r, now), r.sent_at, r.id, matches!(r.residence, Residence::Resident(_))))
            .partition(|k| k.3);
        let window = batch.saturating_mul(WINDOW).max(1);
        if waiting.len() > window {
            waiting.select_nth_unstable_by(window - 1, rank_order);
            waiting.truncate(window);
        }
        keyed.append(&mut waiting);
        keyed.sort_by(rank_order);
        let order: Vec<RequestId> = keyed.into_iter().map(|k| k.2).collect();
        let plan = plan_by_rank(&self.book, worker, info.memory_bytes, &order, batch, self.frame_steps, R::PREEMPTION);
        self.book.apply(ctx, worker, plan);
    }
}

impl<R: Ranking> Policy for RankedLlm<R> {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let kv: f64 = ctx.param_or("kv_bytes_per_token", 819_200.0)?;
        let frame_steps: u32 = ctx.param_or("frame_steps", 50)?;
        Ok(Self { ranking: R::init(ctx)?, book: LlmBook::new(ctx, kv, 0.2), frame_steps, batch_stages: BatchStageFifo::default() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        if BatchStageFifo::is_batch_stage(ctx, request.stage) {
            self.batch_stages.push(&request);
        } else {
            self.book.arrive(&request);
        }
    }

    fn on_frame(&mut self, _ctx: &mut Ctx, frame: FrameReport) {
        if frame.steps > 0 {
            self.frame_steps = frame.steps;
        }
        for finished in self.book.frame(&frame) {
            self.ranking.finished(&finished);
        }
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.book.remove(request);
        self.batch_stages.remove(request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.batch_stages.dispatch_idle(ctx);
        for worker in idle_iteration_workers(ctx) {
            self.plan(ctx, worker);
        }
    }
}
