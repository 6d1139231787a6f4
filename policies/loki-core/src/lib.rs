//! The Loki family of reference policies (Ahmad, Guan, Sitaraman, HPDC 2024):
//! serving a pipeline of ML tasks with hardware scaling first and accuracy scaling
//! when the cluster runs out, planned by a MILP over the augmented graph of variant
//! paths, routed by MostAccurateFirst and protected by early dropping; and the
//! baselines of its paper (an InferLine-like hardware-only planner and a
//! Proteus-like per-task accuracy scaler), which share the same runtime.
//!
//! The policy crates `policy-loki`, `policy-loki-inferline` and
//! `policy-loki-proteus` each export one [`LokiPolicy`] flavour.

pub mod balancer;
pub mod batching;
pub mod budgets;
pub mod demand;
pub mod model;
pub mod plan;
pub mod planner;
#[cfg(test)]
mod properties;
pub mod proteus;
pub mod runtime;
pub mod settings;
pub mod single_path;
pub mod step2;
pub mod transition;
mod vectors;

pub use runtime::{InferLineFlavour, LokiFlavour, LokiPolicy, ProteusFlavour};
