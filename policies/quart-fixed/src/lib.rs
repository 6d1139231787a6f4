//! `quart-fixed`: the fixed-replica baseline of the QUART reproduction. At start it
//! sets every stage to `replicas` replicas (parameter; 0 keeps the pipeline's own
//! counts) and never scales again. Requests wait in one FIFO queue per stage and run
//! on the first idle replica; nothing is dropped.

use yardmaster_sdk::helpers::{ScaledFifo, ScalingRule};
use yardmaster_sdk::Ctx;

/// Fixed replicas, FIFO per stage.
pub type QuartFixed = ScaledFifo<FixedReplicas>;

/// The rule: scale once at start, never again.
#[derive(Debug)]
pub struct FixedReplicas;

impl ScalingRule for FixedReplicas {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let replicas: u32 = ctx.param_or("replicas", 0)?;
        if replicas > 0 {
            let stages: Vec<(u32, u32, u32)> = ctx.config().stages.iter().map(|s| (s.id, s.min_replicas, s.max_replicas)).collect();
            let per_stage_room = ctx.config().max_workers / (stages.len().max(1) as u32);
            for (stage, low, high) in stages {
                ctx.scale(stage, replicas.min(per_stage_room).clamp(low, high.max(low)), None);
            }
        }
        Ok(Self)
    }
}

yardmaster_sdk::export_policy!(QuartFixed);
