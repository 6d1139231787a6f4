//! Sessions per (model, variant): how one is built — cold from the model file, or warm
//! from the parameter cache — and how it runs a batch of per-request tensors.
//!
//! A cold start reads the file, lets ONNX Runtime optimise the graph (all levels) and
//! keeps the optimised graph in the [`ModelCache`]; a warm start builds the session from
//! those bytes with optimisation off, so it skips both the disk and the optimiser.
//! ONNX Runtime fixes a session's intra-op thread count when the session is built, so a
//! new thread count means a new session — a warm start from the cache.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::{RunOptions, Session};
use ort::value::{TensorRef, ValueType};

use crate::batch::{self, InputSpec};
use crate::cache::{CacheKey, CachedModel, ModelCache, ModelKey};
use crate::device::Device;
use crate::error::{DataplaneError, Result};
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// A model variant and the file it loads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Its name.
    pub key: ModelKey,
    /// The `.onnx` file.
    pub path: PathBuf,
}

impl ModelSpec {
    /// A spec from a name and a file.
    pub fn new(key: ModelKey, path: impl Into<PathBuf>) -> Self {
        ModelSpec { key, path: path.into() }
    }
}

/// How a session was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    /// From the file on disk, with graph optimisation.
    Cold,
    /// From the optimised graph in the host-memory cache.
    Warm,
}

/// A loaded session of one model variant on one device.
pub struct ModelSession {
    session: Session,
    spec: ModelSpec,
    inputs: Vec<InputSpec>,
    outputs: Vec<String>,
    threads: usize,
    device: Device,
    /// Fill value for padded batch elements.
    pub pad_value: f32,
}

impl std::fmt::Debug for ModelSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSession").field("model", &self.spec.key).field("threads", &self.threads).field("device", &self.device).finish()
    }
}

/// A session, how it started and how long that took.
#[derive(Debug)]
pub struct Started {
    /// The session.
    pub session: ModelSession,
    /// Cold or warm.
    pub kind: StartKind,
    /// Wall time of the start.
    pub took: Duration,
}

impl ModelSession {
    /// Start a session of `spec` with `threads` intra-op threads (0: ONNX Runtime's
    /// default): warm when the cache holds the model for this device, cold otherwise
    /// (and the cold start fills the cache).
    pub fn start(runtime: &Runtime, cache: &ModelCache, spec: &ModelSpec, threads: usize) -> Result<Started> {
        let begin = Instant::now();
        let key = CacheKey { model: spec.key.clone(), device: runtime.device() };
        let (session, kind) = match cache.get(&key) {
            Some(cached) => (Self::from_cache(runtime, spec, &cached, threads)?, StartKind::Warm),
            None => (Self::cold(runtime, cache, key, spec, threads)?, StartKind::Cold),
        };
        Ok(Started { session, kind, took: begin.elapsed() })
    }

    /// Start from the file, bypassing the cache entirely (neither reads nor fills it).
    pub fn from_file(runtime: &Runtime, spec: &ModelSpec, threads: usize) -> Result<ModelSession> {
        let bytes = read(&spec.path)?;
        let mut builder = builder(runtime, threads, GraphOptimizationLevel::All)?;
        let session = builder.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?;
        Self::wrap(session, spec, threads, runtime.device())
    }

    fn cold(runtime: &Runtime, cache: &ModelCache, key: CacheKey, spec: &ModelSpec, threads: usize) -> Result<ModelSession> {
        let bytes = read(&spec.path)?;
        static COLD_STARTS: AtomicU64 = AtomicU64::new(0);
        let optimized_path = std::env::temp_dir().join(format!(
            "yardmaster-optimized-{}-{}-{}.onnx",
            std::process::id(),
            COLD_STARTS.fetch_add(1, Ordering::Relaxed),
            sanitize(&spec.key.to_string())
        ));
        // ONNX Runtime warns that a graph saved after layout optimisation is tied to this
        // machine; the cache lives in this process only, so that is what is wanted.
        let mut builder = builder(runtime, threads, GraphOptimizationLevel::All)?
            .with_optimized_model_path(&optimized_path)
            .map_err(DataplaneError::ort)?
            .with_log_level(ort::logging::LogLevel::Error)
            .map_err(DataplaneError::ort)?;
        let session = builder.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?;
        let cached = match std::fs::read(&optimized_path) {
            Ok(optimized) => CachedModel { bytes: optimized.into(), optimized: true },
            Err(_) => CachedModel { bytes: bytes.into(), optimized: false },
        };
        let _ = std::fs::remove_file(&optimized_path);
        cache.insert(key, cached);
        Self::wrap(session, spec, threads, runtime.device())
    }

    fn from_cache(runtime: &Runtime, spec: &ModelSpec, cached: &Arc<CachedModel>, threads: usize) -> Result<ModelSession> {
        let level = if cached.optimized { GraphOptimizationLevel::Disable } else { GraphOptimizationLevel::All };
        let mut builder = builder(runtime, threads, level)?;
        let session = builder.commit_from_memory(&cached.bytes).map_err(|e| load_error(spec, e))?;
        Self::wrap(session, spec, threads, runtime.device())
    }

    fn wrap(session: Session, spec: &ModelSpec, threads: usize, device: Device) -> Result<ModelSession> {
        let mut inputs = Vec::new();
        for input in session.inputs() {
            match input.dtype() {
                ValueType::Tensor { ty: ort::value::TensorElementType::Float32, shape, .. } => inputs.push(InputSpec {
                    name: input.name().to_string(),
                    dims: shape.iter().map(|&d| if d < 0 { None } else { Some(d as usize) }).collect(),
                }),
                other => {
                    return Err(DataplaneError::Invalid(format!(
                        "model {}: input {:?} is {other:?}; the data plane feeds float32 tensors only",
                        spec.key,
                        input.name()
                    )))
                }
            }
        }
        let outputs = session.outputs().iter().map(|o| o.name().to_string()).collect();
        Ok(ModelSession { session, spec: spec.clone(), inputs, outputs, threads, device, pad_value: 0.0 })
    }

    /// The model's inputs (batch dimension first).
    pub fn inputs(&self) -> &[InputSpec] {
        &self.inputs
    }

    /// The model's output names.
    pub fn outputs(&self) -> &[String] {
        &self.outputs
    }

    /// What was loaded.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Intra-op threads it was built with (0: ONNX Runtime's default).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Where it runs.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A custom metadata value of the model (e.g. the recogniser's `character` list).
    pub fn custom_metadata(&self, key: &str) -> Result<Option<String>> {
        Ok(self.session.metadata().map_err(DataplaneError::ort)?.custom(key))
    }

    /// Run already-batched inputs (one tensor per model input), returning every output.
    /// With `options`, the run stops early when they are terminated
    /// ([`DataplaneError::Aborted`]).
    pub fn run(&mut self, inputs: &[Tensor], options: Option<&RunOptions>) -> Result<Vec<Tensor>> {
        self.run_with(inputs, options, |shape, data| Ok(Tensor { shape: shape.to_vec(), data: data.to_vec() }))
    }

    /// Run a batch of requests (each one tensor per input, without batch dimension):
    /// stack, run, split. Returns each request's outputs, in order.
    pub fn run_batch(&mut self, requests: &[&[Tensor]], options: Option<&RunOptions>) -> Result<Vec<Vec<Tensor>>> {
        let stacked = batch::stack(&self.inputs, requests, self.pad_value)?;
        let n = stacked.batch;
        // Split straight from ONNX Runtime's output buffers (one copy per request).
        let per_output = self.run_with(&stacked.inputs, options, |shape, data| batch::split_slice(shape, data, n))?;
        let mut per_request: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::with_capacity(per_output.len())).collect();
        for output in per_output {
            for (request, tensor) in per_request.iter_mut().zip(output) {
                request.push(tensor);
            }
        }
        Ok(per_request)
    }

    fn run_with<T>(
        &mut self,
        inputs: &[Tensor],
        options: Option<&RunOptions>,
        mut take: impl FnMut(&[usize], &[f32]) -> Result<T>,
    ) -> Result<Vec<T>> {
        if inputs.len() != self.inputs.len() {
            return Err(DataplaneError::Invalid(format!("{} inputs given, the model takes {}", inputs.len(), self.inputs.len())));
        }
        let mut values = Vec::with_capacity(inputs.len());
        for (spec, tensor) in self.inputs.iter().zip(inputs) {
            let value = TensorRef::from_array_view((tensor.shape.clone(), tensor.data.as_slice())).map_err(DataplaneError::ort)?;
            values.push((spec.name.as_str(), value));
        }
        let result = match options {
            Some(options) => self.session.run_with_options(values, options),
            None => self.session.run(values),
        };
        let outputs = match result {
            Ok(outputs) => outputs,
            Err(error) if error.to_string().contains("terminate") => return Err(DataplaneError::Aborted),
            Err(error) => return Err(DataplaneError::ort(error)),
        };
        let mut taken = Vec::with_capacity(self.outputs.len());
        for name in &self.outputs {
            let value = outputs.get(name).ok_or_else(|| DataplaneError::Ort(format!("output {name:?} missing")))?;
            let (shape, data) = value.try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            taken.push(take(&shape, data)?);
        }
        Ok(taken)
    }
}

fn builder(runtime: &Runtime, threads: usize, level: GraphOptimizationLevel) -> Result<SessionBuilder> {
    let mut builder = Session::builder(runtime.environment())
        .map_err(DataplaneError::ort)?
        .with_optimization_level(level)
        .map_err(DataplaneError::ort)?;
    if threads > 0 {
        builder = builder.with_intra_threads(threads).map_err(DataplaneError::ort)?;
    }
    register_device(builder, runtime.device())
}

/// Add the execution provider of `device` to a session being built (nothing for the
/// CPU, and nothing in a build without the `cuda` feature).
#[cfg(feature = "cuda")]
pub(crate) fn register_device(builder: SessionBuilder, device: Device) -> Result<SessionBuilder> {
    match device {
        Device::Cpu => Ok(builder),
        Device::Cuda(ordinal) => builder
            .with_execution_providers([ort::ep::CUDA::default().with_device_id(ordinal as i32).build().error_on_failure()])
            .map_err(DataplaneError::ort),
    }
}

/// Add the execution provider of `device` (the CPU's: nothing to add).
#[cfg(not(feature = "cuda"))]
pub(crate) fn register_device(builder: SessionBuilder, _device: Device) -> Result<SessionBuilder> {
    Ok(builder)
}

fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| DataplaneError::Io { path: path.to_path_buf(), message: e.to_string() })
}

fn load_error(spec: &ModelSpec, error: ort::Error) -> DataplaneError {
    DataplaneError::Ort(format!("loading {} from {}: {error}", spec.key, spec.path.display()))
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}
