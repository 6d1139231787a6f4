//! End-to-end tests across the Yardmaster crates: policies on the real runtime, engine and simulator.
//!
//! One test binary for the crate (each module was a test binary of its own): a test
//! run links the crate's dependencies once.

mod architecture;
mod conformance;
mod containment;
mod dataplane_profile;
mod decision_cost;
mod every_policy;
mod languages;
mod loading;
mod loki_planner;
mod loki_sim;
mod native_vs_wasm;
mod no_cliff;
mod pard;
mod random_apps;
mod random_apps_calm;
mod random_apps_flex;
mod random_apps_loki;
mod random_apps_pard;
mod random_apps_quart;
mod sandbox_escape;
mod simulator;
mod validation;
