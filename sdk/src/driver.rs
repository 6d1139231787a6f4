//! Drives a [`Policy`] from batches of events: the glue between the contract's two
//! exports and the trait's per-event methods. Used by the component export and, natively,
//! by the host.

use crate::{Action, Config, Ctx, Event, Host, Instant, Policy};

/// A started policy with its context.
pub struct Driver<P: Policy> {
    policy: P,
    ctx: Ctx,
}

impl<P: Policy> Driver<P> {
    /// Start `P` on `config`; returns the driver and the actions `init` emitted.
    pub fn new(config: Config, host: Box<dyn Host + Send>) -> Result<(Self, Vec<Action>), String> {
        let now = config.now;
        let mut ctx = Ctx::new(config, host);
        ctx.set_now(now);
        let policy = P::init(&mut ctx)?;
        let actions = ctx.take_actions();
        Ok((Self { policy, ctx }, actions))
    }

    /// Deliver one batch of events that happened up to `now` and collect the actions.
    pub fn handle(&mut self, now: Instant, events: Vec<Event>) -> Vec<Action> {
        let (policy, ctx) = (&mut self.policy, &mut self.ctx);
        ctx.set_now(now);
        // Requests a dispatch withheld last call (they did not fit) come back first.
        for request in ctx.constraints().take_next_call() {
            ctx.constraints().arrived(&request);
            policy.on_arrival(ctx, request);
        }
        // Workers whose dispatch the guard emptied are idle still: the policy hears so.
        for worker in ctx.constraints().take_idle_again() {
            if ctx.worker(worker).is_some_and(|w| w.idle) {
                policy.on_worker_idle(ctx, worker);
            }
        }
        for event in events {
            match event {
                Event::Arrival(request) => {
                    ctx.constraints().arrived(&request);
                    policy.on_arrival(ctx, request)
                }
                Event::WorkerIdle(worker) => {
                    ctx.mark_idle(worker);
                    // The next run of a dispatch over the limit starts first; the
                    // policy hears the worker is idle after the last.
                    if let Some((run, variant)) = ctx.constraints().next_run(worker) {
                        ctx.push_dispatch(worker, run, variant);
                        continue;
                    }
                    // Sequence steps withheld until their worker was idle come back now.
                    for request in ctx.constraints().take_when_idle(worker) {
                        ctx.constraints().arrived(&request);
                        policy.on_arrival(ctx, request);
                    }
                    policy.on_worker_idle(ctx, worker)
                }
                Event::BatchDone(outcome) => policy.on_batch_done(ctx, outcome),
                Event::Frame(frame) => {
                    ctx.record_frame(&frame);
                    policy.on_frame(ctx, frame)
                }
                Event::Tick(snapshot) => {
                    ctx.follow_batch_limits(&snapshot);
                    policy.on_tick(ctx, snapshot)
                }
                Event::Timer(token) => policy.on_timer(ctx, token),
                Event::WorkerAdded(worker) => {
                    ctx.add_worker(worker);
                    policy.on_worker_added(ctx, worker)
                }
                Event::WorkerRemoved(worker) => {
                    ctx.remove_worker(worker);
                    policy.on_worker_removed(ctx, worker)
                }
                Event::RequestEnded((request, reason)) => {
                    ctx.constraints().ended(request);
                    ctx.forget_sequence(request);
                    policy.on_request_ended(ctx, request, reason)
                }
            }
        }
        policy.on_events_done(ctx);
        ctx.take_actions()
    }

    /// The policy itself (for native tests).
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The context (for native tests).
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }
}
