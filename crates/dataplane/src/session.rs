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
use ort::session::SessionInputValue;
use ort::session::{RunOptions, Session};
use ort::value::{DynValue, TensorElementType, TensorRef, ValueType};

use crate::batch::{self, InputSpec};
use crate::cache::{CacheKey, CachedModel, ModelCache, ModelKey};
use crate::device::Device;
use crate::error::{DataplaneError, Result};
use crate::runtime::Runtime;
use crate::tensor::{ElementType, Tensor};

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

/// What the host-memory cache keeps for a warm start (`YARDMASTER_WARM_START`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WarmStart {
    /// The graph as ONNX Runtime optimised it for this device: a warm start skips the
    /// optimiser too (`optimized-graph`, the default).
    #[default]
    OptimizedGraph,
    /// The model file's bytes: a warm start skips the disk and optimises again
    /// (`model`).
    Model,
}

impl WarmStart {
    /// `YARDMASTER_WARM_START` (`optimized-graph` or `model`); unset keeps the default,
    /// a bad value is an error naming the variable.
    pub fn from_env() -> std::result::Result<WarmStart, String> {
        match std::env::var("YARDMASTER_WARM_START").ok().filter(|v| !v.is_empty()).as_deref() {
            None | Some("optimized-graph") => Ok(WarmStart::OptimizedGraph),
            Some("model") => Ok(WarmStart::Model),
            Some(other) => Err(format!("YARDMASTER_WARM_START={other:?}: expected optimized-graph or model")),
        }
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
    /// Element type of each input.
    input_types: Vec<ElementType>,
    outputs: Vec<String>,
    /// Element type of each output.
    output_types: Vec<ElementType>,
    threads: usize,
    device: Device,
    /// Fill value for padded batch elements.
    pub pad_value: f32,
    last_timing: BatchTiming,
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
        if runtime.warm_start() == WarmStart::Model {
            let session =
                builder(runtime, threads, GraphOptimizationLevel::All)?.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?;
            cache.insert(key, CachedModel { bytes: bytes.into(), optimized: false });
            return Self::wrap(session, spec, threads, runtime.device());
        }
        static COLD_STARTS: AtomicU64 = AtomicU64::new(0);
        let optimized_path = std::env::temp_dir().join(format!(
            "yardmaster-optimized-{}-{}-{}.onnx",
            std::process::id(),
            COLD_STARTS.fetch_add(1, Ordering::Relaxed),
            sanitize(&spec.key.to_string())
        ));
        // ONNX Runtime warns that a graph saved after layout optimisation is tied to this
        // machine; the cache lives in this process only, so that is what is wanted.
        let mut saving = builder(runtime, threads, GraphOptimizationLevel::All)?
            .with_optimized_model_path(&optimized_path)
            .map_err(DataplaneError::ort)?
            .with_log_level(ort::logging::LogLevel::Error)
            .map_err(DataplaneError::ort)?;
        let session = match saving.commit_from_memory(&bytes) {
            Ok(session) => session,
            // An execution provider may refuse to write its optimised graph (nodes it
            // compiled cannot be saved): start without it, and the cache keeps the file.
            Err(error) => {
                tracing::debug!("model {}: optimised graph not saved ({error}); caching the file instead", spec.key);
                let _ = std::fs::remove_file(&optimized_path);
                builder(runtime, threads, GraphOptimizationLevel::All)?.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?
            }
        };
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
        let mut input_types = Vec::new();
        for input in session.inputs() {
            let ValueType::Tensor { ty, shape, .. } = input.dtype() else {
                return Err(DataplaneError::Invalid(format!("model {}: input {:?} is not a tensor", spec.key, input.name())));
            };
            let element = element_type(*ty).ok_or_else(|| {
                DataplaneError::Invalid(format!(
                    "model {}: input {:?} is {ty:?}, which the data plane does not feed",
                    spec.key,
                    input.name()
                ))
            })?;
            inputs.push(InputSpec {
                name: input.name().to_string(),
                dims: shape.iter().map(|&d| if d < 0 { None } else { Some(d as usize) }).collect(),
            });
            input_types.push(element);
        }
        let mut outputs = Vec::new();
        let mut output_types = Vec::new();
        for output in session.outputs() {
            let element = match output.dtype() {
                ValueType::Tensor { ty, .. } => element_type(*ty),
                _ => None,
            }
            .ok_or_else(|| {
                DataplaneError::Invalid(format!(
                    "model {}: output {:?} is {:?}, which the data plane does not read",
                    spec.key,
                    output.name(),
                    output.dtype()
                ))
            })?;
            outputs.push(output.name().to_string());
            output_types.push(element);
        }
        Ok(ModelSession {
            session,
            spec: spec.clone(),
            inputs,
            input_types,
            outputs,
            output_types,
            threads,
            device,
            pad_value: 0.0,
            last_timing: BatchTiming::default(),
        })
    }

    /// The element type of each input, in the order of [`ModelSession::inputs`].
    pub fn input_types(&self) -> &[ElementType] {
        &self.input_types
    }

    /// The element type of each output, in the order of [`ModelSession::outputs`].
    pub fn output_types(&self) -> &[ElementType] {
        &self.output_types
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
        let views: Vec<(Vec<usize>, &[f32])> = inputs.iter().map(|t| (t.shape.clone(), t.data.as_slice())).collect();
        self.run_with(&views, options, |shape, data| Ok(Tensor { shape: shape.to_vec(), data: data.to_vec() }))
    }

    /// Run a batch of requests (each one tensor per input, without batch dimension):
    /// stack, run, split. Returns each request's outputs, in order. A batch of one runs
    /// on views of the request's own tensors (no stacking copy); outputs are split
    /// straight from ONNX Runtime's buffers (one copy per request).
    pub fn run_batch(&mut self, requests: &[&[Tensor]], options: Option<&RunOptions>) -> Result<Vec<Vec<Tensor>>> {
        let begin = Instant::now();
        let stacked;
        let views: Vec<(Vec<usize>, &[f32])> = if let [request] = requests {
            batch::single(&self.inputs, request)?
        } else {
            stacked = batch::stack(&self.inputs, requests, self.pad_value)?;
            stacked.inputs.iter().map(|t| (t.shape.clone(), t.data.as_slice())).collect()
        };
        let n = requests.len();
        let stacked_at = Instant::now();
        let mut ran_at = None;
        let per_output = self.run_with(&views, options, |shape, data| {
            ran_at.get_or_insert_with(Instant::now);
            batch::split_slice(shape, data, n)
        })?;
        let mut per_request: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::with_capacity(per_output.len())).collect();
        for output in per_output {
            for (request, tensor) in per_request.iter_mut().zip(output) {
                request.push(tensor);
            }
        }
        let done = Instant::now();
        let ran_at = ran_at.unwrap_or(done);
        self.last_timing = BatchTiming { stack: stacked_at - begin, run: ran_at - stacked_at, split: done - ran_at };
        Ok(per_request)
    }

    /// Where the last [`ModelSession::run_batch`] spent its time.
    pub fn last_timing(&self) -> BatchTiming {
        self.last_timing
    }

    fn run_with<T>(
        &mut self,
        inputs: &[(Vec<usize>, &[f32])],
        options: Option<&RunOptions>,
        mut take: impl FnMut(&[usize], &[f32]) -> Result<T>,
    ) -> Result<Vec<T>> {
        if inputs.len() != self.inputs.len() {
            return Err(DataplaneError::Invalid(format!("{} inputs given, the model takes {}", inputs.len(), self.inputs.len())));
        }
        let mut values: Vec<(&str, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for ((spec, &element), (shape, data)) in self.inputs.iter().zip(&self.input_types).zip(inputs) {
            values.push((spec.name.as_str(), input_value(element, shape, data)?));
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
        for (name, &element) in self.outputs.iter().zip(&self.output_types) {
            let value = outputs.get(name).ok_or_else(|| DataplaneError::Ort(format!("output {name:?} missing")))?;
            taken.push(read_output(value, element, &mut take)?);
        }
        Ok(taken)
    }
}

/// Where one batch's time went: stacking the requests' inputs, ONNX Runtime's `Run`
/// (with the device copies it makes), and splitting the outputs per request (the first
/// output's split is counted here, the rest too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchTiming {
    /// Checking and stacking the inputs.
    pub stack: Duration,
    /// ONNX Runtime's `Run`, until the first output is read.
    pub run: Duration,
    /// Copying the outputs out, per request.
    pub split: Duration,
}

/// The data plane's element type for one of ONNX Runtime's, if it feeds that type.
fn element_type(ty: TensorElementType) -> Option<ElementType> {
    Some(match ty {
        TensorElementType::Float32 => ElementType::F32,
        TensorElementType::Int8 => ElementType::I8,
        TensorElementType::Int16 => ElementType::I16,
        TensorElementType::Int32 => ElementType::I32,
        TensorElementType::Int64 => ElementType::I64,
        TensorElementType::Uint8 => ElementType::U8,
        TensorElementType::Uint16 => ElementType::U16,
        TensorElementType::Uint32 => ElementType::U32,
        TensorElementType::Bool => ElementType::Bool,
        _ => return None,
    })
}

/// One input as ONNX Runtime takes it: a view of the `f32` data, or a copy cast to the
/// model's element type.
fn input_value<'a>(element: ElementType, shape: &[usize], data: &'a [f32]) -> Result<SessionInputValue<'a>> {
    fn owned<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
        shape: &[usize],
        data: &[f32],
        cast: impl Fn(f32) -> T,
    ) -> Result<SessionInputValue<'static>> {
        let data: Vec<T> = data.iter().map(|&v| cast(v)).collect();
        Ok(ort::value::Tensor::from_array((shape.to_vec(), data)).map_err(DataplaneError::ort)?.into())
    }
    Ok(match element {
        ElementType::F32 => TensorRef::from_array_view((shape.to_vec(), data)).map_err(DataplaneError::ort)?.into(),
        ElementType::I8 => owned(shape, data, |v| v as i8)?,
        ElementType::I16 => owned(shape, data, |v| v as i16)?,
        ElementType::I32 => owned(shape, data, |v| v as i32)?,
        ElementType::I64 => owned(shape, data, |v| v as i64)?,
        ElementType::U8 => owned(shape, data, |v| v as u8)?,
        ElementType::U16 => owned(shape, data, |v| v as u16)?,
        ElementType::U32 => owned(shape, data, |v| v as u32)?,
        ElementType::Bool => owned(shape, data, |v| v != 0.0)?,
    })
}

/// Read one output as `f32` elements and hand them to `take` (straight from ONNX
/// Runtime's buffer for `float32`, through a cast otherwise).
fn read_output<T>(value: &DynValue, element: ElementType, take: &mut impl FnMut(&[usize], &[f32]) -> Result<T>) -> Result<T> {
    fn cast<E: ort::value::PrimitiveTensorElementType + Copy + std::fmt::Debug, T>(
        value: &DynValue,
        to_f32: impl Fn(E) -> f32,
        take: &mut impl FnMut(&[usize], &[f32]) -> Result<T>,
    ) -> Result<T> {
        let (shape, data) = value.try_extract_tensor::<E>().map_err(DataplaneError::ort)?;
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let data: Vec<f32> = data.iter().map(|&v| to_f32(v)).collect();
        take(&shape, &data)
    }
    match element {
        ElementType::F32 => {
            let (shape, data) = value.try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            take(&shape, data)
        }
        ElementType::I8 => cast(value, |v: i8| v as f32, take),
        ElementType::I16 => cast(value, |v: i16| v as f32, take),
        ElementType::I32 => cast(value, |v: i32| v as f32, take),
        ElementType::I64 => cast(value, |v: i64| v as f32, take),
        ElementType::U8 => cast(value, |v: u8| v as f32, take),
        ElementType::U16 => cast(value, |v: u16| v as f32, take),
        ElementType::U32 => cast(value, |v: u32| v as f32, take),
        ElementType::Bool => cast(value, |v: bool| if v { 1.0 } else { 0.0 }, take),
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
    register_device(builder, runtime)
}

/// Add the execution provider of the runtime's device to a session being built, with
/// the runtime's CUDA options on a GPU (nothing for the CPU, and nothing in a build
/// without the `cuda` feature).
#[cfg(feature = "cuda")]
pub(crate) fn register_device(builder: SessionBuilder, runtime: &Runtime) -> Result<SessionBuilder> {
    use crate::device::{ArenaGrowth, ConvAlgorithmSearch};
    use ort::ep::{cuda, ArenaExtendStrategy};
    match runtime.device() {
        Device::Cpu => Ok(builder),
        Device::Cuda(ordinal) => {
            let options = runtime.cuda_options();
            let search = match options.conv_algorithm_search {
                ConvAlgorithmSearch::Exhaustive => cuda::ConvAlgorithmSearch::Exhaustive,
                ConvAlgorithmSearch::Heuristic => cuda::ConvAlgorithmSearch::Heuristic,
                ConvAlgorithmSearch::Default => cuda::ConvAlgorithmSearch::Default,
            };
            let arena = match options.arena_growth {
                ArenaGrowth::SameAsRequested => ArenaExtendStrategy::SameAsRequested,
                ArenaGrowth::NextPowerOfTwo => ArenaExtendStrategy::NextPowerOfTwo,
            };
            let provider = ort::ep::CUDA::default()
                .with_device_id(ordinal as i32)
                .with_conv_algorithm_search(search)
                .with_arena_extend_strategy(arena)
                .build()
                .error_on_failure();
            builder.with_execution_providers([provider]).map_err(DataplaneError::ort)
        }
    }
}

/// Add the execution provider of the runtime's device (the CPU's: nothing to add).
#[cfg(not(feature = "cuda"))]
pub(crate) fn register_device(builder: SessionBuilder, _runtime: &Runtime) -> Result<SessionBuilder> {
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
