//! `loki`: the Loki reference policy (HPDC 2024) — hardware scaling first, then
//! accuracy scaling planned by an in-sandbox MILP over the pipeline's variant paths,
//! MostAccurateFirst routing and early dropping with opportunistic rerouting. The
//! machinery lives in `loki-core`; the early-drop ablations are its `drop_mode`
//! parameter (`none`, `last_task`, `per_task`, `reroute`).

/// The Loki policy.
pub type Loki = loki_core::LokiPolicy<loki_core::LokiFlavour>;

yardmaster_sdk::export_policy!(Loki);
