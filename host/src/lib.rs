//! Yardmaster: an inference-serving host whose every scheduling decision is made by a
//! sandboxed WebAssembly policy.
//!
//! - [`policy`]: the policy runtime (load, sandbox, call, validate, fall back);
//! - [`conformance`]: the harness that drives any policy through every event kind,
//!   checks its answers and measures its decision cost;
//! - [`engine`]: the scheduling engine, generic over a clock and an executor;
//! - [`metrics`]: the one definition of every metric, and reports;
//! - [`sim`]: the discrete-event simulator;
//! - [`serve`]: the live server (KServe v2 over HTTP/1.1 and HTTP/3, the ONNX Runtime
//!   executor, inter-node QUIC, metrics, trace capture, hot swap and the admin API);
//! - [`bench`](mod@bench): decision cost of a policy as a component against the same code native.

#![warn(missing_docs)]

pub mod bench;
pub mod conformance;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod policy;
pub mod serve;
pub mod sim;
