//! The live server. The client API speaks the KServe v2 / Open Inference Protocol
//! ([`kserve`] is the codec, [`api`] the routes) over HTTP/1.1 ([`http1`]) and HTTP/3
//! ([`http3`], TLS from [`tls`]). [`actor`] runs the engine on a thread of its own and
//! is how everything else reaches it.

pub mod actor;
pub mod api;
pub mod client;
pub mod http1;
pub mod http3;
pub mod kserve;
pub mod load;
pub mod prometheus;
pub mod remote;
pub mod tls;
pub mod workers;
