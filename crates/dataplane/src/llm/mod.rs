//! Iteration-level (LLM) execution: a small decoder-only transformer run step by step
//! by ONNX Runtime with a KV cache.
//!
//! - [`model`] writes the decoder as an ONNX file (random weights from a fixed seed),
//!   with `past`/`present` key and value tensors per layer.
//! - [`cache`] is one sequence's KV cache in host memory.
//! - [`session`] runs frames: a prefill or resume step, then decode steps, over a batch
//!   of sequences of different lengths (padded and masked), choosing tokens greedily.
//! - [`worker`] keeps the caches of a worker's sequences between frames and evicts
//!   them (recompute: drop; swap: keep aside).

pub mod cache;
pub mod model;
pub mod session;
pub mod worker;

pub use cache::SequenceCache;
pub use model::{tiny_decoder, DecoderConfig, TINY_DECODER_FILE};
pub use session::{DecoderSession, FrameOutput, FrameRun, FrameSequence, StepTiming};
pub use worker::{DecoderWorker, Eviction, FrameRequest, FrameResult, WorkerFrame};
