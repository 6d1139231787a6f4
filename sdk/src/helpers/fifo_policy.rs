//! A whole autoscaling policy from a scaling rule: [`ScaledFifo`] serves every
//! stage from a [`StageFifo`] (arrival order, first idle worker, nothing dropped)
//! and leaves to a [`ScalingRule`] only when and how far to scale.
//!
//! The baselines of the QUART reproduction (fixed replicas, reactive queue length,
//! uniform QPS) are each a rule, so they move requests through the pipeline exactly
//! alike and differ only in their replica counts.

use crate::helpers::{StageFifo, StageGraph};
use crate::{BatchOutcome, Ctx, Duration, EndReason, Policy, Request, RequestId, Snapshot, StageId, WorkerId};

/// What an autoscaler over per-stage FIFO queues decides: the replicas of each stage.
pub trait ScalingRule: Sized + 'static {
    /// Build the rule from the configuration (it may scale stages at once).
    fn init(ctx: &mut Ctx) -> Result<Self, String>;

    /// A request reached its stage; called before it is queued. Nothing by default.
    fn arrival(&mut self, _ctx: &Ctx, _request: &Request) {}

    /// The periodic tick, with the queues (which measure queue lengths) at hand.
    /// Nothing by default.
    fn tick(&mut self, _ctx: &mut Ctx, _fifo: &mut StageFifo, _snapshot: &Snapshot) {}
}

/// A [`Policy`] made of a [`ScalingRule`] and FIFO queues per stage.
#[derive(Debug)]
pub struct ScaledFifo<R> {
    fifo: StageFifo,
    rule: R,
}

impl<R> ScaledFifo<R> {
    /// The rule.
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// The queues.
    pub fn fifo(&self) -> &StageFifo {
        &self.fifo
    }
}

/// Cap each stage's batch limit at the batch (of variant 0) that serves the most
/// requests per second within half of what the tightest SLO leaves the stage beyond
/// the other stages of the longest path through it, each at one request (half: a wait
/// for a batch and the batch itself); a stage without a profile, or with no SLO, keeps
/// its limit.
///
/// A FIFO worker takes every request waiting, up to the limit. A pipeline's configured
/// limit may be the largest profiled batch (Loki's applications: 64 frames, 1–2 s at a
/// detector), and on a profile whose throughput falls past a sweet spot (Loki's
/// `yolov5n`: 176 frames/s in batches of 3, 69 in batches of 16) a queue that grows
/// makes the batches larger and the stage slower, until the queue holds every request
/// (issue 43: QUART's baselines under 30 % on time at half the capacity bound on
/// `r04`, `r11`, `r16`, `r17`, `r18`, `r20`). Each stage's share of the SLO along its
/// path (in proportion to its time for one request) was tried first: its batches were
/// too small on `r18` and `r19`, whose started workers then could not carry half the
/// bound (2 % on time).
pub fn fit_batch_limits_to_the_slo(ctx: &mut Ctx) {
    let config = ctx.config();
    let Some(slo) = config.streams.iter().map(|s| s.slo).filter(|&slo| slo > 0).min() else { return };
    let graph = StageGraph::new(&config.stages);
    let ones: Vec<f64> = (0..graph.len() as StageId).map(|s| ctx.latency().mean(s, 0, 1).map_or(0.0, |ns| ns as f64)).collect();
    let one = |s: StageId| ones.get(s as usize).copied().unwrap_or(0.0);
    let stages: Vec<(StageId, u32)> = config.stages.iter().map(|s| (s.id, s.max_batch.max(1))).collect();
    for (stage, max_batch) in stages {
        if ctx.latency().mean(stage, 0, 1).is_none() {
            continue;
        }
        let others = graph.longest_path_through(stage, one) - one(stage);
        let budget = ((slo as f64 - others).max(0.0) / 2.0) as Duration;
        let limit = ctx.batch_limit(stage).min(max_batch);
        let fitted = ctx.latency().most_productive_batch_within(stage, 0, budget, limit).max(1);
        if fitted < limit {
            ctx.set_batch_limit(stage, fitted);
        }
    }
}

impl<R: ScalingRule> Policy for ScaledFifo<R> {
    /// The rule, and with the `fit_batches` parameter (true by default) batch limits
    /// fitted to the SLO ([`fit_batch_limits_to_the_slo`]; `false` keeps the
    /// pipeline's).
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let rule = R::init(ctx)?;
        if ctx.param_or("fit_batches", true)? {
            fit_batch_limits_to_the_slo(ctx);
        }
        Ok(Self { rule, fifo: StageFifo::new() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        self.rule.arrival(ctx, &request);
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

    fn on_tick(&mut self, ctx: &mut Ctx, snapshot: Snapshot) {
        self.rule.tick(ctx, &mut self.fifo, &snapshot);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.fifo.dispatch_idle(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{constant_variant, one_stage, request, MS};
    use crate::{Action, Driver, Event, NullHost};

    /// Counts arrivals and scales stage 0 to the count at each tick.
    struct Counting(u32);

    impl ScalingRule for Counting {
        fn init(_ctx: &mut Ctx) -> Result<Self, String> {
            Ok(Self(0))
        }

        fn arrival(&mut self, _ctx: &Ctx, _request: &Request) {
            self.0 += 1;
        }

        fn tick(&mut self, ctx: &mut Ctx, fifo: &mut StageFifo, _snapshot: &Snapshot) {
            assert_eq!(fifo.len(0), 1, "one request still waits");
            ctx.scale(0, self.0, None);
        }
    }

    #[test]
    fn requests_run_in_arrival_order_and_the_rule_sees_arrivals_and_ticks() {
        let config = one_stage(vec![constant_variant(20 * MS)], 1, 1);
        let (mut driver, _) = Driver::<ScaledFifo<Counting>>::new(config, Box::new(NullHost::new(0, 1))).unwrap();
        let arrivals = (1..=2).map(|id| Event::Arrival(request(id, 0, 0, 100 * MS)));
        let actions = driver.handle(0, arrivals.chain([Event::WorkerIdle(0)]).collect());
        assert!(matches!(&actions[..], [Action::Dispatch(d)] if d.requests == vec![1]), "{actions:?}");
        let tick = Snapshot { at: MS, stages: vec![], workers: vec![], host_memory_used: 0, host_memory_capacity: 0, hosts: Vec::new() };
        let actions = driver.handle(MS, vec![Event::Tick(tick)]);
        assert!(matches!(&actions[..], [Action::Scale(s)] if s.stage == 0 && s.replicas == 2), "{actions:?}");
        assert_eq!(driver.policy().rule().0, 2);
    }
}
