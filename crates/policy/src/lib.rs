//! The policy runtime: everything between a policy `.wasm` and the scheduling engine.
//!
//! - [`contract`]: the host side of the WIT contract: the latest version's types, one
//!   bindings module per supported version, and the versions the host accepts;
//! - [`abi`]: the canonical-ABI layout of the hot event and action records (tested
//!   against the WIT);
//! - [`sandbox`]: the wasmtime engine, its modes (epoch deadlines when serving, fuel
//!   when simulating) and limits;
//! - [`loader`]: SHA-256, the contract version and import checks, compilation and its cache;
//! - [`instance`]: a running component, its host imports, fault classification;
//! - [`fast_events`]: the fast lowering of the hot events into a policy's memory;
//! - [`fast_actions`]: the fast lifting of the hot actions out of it;
//! - [`native`]: SDK policies compiled into the host (the built-in fallback);
//! - [`validate`]: checking actions against the host's truth;
//! - [`arm`]: one live policy with its held requests and its failure mode;
//! - [`shadow`]: a candidate policy fed the live events, its answers checked, never applied.

pub mod abi;
pub mod arm;
pub mod contract;
pub mod fast_actions;
pub mod fast_events;
pub mod instance;
pub mod loader;
pub mod native;
pub mod sandbox;
pub mod shadow;
pub mod validate;

pub use arm::{
    Arm, ArmOutput, ArmState, ArmStats, Candidate, EmittedMetric, FailureMode, Handover, HandoverSnapshot, SwapPauses, SwapReport,
    PLAN_INFEASIBLE_METRIC,
};
pub use instance::{CallCost, PolicyFault, PolicyInstance, ProfileSource, WasmPolicy};
pub use loader::{LoadError, PolicyLoader, PolicyModule};
pub use native::NativePolicy;
pub use sandbox::{CallKind, Limits, Mode, Sandbox};
pub use shadow::{Shadow, ShadowReport};
pub use validate::{ClusterView, HostSlots, Ledger, LedgerChanges, LedgerSnapshot, Rejection, SequenceState, StageState, WorkerState};
