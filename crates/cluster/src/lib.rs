//! The cluster: every `yardmaster node` a host of the engine's, reached over QUIC.
//!
//! A controller (the host running the engine) reaches the workers of another host — a
//! `yardmaster node` ([`node`]) — through a [`pool::RemotePool`], a
//! [`workers::Workers`] like the local pool, so the engine sees remote workers
//! like local ones. A request's tensors cross on QUIC streams in the compact binary
//! framing of [`framing`]; [`transport`] holds the QUIC settings, certificate pinning
//! and frame I/O both sides share.
//!
//! **Stream layout** (one QUIC connection per controller and node):
//!
//! - *Hello stream*: the first bidirectional stream, opened by the controller. It sends
//!   `Hello` (the catalogue, with the node's model paths, and the worker threads) and
//!   finishes; the node answers `Welcome` (its device) or `Refused` (why, e.g. which
//!   model files it lacks). Nothing else travels on it.
//! - *Worker streams*: one bidirectional stream per worker, opened by the controller at
//!   the worker's first provision. Controller → node: that worker's commands
//!   (`Provision`, `Start` with the job's input tensors, `Abort`, `Retire`,
//!   `SetThreads`, `SetVariant`); node → controller: that worker's events (`Ready`,
//!   `Finished` with the outputs' tensors, `Aborted`, …). After `Retired` the
//!   controller finishes its side and the node finishes its own; a later provision of
//!   the same id opens a new stream.
//!
//! Why per worker: the executor relies on a worker's commands and events keeping
//! their order (an abort after its job, `Ready` before `Finished`), and one stream
//! keeps it without sequence numbers; a worker runs one job at a time, so nothing is
//! gained by more streams per worker; and separate streams mean one worker's large
//! tensors never hold up another worker's commands (QUIC has no head-of-line blocking
//! across streams).
//!
//! `docs/internode.md` has the framing table, the TLS pinning and the failure
//! semantics.

mod decoder_host;
pub mod decoder_thread;
pub mod discovery;
pub mod framing;
pub mod node;
pub mod pool;
pub mod tls;
pub mod transport;
pub mod workers;
