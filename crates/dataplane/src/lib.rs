//! ONNX Runtime workers for Yardmaster: sessions per (model, variant), batch
//! execution with abort, devices (CUDA when present, CPU otherwise), the host-memory
//! model cache, the latency profiler, and the default PP-OCR text pipeline.
//!
//! ONNX Runtime is loaded at run time from the library that `scripts/setup.sh` takes out
//! of the `onnxruntime` wheel on PyPI ([`assets`]); nothing is downloaded at build time.
//! The crate knows nothing of the engine: [`worker::Worker`] is the shape the server's
//! engine executor drives (start a job, abort, provision warm or cold, retire, set
//! threads, change variant).

#![warn(missing_docs)]

pub mod assets;
pub mod batch;
pub mod bench;
pub mod cache;
pub mod device;
#[cfg(feature = "cuda")]
mod device_batch;
pub mod error;
pub mod events;
pub mod llm;
pub mod ocr;
pub mod parallel;
pub mod pool;
pub mod profile;
pub mod proto;
pub mod runtime;
pub mod sequence;
pub mod session;
pub mod tensor;
pub mod worker;

pub use batch::InputSpec;
pub use cache::{CacheConfig, ModelCache, ModelKey};
pub use device::{Device, DevicePreference};
pub use error::{DataplaneError, Result};
pub use events::{EventHandler, EventSink};
pub use pool::{ModelCatalog, WorkerPool};
pub use runtime::{Runtime, RuntimeConfig};
pub use sequence::{SequenceSpec, SequenceStep};
pub use session::{BatchTiming, ModelSession, ModelSpec, StartKind, WarmUp, WarmUpData, WarmUpInput};
pub use tensor::{Element, ElementType, Elements, SharedBytes, Tensor, TensorData};
pub use worker::{Job, JobTiming, Request, RequestOutput, Worker, WorkerContext, WorkerEvent};
