//! Between the gRPC protocol's messages and the transport-independent request and
//! response types of [`crate::kserve`]: tensors (raw contents or typed lists),
//! parameters, and the JSON documents (configuration, statistics) the backend keeps
//! in the HTTP API's form, read into their protobuf messages by field name.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage};
use serde_json::{Map, Value};

use super::proto::{
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor, model_infer_response::InferOutputTensor,
    model_repository_parameter::ParameterChoice as RepositoryChoice, InferParameter, InferTensorContents, ModelInferRequest,
    ModelInferResponse, ModelRepositoryParameter,
};
use crate::kserve::{
    self, DataType, InferRequest, InferResponse, ProtocolError, RequestedOutput, Schedule, SharedMemoryPlace, Tensor, TensorData,
};
use crate::shared_memory::SharedMemoryRegistry;

/// The protocol's message descriptors, compiled from `proto/` by the build script.
fn descriptors() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin")).as_ref())
            .expect("the build script writes a valid descriptor set")
    })
}

/// The descriptor of the protocol's message `inference.NAME`.
pub fn message_descriptor(name: &str) -> Option<prost_reflect::MessageDescriptor> {
    descriptors().get_message_by_name(&format!("inference.{name}"))
}

/// Read a JSON document in the HTTP API's form (`GET …/config`, `GET …/stats`) into the
/// protobuf message `T` (named `inference.NAME`): fields by name, enum values by name,
/// 64-bit integers as numbers or strings. Fields the message does not declare are
/// left out.
pub fn message_from_json<T: prost::Message + Default>(name: &str, json: &Value) -> Result<T, String> {
    let descriptor = descriptors().get_message_by_name(&format!("inference.{name}")).ok_or_else(|| format!("no message {name}"))?;
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let dynamic = DynamicMessage::deserialize_with_options(descriptor, json, &options).map_err(|e| format!("{name}: {e}"))?;
    T::decode(prost::Message::encode_to_vec(&dynamic).as_slice()).map_err(|e| format!("{name}: {e}"))
}

/// A protocol parameter as the JSON value the HTTP API would have carried.
fn parameter_json(parameter: &InferParameter) -> Value {
    match &parameter.parameter_choice {
        None => Value::Null,
        Some(ParameterChoice::BoolParam(b)) => Value::Bool(*b),
        Some(ParameterChoice::Int64Param(i)) => Value::from(*i),
        Some(ParameterChoice::StringParam(s)) => Value::String(s.clone()),
        Some(ParameterChoice::DoubleParam(d)) => serde_json::Number::from_f64(*d).map(Value::Number).unwrap_or(Value::Null),
        Some(ParameterChoice::Uint64Param(u)) => Value::from(*u),
    }
}

/// A JSON value as a protocol parameter (anything but a scalar goes as its JSON text).
fn parameter_of_json(value: &Value) -> InferParameter {
    let choice = match value {
        Value::Bool(b) => ParameterChoice::BoolParam(*b),
        Value::Number(n) if n.is_u64() => ParameterChoice::Uint64Param(n.as_u64().expect("checked")),
        Value::Number(n) if n.is_i64() => ParameterChoice::Int64Param(n.as_i64().expect("checked")),
        Value::Number(n) => ParameterChoice::DoubleParam(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => ParameterChoice::StringParam(s.clone()),
        other => ParameterChoice::StringParam(other.to_string()),
    };
    InferParameter { parameter_choice: Some(choice) }
}

fn parameters_json(parameters: &HashMap<String, InferParameter>) -> Map<String, Value> {
    parameters.iter().map(|(key, value)| (key.clone(), parameter_json(value))).collect()
}

/// A repository call's parameters as the JSON object the HTTP API carries
/// (`{"config": "…"}`; bytes as their UTF-8 text).
pub fn repository_parameters_json(parameters: &HashMap<String, ModelRepositoryParameter>) -> Value {
    if parameters.is_empty() {
        return Value::Null;
    }
    let object = parameters
        .iter()
        .map(|(key, value)| {
            let value = match &value.parameter_choice {
                None => Value::Null,
                Some(RepositoryChoice::BoolParam(b)) => Value::Bool(*b),
                Some(RepositoryChoice::Int64Param(i)) => Value::from(*i),
                Some(RepositoryChoice::StringParam(s)) => Value::String(s.clone()),
                Some(RepositoryChoice::BytesParam(b)) => Value::String(String::from_utf8_lossy(b).into_owned()),
            };
            (key.clone(), value)
        })
        .collect();
    Value::Object(object)
}

fn invalid<T>(message: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(message.into()))
}

/// A `ModelInferRequest` as the transport-independent request: inputs from
/// `raw_input_contents` (one entry per input, in order) or from each input's typed
/// `contents`, the schedule from the request parameters as over HTTP.
pub fn infer_request(request: ModelInferRequest, regions: Option<&SharedMemoryRegistry>) -> Result<InferRequest, ProtocolError> {
    let parameters = parameters_json(&request.parameters);
    let schedule = Schedule::from_parameters(&parameters)?;
    if request.inputs.is_empty() {
        return invalid("the request has no inputs");
    }
    // Inputs in shared memory have no raw contents entry; the others one each, in order.
    let mut places = Vec::with_capacity(request.inputs.len());
    for input in &request.inputs {
        places.push(SharedMemoryPlace::from_parameters(&parameters_json(&input.parameters), &format!("input {:?}", input.name))?);
    }
    let carried = places.iter().filter(|p| p.is_none()).count();
    let raw = request.raw_input_contents;
    if !raw.is_empty() && raw.len() != carried {
        return invalid(format!(
            "raw_input_contents has {} entries for {carried} inputs not in shared memory: give one per such input, or none and each input's contents",
            raw.len(),
        ));
    }
    let mut raw = raw.into_iter();
    let mut inputs: Vec<Tensor> = Vec::with_capacity(request.inputs.len());
    for (input, place) in request.inputs.into_iter().zip(places) {
        let tensor = match place {
            Some(place) => shared_memory_tensor(input, &place, regions)?,
            None => input_tensor(input, raw.next())?,
        };
        if inputs.iter().any(|t| t.name == tensor.name) {
            return invalid(format!("input {:?} appears twice", tensor.name));
        }
        inputs.push(tensor);
    }
    let mut outputs = Vec::with_capacity(request.outputs.len());
    for output in request.outputs {
        let output_parameters = parameters_json(&output.parameters);
        let shared_memory = SharedMemoryPlace::from_parameters(&output_parameters, &format!("output {:?}", output.name))?;
        let class_count = kserve::class_count(&output_parameters, &output.name)?;
        outputs.push(RequestedOutput { name: output.name, binary: true, shared_memory, class_count });
    }
    let id = (!request.id.is_empty()).then_some(request.id);
    Ok(InferRequest { id, schedule, parameters, inputs, outputs })
}

/// An input read from the system shared-memory region `place` names.
fn shared_memory_tensor(
    input: InferInputTensor,
    place: &SharedMemoryPlace,
    regions: Option<&SharedMemoryRegistry>,
) -> Result<Tensor, ProtocolError> {
    let name = input.name;
    if input.contents.as_ref().is_some_and(|c| !contents_empty(c)) {
        return invalid(format!("input {name:?} names a shared memory region and also carries contents"));
    }
    let (datatype, shape) = input_type_and_shape(&name, &input.datatype, &input.shape)?;
    place.read_input(&name, datatype, shape, regions)
}

/// An input's element type and shape, checked.
fn input_type_and_shape(name: &str, datatype: &str, shape: &[i64]) -> Result<(DataType, Vec<u64>), ProtocolError> {
    let datatype = DataType::parse(datatype).map_err(|e| ProtocolError(format!("input {name:?}: {e}")))?;
    let shape = shape
        .iter()
        .map(|&d| u64::try_from(d).map_err(|_| ProtocolError(format!("input {name:?}: shape entries must be non-negative, got {d}"))))
        .collect::<Result<Vec<u64>, _>>()?;
    Ok((datatype, shape))
}

/// An input from its raw contents (a slice of the message's receive buffer, kept as it
/// is) or its typed contents.
fn input_tensor(input: InferInputTensor, raw: Option<bytes::Bytes>) -> Result<Tensor, ProtocolError> {
    let name = input.name;
    let (datatype, shape) = input_type_and_shape(&name, &input.datatype, &input.shape)?;
    let count = kserve::element_count(&name, &shape)?;
    let typed = input.contents.filter(|c| !contents_empty(c));
    match (raw, typed) {
        (Some(_), Some(_)) => invalid(format!("input {name:?} has both raw contents and typed contents")),
        (Some(bytes), None) => Tensor::from_binary(&name, datatype, shape, bytes),
        (None, None) if count == 0 => Tensor::from_binary(&name, datatype, shape, bytes::Bytes::new()),
        (None, None) => invalid(format!("input {name:?} has no contents (neither raw_input_contents nor contents)")),
        (None, Some(contents)) => typed_tensor(name, datatype, shape, count, contents),
    }
}

fn contents_empty(c: &InferTensorContents) -> bool {
    c.bool_contents.is_empty()
        && c.int_contents.is_empty()
        && c.int64_contents.is_empty()
        && c.uint_contents.is_empty()
        && c.uint64_contents.is_empty()
        && c.fp32_contents.is_empty()
        && c.fp64_contents.is_empty()
        && c.bytes_contents.is_empty()
}

/// A tensor from the typed list that belongs to its datatype (narrow integer types
/// travel in the 32-bit lists and must fit).
fn typed_tensor(name: String, datatype: DataType, shape: Vec<u64>, count: u64, c: InferTensorContents) -> Result<Tensor, ProtocolError> {
    let (list, length) = match datatype {
        DataType::Bool => ("bool_contents", c.bool_contents.len()),
        DataType::U8 | DataType::U16 | DataType::U32 => ("uint_contents", c.uint_contents.len()),
        DataType::U64 => ("uint64_contents", c.uint64_contents.len()),
        DataType::I8 | DataType::I16 | DataType::I32 => ("int_contents", c.int_contents.len()),
        DataType::I64 => ("int64_contents", c.int64_contents.len()),
        DataType::F32 => ("fp32_contents", c.fp32_contents.len()),
        DataType::F64 => ("fp64_contents", c.fp64_contents.len()),
        DataType::Bytes => ("bytes_contents", c.bytes_contents.len()),
        DataType::F16 | DataType::Bf16 => {
            return invalid(format!("input {name:?}: {} has no typed contents; send it in raw_input_contents", datatype.name()))
        }
    };
    if length as u64 != count {
        return invalid(format!("input {name:?}: shape {shape:?} needs {count} elements, {list} has {length}"));
    }
    fn narrow<T: TryFrom<i64> + Copy>(name: &str, values: impl Iterator<Item = i64>, kind: DataType) -> Result<Vec<T>, ProtocolError> {
        values.map(|v| T::try_from(v).map_err(|_| ProtocolError(format!("input {name:?}: {v} does not fit {}", kind.name())))).collect()
    }
    let bytes: Vec<u8> = match datatype {
        DataType::Bool => c.bool_contents.iter().map(|b| u8::from(*b)).collect(),
        DataType::U8 => narrow::<u8>(&name, c.uint_contents.iter().map(|v| i64::from(*v)), datatype)?,
        DataType::U16 => {
            narrow::<u16>(&name, c.uint_contents.iter().map(|v| i64::from(*v)), datatype)?.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        DataType::U32 => c.uint_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::U64 => c.uint64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::I8 => {
            narrow::<i8>(&name, c.int_contents.iter().map(|v| i64::from(*v)), datatype)?.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        DataType::I16 => {
            narrow::<i16>(&name, c.int_contents.iter().map(|v| i64::from(*v)), datatype)?.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        DataType::I32 => c.int_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::I64 => c.int64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::F32 => c.fp32_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::F64 => c.fp64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Bytes => return Ok(Tensor { name, datatype, shape, data: TensorData::Strings(c.bytes_contents) }),
        DataType::F16 | DataType::Bf16 => unreachable!("refused above"),
    };
    Tensor::raw(&name, datatype, shape, bytes)
}

/// The transport-independent response as a `ModelInferResponse`: the outputs asked
/// for (all when none were named) in `raw_output_contents`, as Triton answers over gRPC.
///
/// An output placed in system shared memory is written into its region; it keeps its
/// place in `raw_output_contents` with an empty entry (clients index that list by the
/// outputs' order) and says where it went in its parameters.
pub fn infer_response(
    response: &InferResponse,
    requested: &[RequestedOutput],
    regions: Option<&SharedMemoryRegistry>,
) -> Result<ModelInferResponse, ProtocolError> {
    let selected = kserve::requested_outputs(response, requested)?;
    let mut outputs = Vec::with_capacity(selected.len());
    let mut raw = Vec::with_capacity(selected.len());
    for (tensor, wanted) in selected {
        let mut parameters = HashMap::new();
        match wanted.and_then(|w| w.shared_memory.as_ref()) {
            Some(place) => {
                let written = place.write_output(tensor, regions)?;
                parameters.insert("shared_memory_region".to_string(), parameter_of_json(&Value::String(place.region.clone())));
                parameters.insert("shared_memory_byte_size".to_string(), parameter_of_json(&Value::from(written)));
                raw.push(bytes::Bytes::new());
            }
            // Raw outputs shared with the data plane's buffers, not copied.
            None => raw.push(tensor.binary()),
        }
        outputs.push(InferOutputTensor {
            name: tensor.name.clone(),
            datatype: tensor.datatype.name().to_string(),
            shape: tensor.shape.iter().map(|&d| d as i64).collect(),
            parameters,
            contents: None,
        });
    }
    Ok(ModelInferResponse {
        model_name: response.model_name.clone(),
        model_version: response.model_version.clone().unwrap_or_default(),
        id: response.id.clone().unwrap_or_default(),
        parameters: response.parameters.iter().map(|(k, v)| (k.clone(), parameter_of_json(v))).collect(),
        outputs,
        raw_output_contents: raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::proto::{ModelConfig, ModelStatisticsResponse};
    use serde_json::json;

    fn input(name: &str, datatype: &str, shape: &[i64], contents: Option<InferTensorContents>) -> InferInputTensor {
        InferInputTensor { name: name.into(), datatype: datatype.into(), shape: shape.to_vec(), parameters: HashMap::new(), contents }
    }

    #[test]
    fn raw_and_typed_inputs_decode_to_the_same_tensor() {
        let values = [1.5f32, -2.0, 3.25, 0.0];
        let raw = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("x", "FP32", &[1, 4], None)],
            raw_input_contents: vec![values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()],
            ..Default::default()
        };
        let typed = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("x", "FP32", &[1, 4], Some(InferTensorContents { fp32_contents: values.to_vec(), ..Default::default() }))],
            ..Default::default()
        };
        let (raw, typed) = (infer_request(raw, None).unwrap(), infer_request(typed, None).unwrap());
        assert_eq!(raw.inputs, typed.inputs);
        assert_eq!(raw.inputs[0].as_f32().unwrap(), values);
    }

    #[test]
    fn raw_contents_are_slices_of_the_received_message_and_raw_outputs_are_not_copied() {
        use prost::Message;
        let values = [0.5f32, 1.5, -3.0];
        let request = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("x", "FP32", &[1, 3], None)],
            raw_input_contents: vec![values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()],
            ..Default::default()
        };
        // As tonic hands prost a message: one buffer, whose `bytes` fields are sliced.
        let received = bytes::Bytes::from(request.encode_to_vec());
        let decoded = infer_request(ModelInferRequest::decode(received.clone()).unwrap(), None).unwrap();
        let TensorData::Raw(raw) = &decoded.inputs[0].data else { panic!("raw") };
        let inside = received.as_ptr_range();
        assert!(inside.contains(&raw.as_ptr()) && raw.len() == 12, "the input is the message's bytes in place");
        let response = InferResponse {
            timing: None,
            model_name: "m".into(),
            model_version: None,
            id: None,
            parameters: Map::new(),
            outputs: decoded.inputs.clone(),
        };
        let message = infer_response(&response, &[], None).unwrap();
        assert_eq!(message.raw_output_contents[0].as_ptr(), raw.as_ptr(), "the output goes out as the same bytes, not a copy");
        assert_eq!(&message.raw_output_contents[0][..], &received[received.len() - 12..]);
    }

    #[test]
    fn schedule_parameters_and_strings_come_through() {
        let mut parameters = HashMap::new();
        parameters.insert("priority".to_string(), InferParameter { parameter_choice: Some(ParameterChoice::Int64Param(2)) });
        parameters.insert("timeout".to_string(), InferParameter { parameter_choice: Some(ParameterChoice::Uint64Param(5_000)) });
        let strings = [b"ab".to_vec(), b"".to_vec()];
        let raw: Vec<u8> = strings.iter().flat_map(|s| (s.len() as u32).to_le_bytes().into_iter().chain(s.iter().copied())).collect();
        let request = ModelInferRequest {
            id: "r1".into(),
            parameters,
            inputs: vec![input("s", "BYTES", &[2], None)],
            raw_input_contents: vec![raw.into()],
            ..Default::default()
        };
        let decoded = infer_request(request, None).unwrap();
        assert_eq!(decoded.id.as_deref(), Some("r1"));
        assert_eq!((decoded.schedule.priority, decoded.schedule.timeout_us), (Some(2), Some(5_000)));
        assert_eq!(decoded.inputs[0].data, TensorData::Strings(strings.to_vec()));
    }

    #[test]
    fn malformed_inputs_are_refused_with_the_reason() {
        let cases = [
            (vec![input("x", "FP32", &[2], None)], vec![vec![0u8; 4]], "needs 8 bytes"),
            (vec![input("x", "FP32", &[-1], None)], vec![vec![]], "non-negative"),
            (vec![input("x", "FP99", &[1], None)], vec![vec![0u8; 4]], "FP99"),
            (vec![input("x", "FP32", &[1], None)], vec![], "no contents"),
            (vec![input("x", "FP32", &[1], None), input("y", "FP32", &[1], None)], vec![vec![0u8; 4]], "1 entries for 2 inputs"),
            (
                vec![input("x", "UINT8", &[1], Some(InferTensorContents { uint_contents: vec![300], ..Default::default() }))],
                vec![],
                "does not fit UINT8",
            ),
            (
                vec![input("x", "INT32", &[2], Some(InferTensorContents { int_contents: vec![1], ..Default::default() }))],
                vec![],
                "int_contents has 1",
            ),
        ];
        for (inputs, raw, expected) in cases {
            let raw = raw.into_iter().map(bytes::Bytes::from).collect();
            let request = ModelInferRequest { inputs, raw_input_contents: raw, ..Default::default() };
            let error = infer_request(request, None).unwrap_err();
            assert!(error.0.contains(expected), "{expected:?} not in {:?}", error.0);
        }
    }

    #[test]
    fn responses_carry_the_outputs_asked_for_as_raw_contents() {
        let response = InferResponse {
            timing: None,
            model_name: "m".into(),
            model_version: Some("1".into()),
            id: None,
            parameters: [("arm".to_string(), json!("primary"))].into_iter().collect(),
            outputs: vec![Tensor::f32("a", vec![2], &[1.0, 2.0]).unwrap(), Tensor::f32("b", vec![1], &[3.0]).unwrap()],
        };
        let all = infer_response(&response, &[], None).unwrap();
        assert_eq!(all.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(all.raw_output_contents[1][..], 3.0f32.to_le_bytes());
        assert_eq!(all.parameters["arm"].parameter_choice, Some(ParameterChoice::StringParam("primary".into())));
        let one =
            infer_response(&response, &[RequestedOutput { name: "b".into(), binary: true, shared_memory: None, class_count: None }], None)
                .unwrap();
        assert_eq!((one.outputs.len(), one.outputs[0].shape.as_slice()), (1, &[1i64][..]));
        assert!(infer_response(
            &response,
            &[RequestedOutput { name: "c".into(), binary: true, shared_memory: None, class_count: None }],
            None
        )
        .unwrap_err()
        .0
        .contains("no output \"c\""));
    }

    #[test]
    fn configurations_and_statistics_read_from_their_json_form() {
        let config = json!({
            "name": "ocr", "platform": "ensemble", "backend": "", "max_batch_size": 4,
            "version_policy": { "latest": { "num_versions": 1 } },
            "input": [{ "name": "image", "data_type": "TYPE_UINT8", "dims": [-1, -1, 3], "is_shape_tensor": false, "optional": false }],
            "output": [{ "name": "texts", "data_type": "TYPE_STRING", "dims": ["-1"], "is_shape_tensor": false }],
            "instance_group": [{ "name": "g", "kind": "KIND_CPU", "count": 2, "gpus": [] }],
            "ensemble_scheduling": { "step": [{ "model_name": "det", "model_version": -1, "input_map": { "image": "image" }, "output_map": {} }] },
            "parameters": { "k": { "string_value": "v" } },
            "something_new": { "x": 1 }
        });
        let message: ModelConfig = message_from_json("ModelConfig", &config).unwrap();
        assert_eq!((message.name.as_str(), message.max_batch_size), ("ocr", 4));
        assert_eq!(message.input[0].dims, [-1, -1, 3]);
        assert_eq!(message.output[0].data_type, crate::grpc::proto::DataType::TypeString as i32);
        assert_eq!(message.instance_group[0].count, 2);
        assert_eq!(message.parameters["k"].string_value, "v");
        let Some(crate::grpc::proto::model_config::SchedulingChoice::EnsembleScheduling(ensemble)) = message.scheduling_choice else {
            panic!("the ensemble's steps are kept")
        };
        assert_eq!(ensemble.step[0].input_map["image"], "image");
        let stats = json!({ "model_stats": [{ "name": "ocr", "version": "1", "last_inference": 17, "inference_count": 3, "execution_count": 2,
            "inference_stats": { "success": { "count": 3, "ns": 900 }, "queue": { "count": 3, "ns": 100 } },
            "batch_stats": [{ "batch_size": 1, "compute_infer": { "count": 1, "ns": 50 } }] }] });
        let message: ModelStatisticsResponse = message_from_json("ModelStatisticsResponse", &stats).unwrap();
        let model = &message.model_stats[0];
        assert_eq!((model.inference_count, model.execution_count), (3, 2));
        assert_eq!(model.inference_stats.as_ref().unwrap().success.as_ref().unwrap().ns, 900);
        assert!(message_from_json::<ModelConfig>("ModelConfig", &json!({ "max_batch_size": "many" })).is_err());
    }
}
