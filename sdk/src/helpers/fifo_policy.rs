//! A whole autoscaling policy from a scaling rule: [`ScaledFifo`] serves every
//! stage from a [`StageFifo`] (arrival order, first idle worker, nothing dropped)
//! and leaves to a [`ScalingRule`] only when and how far to scale.
//!
//! The baselines of the QUART reproduction (fixed replicas, reactive queue length,
//! uniform QPS) are each a rule, so they move requests through the pipeline exactly
//! alike and differ only in their replica counts.

use crate::helpers::StageFifo;
use crate::{BatchOutcome, Ctx, EndReason, Policy, Request, RequestId, Snapshot, WorkerId};

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

impl<R: ScalingRule> Policy for ScaledFifo<R> {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        Ok(Self { rule: R::init(ctx)?, fifo: StageFifo::new() })
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
