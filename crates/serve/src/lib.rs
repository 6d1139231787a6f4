//! The live server. The client API speaks the KServe v2 / Open Inference Protocol
//! ([`kserve`] is the codec, [`api`] the routes) over HTTP/1.1 ([`http1`]), HTTP/3
//! ([`http3`], TLS from [`tls`]) and gRPC ([`grpc`]). [`actor`] runs the engine on a thread of its own and
//! is how everything else reaches it. [`stack`] builds the serving stack: the engine
//! actor with the ONNX Runtime [`executor`] (stage [`stages`] programs around the
//! models, request data in the [`payload`] store, workers behind [`workers`], stalled
//! jobs caught by the [`watchdog`]) and the
//! KServe [`backend`] the client API answers with. [`config`] is the server's
//! configuration file, [`listeners`] brings the transports up, [`capture`] writes
//! live traffic as a simulator trace, [`prometheus`] renders `/metrics`, and
//! [`client`] and [`load`] are the project's own client and load generator. [`swap`]
//! swaps the policy on the running engine, triggered by the [`admin`] API and the
//! [`watch`]ed directory. A served Triton model [`repository`] loads and unloads
//! models while serving through [`model_control`].

pub mod ab;
pub mod actor;
pub mod admin;
pub mod api;
pub mod backend;
pub mod bench;
pub mod builtin_repository;
pub mod capture;
pub mod classification;
pub mod client;
pub mod compression;
pub mod config;
pub mod decoupled;
pub mod executor;
pub mod grpc;
pub mod http1;
pub mod http3;
pub mod kserve;
pub mod listeners;
pub mod llm;
pub mod load;
pub mod logging;
pub mod membership;
pub mod model_control;
pub mod payload;
pub mod prometheus;
/// The inter-node transport, now its own crate (`yardmaster-cluster`).
pub use yardmaster_cluster as remote;
pub mod repository;
pub mod sequences;
pub mod served_config;
pub mod server;
pub mod shared_memory;
pub mod stack;
pub mod stages;
pub mod starts;
pub mod swap;
pub mod tensor_codec;
pub mod tiny_model;
pub mod trace;
pub use yardmaster_cluster::tls;
pub mod watch;
pub mod watchdog;
pub mod worker_events;
pub mod workers;
