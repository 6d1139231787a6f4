//! The client API, independent of the transport: KServe v2 routes over plain
//! [`http`] types, answered by a [`Backend`]. The HTTP/1.1 and HTTP/3 front ends
//! both hand every request to [`Api::handle`], so the two speak exactly the same
//! protocol.
//!
//! Routes: `GET /v2/health/live`, `GET /v2/health/ready`, `GET /v2` (server metadata),
//! `GET /v2/models/{model}[/versions/{v}]` (model metadata),
//! `GET /v2/models/{model}[/versions/{v}]/ready`,
//! `GET /v2/models/{model}[/versions/{v}]/config` (the effective configuration),
//! `GET /v2/models/stats` and `GET /v2/models/{model}[/versions/{v}]/stats` (Triton's
//! statistics extension, when the backend keeps statistics),
//! `POST /v2/models/{model}[/versions/{v}]/infer`, `POST /v2/repository/index`
//! (Triton's repository index; load and unload are refused with the reason), and
//! `/v2/systemsharedmemory/…` (Triton's system shared-memory extension: register,
//! unregister and status; inputs read from and outputs written into registered
//! regions, see `super::shared_memory`), `/v2/cudasharedmemory/…` (status empty,
//! registration refused: not supported), `GET /metrics` (Prometheus text, when a
//! renderer is set), and `GET /v2/cluster` (a
//! cluster controller's hosts as JSON, when a reporter is set: see
//! `super::membership::cluster_view`).
//!
//! Bodies may come compressed (`Content-Encoding: gzip` or `deflate`) and answers go
//! compressed when `Accept-Encoding` asks (`super::compression`).
//!
//! Status codes: 400 for a malformed request (with the reason), 404 for an unknown
//! model or route, 405 for a wrong method, 413 for an oversized body (inflated too),
//! 415 for a body encoding other than gzip and deflate, 503 when the
//! scheduling policy dropped the request (the body says it was dropped and why), the
//! server is not ready, or it already holds its admission cap of inference requests
//! ([`Api::with_max_in_flight`]: the body says so), 500 when a worker failed on it.
//!
//! The admission cap bounds what an overload can make the server hold: every
//! inference request in flight, from its body read to its answer, counts once
//! whichever transport it came by; one past the cap is answered 503 at once, before
//! its body is decoded.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::compression;
use super::kserve::{self, DataType, InferRequest, InferResponse};
use super::shared_memory::SharedMemoryRegistry;
use super::trace::{RequestTiming, Tracer};

/// Largest request body accepted (bytes).
pub const DEFAULT_MAX_BODY: usize = 64 << 20;

/// Most inference requests admitted at once, by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// A tensor a model takes or gives, for metadata (`-1` marks a variable dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Shape.
    pub shape: Vec<i64>,
}

/// A model as clients see it (in Yardmaster: a pipeline stream).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetadata {
    /// Name clients address it by.
    pub name: String,
    /// Versions served.
    pub versions: Vec<String>,
    /// Platform string.
    pub platform: String,
    /// Inputs.
    pub inputs: Vec<TensorSpec>,
    /// Outputs.
    pub outputs: Vec<TensorSpec>,
    /// The effective configuration in Triton's JSON form (`GET …/config`), when the
    /// model has one; otherwise the route answers a minimal one.
    pub config: Option<Value>,
}

/// Why an inference did not produce outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum InferError {
    /// The request is malformed for this model (400).
    Invalid(String),
    /// The scheduling policy (or the host's expiry) dropped it (503).
    Dropped(String),
    /// A worker failed on it (500).
    Failed(String),
    /// The server cannot take requests now (503).
    Unavailable(String),
}

/// Why a model could not be loaded or unloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The request cannot be carried out: unknown model, bad configuration, a model
    /// that fails to load, no model control (400).
    Refused(String),
    /// The server's state forbids it now: an A/B run or a shadow in progress, an
    /// ensemble still using the model (409).
    Conflict(String),
    /// It failed part-way (500).
    Failed(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::Refused(reason) | ControlError::Conflict(reason) | ControlError::Failed(reason) => f.write_str(reason),
        }
    }
}

/// Why a request was not answered with a result, as a status and a reason: what every
/// transport reports in its own terms (HTTP status, gRPC code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status that stands for it.
    pub status: StatusCode,
    /// The reason, for the client.
    pub reason: String,
}

impl Refusal {
    fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self { status, reason: reason.into() }
    }
}

impl From<ControlError> for Refusal {
    /// A refused load or unload is 400, a conflict with the server's state 409, a
    /// failure part-way 500.
    fn from(error: ControlError) -> Self {
        match error {
            ControlError::Refused(reason) => Refusal::new(StatusCode::BAD_REQUEST, reason),
            ControlError::Conflict(reason) => Refusal::new(StatusCode::CONFLICT, reason),
            ControlError::Failed(reason) => Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, reason),
        }
    }
}

/// One served model, looked up by name (and version) in the models of the backend's
/// current generation.
#[derive(Debug, Clone)]
pub struct ServedModel {
    models: Arc<Vec<ModelMetadata>>,
    index: usize,
    version: Option<String>,
}

impl ServedModel {
    /// The model's metadata.
    pub fn metadata(&self) -> &ModelMetadata {
        &self.models[self.index]
    }

    /// The version asked for (`None`: the default one).
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The configuration `GET …/config` and gRPC's `ModelConfig` give: the model's
    /// effective one, or a minimal one when it has none.
    pub fn config(&self) -> Value {
        let metadata = self.metadata();
        match &metadata.config {
            Some(config) => config.clone(),
            None => json!({ "name": metadata.name, "platform": metadata.platform, "max_batch_size": 0 }),
        }
    }

    /// Whether the model is decoupled (read in place: no copy of its configuration).
    pub fn decoupled(&self) -> bool {
        self.metadata().config.as_ref().is_some_and(super::decoupled::is_decoupled)
    }
}

/// The protocol extensions the server metadata announces.
pub const EXTENSIONS: [&str; 11] = [
    "binary_tensor_data",
    "system_shared_memory",
    "logging",
    "trace",
    "classification",
    "schedule_policy",
    "sequence",
    "model_configuration",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
];

/// A boxed future, for the object-safe [`Backend`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What answers inference requests.
pub trait Backend: Send + Sync {
    /// Every model served.
    fn models(&self) -> Vec<ModelMetadata>;
    /// Whether the server takes requests.
    fn ready(&self) -> bool;
    /// Whether `model` takes requests (`GET /v2/models/{m}/ready`); the server's
    /// readiness unless the backend knows better.
    fn model_ready(&self, model: &str) -> bool {
        let _ = model;
        self.ready()
    }
    /// Run one request on `model` (a name from [`Backend::models`]).
    fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>>;
    /// Run one request on `version` of `model` (one of its metadata's versions; `None`:
    /// the default one). A backend serving one version per model need not override it.
    fn infer_version(&self, model: &str, version: Option<&str>, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        let _ = version;
        self.infer(model, request)
    }
    /// Triton's statistics extension: `{"model_stats": [...]}` for `model`, or for
    /// every model when `None`; `Err` when the backend keeps none.
    fn statistics(&self, model: Option<&str>) -> Result<Value, String> {
        let _ = model;
        Err("this server keeps no model statistics".into())
    }
    /// Changes whenever the models served change (loaded or unloaded while serving):
    /// the API reads [`Backend::models`] again when it differs from the last read.
    fn generation(&self) -> u64 {
        0
    }
    /// Triton's repository extension: load (or load again) `model`; `parameters` is the
    /// request body's `parameters` object (`Null` when none).
    fn load_model(&self, model: &str, parameters: Value) -> BoxFuture<'_, Result<(), ControlError>> {
        let (model, _) = (model.to_string(), parameters);
        Box::pin(async move {
            Err(ControlError::Refused(format!("cannot load model {model:?}: this server does not load models while serving")))
        })
    }
    /// Triton's repository extension: unload `model` (its requests drain first).
    fn unload_model(&self, model: &str, parameters: Value) -> BoxFuture<'_, Result<(), ControlError>> {
        let (model, _) = (model.to_string(), parameters);
        Box::pin(async move {
            Err(ControlError::Refused(format!("cannot unload model {model:?}: this server does not unload models while serving")))
        })
    }
    /// Triton's repository index: every model with its version, `state` (`READY` or
    /// `UNAVAILABLE`) and, when unavailable, the `reason`.
    fn repository_index(&self) -> Vec<Value> {
        self.models()
            .into_iter()
            .map(|m| json!({ "name": m.name, "version": m.versions.first().cloned().unwrap_or_default(), "state": "READY", "reason": "" }))
            .collect()
    }
}

/// A request body as its transport hands it over, in pieces (HTTP/1.1's reads, HTTP/3's
/// DATA frames), kept as they are until [`BodyChunks::gather`] makes one buffer of them.
#[derive(Debug, Default)]
pub struct BodyChunks {
    chunks: Vec<Bytes>,
    len: usize,
}

impl BodyChunks {
    /// Add the next piece (not copied).
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push(chunk);
        }
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing came.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body in one buffer: a body that came in one piece as it is (no copy); one in
    /// several pieces copied once, into a buffer where the binary data of an inference
    /// request (after the `Inference-Header-Content-Length` bytes of JSON that `headers`
    /// announce, for a body not compressed) starts at an address aligned for every
    /// element type, so that its tensors are handed to ONNX Runtime in place, without
    /// a further copy.
    pub fn gather(self, headers: &HeaderMap) -> Bytes {
        if self.chunks.len() <= 1 {
            return self.chunks.into_iter().next().unwrap_or_default();
        }
        let json_length = headers
            .get(kserve::HEADER_CONTENT_LENGTH)
            .filter(|_| !headers.contains_key(http::header::CONTENT_ENCODING))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n <= self.len)
            .unwrap_or(0);
        let mut body = AlignedBody::new(json_length, self.len);
        let out = body.bytes_mut();
        let mut at = 0;
        for chunk in &self.chunks {
            out[at..at + chunk.len()].copy_from_slice(chunk);
            at += chunk.len();
        }
        Bytes::from_owner(body)
    }
}

/// Bytes whose byte `lead` sits at an address aligned for 8-byte words (the widest
/// element type), in a buffer of words.
struct AlignedBody {
    words: Vec<u64>,
    start: usize,
    len: usize,
}

impl AlignedBody {
    /// Room for `len` bytes, byte `lead` of them aligned.
    fn new(lead: usize, len: usize) -> Self {
        let start = (8 - lead % 8) % 8;
        AlignedBody { words: vec![0; (start + len).div_ceil(8)], start, len }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let (start, len) = (self.start, self.len);
        &mut bytemuck::cast_slice_mut(&mut self.words)[start..start + len]
    }
}

impl AsRef<[u8]> for AlignedBody {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[self.start..self.start + self.len]
    }
}

/// A request, transport-independent.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// Method.
    pub method: Method,
    /// Path (no query).
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// A response, transport-independent.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers (content type, binary-extension header length).
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl ApiResponse {
    fn json(status: StatusCode, value: &Value) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Self { status, headers, body: Bytes::from(serde_json::to_vec(value).expect("JSON values serialise")) }
    }

    /// A protocol error body (`{"error": message}`) with `status`.
    pub fn error_response(status: StatusCode, message: &str) -> Self {
        Self::error(status, message)
    }

    fn error(status: StatusCode, message: &str) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Self { status, headers, body: Bytes::from(kserve::error_body(message)) }
    }

    fn empty(status: StatusCode) -> Self {
        Self { status, headers: HeaderMap::new(), body: Bytes::new() }
    }
}

/// Renders the Prometheus text exposition.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Describes the live cluster's hosts for `GET /v2/cluster`.
pub type ClusterReporter = Arc<dyn Fn() -> Value + Send + Sync>;

/// The client API.
pub struct Api {
    backend: Arc<dyn Backend>,
    /// The backend's models with the generation they were read at: every request looks
    /// its model up here, read again when the backend's generation moves on.
    models: std::sync::RwLock<(u64, Arc<Vec<ModelMetadata>>)>,
    metrics: Option<MetricsRenderer>,
    cluster: Option<ClusterReporter>,
    shared_memory: SharedMemoryRegistry,
    tracer: Tracer,
    cuda_device: bool,
    max_body: usize,
    admission: Admission,
}

/// The admission cap: inference requests in flight, and those refused at the cap.
#[derive(Debug)]
struct Admission {
    limit: usize,
    in_flight: Arc<AtomicUsize>,
    refused: AtomicU64,
}

/// One admitted request's place under the cap, given back when dropped (answered, or
/// abandoned by its client).
#[derive(Debug)]
pub struct Admitted(Arc<AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    fn enter(&self) -> Option<Admitted> {
        let admitted = self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1)).is_ok();
        if admitted {
            Some(Admitted(Arc::clone(&self.in_flight)))
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Api {
    /// An API answered by `backend` (whose models are read here, and again whenever
    /// its generation changes).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        let models = std::sync::RwLock::new((backend.generation(), Arc::new(backend.models())));
        let admission = Admission { limit: DEFAULT_MAX_IN_FLIGHT, in_flight: Arc::default(), refused: AtomicU64::new(0) };
        Self {
            backend,
            models,
            metrics: None,
            cluster: None,
            shared_memory: SharedMemoryRegistry::default(),
            tracer: Tracer::default(),
            cuda_device: false,
            max_body: DEFAULT_MAX_BODY,
            admission,
        }
    }

    /// Traces go to `file` when a client turns tracing on (Triton's trace extension);
    /// without one, tracing cannot be turned on.
    pub fn with_trace_file(mut self, file: Option<std::path::PathBuf>) -> Self {
        self.tracer = Tracer::new(file);
        self
    }

    /// The trace settings and file.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Whether the models run on a CUDA device (so that a CUDA shared-memory refusal
    /// can say why).
    pub fn with_cuda_device(mut self, cuda: bool) -> Self {
        self.cuda_device = cuda;
        self
    }

    /// Why a CUDA shared-memory registration is refused, pointing at system shared
    /// memory (`alternative`: where to register it).
    pub fn cuda_shared_memory_refusal(&self, alternative: &str) -> String {
        if self.cuda_device {
            format!("CUDA shared memory is not supported yet by this server: use system shared memory ({alternative})")
        } else {
            format!("no CUDA device: this server runs its models on the CPU, so CUDA shared memory cannot be registered; use system shared memory ({alternative})")
        }
    }

    /// The backend's models as of its current generation.
    fn models(&self) -> Arc<Vec<ModelMetadata>> {
        let generation = self.backend.generation();
        {
            let cached = self.models.read().unwrap_or_else(|p| p.into_inner());
            if cached.0 == generation {
                return Arc::clone(&cached.1);
            }
        }
        let fresh = Arc::new(self.backend.models());
        *self.models.write().unwrap_or_else(|p| p.into_inner()) = (generation, Arc::clone(&fresh));
        fresh
    }

    /// Admit at most `requests` inference requests at once; more get 503.
    pub fn with_max_in_flight(mut self, requests: usize) -> Self {
        self.admission.limit = requests.max(1);
        self
    }

    /// Inference requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight.load(Ordering::Acquire)
    }

    /// Inference requests refused at the admission cap so far.
    pub fn refused_at_cap(&self) -> u64 {
        self.admission.refused.load(Ordering::Relaxed)
    }

    /// Serve `GET /metrics` with `render`.
    pub fn with_metrics(mut self, render: MetricsRenderer) -> Self {
        self.metrics = Some(render);
        self
    }

    /// Serve `GET /v2/cluster` with `report` (a cluster controller).
    pub fn with_cluster(mut self, report: ClusterReporter) -> Self {
        self.cluster = Some(report);
        self
    }

    /// Refuse bodies larger than `bytes` with 413.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Largest body accepted (front ends stop reading past it).
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Answer one request: its body inflated if it came compressed, the answer
    /// compressed if the client accepts it (`super::compression`).
    pub async fn handle(&self, mut request: ApiRequest) -> ApiResponse {
        if request.headers.contains_key(http::header::CONTENT_ENCODING) {
            match compression::decode_request_body(&request.headers, std::mem::take(&mut request.body), self.max_body) {
                Ok(body) => {
                    request.body = body;
                    request.headers.remove(http::header::CONTENT_ENCODING);
                }
                Err(refused) => return ApiResponse::error(refused.status, &refused.reason),
            }
        }
        let encoding = compression::response_encoding(&request.headers);
        let mut response = self.route(request).await;
        if let Some(encoding) = encoding.filter(|_| !response.body.is_empty()) {
            response.body = compression::encode_response_body(encoding, &mut response.headers, &response.body);
        }
        response
    }

    /// Answer one request whose body is as the client wrote it.
    async fn route(&self, request: ApiRequest) -> ApiResponse {
        let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
        let get = request.method == Method::GET || request.method == Method::HEAD;
        match segments.as_slice() {
            ["metrics"] if get => match &self.metrics {
                Some(render) => {
                    let mut headers = HeaderMap::new();
                    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
                    ApiResponse { status: StatusCode::OK, headers, body: Bytes::from(render()) }
                }
                None => ApiResponse::error(StatusCode::NOT_FOUND, "metrics are not enabled"),
            },
            ["v2", "health", "live"] if get => ApiResponse::empty(StatusCode::OK),
            ["v2", "health", "ready"] if get => {
                ApiResponse::empty(if self.backend.ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE })
            }
            ["v2"] if get => ApiResponse::json(
                StatusCode::OK,
                &json!({ "name": "yardmaster", "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS }),
            ),
            ["v2", "models", "stats"] if get => self.statistics(None),
            ["v2", "systemsharedmemory", rest @ ..] => self.system_shared_memory(&request, rest),
            ["v2", "trace", "setting"] => self.trace_setting(&request, None),
            ["v2", "models", model, "trace", "setting"] => match self.served_model(model, None) {
                Ok(served) => self.trace_setting(&request, Some(&served.metadata().name)),
                Err(refusal) => ApiResponse::error(refusal.status, &refusal.reason),
            },
            ["v2", "logging"] if get => ApiResponse::json(StatusCode::OK, &super::logging::current().to_json()),
            ["v2", "logging"] if request.method == Method::POST => {
                let changes = match serde_json::from_slice::<Value>(&request.body) {
                    Ok(Value::Object(changes)) => changes,
                    Ok(other) => {
                        return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("log settings must be a JSON object, got {other}"))
                    }
                    Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("the log settings are not valid JSON: {e}")),
                };
                match super::logging::update(&changes) {
                    Ok(settings) => ApiResponse::json(StatusCode::OK, &settings.to_json()),
                    Err(reason) => ApiResponse::error(StatusCode::BAD_REQUEST, &reason),
                }
            }
            ["v2", "cudasharedmemory", "status"] if get => ApiResponse::json(StatusCode::OK, &json!([])),
            ["v2", "cudasharedmemory", ..] if request.method == Method::POST => {
                ApiResponse::error(StatusCode::BAD_REQUEST, &self.cuda_shared_memory_refusal("/v2/systemsharedmemory"))
            }
            ["v2", "cluster"] if get => match &self.cluster {
                Some(report) => ApiResponse::json(StatusCode::OK, &report()),
                None => {
                    ApiResponse::error(StatusCode::NOT_FOUND, "this server is not a cluster controller (no [cluster] nodes are configured)")
                }
            },
            ["v2", "repository", "index"] if request.method == Method::POST => self.repository_index(&request),
            ["v2", "repository", "models", model, action @ ("load" | "unload")] if request.method == Method::POST => {
                self.model_control(&request, model, action).await
            }
            ["v2", "models", model, rest @ ..] => self.model_route(&request, model, rest).await,
            other if known_route(other) => ApiResponse::error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {} not allowed on {} (see the Allow list in docs/serving.md)", request.method, request.path),
            ),
            _ => ApiResponse::error(StatusCode::NOT_FOUND, &format!("no route {} {}", request.method, request.path)),
        }
    }

    /// The shared-memory regions registered with this server (shared with gRPC).
    pub fn shared_memory(&self) -> &SharedMemoryRegistry {
        &self.shared_memory
    }

    /// Triton's system shared-memory extension: `GET status`, `GET region/{r}/status`,
    /// `POST region/{r}/register` (`{"key", "offset", "byte_size"}`), `POST
    /// region/{r}/unregister`, `POST unregister` (every region).
    fn system_shared_memory(&self, request: &ApiRequest, rest: &[&str]) -> ApiResponse {
        let get = request.method == Method::GET || request.method == Method::HEAD;
        let post = request.method == Method::POST;
        let refused = |e: super::shared_memory::SharedMemoryError| ApiResponse::error(StatusCode::BAD_REQUEST, &e.0);
        match rest {
            ["status"] if get => self.shared_memory.status(None).map_or_else(refused, |v| ApiResponse::json(StatusCode::OK, &v)),
            ["region", name, "status"] if get => {
                self.shared_memory.status(Some(name)).map_or_else(refused, |v| ApiResponse::json(StatusCode::OK, &v))
            }
            ["region", name, "register"] if post => {
                let body: Value = match serde_json::from_slice(&request.body) {
                    Ok(body) => body,
                    Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("the register request is not valid JSON: {e}")),
                };
                let Some(key) = body["key"].as_str() else {
                    return ApiResponse::error(StatusCode::BAD_REQUEST, "register needs a \"key\" string (the shm_open name)");
                };
                let Some(byte_size) = body["byte_size"].as_u64() else {
                    return ApiResponse::error(StatusCode::BAD_REQUEST, "register needs a \"byte_size\" (a non-negative integer)");
                };
                let offset = body["offset"].as_u64().unwrap_or(0);
                match self.shared_memory.register(name, key, offset, byte_size) {
                    Ok(()) => ApiResponse::empty(StatusCode::OK),
                    Err(e) => refused(e),
                }
            }
            ["region", name, "unregister"] if post => match self.shared_memory.unregister(name) {
                Ok(()) => ApiResponse::empty(StatusCode::OK),
                Err(e) => refused(e),
            },
            ["unregister"] if post => {
                self.shared_memory.unregister_all();
                ApiResponse::empty(StatusCode::OK)
            }
            ["status"] | ["region", _, "status" | "register" | "unregister"] | ["unregister"] => {
                ApiResponse::error(StatusCode::METHOD_NOT_ALLOWED, &format!("method {} not allowed on {}", request.method, request.path))
            }
            _ => ApiResponse::error(StatusCode::NOT_FOUND, &format!("no route {} {}", request.method, request.path)),
        }
    }

    /// `POST /v2/repository/models/{m}/load` or `…/unload`, with an optional body
    /// `{"parameters": {…}}`.
    async fn model_control(&self, request: &ApiRequest, model: &str, action: &str) -> ApiResponse {
        let parameters = if request.body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice::<Value>(&request.body) {
                Ok(body) => body.get("parameters").cloned().unwrap_or(Value::Null),
                Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("the {action} request is not valid JSON: {e}")),
            }
        };
        let done = if action == "load" {
            self.backend.load_model(model, parameters).await
        } else {
            self.backend.unload_model(model, parameters).await
        };
        match done.map_err(Refusal::from) {
            Ok(()) => ApiResponse::empty(StatusCode::OK),
            Err(refusal) => ApiResponse::error(refusal.status, &refusal.reason),
        }
    }

    /// The model `name` (at `version`, when given) among those served now; 404 when
    /// there is no such model or version.
    pub fn served_model(&self, name: &str, version: Option<&str>) -> Result<ServedModel, Refusal> {
        let models = self.models();
        let Some(index) = models.iter().position(|m| m.name == name) else {
            let known: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
            let message = kserve::unknown_model_message(name);
            return Err(Refusal::new(StatusCode::NOT_FOUND, format!("{message} (served: {})", known.join(", "))));
        };
        if let Some(version) = version {
            let versions = &models[index].versions;
            if !versions.iter().any(|v| v == version) {
                return Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    format!("{} (versions: {})", kserve::unknown_version_message(name, version), versions.join(", ")),
                ));
            }
        }
        Ok(ServedModel { models, index, version: version.map(str::to_string) })
    }

    /// What answers the requests (health, statistics, the repository calls).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Take a place under the admission cap for one inference request, or refuse it
    /// (503) when the server already holds its limit.
    pub fn admit(&self) -> Result<Admitted, Refusal> {
        self.admission.enter().ok_or_else(|| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "overloaded: the server already holds its limit of {} requests in flight (max_in_flight); retry later",
                    self.admission.limit
                ),
            )
        })
    }

    /// Run a decoded, admitted request on `model`: its inputs are checked against the
    /// model's metadata, then the backend answers it. The caller encodes the response
    /// (and picks the outputs the request asked for).
    pub async fn run_inference(&self, model: &ServedModel, request: InferRequest) -> Result<InferResponse, Refusal> {
        let metadata = model.metadata();
        check_inputs(&request, metadata).map_err(|message| Refusal::new(StatusCode::BAD_REQUEST, message))?;
        let traced = self.tracer.sample(&metadata.name);
        let started = traced.as_ref().map(|_| std::time::Instant::now());
        let answer = self.backend.infer_version(&metadata.name, model.version(), request).await;
        if let Some(traced) = traced {
            let version = match &answer {
                Ok(response) => response.model_version.clone(),
                Err(_) => None,
            };
            let version = version.or_else(|| model.version().map(str::to_string)).unwrap_or_else(|| "1".into());
            let timing = match &answer {
                Ok(InferResponse { timing: Some(timing), .. }) => *timing,
                // A backend that keeps no engine times: the request's own span, on a clock of its own.
                _ => RequestTiming {
                    request_start: 0,
                    request_end: started.map_or(0, |s| s.elapsed().as_nanos() as u64),
                    ..Default::default()
                },
            };
            let completed = matches!(&answer, Ok(InferResponse { timing: Some(_), .. }));
            self.tracer.record(traced, &metadata.name, &version, &timing, completed);
        }
        answer.map_err(|error| match error {
            InferError::Invalid(message) => Refusal::new(StatusCode::BAD_REQUEST, message),
            InferError::Dropped(reason) => Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("dropped by the scheduler: {reason}")),
            InferError::Failed(error) => Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("failed: {error}")),
            InferError::Unavailable(reason) => Refusal::new(StatusCode::SERVICE_UNAVAILABLE, reason),
        })
    }

    async fn model_route(&self, request: &ApiRequest, model: &str, rest: &[&str]) -> ApiResponse {
        let (version, rest) = match rest {
            ["versions", version, rest @ ..] => (Some(*version), rest),
            rest => (None, rest),
        };
        let served = match self.served_model(model, version) {
            Ok(served) => served,
            Err(refusal) => return ApiResponse::error(refusal.status, &refusal.reason),
        };
        let metadata = served.metadata();
        let get = request.method == Method::GET || request.method == Method::HEAD;
        match rest {
            [] if get => ApiResponse::json(StatusCode::OK, &metadata_json(metadata)),
            ["ready"] if get => {
                ApiResponse::empty(if self.backend.model_ready(&metadata.name) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE })
            }
            ["stats"] if get => self.statistics(Some(&metadata.name)),
            ["config"] if get => ApiResponse::json(StatusCode::OK, &served.config()),
            ["infer"] if request.method == Method::POST => self.infer(request, &served).await,
            ["generate"] | ["generate_stream"] => ApiResponse::error(
                StatusCode::NOT_IMPLEMENTED,
                "the generate extension is not supported: use POST …/infer (and gRPC ModelStreamInfer for a decoupled model's responses)",
            ),
            [] | ["ready"] | ["config"] | ["stats"] | ["infer"] => {
                ApiResponse::error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
            }
            _ => ApiResponse::error(StatusCode::NOT_FOUND, &format!("no route {} {}", request.method, request.path)),
        }
    }

    /// `POST /v2/repository/index`, optionally `{"ready": true}` for the ready models only.
    fn repository_index(&self, request: &ApiRequest) -> ApiResponse {
        let ready_only = if request.body.is_empty() {
            false
        } else {
            match serde_json::from_slice::<Value>(&request.body) {
                Ok(body) => body.get("ready").and_then(Value::as_bool).unwrap_or(false),
                Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("the index request is not valid JSON: {e}")),
            }
        };
        let models: Vec<Value> = self.backend.repository_index().into_iter().filter(|m| !ready_only || m["state"] == "READY").collect();
        ApiResponse::json(StatusCode::OK, &Value::Array(models))
    }

    /// `GET`/`POST` of the trace settings of the server (`model`: `None`) or a model.
    fn trace_setting(&self, request: &ApiRequest, model: Option<&str>) -> ApiResponse {
        if request.method == Method::GET || request.method == Method::HEAD {
            return ApiResponse::json(StatusCode::OK, &self.tracer.settings_json(model));
        }
        if request.method != Method::POST {
            return ApiResponse::error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route");
        }
        let changes = match serde_json::from_slice::<Value>(&request.body) {
            Ok(Value::Object(changes)) => changes,
            Ok(other) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("trace settings must be a JSON object, got {other}")),
            Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("the trace settings are not valid JSON: {e}")),
        };
        match self.tracer.update(model, &changes) {
            Ok(settings) => ApiResponse::json(StatusCode::OK, &settings),
            Err(reason) => ApiResponse::error(StatusCode::BAD_REQUEST, &reason),
        }
    }

    fn statistics(&self, model: Option<&str>) -> ApiResponse {
        match self.backend.statistics(model) {
            Ok(stats) => ApiResponse::json(StatusCode::OK, &stats),
            Err(reason) => ApiResponse::error(StatusCode::NOT_FOUND, &reason),
        }
    }

    async fn infer(&self, request: &ApiRequest, model: &ServedModel) -> ApiResponse {
        if request.body.len() > self.max_body {
            return ApiResponse::error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("body of {} bytes exceeds the limit of {}", request.body.len(), self.max_body),
            );
        }
        if model.decoupled() {
            return ApiResponse::error(StatusCode::BAD_REQUEST, &super::decoupled::unary_refusal("HTTP end point", &model.metadata().name));
        }
        let _admitted = match self.admit() {
            Ok(admitted) => admitted,
            Err(refusal) => return ApiResponse::error(refusal.status, &refusal.reason),
        };
        let json_length = match request.headers.get(kserve::HEADER_CONTENT_LENGTH) {
            None => None,
            Some(value) => match value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()) {
                Some(n) => Some(n),
                None => {
                    return ApiResponse::error(StatusCode::BAD_REQUEST, "Inference-Header-Content-Length must be a non-negative integer")
                }
            },
        };
        let mut decoded = match kserve::decode_request_in(&request.body, json_length, Some(&self.shared_memory)) {
            Ok(decoded) => decoded,
            Err(e) => return ApiResponse::error(StatusCode::BAD_REQUEST, &format!("model {:?}: {}", model.metadata().name, e.0)),
        };
        if decoded.schedule.split_key.is_none() {
            decoded.schedule.split_key = request.headers.get(super::ab::KEY_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
        }
        let requested = decoded.outputs.clone();
        let all_binary = decoded.parameters.get("binary_data_output").and_then(Value::as_bool).unwrap_or(false);
        match self.run_inference(model, decoded).await {
            Ok(response) => match kserve::encode_response_in(&response, &requested, all_binary, Some(&self.shared_memory)) {
                Ok(encoded) => {
                    let mut headers = HeaderMap::new();
                    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    if let Some(n) = encoded.json_length {
                        headers.insert(kserve::HEADER_CONTENT_LENGTH, HeaderValue::from(n));
                        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                    }
                    ApiResponse { status: StatusCode::OK, headers, body: Bytes::from(encoded.bytes) }
                }
                Err(e) => ApiResponse::error(StatusCode::BAD_REQUEST, &e.0),
            },
            Err(refusal) => ApiResponse::error(refusal.status, &refusal.reason),
        }
    }
}

/// Whether `segments` name a route this API answers with some method (so another
/// method gets 405, and an unknown route 404).
fn known_route(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["metrics"]
            | ["v2"]
            | ["v2", "health", "live" | "ready"]
            | ["v2", "models", "stats"]
            | ["v2", "cluster"]
            | ["v2", "logging"]
            | ["v2", "cudasharedmemory", ..]
            | ["v2", "repository", "index"]
            | ["v2", "repository", "models", _, "load" | "unload"]
    )
}

/// Inputs must be the model's, with its types and compatible shapes; a refusal names
/// the model and the input.
fn check_inputs(request: &InferRequest, metadata: &ModelMetadata) -> Result<(), String> {
    let model = &metadata.name;
    for tensor in &request.inputs {
        let Some(spec) = metadata.inputs.iter().find(|s| s.name == tensor.name) else {
            let names: Vec<&str> = metadata.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(format!("model {:?} has no input {:?} (inputs: {})", metadata.name, tensor.name, names.join(", ")));
        };
        if spec.datatype != tensor.datatype {
            return Err(format!(
                "model {model:?}: input {:?} must be {}, got {}",
                tensor.name,
                spec.datatype.name(),
                tensor.datatype.name()
            ));
        }
        let fits = spec.shape.len() == tensor.shape.len()
            && spec.shape.iter().zip(&tensor.shape).all(|(want, got)| *want < 0 || *want as u64 == *got);
        if !fits {
            return Err(format!(
                "model {model:?}: input {:?} must have shape {:?} (-1: any), got {:?}",
                tensor.name, spec.shape, tensor.shape
            ));
        }
    }
    if let Some(missing) = metadata.inputs.iter().find(|s| !request.inputs.iter().any(|t| t.name == s.name)) {
        return Err(format!("model {model:?}: input {:?} is missing", missing.name));
    }
    Ok(())
}

fn metadata_json(metadata: &ModelMetadata) -> Value {
    let tensors = |specs: &[TensorSpec]| -> Value {
        specs.iter().map(|s| json!({ "name": s.name, "datatype": s.datatype.name(), "shape": s.shape })).collect()
    };
    json!({
        "name": metadata.name,
        "versions": metadata.versions,
        "platform": metadata.platform,
        "inputs": tensors(&metadata.inputs),
        "outputs": tensors(&metadata.outputs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::Tensor;

    #[test]
    fn a_body_in_pieces_is_gathered_once_with_its_binary_data_aligned_and_reaches_the_data_plane_in_place() {
        use crate::tensor_codec::{TensorCodec, TensorDecl};
        let header = r#"{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","parameters":{"binary_data_size":12}}]}"#;
        let values = [0.25f32, -1.0, 3.5];
        let mut body = header.as_bytes().to_vec();
        body.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let mut headers = HeaderMap::new();
        headers.insert(kserve::HEADER_CONTENT_LENGTH, HeaderValue::from(header.len()));
        let mut pieces = BodyChunks::default();
        for piece in body.chunks(7) {
            pieces.push(Bytes::copy_from_slice(piece));
        }
        let gathered = pieces.gather(&headers);
        assert_eq!(&gathered[..], &body[..]);
        assert!((gathered[header.len()..].as_ptr() as usize).is_multiple_of(8), "the binary data starts aligned");
        let whole = Bytes::from(body.clone());
        let mut one = BodyChunks::default();
        one.push(whole.clone());
        assert_eq!(one.gather(&headers).as_ptr(), whole.as_ptr(), "a body in one piece is not copied");
        // Decoded and carried to the data plane: the gathered body's bytes, in place.
        let request = kserve::decode_request_in(&gathered, Some(header.len()), None).unwrap();
        let codec = TensorCodec {
            inputs: vec![TensorDecl::new("x", vec![-1, 3], DataType::F32)],
            outputs: vec![TensorDecl::new("y", vec![-1, 3], DataType::F32)],
            batching: true,
            max_batch_size: 4,
        };
        let tensors = codec.decode(&request).unwrap();
        assert!(tensors[0].data.shares(&gathered[header.len()..]), "the data plane's input is the body's bytes");
        assert_eq!(tensors[0].data.as_f32(), Some(&values[..]));
    }

    /// Doubles its FP32 input; drops requests whose priority is 9.
    struct Doubler;

    impl Backend for Doubler {
        fn models(&self) -> Vec<ModelMetadata> {
            vec![ModelMetadata {
                name: "double".into(),
                versions: vec!["1".into()],
                platform: "test".into(),
                inputs: vec![TensorSpec { name: "x".into(), datatype: DataType::F32, shape: vec![-1] }],
                outputs: vec![TensorSpec { name: "y".into(), datatype: DataType::F32, shape: vec![-1] }],
                config: None,
            }]
        }
        fn ready(&self) -> bool {
            true
        }
        fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
            let model = model.to_string();
            Box::pin(async move {
                if request.schedule.priority == Some(9) {
                    return Err(InferError::Dropped("cannot finish before its deadline".into()));
                }
                let x = request.inputs[0].as_f32().unwrap();
                let y: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
                Ok(InferResponse {
                    timing: None,
                    model_name: model,
                    model_version: Some("1".into()),
                    id: request.id,
                    parameters: Default::default(),
                    outputs: vec![Tensor::f32("y", vec![y.len() as u64], &y).unwrap()],
                })
            })
        }
    }

    fn call(api: &Api, method: Method, path: &str, body: &str) -> ApiResponse {
        let request = ApiRequest { method, path: path.into(), headers: HeaderMap::new(), body: Bytes::from(body.to_string()) };
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(api.handle(request))
    }

    fn json_of(response: &ApiResponse) -> Value {
        serde_json::from_slice(&response.body).unwrap()
    }

    #[test]
    fn metadata_health_and_infer() {
        let api = Api::new(Arc::new(Doubler)).with_metrics(Arc::new(|| "up 1\n".into()));
        assert_eq!(call(&api, Method::GET, "/v2/health/live", "").status, StatusCode::OK);
        assert_eq!(call(&api, Method::GET, "/v2/health/ready", "").status, StatusCode::OK);
        assert_eq!(json_of(&call(&api, Method::GET, "/v2", ""))["name"], "yardmaster");
        let metadata = json_of(&call(&api, Method::GET, "/v2/models/double", ""));
        assert_eq!(metadata["inputs"][0], json!({"name": "x", "datatype": "FP32", "shape": [-1]}));
        assert_eq!(call(&api, Method::GET, "/v2/models/double/versions/1/ready", "").status, StatusCode::OK);
        let response = call(
            &api,
            Method::POST,
            "/v2/models/double/infer",
            r#"{"id":"a","inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1.5,2]}]}"#,
        );
        assert_eq!(response.status, StatusCode::OK);
        let body = json_of(&response);
        assert_eq!(body["id"], "a");
        assert_eq!(body["outputs"][0]["data"], json!([3.0, 4.0]));
        assert_eq!(&call(&api, Method::GET, "/metrics", "").body[..], b"up 1\n");
        let cluster = call(&api, Method::GET, "/v2/cluster", "");
        assert_eq!(cluster.status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&cluster.body).contains("not a cluster controller"));
        let api = api.with_cluster(Arc::new(|| json!({"hosts": [{"name": "node-0"}]})));
        assert_eq!(json_of(&call(&api, Method::GET, "/v2/cluster", ""))["hosts"][0]["name"], "node-0");
    }

    #[test]
    fn refusals_have_the_right_status_and_a_reason() {
        let api = Api::new(Arc::new(Doubler)).with_max_body(1000);
        let cases = [
            (Method::GET, "/v2/models/nope", "".to_string(), StatusCode::NOT_FOUND, "Request for unknown model: 'nope' is not found"),
            (
                Method::GET,
                "/v2/models/double/versions/7",
                "".into(),
                StatusCode::NOT_FOUND,
                "Request for unknown model: 'double' version 7 is not found",
            ),
            (Method::GET, "/v2/nothing/here", "".into(), StatusCode::NOT_FOUND, "no route"),
            (
                Method::POST,
                "/v2/models/double/generate_stream",
                "{}".into(),
                StatusCode::NOT_IMPLEMENTED,
                "generate extension is not supported",
            ),
            (Method::POST, "/v2/trace/setting", r#"{"trace_level":["TIMESTAMPS"]}"#.into(), StatusCode::BAD_REQUEST, "needs a trace file"),
            (Method::POST, "/v2/models/nope/trace/setting", "{}".into(), StatusCode::NOT_FOUND, "unknown model"),
            (Method::GET, "/v2/systemsharedmemory/region/x/status", "".into(), StatusCode::BAD_REQUEST, "Unable to find"),
            (Method::POST, "/v2/cudasharedmemory/region/x/register", "{}".into(), StatusCode::BAD_REQUEST, "no CUDA device"),
            (Method::DELETE, "/v2/health/ready", "".into(), StatusCode::METHOD_NOT_ALLOWED, "not allowed"),
            (Method::GET, "/v2/repository/index", "".into(), StatusCode::METHOD_NOT_ALLOWED, "not allowed"),
            (Method::GET, "/v2/models/double/infer", "".into(), StatusCode::METHOD_NOT_ALLOWED, "not allowed"),
            (Method::GET, "/elsewhere", "".into(), StatusCode::NOT_FOUND, "no route"),
            (Method::POST, "/v2/models/double/infer", "{".into(), StatusCode::BAD_REQUEST, "not valid JSON"),
            (
                Method::POST,
                "/v2/models/double/infer",
                r#"{"inputs":[{"name":"z","shape":[1],"datatype":"FP32","data":[1]}]}"#.into(),
                StatusCode::BAD_REQUEST,
                "has no input \"z\"",
            ),
            (
                Method::POST,
                "/v2/models/double/infer",
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1]}]}"#.into(),
                StatusCode::BAD_REQUEST,
                "must be FP32",
            ),
            (
                Method::POST,
                "/v2/models/double/infer",
                r#"{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1]}]}"#.into(),
                StatusCode::BAD_REQUEST,
                "must have shape",
            ),
            (
                Method::POST,
                "/v2/models/double/infer",
                r#"{"parameters":{"priority":9},"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#.into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "dropped by the scheduler: cannot finish",
            ),
            (Method::POST, "/v2/models/double/infer", "x".repeat(2000), StatusCode::PAYLOAD_TOO_LARGE, "exceeds"),
        ];
        for (method, path, body, status, reason) in cases {
            let response = call(&api, method.clone(), path, &body);
            assert_eq!(response.status, status, "{method} {path}");
            let message = json_of(&response)["error"].as_str().unwrap().to_string();
            assert!(message.contains(reason), "{method} {path}: {message:?} should mention {reason:?}");
        }
        assert_eq!(call(&api, Method::GET, "/metrics", "").status, StatusCode::NOT_FOUND);
    }

    /// Answers once the gate opens.
    struct Gated(Arc<tokio::sync::Semaphore>);

    impl Backend for Gated {
        fn models(&self) -> Vec<ModelMetadata> {
            Doubler.models()
        }
        fn ready(&self) -> bool {
            true
        }
        fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
            let model = model.to_string();
            Box::pin(async move {
                let _pass = self.0.acquire().await.map_err(|e| InferError::Failed(e.to_string()))?;
                Doubler.infer(&model, request).await
            })
        }
    }

    #[test]
    fn requests_past_the_admission_cap_get_503_and_places_are_given_back() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let api = Arc::new(Api::new(Arc::new(Gated(Arc::clone(&gate)))).with_max_in_flight(2));
        let body = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#;
        let request = move || ApiRequest {
            method: Method::POST,
            path: "/v2/models/double/infer".into(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut held: Vec<_> = (0..2)
                .map(|_| {
                    let api = Arc::clone(&api);
                    tokio::spawn(async move { api.handle(request()).await })
                })
                .collect();
            tokio::task::yield_now().await;
            assert_eq!(api.in_flight(), 2);
            let refused = api.handle(request()).await;
            assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
            let message = json_of(&refused)["error"].as_str().unwrap().to_string();
            assert!(message.contains("limit of 2 requests in flight") && message.contains("max_in_flight"), "{message}");
            assert_eq!(api.refused_at_cap(), 1);
            // A client that goes away gives its place back.
            let first = held.remove(0);
            first.abort();
            assert!(first.await.is_err(), "the first request was abandoned");
            tokio::task::yield_now().await;
            assert_eq!(api.in_flight(), 1);
            gate.add_permits(10);
            assert_eq!(api.handle(request()).await.status, StatusCode::OK);
            while api.in_flight() > 0 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(api.refused_at_cap(), 1);
    }
}
