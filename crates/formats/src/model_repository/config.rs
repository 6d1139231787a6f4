//! Triton's model configuration (`config.pbtxt`), typed: the fields that matter for
//! ONNX models and ensembles of them, read from the [`pbtxt`] tree and
//! checked, and written back as JSON in the shape of Triton's
//! `GET /v2/models/{m}/config` (see [`ModelConfig::to_triton_json`]).
//!
//! Fields this reader does not use are not an error: they are collected in
//! [`ModelConfig::ignored_fields`] so that the loader can name them in one warning.
//! A field given the wrong kind of value, a value out of range, or a platform other than
//! ONNX Runtime or an ensemble is refused, naming the file, line and column.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::pbtxt::{self, Field, Message, ParseError, Pos, Value};

/// The file name looked for in each version folder unless `default_model_filename` says otherwise.
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

/// A model's effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model's name (its folder's name).
    pub name: String,
    /// What runs it.
    pub backend: Backend,
    /// Largest batch the model takes along its first dimension; 0 when it has none.
    pub max_batch_size: u32,
    /// Input tensors (empty when left to the graph, see [`ModelConfig::from_graph`]).
    pub input: Vec<TensorConfig>,
    /// Output tensors (empty when left to the graph).
    pub output: Vec<TensorConfig>,
    /// Triton's `dynamic_batching`, when given.
    pub dynamic_batching: Option<DynamicBatching>,
    /// Triton's `instance_group` entries as written (none: one instance).
    pub instance_group: Vec<InstanceGroup>,
    /// Which version folders are served.
    pub version_policy: VersionPolicy,
    /// `parameters`: key to `string_value`.
    pub parameters: BTreeMap<String, String>,
    /// `ensemble_scheduling` steps (non-empty exactly when [`Backend::Ensemble`]).
    pub ensemble_steps: Vec<EnsembleStep>,
    /// The model file in each version folder (`default_model_filename`, else `model.onnx`).
    pub default_model_filename: String,
    /// What still has to come from the ONNX graph, as Triton's auto-complete fills it;
    /// `None` when the configuration is complete. Until
    /// [`ModelConfig::complete_from_graph`] has run, the fields named here are empty or 0
    /// and must not be served as they are.
    pub from_graph: Option<FromGraph>,
    /// The configuration as written (`config.pbtxt`, or JSON given at load), every
    /// field of it, for serving the fields this reader does not use unchanged; `None`
    /// for a model without one.
    pub source: Option<pbtxt::Message>,
    /// `model_warmup`: samples a worker runs at load, before it serves.
    pub warmup: Vec<Warmup>,
    /// `model_transaction_policy { decoupled }`: the model answers a request with zero,
    /// one or many responses, over gRPC's `ModelStreamInfer` only (as in Triton).
    pub decoupled: bool,
    /// Triton's `sequence_batching`, when given: the model is stateful, its requests
    /// come in sequences (correlation ids).
    pub sequence_batching: Option<SequenceBatching>,
    /// Fields this reader does not use, as dotted paths (`optimization`,
    /// `input.format`), sorted, each once; for one warning at load.
    pub ignored_fields: Vec<String>,
}

/// What a configuration leaves to the ONNX graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromGraph {
    /// No `config.pbtxt`: inputs, outputs and `max_batch_size`.
    Everything,
    /// A `config.pbtxt` without `input` or without `output`: those tensors.
    Tensors,
}

/// What runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// ONNX Runtime (`platform: "onnxruntime_onnx"` or `backend: "onnxruntime"`).
    OnnxRuntime,
    /// An ensemble of other models (`platform: "ensemble"` with `ensemble_scheduling`).
    Ensemble,
}

/// A tensor's element type (Triton's `TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    String,
    Bf16,
}

const DATA_TYPES: [(DataType, &str); 14] = [
    (DataType::Bool, "TYPE_BOOL"),
    (DataType::Uint8, "TYPE_UINT8"),
    (DataType::Uint16, "TYPE_UINT16"),
    (DataType::Uint32, "TYPE_UINT32"),
    (DataType::Uint64, "TYPE_UINT64"),
    (DataType::Int8, "TYPE_INT8"),
    (DataType::Int16, "TYPE_INT16"),
    (DataType::Int32, "TYPE_INT32"),
    (DataType::Int64, "TYPE_INT64"),
    (DataType::Fp16, "TYPE_FP16"),
    (DataType::Fp32, "TYPE_FP32"),
    (DataType::Fp64, "TYPE_FP64"),
    (DataType::String, "TYPE_STRING"),
    (DataType::Bf16, "TYPE_BF16"),
];

impl DataType {
    /// Triton's name, `TYPE_FP32` and so on.
    pub fn triton_name(self) -> &'static str {
        DATA_TYPES.iter().find(|(t, _)| *t == self).map(|(_, n)| *n).expect("every type is listed")
    }

    /// The type for a Triton name, if there is one.
    pub fn from_triton_name(name: &str) -> Option<DataType> {
        DATA_TYPES.iter().find(|(_, n)| *n == name).map(|(t, _)| *t)
    }
}

/// An input or output tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorConfig {
    /// The tensor's name in the graph.
    pub name: String,
    /// Element type.
    pub data_type: DataType,
    /// Shape without the batch dimension when `max_batch_size > 0`; -1 is any size.
    pub dims: Vec<i64>,
    /// `reshape { shape }`: the shape the model sees, when it differs from `dims`
    /// (`Some(vec![])` is a scalar).
    pub reshape: Option<Vec<i64>>,
    /// Inputs only: a request may leave it out.
    pub optional: bool,
    /// Inputs only: Triton's `format` (`FORMAT_NONE`, `FORMAT_NHWC`, `FORMAT_NCHW`),
    /// kept and served in the configuration; it describes the tensor's layout to
    /// clients and does not change what the model is fed.
    pub format: Option<String>,
    /// Outputs only: `label_filename`, the file in the model's folder with one class
    /// label per line, for Triton's classification extension.
    pub label_filename: Option<String>,
}

/// One of Triton's `model_warmup` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Warmup {
    /// Its name.
    pub name: String,
    /// Requests in its batch (1 for a model without a batch dimension).
    pub batch_size: u32,
    /// Times it runs (0 and 1 both mean once).
    pub count: u32,
    /// Each input: its type, shape (without the batch dimension) and data.
    pub inputs: BTreeMap<String, WarmupInput>,
}

/// One input of a warm-up sample.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupInput {
    /// Element type.
    pub data_type: DataType,
    /// Shape, without the batch dimension.
    pub dims: Vec<i64>,
    /// Where its data comes from.
    pub data: WarmupData,
}

/// Where a warm-up input's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmupData {
    /// `zero_data`.
    Zero,
    /// `random_data`.
    Random,
    /// `input_data_file`: a file in the model's `warmup/` folder.
    File(String),
}

/// Triton's `sequence_batching`: a stateful model's requests come in sequences, each
/// named by a correlation id; a sequence's requests run in order on the replica that
/// holds its state. In Yardmaster the policy still forms every batch (which sequences
/// run together, and when): both strategies are accepted and mean the same.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceBatching {
    /// `direct` or `oldest`.
    pub strategy: SequenceStrategy,
    /// A sequence that has no request for this long ends (its state is released);
    /// Triton's default is one second.
    pub max_sequence_idle_microseconds: u64,
    /// `control_input`: inputs the server fills for each request (not sent by clients).
    pub control_inputs: Vec<ControlInput>,
    /// `state`: implicit state, fed back from one request of a sequence to the next.
    pub states: Vec<SequenceState>,
}

/// Triton's default `max_sequence_idle_microseconds`: one second.
pub const DEFAULT_MAX_SEQUENCE_IDLE_MICROSECONDS: u64 = 1_000_000;

/// The sequence batcher's strategy as written (the policy forms the batches either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SequenceStrategy {
    /// `direct` (Triton's default).
    #[default]
    Direct,
    /// `oldest`.
    Oldest,
}

/// What a control input tells the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// `CONTROL_SEQUENCE_START`: the first request of its sequence.
    Start,
    /// `CONTROL_SEQUENCE_END`: the last request of its sequence.
    End,
    /// `CONTROL_SEQUENCE_READY`: the batch slot holds a request.
    Ready,
    /// `CONTROL_SEQUENCE_CORRID`: the sequence's correlation id.
    CorrelationId,
}

/// The false and true values of a flag control, in its element type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ControlValues {
    /// `int32_false_true`.
    Int32(i32, i32),
    /// `fp32_false_true`.
    Fp32(f32, f32),
    /// `bool_false_true`.
    Bool(bool, bool),
}

/// One control input (`control_input { name control { kind … } }`).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlInput {
    /// The model input it fills.
    pub name: String,
    /// What it carries.
    pub kind: ControlKind,
    /// A flag's false and true values (`None` for the correlation id).
    pub values: Option<ControlValues>,
    /// Its element type: the values' for a flag, `data_type` for the correlation id.
    pub data_type: DataType,
}

/// One implicit state (`state { input_name output_name data_type dims initial_state }`).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceState {
    /// The model input fed the state.
    pub input_name: String,
    /// The model output the next state is read from.
    pub output_name: String,
    /// Element type.
    pub data_type: DataType,
    /// Shape, without the batch dimension when the model batches.
    pub dims: Vec<i64>,
    /// What the state is at a sequence's start (`None`: zeros).
    pub initial: Option<InitialState>,
}

/// A state's value at the start of a sequence (`initial_state`).
#[derive(Debug, Clone, PartialEq)]
pub struct InitialState {
    /// Shape.
    pub dims: Vec<i64>,
    /// `zero_data`, or `data_file` (a file in the model's `initial_state/` folder).
    pub data: InitialData,
}

/// Where an initial state's elements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitialData {
    /// `zero_data`.
    Zero,
    /// `data_file`: a file in the model's `initial_state/` folder.
    File(String),
}

impl SequenceBatching {
    /// Whether `name` is an input the server fills (a control or a state input), not
    /// one clients send.
    pub fn fills_input(&self, name: &str) -> bool {
        self.control_inputs.iter().any(|c| c.name == name) || self.states.iter().any(|s| s.input_name == name)
    }

    /// Whether `name` is a state output, which the server keeps and clients never get.
    pub fn keeps_output(&self, name: &str) -> bool {
        self.states.iter().any(|s| s.output_name == name)
    }
}

/// Triton's `dynamic_batching` settings. In Yardmaster they are parameters the policy
/// sees: the policy still forms every batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DynamicBatching {
    /// Batch sizes the batcher should prefer.
    pub preferred_batch_size: Vec<u32>,
    /// Longest a request should wait for a batch to fill, in microseconds.
    pub max_queue_delay_microseconds: u64,
    /// Number of priority levels (0: priorities off); 1 is the highest.
    pub priority_levels: u64,
    /// Level of a request that names none (0 when priorities are off).
    pub default_priority_level: u64,
    /// Queue policy for every level, when given.
    pub default_queue_policy: Option<QueuePolicy>,
}

/// Triton's `ModelQueuePolicy`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueuePolicy {
    /// What happens to a request whose timeout expires in the queue.
    pub timeout_action: TimeoutAction,
    /// Queue timeout of a request that gives none, in microseconds (0: none).
    pub default_timeout_microseconds: u64,
    /// Whether a request may give its own timeout.
    pub allow_timeout_override: bool,
    /// Most requests queued (0: unbounded).
    pub max_queue_size: u32,
}

/// Triton's timeout action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutAction {
    /// Fail the request.
    #[default]
    Reject,
    /// Keep it, behind requests that have not timed out.
    Delay,
}

/// One `instance_group` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceGroup {
    /// Its name (`<model>_<index>` when not given).
    pub name: String,
    /// Where the instances run.
    pub kind: InstanceKind,
    /// Instances (on each listed GPU, for GPU groups with `gpus`).
    pub count: u32,
    /// GPU indices, for `KIND_GPU` (empty: all, as the device allows).
    pub gpus: Vec<u32>,
}

/// Where an instance group runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceKind {
    /// The server picks: a GPU when there is one.
    Auto,
    /// On a GPU.
    Gpu,
    /// On the CPU.
    Cpu,
}

impl InstanceKind {
    /// Triton's name, `KIND_GPU` and so on.
    pub fn triton_name(self) -> &'static str {
        match self {
            InstanceKind::Auto => "KIND_AUTO",
            InstanceKind::Gpu => "KIND_GPU",
            InstanceKind::Cpu => "KIND_CPU",
        }
    }
}

/// Which version folders of a model are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The `num_versions` highest-numbered versions (Triton's default: 1).
    Latest {
        /// How many.
        num_versions: u32,
    },
    /// Every version.
    All,
    /// Exactly these versions (each must exist).
    Specific {
        /// The versions, as written.
        versions: Vec<u64>,
    },
}

impl Default for VersionPolicy {
    fn default() -> Self {
        VersionPolicy::Latest { num_versions: 1 }
    }
}

/// One step of an ensemble.
#[derive(Debug, Clone, PartialEq)]
pub struct EnsembleStep {
    /// The model this step runs.
    pub model_name: String,
    /// Its version; -1 (the default here, as Triton's examples write it) is the latest.
    pub model_version: i64,
    /// The step model's input name to the ensemble tensor it reads.
    pub input_map: BTreeMap<String, String>,
    /// The step model's output name to the ensemble tensor it writes.
    pub output_map: BTreeMap<String, String>,
}

impl ModelConfig {
    /// The configuration of a model without `config.pbtxt`: its name and ONNX Runtime;
    /// everything else is a default or left to the graph ([`FromGraph::Everything`]).
    pub fn without_file(name: &str) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            backend: Backend::OnnxRuntime,
            max_batch_size: 0,
            input: Vec::new(),
            output: Vec::new(),
            dynamic_batching: None,
            instance_group: Vec::new(),
            version_policy: VersionPolicy::default(),
            parameters: BTreeMap::new(),
            ensemble_steps: Vec::new(),
            default_model_filename: DEFAULT_MODEL_FILENAME.into(),
            from_graph: Some(FromGraph::Everything),
            source: None,
            warmup: Vec::new(),
            decoupled: false,
            sequence_batching: None,
            ignored_fields: Vec::new(),
        }
    }

    /// Read `config.pbtxt` text for the model in folder `model`; `file` names it in errors.
    /// The file's `name`, when given, must be `model`.
    pub fn from_pbtxt(text: &str, file: &str, model: &str) -> Result<ModelConfig, ParseError> {
        let tree = pbtxt::parse(text, file)?;
        Self::from_tree(&tree, file, model, false)
    }

    /// Read the configuration out of a parsed text-format tree (from `config.pbtxt`, or
    /// from JSON: `super::config_json`, where enum values and integers may be strings, as
    /// protobuf's JSON writes them); `file` names its source in errors.
    pub(super) fn from_tree(tree: &pbtxt::Message, file: &str, model: &str, from_json: bool) -> Result<ModelConfig, ParseError> {
        let mut reader = Reader { file, ignored: BTreeSet::new(), from_json };
        let mut config = reader.model_config(tree, model)?;
        config.ignored_fields = reader.ignored.into_iter().collect();
        config.source = Some(tree.clone());
        Ok(config)
    }

    /// Instances to start with: each group's `count`, times its GPUs for a GPU group that
    /// lists them; 1 when there are no groups. Yardmaster starts this many replicas and
    /// the policy may scale them.
    pub fn instance_count(&self) -> u64 {
        if self.instance_group.is_empty() {
            return 1;
        }
        let per_group = |g: &InstanceGroup| {
            let gpus = if g.kind == InstanceKind::Cpu { 1 } else { g.gpus.len().max(1) as u64 };
            u64::from(g.count) * gpus
        };
        self.instance_group.iter().map(per_group).sum()
    }

    /// The configuration as Triton's `GET /v2/models/{m}/config` returns it.
    pub fn to_triton_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the configuration always serializes")
    }
}

impl Serialize for ModelConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        json::ModelConfigJson::from(self).serialize(serializer)
    }
}

/// Reads the typed configuration out of the untyped tree.
struct Reader<'a> {
    file: &'a str,
    ignored: BTreeSet<String>,
    /// The tree came from JSON: strings stand for enum values and integers too.
    from_json: bool,
}

/// Tracks the singular fields of one message, so that one given twice is refused.
#[derive(Default)]
struct Seen<'m>(HashMap<&'m str, Pos>);

impl<'m> Seen<'m> {
    fn once(&mut self, reader: &Reader, path: &str, field: &'m Field) -> Result<(), ParseError> {
        if let Some(first) = self.0.insert(&field.name, field.pos) {
            return Err(reader.error(field.pos, format!("{} is given twice (first at line {})", join(path, &field.name), first.line)));
        }
        Ok(())
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

impl Reader<'_> {
    fn error(&self, pos: Pos, message: impl Into<String>) -> ParseError {
        ParseError::at(self.file, pos, message)
    }

    fn ignore(&mut self, path: &str, field: &Field) {
        self.ignored.insert(join(path, &field.name));
    }

    fn expected(&self, path: &str, field: &Field, what: &str) -> ParseError {
        self.error(field.value_pos, format!("{}: expected {what}, found {}", join(path, &field.name), field.value.describe()))
    }

    /// An integer; from JSON, a string of one too (protobuf's JSON writes 64-bit
    /// integers so).
    fn int(&self, path: &str, field: &Field, min: i128, max: i128) -> Result<i128, ParseError> {
        let value = match &field.value {
            Value::Int(i) => *i,
            Value::Str(text) if self.from_json => text.trim().parse::<i128>().map_err(|_| self.expected(path, field, "an integer"))?,
            _ => return Err(self.expected(path, field, "an integer")),
        };
        if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(self.error(field.value_pos, format!("{}: {value} is out of range ({min} to {max})", join(path, &field.name))))
        }
    }

    fn u32(&self, path: &str, field: &Field) -> Result<u32, ParseError> {
        Ok(self.int(path, field, 0, i32::MAX.into())? as u32)
    }

    fn u64(&self, path: &str, field: &Field) -> Result<u64, ParseError> {
        Ok(self.int(path, field, 0, u64::MAX.into())? as u64)
    }

    fn string(&self, path: &str, field: &Field) -> Result<String, ParseError> {
        match &field.value {
            Value::Str(s) => Ok(s.clone()),
            _ => Err(self.expected(path, field, "a string in quotes")),
        }
    }

    fn boolean(&self, path: &str, field: &Field) -> Result<bool, ParseError> {
        match &field.value {
            Value::Ident(i) if matches!(i.as_str(), "true" | "True" | "t") => Ok(true),
            Value::Ident(i) if matches!(i.as_str(), "false" | "False" | "f") => Ok(false),
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            _ => Err(self.expected(path, field, "true or false")),
        }
    }

    /// An enum value: an identifier, or from JSON a string (as protobuf's JSON writes it).
    fn ident<'f>(&self, path: &str, field: &'f Field, one_of: &[&str]) -> Result<&'f str, ParseError> {
        match &field.value {
            Value::Ident(i) if one_of.contains(&i.as_str()) => Ok(i),
            Value::Str(i) if self.from_json && one_of.contains(&i.as_str()) => Ok(i),
            _ => Err(self.expected(path, field, &format!("one of {}", one_of.join(", ")))),
        }
    }

    /// A file name that stays in its folder (no separator, not `.` or `..`); `""` is
    /// returned as it is, for the caller to judge.
    fn file_name(&self, path: &str, field: &Field) -> Result<String, ParseError> {
        let file = self.string(path, field)?;
        if file.contains(['/', '\\']) || file == "." || file == ".." {
            return Err(self.error(field.value_pos, format!("{} {file:?} must be a plain file name", join(path, &field.name))));
        }
        Ok(file)
    }

    fn message<'f>(&self, path: &str, field: &'f Field) -> Result<&'f Message, ParseError> {
        match &field.value {
            Value::Message(m) => Ok(m),
            _ => Err(self.expected(path, field, "a message in { }")),
        }
    }

    fn model_config(&mut self, tree: &Message, model: &str) -> Result<ModelConfig, ParseError> {
        let mut config = ModelConfig::without_file(model);
        config.from_graph = None;
        let mut seen = Seen::default();
        let (mut platform, mut backend, mut ensemble_at) = (None, None, None);
        let mut preferred_at = Vec::new();
        for field in &tree.fields {
            match field.name.as_str() {
                "name" => {
                    seen.once(self, "", field)?;
                    let name = self.string("", field)?;
                    if name != model {
                        return Err(self.error(
                            field.value_pos,
                            format!("name {name:?} differs from the model's folder {model:?}; they must be the same (or leave name out)"),
                        ));
                    }
                }
                "platform" => {
                    seen.once(self, "", field)?;
                    platform = Some((self.string("", field)?, field.value_pos));
                }
                "backend" => {
                    seen.once(self, "", field)?;
                    backend = Some((self.string("", field)?, field.value_pos));
                }
                "max_batch_size" => {
                    seen.once(self, "", field)?;
                    config.max_batch_size = self.u32("", field)?;
                }
                "input" => {
                    let path = format!("input[{}]", config.input.len());
                    config.input.push(self.tensor(&path, "input", self.message("", field)?, true)?);
                }
                "output" => {
                    let path = format!("output[{}]", config.output.len());
                    config.output.push(self.tensor(&path, "output", self.message("", field)?, false)?);
                }
                "dynamic_batching" => {
                    seen.once(self, "", field)?;
                    let (batching, at) = self.dynamic_batching(self.message("", field)?)?;
                    preferred_at = at;
                    config.dynamic_batching = Some(batching);
                }
                "instance_group" => {
                    let index = config.instance_group.len();
                    let group = self.instance_group(self.message("", field)?, &format!("{model}_{index}"), index)?;
                    config.instance_group.push(group);
                }
                "version_policy" => {
                    seen.once(self, "", field)?;
                    config.version_policy = self.version_policy(self.message("", field)?, field.pos)?;
                }
                "parameters" => {
                    let (key, value) = self.map_entry("parameters", self.message("", field)?, field.pos, true)?;
                    config.parameters.insert(key, value);
                }
                "ensemble_scheduling" => {
                    seen.once(self, "", field)?;
                    ensemble_at = Some(field.pos);
                    config.ensemble_steps = self.ensemble(self.message("", field)?, field.pos)?;
                }
                "default_model_filename" => {
                    seen.once(self, "", field)?;
                    let name = self.file_name("", field)?;
                    if name.is_empty() {
                        return Err(self.error(field.value_pos, "default_model_filename \"\" must be a plain file name"));
                    }
                    config.default_model_filename = name;
                }
                "model_warmup" => {
                    let sample = self.warmup(self.message("", field)?, field.pos)?;
                    config.warmup.push(sample);
                }
                "sequence_batching" => {
                    seen.once(self, "", field)?;
                    config.sequence_batching = Some(self.sequence_batching(self.message("", field)?, field.pos)?);
                }
                "model_transaction_policy" => {
                    seen.once(self, "", field)?;
                    const PATH: &str = "model_transaction_policy";
                    for f in &self.message("", field)?.fields {
                        match f.name.as_str() {
                            "decoupled" => config.decoupled = self.boolean(PATH, f)?,
                            _ => self.ignore(PATH, f),
                        }
                    }
                }
                _ => self.ignore("", field),
            }
        }
        config.backend = self.backend(platform, backend, ensemble_at)?;
        if let Some(batching) = &config.dynamic_batching {
            let sizes = batching.preferred_batch_size.iter().zip(preferred_at);
            if let Some((size, at)) = sizes.into_iter().find(|(s, _)| **s > config.max_batch_size) {
                return Err(self
                    .error(at, format!("dynamic_batching.preferred_batch_size {size} is over max_batch_size {}", config.max_batch_size)));
            }
        }
        if config.backend == Backend::OnnxRuntime && (config.input.is_empty() || config.output.is_empty()) {
            config.from_graph = Some(FromGraph::Tensors);
        }
        Ok(config)
    }

    /// The backend from `platform` and `backend`, refusing anything but ONNX Runtime and ensembles.
    fn backend(
        &self,
        platform: Option<(String, Pos)>,
        backend: Option<(String, Pos)>,
        ensemble_at: Option<Pos>,
    ) -> Result<Backend, ParseError> {
        const SERVED: &str = "Yardmaster serves ONNX models (platform \"onnxruntime_onnx\", backend \"onnxruntime\") and ensembles of them";
        let from_platform = match &platform {
            None => None,
            Some((p, _)) if p == "onnxruntime_onnx" => Some(Backend::OnnxRuntime),
            Some((p, _)) if p == "ensemble" => Some(Backend::Ensemble),
            Some((p, at)) => return Err(self.error(*at, format!("platform {p:?} is not served: {SERVED}"))),
        };
        let from_backend = match &backend {
            None => None,
            Some((b, _)) if b == "onnxruntime" => Some(Backend::OnnxRuntime),
            Some((b, at)) => return Err(self.error(*at, format!("backend {b:?} is not served: {SERVED}"))),
        };
        let chosen = match (from_platform, from_backend) {
            (Some(p), Some(b)) if p != b => {
                let at = backend.as_ref().unwrap().1;
                return Err(self.error(at, format!("backend \"onnxruntime\" contradicts platform {:?}", platform.unwrap().0)));
            }
            (p, b) => p.or(b).unwrap_or(if ensemble_at.is_some() { Backend::Ensemble } else { Backend::OnnxRuntime }),
        };
        match (chosen, ensemble_at) {
            (Backend::Ensemble, None) => {
                let at = platform.map(|p| p.1).unwrap_or(Pos { line: 1, column: 1 });
                Err(self.error(at, "platform \"ensemble\" needs ensemble_scheduling with its steps"))
            }
            (Backend::OnnxRuntime, Some(at)) => Err(self.error(at, "ensemble_scheduling needs platform \"ensemble\"")),
            (chosen, _) => Ok(chosen),
        }
    }

    fn tensor(&mut self, path: &str, kind: &str, message: &Message, is_input: bool) -> Result<TensorConfig, ParseError> {
        let mut seen = Seen::default();
        let (mut name, mut data_type, mut dims, mut reshape, mut optional) = (None, None, Vec::new(), None, false);
        let (mut format, mut label_filename) = (None, None);
        let mut dims_at = None;
        for field in &message.fields {
            match field.name.as_str() {
                "name" => {
                    seen.once(self, path, field)?;
                    name = Some(self.string(path, field)?);
                }
                "data_type" => {
                    seen.once(self, path, field)?;
                    let names: Vec<&str> = DATA_TYPES.iter().map(|(_, n)| *n).collect();
                    data_type = DataType::from_triton_name(self.ident(path, field, &names)?);
                }
                "dims" => {
                    dims_at.get_or_insert(field.pos);
                    dims.push(self.dim(path, field)?);
                }
                "reshape" => {
                    seen.once(self, path, field)?;
                    let mut shape = Vec::new();
                    for f in &self.message(path, field)?.fields {
                        let inner = join(path, "reshape");
                        if f.name == "shape" {
                            shape.push(self.dim(&inner, f)?);
                        } else {
                            self.ignore(&format!("{kind}.reshape"), f);
                        }
                    }
                    reshape = Some(shape);
                }
                "optional" if is_input => {
                    seen.once(self, path, field)?;
                    optional = self.boolean(path, field)?;
                }
                "format" if is_input => {
                    seen.once(self, path, field)?;
                    format = Some(self.ident(path, field, &["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"])?.to_string());
                }
                "label_filename" if !is_input => {
                    seen.once(self, path, field)?;
                    let file = self.file_name(path, field)?;
                    // "" is Triton's "no labels".
                    label_filename = (!file.is_empty()).then_some(file);
                }
                _ => self.ignore(kind, field),
            }
        }
        let at = message.fields.first().map(|f| f.pos).unwrap_or(Pos { line: 1, column: 1 });
        let name = name.ok_or_else(|| self.error(at, format!("{path}: name is missing")))?;
        let data_type = data_type.ok_or_else(|| self.error(at, format!("{path} ({name:?}): data_type is missing")))?;
        if dims_at.is_none() {
            return Err(self.error(at, format!("{path} ({name:?}): dims is missing")));
        }
        Ok(TensorConfig { name, data_type, dims, reshape, optional, format, label_filename })
    }

    /// One dimension: -1 (any) or positive.
    fn dim(&self, path: &str, field: &Field) -> Result<i64, ParseError> {
        let d = self.int(path, field, -1, i64::MAX.into())? as i64;
        if d == 0 {
            return Err(
                self.error(field.value_pos, format!("{}: a dimension is -1 (any size) or positive, not 0", join(path, &field.name)))
            );
        }
        Ok(d)
    }

    /// `dynamic_batching`, and where each `preferred_batch_size` is.
    fn dynamic_batching(&mut self, message: &Message) -> Result<(DynamicBatching, Vec<Pos>), ParseError> {
        const PATH: &str = "dynamic_batching";
        let mut seen = Seen::default();
        let mut batching = DynamicBatching::default();
        let (mut preferred_at, mut default_level_at) = (Vec::new(), None);
        for field in &message.fields {
            match field.name.as_str() {
                "preferred_batch_size" => {
                    preferred_at.push(field.value_pos);
                    let size = self.u32(PATH, field)?;
                    if size == 0 {
                        return Err(self.error(field.value_pos, "dynamic_batching.preferred_batch_size must be positive"));
                    }
                    batching.preferred_batch_size.push(size);
                }
                "max_queue_delay_microseconds" => {
                    seen.once(self, PATH, field)?;
                    batching.max_queue_delay_microseconds = self.u64(PATH, field)?;
                }
                "priority_levels" => {
                    seen.once(self, PATH, field)?;
                    batching.priority_levels = self.u64(PATH, field)?;
                }
                "default_priority_level" => {
                    seen.once(self, PATH, field)?;
                    default_level_at = Some(field.value_pos);
                    batching.default_priority_level = self.u64(PATH, field)?;
                }
                "default_queue_policy" => {
                    seen.once(self, PATH, field)?;
                    batching.default_queue_policy = Some(self.queue_policy(self.message(PATH, field)?)?);
                }
                _ => self.ignore(PATH, field),
            }
        }
        let level = batching.default_priority_level;
        let levels = batching.priority_levels;
        if let Some(at) = default_level_at {
            if levels == 0 && level != 0 {
                return Err(self.error(at, format!("dynamic_batching.default_priority_level {level} needs priority_levels")));
            }
            if levels > 0 && !(1..=levels).contains(&level) {
                return Err(self.error(at, format!("dynamic_batching.default_priority_level {level} is not in 1 to {levels}")));
            }
        } else if levels > 0 {
            // Triton requires it; with none given, take the lowest priority rather than refuse.
            batching.default_priority_level = levels;
        }
        Ok((batching, preferred_at))
    }

    fn queue_policy(&mut self, message: &Message) -> Result<QueuePolicy, ParseError> {
        const PATH: &str = "dynamic_batching.default_queue_policy";
        let mut seen = Seen::default();
        let mut policy = QueuePolicy::default();
        for field in &message.fields {
            match field.name.as_str() {
                "timeout_action" => {
                    seen.once(self, PATH, field)?;
                    policy.timeout_action = if self.ident(PATH, field, &["REJECT", "DELAY"])? == "REJECT" {
                        TimeoutAction::Reject
                    } else {
                        TimeoutAction::Delay
                    };
                }
                "default_timeout_microseconds" => {
                    seen.once(self, PATH, field)?;
                    policy.default_timeout_microseconds = self.u64(PATH, field)?;
                }
                "allow_timeout_override" => {
                    seen.once(self, PATH, field)?;
                    policy.allow_timeout_override = self.boolean(PATH, field)?;
                }
                "max_queue_size" => {
                    seen.once(self, PATH, field)?;
                    policy.max_queue_size = self.int(PATH, field, 0, u32::MAX.into())? as u32;
                }
                _ => self.ignore(PATH, field),
            }
        }
        Ok(policy)
    }

    fn instance_group(&mut self, message: &Message, default_name: &str, index: usize) -> Result<InstanceGroup, ParseError> {
        let path = format!("instance_group[{index}]");
        let mut seen = Seen::default();
        let mut group = InstanceGroup { name: default_name.into(), kind: InstanceKind::Auto, count: 1, gpus: Vec::new() };
        for field in &message.fields {
            match field.name.as_str() {
                "name" => {
                    seen.once(self, &path, field)?;
                    group.name = self.string(&path, field)?;
                }
                "count" => {
                    seen.once(self, &path, field)?;
                    group.count = self.u32(&path, field)?;
                    if group.count == 0 {
                        return Err(self.error(field.value_pos, format!("{path}.count must be at least 1")));
                    }
                }
                "kind" => {
                    seen.once(self, &path, field)?;
                    if matches!(&field.value, Value::Ident(k) if k == "KIND_MODEL")
                        || matches!(&field.value, Value::Str(k) if self.from_json && k == "KIND_MODEL")
                    {
                        return Err(self
                            .error(field.value_pos, format!("{path}.kind KIND_MODEL is not served: use KIND_CPU, KIND_GPU or KIND_AUTO")));
                    }
                    group.kind = match self.ident(&path, field, &["KIND_AUTO", "KIND_GPU", "KIND_CPU"])? {
                        "KIND_GPU" => InstanceKind::Gpu,
                        "KIND_CPU" => InstanceKind::Cpu,
                        _ => InstanceKind::Auto,
                    };
                }
                "gpus" => group.gpus.push(self.u32(&path, field)?),
                _ => self.ignore("instance_group", field),
            }
        }
        if group.kind == InstanceKind::Cpu && !group.gpus.is_empty() {
            let at = message.fields.iter().find(|f| f.name == "gpus").unwrap().pos;
            return Err(self.error(at, format!("{path}: gpus are listed for a KIND_CPU group")));
        }
        Ok(group)
    }

    fn version_policy(&mut self, message: &Message, at: Pos) -> Result<VersionPolicy, ParseError> {
        const PATH: &str = "version_policy";
        let mut policy = None;
        for field in &message.fields {
            let chosen = match field.name.as_str() {
                "latest" => {
                    let mut num_versions = None;
                    for f in &self.message(PATH, field)?.fields {
                        if f.name == "num_versions" {
                            let n = self.u32("version_policy.latest", f)?;
                            if n == 0 {
                                return Err(self.error(f.value_pos, "version_policy.latest.num_versions must be at least 1"));
                            }
                            num_versions = Some(n);
                        } else {
                            self.ignore("version_policy.latest", f);
                        }
                    }
                    let num_versions = num_versions.ok_or_else(|| {
                        self.error(field.pos, "version_policy.latest needs num_versions (for example latest { num_versions: 2 })")
                    })?;
                    VersionPolicy::Latest { num_versions }
                }
                "all" => {
                    for f in &self.message(PATH, field)?.fields {
                        self.ignore("version_policy.all", f);
                    }
                    VersionPolicy::All
                }
                "specific" => {
                    let mut versions = Vec::new();
                    for f in &self.message(PATH, field)?.fields {
                        if f.name == "versions" {
                            versions.push(self.int("version_policy.specific", f, 0, i64::MAX.into())? as u64);
                        } else {
                            self.ignore("version_policy.specific", f);
                        }
                    }
                    if versions.is_empty() {
                        return Err(self.error(field.pos, "version_policy.specific lists no versions"));
                    }
                    VersionPolicy::Specific { versions }
                }
                _ => {
                    return Err(self.error(field.pos, format!("version_policy: expected latest, all or specific, found `{}`", field.name)));
                }
            };
            if policy.replace(chosen).is_some() {
                return Err(self.error(field.pos, "version_policy gives more than one of latest, all and specific"));
            }
        }
        policy.ok_or_else(|| self.error(at, "version_policy is empty: give latest, all or specific"))
    }

    /// One `model_warmup` sample.
    fn warmup(&mut self, message: &Message, at: Pos) -> Result<Warmup, ParseError> {
        const PATH: &str = "model_warmup";
        let mut seen = Seen::default();
        let mut sample = Warmup { name: String::new(), batch_size: 0, count: 0, inputs: BTreeMap::new() };
        for field in &message.fields {
            match field.name.as_str() {
                "name" => {
                    seen.once(self, PATH, field)?;
                    sample.name = self.string(PATH, field)?;
                }
                "batch_size" => {
                    seen.once(self, PATH, field)?;
                    sample.batch_size = self.u32(PATH, field)?;
                }
                "count" => {
                    seen.once(self, PATH, field)?;
                    sample.count = self.u32(PATH, field)?;
                }
                "inputs" => {
                    let entry = self.message(PATH, field)?;
                    let key = entry.fields.iter().find(|f| f.name == "key").map(|f| self.string(PATH, f)).transpose()?;
                    let key = key.ok_or_else(|| self.error(field.pos, "model_warmup.inputs: an entry without key"))?;
                    let value = entry.fields.iter().find(|f| f.name == "value");
                    let value = value.ok_or_else(|| self.error(field.pos, format!("model_warmup.inputs {key:?}: no value")))?;
                    let input = self.warmup_input(&key, self.message(PATH, value)?, value.pos)?;
                    sample.inputs.insert(key, input);
                }
                _ => self.ignore(PATH, field),
            }
        }
        if sample.batch_size == 0 {
            return Err(self.error(at, format!("model_warmup {:?}: batch_size must be at least 1", sample.name)));
        }
        Ok(sample)
    }

    /// `sequence_batching`: its strategy, idle time, control inputs and states.
    fn sequence_batching(&mut self, message: &Message, at: Pos) -> Result<SequenceBatching, ParseError> {
        const PATH: &str = "sequence_batching";
        let mut seen = Seen::default();
        let mut batching = SequenceBatching {
            strategy: SequenceStrategy::Direct,
            max_sequence_idle_microseconds: DEFAULT_MAX_SEQUENCE_IDLE_MICROSECONDS,
            control_inputs: Vec::new(),
            states: Vec::new(),
        };
        let mut strategies = 0;
        for field in &message.fields {
            match field.name.as_str() {
                "direct" | "oldest" => {
                    strategies += 1;
                    if strategies > 1 {
                        return Err(self.error(field.pos, "sequence_batching: give one strategy, direct or oldest"));
                    }
                    batching.strategy = if field.name == "direct" { SequenceStrategy::Direct } else { SequenceStrategy::Oldest };
                    // Their settings tune Triton's own batcher; the policy forms the batches here.
                    for f in &self.message(PATH, field)?.fields {
                        self.ignore(&join(PATH, &field.name), f);
                    }
                }
                "max_sequence_idle_microseconds" => {
                    seen.once(self, PATH, field)?;
                    batching.max_sequence_idle_microseconds = self.u64(PATH, field)?;
                }
                "control_input" => {
                    let input = self.message(PATH, field)?;
                    batching.control_inputs.extend(self.control_input(input, field.pos)?);
                }
                "state" => {
                    let state = self.sequence_state(self.message(PATH, field)?, field.pos)?;
                    batching.states.push(state);
                }
                _ => self.ignore(PATH, field),
            }
        }
        let mut names: Vec<&str> = batching.control_inputs.iter().map(|c| c.name.as_str()).collect();
        names.extend(batching.states.iter().map(|s| s.input_name.as_str()));
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(self.error(at, format!("sequence_batching fills input {:?} twice", twice[0])));
        }
        Ok(batching)
    }

    /// One `control_input { name control [ { kind … } ] }`: one control per input.
    fn control_input(&mut self, message: &Message, at: Pos) -> Result<Vec<ControlInput>, ParseError> {
        const PATH: &str = "sequence_batching.control_input";
        let mut name = None;
        let mut controls = Vec::new();
        for field in &message.fields {
            match field.name.as_str() {
                "name" => name = Some(self.string(PATH, field)?),
                "control" => controls.push((self.message(PATH, field)?, field.pos)),
                _ => self.ignore(PATH, field),
            }
        }
        let name = name.filter(|n| !n.is_empty()).ok_or_else(|| self.error(at, format!("{PATH}: name is missing")))?;
        if controls.len() != 1 {
            return Err(self.error(at, format!("{PATH} {name:?}: give exactly one control, {} given", controls.len())));
        }
        let mut parsed = Vec::new();
        for (control, at) in controls {
            let path = format!("{PATH}[{name:?}].control");
            let (mut kind, mut values, mut data_type) = (None, None, None);
            let (mut ints, mut floats, mut bools) = (Vec::new(), Vec::new(), Vec::new());
            for field in &control.fields {
                match field.name.as_str() {
                    "kind" => {
                        let kinds = ["CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_CORRID"];
                        kind = Some(match self.ident(&path, field, &kinds)? {
                            "CONTROL_SEQUENCE_START" => ControlKind::Start,
                            "CONTROL_SEQUENCE_READY" => ControlKind::Ready,
                            "CONTROL_SEQUENCE_END" => ControlKind::End,
                            _ => ControlKind::CorrelationId,
                        });
                    }
                    "int32_false_true" => ints.push(self.int(&path, field, i32::MIN.into(), i32::MAX.into())? as i32),
                    "fp32_false_true" => floats.push(match &field.value {
                        Value::Float(f) => *f as f32,
                        Value::Int(i) => *i as f32,
                        _ => return Err(self.expected(&path, field, "a number")),
                    }),
                    "bool_false_true" => bools.push(self.boolean(&path, field)?),
                    "data_type" => {
                        let names: Vec<&str> = DATA_TYPES.iter().map(|(_, n)| *n).collect();
                        data_type = DataType::from_triton_name(self.ident(&path, field, &names)?);
                    }
                    _ => self.ignore(&path, field),
                }
            }
            let kind = kind.ok_or_else(|| self.error(at, format!("{path}: kind is missing")))?;
            let given = [!ints.is_empty(), !floats.is_empty(), !bools.is_empty()].iter().filter(|g| **g).count();
            let pair = |n: usize| -> Result<(), ParseError> {
                if n == 2 {
                    Ok(())
                } else {
                    Err(self.error(at, format!("{path}: the false and true values are two, {n} given")))
                }
            };
            if kind == ControlKind::CorrelationId {
                if given > 0 {
                    return Err(self.error(at, format!("{path}: CONTROL_SEQUENCE_CORRID takes data_type, not false/true values")));
                }
                let data_type = data_type.ok_or_else(|| self.error(at, format!("{path}: CONTROL_SEQUENCE_CORRID needs data_type")))?;
                let carried = [DataType::Uint64, DataType::Int64, DataType::Uint32, DataType::Int32, DataType::String];
                if !carried.contains(&data_type) {
                    return Err(self.error(
                        at,
                        format!(
                            "{path}: a correlation id is TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, not {}",
                            data_type.triton_name()
                        ),
                    ));
                }
                parsed.push(ControlInput { name: name.clone(), kind, values: None, data_type });
                continue;
            }
            if given != 1 {
                return Err(self.error(at, format!("{path}: give one of int32_false_true, fp32_false_true or bool_false_true")));
            }
            if !ints.is_empty() {
                pair(ints.len())?;
                values = Some((ControlValues::Int32(ints[0], ints[1]), DataType::Int32));
            } else if !floats.is_empty() {
                pair(floats.len())?;
                values = Some((ControlValues::Fp32(floats[0], floats[1]), DataType::Fp32));
            } else if !bools.is_empty() {
                pair(bools.len())?;
                values = Some((ControlValues::Bool(bools[0], bools[1]), DataType::Bool));
            }
            let (values, data_type) = values.expect("one kind of values was given");
            parsed.push(ControlInput { name: name.clone(), kind, values: Some(values), data_type });
        }
        Ok(parsed)
    }

    /// One implicit `state { input_name output_name data_type dims initial_state }`.
    fn sequence_state(&mut self, message: &Message, at: Pos) -> Result<SequenceState, ParseError> {
        const PATH: &str = "sequence_batching.state";
        let (mut input_name, mut output_name, mut data_type, mut dims, mut initial) = (None, None, None, Vec::new(), None);
        for field in &message.fields {
            match field.name.as_str() {
                "input_name" => input_name = Some(self.string(PATH, field)?),
                "output_name" => output_name = Some(self.string(PATH, field)?),
                "data_type" => {
                    let names: Vec<&str> = DATA_TYPES.iter().map(|(_, n)| *n).collect();
                    data_type = DataType::from_triton_name(self.ident(PATH, field, &names)?);
                }
                "dims" => dims.push(self.dim(PATH, field)?),
                "initial_state" => {
                    if initial.is_some() {
                        return Err(self.error(field.pos, format!("{PATH}: one initial_state per state")));
                    }
                    initial = Some(self.initial_state(self.message(PATH, field)?, field.pos)?);
                }
                _ => self.ignore(PATH, field),
            }
        }
        let missing = |what: &str| self.error(at, format!("{PATH}: {what} is missing"));
        let input_name = input_name.filter(|n| !n.is_empty()).ok_or_else(|| missing("input_name"))?;
        let output_name = output_name.filter(|n| !n.is_empty()).ok_or_else(|| missing("output_name"))?;
        let data_type = data_type.ok_or_else(|| missing("data_type"))?;
        if dims.is_empty() {
            return Err(missing("dims"));
        }
        Ok(SequenceState { input_name, output_name, data_type, dims, initial })
    }

    /// A state's `initial_state { data_type dims zero_data | data_file name }`.
    fn initial_state(&mut self, message: &Message, at: Pos) -> Result<InitialState, ParseError> {
        const PATH: &str = "sequence_batching.state.initial_state";
        let (mut dims, mut data) = (Vec::new(), None);
        for field in &message.fields {
            match field.name.as_str() {
                "dims" => dims.push(self.int(PATH, field, 0, i64::MAX.into())? as i64),
                "zero_data" => data = Some(InitialData::Zero),
                "data_file" => {
                    let file = self.file_name(PATH, field)?;
                    if file.is_empty() {
                        return Err(self.error(field.value_pos, format!("{PATH}.data_file \"\" must be a plain file name")));
                    }
                    data = Some(InitialData::File(file));
                }
                // Its data_type and name repeat the state's.
                "data_type" | "name" => {}
                _ => self.ignore(PATH, field),
            }
        }
        let data = data.ok_or_else(|| self.error(at, format!("{PATH}: give zero_data or data_file")))?;
        Ok(InitialState { dims, data })
    }

    /// One input of a `model_warmup` sample.
    fn warmup_input(&mut self, name: &str, message: &Message, at: Pos) -> Result<WarmupInput, ParseError> {
        let path = format!("model_warmup.inputs[{name:?}]");
        let (mut data_type, mut dims, mut data) = (None, Vec::new(), None);
        for field in &message.fields {
            match field.name.as_str() {
                "data_type" => {
                    let names: Vec<&str> = DATA_TYPES.iter().map(|(_, n)| *n).collect();
                    data_type = DataType::from_triton_name(self.ident(&path, field, &names)?);
                }
                "dims" => dims.push(self.int(&path, field, 0, i64::MAX.into())? as i64),
                "zero_data" => data = Some(WarmupData::Zero),
                "random_data" => data = Some(WarmupData::Random),
                "input_data_file" => {
                    let file = self.file_name(&path, field)?;
                    if file.is_empty() {
                        return Err(self.error(field.value_pos, format!("{path}.input_data_file \"\" must be a plain file name")));
                    }
                    data = Some(WarmupData::File(file));
                }
                _ => self.ignore("model_warmup.inputs", field),
            }
        }
        let data_type = data_type.ok_or_else(|| self.error(at, format!("{path}: data_type is missing")))?;
        let data = data.ok_or_else(|| self.error(at, format!("{path}: give zero_data, random_data or input_data_file")))?;
        Ok(WarmupInput { data_type, dims, data })
    }

    /// A map entry `{ key: "k" value: … }`: with `nested_value`, the value is
    /// `{ string_value: "v" }` (`parameters`); without, a plain string.
    fn map_entry(&mut self, path: &str, message: &Message, at: Pos, nested_value: bool) -> Result<(String, String), ParseError> {
        let mut seen = Seen::default();
        let (mut key, mut value) = (None, String::new());
        for field in &message.fields {
            match field.name.as_str() {
                "key" => {
                    seen.once(self, path, field)?;
                    key = Some(self.string(path, field)?);
                }
                "value" if nested_value => {
                    seen.once(self, path, field)?;
                    let inner = join(path, "value");
                    for f in &self.message(path, field)?.fields {
                        if f.name == "string_value" {
                            value = self.string(&inner, f)?;
                        } else {
                            self.ignore(&inner, f);
                        }
                    }
                }
                "value" => {
                    seen.once(self, path, field)?;
                    value = self.string(path, field)?;
                }
                _ => self.ignore(path, field),
            }
        }
        let key = key.ok_or_else(|| self.error(at, format!("{path}: an entry without key")))?;
        Ok((key, value))
    }

    fn ensemble(&mut self, message: &Message, at: Pos) -> Result<Vec<EnsembleStep>, ParseError> {
        const PATH: &str = "ensemble_scheduling.step";
        let mut steps = Vec::new();
        for field in &message.fields {
            if field.name != "step" {
                self.ignore("ensemble_scheduling", field);
                continue;
            }
            let mut seen = Seen::default();
            let mut step =
                EnsembleStep { model_name: String::new(), model_version: -1, input_map: BTreeMap::new(), output_map: BTreeMap::new() };
            for f in &self.message("ensemble_scheduling", field)?.fields {
                match f.name.as_str() {
                    "model_name" => {
                        seen.once(self, PATH, f)?;
                        step.model_name = self.string(PATH, f)?;
                    }
                    "model_version" => {
                        seen.once(self, PATH, f)?;
                        step.model_version = self.int(PATH, f, -1, i64::MAX.into())? as i64;
                    }
                    "input_map" | "output_map" => {
                        let (key, value) = self.map_entry(&join(PATH, &f.name), self.message(PATH, f)?, f.pos, false)?;
                        let map = if f.name == "input_map" { &mut step.input_map } else { &mut step.output_map };
                        map.insert(key, value);
                    }
                    _ => self.ignore(PATH, f),
                }
            }
            if step.model_name.is_empty() {
                return Err(self.error(field.pos, format!("{PATH} {} has no model_name", steps.len() + 1)));
            }
            steps.push(step);
        }
        if steps.is_empty() {
            return Err(self.error(at, "ensemble_scheduling has no step"));
        }
        Ok(steps)
    }
}

mod json {
    //! The serde shape of Triton's `GET /v2/models/{m}/config` answer (snake_case, as
    //! Triton's JSON uses; enums by name; dimensions as numbers).

    use super::*;

    #[derive(Serialize)]
    pub struct ModelConfigJson<'a> {
        name: &'a str,
        platform: &'a str,
        backend: &'a str,
        version_policy: VersionPolicyJson<'a>,
        max_batch_size: u32,
        input: Vec<TensorJson<'a>>,
        output: Vec<TensorJson<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dynamic_batching: Option<DynamicBatchingJson<'a>>,
        instance_group: Vec<InstanceGroupJson<'a>>,
        default_model_filename: &'a str,
        parameters: BTreeMap<&'a str, ParameterJson<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ensemble_scheduling: Option<EnsembleJson<'a>>,
        model_transaction_policy: TransactionPolicyJson,
    }

    #[derive(Serialize)]
    struct TransactionPolicyJson {
        decoupled: bool,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum VersionPolicyJson<'a> {
        Latest { num_versions: u32 },
        All {},
        Specific { versions: &'a [u64] },
    }

    #[derive(Serialize)]
    struct TensorJson<'a> {
        name: &'a str,
        data_type: &'static str,
        dims: &'a [i64],
        #[serde(skip_serializing_if = "Option::is_none")]
        reshape: Option<ReshapeJson<'a>>,
        is_shape_tensor: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        optional: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        format: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        label_filename: Option<&'a str>,
    }

    #[derive(Serialize)]
    struct ReshapeJson<'a> {
        shape: &'a [i64],
    }

    #[derive(Serialize)]
    struct DynamicBatchingJson<'a> {
        preferred_batch_size: &'a [u32],
        max_queue_delay_microseconds: u64,
        priority_levels: u64,
        default_priority_level: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        default_queue_policy: Option<QueuePolicyJson>,
    }

    #[derive(Serialize)]
    struct QueuePolicyJson {
        timeout_action: &'static str,
        default_timeout_microseconds: u64,
        allow_timeout_override: bool,
        max_queue_size: u32,
    }

    #[derive(Serialize)]
    struct InstanceGroupJson<'a> {
        name: &'a str,
        kind: &'static str,
        count: u32,
        gpus: &'a [u32],
    }

    #[derive(Serialize)]
    struct ParameterJson<'a> {
        string_value: &'a str,
    }

    #[derive(Serialize)]
    struct EnsembleJson<'a> {
        step: Vec<StepJson<'a>>,
    }

    #[derive(Serialize)]
    struct StepJson<'a> {
        model_name: &'a str,
        model_version: i64,
        input_map: &'a BTreeMap<String, String>,
        output_map: &'a BTreeMap<String, String>,
    }

    fn tensor(t: &TensorConfig, is_input: bool) -> TensorJson<'_> {
        TensorJson {
            name: &t.name,
            data_type: t.data_type.triton_name(),
            dims: &t.dims,
            reshape: t.reshape.as_deref().map(|shape| ReshapeJson { shape }),
            is_shape_tensor: false,
            optional: is_input.then_some(t.optional),
            format: is_input.then(|| t.format.as_deref().unwrap_or("FORMAT_NONE")),
            label_filename: if is_input { None } else { Some(t.label_filename.as_deref().unwrap_or("")) },
        }
    }

    impl<'a> From<&'a ModelConfig> for ModelConfigJson<'a> {
        fn from(c: &'a ModelConfig) -> Self {
            let (platform, backend) = match c.backend {
                Backend::OnnxRuntime => ("onnxruntime_onnx", "onnxruntime"),
                Backend::Ensemble => ("ensemble", ""),
            };
            ModelConfigJson {
                name: &c.name,
                platform,
                backend,
                version_policy: match &c.version_policy {
                    VersionPolicy::Latest { num_versions } => VersionPolicyJson::Latest { num_versions: *num_versions },
                    VersionPolicy::All => VersionPolicyJson::All {},
                    VersionPolicy::Specific { versions } => VersionPolicyJson::Specific { versions },
                },
                max_batch_size: c.max_batch_size,
                input: c.input.iter().map(|t| tensor(t, true)).collect(),
                output: c.output.iter().map(|t| tensor(t, false)).collect(),
                dynamic_batching: c.dynamic_batching.as_ref().map(|d| DynamicBatchingJson {
                    preferred_batch_size: &d.preferred_batch_size,
                    max_queue_delay_microseconds: d.max_queue_delay_microseconds,
                    priority_levels: d.priority_levels,
                    default_priority_level: d.default_priority_level,
                    default_queue_policy: d.default_queue_policy.as_ref().map(|q| QueuePolicyJson {
                        timeout_action: match q.timeout_action {
                            TimeoutAction::Reject => "REJECT",
                            TimeoutAction::Delay => "DELAY",
                        },
                        default_timeout_microseconds: q.default_timeout_microseconds,
                        allow_timeout_override: q.allow_timeout_override,
                        max_queue_size: q.max_queue_size,
                    }),
                }),
                instance_group: c
                    .instance_group
                    .iter()
                    .map(|g| InstanceGroupJson { name: &g.name, kind: g.kind.triton_name(), count: g.count, gpus: &g.gpus })
                    .collect(),
                default_model_filename: &c.default_model_filename,
                parameters: c.parameters.iter().map(|(k, v)| (k.as_str(), ParameterJson { string_value: v })).collect(),
                ensemble_scheduling: (!c.ensemble_steps.is_empty()).then(|| EnsembleJson {
                    step: c
                        .ensemble_steps
                        .iter()
                        .map(|s| StepJson {
                            model_name: &s.model_name,
                            model_version: s.model_version,
                            input_map: &s.input_map,
                            output_map: &s.output_map,
                        })
                        .collect(),
                }),
                model_transaction_policy: TransactionPolicyJson { decoupled: c.decoupled },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration laid out the way Triton's documentation lays them out.
    const DOCUMENTED: &str = r#"
name: "classifier"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "pixels"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "scores"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    count: 2
    kind: KIND_GPU
    gpus: [ 0, 1 ]
  },
  {
    count: 1
    kind: KIND_CPU
  }
]
"#;

    fn read(text: &str) -> ModelConfig {
        ModelConfig::from_pbtxt(text, "m/config.pbtxt", "m").unwrap_or_else(|e| panic!("{e}"))
    }

    /// The error for `text` in model `m`: (line, column, message).
    fn refused(text: &str) -> (u32, u32, String) {
        let e = ModelConfig::from_pbtxt(text, "m/config.pbtxt", "m").expect_err("should be refused");
        assert_eq!(e.file, "m/config.pbtxt");
        (e.line, e.column, e.message)
    }

    #[test]
    fn reads_a_documented_config() {
        let c = ModelConfig::from_pbtxt(DOCUMENTED, "classifier/config.pbtxt", "classifier").unwrap();
        assert_eq!(c.name, "classifier");
        assert_eq!(c.backend, Backend::OnnxRuntime);
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input.len(), 1);
        assert_eq!(c.input[0].name, "pixels");
        assert_eq!(c.input[0].data_type, DataType::Fp32);
        assert_eq!(c.input[0].dims, [3, 224, 224]);
        assert_eq!(c.output[0].dims, [1000]);
        let batching = c.dynamic_batching.as_ref().unwrap();
        assert_eq!(batching.preferred_batch_size, [4, 8]);
        assert_eq!(batching.max_queue_delay_microseconds, 100);
        assert_eq!(c.instance_group.len(), 2);
        assert_eq!(c.instance_group[0].kind, InstanceKind::Gpu);
        assert_eq!(c.instance_group[0].gpus, [0, 1]);
        assert_eq!(c.instance_group[0].name, "classifier_0");
        assert_eq!(c.instance_group[1].kind, InstanceKind::Cpu);
        assert_eq!(c.instance_count(), 2 * 2 + 1);
        assert_eq!(c.version_policy, VersionPolicy::Latest { num_versions: 1 });
        assert_eq!(c.from_graph, None);
        assert!(c.ignored_fields.is_empty(), "{:?}", c.ignored_fields);
        assert_eq!(c.output[0].label_filename.as_deref(), Some("labels.txt"));
        assert!(!c.decoupled);
        assert_eq!(c.input[0].format.as_deref(), Some("FORMAT_NCHW"), "kept, to be served");
    }

    #[test]
    fn reads_warm_up_samples() {
        let c = read(
            r#"model_warmup [ { name: "w" batch_size: 2 count: 3 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
                               inputs { key: "ids" value: { data_type: TYPE_INT64 dims: 8 input_data_file: "ids.bin" } } } ]"#,
        );
        assert!(c.ignored_fields.is_empty(), "{:?}", c.ignored_fields);
        let sample = &c.warmup[0];
        assert_eq!((sample.name.as_str(), sample.batch_size, sample.count), ("w", 2, 3));
        assert_eq!(sample.inputs["x"].data, WarmupData::Zero);
        assert_eq!(sample.inputs["ids"].data, WarmupData::File("ids.bin".into()));
        assert_eq!(sample.inputs["ids"].dims, [8]);
        let (_, _, message) =
            refused(r#"model_warmup { name: "w" inputs { key: "x" value: { data_type: TYPE_FP32 dims: 1 zero_data: true } } }"#);
        assert!(message.contains("batch_size must be at least 1"), "{message}");
        let (_, _, message) =
            refused(r#"model_warmup { name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: 1 } } }"#);
        assert!(message.contains("zero_data, random_data or input_data_file"), "{message}");
    }

    #[test]
    fn reads_a_sequence_batcher_with_its_controls_and_states() {
        let c = read(
            r#"sequence_batching {
                 max_sequence_idle_microseconds: 5000
                 oldest { max_candidate_sequences: 4 }
                 control_input [
                   { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                   { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
                   { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1.5 ] } ] },
                   { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
                 ]
                 state [ { input_name: "h" output_name: "h_next" data_type: TYPE_FP32 dims: [ 2, -1 ]
                           initial_state { data_type: TYPE_FP32 dims: [ 2, 3 ] data_file: "h0" name: "warm" } } ]
               }"#,
        );
        let batching = c.sequence_batching.as_ref().expect("a sequence batcher");
        assert_eq!((batching.strategy, batching.max_sequence_idle_microseconds), (SequenceStrategy::Oldest, 5000));
        assert_eq!(c.ignored_fields, ["sequence_batching.oldest.max_candidate_sequences"], "its settings tune Triton's own batcher");
        let kinds: Vec<(&str, ControlKind, DataType)> =
            batching.control_inputs.iter().map(|i| (i.name.as_str(), i.kind, i.data_type)).collect();
        assert_eq!(
            kinds,
            [
                ("START", ControlKind::Start, DataType::Int32),
                ("END", ControlKind::End, DataType::Bool),
                ("READY", ControlKind::Ready, DataType::Fp32),
                ("CORRID", ControlKind::CorrelationId, DataType::String)
            ]
        );
        assert_eq!(batching.control_inputs[2].values, Some(ControlValues::Fp32(0.0, 1.5)));
        assert_eq!(batching.control_inputs[3].values, None);
        let state = &batching.states[0];
        assert_eq!((state.input_name.as_str(), state.output_name.as_str(), state.dims.as_slice()), ("h", "h_next", &[2, -1][..]));
        assert_eq!(state.initial, Some(InitialState { dims: vec![2, 3], data: InitialData::File("h0".into()) }));
        assert!(batching.fills_input("READY") && batching.fills_input("h") && !batching.fills_input("x"));
        assert!(batching.keeps_output("h_next") && !batching.keeps_output("h"));
        let plain = read("sequence_batching { }");
        let defaults = plain.sequence_batching.unwrap();
        assert_eq!(
            (defaults.strategy, defaults.max_sequence_idle_microseconds),
            (SequenceStrategy::Direct, 1_000_000),
            "Triton's defaults"
        );
        assert_eq!(read("").sequence_batching, None);
        for (text, wanted) in [
            ("sequence_batching { direct { } oldest { } }", "give one strategy"),
            (
                r#"sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } } }"#,
                "give one of int32_false_true",
            ),
            (
                r#"sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } } }"#,
                "two, 1 given",
            ),
            (r#"sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID } } }"#, "needs data_type"),
            (
                r#"sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } } }"#,
                "not TYPE_FP32",
            ),
            (
                r#"sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } }
                                       state { input_name: "S" output_name: "o" data_type: TYPE_FP32 dims: 1 } }"#,
                "fills input \"S\" twice",
            ),
            (
                r#"sequence_batching { state { input_name: "h" output_name: "o" data_type: TYPE_FP32 dims: 1 initial_state { dims: 1 } } }"#,
                "zero_data or data_file",
            ),
        ] {
            let (_, _, message) = refused(text);
            assert!(message.contains(wanted), "{text}: {message}");
        }
    }

    #[test]
    fn reads_the_transaction_policy_and_serves_it() {
        let c = read(r#"model_transaction_policy { decoupled: true }"#);
        assert!(c.decoupled);
        assert_eq!(c.to_triton_json()["model_transaction_policy"]["decoupled"], true);
        assert!(!read("").decoupled);
        let (_, _, message) = refused("model_transaction_policy { decoupled: 3 }");
        assert!(message.contains("model_transaction_policy.decoupled"), "{message}");
        let (_, _, message) = refused(r#"output { name: "o" data_type: TYPE_FP32 dims: [2] label_filename: "../x" }"#);
        assert!(message.contains("plain file name"), "{message}");
    }

    #[test]
    fn reads_every_covered_field() {
        let c = read(
            r#"
            backend: "onnxruntime"
            max_batch_size: 4
            input { name: "ids" data_type: TYPE_INT64 dims: -1 dims: 16 optional: true reshape { shape: [16, -1] } }
            input < name: "scalar" data_type: TYPE_BOOL dims: [1] reshape: { } >
            output { name: "out" data_type: TYPE_STRING dims: [-1] }
            dynamic_batching {
              preferred_batch_size: 2
              max_queue_delay_microseconds: 18446744073709551615
              priority_levels: 3
              default_priority_level: 2
              default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 64 }
              preserve_ordering: true
            }
            version_policy: { specific { versions: [1, 3] } }
            parameters { key: "yardmaster.slo_ms" value: { string_value: "250" } }
            parameters [ { key: "a" value { string_value: "x\ty" } }, { key: "b" value: {} } ]
            optimization { execution_accelerators { } }
            default_model_filename: "net.onnx"
            "#,
        );
        assert_eq!(c.backend, Backend::OnnxRuntime);
        assert_eq!(c.input[0].dims, [-1, 16]);
        assert!(c.input[0].optional);
        assert_eq!(c.input[0].reshape, Some(vec![16, -1]));
        assert_eq!(c.input[0].data_type, DataType::Int64);
        assert_eq!(c.input[1].reshape, Some(vec![]), "an empty reshape is a scalar");
        assert!(!c.input[1].optional);
        assert_eq!(c.output[0].data_type, DataType::String);
        let d = c.dynamic_batching.as_ref().unwrap();
        assert_eq!(d.preferred_batch_size, [2]);
        assert_eq!(d.max_queue_delay_microseconds, u64::MAX);
        assert_eq!((d.priority_levels, d.default_priority_level), (3, 2));
        let q = d.default_queue_policy.as_ref().unwrap();
        assert_eq!(q.timeout_action, TimeoutAction::Delay);
        assert_eq!(q.default_timeout_microseconds, 5000);
        assert!(q.allow_timeout_override);
        assert_eq!(q.max_queue_size, 64);
        assert_eq!(c.version_policy, VersionPolicy::Specific { versions: vec![1, 3] });
        assert_eq!(c.parameters["yardmaster.slo_ms"], "250");
        assert_eq!(c.parameters["a"], "x\ty");
        assert_eq!(c.parameters["b"], "");
        assert_eq!(c.default_model_filename, "net.onnx");
        assert_eq!(c.ignored_fields, ["dynamic_batching.preserve_ordering", "optimization"]);
        assert_eq!(c.instance_count(), 1, "no instance_group: one instance");

        assert_eq!(read("version_policy { all { } }").version_policy, VersionPolicy::All);
        assert_eq!(read("version_policy { latest { num_versions: 3 } }").version_policy, VersionPolicy::Latest { num_versions: 3 });
        let d = read("max_batch_size: 1 dynamic_batching { priority_levels: 4 }").dynamic_batching.unwrap();
        assert_eq!(d.default_priority_level, 4, "the lowest level when none is named");
    }

    #[test]
    fn tensors_left_out_are_left_to_the_graph() {
        assert_eq!(read("max_batch_size: 2").from_graph, Some(FromGraph::Tensors));
        assert_eq!(read("input { name: \"x\" data_type: TYPE_FP32 dims: 1 }").from_graph, Some(FromGraph::Tensors));
        let c = ModelConfig::without_file("bare");
        assert_eq!(c.from_graph, Some(FromGraph::Everything));
        assert_eq!(c.backend, Backend::OnnxRuntime);
        assert_eq!(c.name, "bare");
    }

    #[test]
    fn reads_an_ensemble() {
        let c = read(
            r#"
            platform: "ensemble"
            max_batch_size: 4
            input { name: "IMAGE" data_type: TYPE_UINT8 dims: [-1] }
            output { name: "TEXT" data_type: TYPE_STRING dims: [1] }
            ensemble_scheduling {
              step [
                { model_name: "det" model_version: -1 input_map { key: "x" value: "IMAGE" } output_map { key: "boxes" value: "b" } },
                { model_name: "rec" model_version: 2 input_map { key: "crops" value: "b" } input_map { key: "y" value: "IMAGE" } output_map { key: "text" value: "TEXT" } }
              ]
            }
            "#,
        );
        assert_eq!(c.backend, Backend::Ensemble);
        assert_eq!(c.from_graph, None, "an ensemble has no graph of its own");
        assert_eq!(c.ensemble_steps.len(), 2);
        assert_eq!(c.ensemble_steps[0].model_name, "det");
        assert_eq!(c.ensemble_steps[0].model_version, -1);
        assert_eq!(c.ensemble_steps[0].output_map["boxes"], "b");
        assert_eq!(c.ensemble_steps[1].model_version, 2);
        assert_eq!(c.ensemble_steps[1].input_map.len(), 2);
        assert_eq!(c.ensemble_steps[1].input_map["crops"], "b");
        let json = c.to_triton_json();
        assert_eq!(json["platform"], "ensemble");
        assert_eq!(json["ensemble_scheduling"]["step"][1]["input_map"]["y"], "IMAGE");
        assert_eq!(json["ensemble_scheduling"]["step"][0]["model_version"], -1);
        let implied = read("ensemble_scheduling { step { model_name: \"a\" } }");
        assert_eq!(implied.backend, Backend::Ensemble, "ensemble_scheduling without a platform is an ensemble");
        assert_eq!(implied.ensemble_steps[0].model_version, -1, "the latest version when none is named");
    }

    #[test]
    fn json_has_tritons_shape() {
        let text = format!("{DOCUMENTED}\nparameters {{ key: \"k\" value {{ string_value: \"v\" }} }}\ninput {{ name: \"mask\" data_type: TYPE_BOOL dims: [-1] reshape {{ shape: [ ] }} optional: true }}");
        let c = ModelConfig::from_pbtxt(&text, "f", "classifier").unwrap();
        let json = c.to_triton_json();
        let expected = serde_json::json!({
            "name": "classifier",
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "version_policy": { "latest": { "num_versions": 1 } },
            "max_batch_size": 8,
            "input": [
                { "name": "pixels", "data_type": "TYPE_FP32", "dims": [3, 224, 224], "is_shape_tensor": false, "optional": false, "format": "FORMAT_NCHW" },
                { "name": "mask", "data_type": "TYPE_BOOL", "dims": [-1], "reshape": { "shape": [] }, "is_shape_tensor": false, "optional": true, "format": "FORMAT_NONE" }
            ],
            "output": [ { "name": "scores", "data_type": "TYPE_FP32", "dims": [1000], "is_shape_tensor": false, "label_filename": "labels.txt" } ],
            "dynamic_batching": { "preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100, "priority_levels": 0, "default_priority_level": 0 },
            "instance_group": [
                { "name": "classifier_0", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1] },
                { "name": "classifier_1", "kind": "KIND_CPU", "count": 1, "gpus": [] }
            ],
            "default_model_filename": "model.onnx",
            "parameters": { "k": { "string_value": "v" } },
            "model_transaction_policy": { "decoupled": false }
        });
        assert_eq!(json, expected);
        let policies = [
            ("version_policy { all {} }", serde_json::json!({ "all": {} })),
            ("version_policy { specific { versions: [2, 5] } }", serde_json::json!({ "specific": { "versions": [2, 5] } })),
        ];
        for (text, policy) in policies {
            assert_eq!(read(text).to_triton_json()["version_policy"], policy, "{text}");
        }
        let q = read("max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 3 } }").to_triton_json();
        assert_eq!(
            q["dynamic_batching"]["default_queue_policy"],
            serde_json::json!({ "timeout_action": "REJECT", "default_timeout_microseconds": 0, "allow_timeout_override": false, "max_queue_size": 3 })
        );
    }

    #[test]
    fn wrong_values_are_refused_where_they_are() {
        let cases: &[(&str, (u32, u32), &str)] = &[
            ("platform: \"tensorrt_plan\"", (1, 11), "platform \"tensorrt_plan\" is not served"),
            ("backend: \"python\"", (1, 10), "backend \"python\" is not served"),
            (
                "platform: \"onnxruntime_onnx\"\nbackend: \"onnxruntime\"\nplatform: \"x\"",
                (3, 1),
                "platform is given twice (first at line 1)",
            ),
            ("name: \"other\"", (1, 7), "name \"other\" differs from the model's folder \"m\""),
            ("max_batch_size: -1", (1, 17), "max_batch_size: -1 is out of range"),
            ("max_batch_size: \"8\"", (1, 17), "max_batch_size: expected an integer, found the string \"8\""),
            ("input { name: \"x\"\n  data_type: TYPE_FLOAT dims: 1 }", (2, 14), "input[0].data_type: expected one of TYPE_BOOL"),
            ("input { name: \"x\" dims: 1 }", (1, 9), "input[0] (\"x\"): data_type is missing"),
            ("output { data_type: TYPE_FP32 dims: 1 }", (1, 10), "output[0]: name is missing"),
            ("input { name: \"x\" data_type: TYPE_FP32 }", (1, 9), "dims is missing"),
            ("input { name: \"x\" data_type: TYPE_FP32 dims: [1, 0] }", (1, 50), "a dimension is -1 (any size) or positive, not 0"),
            ("input { name: \"x\" data_type: TYPE_FP32 dims: [-2] }", (1, 47), "input[0].dims: -2 is out of range"),
            ("input { name: \"x\" data_type: TYPE_FP32 dims: 1 optional: maybe }", (1, 58), "input[0].optional: expected true or false"),
            ("input: 3", (1, 8), "input: expected a message in { }, found the integer 3"),
            (
                "max_batch_size: 4\ndynamic_batching { preferred_batch_size: [2, 8] }",
                (2, 46),
                "preferred_batch_size 8 is over max_batch_size 4",
            ),
            ("dynamic_batching { preferred_batch_size: 1 }", (1, 42), "preferred_batch_size 1 is over max_batch_size 0"),
            ("max_batch_size: 4 dynamic_batching { preferred_batch_size: 0 }", (1, 60), "preferred_batch_size must be positive"),
            ("dynamic_batching { priority_levels: 2 default_priority_level: 3 }", (1, 63), "default_priority_level 3 is not in 1 to 2"),
            ("dynamic_batching { default_priority_level: 1 }", (1, 44), "needs priority_levels"),
            ("dynamic_batching { default_queue_policy { timeout_action: DROP } }", (1, 59), "expected one of REJECT, DELAY"),
            ("instance_group { count: 0 }", (1, 25), "instance_group[0].count must be at least 1"),
            ("instance_group { kind: KIND_MODEL }", (1, 24), "KIND_MODEL is not served"),
            ("instance_group { kind: KIND_CPU gpus: 0 }", (1, 33), "gpus are listed for a KIND_CPU group"),
            ("instance_group { kind: GPU }", (1, 24), "expected one of KIND_AUTO, KIND_GPU, KIND_CPU"),
            ("version_policy { latest { } }", (1, 18), "version_policy.latest needs num_versions"),
            ("version_policy { latest { num_versions: 0 } }", (1, 41), "num_versions must be at least 1"),
            ("version_policy { specific { } }", (1, 18), "version_policy.specific lists no versions"),
            ("version_policy { all { } latest { num_versions: 1 } }", (1, 26), "more than one of latest, all and specific"),
            ("version_policy { newest { } }", (1, 18), "expected latest, all or specific, found `newest`"),
            ("version_policy { }", (1, 1), "version_policy is empty"),
            ("parameters { value { string_value: \"v\" } }", (1, 1), "parameters: an entry without key"),
            ("parameters { key: 7 }", (1, 19), "parameters.key: expected a string"),
            ("platform: \"ensemble\"", (1, 11), "platform \"ensemble\" needs ensemble_scheduling"),
            (
                "backend: \"onnxruntime\"\nensemble_scheduling { step { model_name: \"a\" } }",
                (2, 1),
                "ensemble_scheduling needs platform \"ensemble\"",
            ),
            ("platform: \"ensemble\" ensemble_scheduling { }", (1, 22), "ensemble_scheduling has no step"),
            ("platform: \"ensemble\" ensemble_scheduling { step { model_version: 1 } }", (1, 44), "step 1 has no model_name"),
            ("platform: \"onnxruntime_onnx\" backend: \"onnxruntime\" platform: \"ensemble\"", (1, 53), "platform is given twice"),
            ("default_model_filename: \"../x.onnx\"", (1, 25), "must be a plain file name"),
            ("max_batch_size 4", (1, 16), "expected `:` after the field name"),
        ];
        for (text, (line, column), message) in cases {
            let (l, c, m) = refused(text);
            assert!(m.contains(message), "{text}: {m}");
            assert_eq!((l, c), (*line, *column), "{text}: {m}");
        }
    }
}
