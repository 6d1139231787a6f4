//! A whole pipeline policy from a rule: [`BrokeredPipeline`] wires a
//! [`BatchBroker`] (per-worker queues, open batches, round-robin dispatch) and a
//! [`ScalingPlanner`] (Nexus-style batch sizes and replicas) to the host's events,
//! and leaves to a [`PipelineRule`] only what distinguishes one policy from another:
//! the queue order, the drop rule, drops at arrival and per-tick bookkeeping.
//!
//! PARD, its ablations and the baselines it is compared with (naive, Nexus,
//! Clipper++) are each a rule, so they share batching, planning and scaling exactly.
//!
//! Planner parameters, read by every rule's policy (defaults in parentheses):
//! `max_batch` (32) largest batch considered; `scale_epoch_ms` (5000) scaling period;
//! `rate_window_s` (5) seconds averaged for the entry rate; `plan_grid_ms` (1) grid of
//! the SLO split; `initial_rate` (0) entry rate (req/s) to scale for at start (0:
//! spread the started workers as the plan needs them until the first epoch);
//! `plan_headroom` (0.2; 0 when `initial_rate` is given) the replicas are planned
//! for the rate times one plus it.

use crate::helpers::{BatchBroker, Discipline, NexusPlan, Queued, ScalingPlanner, StageGraph, WorkerQueue};
use crate::{Ctx, DropReason, EndReason, Policy, Request, RequestId, Snapshot, StageId, Worker, WorkerId};

/// What a pipeline policy decides beyond the shared mechanics.
pub trait PipelineRule: Discipline<Self::Queue> + Sized + 'static {
    /// The per-worker queue.
    type Queue: WorkerQueue;

    /// Build the rule. Batch limits are already set from `plan`.
    fn init(ctx: &mut Ctx, graph: &StageGraph, plan: &NexusPlan) -> Result<Self, String>;

    /// The queue key of an arriving request (smaller is served first by a
    /// [`crate::helpers::PriorityQueue`]); the deadline by default.
    fn key(&self, request: &Queued) -> crate::Instant {
        request.deadline
    }

    /// A drop decided at arrival, before the request is queued; none by default.
    fn admit_arrival(&mut self, _ctx: &Ctx, _request: &Queued) -> Option<DropReason> {
        None
    }

    /// The periodic tick: update estimates (the broker shows what is queued).
    fn tick(&mut self, _ctx: &mut Ctx, _broker: &BatchBroker<Self::Queue>, _snapshot: &Snapshot) {}

    /// At every tick, the entry requests per second the workers serving now carry at
    /// the batch limits in force (the slowest stage, with the planner's pieces per
    /// request); ignored by default.
    fn entry_capacity(&mut self, _ctx: &Ctx, _capacity: f64) {}
}

/// A [`Policy`] made of a [`PipelineRule`], the shared broker and the planner.
pub struct BrokeredPipeline<R: PipelineRule> {
    broker: BatchBroker<R::Queue>,
    planner: ScalingPlanner,
    rule: R,
    graph: StageGraph,
    /// Whether each stage is a stream's entry (for the entry rate).
    entry: Vec<bool>,
}

impl<R: PipelineRule> BrokeredPipeline<R> {
    /// The rule.
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// The broker.
    pub fn broker(&self) -> &BatchBroker<R::Queue> {
        &self.broker
    }

    /// The planner.
    pub fn planner(&self) -> &ScalingPlanner {
        &self.planner
    }

    /// The stage graph.
    pub fn graph(&self) -> &StageGraph {
        &self.graph
    }
}

/// The Nexus plan for the configuration, with the planner parameters.
fn plan(ctx: &Ctx, graph: &StageGraph) -> Result<NexusPlan, String> {
    let max_batch: u32 = ctx.param_or("max_batch", 32)?;
    let grid_ms: u64 = ctx.param_or("plan_grid_ms", 1)?;
    let slo = ctx.config().streams.iter().map(|s| s.slo).min().ok_or("the pipeline has no stream")?;
    let config = ctx.config();
    let stage_max = |s: StageId| config.stages.iter().find(|st| st.id == s).map_or(1, |st| st.max_batch.min(max_batch));
    let fan_out = |s: StageId| config.stages.iter().find(|st| st.id == s).and_then(|st| st.variants.first()).map_or(1.0, |v| v.fan_out);
    let latency = |s: StageId, b: u32| ctx.latency().mean(s, 0, b).unwrap_or(0);
    NexusPlan::solve(graph, slo, grid_ms.max(1) * 1_000_000, latency, stage_max, fan_out)
        .ok_or_else(|| "the SLO is too tight for the pipeline's profiles".to_string())
}

/// The replicas per stage the shared planner requests for an entry rate of `rate`
/// req/s — what a policy with `initial_rate = rate` asks for at start — so that a
/// harness can start the cluster already provisioned for it (the planner's
/// parameters are read from the configuration, as the policy reads them).
pub fn planned_replicas(ctx: &Ctx, rate: f64) -> Result<Vec<u32>, String> {
    let graph = StageGraph::new(&ctx.config().stages);
    let plan = plan(ctx, &graph)?;
    let rate = rate * (1.0 + ScalingPlanner::headroom_started(ctx, true));
    Ok(plan.replicas(rate, &ScalingPlanner::bounds(ctx, plan.batch.len()), ctx.config().max_workers))
}

impl<R: PipelineRule> Policy for BrokeredPipeline<R> {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let graph = StageGraph::new(&ctx.config().stages);
        let plan = plan(ctx, &graph)?;
        let epoch_ms: u64 = ctx.param_or("scale_epoch_ms", 5000)?;
        let rate_window: usize = ctx.param_or("rate_window_s", 5)?;
        let initial_rate: f64 = ctx.param_or("initial_rate", 0.0)?;
        let headroom: f64 = ctx.param_or("plan_headroom", 0.0)?;
        if !(headroom.is_finite() && headroom >= 0.0) {
            return Err(format!("parameter `plan_headroom`: {headroom} is not a fraction of zero or more"));
        }
        let planner = ScalingPlanner::start(ctx, plan, epoch_ms.saturating_mul(1_000_000), rate_window, initial_rate);
        let rule = R::init(ctx, &graph, planner.plan())?;
        let mut entry = vec![false; graph.len()];
        for stream in &ctx.config().streams {
            if let Some(e) = entry.get_mut(stream.entry as usize) {
                *e = true;
            }
        }
        Ok(Self { broker: BatchBroker::new(ctx), planner, rule, graph, entry })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        if request.requeues == 0 {
            if self.entry.get(request.stage as usize).copied().unwrap_or(false) {
                self.planner.entry_arrival();
            }
            self.planner.stage_arrival(request.stage);
        }
        let mut queued = Queued::from(&request);
        queued.key = self.rule.key(&queued);
        if let Some(reason) = self.rule.admit_arrival(ctx, &queued) {
            ctx.drop_request(queued.id, reason);
            return;
        }
        self.broker.enqueue(queued);
    }

    fn on_worker_idle(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.broker.worker_idle(worker);
    }

    fn on_tick(&mut self, ctx: &mut Ctx, snapshot: Snapshot) {
        self.rule.tick(ctx, &self.broker, &snapshot);
        self.planner.tick(ctx);
        // What the serving workers carry at the batch limits in force (a stage catching
        // up on its workers runs larger batches than the plan's).
        let pieces = self.planner.pieces();
        let capacity = (0..self.graph.len())
            .filter(|&s| pieces.get(s).is_some_and(|&p| p > 0.0))
            .map(|s| {
                let stage = s as StageId;
                let limit = ctx.batch_limit(stage);
                let duration = ctx.latency().mean(stage, 0, limit).unwrap_or(0).max(1) as f64;
                self.broker.workers_of(stage).len() as f64 * limit as f64 * 1e9 / duration / pieces[s]
            })
            .fold(f64::INFINITY, f64::min);
        self.rule.entry_capacity(ctx, capacity);
    }

    fn on_worker_added(&mut self, ctx: &mut Ctx, worker: Worker) {
        self.broker.add_worker(&worker);
        let serving = self.broker.workers_of(worker.stage).len() as u32;
        self.planner.worker_added(ctx, worker.stage, serving);
    }

    fn on_worker_removed(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.broker.remove_worker(worker);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.broker.forget(request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.broker.settle(ctx, &mut self.rule);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{linear_variant, one_stage, MS};
    use crate::{NullHost, Stream};

    /// One stage of d(b) = 25 + 5b ms under a 100 ms SLO: the plan's batch is 5
    /// (d = 50 ms, half the budget), 100 req/s per worker.
    fn ctx(min: u32, max: u32) -> Ctx {
        ctx_with(min, max, &[])
    }

    /// [`ctx`] with policy parameters.
    fn ctx_with(min: u32, max: u32, params: &[(&str, &str)]) -> Ctx {
        let mut config = one_stage(vec![linear_variant(0, "v", 5 * MS, 25 * MS, 32)], 32, 1);
        config.params = params.iter().map(|(key, value)| crate::Param { key: (*key).into(), value: (*value).into() }).collect();
        config.stages[0].min_replicas = min;
        config.stages[0].max_replicas = max;
        config.max_workers = 10;
        config.streams = vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 100 * MS }];
        Ctx::new(config, Box::new(NullHost::default()))
    }

    #[test]
    fn planned_replicas_follow_the_rate_within_the_bounds() {
        assert_eq!(planned_replicas(&ctx(1, 64), 250.0), Ok(vec![3]));
        // A run started for a rate (the paper's setup, `sim reproduce pard`) plans no
        // headroom unless it is given: 100 req/s, one worker; with 0.2, 120, two.
        assert_eq!(planned_replicas(&ctx(1, 64), 100.0), Ok(vec![1]));
        assert_eq!(planned_replicas(&ctx_with(1, 64, &[("plan_headroom", "0.2")]), 100.0), Ok(vec![2]));
        assert_eq!(planned_replicas(&ctx(2, 64), 10.0), Ok(vec![2]), "at least the minimum");
        assert_eq!(planned_replicas(&ctx(1, 64), 5000.0), Ok(vec![10]), "at most max_workers");
        assert_eq!(planned_replicas(&ctx(1, 4), 5000.0), Ok(vec![4]), "at most the stage's maximum");
    }
}
