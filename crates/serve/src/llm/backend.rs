//! The client API's [`Backend`] for LLM serving: every stream of the LLM pipeline is a
//! KServe model that takes the prompt's token ids and answers with the ids it generated.
//!
//! - Input `input_ids`: `INT64`, shape `[n]`, every id inside the
//!   decoder's vocabulary.
//! - Request parameter `max_tokens`: how many tokens to generate (a positive integer;
//!   [`super::DEFAULT_MAX_TOKENS`] when absent).
//! - Output `output_ids`: `INT64`, shape `[m]`, the generated ids in order.
//!
//! The stream's class (its name: `ls…` latency-sensitive, `ds…` deadline-sensitive)
//! sets the SLO the policy schedules against. A request the policy drops answers 503
//! with the reason, one that fails 500; a client that goes away cancels its request.

use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::service::{Completion, LlmService};
use crate::api::{Backend, BoxFuture, InferError, ModelMetadata, TensorSpec};
use crate::backend::CancelOnDrop;
use crate::kserve::{DataType, InferRequest, InferResponse, Tensor, TensorData};
use yardmaster_engine::metrics::Outcome;

/// The input tensor holding the prompt's token ids.
pub const INPUT_IDS: &str = "input_ids";
/// The output tensor holding the generated token ids.
pub const OUTPUT_IDS: &str = "output_ids";
/// The request parameter giving how many tokens to generate.
pub const MAX_TOKENS_PARAMETER: &str = "max_tokens";
/// Most tokens one request may ask for.
pub const MAX_TOKENS_LIMIT: u64 = 4_096;
/// The version every LLM model reports.
const MODEL_VERSION: &str = "1";

/// Answers KServe inference requests with the LLM engine.
#[derive(Debug, Clone)]
pub struct LlmBackend {
    service: LlmService,
    models: Vec<ModelMetadata>,
}

impl LlmBackend {
    /// A backend submitting to `service`, one model per stream in `streams`.
    pub fn new(service: LlmService, streams: &[String]) -> Self {
        let models = streams.iter().map(|name| model_metadata(name)).collect();
        Self { service, models }
    }

    async fn run(&self, model: &str, request: InferRequest) -> Result<InferResponse, InferError> {
        let Some(stream) = self.service.stream(model) else {
            let names: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
            let message = crate::kserve::unknown_model_message(model);
            return Err(InferError::Invalid(format!("{message} (served: {})", names.join(", "))));
        };
        let prompt = prompt_ids(&request).map_err(InferError::Invalid)?;
        let max_tokens = max_tokens(&request.parameters).map_err(InferError::Invalid)?;
        let (reply, answer) = oneshot::channel::<Completion>();
        let guard = CancelOnDrop::new(self.service.handle().clone());
        self.service
            .submit_admitted(stream, prompt, max_tokens, guard.on_admitted(), move |completion| {
                let _ = reply.send(completion);
            })
            .map_err(InferError::Invalid)?;
        let completion = answer.await.map_err(|_| InferError::Unavailable("the scheduling engine stopped".into()))?;
        guard.disarm();
        match completion.outcome {
            Outcome::Completed => {
                let count = completion.tokens.len() as u64;
                let bytes = completion.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
                let output = Tensor::raw(OUTPUT_IDS, DataType::I64, vec![count], bytes).map_err(|e| InferError::Failed(e.0))?;
                let mut parameters = Map::new();
                parameters.insert("engine_id".into(), Value::from(completion.id));
                Ok(InferResponse {
                    timing: None,
                    model_name: model.to_string(),
                    model_version: Some(MODEL_VERSION.into()),
                    id: request.id,
                    parameters,
                    outputs: vec![output],
                })
            }
            Outcome::Dropped { reason } => Err(InferError::Dropped(reason)),
            Outcome::Failed { error } => Err(InferError::Failed(error)),
        }
    }
}

impl Backend for LlmBackend {
    fn models(&self) -> Vec<ModelMetadata> {
        self.models.clone()
    }

    fn ready(&self) -> bool {
        true
    }

    fn infer(&self, model: &str, request: InferRequest) -> BoxFuture<'_, Result<InferResponse, InferError>> {
        let model = model.to_string();
        Box::pin(async move { self.run(&model, request).await })
    }
}

fn model_metadata(stream: &str) -> ModelMetadata {
    ModelMetadata {
        name: stream.to_string(),
        versions: vec![MODEL_VERSION.into()],
        platform: "yardmaster_llm".into(),
        inputs: vec![TensorSpec { name: INPUT_IDS.into(), datatype: DataType::I64, shape: vec![-1] }],
        outputs: vec![TensorSpec { name: OUTPUT_IDS.into(), datatype: DataType::I64, shape: vec![-1] }],
        config: None,
    }
}

/// The prompt's ids from the `input_ids` tensor (the API has checked its name, type
/// and rank against the metadata).
fn prompt_ids(request: &InferRequest) -> Result<Vec<i64>, String> {
    let tensor = request.inputs.iter().find(|t| t.name == INPUT_IDS).ok_or_else(|| format!("input {INPUT_IDS:?} is missing"))?;
    let TensorData::Raw(bytes) = &tensor.data else {
        return Err(format!("input {INPUT_IDS:?} must be INT64"));
    };
    if tensor.datatype != DataType::I64 {
        return Err(format!("input {INPUT_IDS:?} must be INT64, got {}", tensor.datatype.name()));
    }
    Ok(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// The `max_tokens` parameter: absent means the executor's default (0).
fn max_tokens(parameters: &Map<String, Value>) -> Result<u32, String> {
    let Some(value) = parameters.get(MAX_TOKENS_PARAMETER) else {
        return Ok(0);
    };
    match value.as_u64() {
        Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(n as u32),
        _ => Err(format!("parameter {MAX_TOKENS_PARAMETER:?} must be an integer from 1 to {MAX_TOKENS_LIMIT}, got {value}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::Schedule;

    fn request(inputs: Vec<Tensor>, parameters: Map<String, Value>) -> InferRequest {
        InferRequest { id: None, schedule: Schedule::default(), parameters, inputs, outputs: Vec::new() }
    }

    fn ids(values: &[i64]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::raw(INPUT_IDS, DataType::I64, vec![values.len() as u64], bytes).unwrap()
    }

    #[test]
    fn prompts_and_token_budgets_are_read_or_refused_with_a_reason() {
        assert_eq!(prompt_ids(&request(vec![ids(&[5, 7, 511])], Map::new())).unwrap(), [5, 7, 511]);
        assert!(prompt_ids(&request(vec![], Map::new())).unwrap_err().contains("missing"));
        let floats = Tensor::f32(INPUT_IDS, vec![1], &[1.0]).unwrap();
        assert!(prompt_ids(&request(vec![floats], Map::new())).unwrap_err().contains("INT64"));
        let with = |v: Value| Map::from_iter([(MAX_TOKENS_PARAMETER.to_string(), v)]);
        assert_eq!(max_tokens(&Map::new()), Ok(0));
        assert_eq!(max_tokens(&with(Value::from(12))), Ok(12));
        for bad in [Value::from(0), Value::from(-3), Value::from(1.5), Value::from("8"), Value::from(MAX_TOKENS_LIMIT + 1)] {
            assert!(max_tokens(&with(bad.clone())).unwrap_err().contains("from 1 to"), "{bad}");
        }
    }

    #[test]
    fn each_stream_is_a_model_of_token_ids() {
        let m = model_metadata("ls");
        assert_eq!((m.name.as_str(), m.inputs[0].name.as_str(), m.outputs[0].name.as_str()), ("ls", INPUT_IDS, OUTPUT_IDS));
        assert_eq!((m.inputs[0].datatype, m.inputs[0].shape.clone()), (DataType::I64, vec![-1]));
    }
}
