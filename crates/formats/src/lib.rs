//! The files both drivers read and write, neutral to either: the simulator replays
//! them, the server captures and loads them.
//!
//! - [`rng`]: the seeded random source every generator draws from;
//! - [`workload`]: arrival processes (Poisson, bursty with a target CV, diurnal,
//!   presets, per-second rate files, the Azure LLM trace) and [`workload::Arrival`];
//! - [`rate_series`]: per-second rate series shaped like the Wikipedia, Twitter and
//!   Azure Functions traces, replayed Poisson within each second;
//! - [`sources`]: [`WorkloadSpec`], the one way both drivers name a workload;
//! - [`trace`]: the JSON-lines trace format (written by the server and the simulator,
//!   replayed by either);
//! - [`pipeline`]: pipeline files (our TOML, Loki's application JSON and profiles);
//! - [`presets`]: the built-in pipelines;
//! - [`random_app`]: random applications in Loki's format, of varied shape;
//! - [`model_repository`]: Triton model repositories (`config.pbtxt`, version folders
//!   of ONNX models), read for serving the user's own models.

#![warn(missing_docs)]

pub mod model_repository;
pub mod pipeline;
pub mod presets;
pub mod random_app;
pub mod rate_series;
pub mod rng;
pub mod sources;
pub mod trace;
pub mod workload;

pub use sources::WorkloadSpec;
