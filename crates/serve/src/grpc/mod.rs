//! KServe v2 over gRPC: the `inference.GRPCInferenceService` that Triton's gRPC
//! clients (`tritonclient.grpc`, `perf_analyzer -i grpc`) speak, answered by the same
//! [`Api`] as HTTP — the same models, admission cap, input checks, backend and
//! refusals — so a request is scheduled alike whichever transport carried it.
//!
//! Calls served: health (`ServerLive`, `ServerReady`, `ModelReady`), metadata
//! (`ServerMetadata`, `ModelMetadata`), inference (`ModelInfer`, and
//! `ModelStreamInfer`: one response per request on the stream, matched by id, or a
//! decoupled model's rows, each flagged, see `super::decoupled`),
//! Triton's extensions `ModelConfig`, `ModelStatistics`, `RepositoryIndex`,
//! `RepositoryModelLoad`, `RepositoryModelUnload`, and system shared memory
//! (`SystemSharedMemory*`, the regions shared with HTTP, see `super::shared_memory`;
//! `CudaSharedMemory*` answer an empty status and refuse registration), and
//! `LogSettings` (Triton's logging extension, `super::logging`) and `TraceSetting`
//! (Triton's trace extension, `super::trace`). Refusals map HTTP's statuses to gRPC codes:
//! 400 `INVALID_ARGUMENT`, 404 `NOT_FOUND`, 409 `FAILED_PRECONDITION`, 503
//! `UNAVAILABLE` (dropped by the policy, over the admission cap, not ready), 500
//! `INTERNAL`; the message is the same reason. The A/B split key comes from the
//! `split_key` request parameter or the `x-yardmaster-key` metadata entry. Messages
//! may come compressed (gzip or deflate, `grpc-encoding`), and answers go compressed
//! in the encoding the client accepts (`grpc-accept-encoding`).
//!
//! The protocol's `.proto` files live in `proto/` (written for Yardmaster from the
//! published protocol) and are compiled by the build script with no `protoc`.

mod convert;

pub use convert::{message_descriptor, message_from_json};

use std::pin::Pin;
use std::sync::Arc;

use http::StatusCode;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status, Streaming};

use super::api::{Api, Refusal, ServedModel, EXTENSIONS};
use super::decoupled;
use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::*;

/// The protocol's messages and service, generated from `proto/` by the build script.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// The default gRPC port, as Triton's tools expect (HTTP 8000, gRPC 8001, metrics 8002).
pub const DEFAULT_PORT: u16 = 8001;

/// Serve the gRPC protocol on `listener` until `shutdown` turns true; requests in
/// progress finish first.
pub async fn serve(listener: TcpListener, api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    let service = GrpcInferenceServiceServer::new(InferenceService { api: Arc::clone(&api) })
        .max_decoding_message_size(api.max_body())
        .max_encoding_message_size(usize::MAX)
        // gRPC message compression both ways, as Triton's clients ask for it.
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Deflate);
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        if let Ok(stream) = &stream {
            let _ = stream.set_nodelay(true);
        }
        stream
    });
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    if let Err(error) = tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, stop).await {
        tracing::warn!("the gRPC listener stopped: {error}");
    }
}

/// The gRPC service over the client API.
struct InferenceService {
    api: Arc<Api>,
}

/// The gRPC status that stands for a refusal's HTTP status.
fn status_of(refusal: Refusal) -> Status {
    let code = match refusal.status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::InvalidArgument,
        StatusCode::NOT_FOUND => tonic::Code::NotFound,
        StatusCode::CONFLICT => tonic::Code::FailedPrecondition,
        StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
        _ => tonic::Code::Internal,
    };
    Status::new(code, refusal.reason)
}

/// `""` (the protocol's "not given") as `None`.
fn given(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

impl InferenceService {
    fn model(&self, name: &str, version: &str) -> Result<ServedModel, Status> {
        self.api.served_model(name, given(version)).map_err(status_of)
    }

    /// One inference, from the protocol's request to its response: admitted under the
    /// cap, decoded, run, encoded. A decoupled model is refused here, as in Triton: it
    /// answers over `ModelStreamInfer` only.
    async fn infer(api: &Api, request: ModelInferRequest, split_key: Option<String>) -> Result<ModelInferResponse, Status> {
        let (response, requested, _) = Self::run(api, request, split_key, false).await?;
        convert::infer_response(&response, &requested, Some(api.shared_memory())).map_err(|e| Status::invalid_argument(e.0))
    }

    /// Run one request (admitted under the cap, decoded): its response, the outputs it
    /// asked for and whether the model is decoupled (`streaming`: the caller can send a
    /// decoupled model's responses).
    async fn run(
        api: &Api,
        request: ModelInferRequest,
        split_key: Option<String>,
        streaming: bool,
    ) -> Result<(super::kserve::InferResponse, Vec<super::kserve::RequestedOutput>, bool), Status> {
        let _admitted = api.admit().map_err(status_of)?;
        let model = api.served_model(&request.model_name, given(&request.model_version)).map_err(status_of)?;
        let decoupled = model.decoupled();
        if decoupled && !streaming {
            return Err(Status::invalid_argument(decoupled::unary_refusal("ModelInfer RPC", &model.metadata().name)));
        }
        let mut decoded = convert::infer_request(request, Some(api.shared_memory())).map_err(|e| Status::invalid_argument(e.0))?;
        if decoded.schedule.split_key.is_none() {
            decoded.schedule.split_key = split_key;
        }
        let requested = decoded.outputs.clone();
        let response = api.run_inference(&model, decoded).await.map_err(status_of)?;
        Ok((response, requested, decoupled))
    }

    /// One request on a stream: its responses, in order (one for a model that is not
    /// decoupled; a decoupled model's rows, each flagged, see `super::decoupled`), or an
    /// error response carrying the request's id.
    async fn stream_answers(api: &Api, request: ModelInferRequest, split_key: Option<String>) -> Vec<ModelStreamInferResponse> {
        let id = request.id.clone();
        let empty_final = request
            .parameters
            .get(decoupled::ENABLE_EMPTY_FINAL)
            .is_some_and(|p| matches!(p.parameter_choice, Some(proto::infer_parameter::ParameterChoice::BoolParam(true))));
        let failed = |message: String| {
            vec![ModelStreamInferResponse {
                error_message: message,
                infer_response: Some(ModelInferResponse { id: id.clone(), ..Default::default() }),
            }]
        };
        let (response, requested, is_decoupled) = match Self::run(api, request, split_key, true).await {
            Ok(ran) => ran,
            Err(status) => return failed(status.message().to_string()),
        };
        let responses = if is_decoupled {
            match decoupled::responses(response, empty_final) {
                Ok(responses) => responses,
                Err(error) => return failed(error),
            }
        } else {
            vec![response]
        };
        let mut answers = Vec::with_capacity(responses.len());
        for response in responses {
            // An empty final response names no outputs, whatever the request asked for.
            let wanted: &[super::kserve::RequestedOutput] = if response.outputs.is_empty() { &[] } else { &requested };
            match convert::infer_response(&response, wanted, Some(api.shared_memory())) {
                Ok(message) => answers.push(ModelStreamInferResponse { error_message: String::new(), infer_response: Some(message) }),
                Err(error) => return failed(error.0),
            }
        }
        answers
    }
}

fn split_key<T>(request: &Request<T>) -> Option<String> {
    request.metadata().get(super::ab::KEY_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string)
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.api.backend().ready() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let request = request.into_inner();
        let ready = match self.api.served_model(&request.name, given(&request.version)) {
            Ok(model) => self.api.backend().model_ready(&model.metadata().name),
            Err(_) => false,
        };
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "yardmaster".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> Result<Response<ModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let model = self.model(&request.name, &request.version)?;
        let metadata = model.metadata();
        let tensors = |specs: &[super::api::TensorSpec]| {
            specs
                .iter()
                .map(|s| model_metadata_response::TensorMetadata {
                    name: s.name.clone(),
                    datatype: s.datatype.name().into(),
                    shape: s.shape.clone(),
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: metadata.name.clone(),
            versions: metadata.versions.clone(),
            platform: metadata.platform.clone(),
            inputs: tensors(&metadata.inputs),
            outputs: tensors(&metadata.outputs),
        }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let key = split_key(&request);
        Self::infer(&self.api, request.into_inner(), key).await.map(Response::new)
    }

    type ModelStreamInferStream = ResponseStream;

    async fn model_stream_infer(&self, request: Request<Streaming<ModelInferRequest>>) -> Result<Response<ResponseStream>, Status> {
        let key = split_key(&request);
        let mut requests = request.into_inner();
        let (sender, receiver) = mpsc::channel(64);
        let api = Arc::clone(&self.api);
        tokio::spawn(async move {
            while let Some(next) = requests.next().await {
                let request = match next {
                    Ok(request) => request,
                    Err(status) => {
                        let _ = sender.send(Err(status)).await;
                        break;
                    }
                };
                let (api, sender, key) = (Arc::clone(&api), sender.clone(), key.clone());
                tokio::spawn(async move {
                    // A client that closes the stream cancels its requests still running
                    // (dropping the inference ends it in the engine, once).
                    let answers = tokio::select! {
                        answers = InferenceService::stream_answers(&api, request, key) => answers,
                        _ = sender.closed() => return,
                    };
                    for answer in answers {
                        if sender.send(Ok(answer)).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn model_config(&self, request: Request<ModelConfigRequest>) -> Result<Response<ModelConfigResponse>, Status> {
        let request = request.into_inner();
        let model = self.model(&request.name, &request.version)?;
        let config = convert::message_from_json::<ModelConfig>("ModelConfig", &model.config())
            .map_err(|e| Status::internal(format!("the configuration of {:?} does not convert: {e}", request.name)))?;
        Ok(Response::new(ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(&self, request: Request<ModelStatisticsRequest>) -> Result<Response<ModelStatisticsResponse>, Status> {
        let request = request.into_inner();
        let name = match given(&request.name) {
            Some(name) => Some(self.model(name, &request.version)?.metadata().name.clone()),
            None => None,
        };
        let stats = self.api.backend().statistics(name.as_deref()).map_err(Status::not_found)?;
        let message = convert::message_from_json::<ModelStatisticsResponse>("ModelStatisticsResponse", &stats)
            .map_err(|e| Status::internal(format!("the statistics do not convert: {e}")))?;
        Ok(Response::new(message))
    }

    async fn repository_index(&self, request: Request<RepositoryIndexRequest>) -> Result<Response<RepositoryIndexResponse>, Status> {
        let ready_only = request.into_inner().ready;
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        let models = self
            .api
            .backend()
            .repository_index()
            .into_iter()
            .filter(|m| !ready_only || m["state"] == "READY")
            .map(|m| repository_index_response::ModelIndex {
                name: text(&m, "name"),
                version: text(&m, "version"),
                state: text(&m, "state"),
                reason: text(&m, "reason"),
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let request = request.into_inner();
        let parameters = convert::repository_parameters_json(&request.parameters);
        self.api.backend().load_model(&request.model_name, parameters).await.map_err(|e| status_of(e.into()))?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let request = request.into_inner();
        let parameters = convert::repository_parameters_json(&request.parameters);
        self.api.backend().unload_model(&request.model_name, parameters).await.map_err(|e| status_of(e.into()))?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        let name = request.into_inner().name;
        let registry = self.api.shared_memory();
        if !name.is_empty() {
            registry.status(Some(&name)).map_err(|e| Status::invalid_argument(e.0))?;
        }
        let regions = registry
            .regions()
            .into_iter()
            .filter(|(region, ..)| name.is_empty() || *region == name)
            .map(|(name, key, offset, byte_size)| {
                (name.clone(), system_shared_memory_status_response::RegionStatus { name, key, offset, byte_size })
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        let r = request.into_inner();
        self.api.shared_memory().register(&r.name, &r.key, r.offset, r.byte_size).map_err(|e| Status::invalid_argument(e.0))?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        let name = request.into_inner().name;
        let registry = self.api.shared_memory();
        if name.is_empty() {
            registry.unregister_all();
        } else {
            registry.unregister(&name).map_err(|e| Status::invalid_argument(e.0))?;
        }
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn log_settings(&self, request: Request<LogSettingsRequest>) -> Result<Response<LogSettingsResponse>, Status> {
        use log_settings_request::setting_value::ParameterChoice as In;
        use log_settings_response::setting_value::ParameterChoice as Out;
        let changes: serde_json::Map<String, Value> = request
            .into_inner()
            .settings
            .into_iter()
            .map(|(key, value)| {
                let value = match value.parameter_choice {
                    Some(In::BoolParam(b)) => Value::Bool(b),
                    Some(In::Uint32Param(u)) => Value::from(u),
                    Some(In::StringParam(s)) => Value::String(s),
                    None => Value::Null,
                };
                (key, value)
            })
            .collect();
        let settings = if changes.is_empty() {
            super::logging::current()
        } else {
            super::logging::update(&changes).map_err(Status::invalid_argument)?
        };
        let Value::Object(answer) = settings.to_json() else { unreachable!("settings are an object") };
        let settings = answer
            .into_iter()
            .map(|(key, value)| {
                let choice = match value {
                    Value::Bool(b) => Out::BoolParam(b),
                    Value::Number(n) => Out::Uint32Param(n.as_u64().unwrap_or(0) as u32),
                    other => Out::StringParam(other.as_str().unwrap_or_default().to_string()),
                };
                (key, log_settings_response::SettingValue { parameter_choice: Some(choice) })
            })
            .collect();
        Ok(Response::new(LogSettingsResponse { settings }))
    }

    async fn trace_setting(&self, request: Request<TraceSettingRequest>) -> Result<Response<TraceSettingResponse>, Status> {
        let request = request.into_inner();
        let model = match given(&request.model_name) {
            Some(name) => Some(self.model(name, "")?.metadata().name.clone()),
            None => None,
        };
        let tracer = self.api.tracer();
        let settings = if request.settings.is_empty() {
            tracer.settings_json(model.as_deref())
        } else {
            // An empty list is "back to the default", as `null` over HTTP.
            let changes: serde_json::Map<String, Value> = request
                .settings
                .into_iter()
                .map(|(key, setting)| {
                    let value = match setting.value.as_slice() {
                        [] => Value::Null,
                        [one] if key != "trace_level" => Value::String(one.clone()),
                        many => Value::Array(many.iter().cloned().map(Value::String).collect()),
                    };
                    (key, value)
                })
                .collect();
            tracer.update(model.as_deref(), &changes).map_err(Status::invalid_argument)?
        };
        let settings = settings
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, value)| {
                let values = match value {
                    Value::Array(items) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
                    Value::String(text) => vec![text.clone()],
                    other => vec![other.to_string()],
                };
                (key.clone(), trace_setting_response::SettingValue { value: values })
            })
            .collect();
        Ok(Response::new(TraceSettingResponse { settings }))
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        Ok(Response::new(CudaSharedMemoryStatusResponse { regions: Default::default() }))
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        Err(Status::unimplemented(self.api.cuda_shared_memory_refusal("SystemSharedMemoryRegister")))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        Err(Status::unimplemented(self.api.cuda_shared_memory_refusal("SystemSharedMemoryRegister")))
    }
}
