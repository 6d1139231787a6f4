//! End-to-end tests of the `yardmaster` command and server: real ONNX Runtime, real clients, the built binary.
//!
//! One test binary for the crate (each module was a test binary of its own): a test
//! run links the crate's dependencies once.

mod cluster_dns;
mod cluster_quart;
mod command_line;
#[path = "../../../dataplane/tests/all/common/mod.rs"]
mod common;
mod fuzz_corpus;
mod node_process;
mod onnx_graph;
mod policy_new;
mod repository_check;
mod serve_ab;
mod serve_batches;
mod serve_builtin;
mod serve_classification;
mod serve_compression;
mod serve_decoupled;
mod serve_end_to_end;
mod serve_executor;
mod serve_faults;
mod serve_grpc;
mod serve_hostile;
mod serve_llm;
mod serve_llm_http;
mod serve_logging;
mod serve_model_control;
mod serve_overload;
mod serve_policies;
mod serve_prometheus;
mod serve_remote;
mod serve_repository;
mod serve_sequences;
mod serve_shared_memory;
mod serve_swap;
mod serve_trace;
mod serve_transports;
mod serve_typed;
mod serve_wheel_models;
mod sim_sweep;
