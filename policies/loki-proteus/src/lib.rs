//! `loki-proteus`: the Proteus-like baseline of the Loki paper — accuracy scaling
//! task by task on each task's measured demand, an equal share of the SLO per task,
//! every worker always on, routing in proportion to planned load and per-task early
//! dropping.

/// The Proteus-like policy.
pub type LokiProteus = loki_core::LokiPolicy<loki_core::ProteusFlavour>;

yardmaster_sdk::export_policy!(LokiProteus);
