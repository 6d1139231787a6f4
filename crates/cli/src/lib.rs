//! Yardmaster: an inference-serving host whose every scheduling decision is made by a
//! sandboxed WebAssembly policy.
//!
//! This crate is the `yardmaster` command line. Its library re-exports the crates the
//! command is made of, one per part of the architecture (see the README's layout):
//!
//! - [`policy`]: the policy runtime (contract, load, sandbox, call, validate, fall back);
//! - [`engine`]: the scheduling engine, generic over a clock and an executor, and the
//!   one definition of every metric ([`engine::metrics`]);
//! - [`formats`]: pipelines, presets, traces and workloads, read and written by both drivers;
//! - [`sim`]: the discrete-event simulator, its reports and the papers' reproductions;
//! - [`serve`]: the live server (KServe v2 over HTTP/1.1 and HTTP/3, the ONNX Runtime
//!   executor, metrics, trace capture, hot swap and the admin API);
//! - [`cluster`]: nodes as hosts: the inter-node QUIC transport, `yardmaster node`,
//!   discovery and cluster certificates;
//! - [`conformance`]: `policy check` on the real engine, and decision-cost benchmarks;
//! - [`dataplane`]: ONNX Runtime workers.

#![warn(missing_docs)]

pub use yardmaster_cluster as cluster;
pub use yardmaster_conformance as conformance;
pub use yardmaster_dataplane as dataplane;
pub use yardmaster_engine as engine;
pub use yardmaster_formats as formats;
pub use yardmaster_policy as policy;
pub use yardmaster_serve as serve;
pub use yardmaster_sim as sim;

#[doc(hidden)]
pub mod fuzzing;
