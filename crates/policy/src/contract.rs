//! The host side of the `yardmaster:policy@0.1.0` contract, generated from `wit/`.
//!
//! These generated types are the host's vocabulary for events and actions. A later
//! `0.2` contract gets a module of its own next to this one plus an adapter that
//! converts between them, so components built against `0.1` keep loading.
#![allow(missing_docs)] // the bindings wasmtime generates from the WIT carry the WIT's own docs only

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "yardmaster:policy/scheduler@0.1.0",
    imports: { default: trappable },
    additional_derives: [PartialEq],
});

pub use self::yardmaster::policy::host::Level;
pub use self::yardmaster::policy::types::*;

/// The version of the contract this host implements natively.
pub const CONTRACT_VERSION: &str = "0.1.0";

/// The interfaces of the world a policy may import (without their version).
pub const WORLD_IMPORTS: &[&str] = &["yardmaster:policy/types", "yardmaster:policy/host"];

impl Event {
    /// A short name of the event's kind, for metrics and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Arrival(_) => "arrival",
            Event::WorkerIdle(_) => "worker-idle",
            Event::BatchDone(_) => "batch-done",
            Event::Frame(_) => "frame",
            Event::Tick(_) => "tick",
            Event::Timer(_) => "timer",
            Event::WorkerAdded(_) => "worker-added",
            Event::WorkerRemoved(_) => "worker-removed",
            Event::RequestEnded(_) => "request-ended",
        }
    }
}

impl Action {
    /// A short name of the action's kind, for metrics and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Drop(_) => "drop",
            Action::Dispatch(_) => "dispatch",
            Action::Preempt(_) => "preempt",
            Action::Evict(_) => "evict",
            Action::Scale(_) => "scale",
            Action::SetVariant(_) => "set-variant",
            Action::SetRoutes(_) => "set-routes",
            Action::SetBatchLimit(_) => "set-batch-limit",
            Action::SetThreads(_) => "set-threads",
            Action::Defer(_) => "defer",
            Action::SetTimer(_) => "set-timer",
        }
    }
}
