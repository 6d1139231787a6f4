//! `loki-inferline`: the InferLine-like baseline of the Loki paper — pipeline-aware
//! hardware scaling of the most accurate variants only; past the cluster's capacity
//! it serves the largest fraction of the demand it can and sheds the rest by
//! per-task early dropping (no accuracy scaling, no rerouting).

/// The InferLine-like policy.
pub type LokiInferLine = loki_core::LokiPolicy<loki_core::InferLineFlavour>;

yardmaster_sdk::export_policy!(LokiInferLine);
