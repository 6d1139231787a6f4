//! Sessions per (model, variant): how one is built — cold from the model file, or warm
//! from the parameter cache — and how it runs a batch of per-request tensors.
//!
//! A cold start reads the file, lets ONNX Runtime optimise the graph (all levels) and
//! keeps the optimised graph in the [`ModelCache`]; a warm start builds the session from
//! those bytes with optimisation off, so it skips both the disk and the optimiser.
//! ONNX Runtime fixes a session's intra-op thread count when the session is built, so a
//! new thread count means a new session — a warm start from the cache.
//!
//! On a GPU a loaded model may hold several ONNX Runtime sessions, each bound to the
//! input shapes it last ran ([`crate::device::CudaOptions::shape_sessions`]): ONNX
//! Runtime's CUDA convolutions rebuild their cuDNN plans whenever a session's input
//! shape changes, which costs far more than the batch itself, so a batch runs on the
//! session that last ran its shapes, or on a new one while there is room, or else on
//! the least recently used.
//!
//! A batch of one runs on views of the request's own tensors. Larger batches are
//! stacked into buffers the session keeps — on a GPU, batches of large requests
//! straight into device memory ([`crate::device::CudaOptions::stack_on_device`]).
//! Outputs are views of ONNX Runtime's own output buffers, split per request without a
//! copy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::SessionInputValue;
use ort::session::{RunOptions, Session};
use ort::value::{DynValue, TensorElementType, TensorRef, ValueType};

use crate::batch::{self, InputSpec, InputView};
use crate::cache::{CacheKey, CachedModel, ModelCache, ModelKey};
use crate::device::Device;
use crate::error::{DataplaneError, Result};
use crate::runtime::Runtime;
use crate::tensor::{ElementType, Elements, SharedBytes, Tensor, TensorData};

/// A model variant and the file it loads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Its name.
    pub key: ModelKey,
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Runs a worker makes at load, before it is ready (Triton's `model_warmup`); empty:
    /// one run of a batch of one on synthetic inputs ([`crate::worker::warm_up`]).
    pub warm_up: Vec<WarmUp>,
    /// A stateful model's sequence settings (Triton's `sequence_batching`): the worker
    /// fills its control and state inputs and keeps each sequence's state.
    pub sequence: Option<crate::sequence::SequenceSpec>,
}

impl ModelSpec {
    /// A spec from a name and a file.
    pub fn new(key: ModelKey, path: impl Into<PathBuf>) -> Self {
        ModelSpec { key, path: path.into(), warm_up: Vec::new(), sequence: None }
    }
}

/// One warm-up sample: a batch of `batch` requests, each with these inputs, run
/// `count` times (at least once) when a worker loads the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUp {
    /// Its name (in errors).
    pub name: String,
    /// Requests in the batch.
    pub batch: u32,
    /// Times it runs.
    pub count: u32,
    /// One per model input, in the model's order.
    pub inputs: Vec<WarmUpInput>,
}

/// One input of a warm-up request: its shape (without the batch dimension for a
/// batching model) and where its elements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUpInput {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Its elements.
    pub data: WarmUpData,
}

/// Where a warm-up input's elements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmUpData {
    /// Zeros (empty strings for BYTES).
    Zero,
    /// Pseudo-random values.
    Random,
    /// These bytes, in the input's element type (a file's contents).
    Given(Vec<u8>),
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

/// One ONNX Runtime session of a model and the input shapes it last ran.
struct ShapedSession {
    session: Session,
    /// The shapes of its last run (`None`: it has not run yet).
    shapes: Option<Vec<Vec<usize>>>,
    /// When it last ran, on its model's clock of runs.
    last_used: u64,
    /// Device tensors its batches are stacked into on a GPU (see [`crate::device_batch`]).
    #[cfg(feature = "cuda")]
    device_inputs: Option<crate::device_batch::DeviceInputs>,
}

impl ShapedSession {
    fn new(session: Session) -> Self {
        ShapedSession {
            session,
            shapes: None,
            last_used: 0,
            #[cfg(feature = "cuda")]
            device_inputs: None,
        }
    }
}

/// What another session of the same model is built from.
struct SessionSource {
    runtime: Arc<Runtime>,
    model: Arc<CachedModel>,
}

/// A loaded session of one model variant on one device.
pub struct ModelSession {
    /// The first is built when the model is loaded, the rest as new shapes arrive.
    sessions: Vec<ShapedSession>,
    /// The most sessions kept (1 on the CPU, where a shape change costs nothing).
    shape_sessions: usize,
    source: SessionSource,
    /// Runs so far (orders the sessions by last use).
    runs: u64,
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
    /// One buffer per input that batches are stacked into, kept from batch to batch.
    stack_buffers: Vec<Elements>,
    /// Whether batches are stacked straight into GPU memory (turned off for good after
    /// a failure there, with a warning).
    #[cfg(feature = "cuda")]
    stack_on_device: bool,
    /// The GPU copier, opened at the first batch stacked on the device.
    #[cfg(feature = "cuda")]
    stager: Option<crate::device_batch::DeviceStager>,
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
    pub fn start(runtime: &Arc<Runtime>, cache: &ModelCache, spec: &ModelSpec, threads: usize) -> Result<Started> {
        let begin = Instant::now();
        let key = CacheKey { model: spec.key.clone(), device: runtime.device() };
        let (session, kind) = match cache.get(&key) {
            Some(cached) => (Self::from_cache(runtime, spec, &cached, threads)?, StartKind::Warm),
            None => (Self::cold(runtime, cache, key, spec, threads)?, StartKind::Cold),
        };
        Ok(Started { session, kind, took: begin.elapsed() })
    }

    /// Start from the file, bypassing the cache entirely (neither reads nor fills it).
    pub fn from_file(runtime: &Arc<Runtime>, spec: &ModelSpec, threads: usize) -> Result<ModelSession> {
        let bytes = read(&spec.path)?;
        let mut builder = builder(runtime, threads, GraphOptimizationLevel::All)?;
        let session = builder.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?;
        Self::wrap(session, spec, threads, runtime, Arc::new(CachedModel { bytes: bytes.into(), optimized: false }))
    }

    fn cold(runtime: &Arc<Runtime>, cache: &ModelCache, key: CacheKey, spec: &ModelSpec, threads: usize) -> Result<ModelSession> {
        let bytes = read(&spec.path)?;
        if runtime.warm_start() == WarmStart::Model {
            let session =
                builder(runtime, threads, GraphOptimizationLevel::All)?.commit_from_memory(&bytes).map_err(|e| load_error(spec, e))?;
            let bytes: Arc<[u8]> = bytes.into();
            cache.insert(key, CachedModel { bytes: Arc::clone(&bytes), optimized: false });
            return Self::wrap(session, spec, threads, runtime, Arc::new(CachedModel { bytes, optimized: false }));
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
        let source = Arc::new(CachedModel { bytes: Arc::clone(&cached.bytes), optimized: cached.optimized });
        cache.insert(key, cached);
        Self::wrap(session, spec, threads, runtime, source)
    }

    fn from_cache(runtime: &Arc<Runtime>, spec: &ModelSpec, cached: &Arc<CachedModel>, threads: usize) -> Result<ModelSession> {
        let session = build_from(runtime, spec, cached, threads)?;
        Self::wrap(session, spec, threads, runtime, Arc::clone(cached))
    }

    fn wrap(session: Session, spec: &ModelSpec, threads: usize, runtime: &Arc<Runtime>, model: Arc<CachedModel>) -> Result<ModelSession> {
        let device = runtime.device();
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
        let shape_sessions = match device {
            Device::Cpu => 1,
            Device::Cuda(_) => runtime.cuda_options().shape_sessions.max(1),
        };
        Ok(ModelSession {
            sessions: vec![ShapedSession::new(session)],
            shape_sessions,
            source: SessionSource { runtime: Arc::clone(runtime), model },
            runs: 0,
            spec: spec.clone(),
            inputs,
            input_types,
            outputs,
            output_types,
            threads,
            device,
            pad_value: 0.0,
            last_timing: BatchTiming::default(),
            stack_buffers: Vec::new(),
            #[cfg(feature = "cuda")]
            stack_on_device: matches!(device, Device::Cuda(_)) && runtime.cuda_options().stack_on_device,
            #[cfg(feature = "cuda")]
            stager: None,
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
        Ok(self.sessions[0].session.metadata().map_err(DataplaneError::ort)?.custom(key))
    }

    /// How many ONNX Runtime sessions the model holds now (one per recent input shape,
    /// up to [`ModelSession::shape_sessions`]).
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The most sessions the model keeps, one per input shape (1 on the CPU).
    pub fn shape_sessions(&self) -> usize {
        self.shape_sessions
    }

    /// Keep at most `limit` sessions (at least 1) from now on; sessions over the limit
    /// are closed, least recently used first.
    pub fn set_shape_sessions(&mut self, limit: usize) {
        self.shape_sessions = limit.max(1);
        while self.sessions.len() > self.shape_sessions {
            let oldest = self.least_recently_used();
            self.sessions.remove(oldest);
        }
    }

    fn least_recently_used(&self) -> usize {
        (0..self.sessions.len()).min_by_key(|&i| self.sessions[i].last_used).unwrap_or(0)
    }

    /// The session to run `shapes` on: the one that last ran them, else one that has
    /// not run yet, else a new one while there is room, else the least recently used
    /// (which then rebuilds its plans for the new shapes).
    fn session_for(&mut self, shapes: Vec<Vec<usize>>) -> usize {
        self.runs += 1;
        let index = if let Some(i) = self.sessions.iter().position(|s| s.shapes.as_ref() == Some(&shapes)) {
            i
        } else if let Some(i) = self.sessions.iter().position(|s| s.shapes.is_none()) {
            i
        } else if self.sessions.len() < self.shape_sessions {
            match build_from(&self.source.runtime, &self.spec, &self.source.model, self.threads) {
                Ok(session) => {
                    tracing::debug!(model = %self.spec.key, sessions = self.sessions.len() + 1, ?shapes, "another session for new input shapes");
                    self.sessions.push(ShapedSession::new(session));
                    self.sessions.len() - 1
                }
                Err(error) => {
                    tracing::warn!(model = %self.spec.key, "no further session for new input shapes ({error}); reusing one");
                    self.shape_sessions = self.sessions.len();
                    self.least_recently_used()
                }
            }
        } else {
            self.least_recently_used()
        };
        let chosen = &mut self.sessions[index];
        chosen.shapes = Some(shapes);
        chosen.last_used = self.runs;
        index
    }

    /// Run already-batched inputs (one tensor per model input), returning every output.
    /// With `options`, the run stops early when they are terminated
    /// ([`DataplaneError::Aborted`]).
    pub fn run(&mut self, inputs: &[Tensor], options: Option<&RunOptions>) -> Result<Vec<Tensor>> {
        let views: Vec<InputView<'_>> =
            inputs.iter().map(|t| InputView { shape: &t.shape, element: t.data.element(), bytes: t.data.bytes() }).collect();
        self.run_with(&views, options)
    }

    /// Run a batch of requests (each one tensor per input, without batch dimension):
    /// stack, run, split. Returns each request's outputs, in order. A batch of one runs
    /// on views of the request's own tensors (no stacking copy); larger batches are
    /// stacked into buffers the session keeps. Each request's outputs are views of
    /// ONNX Runtime's output buffers (no copy), freed when the last view is.
    pub fn run_batch(&mut self, requests: &[&[Tensor]], options: Option<&RunOptions>) -> Result<Vec<Vec<Tensor>>> {
        let begin = Instant::now();
        // A batch of several requests: its shapes, worked out once for either path.
        let batched = match requests {
            [_] => None,
            _ => Some(batch::shapes(&self.inputs, requests)?),
        };
        #[cfg(feature = "cuda")]
        if let (Some((shapes, false)), true) = (&batched, self.stack_on_device) {
            match self.run_stacked_on_device(requests, shapes, options, begin) {
                Ok(Some(outputs)) => return Ok(outputs),
                Ok(None) => {}
                Err(DataplaneError::Aborted) => return Err(DataplaneError::Aborted),
                Err(error) => {
                    tracing::warn!(model = %self.spec.key, "stacking batches on the host from now on: {error}");
                    self.stack_on_device = false;
                }
            }
        }
        let mut buffers = std::mem::take(&mut self.stack_buffers);
        let outputs = (|| {
            let single_shapes;
            let views: Vec<InputView<'_>> = match &batched {
                Some((shapes, _)) => {
                    batch::fill(requests, shapes, self.pad_value, &mut buffers)?;
                    shapes
                        .iter()
                        .zip(&buffers)
                        .map(|(shape, data)| InputView { shape, element: data.element(), bytes: data.bytes() })
                        .collect()
                }
                // A batch of one: no shapes were worked out above; it runs on its own data.
                None => {
                    single_shapes = batch::single(&self.inputs, requests[0])?;
                    single_shapes
                        .iter()
                        .zip(requests[0])
                        .map(|(shape, t)| InputView { shape, element: t.data.element(), bytes: t.data.bytes() })
                        .collect()
                }
            };
            let stacked_at = Instant::now();
            let outputs = self.run_with(&views, options)?;
            Ok((stacked_at, outputs))
        })();
        self.stack_buffers = buffers;
        let (stacked_at, outputs) = outputs?;
        let ran_at = Instant::now();
        // A whole request (a model without a batch dimension) answers with its outputs whole.
        let per_request = match (&batched, requests) {
            (None, [request]) if batch::is_whole(&self.inputs, request) => vec![outputs],
            _ => batch::split(outputs, requests.len())?,
        };
        self.last_timing = BatchTiming { stack: stacked_at - begin, run: ran_at - stacked_at, split: ran_at.elapsed() };
        Ok(per_request)
    }

    /// [`ModelSession::run_batch`] with each request copied straight into device memory,
    /// for a batch of `shapes` that needs no padding; `None` where the batch does not
    /// qualify (small requests, or an input that is not `f32`).
    #[cfg(feature = "cuda")]
    fn run_stacked_on_device(
        &mut self,
        requests: &[&[Tensor]],
        shapes: &[Vec<usize>],
        options: Option<&RunOptions>,
        begin: Instant,
    ) -> Result<Option<Vec<Vec<Tensor>>>> {
        let Device::Cuda(ordinal) = self.device else { return Ok(None) };
        if self.input_types.iter().any(|&t| t != ElementType::F32) {
            return Ok(None);
        }
        let request_bytes: usize = shapes.iter().map(|shape| shape[1..].iter().product::<usize>()).sum::<usize>() * 4;
        if request_bytes < crate::device_batch::MIN_REQUEST_BYTES {
            return Ok(None);
        }
        if self.stager.is_none() {
            self.stager = Some(crate::device_batch::DeviceStager::new(ordinal)?);
        }
        let index = self.session_for(shapes.to_vec());
        let shaped = &mut self.sessions[index];
        let stager = self.stager.as_ref().expect("opened above");
        stager.stage(&shaped.session, shapes, requests, &mut shaped.device_inputs)?;
        let stacked_at = Instant::now();
        let device_inputs = shaped.device_inputs.as_ref().expect("staged above");
        let values: Vec<(&str, SessionInputValue<'_>)> =
            self.inputs.iter().zip(device_inputs.tensors()).map(|(spec, tensor)| (spec.name.as_str(), tensor.into())).collect();
        let outputs = run_session(&mut shaped.session, &self.outputs, &self.output_types, values, options)?;
        let ran_at = Instant::now();
        let per_request = batch::split(outputs, requests.len())?;
        self.last_timing = BatchTiming { stack: stacked_at - begin, run: ran_at - stacked_at, split: ran_at.elapsed() };
        Ok(Some(per_request))
    }

    /// Bytes of the buffers the session keeps to stack batches into (0 until a batch of
    /// several requests is stacked on the host: a batch of one runs on the request's
    /// own bytes, handed to ONNX Runtime in place).
    pub fn stacked_bytes(&self) -> usize {
        self.stack_buffers.iter().map(|b| b.bytes().len()).sum()
    }

    /// Where the last [`ModelSession::run_batch`] spent its time.
    pub fn last_timing(&self) -> BatchTiming {
        self.last_timing
    }

    fn run_with(&mut self, inputs: &[InputView<'_>], options: Option<&RunOptions>) -> Result<Vec<Tensor>> {
        if inputs.len() != self.inputs.len() {
            return Err(DataplaneError::Invalid(format!("{} inputs given, the model takes {}", inputs.len(), self.inputs.len())));
        }
        let index = self.session_for(inputs.iter().map(|view| view.shape.to_vec()).collect());
        let mut values: Vec<(&str, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for ((spec, &element), view) in self.inputs.iter().zip(&self.input_types).zip(inputs) {
            let value = input_value(element, view).map_err(|e| match e {
                DataplaneError::Invalid(reason) => DataplaneError::Invalid(format!("input {:?}: {reason}", spec.name)),
                other => other,
            })?;
            values.push((spec.name.as_str(), value));
        }
        run_session(&mut self.sessions[index].session, &self.outputs, &self.output_types, values, options)
    }
}

/// Run `session` on `values` and read every output, in the order of `outputs`.
fn run_session(
    session: &mut Session,
    outputs: &[String],
    output_types: &[ElementType],
    values: Vec<(&str, SessionInputValue<'_>)>,
    options: Option<&RunOptions>,
) -> Result<Vec<Tensor>> {
    let result = match options {
        Some(options) => session.run_with_options(values, options),
        None => session.run(values),
    };
    let mut produced = match result {
        Ok(produced) => produced,
        Err(error) if error.to_string().contains("terminate") => return Err(DataplaneError::Aborted),
        Err(error) => return Err(DataplaneError::ort(error)),
    };
    let mut taken = Vec::with_capacity(outputs.len());
    for (name, &element) in outputs.iter().zip(output_types) {
        let value = produced.remove(name).ok_or_else(|| DataplaneError::Ort(format!("output {name:?} missing")))?;
        taken.push(read_output(value, element)?);
    }
    Ok(taken)
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
        TensorElementType::Float16 => ElementType::F16,
        TensorElementType::Float64 => ElementType::F64,
        TensorElementType::Uint64 => ElementType::U64,
        TensorElementType::Bfloat16 => ElementType::Bf16,
        TensorElementType::String => ElementType::Bytes,
        _ => return None,
    })
}

/// One input as ONNX Runtime takes it, for a model input of `element`s: a view of the
/// elements when they are the model's type (no copy), or — for `f32` elements made by
/// the data plane's own pipelines — a copy cast to the model's type.
fn input_value<'a>(element: ElementType, view: &InputView<'a>) -> Result<SessionInputValue<'a>> {
    fn borrowed<'a, T: ort::value::PrimitiveTensorElementType + bytemuck::Pod + std::fmt::Debug>(
        shape: &[usize],
        bytes: &'a [u8],
    ) -> Result<SessionInputValue<'a>> {
        // No elements: an empty slice of `T`, wherever the empty bytes point.
        let values: &'a [T] = match bytes.is_empty() {
            true => &[],
            false => bytemuck::try_cast_slice(bytes)
                .map_err(|e| DataplaneError::Invalid(format!("elements not laid out as {}: {e}", std::any::type_name::<T>())))?,
        };
        Ok(TensorRef::from_array_view((shape.to_vec(), values)).map_err(DataplaneError::ort)?.into())
    }
    fn cast<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
        shape: &[usize],
        data: &[f32],
        cast: impl Fn(f32) -> T,
    ) -> Result<SessionInputValue<'static>> {
        let data: Vec<T> = data.iter().map(|&v| cast(v)).collect();
        Ok(ort::value::Tensor::from_array((shape.to_vec(), data)).map_err(DataplaneError::ort)?.into())
    }
    let shape = view.shape;
    if view.element == element {
        return match element {
            ElementType::F32 => borrowed::<f32>(shape, view.bytes),
            ElementType::F64 => borrowed::<f64>(shape, view.bytes),
            ElementType::F16 => borrowed::<half::f16>(shape, view.bytes),
            ElementType::Bf16 => borrowed::<half::bf16>(shape, view.bytes),
            ElementType::I8 => borrowed::<i8>(shape, view.bytes),
            ElementType::I16 => borrowed::<i16>(shape, view.bytes),
            ElementType::I32 => borrowed::<i32>(shape, view.bytes),
            ElementType::I64 => borrowed::<i64>(shape, view.bytes),
            ElementType::U8 => borrowed::<u8>(shape, view.bytes),
            ElementType::U16 => borrowed::<u16>(shape, view.bytes),
            ElementType::U32 => borrowed::<u32>(shape, view.bytes),
            ElementType::U64 => borrowed::<u64>(shape, view.bytes),
            ElementType::Bool => {
                if view.bytes.iter().any(|&b| b > 1) {
                    return Err(DataplaneError::Invalid("a bool element is neither 0 nor 1".into()));
                }
                // SAFETY: every byte is 0 or 1, the two valid `bool` bit patterns, and
                // `bool` has the size and alignment of `u8`.
                let values: &'a [bool] = unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<bool>(), view.bytes.len()) };
                Ok(TensorRef::from_array_view((shape.to_vec(), values)).map_err(DataplaneError::ort)?.into())
            }
            ElementType::Bytes => {
                let strings: Vec<OnnxString> =
                    crate::tensor::string_offsets(view.bytes)?.into_iter().map(|range| OnnxString(view.bytes[range].to_vec())).collect();
                if let Some(bad) = strings.iter().position(|s| s.0.contains(&0)) {
                    return Err(DataplaneError::Invalid(format!("string {bad} holds a NUL byte, which ONNX Runtime's strings cannot")));
                }
                Ok(ort::value::Tensor::from_string_array((shape.to_vec(), strings.as_slice())).map_err(DataplaneError::ort)?.into())
            }
        };
    }
    let Some(data) = (view.element == ElementType::F32).then(|| bytemuck::try_cast_slice::<u8, f32>(view.bytes).ok()).flatten() else {
        return Err(DataplaneError::Invalid(format!("{} elements given, the model takes {element}", view.element)));
    };
    match element {
        ElementType::F64 => cast(shape, data, |v| v as f64),
        ElementType::F16 => cast(shape, data, half::f16::from_f32),
        ElementType::Bf16 => cast(shape, data, half::bf16::from_f32),
        ElementType::I8 => cast(shape, data, |v| v as i8),
        ElementType::I16 => cast(shape, data, |v| v as i16),
        ElementType::I32 => cast(shape, data, |v| v as i32),
        ElementType::I64 => cast(shape, data, |v| v as i64),
        ElementType::U8 => cast(shape, data, |v| v as u8),
        ElementType::U16 => cast(shape, data, |v| v as u16),
        ElementType::U32 => cast(shape, data, |v| v as u32),
        ElementType::U64 => cast(shape, data, |v| v as u64),
        ElementType::Bool => cast(shape, data, |v| v != 0.0),
        ElementType::F32 | ElementType::Bytes => Err(DataplaneError::Invalid(format!("float32 elements given, the model takes {element}"))),
    }
}

/// A string element as ONNX Runtime takes it: its bytes, which need not be UTF-8 (ONNX
/// strings are byte strings).
#[derive(Clone)]
struct OnnxString(Vec<u8>);

impl ort::value::Utf8Data for OnnxString {
    fn as_utf8_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// An output of ONNX Runtime, held so tensors can view its buffer without a copy.
struct OrtBytes {
    /// Keeps the buffer alive.
    _value: DynValue,
    data: *const u8,
    len: usize,
}

// SAFETY: the buffer is only read, and stays where it is while `_value` (which is Send
// and Sync itself) lives.
unsafe impl Send for OrtBytes {}
unsafe impl Sync for OrtBytes {}

impl SharedBytes for OrtBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `data` and `len` describe the tensor buffer `_value` owns (see `read_output`).
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

/// An output as a host tensor in its own element type: numeric outputs as a view of
/// ONNX Runtime's own buffer (no copy), strings in Triton's binary layout.
fn read_output(value: DynValue, element: ElementType) -> Result<Tensor> {
    fn view<E: ort::value::PrimitiveTensorElementType + bytemuck::Pod + std::fmt::Debug>(
        value: DynValue,
        element: ElementType,
    ) -> Result<Tensor> {
        let (shape, data) = value.try_extract_tensor::<E>().map_err(DataplaneError::ort)?;
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let (pointer, len) = (bytes.as_ptr(), bytes.len());
        let buffer: Arc<dyn SharedBytes> = Arc::new(OrtBytes { _value: value, data: pointer, len });
        let data = TensorData::view(element, buffer, 0..len)
            .ok_or_else(|| DataplaneError::Ort("an output's buffer is shorter than itself".into()))?;
        Ok(Tensor { shape, data })
    }
    match element {
        ElementType::F32 => view::<f32>(value, element),
        ElementType::F64 => view::<f64>(value, element),
        ElementType::F16 => view::<half::f16>(value, element),
        ElementType::Bf16 => view::<half::bf16>(value, element),
        ElementType::I8 => view::<i8>(value, element),
        ElementType::I16 => view::<i16>(value, element),
        ElementType::I32 => view::<i32>(value, element),
        ElementType::I64 => view::<i64>(value, element),
        ElementType::U8 => view::<u8>(value, element),
        ElementType::U16 => view::<u16>(value, element),
        ElementType::U32 => view::<u32>(value, element),
        ElementType::U64 => view::<u64>(value, element),
        ElementType::Bool => {
            let (shape, data) = value.try_extract_tensor::<bool>().map_err(DataplaneError::ort)?;
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            Tensor::new(shape, Elements::Bool(data.iter().map(|&b| u8::from(b)).collect()))
        }
        ElementType::Bytes => {
            let ValueType::Tensor { shape, .. } = value.dtype() else {
                return Err(DataplaneError::Ort("a string output that is not a tensor".into()));
            };
            let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
            let count: usize = shape.iter().product();
            let (contents, offsets) = string_contents(&value, count)?;
            let mut layout = Vec::with_capacity(contents.len() + 4 * count);
            for (i, &start) in offsets.iter().enumerate() {
                let end = offsets.get(i + 1).copied().unwrap_or(contents.len());
                let string =
                    contents.get(start..end).ok_or_else(|| DataplaneError::Ort("a string output's offsets are out of order".into()))?;
                layout.extend_from_slice(&(string.len() as u32).to_le_bytes());
                layout.extend_from_slice(string);
            }
            Tensor::new(shape, Elements::Bytes { data: layout, count })
        }
    }
}

/// The bytes of a string tensor's `count` strings, and where each starts: read through
/// ONNX Runtime's C API, since its strings are byte strings that need not be UTF-8
/// (`ort`'s own reader insists on UTF-8).
fn string_contents(value: &DynValue, count: usize) -> Result<(Vec<u8>, Vec<usize>)> {
    use ort::AsPointer;
    let api = ort::api();
    let check = |status: ort::sys::OrtStatusPtr| -> Result<()> {
        if status.0.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null status from the API is a valid `OrtStatus` until released,
        // and its message a NUL-terminated string it owns.
        let message = unsafe { std::ffi::CStr::from_ptr((api.GetErrorMessage)(status.0)) }.to_string_lossy().into_owned();
        // SAFETY: released once, after its message was copied.
        unsafe { (api.ReleaseStatus)(status.0) };
        Err(DataplaneError::Ort(format!("reading a string output: {message}")))
    };
    let mut total = 0usize;
    // SAFETY: `value` is a live string tensor (its element type was checked by the caller).
    check(unsafe { (api.GetStringTensorDataLength)(value.ptr(), &mut total) })?;
    let mut contents = vec![0u8; total];
    let mut offsets = vec![0usize; count];
    if count > 0 {
        // SAFETY: the buffers have the lengths passed beside them: `total` bytes for the
        // contents and `count` offsets, the tensor's element count.
        check(unsafe { (api.GetStringTensorContent)(value.ptr(), contents.as_mut_ptr().cast(), total, offsets.as_mut_ptr(), count) })?;
    }
    Ok((contents, offsets))
}

/// A session of `spec` from bytes held in memory (its optimised graph, or the file).
fn build_from(runtime: &Runtime, spec: &ModelSpec, model: &CachedModel, threads: usize) -> Result<Session> {
    let level = if model.optimized { GraphOptimizationLevel::Disable } else { GraphOptimizationLevel::All };
    builder(runtime, threads, level)?.commit_from_memory(&model.bytes).map_err(|e| load_error(spec, e))
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
