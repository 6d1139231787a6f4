//! The KServe v2 / Open Inference Protocol messages (the protocol Triton and KServe
//! speak), decoded from and encoded to JSON, with the binary-tensor extension.
//!
//! This module is the codec only: it turns request bodies into [`InferRequest`]s with
//! validated [`Tensor`]s, and [`InferResponse`]s into bodies. Every refusal is a
//! [`ProtocolError`] whose message says what is wrong and where, so the HTTP layer
//! can answer 400 with it.
//!
//! Tensors keep their elements as raw little-endian bytes (what the binary extension
//! carries and what ONNX Runtime takes), except `BYTES` tensors, whose elements are
//! byte strings of their own. Raw elements are [`Bytes`]: a binary input is a slice of
//! the request body it came in (no copy), and an output handed over by the data plane
//! is a slice of ONNX Runtime's buffer.
//!
//! The schedule-policy parameters of a request follow Triton's names: `priority`
//! (an unsigned integer, 1 is the highest; 0 means the default) and `timeout` (the
//! request's deadline, in microseconds from its arrival); `split_key` (a string) is the
//! key of an A/B run split by key.

use std::fmt;

use bytes::Bytes;

use super::shared_memory::SharedMemoryRegistry;
use serde_json::{Map, Number, Value};

/// Name of the HTTP header that says how long the JSON part of a binary-extension
/// body is.
pub const HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// A request's place in a stateful sequence, as Triton's parameters give it:
/// `sequence_id` (a non-zero unsigned integer, or a non-empty string), `sequence_start`
/// and `sequence_end` (booleans). Whether the model takes sequences, and whether the
/// step fits the sequence's state, is the backend's to judge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SequenceParams {
    /// The correlation id; `None` when absent, 0 or empty.
    pub id: Option<CorrelationId>,
    /// `sequence_start`.
    pub start: bool,
    /// `sequence_end`.
    pub end: bool,
}

/// A sequence's correlation id, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    /// An unsigned integer.
    Number(u64),
    /// A string.
    Text(String),
}

impl SequenceParams {
    /// The sequence parameters among a request's `parameters`; `None` when none is set.
    pub fn from_parameters(parameters: &Map<String, Value>) -> Result<Option<SequenceParams>, ProtocolError> {
        let id = match parameters.get("sequence_id") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) => None,
                Some(id) => Some(CorrelationId::Number(id)),
                None => return error(format!("\"sequence_id\" must be an unsigned integer or a string, got {n}")),
            },
            Some(Value::String(text)) if text.is_empty() => None,
            Some(Value::String(text)) => Some(CorrelationId::Text(text.clone())),
            Some(other) => return error(format!("\"sequence_id\" must be an unsigned integer or a string, got {other}")),
        };
        let flag = |key: &str| match parameters.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => error(format!("{key:?} must be true or false, got {other}")),
        };
        let (start, end) = (flag("sequence_start")?, flag("sequence_end")?);
        Ok((id.is_some() || start || end).then_some(SequenceParams { id, start, end }))
    }

    /// The parameter that is set, to name in a refusal (`sequence_id` first).
    pub fn named(&self) -> &'static str {
        match (&self.id, self.start) {
            (Some(_), _) => "sequence_id",
            (None, true) => "sequence_start",
            (None, false) => "sequence_end",
        }
    }
}

/// Triton's wording for a model it does not serve (clients match on it); our detail
/// goes after it.
pub fn unknown_model_message(name: &str) -> String {
    format!("Request for unknown model: '{name}' is not found")
}

/// Triton's wording for a version of a model it does not serve.
pub fn unknown_version_message(name: &str, version: &str) -> String {
    format!("Request for unknown model: '{name}' version {version} is not found")
}

/// Triton's wording for a model it knows but serves no version of now (unloaded).
pub fn unavailable_model_message(name: &str) -> String {
    format!("Request for unknown model: '{name}' has no available versions")
}

/// Largest number of elements a tensor may declare (guards `shape` products against
/// overflow and absurd allocations).
pub const MAX_ELEMENTS: u64 = 1 << 31;

/// Most elements reserved from a JSON input's declared shape before they are read.
const PREALLOCATED_ELEMENTS: u64 = 1 << 16;

/// A refusal of a malformed message: the reason, meant for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn error<T>(message: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(message.into()))
}

/// Element types of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`, one byte per element.
    Bool,
    /// `UINT8`.
    U8,
    /// `UINT16`.
    U16,
    /// `UINT32`.
    U32,
    /// `UINT64`.
    U64,
    /// `INT8`.
    I8,
    /// `INT16`.
    I16,
    /// `INT32`.
    I32,
    /// `INT64`.
    I64,
    /// `FP16` (IEEE half; binary data only).
    F16,
    /// `BF16` (binary data only).
    Bf16,
    /// `FP32`.
    F32,
    /// `FP64`.
    F64,
    /// `BYTES`: each element a byte string.
    Bytes,
}

impl DataType {
    /// Every type, in the protocol's order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::Bf16,
        DataType::F32,
        DataType::F64,
        DataType::Bytes,
    ];

    /// The protocol's name (`FP32`, …).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::Bf16 => "BF16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// The type called `name`.
    pub fn parse(name: &str) -> Result<DataType, ProtocolError> {
        DataType::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            let known: Vec<&str> = DataType::ALL.iter().map(|t| t.name()).collect();
            ProtocolError(format!("unknown datatype {name:?} (one of {})", known.join(", ")))
        })
    }

    /// Bytes per element; `None` for `BYTES`.
    pub fn width(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::Bf16 => 2,
            DataType::U32 | DataType::I32 | DataType::F32 => 4,
            DataType::U64 | DataType::I64 | DataType::F64 => 8,
            DataType::Bytes => return None,
        })
    }
}

/// A tensor's elements.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Fixed-width elements, little-endian, row-major (a slice of the buffer they came
    /// in, shared).
    Raw(Bytes),
    /// `BYTES` elements.
    Strings(Vec<Vec<u8>>),
}

/// A named tensor of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Input or output name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Dimensions (all non-negative).
    pub shape: Vec<u64>,
    /// Elements.
    pub data: TensorData,
}

impl Tensor {
    /// Number of elements the shape declares.
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// A fixed-width tensor from little-endian bytes; checks the length against the shape.
    pub fn raw(name: &str, datatype: DataType, shape: Vec<u64>, bytes: Vec<u8>) -> Result<Tensor, ProtocolError> {
        Tensor::raw_bytes(name, datatype, shape, bytes.into())
    }

    /// [`Tensor::raw`] of bytes held elsewhere (a request body, a data plane buffer),
    /// shared rather than copied.
    pub fn raw_bytes(name: &str, datatype: DataType, shape: Vec<u64>, bytes: Bytes) -> Result<Tensor, ProtocolError> {
        let width = datatype.width().ok_or_else(|| ProtocolError("BYTES tensors are not raw".into()))?;
        let count = element_count(name, &shape)?;
        if bytes.len() as u64 != count * width as u64 {
            return error(format!(
                "input {name:?}: shape {shape:?} of {} needs {} bytes, got {}",
                datatype.name(),
                count * width as u64,
                bytes.len()
            ));
        }
        Ok(Tensor { name: name.into(), datatype, shape, data: TensorData::Raw(bytes) })
    }

    /// A tensor from its elements laid out as the binary extension (and gRPC's raw
    /// contents) lay them: fixed-width elements little-endian, `BYTES` elements each
    /// after a 4-byte length; checks them against the shape.
    pub fn from_binary(name: &str, datatype: DataType, shape: Vec<u64>, bytes: impl Into<Bytes>) -> Result<Tensor, ProtocolError> {
        let bytes = bytes.into();
        if datatype != DataType::Bytes {
            return Tensor::raw_bytes(name, datatype, shape, bytes);
        }
        let count = element_count(name, &shape)?;
        let items = split_length_prefixed(name, &bytes)?;
        if items.len() as u64 != count {
            return error(format!("input {name:?}: shape {shape:?} needs {count} strings, got {}", items.len()));
        }
        Ok(Tensor { name: name.into(), datatype, shape, data: TensorData::Strings(items) })
    }

    /// An `FP32` tensor.
    pub fn f32(name: &str, shape: Vec<u64>, values: &[f32]) -> Result<Tensor, ProtocolError> {
        Tensor::raw(name, DataType::F32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// The elements of an `FP32` tensor.
    pub fn as_f32(&self) -> Option<Vec<f32>> {
        match (&self.data, self.datatype) {
            (TensorData::Raw(bytes), DataType::F32) => {
                Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
            }
            _ => None,
        }
    }

    /// Size of the elements in bytes (for `BYTES`: the strings plus a 4-byte length
    /// prefix each, as the binary extension lays them out).
    pub fn byte_size(&self) -> usize {
        match &self.data {
            TensorData::Raw(bytes) => bytes.len(),
            TensorData::Strings(items) => items.iter().map(|s| 4 + s.len()).sum(),
        }
    }

    /// The elements as the binary extension lays them out (raw elements shared, not
    /// copied; strings written out after their lengths).
    pub fn binary(&self) -> Bytes {
        match &self.data {
            TensorData::Raw(bytes) => bytes.clone(),
            TensorData::Strings(_) => {
                let mut out = Vec::with_capacity(self.byte_size());
                self.write_binary(&mut out);
                out.into()
            }
        }
    }

    /// Append the elements as the binary extension lays them out to `out`.
    pub fn write_binary(&self, out: &mut Vec<u8>) {
        match &self.data {
            TensorData::Raw(bytes) => out.extend_from_slice(bytes),
            TensorData::Strings(items) => {
                for item in items {
                    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
                    out.extend_from_slice(item);
                }
            }
        }
    }
}

/// The number of elements `shape` declares for input `name`, refused past
/// [`MAX_ELEMENTS`].
pub fn element_count(name: &str, shape: &[u64]) -> Result<u64, ProtocolError> {
    let mut count: u64 = 1;
    for &dim in shape {
        count = count
            .checked_mul(dim)
            .filter(|c| *c <= MAX_ELEMENTS)
            .ok_or_else(|| ProtocolError(format!("input {name:?}: shape {shape:?} has more than {MAX_ELEMENTS} elements")))?;
    }
    Ok(count)
}

/// Schedule-policy parameters of a request (Triton's names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// `priority`: 1 is the highest; `None` when absent or 0 (the model's default).
    pub priority: Option<u32>,
    /// `timeout`: deadline in microseconds after arrival; `None` when absent or 0
    /// (the pipeline's SLO applies).
    pub timeout_us: Option<u64>,
    /// `split_key`: the key an A/B run split by key hashes (e.g. a tenant); the
    /// `x-yardmaster-key` header gives it too.
    pub split_key: Option<String>,
    /// `sequence_id`, `sequence_start`, `sequence_end`: the request's place in a
    /// stateful sequence; `None` when none is set.
    pub sequence: Option<SequenceParams>,
}

impl Schedule {
    /// The schedule-policy parameters among a request's `parameters` (whatever the
    /// transport that carried them).
    pub fn from_parameters(parameters: &Map<String, Value>) -> Result<Schedule, ProtocolError> {
        Ok(Schedule {
            priority: optional_uint(parameters, "priority")?
                .map(|p| u32::try_from(p).map_err(|_| ProtocolError(format!("\"priority\" {p} is too large"))))
                .transpose()?
                .filter(|p| *p > 0),
            timeout_us: optional_uint(parameters, "timeout")?.filter(|t| *t > 0),
            split_key: match parameters.get("split_key") {
                None | Some(Value::Null) => None,
                Some(Value::String(key)) => Some(key.clone()),
                Some(other) => return error(format!("\"split_key\" must be a string, got {other}")),
            },
            sequence: SequenceParams::from_parameters(parameters)?,
        })
    }
}

/// A decoded inference request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferRequest {
    /// The client's request id, echoed in the response.
    pub id: Option<String>,
    /// Schedule-policy parameters.
    pub schedule: Schedule,
    /// Other request parameters, as sent.
    pub parameters: Map<String, Value>,
    /// Inputs.
    pub inputs: Vec<Tensor>,
    /// Outputs asked for (empty: all), each with whether it should come back as binary data.
    pub outputs: Vec<RequestedOutput>,
}

/// An output named in a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// Return it in the binary extension rather than as JSON.
    pub binary: bool,
    /// Write it into this system shared-memory region instead of the response.
    pub shared_memory: Option<SharedMemoryPlace>,
    /// Triton's classification extension: answer its top this-many classes instead
    /// of its values (see `super::classification`).
    pub class_count: Option<u32>,
}

/// An output's `classification` parameter (`class_count`): `None` when absent or 0, an
/// error naming the output when it is not a non-negative integer.
pub fn class_count(parameters: &Map<String, Value>, output: &str) -> Result<Option<u32>, ProtocolError> {
    match parameters.get(super::classification::PARAMETER) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64().and_then(|k| u32::try_from(k).ok()) {
            Some(0) => Ok(None),
            Some(k) => Ok(Some(k)),
            None => error(format!("output {output:?}: classification must be a non-negative class count, got {n}")),
        },
        Some(other) => error(format!("output {output:?}: classification must be a class count (an integer), got {other}")),
    }
}

/// A place in a registered shared-memory region (the `shared_memory_region`,
/// `shared_memory_offset` and `shared_memory_byte_size` parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedMemoryPlace {
    /// The region's name.
    pub region: String,
    /// Offset into the region.
    pub offset: u64,
    /// Bytes of the region given to the tensor.
    pub byte_size: u64,
}

impl SharedMemoryPlace {
    /// Input `name` (of `datatype` and `shape`) read from this place of `regions`.
    pub fn read_input(
        &self,
        name: &str,
        datatype: DataType,
        shape: Vec<u64>,
        regions: Option<&SharedMemoryRegistry>,
    ) -> Result<Tensor, ProtocolError> {
        let regions = regions.ok_or_else(|| ProtocolError(format!("input {name:?}: system shared memory is not available here")))?;
        // The one copy of these bytes: out of the region, into a buffer of the request's.
        let bytes = regions.read(&self.region, self.offset, self.byte_size).map_err(|e| ProtocolError(format!("input {name:?}: {e}")))?;
        Tensor::from_binary(name, datatype, shape, bytes)
    }

    /// Write output `tensor`'s bytes into this place of `regions`; how many.
    pub fn write_output(&self, tensor: &Tensor, regions: Option<&SharedMemoryRegistry>) -> Result<usize, ProtocolError> {
        let name = &tensor.name;
        let regions = regions.ok_or_else(|| ProtocolError(format!("output {name:?}: system shared memory is not available here")))?;
        let bytes = tensor.binary();
        regions.write(&self.region, self.offset, self.byte_size, &bytes).map_err(|e| ProtocolError(format!("output {name:?}: {e}")))?;
        Ok(bytes.len())
    }

    /// The place `parameters` name, if they name one (`what` names the tensor in errors).
    pub fn from_parameters(parameters: &Map<String, Value>, what: &str) -> Result<Option<SharedMemoryPlace>, ProtocolError> {
        let Some(region) = parameters.get("shared_memory_region") else { return Ok(None) };
        let Some(region) = region.as_str() else {
            return error(format!("{what}: shared_memory_region must be a string, got {region}"));
        };
        let in_what = |e: ProtocolError| ProtocolError(format!("{what}: {e}"));
        let Some(byte_size) = optional_uint(parameters, "shared_memory_byte_size").map_err(in_what)? else {
            return error(format!("{what}: shared_memory_region needs shared_memory_byte_size"));
        };
        let offset = optional_uint(parameters, "shared_memory_offset").map_err(in_what)?.unwrap_or(0);
        Ok(Some(SharedMemoryPlace { region: region.to_string(), offset, byte_size }))
    }
}

/// A response to encode.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version, if it has versions.
    pub model_version: Option<String>,
    /// The request's id.
    pub id: Option<String>,
    /// Response parameters (e.g. the policy arm that scheduled it).
    pub parameters: Map<String, Value>,
    /// Outputs.
    pub outputs: Vec<Tensor>,
    /// When its steps happened in the server, for a trace (`None`: the backend keeps
    /// no such times). Not sent to the client.
    pub timing: Option<super::trace::RequestTiming>,
}

/// An encoded response body: the bytes and, when it uses the binary extension, the
/// length of its JSON part (for the `Inference-Header-Content-Length` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedBody {
    /// The body.
    pub bytes: Vec<u8>,
    /// Length of the JSON header when binary data follows it.
    pub json_length: Option<usize>,
}

/// Decode a request body. `json_length` is the value of the
/// `Inference-Header-Content-Length` header when the client sent one (binary
/// extension): the first `json_length` bytes are JSON, the rest the inputs' binary data
/// in the order of the inputs that declare `binary_data_size`.
pub fn decode_request(body: &[u8], json_length: Option<usize>) -> Result<InferRequest, ProtocolError> {
    decode_request_in(&Bytes::copy_from_slice(body), json_length, None)
}

/// [`decode_request`] of a body held in `Bytes`, whose binary inputs are slices of it
/// (no copy), reading inputs that name a system shared-memory region from `regions`
/// (refused when there are none).
pub fn decode_request_in(
    body: &Bytes,
    json_length: Option<usize>,
    regions: Option<&SharedMemoryRegistry>,
) -> Result<InferRequest, ProtocolError> {
    let (json, mut binary) = match json_length {
        Some(n) if n > body.len() => {
            return error(format!("Inference-Header-Content-Length is {n} but the body has only {} bytes", body.len()))
        }
        Some(n) => (&body[..n], body.slice(n..)),
        None => (&body[..], Bytes::new()),
    };
    let value: Value = serde_json::from_slice(json).map_err(|e| ProtocolError(format!("request is not valid JSON: {e}")))?;
    let Value::Object(mut object) = value else { return error("request must be a JSON object") };
    let id = match object.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => return error(format!("\"id\" must be a string, got {other}")),
    };
    let parameters = take_parameters(&mut object, "request")?;
    let schedule = Schedule::from_parameters(&parameters)?;
    let Some(Value::Array(raw_inputs)) = object.remove("inputs") else {
        return error("request needs an \"inputs\" array");
    };
    if raw_inputs.is_empty() {
        return error("\"inputs\" is empty");
    }
    let mut inputs = Vec::with_capacity(raw_inputs.len());
    for (index, raw) in raw_inputs.into_iter().enumerate() {
        let tensor = decode_input(index, raw, &mut binary, regions)?;
        if inputs.iter().any(|t: &Tensor| t.name == tensor.name) {
            return error(format!("input {:?} appears twice", tensor.name));
        }
        inputs.push(tensor);
    }
    if !binary.is_empty() {
        return error(format!("{} bytes of binary data follow the inputs that declared binary_data_size", binary.len()));
    }
    let mut outputs = Vec::new();
    match object.remove("outputs") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (index, item) in items.into_iter().enumerate() {
                let Value::Object(mut item) = item else { return error(format!("outputs[{index}] must be an object")) };
                let Some(Value::String(name)) = item.remove("name") else {
                    return error(format!("outputs[{index}] needs a \"name\" string"));
                };
                let parameters = take_parameters(&mut item, &format!("output {name:?}"))?;
                let binary = match parameters.get("binary_data") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => return error(format!("output {name:?}: binary_data must be a boolean, got {other}")),
                };
                let shared_memory = SharedMemoryPlace::from_parameters(&parameters, &format!("output {name:?}"))?;
                let class_count = class_count(&parameters, &name)?;
                outputs.push(RequestedOutput { name, binary, shared_memory, class_count });
            }
        }
        Some(other) => return error(format!("\"outputs\" must be an array, got {other}")),
    }
    Ok(InferRequest { id, schedule, parameters, inputs, outputs })
}

fn take_parameters(object: &mut Map<String, Value>, what: &str) -> Result<Map<String, Value>, ProtocolError> {
    match object.remove("parameters") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(other) => error(format!("{what}: \"parameters\" must be an object, got {other}")),
    }
}

fn optional_uint(parameters: &Map<String, Value>, key: &str) -> Result<Option<u64>, ProtocolError> {
    match parameters.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_u64().map(Some).ok_or_else(|| ProtocolError(format!("parameter {key:?} must be a non-negative integer, got {n}")))
        }
        Some(other) => error(format!("parameter {key:?} must be a non-negative integer, got {other}")),
    }
}

fn decode_input(index: usize, raw: Value, binary: &mut Bytes, regions: Option<&SharedMemoryRegistry>) -> Result<Tensor, ProtocolError> {
    let Value::Object(mut object) = raw else { return error(format!("inputs[{index}] must be an object")) };
    let Some(Value::String(name)) = object.remove("name") else {
        return error(format!("inputs[{index}] needs a \"name\" string"));
    };
    let Some(Value::String(datatype)) = object.remove("datatype") else {
        return error(format!("input {name:?} needs a \"datatype\" string"));
    };
    let datatype = DataType::parse(&datatype).map_err(|e| ProtocolError(format!("input {name:?}: {e}")))?;
    let Some(Value::Array(dims)) = object.remove("shape") else {
        return error(format!("input {name:?} needs a \"shape\" array"));
    };
    let shape = dims
        .iter()
        .map(|d| d.as_u64().ok_or_else(|| ProtocolError(format!("input {name:?}: shape entries must be non-negative integers, got {d}"))))
        .collect::<Result<Vec<u64>, _>>()?;
    let count = element_count(&name, &shape)?;
    let parameters = take_parameters(&mut object, &format!("input {name:?}"))?;
    let binary_size = optional_uint(&parameters, "binary_data_size").map_err(|e| ProtocolError(format!("input {name:?}: {e}")))?;
    let data = object.remove("data");
    if let Some(place) = SharedMemoryPlace::from_parameters(&parameters, &format!("input {name:?}"))? {
        if binary_size.is_some() || data.is_some() {
            return error(format!("input {name:?} names a shared memory region and also carries data"));
        }
        return place.read_input(&name, datatype, shape, regions);
    }
    match (binary_size, data) {
        (Some(_), Some(_)) => error(format!("input {name:?} has both \"data\" and binary_data_size")),
        (None, None) => error(format!("input {name:?} has no \"data\" (and no binary_data_size)")),
        (Some(size), None) => {
            let size = usize::try_from(size).map_err(|_| ProtocolError(format!("input {name:?}: binary_data_size too large")))?;
            if size > binary.len() {
                return error(format!("input {name:?}: binary_data_size {size} but only {} bytes of binary data remain", binary.len()));
            }
            // A slice of the body, shared: no copy.
            let bytes = binary.split_to(size);
            Tensor::from_binary(&name, datatype, shape, bytes)
        }
        (None, Some(data)) => {
            // The shape is only a claim: reserve no more than a small bound ahead of
            // the elements actually present (a shape of 2^31 with one element must not
            // allocate 2^31 JSON values).
            let mut flat = Vec::with_capacity(count.min(PREALLOCATED_ELEMENTS) as usize);
            flatten(&name, data, &mut flat)?;
            if flat.len() as u64 != count {
                return error(format!("input {name:?}: shape {shape:?} needs {count} elements, \"data\" has {}", flat.len()));
            }
            let data = json_elements(&name, datatype, &flat)?;
            Ok(Tensor { name, datatype, shape, data })
        }
    }
}

/// `BYTES` elements laid out as the binary extension lays them: each a 4-byte
/// little-endian length and that many bytes.
fn split_length_prefixed(name: &str, mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut items = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 4 {
            return error(format!("input {name:?}: truncated BYTES length prefix"));
        }
        let length = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        bytes = &bytes[4..];
        if length > bytes.len() {
            return error(format!("input {name:?}: BYTES element of {length} bytes overruns the data"));
        }
        items.push(bytes[..length].to_vec());
        bytes = &bytes[length..];
    }
    Ok(items)
}

/// Row-major flattening of nested JSON arrays (the protocol accepts both flat and
/// nested `data`).
fn flatten(name: &str, value: Value, out: &mut Vec<Value>) -> Result<(), ProtocolError> {
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(name, item, out)?;
            }
            Ok(())
        }
        Value::Object(_) => error(format!("input {name:?}: \"data\" may hold only arrays, numbers, booleans and strings")),
        scalar => {
            if out.len() as u64 >= MAX_ELEMENTS {
                return error(format!("input {name:?}: more than {MAX_ELEMENTS} elements"));
            }
            out.push(scalar);
            Ok(())
        }
    }
}

fn json_elements(name: &str, datatype: DataType, values: &[Value]) -> Result<TensorData, ProtocolError> {
    let bad = |i: usize, v: &Value| ProtocolError(format!("input {name:?}: element {i} ({v}) is not a valid {}", datatype.name()));
    if datatype == DataType::Bytes {
        let items = values
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().map(|s| s.as_bytes().to_vec()).ok_or_else(|| bad(i, v)))
            .collect::<Result<_, _>>()?;
        return Ok(TensorData::Strings(items));
    }
    let width = datatype.width().expect("fixed width");
    let mut bytes = Vec::with_capacity(values.len() * width);
    for (i, v) in values.iter().enumerate() {
        macro_rules! int {
            ($t:ty) => {{
                let n = v.as_i64().and_then(|n| <$t>::try_from(n).ok());
                let n = n.or_else(|| v.as_u64().and_then(|n| <$t>::try_from(n).ok())).ok_or_else(|| bad(i, v))?;
                bytes.extend_from_slice(&n.to_le_bytes());
            }};
        }
        match datatype {
            DataType::Bool => bytes.push(v.as_bool().ok_or_else(|| bad(i, v))? as u8),
            DataType::U8 => int!(u8),
            DataType::U16 => int!(u16),
            DataType::U32 => int!(u32),
            DataType::U64 => int!(u64),
            DataType::I8 => int!(i8),
            DataType::I16 => int!(i16),
            DataType::I32 => int!(i32),
            DataType::I64 => int!(i64),
            DataType::F32 => bytes.extend_from_slice(&(v.as_f64().ok_or_else(|| bad(i, v))? as f32).to_le_bytes()),
            DataType::F64 => bytes.extend_from_slice(&v.as_f64().ok_or_else(|| bad(i, v))?.to_le_bytes()),
            DataType::F16 | DataType::Bf16 => {
                return error(format!("input {name:?}: {} tensors must be sent as binary data", datatype.name()))
            }
            DataType::Bytes => unreachable!("handled above"),
        }
    }
    Ok(TensorData::Raw(bytes.into()))
}

/// JSON values of a tensor's elements (flat, row-major), for a JSON response.
fn json_values(tensor: &Tensor) -> Result<Vec<Value>, ProtocolError> {
    let TensorData::Raw(bytes) = &tensor.data else {
        let TensorData::Strings(items) = &tensor.data else { unreachable!() };
        return Ok(items.iter().map(|s| Value::String(String::from_utf8_lossy(s).into_owned())).collect());
    };
    let width = tensor.datatype.width().expect("raw tensors are fixed width");
    let chunks = bytes.chunks_exact(width);
    macro_rules! ints {
        ($t:ty) => {
            chunks.map(|c| Value::from(<$t>::from_le_bytes(c.try_into().expect("width")))).collect()
        };
    }
    let float = |f: f64| Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null);
    Ok(match tensor.datatype {
        DataType::Bool => chunks.map(|c| Value::Bool(c[0] != 0)).collect(),
        DataType::U8 => ints!(u8),
        DataType::U16 => ints!(u16),
        DataType::U32 => ints!(u32),
        DataType::U64 => ints!(u64),
        DataType::I8 => ints!(i8),
        DataType::I16 => ints!(i16),
        DataType::I32 => ints!(i32),
        DataType::I64 => ints!(i64),
        DataType::F32 => chunks.map(|c| float(f32::from_le_bytes(c.try_into().expect("4")) as f64)).collect(),
        DataType::F64 => chunks.map(|c| float(f64::from_le_bytes(c.try_into().expect("8")))).collect(),
        DataType::F16 | DataType::Bf16 => {
            return error(format!("output {:?}: {} can only be returned as binary data", tensor.name, tensor.datatype.name()))
        }
        DataType::Bytes => unreachable!("strings handled above"),
    })
}

/// Encode a response. Outputs named in `binary` (or every output when `all_binary`)
/// go into the binary extension; the rest are JSON.
pub fn encode_response(response: &InferResponse, requested: &[RequestedOutput], all_binary: bool) -> Result<EncodedBody, ProtocolError> {
    encode_response_in(response, requested, all_binary, None)
}

/// [`encode_response`], writing the outputs a request placed in system shared memory
/// into `regions` (the response then carries their shape and type, not their data).
pub fn encode_response_in(
    response: &InferResponse,
    requested: &[RequestedOutput],
    all_binary: bool,
    regions: Option<&SharedMemoryRegistry>,
) -> Result<EncodedBody, ProtocolError> {
    let mut object = Map::new();
    object.insert("model_name".into(), Value::String(response.model_name.clone()));
    if let Some(version) = &response.model_version {
        object.insert("model_version".into(), Value::String(version.clone()));
    }
    if let Some(id) = &response.id {
        object.insert("id".into(), Value::String(id.clone()));
    }
    if !response.parameters.is_empty() {
        object.insert("parameters".into(), Value::Object(response.parameters.clone()));
    }
    // Which outputs go as binary data, written after the JSON in one buffer: the one
    // copy of their bytes on the way out.
    let mut binary: Vec<&Tensor> = Vec::new();
    let mut outputs = Vec::new();
    for (tensor, wanted) in requested_outputs(response, requested)? {
        let as_binary = all_binary || wanted.is_some_and(|r| r.binary);
        let mut out = Map::new();
        out.insert("name".into(), Value::String(tensor.name.clone()));
        out.insert("datatype".into(), Value::String(tensor.datatype.name().into()));
        out.insert("shape".into(), Value::Array(tensor.shape.iter().map(|d| Value::from(*d)).collect()));
        if let Some(place) = wanted.and_then(|r| r.shared_memory.as_ref()) {
            place.write_output(tensor, regions)?;
            // Name, type and shape only, as Triton answers: its C++ client reads any
            // output `parameters` as the binary extension's.
        } else if as_binary {
            let mut parameters = Map::new();
            parameters.insert("binary_data_size".into(), Value::from(tensor.byte_size()));
            out.insert("parameters".into(), Value::Object(parameters));
            binary.push(tensor);
        } else {
            out.insert("data".into(), Value::Array(json_values(tensor)?));
        }
        outputs.push(Value::Object(out));
    }
    object.insert("outputs".into(), Value::Array(outputs));
    let binary_size: usize = binary.iter().map(|t| t.byte_size()).sum();
    let mut bytes = Vec::with_capacity(binary_size + 1024);
    serde_json::to_writer(&mut bytes, &Value::Object(object)).expect("JSON values serialise");
    let json_length = (!binary.is_empty()).then_some(bytes.len());
    bytes.reserve_exact(binary_size);
    for tensor in binary {
        tensor.write_binary(&mut bytes);
    }
    Ok(EncodedBody { bytes, json_length })
}

/// The outputs of `response` a request asked for (all when it named none), each with
/// how it was asked for; an error names an output asked for that the model lacks.
pub fn requested_outputs<'r>(
    response: &'r InferResponse,
    requested: &'r [RequestedOutput],
) -> Result<Vec<(&'r Tensor, Option<&'r RequestedOutput>)>, ProtocolError> {
    if let Some(missing) = requested.iter().find(|r| !response.outputs.iter().any(|t| t.name == r.name)) {
        return error(format!("the model has no output {:?}", missing.name));
    }
    Ok(response
        .outputs
        .iter()
        .filter_map(|tensor| {
            let wanted = requested.iter().find(|r| r.name == tensor.name);
            (requested.is_empty() || wanted.is_some()).then_some((tensor, wanted))
        })
        .collect())
}

/// The error body the protocol specifies: `{"error": "..."}`.
pub fn error_body(message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "error": message })).expect("JSON values serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: &str) -> Result<InferRequest, ProtocolError> {
        decode_request(json.as_bytes(), None)
    }

    #[test]
    fn a_huge_declared_shape_with_little_data_is_refused_without_allocating_for_it() {
        // Found by fuzzing: the shape's element count was reserved up front (64 GiB).
        let err = decode(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2147483648],"data":[1]}]}"#).unwrap_err();
        assert!(err.0.contains("needs 2147483648 elements"), "{err}");
    }

    #[test]
    fn sequence_parameters_are_read_and_a_class_count_is_read() {
        let body = |extra: &str| format!(r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"FP32","data":[1]}}]{extra}}}"#);
        let refused = |extra: &str| decode_request(body(extra).as_bytes(), None).unwrap_err().0;
        let sequence = |extra: &str| decode_request(body(extra).as_bytes(), None).unwrap().schedule.sequence;
        let numbered = sequence(r#","parameters":{"sequence_id":7,"sequence_start":true}"#).unwrap();
        assert_eq!((numbered.id, numbered.start, numbered.end), (Some(CorrelationId::Number(7)), true, false));
        let named = sequence(r#","parameters":{"sequence_id":"user-7","sequence_end":true}"#).unwrap();
        assert_eq!((named.id, named.end), (Some(CorrelationId::Text("user-7".into())), true));
        assert_eq!(sequence(r#","parameters":{"sequence_start":true}"#).unwrap().named(), "sequence_start", "a start without an id");
        assert!(refused(r#","parameters":{"sequence_id":-3}"#).contains("sequence_id"));
        assert!(refused(r#","parameters":{"sequence_end":"yes"}"#).contains("sequence_end"));
        let classified = decode_request(body(r#","outputs":[{"name":"y","parameters":{"classification":3}}]"#).as_bytes(), None).unwrap();
        assert_eq!(classified.outputs[0].class_count, Some(3));
        let class = refused(r#","outputs":[{"name":"y","parameters":{"classification":"three"}}]"#);
        assert!(class.contains("output \"y\"") && class.contains("classification"), "{class}");
        assert_eq!(sequence(r#","parameters":{"sequence_id":0,"sequence_end":false}"#), None, "unset");
    }

    #[test]
    fn json_request_with_nested_data_and_schedule_parameters() {
        let request = decode(
            r#"{"id":"r1","parameters":{"priority":2,"timeout":150000,"tenant":"a"},
                "inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]},
                          {"name":"t","shape":[2],"datatype":"BYTES","data":["hi","yo"]}],
                "outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#,
        )
        .unwrap();
        assert_eq!(request.id.as_deref(), Some("r1"));
        assert_eq!(request.schedule, Schedule { priority: Some(2), timeout_us: Some(150_000), split_key: None, sequence: None });
        assert_eq!(request.parameters["tenant"], "a");
        assert_eq!(request.inputs[0].as_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.5]);
        assert_eq!(request.inputs[1].data, TensorData::Strings(vec![b"hi".to_vec(), b"yo".to_vec()]));
        assert_eq!(request.outputs, vec![RequestedOutput { name: "y".into(), binary: true, shared_memory: None, class_count: None }]);
    }

    #[test]
    fn zero_priority_and_timeout_mean_default() {
        let request =
            decode(r#"{"parameters":{"priority":0,"timeout":0},"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[-3]}]}"#)
                .unwrap();
        assert_eq!(request.schedule, Schedule::default());
        assert_eq!(request.inputs[0].data, TensorData::Raw((-3i64).to_le_bytes().to_vec().into()));
    }

    #[test]
    fn binary_extension_round_trip() {
        let header = r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","parameters":{"binary_data_size":12}},
                                     {"name":"s","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":7}}]}"#;
        let mut body = header.as_bytes().to_vec();
        for v in [1.0f32, -2.0, 0.25] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"abc");
        let sent_json_length = header.len();
        let request = decode_request(&body, Some(sent_json_length)).unwrap();
        assert_eq!(request.inputs[0].as_f32().unwrap(), vec![1.0, -2.0, 0.25]);
        assert_eq!(request.inputs[1].data, TensorData::Strings(vec![b"abc".to_vec()]));

        let response = InferResponse {
            timing: None,
            model_name: "m".into(),
            model_version: None,
            id: Some("7".into()),
            parameters: Map::new(),
            outputs: vec![request.inputs[0].clone(), request.inputs[1].clone()],
        };
        let encoded = encode_response(&response, &[], true).unwrap();
        let json_length = encoded.json_length.unwrap();
        let json: Value = serde_json::from_slice(&encoded.bytes[..json_length]).unwrap();
        assert_eq!(json["id"], "7");
        assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 12);
        assert_eq!(json["outputs"][1]["parameters"]["binary_data_size"], 7);
        assert_eq!(&encoded.bytes[json_length..], &body[sent_json_length..], "binary data comes back byte for byte");
    }

    #[test]
    fn binary_inputs_are_slices_of_the_request_body_not_copies() {
        let header = r#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},
                                     {"name":"y","shape":[1],"datatype":"INT64","parameters":{"binary_data_size":8}}]}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(&[1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat());
        body.extend_from_slice(&(-9i64).to_le_bytes());
        let body = Bytes::from(body);
        let request = decode_request_in(&body, Some(header.len()), None).unwrap();
        let binary = &body[header.len()..];
        for (tensor, range) in request.inputs.iter().zip([0..8, 8..16]) {
            let TensorData::Raw(bytes) = &tensor.data else { panic!("raw") };
            assert_eq!(bytes.as_ptr(), binary[range.clone()].as_ptr(), "input {:?} is the body's bytes in place", tensor.name);
            assert_eq!(bytes.len(), range.len());
        }
        assert_eq!(request.inputs[0].as_f32().unwrap(), vec![1.0, 2.0]);
    }

    #[test]
    fn json_response_of_every_fixed_width_type() {
        let outputs = vec![
            Tensor::raw("b", DataType::Bool, vec![2], vec![1, 0]).unwrap(),
            Tensor::raw("u", DataType::U16, vec![1], 65535u16.to_le_bytes().to_vec()).unwrap(),
            Tensor::raw("i", DataType::I32, vec![1], (-7i32).to_le_bytes().to_vec()).unwrap(),
            Tensor::f32("f", vec![1, 2], &[0.5, 1.5]).unwrap(),
        ];
        let response = InferResponse {
            timing: None,
            model_name: "m".into(),
            model_version: Some("1".into()),
            id: None,
            parameters: Map::new(),
            outputs,
        };
        let encoded = encode_response(&response, &[], false).unwrap();
        assert_eq!(encoded.json_length, None);
        let value: Value = serde_json::from_slice(&encoded.bytes).unwrap();
        assert_eq!(value["model_version"], "1");
        assert_eq!(value["outputs"][0]["data"], serde_json::json!([true, false]));
        assert_eq!(value["outputs"][1]["data"], serde_json::json!([65535]));
        assert_eq!(value["outputs"][2]["data"], serde_json::json!([-7]));
        assert_eq!(value["outputs"][3]["data"], serde_json::json!([0.5, 1.5]));
        assert_eq!(value["outputs"][3]["shape"], serde_json::json!([1, 2]));
    }

    #[test]
    fn requested_outputs_filter_and_unknown_output_is_refused() {
        let outputs = vec![Tensor::f32("a", vec![1], &[1.0]).unwrap(), Tensor::f32("b", vec![1], &[2.0]).unwrap()];
        let response =
            InferResponse { timing: None, model_name: "m".into(), model_version: None, id: None, parameters: Map::new(), outputs };
        let only_b = [RequestedOutput { name: "b".into(), binary: false, shared_memory: None, class_count: None }];
        let value: Value = serde_json::from_slice(&encode_response(&response, &only_b, false).unwrap().bytes).unwrap();
        assert_eq!(value["outputs"].as_array().unwrap().len(), 1);
        assert_eq!(value["outputs"][0]["name"], "b");
        let missing = [RequestedOutput { name: "zzz".into(), binary: false, shared_memory: None, class_count: None }];
        assert!(encode_response(&response, &missing, false).unwrap_err().0.contains("zzz"));
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        let cases = [
            ("not json", "not valid JSON"),
            ("[]", "JSON object"),
            ("{}", "\"inputs\""),
            (r#"{"inputs":[]}"#, "empty"),
            (r#"{"inputs":[{"shape":[1],"datatype":"FP32","data":[1]}]}"#, "\"name\""),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP99","data":[1]}]}"#, "unknown datatype"),
            (r#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]}"#, "non-negative"),
            (r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#, "needs 3 elements"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[300]}]}"#, "not a valid UINT8"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32"}]}"#, "no \"data\""),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[{"a":1}]}]}"#, "only arrays"),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#,
                "twice",
            ),
            (r#"{"inputs":[{"name":"x","shape":[4294967296,4294967296],"datatype":"FP32","data":[1]}]}"#, "more than"),
            (r#"{"parameters":{"priority":-1},"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#, "priority"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#, "only 0 bytes"),
        ];
        for (body, expected) in cases {
            let message = decode(body).unwrap_err().0;
            assert!(message.contains(expected), "{body}: {message:?} should mention {expected:?}");
        }
        assert!(decode_request(b"{}", Some(10)).unwrap_err().0.contains("Inference-Header-Content-Length"));
        let header = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(&[0; 6]);
        assert!(decode_request(&body, Some(header.len())).unwrap_err().0.contains("2 bytes of binary data follow"));
    }

    #[test]
    fn error_body_is_the_protocol_shape() {
        let value: Value = serde_json::from_slice(&error_body("dropped: deadline")).unwrap();
        assert_eq!(value, serde_json::json!({"error": "dropped: deadline"}));
    }
}
