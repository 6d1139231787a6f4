//! The Rust SDK for Yardmaster scheduling policies.
//!
//! A policy implements [`Policy`]: one method per event kind, each with a default
//! that does nothing, and each handed a [`Ctx`] through which it reads the cluster,
//! the clock and its parameters and emits actions. [`export_policy!`] turns the type
//! into the component export of the `yardmaster:policy/scheduler@0.1.0` world when
//! compiled for `wasm32-wasip2`; compiled natively, the same type is driven by the
//! host directly through [`Driver`] (for the built-in fallback and for comparing the
//! decision cost of WebAssembly against native code).
//!
//! ```ignore
//! use yardmaster_sdk::{Ctx, Policy, Request};
//!
//! #[derive(Default)]
//! struct Fifo { queue: std::collections::VecDeque<Request> }
//!
//! impl Policy for Fifo {
//!     fn init(_ctx: &mut Ctx) -> Result<Self, String> { Ok(Self::default()) }
//!     fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) { self.queue.push_back(request) }
//! }
//! yardmaster_sdk::export_policy!(Fifo);
//! ```
//!
//! The [`helpers`] module holds the data structures the reference policies share:
//! a double-ended priority queue, sliding windows, EWMAs, streaming quantiles, a
//! PID controller, M/M/c queueing formulas and per-stage FIFO queues.

pub mod bindings;
mod ctx;
mod driver;
mod fit;
pub mod helpers;
mod host;
mod latency;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use ctx::{Ctx, WorkerView};
pub use driver::Driver;
#[cfg(target_arch = "wasm32")]
pub use host::ComponentHost;
pub use host::{splitmix64, Host, NullHost};
pub use latency::{interpolate, most_productive_batch, LatencyTable};

pub use bindings::yardmaster::policy::host::Level;
pub use bindings::yardmaster::policy::types::{
    Action, BatchOutcome, CachedParameters, Config, Correlation, Defer, DeviceKind, Dispatch, DropReason, DropRequest, Duration, EndReason,
    Event, Evict, EvictMode, FrameReport, HostId, HostInfo, HostStats, Instant, LatencyPoint, Param, Placement, Request, RequestId,
    RequestResult, RequestStatus, Route, Scale, SequenceState, SetBatchLimit, SetRoutes, SetThreads, SetTimer, SetVariant, Snapshot, Stage,
    StageId, StageKind, StageStats, Stream, StreamId, Tag, Variant, VariantId, VariantTarget, Worker, WorkerId, WorkerStats,
};

/// A scheduling policy: the host calls one method per event, in the order the events
/// happened, and then [`Policy::on_events_done`] once per delivered batch.
///
/// Every method receives the [`Ctx`]; actions are emitted through it. Each method has
/// a default that does nothing, so a policy implements only the events it cares about.
pub trait Policy: Sized + 'static {
    /// Build the policy from the configuration in `ctx.config()`. An error refuses the
    /// policy with that reason.
    fn init(ctx: &mut Ctx) -> Result<Self, String>;

    /// A request reached a stage queue (or was handed back after a preemption or a defer).
    fn on_arrival(&mut self, _ctx: &mut Ctx, _request: Request) {}

    /// A worker can start work now; `ctx` already counts it as idle. A worker is idle
    /// only from this event until the policy dispatches to it (the host sends one for
    /// every configured worker right after `init`).
    fn on_worker_idle(&mut self, _ctx: &mut Ctx, _worker: WorkerId) {}

    /// A batch finished (the worker's idle event follows separately).
    fn on_batch_done(&mut self, _ctx: &mut Ctx, _outcome: BatchOutcome) {}

    /// A frame boundary on an iteration-level (LLM) worker.
    fn on_frame(&mut self, _ctx: &mut Ctx, _frame: FrameReport) {}

    /// The periodic telemetry snapshot.
    fn on_tick(&mut self, _ctx: &mut Ctx, _snapshot: Snapshot) {}

    /// A timer set with [`Ctx::set_timer`] fired.
    fn on_timer(&mut self, _ctx: &mut Ctx, _token: u64) {}

    /// A worker started and serves now; `ctx` already knows it, and the host sends its
    /// `worker-idle` event next.
    fn on_worker_added(&mut self, _ctx: &mut Ctx, _worker: Worker) {}

    /// A worker was removed; `ctx` has already forgotten it.
    fn on_worker_removed(&mut self, _ctx: &mut Ctx, _worker: WorkerId) {}

    /// The host ended a request the policy was holding: forget it.
    fn on_request_ended(&mut self, _ctx: &mut Ctx, _request: RequestId, _reason: EndReason) {}

    /// Called once after every delivered batch of events: the place to form batches
    /// for idle workers once rather than after each event.
    fn on_events_done(&mut self, _ctx: &mut Ctx) {}
}

/// Export a [`Policy`] type as the component's `yardmaster:policy/policy` interface.
///
/// Expands to nothing when the crate is not compiled for WebAssembly, so the same
/// crate can also be linked natively (the host uses that for its built-in fallback
/// and for benchmarks).
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::bindings::exports::yardmaster::policy::policy::Guest;

            ::std::thread_local! {
                static DRIVER: ::std::cell::RefCell<Option<$crate::Driver<$policy>>> =
                    const { ::std::cell::RefCell::new(None) };
            }

            struct Export;

            impl Guest for Export {
                fn init(config: $crate::Config) -> Result<Vec<$crate::Action>, String> {
                    let host = Box::new($crate::ComponentHost);
                    let (driver, actions) = $crate::Driver::<$policy>::new(config, host)?;
                    DRIVER.with(|slot| *slot.borrow_mut() = Some(driver));
                    Ok(actions)
                }

                fn handle(now: $crate::Instant, events: Vec<$crate::Event>) -> Vec<$crate::Action> {
                    DRIVER.with(|slot| match slot.borrow_mut().as_mut() {
                        Some(driver) => driver.handle(now, events),
                        None => panic!("handle called before init"),
                    })
                }
            }

    $crate::bindings::export_scheduler!(Export with_types_in $crate::bindings);
        };
    };
}
