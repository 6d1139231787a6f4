//! Triton model repositories, read as Triton reads them, for serving the user's own
//! ONNX models (issue 21). This module reads; serving what it returns is the drivers'
//! work (not yet wired).
//!
//! The layout, under each repository directory given:
//!
//! ```text
//! DIR/<model>/config.pbtxt      optional: Triton's model configuration (protobuf text)
//! DIR/<model>/yardmaster.toml   optional: Yardmaster's settings for the model
//! DIR/<model>/<version>/model.onnx
//! ```
//!
//! - [`pbtxt`]: the protobuf text-format reader (`config.pbtxt`'s syntax);
//! - [`config`]: the typed [`ModelConfig`], and its JSON in Triton's
//!   `GET /v2/models/{m}/config` shape;
//! - [`onnx_graph`]: the signature (inputs, outputs, element types, shapes) of an ONNX
//!   file's graph, read with a protobuf decoder of our own (no ONNX Runtime here);
//! - [`autocomplete`]: completing a configuration from that signature as Triton's
//!   auto-complete does, and checking a configuration against it;
//! - [`repository`]: the scan ([`scan`]): models, their served versions after
//!   `version_policy`, and a reason for each model that cannot be served, the rest
//!   still returned.
//!
//! Yardmaster's own settings per model ([`ModelSettings`]): the SLO, in milliseconds,
//! from `parameters { key: "yardmaster.slo_ms" value: { string_value: "250" } }` in
//! `config.pbtxt`, or from `slo_ms = 250` in `yardmaster.toml` beside it (giving it in
//! both is refused); [`DEFAULT_SLO_MS`] (1000 ms) when neither gives one. Any other
//! `yardmaster.*` parameter, or another key in `yardmaster.toml`, is refused so that a
//! misspelled setting does not pass silently.

pub mod autocomplete;
pub mod config;
pub mod config_json;
pub mod onnx_graph;
pub mod pbtxt;
pub mod repository;
pub mod stages;
#[cfg(test)]
mod test_dir;

pub use autocomplete::DEFAULT_MAX_BATCH_SIZE;
pub use config::ModelConfig;
pub use onnx_graph::{graph_signature, read_graph_signature, GraphError, GraphSignature, TensorSignature};
pub use pbtxt::ParseError;
pub use repository::{
    scan, scan_model, scan_model_with, BuiltinProgram, ModelEntry, ModelError, ModelSettings, ModelVersion, Repository, RepositoryError,
    SloSource, DEFAULT_SLO_MS,
};
