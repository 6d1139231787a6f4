//! `quart-fixed`: the fixed-replica baseline of the QUART reproduction. At start it
//! sets every stage to `replicas` replicas (parameter; 0 keeps the pipeline's own
//! counts) and never scales again. Requests wait in one FIFO queue per stage and run
//! on the first idle replica; nothing is dropped.

use yardmaster_sdk::helpers::StageFifo;
use yardmaster_sdk::{BatchOutcome, Ctx, EndReason, Policy, Request, RequestId, WorkerId};

/// Fixed replicas, FIFO per stage.
#[derive(Debug, Default)]
pub struct QuartFixed {
    fifo: StageFifo,
}

impl Policy for QuartFixed {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let replicas: u32 = ctx.param_or("replicas", 0)?;
        if replicas > 0 {
            let stages: Vec<(u32, u32, u32)> =
                ctx.config().stages.iter().map(|s| (s.id, s.min_replicas, s.max_replicas)).collect();
            let per_stage_room = ctx.config().max_workers / (stages.len().max(1) as u32);
            for (stage, low, high) in stages {
                ctx.scale(stage, replicas.min(per_stage_room).clamp(low, high.max(low)), None);
            }
        }
        Ok(Self::default())
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        self.fifo.push(ctx.now(), &request);
    }

    fn on_batch_done(&mut self, ctx: &mut Ctx, outcome: BatchOutcome) {
        self.fifo.finish(&outcome, ctx.now());
    }

    fn on_request_ended(&mut self, ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.fifo.forget(ctx.now(), request);
    }

    fn on_worker_removed(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.fifo.worker_gone(worker);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.fifo.dispatch_idle(ctx);
    }
}

yardmaster_sdk::export_policy!(QuartFixed);
