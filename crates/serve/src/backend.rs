//! The client API's [`Backend`] over the scheduling engine: each served model is a
//! pipeline stream, each inference one engine request.
//!
//! [`EngineBackend::infer`] validates the KServe inputs against the model's [`Codec`]
//! (every refusal an [`InferError::Invalid`] saying which input is wrong and how),
//! decodes them into a [`Payload`] and makes the entry stage's inputs on the caller's
//! task, then submits the request: the deadline is Triton's `timeout` (microseconds
//! from now) or else the stream's SLO, the priority Triton's `priority`. The payload is
//! parked in the [`PayloadStore`] in the actor's `admitted` callback; the `ended`
//! callback takes it back and wakes the caller through a oneshot channel, and the
//! response is built from it. A dropped request answers [`InferError::Dropped`] with
//! the engine's reason, a failed one [`InferError::Failed`] with the error. If the
//! caller's future is dropped first (the client went away), a guard cancels the
//! request in the engine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use yardmaster_formats::model_repository::stages::step_stage_model;

use serde_json::Map;
use tokio::sync::oneshot;
use yardmaster_dataplane::ocr::RgbImage;
use yardmaster_dataplane::SequenceStep;

use super::actor::ActorHandle;
use super::api::{Backend, BoxFuture, ControlError, InferError, ModelMetadata, TensorSpec};
use super::executor::{ServeHandle, WorkerBoard};
use super::kserve::{DataType, InferRequest, InferResponse, Tensor, TensorData};
use super::payload::{OcrDocument, Parcel, Payload, PayloadStore, Prepared};
use super::sequences::{Admitted, SequenceTable};
use super::stages::StageProgram;
use super::tensor_codec::TensorCodec;
use super::trace::RequestTiming;
use yardmaster_engine::metrics::Outcome;
use yardmaster_engine::{Clock, Executor, MonotonicClock, Submission};

/// Largest image side accepted, pixels.
pub const MAX_IMAGE_SIDE: u64 = 8192;

/// Version string every served model reports.
pub const MODEL_VERSION: &str = "1";

/// Priority levels Triton's `priority` maps onto: level 1 (the highest) becomes engine
/// priority 255, level 255 priority 1; no level is the engine's default, 0.
pub const PRIORITY_LEVELS: u32 = 255;

/// How a model's KServe tensors become a payload, and a finished payload outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Codec {
    /// Text recognition. In: `image`, UINT8 `[H, W, 3]` (RGB pixels). Out: `texts`,
    /// BYTES `[n]` (one line each, in reading order); `scores`, FP32 `[n]`; `boxes`,
    /// FP32 `[n, 4, 2]` (corners top-left, top-right, bottom-right, bottom-left, as x, y).
    OcrImage,
    /// A repository model's tensors, as its configuration declares them.
    Tensors(TensorCodec),
    /// An ensemble's tensors, as its configuration declares them: carried by name
    /// from step to step.
    Ensemble(TensorCodec),
    /// A model that runs a built-in program and serves only as a step of `ensemble`:
    /// its metadata and configuration are its own (its graph's tensors, so Triton's
    /// tools can read an ensemble's composing models), but a request for it is refused,
    /// naming the ensemble to send it to.
    BuiltinStep {
        /// The model's own tensors.
        codec: TensorCodec,
        /// The ensemble it is a step of.
        ensemble: String,
    },
}

/// Names of the OCR codec's tensors.
pub mod ocr_names {
    /// The image input.
    pub const IMAGE: &str = "image";
    /// The recognised lines.
    pub const TEXTS: &str = "texts";
    /// Their confidences.
    pub const SCORES: &str = "scores";
    /// Their boxes.
    pub const BOXES: &str = "boxes";
}

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
}

impl Codec {
    /// Input specs, for metadata.
    pub fn inputs(&self) -> Vec<TensorSpec> {
        match self {
            Codec::OcrImage => vec![spec(ocr_names::IMAGE, DataType::U8, &[-1, -1, 3])],
            Codec::Tensors(codec) | Codec::Ensemble(codec) | Codec::BuiltinStep { codec, .. } => codec.input_specs(),
        }
    }

    /// Output specs, for metadata.
    pub fn outputs(&self) -> Vec<TensorSpec> {
        match self {
            Codec::OcrImage => vec![
                spec(ocr_names::TEXTS, DataType::Bytes, &[-1]),
                spec(ocr_names::SCORES, DataType::F32, &[-1]),
                spec(ocr_names::BOXES, DataType::F32, &[-1, 4, 2]),
            ],
            Codec::Tensors(codec) | Codec::Ensemble(codec) | Codec::BuiltinStep { codec, .. } => codec.output_specs(),
        }
    }

    /// The payload of a request, or why its inputs are not this model's.
    pub fn decode(&self, request: &InferRequest) -> Result<Payload, String> {
        let names: Vec<String> = self.inputs().into_iter().map(|s| s.name).collect();
        if let Some(unknown) = request.inputs.iter().find(|t| !names.contains(&t.name)) {
            return Err(format!("no input {:?} (inputs: {})", unknown.name, names.join(", ")));
        }
        let input = |name: &str| request.inputs.iter().find(|t| t.name == name).ok_or_else(|| format!("input {name:?} is missing"));
        match self {
            Codec::OcrImage => {
                let tensor = input(ocr_names::IMAGE)?;
                Ok(Payload::Ocr(OcrDocument::new(decode_image(tensor)?)))
            }
            Codec::Tensors(codec) => Ok(Payload::Tensors(codec.decode(request)?)),
            Codec::Ensemble(codec) => {
                let tensors = codec.decode(request)?;
                Ok(Payload::Named(codec.inputs.iter().map(|t| t.name.clone()).zip(tensors).collect()))
            }
            Codec::BuiltinStep { ensemble, .. } => Err(format!(
                "this model runs a built-in program and serves only as a step of ensemble {ensemble:?}: send the request to {ensemble:?}"
            )),
        }
    }

    /// The rows (client batch size) of a decoded payload: a batching model's leading
    /// dimension, else 1.
    pub fn rows(&self, payload: &Payload) -> u32 {
        match (self, payload) {
            (Codec::Tensors(codec), Payload::Tensors(tensors)) => codec.rows(tensors),
            (Codec::Ensemble(codec), Payload::Named(tensors)) => {
                let first = codec.inputs.first().and_then(|d| tensors.get(&d.name));
                codec.rows(first.map(std::slice::from_ref).unwrap_or_default())
            }
            _ => 1,
        }
    }

    /// The outputs of a finished payload.
    pub fn encode(&self, payload: Payload) -> Result<Vec<Tensor>, String> {
        match (self, payload) {
            (Codec::OcrImage, Payload::Ocr(document)) => {
                let n = document.lines.len() as u64;
                let texts = document.lines.iter().map(|l| l.text.as_bytes().to_vec()).collect();
                let scores: Vec<f32> = document.lines.iter().map(|l| l.score).collect();
                let boxes: Vec<f32> = document.lines.iter().flat_map(|l| l.region.corners.iter().flat_map(|&(x, y)| [x, y])).collect();
                Ok(vec![
                    Tensor { name: ocr_names::TEXTS.into(), datatype: DataType::Bytes, shape: vec![n], data: TensorData::Strings(texts) },
                    Tensor::f32(ocr_names::SCORES, vec![n], &scores).map_err(|e| e.0)?,
                    Tensor::f32(ocr_names::BOXES, vec![n, 4, 2], &boxes).map_err(|e| e.0)?,
                ])
            }
            (Codec::Tensors(codec), Payload::Tensors(tensors)) => codec.encode(tensors),
            (Codec::Ensemble(codec), Payload::Named(mut tensors)) => {
                let outputs = codec
                    .outputs
                    .iter()
                    .map(|t| tensors.remove(&t.name).ok_or_else(|| format!("no step of the ensemble produced {:?}", t.name)))
                    .collect::<Result<Vec<_>, String>>()?;
                codec.encode(outputs)
            }
            (_, payload) => Err(format!(
                "the pipeline produced {} for a model that answers {}",
                match payload {
                    Payload::Ocr(_) => "text lines",
                    Payload::Tensors(_) => "tensors",
                    Payload::Named(_) => "named tensors",
                },
                match self {
                    Codec::OcrImage => "text lines",
                    Codec::Tensors(_) | Codec::BuiltinStep { .. } => "tensors",
                    Codec::Ensemble(_) => "named tensors",
                }
            )),
        }
    }
}

fn decode_image(tensor: &Tensor) -> Result<RgbImage, String> {
    let name = &tensor.name;
    match tensor.datatype {
        DataType::U8 => {}
        DataType::Bytes => return decode_encoded_image(tensor),
        other => {
            return Err(format!("input {name:?} must be UINT8 [H, W, 3] pixels or BYTES [1] (a PNG or JPEG file), got {}", other.name()))
        }
    }
    let [height, width, 3] = tensor.shape[..] else {
        return Err(format!("input {name:?} must have shape [H, W, 3] (RGB), got {:?}", tensor.shape));
    };
    check_image_size(name, width, height)?;
    let TensorData::Raw(bytes) = &tensor.data else {
        return Err(format!("input {name:?}: UINT8 elements expected"));
    };
    Ok(RgbImage { width: width as usize, height: height as usize, data: bytes.to_vec() })
}

fn check_image_size(name: &str, width: u64, height: u64) -> Result<(), String> {
    if height == 0 || width == 0 || height > MAX_IMAGE_SIDE || width > MAX_IMAGE_SIDE {
        return Err(format!("input {name:?}: an image of {width}×{height}; each side must be 1 to {MAX_IMAGE_SIDE} pixels"));
    }
    Ok(())
}

/// An encoded image (`BYTES [1]`: the bytes of a PNG or JPEG file, as clients send
/// them), decoded here on the caller's task. The size is read from the header and
/// checked before anything is decompressed.
fn decode_encoded_image(tensor: &Tensor) -> Result<RgbImage, String> {
    let name = &tensor.name;
    let TensorData::Strings(items) = &tensor.data else {
        return Err(format!("input {name:?}: BYTES elements expected"));
    };
    let [bytes] = items.as_slice() else {
        return Err(format!("input {name:?}: one encoded image per request (BYTES [1]), got {} elements", items.len()));
    };
    let reader = || image::io::Reader::new(std::io::Cursor::new(bytes.as_slice())).with_guessed_format();
    let format = reader().map_err(|e| format!("input {name:?}: {e}"))?.format();
    if !matches!(format, Some(image::ImageFormat::Png | image::ImageFormat::Jpeg)) {
        return Err(format!("input {name:?}: not a PNG or JPEG file ({} bytes)", bytes.len()));
    }
    let (width, height) = reader()
        .map_err(|e| format!("input {name:?}: {e}"))?
        .into_dimensions()
        .map_err(|e| format!("input {name:?}: a corrupt image: {e}"))?;
    check_image_size(name, width as u64, height as u64)?;
    let decoded = reader()
        .map_err(|e| format!("input {name:?}: {e}"))?
        .decode()
        .map_err(|e| format!("input {name:?}: a corrupt image: {e}"))?
        .to_rgb8();
    Ok(RgbImage { width: decoded.width() as usize, height: decoded.height() as usize, data: decoded.into_raw() })
}

/// A model as the backend serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedModel {
    /// Name clients address it by.
    pub name: String,
    /// The pipeline stream it feeds.
    pub stream: u32,
    /// The stream's entry stage.
    pub entry: u32,
    /// Every stage its requests pass through (the entry first): it is ready when each
    /// has a worker ready.
    pub stages: Vec<u32>,
    /// Its tensors.
    pub codec: Codec,
    /// How it describes itself: version, platform, configuration.
    pub description: ModelDescription,
    /// Its running sequences, when it has a sequence batcher (a stateful model).
    pub sequences: Option<Arc<SequenceTable>>,
}

/// What a served model says about itself beyond its tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDescription {
    /// The version served.
    pub version: String,
    /// Platform string (`onnxruntime_onnx` for a repository model).
    pub platform: String,
    /// Its effective configuration in Triton's JSON form, when it has one.
    pub config: Option<serde_json::Value>,
    /// Class labels of the outputs that have a labels file, by output name.
    pub labels: std::collections::BTreeMap<String, super::classification::Labels>,
}

impl Default for ModelDescription {
    /// A built-in pipeline's: version 1, platform `yardmaster_pipeline`, no configuration.
    fn default() -> Self {
        ModelDescription { version: MODEL_VERSION.into(), platform: "yardmaster_pipeline".into(), config: None, labels: Default::default() }
    }
}

impl ServedModel {
    /// The model's metadata.
    pub fn metadata(&self) -> ModelMetadata {
        ModelMetadata {
            name: self.name.clone(),
            versions: vec![self.description.version.clone()],
            platform: self.description.platform.clone(),
            inputs: self.codec.inputs(),
            outputs: self.codec.outputs(),
            config: self.description.config.clone(),
        }
    }
}

/// The engine's answer for one request: how it ended, and its payload when it completed.
/// How a request ended: its outcome, its data when completed, and the engine's times
/// of it (taken in, first job, end).
type Answer = (Outcome, Option<Parcel>, (u64, Option<u64>, u64));

/// What the backend serves: replaced whole by model control as models are loaded
/// and unloaded while serving ([`EngineBackend::replace_models`]).
#[derive(Default)]
pub struct ModelTables {
    /// The program of every stage (a request's entry-stage inputs are made with it).
    pub programs: Vec<Arc<dyn StageProgram>>,
    /// The models served, one per version.
    pub models: Vec<Arc<ServedModel>>,
    /// Repository models not served, `(name, reason)`, for the repository index.
    pub unavailable: Vec<(String, String)>,
    /// Models being unloaded: new requests for them are refused while theirs drain.
    pub unloading: Vec<String>,
}

/// Loads and unloads models while serving (Triton's model control), for the client
/// API's `POST /v2/repository/models/{m}/load` and `…/unload`.
pub trait ModelController: Send + Sync {
    /// Load (or load again) `model` from the repository; `Ok` once it serves.
    fn load(&self, model: &str, parameters: &serde_json::Value) -> Result<(), ControlError>;
    /// Unload `model` once its requests have drained (or failed after the timeout).
    fn unload(&self, model: &str, parameters: &serde_json::Value) -> Result<(), ControlError>;
}

/// The KServe backend over the serving actor.
pub struct EngineBackend {
    handle: ServeHandle,
    clock: MonotonicClock,
    store: PayloadStore,
    board: WorkerBoard,
    tables: RwLock<ModelTables>,
    /// Counts replacements of `tables`, so the API knows when to read the models again.
    generation: AtomicU64,
    /// Model control, when the server loads and unloads models while serving.
    control: OnceLock<Arc<dyn ModelController>>,
}

impl std::fmt::Debug for EngineBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBackend").field("models", &self.tables().models).finish()
    }
}

impl EngineBackend {
    /// A backend submitting to `handle` (whose engine runs on `clock`), sharing `store`
    /// with the executor, ready when `board` says so, making entry-stage inputs with
    /// `programs`.
    pub fn new(
        handle: ServeHandle,
        clock: MonotonicClock,
        store: PayloadStore,
        board: WorkerBoard,
        programs: Vec<Arc<dyn StageProgram>>,
        models: Vec<ServedModel>,
    ) -> Self {
        let models = models.into_iter().map(Arc::new).collect();
        let tables = ModelTables { programs, models, unavailable: Vec::new(), unloading: Vec::new() };
        Self { handle, clock, store, board, tables: RwLock::new(tables), generation: AtomicU64::new(0), control: OnceLock::new() }
    }

    /// Models of the repository that are not served, `(name, reason)`, for the
    /// repository index.
    pub fn with_unavailable(self, unavailable: Vec<(String, String)>) -> Self {
        self.change_tables(|tables| tables.unavailable = unavailable);
        self
    }

    /// Load and unload models with `control` (once; later calls are ignored).
    pub fn set_controller(&self, control: Arc<dyn ModelController>) {
        let _ = self.control.set(control);
    }

    /// The served models.
    pub fn served(&self) -> Vec<Arc<ServedModel>> {
        self.tables().models.clone()
    }

    /// What is served now.
    pub fn tables(&self) -> RwLockReadGuard<'_, ModelTables> {
        self.tables.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Change what is served (model control); the API reads the models again.
    pub fn change_tables(&self, change: impl FnOnce(&mut ModelTables)) {
        let mut tables: RwLockWriteGuard<'_, ModelTables> = self.tables.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut tables);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The payload store (requests in flight hold one entry each).
    pub fn store(&self) -> &PayloadStore {
        &self.store
    }

    /// The worker board.
    pub fn board(&self) -> &WorkerBoard {
        &self.board
    }

    /// The request's submission: deadline from Triton's `timeout` (µs), else the
    /// stream's SLO; priority from Triton's `priority`; `items` the request's client
    /// batch (its rows: the policy counts them, and never splits the request).
    fn submission(&self, model: &ServedModel, request: &InferRequest, items: u32, step: Option<&SequenceStep>) -> Submission {
        let now = self.clock.now();
        let deadline = request.schedule.timeout_us.map_or(0, |us| now.saturating_add(us.saturating_mul(1_000)));
        let priority = request.schedule.priority.map_or(0, |p| PRIORITY_LEVELS + 1 - p.clamp(1, PRIORITY_LEVELS));
        let sequence = step.map(|s| yardmaster_engine::SequenceStep { id: s.id, start: s.start, end: s.end });
        Submission { stream: model.stream, sent_at: now, deadline, priority, input_size: 0, expected_tokens: 0, items, sequence }
    }

    /// Start the sweeper of a stateful model's sequence table, once: every quarter of
    /// the idle time (10 ms to 1 s) it takes the sequences idle past their time out of
    /// the table and has the engine forget them, which frees their state on their
    /// replica. It stops when the model is no longer served or the engine has stopped.
    fn watch_sequences(&self, table: &Arc<SequenceTable>, stream: u32) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if !table.claim_sweeper() {
            return;
        }
        let period = (table.idle() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let (table, handle) = (Arc::downgrade(table), self.handle.clone());
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(table) = table.upgrade() else { return };
                table.sweep(Instant::now());
                if release_sequences(&handle, stream, table.take_expired()).is_err() {
                    return;
                }
            }
        });
    }

    async fn run(&self, model: &str, version: Option<&str>, request: InferRequest) -> Result<InferResponse, InferError> {
        let request_start = self.clock.now();
        let (served, program) = {
            let tables = self.tables();
            if tables.unloading.iter().any(|m| m == model) {
                return Err(InferError::Unavailable(format!("model {model:?} is being unloaded")));
            }
            let found = match version {
                Some(version) => versions_of(&tables.models, model).find(|m| m.description.version == version),
                None => versions_of(&tables.models, model).last(),
            };
            let Some(served) = found.cloned() else {
                let names: Vec<&str> = tables.models.iter().map(|m| m.name.as_str()).collect();
                let gone = tables.unavailable.iter().any(|(name, _)| name == model);
                if gone {
                    // Unloaded since the API checked the model against its metadata.
                    let message = super::kserve::unavailable_model_message(model);
                    return Err(InferError::Unavailable(format!("{message}: unloaded (served: {})", names.join(", "))));
                }
                let message = match &version {
                    Some(version) => super::kserve::unknown_version_message(model, version),
                    None => super::kserve::unknown_model_message(model),
                };
                return Err(InferError::Invalid(format!("{message} (served: {})", names.join(", "))));
            };
            let program = tables.programs.get(served.entry as usize).cloned();
            (served, program.ok_or_else(|| InferError::Failed(format!("model {model:?} has no entry stage program")))?)
        };
        let payload = served.codec.decode(&request).map_err(|e| InferError::Invalid(format!("model {:?}: {e}", served.name)))?;
        let items = served.codec.rows(&payload);
        let elements = program.inputs(&payload).map_err(InferError::Invalid)?;
        // Last, once the request is otherwise good: its place in its sequence.
        let admitted = match (&served.sequences, &request.schedule.sequence) {
            (Some(table), params) => {
                self.watch_sequences(table, served.stream);
                let admitted = table.admit(params.as_ref(), items, Instant::now());
                // The engine forgets the sequences found idle, and a START's id if it
                // still holds a stale run of it (one that failed, say), before this
                // request reaches it.
                let mut stale = table.take_expired();
                if let Ok(Admitted { step, .. }) = &admitted {
                    if step.start && !stale.contains(&step.id) {
                        stale.push(step.id);
                    }
                }
                let _ = release_sequences(&self.handle, served.stream, stale);
                Some(admitted.map_err(InferError::Invalid)?)
            }
            (None, Some(params)) => {
                return Err(InferError::Invalid(format!(
                    "model {:?}: {}: the model has no sequence batcher (sequence_batching in its configuration); send its requests without sequence parameters",
                    served.name,
                    params.named()
                )))
            }
            (None, None) => None,
        };
        let sequence = admitted.as_ref().map(|a| a.step.clone());
        let parcel =
            Parcel { payload, prepared: Some(Prepared { stage: served.entry, elements }), sequence: sequence.clone(), last_job: None };
        // A sequence's request that does not complete ends its sequence at the door.
        let on_failure = served.sequences.clone().zip(admitted.map(|a| (a.step.id, a.run)));

        let (reply, answer) = oneshot::channel::<Answer>();
        let guard = CancelOnDrop::new(self.handle.clone());
        let admitted = {
            let (store, on_admitted) = (self.store.clone(), guard.on_admitted());
            Box::new(move |id: u64| {
                store.park(id, parcel);
                on_admitted(id);
            })
        };
        let ended = {
            let store = self.store.clone();
            Box::new(move |end: yardmaster_engine::Ended| {
                if let Some((table, (id, run))) = on_failure.filter(|_| !matches!(end.outcome, Outcome::Completed)) {
                    table.failed(id, run);
                }
                let parcel = match end.outcome {
                    Outcome::Completed => store.take(end.id),
                    _ => {
                        store.discard(end.id);
                        None
                    }
                };
                let _ = reply.send((end.outcome, parcel, (end.arrived_at, end.first_job_at, end.at)));
            })
        };
        let key = request.schedule.split_key.as_deref().map(|k| super::ab::key_hash(k.as_bytes()));
        self.handle
            .submit_keyed(self.submission(&served, &request, items, sequence.as_ref()), key, admitted, ended)
            .map_err(|stopped| InferError::Unavailable(stopped.to_string()))?;
        let (outcome, parcel, (queue_start, compute_start, compute_end)) =
            answer.await.map_err(|_| InferError::Unavailable("the scheduling engine stopped".into()))?;
        guard.disarm();
        match outcome {
            Outcome::Completed => {
                let parcel = parcel.ok_or_else(|| InferError::Failed("the request completed but its data was lost".into()))?;
                let (compute_input_end, compute_output_start) = self.worker_stamps(parcel.last_job.as_ref());
                let mut outputs = served.codec.encode(parcel.payload).map_err(InferError::Failed)?;
                classify_outputs(&served, &request.outputs, &mut outputs).map_err(InferError::Invalid)?;
                let timing = RequestTiming {
                    request_start,
                    queue_start,
                    compute_start,
                    compute_end,
                    compute_input_end,
                    compute_output_start,
                    request_end: self.clock.now(),
                };
                Ok(InferResponse {
                    model_name: served.name.clone(),
                    model_version: Some(served.description.version.clone()),
                    id: request.id,
                    parameters: Map::new(),
                    outputs,
                    timing: Some(timing),
                })
            }
            Outcome::Dropped { reason } => Err(InferError::Dropped(reason)),
            Outcome::Failed { error } => Err(InferError::Failed(error)),
        }
    }
}

/// Have the engine forget sequences `ids` of `stream` (idle past their time, or stale),
/// freeing their state on the replica that holds it; a sequence with a request in
/// flight is busy, not idle, and is kept. Nothing is sent for no ids.
fn release_sequences(handle: &ServeHandle, stream: u32, ids: Vec<u64>) -> Result<(), super::actor::ActorStopped> {
    if ids.is_empty() {
        return Ok(());
    }
    handle.send(super::actor::Message::Update(Box::new(move |arms| {
        for id in ids {
            arms.release_sequence(stream, id);
        }
    })))
}

/// Replace each output asked for with a class count by its top classes (Triton's
/// classification extension), with the output's labels when it has a labels file.
fn classify_outputs(served: &ServedModel, requested: &[super::kserve::RequestedOutput], outputs: &mut [Tensor]) -> Result<(), String> {
    let batching = match &served.codec {
        Codec::Tensors(codec) | Codec::Ensemble(codec) | Codec::BuiltinStep { codec, .. } => codec.batching,
        Codec::OcrImage => false,
    };
    for wanted in requested {
        let Some(class_count) = wanted.class_count else { continue };
        let Some(output) = outputs.iter_mut().find(|t| t.name == wanted.name) else { continue };
        let labels = served.description.labels.get(&wanted.name).map(|l| l.as_slice());
        *output =
            super::classification::classify(output, class_count, labels, batching).map_err(|e| format!("model {:?}: {e}", served.name))?;
    }
    Ok(())
}

/// Every served version of `model` in `models`, lowest first.
fn versions_of<'a>(models: &'a [Arc<ServedModel>], model: &'a str) -> impl Iterator<Item = &'a Arc<ServedModel>> + 'a {
    let mut versions: Vec<&Arc<ServedModel>> = models.iter().filter(|m| m.name == model).collect();
    versions.sort_by_key(|m| (m.description.version.parse::<u64>().unwrap_or(0), m.description.version.clone()));
    versions.into_iter()
}

/// The version of each model a request without a version runs: the highest.
fn default_versions(models: &[Arc<ServedModel>]) -> Vec<&Arc<ServedModel>> {
    let mut names: Vec<&str> = Vec::new();
    for model in models {
        if !names.contains(&model.name.as_str()) {
            names.push(&model.name);
        }
    }
    names.into_iter().filter_map(|name| versions_of(models, name).last()).collect()
}

impl Backend for EngineBackend {
    /// One entry per model name, listing every version served (each version of a
    /// repository model is a stream of its own).
    fn models(&self) -> Vec<ModelMetadata> {
        let tables = self.tables();
        let mut merged: Vec<ModelMetadata> = Vec::new();
        for model in default_versions(&tables.models) {
            let mut metadata = model.metadata();
            metadata.versions = versions_of(&tables.models, &model.name).map(|m| m.description.version.clone()).collect();
            merged.push(metadata);
        }
        merged
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn load_model(&self, model: &str, parameters: serde_json::Value) -> BoxFuture<'_, Result<(), ControlError>> {
        self.control_model("load", model, parameters, |control, model, parameters| control.load(model, parameters))
    }

    fn unload_model(&self, model: &str, parameters: serde_json::Value) -> BoxFuture<'_, Result<(), ControlError>> {
        self.control_model("unload", model, parameters, |control, model, parameters| control.unload(model, parameters))
    }

    fn ready(&self) -> bool {
        self.board.ready()
    }

    /// Ready when every stage of the model's default version has a worker ready (a model
    /// just loaded serves once its workers have started).
    fn model_ready(&self, model: &str) -> bool {
        let stages = versions_of(&self.tables().models, model).last().map(|m| m.stages.clone());
        stages.is_some_and(|stages| self.board.stages_ready(&stages))
    }

    fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        self.infer_version(model, None, request)
    }

    fn infer_version(&self, model: &str, version: Option<&str>, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        let (model, version) = (model.to_string(), version.map(str::to_string));
        Box::pin(async move { self.run(&model, version.as_deref(), request).await })
    }

    fn repository_index(&self) -> Vec<serde_json::Value> {
        let tables = self.tables();
        let ready = tables
            .models
            .iter()
            .map(|m| serde_json::json!({ "name": m.name, "version": m.description.version, "state": "READY", "reason": "" }));
        let unavailable = tables
            .unavailable
            .iter()
            .map(|(name, reason)| serde_json::json!({ "name": name, "version": "", "state": "UNAVAILABLE", "reason": reason }));
        let mut index: Vec<serde_json::Value> = ready.chain(unavailable).collect();
        index.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        index
    }

    fn statistics(&self, model: Option<&str>) -> Result<serde_json::Value, String> {
        let stats: Vec<serde_json::Value> =
            self.model_totals(model)?.into_iter().map(|(name, version, totals)| totals.to_triton(&name, &version)).collect();
        Ok(serde_json::json!({ "model_stats": stats }))
    }
}

impl EngineBackend {
    /// When the last job's inputs were stacked and its `Run` ended, on the engine's
    /// clock, from the worker's measures (none where the worker does not measure).
    fn worker_stamps(&self, spans: Option<&super::payload::JobSpans>) -> (Option<u64>, Option<u64>) {
        let Some(spans) = spans.filter(|s| s.timing.measured()) else { return (None, None) };
        let ns = |d: Duration| d.as_nanos() as u64;
        let handed = self.clock.now().saturating_sub(ns(spans.handed.elapsed()));
        let input_end = handed + ns(spans.timing.input());
        (Some(input_end), Some(input_end + ns(spans.timing.batch.run)))
    }

    /// Every served version of `model` (or of every model) with its counters summed
    /// over the arms: what Triton's statistics extension and its `nv_inference_*`
    /// metrics report.
    fn model_totals(&self, model: Option<&str>) -> Result<Vec<(String, String, StreamTotals)>, String> {
        // A model of one stage runs its own requests and, as a step, its ensembles':
        // both count as its executions (as in Triton), the step runs as successes whose
        // times are the ensemble's.
        // (An ensemble step runs a copy of the model's latest version in a stage of its
        // own, named after the model: those count for that version.)
        let tables = self.tables();
        let latest: Vec<&Arc<ServedModel>> = default_versions(&tables.models);
        let models: Vec<(String, String, u32, Option<u32>, bool)> = tables
            .models
            .iter()
            .filter(|m| model.is_none_or(|name| m.name == name))
            .map(|m| {
                let single = (m.stages.len() == 1).then_some(m.entry);
                let is_latest = latest.iter().any(|l| Arc::ptr_eq(l, m));
                (m.name.clone(), m.description.version.clone(), m.stream, single, is_latest)
            })
            .collect();
        drop(tables);
        if models.is_empty() && model.is_some() {
            return Err(super::kserve::unknown_model_message(model.unwrap_or_default()));
        }
        let wanted: Vec<(String, u32, Option<u32>, bool)> =
            models.iter().map(|(name, _, stream, stage, latest)| (name.clone(), *stream, *stage, *latest)).collect();
        let per_stream = self
            .handle
            .inspect_arms(move |arms| {
                // One summary per arm, read for every model asked for.
                let mut totals = vec![StreamTotals::default(); wanted.len()];
                for (index, slot) in arms.slots().iter().enumerate() {
                    let first_arm = index == 0;
                    let accounting = slot.engine.accounting();
                    let summary = accounting.summary(slot.engine.state().now());
                    let stages = &slot.engine.state().pipeline().stages;
                    for ((name, stream, stage, latest), total) in wanted.iter().zip(&mut totals) {
                        if let Some(stats) = summary.streams.get(stream) {
                            total.add(stats);
                        }
                        let Some(own) = stage else { continue };
                        let steps = (0..stages.len() as u32)
                            .filter(|&s| *latest && step_stage_model(&stages[s as usize].name) == Some(name.as_str()));
                        for s in std::iter::once(*own).chain(steps) {
                            if let Some(work) = accounting.stage_work().get(&s) {
                                total.add_stage(work, *stream);
                            }
                            if first_arm {
                                // The arms share one executor: its timings are counted once.
                                total.add_worker_timing(&slot.engine.executor().borrow().stage_timing(s));
                            }
                        }
                    }
                }
                totals
            })
            .map_err(|e| e.to_string())?;
        Ok(models.into_iter().zip(per_stream).map(|((name, version, ..), totals)| (name, version, totals)).collect())
    }

    /// Triton's metric families for every served model version (`nv_inference_*`,
    /// labelled `model` and `version`), so Triton's dashboards and autoscaling rules
    /// read this server unchanged.
    pub fn triton_metrics(&self) -> String {
        let rows: Vec<super::prometheus::TritonModelMetrics> = match self.model_totals(None) {
            Ok(totals) => totals.into_iter().map(|(model, version, totals)| totals.to_metrics(model, version)).collect(),
            Err(error) => return format!("# {error}\n"),
        };
        super::prometheus::render_triton(&rows)
    }

    /// Run a load or unload (`action`) through model control on a blocking thread (it
    /// may profile a model), or refuse it when the server does not control its models.
    fn control_model(
        &self,
        action: &'static str,
        model: &str,
        parameters: serde_json::Value,
        call: fn(&dyn ModelController, &str, &serde_json::Value) -> Result<(), ControlError>,
    ) -> BoxFuture<'_, Result<(), ControlError>> {
        let model = model.to_string();
        let control = self.control.get().cloned();
        Box::pin(async move {
            let control = control.ok_or_else(|| ControlError::Refused(not_controlled(action, &model)))?;
            tokio::task::spawn_blocking(move || call(&*control, &model, &parameters))
                .await
                .map_err(|e| ControlError::Failed(format!("the {action} stopped: {e}")))?
        })
    }
}

/// Why a load or unload is refused by a server that does not control its models.
fn not_controlled(action: &str, model: &str) -> String {
    format!(
        "cannot {action} model {model:?}: this server does not load or unload models while serving (model control mode: none); start it with --model-control-mode explicit or poll"
    )
}

/// One model's counters summed over the arms, for Triton's statistics extension.
#[derive(Debug, Default, Clone, Copy)]
struct StreamTotals {
    completed: u64,
    failed: u64,
    /// Requests that arrived, and those that ended (any outcome).
    arrived: u64,
    ended: u64,
    latency_ns: f64,
    queue_ns: f64,
    compute_ns: f64,
    /// Items the model's stage ran for other streams (as a step of an ensemble).
    step_runs: u64,
    /// Batches its stage ran, when it is a model of one stage.
    batches: Option<u64>,
    /// Its stage's accelerator time (all the runs), when it is a model of one stage.
    stage_compute_ns: Option<f64>,
    /// Where its stage's jobs spent their time on the workers, where they measure it.
    worker: super::executor::StageTiming,
}

impl StreamTotals {
    fn add(&mut self, stats: &yardmaster_engine::metrics::Stats) {
        self.completed += stats.completed;
        self.failed += stats.outcomes.dropped + stats.outcomes.failed;
        self.arrived += stats.arrivals;
        self.ended += stats.outcomes.on_time + stats.outcomes.late + stats.outcomes.dropped + stats.outcomes.failed;
        self.latency_ns += stats.latency.mean * stats.completed as f64;
        self.queue_ns += stats.queue_delay.mean * stats.completed as f64;
        self.compute_ns += stats.accelerator_s * 1e9;
    }

    /// The work of the model's own stage: the runs it made for ensembles, its batches
    /// and its accelerator time.
    fn add_stage(&mut self, work: &yardmaster_engine::metrics::StageWork, own_stream: u32) {
        self.step_runs += work.items_for_others(own_stream);
        *self.batches.get_or_insert(0) += work.batches;
        *self.stage_compute_ns.get_or_insert(0.0) += work.busy_ns as f64;
    }

    fn add_worker_timing(&mut self, timing: &super::executor::StageTiming) {
        self.worker.jobs += timing.jobs;
        self.worker.input_ns += timing.input_ns;
        self.worker.infer_ns += timing.infer_ns;
        self.worker.output_ns += timing.output_ns;
        self.worker.unmeasured_ns += timing.unmeasured_ns;
    }

    /// Compute time as Triton splits it: preparing the inputs, the model's run, the
    /// outputs, from the executor's own counts (a job a worker did not measure counts
    /// whole as the run); without any (not a model the executor ran), all of the
    /// engine's compute time is the run. Each part only grows, as clients that read
    /// the statistics twice and take differences (perf_analyzer) need.
    fn compute_split(&self) -> (f64, f64, f64) {
        let worker = &self.worker;
        if worker.jobs == 0 && worker.unmeasured_ns == 0 {
            return (0.0, self.stage_compute_ns.unwrap_or(self.compute_ns), 0.0);
        }
        (worker.input_ns as f64, (worker.infer_ns + worker.unmeasured_ns) as f64, worker.output_ns as f64)
    }

    /// Triton's `ModelStatistics`: successes with their end-to-end time, failures
    /// (dropped or failed), time queued and time computing. The requests run as a step
    /// of an ensemble count as successes and inferences too (their times are in the
    /// ensemble's statistics); `execution_count` is the batches of a model of one
    /// stage, else the requests completed.
    /// The counters as Triton's metrics name them.
    fn to_metrics(self, model: String, version: String) -> super::prometheus::TritonModelMetrics {
        let runs = self.completed + self.step_runs;
        let (input, infer, output) = self.compute_split();
        super::prometheus::TritonModelMetrics {
            model,
            version,
            success: runs,
            failure: self.failed,
            inference_count: runs,
            exec_count: self.batches.unwrap_or(self.completed),
            request_us: self.latency_ns / 1e3,
            queue_us: self.queue_ns / 1e3,
            compute_input_us: input / 1e3,
            compute_infer_us: infer / 1e3,
            compute_output_us: output / 1e3,
            pending: self.arrived.saturating_sub(self.ended),
        }
    }

    fn to_triton(self, name: &str, version: &str) -> serde_json::Value {
        let duration = |count: u64, ns: f64| serde_json::json!({ "count": count, "ns": ns.max(0.0) as u64 });
        let (input, infer, output) = self.compute_split();
        let runs = self.completed + self.step_runs;
        serde_json::json!({
            "name": name,
            "version": version,
            "last_inference": 0,
            "inference_count": runs,
            "execution_count": self.batches.unwrap_or(self.completed),
            "inference_stats": {
                "success": duration(runs, self.latency_ns),
                "fail": duration(self.failed, 0.0),
                "queue": duration(runs, self.queue_ns),
                "compute_input": duration(runs, input),
                "compute_infer": duration(runs, infer),
                "compute_output": duration(runs, output),
                "cache_hit": duration(0, 0.0),
                "cache_miss": duration(0, 0.0),
            },
            "batch_stats": [],
        })
    }
}

#[derive(Debug, Default)]
struct CancelState {
    /// The engine's id, once admitted.
    id: Option<u64>,
    /// The caller went away.
    abandoned: bool,
}

/// Cancels the request in the engine if dropped before [`CancelOnDrop::disarm`]: the
/// client stopped waiting. Before the request has its id, the callback from
/// [`CancelOnDrop::on_admitted`] sees `abandoned` and cancels it itself.
pub(crate) struct CancelOnDrop<C: Clock, X: Executor> {
    handle: ActorHandle<C, X>,
    state: Arc<Mutex<CancelState>>,
    armed: bool,
}

impl<C: Clock + 'static, X: Executor + 'static> CancelOnDrop<C, X> {
    /// A guard for one request submitted through `handle`.
    pub(crate) fn new(handle: ActorHandle<C, X>) -> Self {
        Self { handle, state: Arc::default(), armed: true }
    }

    /// What the engine's `admitted` callback must call with the request's id.
    pub(crate) fn on_admitted(&self) -> impl FnOnce(u64) + Send + 'static {
        let (state, handle) = (Arc::clone(&self.state), self.handle.clone());
        move |id| {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.id = Some(id);
            if state.abandoned {
                let _ = handle.cancel(id);
            }
        }
    }

    /// The request ended: nothing to cancel.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl<C: Clock, X: Executor> Drop for CancelOnDrop<C, X> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.abandoned = true;
        if let Some(id) = state.id {
            let _ = self.handle.cancel(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::Schedule;

    fn request(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest { id: None, schedule: Schedule::default(), parameters: Map::new(), inputs, outputs: Vec::new() }
    }

    #[test]
    fn compute_time_splits_by_the_executors_counts_whatever_the_engine_has_counted() {
        use super::super::executor::StageTiming;
        // Nothing from the executor: the engine's compute time is all run.
        let engine_only = StreamTotals { stage_compute_ns: Some(900.0), batches: Some(3), ..Default::default() };
        assert_eq!(engine_only.compute_split(), (0.0, 900.0, 0.0));
        // The executor's counts, even while the engine has counted a job fewer (its
        // report is on its way): the parts never step back between two reads.
        let mut totals = StreamTotals { stage_compute_ns: Some(900.0), batches: Some(2), ..Default::default() };
        totals.add_worker_timing(&StageTiming { jobs: 3, input_ns: 100, infer_ns: 700, output_ns: 50, unmeasured_ns: 0 });
        assert_eq!(totals.compute_split(), (100.0, 700.0, 50.0));
        // A job a worker did not measure (a remote host's) counts whole as run.
        totals.add_worker_timing(&StageTiming { unmeasured_ns: 400, ..Default::default() });
        assert_eq!(totals.compute_split(), (100.0, 1100.0, 50.0));
    }

    #[test]
    fn ocr_inputs_are_checked_and_decoded() {
        let codec = Codec::OcrImage;
        let image = Tensor::raw("image", DataType::U8, vec![2, 3, 3], (0..18).collect()).unwrap();
        let Payload::Ocr(document) = codec.decode(&request(vec![image])).unwrap() else { panic!("an OCR payload") };
        assert_eq!((document.image.width, document.image.height), (3, 2));
        assert_eq!(document.image.pixel(1, 0), [3, 4, 5]);
        let cases = [
            (Tensor::raw("image", DataType::U8, vec![2, 3, 4], vec![0; 24]).unwrap(), "shape [H, W, 3]"),
            (Tensor::f32("image", vec![1, 1, 3], &[0.0; 3]).unwrap(), "must be UINT8"),
            (
                Tensor {
                    name: "image".into(),
                    datatype: DataType::Bytes,
                    shape: vec![1],
                    data: TensorData::Strings(vec![b"png".to_vec()]),
                },
                "not a PNG or JPEG file",
            ),
            (Tensor::raw("picture", DataType::U8, vec![1, 1, 3], vec![0; 3]).unwrap(), "no input \"picture\""),
            (Tensor::raw("image", DataType::U8, vec![0, 5, 3], vec![]).unwrap(), "each side must be"),
        ];
        for (tensor, reason) in cases {
            let error = codec.decode(&request(vec![tensor])).unwrap_err();
            assert!(error.contains(reason), "{error:?} should say {reason:?}");
        }
        assert!(codec.decode(&request(vec![])).unwrap_err().contains("missing"));
    }

    /// `image` as the bytes of a file in `format`.
    fn encoded(image: &image::RgbImage, format: image::ImageFormat) -> Tensor {
        let mut bytes = std::io::Cursor::new(Vec::new());
        image.write_to(&mut bytes, format).unwrap();
        Tensor { name: "image".into(), datatype: DataType::Bytes, shape: vec![1], data: TensorData::Strings(vec![bytes.into_inner()]) }
    }

    #[test]
    fn png_and_jpeg_files_are_decoded_and_corrupt_or_huge_ones_refused() {
        let codec = Codec::OcrImage;
        let picture = image::RgbImage::from_fn(5, 3, |x, y| image::Rgb([x as u8 * 40, y as u8 * 80, 7]));
        let Payload::Ocr(png) = codec.decode(&request(vec![encoded(&picture, image::ImageFormat::Png)])).unwrap() else { panic!() };
        assert_eq!((png.image.width, png.image.height), (5, 3));
        assert_eq!(png.image.data, picture.clone().into_raw(), "PNG is lossless");
        let Payload::Ocr(jpeg) = codec.decode(&request(vec![encoded(&picture, image::ImageFormat::Jpeg)])).unwrap() else { panic!() };
        assert_eq!((jpeg.image.width, jpeg.image.height), (5, 3));
        // A truncated file, a file of another format, a picture too large.
        let mut truncated = encoded(&picture, image::ImageFormat::Png);
        let TensorData::Strings(items) = &mut truncated.data else { unreachable!() };
        let half = items[0].len() / 2;
        items[0].truncate(half);
        let bmp = encoded(&picture, image::ImageFormat::Bmp);
        let huge = encoded(&image::RgbImage::new(MAX_IMAGE_SIDE as u32 + 1, 1), image::ImageFormat::Png);
        for (tensor, reason) in [(truncated, "corrupt image"), (bmp, "not a PNG or JPEG"), (huge, "each side must be")] {
            let error = codec.decode(&request(vec![tensor])).unwrap_err();
            assert!(error.contains(reason), "{error:?} should say {reason:?}");
        }
    }
}
