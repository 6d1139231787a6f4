//! Serving a Triton model repository (`yardmaster serve --model-repository DIR`): every
//! ONNX model found becomes one engine stage and one stream, so the policy schedules
//! every model's batches, drops, priorities and replicas.
//!
//! [`load`] scans the directories (`yardmaster_formats::model_repository`), completes
//! each configuration from its ONNX graph as Triton's auto-complete does, and for each
//! model that can be served builds:
//!
//! - **a stage and a stream per served version** as
//!   `yardmaster_formats::model_repository::stages` makes them (the simulator makes the
//!   same ones; the latest version's are named after the model, the others
//!   `model:version`): the version's file is the one variant, `max_batch_size` bounds the batch, `instance_group`'s count starts
//!   that many replicas (the policy may scale to four times that), the stream has the
//!   model's SLO, and the latency profile is *measured* on this server's device — a
//!   `profile.toml` beside the model (written by `yardmaster profile`) if there is one,
//!   else a cached measurement (keyed by the model file's SHA-256, the device and the
//!   thread count), else a new one, cached for next time (and for the simulator). A
//!   model is served only once profiled;
//! - **a codec** ([`TensorCodec`]) from the configuration's tensors, and the effective
//!   configuration in Triton's JSON for `GET /v2/models/{m}/config`;
//! - **policy parameters** from `dynamic_batching` (`<model>.max_queue_delay_us`, …):
//!   the policy forms every batch; these tell it what the model's owner asked for.
//!
//! An ensemble (`platform: "ensemble"`) becomes a chain of stages, one per step, each
//! running its step model with that model's profile, in an order where every step
//! follows the steps whose outputs it reads; the request's tensors travel by their
//! ensemble names from step to step (`EnsembleStepProgram`), so DAG-aware policies
//! schedule every step.
//!
//! A model that cannot be served (malformed configuration, unreadable graph, element
//! types the data plane does not carry — FP64, UINT64, BF16, strings —, a failed
//! profile, an ensemble step without its model) is refused with the reason and the
//! others still serve.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use yardmaster_dataplane::profile::{profile, ProfileOptions};
use yardmaster_dataplane::sequence::{Control, ControlKind as SequenceControl, SequenceSpec, State as SequenceState};
use yardmaster_dataplane::{Device, ModelCatalog, ModelKey, ModelSpec, WarmUp, WarmUpData, WarmUpInput, WorkerContext};
use yardmaster_engine::pipeline::{StageDef, StreamDef};
use yardmaster_formats::model_repository::config::{Backend, ControlKind, ControlValues, DataType, InitialData, TensorConfig, WarmupData};
use yardmaster_formats::model_repository::repository::PROFILE_SHAPES_PARAMETER;
use yardmaster_formats::model_repository::stages::{
    dynamic_batching_params, ensemble_order, ensemble_stages, link_places, model_stage, profile_stage_from_text, repository_pipeline,
    sha256_of, ProfileSource, ProfileStore, StepModel, PROFILE_FILE,
};
use yardmaster_formats::model_repository::{read_graph_signature, scan, BuiltinProgram, ModelConfig, ModelEntry, ModelVersion};
use yardmaster_policy::contract::{DeviceKind, Param};

use super::backend::{ocr_names, Codec, ModelDescription, ServedModel};
use super::classification::{read_labels, Labels};
use super::kserve::DataType as WireType;
use super::sequences::SequenceTable;
use super::stack::ServedPipeline;
use super::stages::{builtin_program, EnsembleStepProgram, StageProgram, TensorProgram};
use super::tensor_codec::{element_type, TensorCodec, TensorDecl};

/// The size a dimension of any size is profiled at, unless the configuration says.
pub const PROFILE_ANY_SIZE: usize = 64;

/// The platform string repository models report.
pub const PLATFORM: &str = "onnxruntime_onnx";

/// How models are profiled and where profiles are cached.
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    /// Where measured profiles are kept (`<assets>/profiles` by default).
    pub profile_cache: PathBuf,
    /// Intra-op threads of each worker (and of the profile).
    pub threads: usize,
    /// Runs per batch size when measuring.
    pub iterations: usize,
}

impl Default for RepositoryOptions {
    fn default() -> Self {
        RepositoryOptions { profile_cache: default_profile_cache(), threads: 1, iterations: 10 }
    }
}

/// Where measured profiles are cached unless configured: `<assets>/profiles`.
pub fn default_profile_cache() -> PathBuf {
    yardmaster_dataplane::assets::assets_dir().join("profiles")
}

/// What [`load`] made of a repository.
pub struct LoadedRepository {
    /// The models that serve, as one pipeline.
    pub served: ServedPipeline,
    /// The models that do not, each with the reason.
    pub refused: Vec<RefusedModel>,
    /// Things the operator should know (configuration fields ignored).
    pub warnings: Vec<String>,
    /// Policy parameters from the models' `dynamic_batching`.
    pub params: Vec<Param>,
    /// Each model version and ensemble served, as prepared (for model control).
    pub(crate) prepared: Vec<Prepared>,
}

/// A model of the repository that is not served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedModel {
    /// The model (its folder's name).
    pub name: String,
    /// Why it is not served.
    pub reason: String,
}

impl std::fmt::Display for RefusedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "model {:?}: {}", self.name, self.reason)
    }
}

/// One model version (or ensemble) ready to serve: its stages, a chain, and its
/// stream. Kept while the model is loaded, so a change elsewhere in the repository
/// does not prepare it again.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) stages: Vec<PreparedStage>,
    /// Its stream; `None` for a model running a built-in program, which serves only
    /// as a step of an ensemble.
    pub(crate) stream: Option<StreamDef>,
    pub(crate) model: ServedModel,
    /// A plain model's tensors, which an ensemble step maps to.
    pub(crate) codec: Option<TensorCodec>,
    pub(crate) params: Vec<Param>,
    /// The models an ensemble's steps run (empty for a plain model).
    pub(crate) steps: Vec<String>,
    /// The built-in program a plain model runs, if any.
    pub(crate) builtin: Option<BuiltinProgram>,
}

/// One stage of a prepared model: its engine stage, its model file and its program.
#[derive(Clone)]
pub(crate) struct PreparedStage {
    stage: StageDef,
    spec: ModelSpec,
    program: Arc<dyn StageProgram>,
}

/// Load every model of the repository directories `dirs` for `context`'s device;
/// `progress` gets one line per model (profiling takes a while).
pub fn load(
    dirs: &[PathBuf],
    context: &WorkerContext,
    options: &RepositoryOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<LoadedRepository, String> {
    load_selected(dirs, context, options, &|_| true, progress)
}

/// Why a model of the repository is not loaded under model control.
pub const NOT_LOADED: &str = "not loaded (load it with POST /v2/repository/models/{m}/load)";

/// [`load`], for the models `select` accepts only; the others are listed as not
/// loaded ([`NOT_LOADED`]).
pub fn load_selected(
    dirs: &[PathBuf],
    context: &WorkerContext,
    options: &RepositoryOptions,
    select: &dyn Fn(&str) -> bool,
    progress: &mut dyn FnMut(&str),
) -> Result<LoadedRepository, String> {
    let mut repository = scan(dirs).map_err(|e| e.to_string())?;
    let skipped: Vec<String> = repository.models.keys().filter(|name| !select(name)).cloned().collect();
    for name in &skipped {
        repository.models.remove(name);
    }
    repository.complete_from_graphs();
    let mut refused: Vec<RefusedModel> =
        repository.errors().map(|e| RefusedModel { name: e.model.clone(), reason: e.message.clone() }).collect();
    let mut warnings = Vec::new();
    let mut prepared: Vec<Prepared> = Vec::new();
    // Plain models first: ensembles are made of their stages.
    let (ensembles, models): (Vec<&ModelEntry>, Vec<&ModelEntry>) = repository.ready().partition(|e| e.config.backend == Backend::Ensemble);
    for entry in models {
        if let Some(warning) = entry.ignored_fields_warning() {
            warnings.push(warning);
        }
        match prepare(entry, context, options, progress) {
            Ok(versions) => prepared.extend(versions),
            Err(reason) => refused.push(RefusedModel { name: entry.name.clone(), reason }),
        }
    }
    for entry in ensembles {
        match prepare_ensemble(entry, &prepared) {
            Ok(ensemble) => prepared.push(ensemble),
            Err(reason) => refused.push(RefusedModel { name: entry.name.clone(), reason }),
        }
    }
    refused.extend(skipped.into_iter().map(|name| RefusedModel { name, reason: NOT_LOADED.into() }));
    refused.sort_by(|a, b| a.name.cmp(&b.name));
    if prepared.is_empty() {
        let mut message =
            format!("no model of {} can be served", dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "));
        for reason in &refused {
            let _ = write!(message, "\n  {reason}");
        }
        return Err(message);
    }
    let params = prepared.iter().flat_map(|p| p.params.clone()).collect();
    let served = assemble(&prepared, None)?;
    Ok(LoadedRepository { served, refused, warnings, params, prepared })
}

/// The pipeline serving `prepared` (plain models before the ensembles made of them).
///
/// Stages and streams have places named after them. With `previous` (the pipeline
/// served until now), every place it has keeps its index: a model served again takes
/// its old places back, new ones are added after, and the places of models no longer
/// served stay as offline stages (no replica allowed, no edges) whose streams get no
/// request — so stage and stream ids never move under a running engine (see
/// `yardmaster_engine::Engine::reconfigure`).
pub(crate) fn assemble(prepared: &[Prepared], previous: Option<&ServedPipeline>) -> Result<ServedPipeline, String> {
    let mut stages: Vec<StageDef> = Vec::new();
    let mut streams: Vec<StreamDef> = Vec::new();
    let mut catalog = ModelCatalog::default();
    let mut programs: Vec<Arc<dyn StageProgram>> = Vec::new();
    if let Some(previous) = previous {
        for stage in &previous.pipeline.stages {
            stages.push(StageDef {
                replicas: 0,
                min_replicas: 0,
                max_replicas: 0,
                successors: Vec::new(),
                predecessors: Vec::new(),
                ..stage.clone()
            });
        }
        streams = previous.pipeline.streams.clone();
        catalog = previous.catalog.clone();
        programs = previous.programs.clone();
    }
    let mut models = Vec::new();
    for p in prepared {
        // A model running a built-in program has places only as its ensemble's step.
        let Some(own_stream) = &p.stream else { continue };
        let mut places = Vec::with_capacity(p.stages.len());
        for prepared_stage in &p.stages {
            let place = match stages.iter().position(|s| s.name == prepared_stage.stage.name) {
                Some(place) => {
                    stages[place] = prepared_stage.stage.clone();
                    catalog.stages[place] = vec![prepared_stage.spec.clone()];
                    programs[place] = prepared_stage.program.clone();
                    place
                }
                None => {
                    stages.push(prepared_stage.stage.clone());
                    catalog.stages.push(vec![prepared_stage.spec.clone()]);
                    programs.push(prepared_stage.program.clone());
                    stages.len() - 1
                }
            };
            places.push(place);
        }
        link_places(&mut stages, &places);
        let entry = places[0] as u32;
        let stream = match streams.iter().position(|s| s.name == own_stream.name) {
            Some(place) if streams[place].entry != entry => {
                return Err(format!(
                    "model {:?} now starts at stage {:?}, not {:?}: an entry stage cannot change while serving (restart the server)",
                    p.model.name, stages[entry as usize].name, stages[streams[place].entry as usize].name
                ))
            }
            Some(place) => {
                streams[place] = StreamDef { entry, ..own_stream.clone() };
                place
            }
            None => {
                streams.push(StreamDef { entry, ..own_stream.clone() });
                streams.len() - 1
            }
        };
        let stages = places.iter().map(|&p| p as u32).collect();
        models.push(ServedModel { stream: stream as u32, entry, stages, ..p.model.clone() });
    }
    // A model running a built-in program is described as itself (Triton's tools read
    // an ensemble's composing models), on its ensemble's stream, but not served alone.
    for p in prepared.iter().filter(|p| p.stream.is_none()) {
        let Some(place) = stages.iter().position(|s| s.name == p.model.name) else { continue };
        let Some(ensemble) = models.iter().find(|m| m.stages.contains(&(place as u32))) else { continue };
        let Codec::Tensors(codec) = &p.model.codec else { continue };
        let codec = Codec::BuiltinStep { codec: codec.clone(), ensemble: ensemble.name.clone() };
        let (stream, entry) = (ensemble.stream, place as u32);
        models.push(ServedModel { stream, entry, stages: vec![entry], codec, ..p.model.clone() });
    }
    let pipeline = repository_pipeline(stages, streams)?;
    let served = ServedPipeline { pipeline, catalog, programs, models };
    served.check()?;
    Ok(served)
}

/// Whether `serve` carries this plain model's tensors: the check [`prepare`] makes of
/// every served version before it loads or profiles anything, with its words (element
/// types the data plane carries, no optional input, every graph tensor in the
/// configuration).
/// `repository check` calls it too, so the two cannot differ on a model's tensors.
/// Ensembles are checked when they are assembled from their steps.
pub fn servable(entry: &ModelEntry) -> Result<(), String> {
    refuse_unserved(entry)?;
    if entry.config.backend == Backend::Ensemble {
        return Ok(());
    }
    output_labels(entry)?;
    for (_, _, codec) in version_codecs(entry)? {
        warm_up_samples(entry, &codec, Device::Cpu)?;
    }
    Ok(())
}

/// Refuse what a configuration asks for that would be served wrong if it were not
/// acted on. Every field read is acted on now (a sequence batcher's settings are checked
/// by [`sequence_spec`]).
fn refuse_unserved(entry: &ModelEntry) -> Result<(), String> {
    sequence_spec(entry).map(|_| ())
}

/// A stateful model's sequence settings for its workers, from its `sequence_batching`:
/// control inputs with their values in their element types, states with their shapes
/// and initial values (zeros, or a file in the model's `initial_state/` folder, which
/// must hold exactly the state's bytes); `None` for a model without a sequence batcher.
pub(crate) fn sequence_spec(entry: &ModelEntry) -> Result<Option<SequenceSpec>, String> {
    let Some(batching) = &entry.config.sequence_batching else { return Ok(None) };
    if entry.config.backend == Backend::Ensemble {
        return Err("sequence_batching on an ensemble is not served: give it to the stateful model the ensemble steps into".into());
    }
    let controls = batching
        .control_inputs
        .iter()
        .map(|control| {
            let element = element_type(wire_type(control.data_type)).expect("every type is carried");
            let (false_value, true_value) = match control.values {
                None => (Vec::new(), Vec::new()),
                Some(ControlValues::Int32(f, t)) => (f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()),
                Some(ControlValues::Fp32(f, t)) => (f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()),
                Some(ControlValues::Bool(f, t)) => (vec![u8::from(f)], vec![u8::from(t)]),
            };
            let kind = match control.kind {
                ControlKind::Start => SequenceControl::Start,
                ControlKind::End => SequenceControl::End,
                ControlKind::Ready => SequenceControl::Ready,
                ControlKind::CorrelationId => SequenceControl::CorrelationId,
            };
            Control { input: control.name.clone(), kind, element, false_value, true_value }
        })
        .collect();
    let states = batching
        .states
        .iter()
        .map(|state| {
            let named = |e: String| format!("sequence_batching state {:?}: {e}", state.input_name);
            let dims = match &state.initial {
                Some(initial) if !initial.dims.is_empty() => &initial.dims,
                _ => &state.dims,
            };
            if dims.iter().any(|&d| d < 0) {
                return Err(named(format!("dims {dims:?}: a state's size must be fixed (give its initial_state dims)")));
            }
            let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            let element = element_type(wire_type(state.data_type)).expect("every type is carried");
            let initial = match state.initial.as_ref().map(|i| &i.data) {
                None | Some(InitialData::Zero) => Vec::new(),
                Some(InitialData::File(file)) => {
                    let path = entry.dir.join("initial_state").join(file);
                    let bytes = std::fs::read(&path).map_err(|e| named(format!("{}: {e}", path.display())))?;
                    let count: usize = shape.iter().product();
                    yardmaster_dataplane::Elements::from_bytes(element, &bytes, count)
                        .map_err(|e| named(format!("{} does not hold a state of shape {shape:?}: {e}", path.display())))?;
                    bytes
                }
            };
            Ok(SequenceState { input: state.input_name.clone(), output: state.output_name.clone(), element, shape, initial })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let idle = std::time::Duration::from_micros(batching.max_sequence_idle_microseconds);
    Ok(Some(SequenceSpec { controls, states, idle }))
}

/// The class labels of each output that names a `label_filename` (a file in the
/// model's folder, one label per line), for the classification extension; a file that
/// cannot be read refuses the model, naming it.
pub(crate) fn output_labels(entry: &ModelEntry) -> Result<BTreeMap<String, Labels>, String> {
    let mut labels = BTreeMap::new();
    for output in &entry.config.output {
        if let Some(file) = &output.label_filename {
            let read = read_labels(&entry.dir.join(file)).map_err(|e| format!("output {:?}: {e}", output.name))?;
            labels.insert(output.name.clone(), read);
        }
    }
    Ok(labels)
}

/// Each version `serve` loads — all of them, or the latest only for a model running a
/// built-in program (one ensemble's step) — with its model file and tensor codec.
fn version_codecs(entry: &ModelEntry) -> Result<Vec<(&ModelVersion, &Path, TensorCodec)>, String> {
    let versions =
        if entry.settings.program.is_some() { &entry.versions[entry.versions.len().saturating_sub(1)..] } else { &entry.versions[..] };
    versions
        .iter()
        .map(|version| {
            let in_version = |e: String| in_version_of(entry, version, e);
            let file = version.model_file.as_deref().ok_or_else(|| in_version("the version has no model file".into()))?;
            let codec = codec(&entry.config, file).map_err(in_version)?;
            Ok((version, file, codec))
        })
        .collect()
}

/// `error` about `version`, naming the version when the model has several.
fn in_version_of(entry: &ModelEntry, version: &ModelVersion, error: String) -> String {
    if entry.versions.len() > 1 {
        format!("version {}: {error}", version.version)
    } else {
        error
    }
}

/// Build the stage, stream, codec and parameters of each served version of a model,
/// profiling them if needed; the latest version last.
pub(crate) fn prepare(
    entry: &ModelEntry,
    context: &WorkerContext,
    options: &RepositoryOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Prepared>, String> {
    let config = &entry.config;
    let builtin = entry.settings.program;
    refuse_unserved(entry)?;
    let versions = version_codecs(entry)?;
    let labels = output_labels(entry)?;
    let sequence = sequence_spec(entry)?;
    let mut prepared = Vec::with_capacity(versions.len());
    for (version, file, codec) in versions {
        let in_version = |e: String| in_version_of(entry, version, e);
        let mut spec = ModelSpec::new(ModelKey::new(&entry.name, version.version.to_string()), file);
        spec.warm_up = warm_up_samples(entry, &codec, context.runtime.device()).map_err(in_version)?;
        spec.sequence = sequence.clone();
        let profile = profiled_stage(entry, version, &spec, &codec, context, options, progress).map_err(in_version)?;
        let device = if context.runtime.device() == Device::Cpu { DeviceKind::Cpu } else { DeviceKind::Gpu };
        let (stage, stream) = model_stage(entry, version.version, profile, 0, device, options.threads);
        let description = ModelDescription {
            version: version.version.to_string(),
            platform: PLATFORM.into(),
            config: Some(super::served_config::served(config)),
            labels: labels.clone(),
        };
        let model = ServedModel {
            name: entry.name.clone(),
            stream: 0,
            entry: 0,
            stages: Vec::new(),
            codec: Codec::Tensors(codec.clone()),
            description,
            sequences: sequence.as_ref().map(|s| Arc::new(SequenceTable::new(&entry.name, s.idle))),
        };
        let program: Arc<dyn StageProgram> = match builtin {
            Some(builtin) => builtin_program(builtin, &spec, context).map_err(in_version)?,
            None => Arc::new(TensorProgram { name: stage.name.clone(), batching: codec.batching }),
        };
        prepared.push(Prepared {
            stages: vec![PreparedStage { stage, spec, program }],
            stream: builtin.is_none().then_some(stream),
            model,
            codec: Some(codec),
            params: Vec::new(),
            steps: Vec::new(),
            builtin,
        });
    }
    if let Some(latest) = prepared.last_mut() {
        latest.params = dynamic_batching_params(&entry.name, config);
    }
    Ok(prepared)
}

/// An ensemble as a chain of stages: each step a stage of its own running the step's
/// model (with that model's profile), in an order where every step comes after the
/// steps whose outputs it reads; the request's tensors travel by name between them.
pub(crate) fn prepare_ensemble(entry: &ModelEntry, models: &[Prepared]) -> Result<Prepared, String> {
    let config = &entry.config;
    // The latest version of a model is the stage named after it.
    let served = |name: &str| models.iter().find(|m| m.codec.is_some() && m.stages[0].stage.name == name);
    let step_model = |name: &str| served(name).map(|m| StepModel { stage: m.stages[0].stage.clone(), builtin: m.builtin.is_some() });
    let (chain, stream) = ensemble_stages(entry, &step_model)?;
    let builtin_steps = config.ensemble_steps.iter().filter(|s| served(&s.model_name).is_some_and(|m| m.builtin.is_some())).count();
    let codec = match builtin_steps {
        0 => {
            let names = |tensors: &[TensorConfig]| tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
            Codec::Ensemble(tensor_codec(config, &names(&config.input), &names(&config.output))?)
        }
        n if n == config.ensemble_steps.len() => {
            check_builtin_ensemble(config, &|name| served(name).and_then(|m| m.builtin))?;
            Codec::OcrImage
        }
        _ => return Err("its steps mix built-in programs and plain models (an ensemble's steps are all one or all the other)".into()),
    };
    let mut stages = Vec::with_capacity(chain.len());
    for (stage, k) in chain.into_iter().zip(ensemble_order(config)?) {
        let step = &config.ensemble_steps[k];
        let model =
            served(&step.model_name).ok_or_else(|| format!("step {} runs model {:?}, which is not served", k + 1, step.model_name))?;
        let served_version: i64 = model.model.description.version.parse().unwrap_or(-1);
        if step.model_version >= 0 && step.model_version != served_version {
            return Err(format!(
                "step {} asks for version {} of {:?}; this server serves its latest, {served_version}",
                k + 1,
                step.model_version,
                step.model_name
            ));
        }
        let program: Arc<dyn StageProgram> = if model.builtin.is_some() {
            model.stages[0].program.clone()
        } else {
            let step_codec = model.codec.as_ref().expect("a plain model");
            let inputs = step_codec
                .inputs
                .iter()
                .map(|t| {
                    step.input_map
                        .get(&t.name)
                        .cloned()
                        .ok_or_else(|| format!("step {} leaves input {:?} of {:?} unmapped", k + 1, t.name, step.model_name))
                })
                .collect::<Result<Vec<String>, String>>()?;
            let outputs = step_codec.outputs.iter().map(|t| step.output_map.get(&t.name).cloned()).collect();
            // The ensemble's tensors lead with the request's rows when it batches.
            let batching = step_codec.batching && matches!(&codec, Codec::Ensemble(c) if c.batching);
            Arc::new(EnsembleStepProgram { name: stage.name.clone(), inputs, outputs, batching })
        };
        stages.push(PreparedStage { stage, spec: model.stages[0].spec.clone(), program });
    }
    let version = entry.versions.last().map_or_else(|| "1".to_string(), |v| v.version.to_string());
    let description = ModelDescription {
        version,
        platform: "ensemble".into(),
        config: Some(super::served_config::served(config)),
        labels: BTreeMap::new(),
    };
    let model = ServedModel { name: entry.name.clone(), stream: 0, entry: 0, stages: Vec::new(), codec, description, sequences: None };
    let steps = config.ensemble_steps.iter().map(|s| s.model_name.clone()).collect();
    Ok(Prepared { stages, stream: Some(stream), model, codec: None, params: Vec::new(), steps, builtin: None })
}

/// Check an ensemble whose steps all run built-in programs (`program_of` gives each
/// step model's): each step maps exactly its program's own tensors, and the ensemble
/// takes what the OCR codec reads (`image`) and gives what it writes (`texts`, `scores`,
/// `boxes`), as the ensemble's own tensors of those names.
fn check_builtin_ensemble(config: &ModelConfig, program_of: &dyn Fn(&str) -> Option<BuiltinProgram>) -> Result<(), String> {
    let sorted = |names: Vec<&str>| {
        let mut names: Vec<String> = names.into_iter().map(str::to_string).collect();
        names.sort();
        names
    };
    for (k, step) in config.ensemble_steps.iter().enumerate() {
        let program = program_of(&step.model_name).expect("every step runs a built-in program");
        for (kind, map, expected) in [("input_map", &step.input_map, program.inputs()), ("output_map", &step.output_map, program.outputs())]
        {
            let keys = sorted(map.keys().map(String::as_str).collect());
            if keys != sorted(expected.to_vec()) {
                return Err(format!(
                    "step {} runs the built-in program {}: its {kind} maps {keys:?}; the program's tensors are {expected:?}",
                    k + 1,
                    program.name()
                ));
            }
        }
    }
    let inputs = sorted(config.input.iter().map(|t| t.name.as_str()).collect());
    let outputs = sorted(config.output.iter().map(|t| t.name.as_str()).collect());
    let codec_inputs = sorted(vec![ocr_names::IMAGE]);
    let codec_outputs = sorted(vec![ocr_names::TEXTS, ocr_names::SCORES, ocr_names::BOXES]);
    if inputs != codec_inputs || outputs != codec_outputs {
        return Err(format!(
            "an ensemble of built-in OCR steps takes {codec_inputs:?} and gives {codec_outputs:?}; this one declares inputs {inputs:?} and outputs {outputs:?}"
        ));
    }
    // The codec's tensors keep their names from the ensemble to the program.
    let codec_tensors = [ocr_names::IMAGE, ocr_names::TEXTS, ocr_names::SCORES, ocr_names::BOXES];
    for step in &config.ensemble_steps {
        if let Some((key, value)) =
            step.input_map.iter().chain(&step.output_map).find(|(key, value)| codec_tensors.contains(&key.as_str()) && key != value)
        {
            return Err(format!("step {:?} maps {key:?} to {value:?}: the OCR tensors keep their names", step.model_name));
        }
    }
    Ok(())
}

/// The codec of a completed configuration, with tensors in the graph's order: of a
/// stateful model, the inputs and outputs its clients send and get (not its control and
/// state inputs, nor its state outputs, which the graph must have).
fn codec(config: &ModelConfig, file: &Path) -> Result<TensorCodec, String> {
    let graph = read_graph_signature(file).map_err(|e| e.to_string())?;
    let names =
        |tensors: &[yardmaster_formats::model_repository::TensorSignature]| tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let (mut inputs, mut outputs) = (names(&graph.inputs), names(&graph.outputs));
    if let Some(batching) = &config.sequence_batching {
        let filled = batching.control_inputs.iter().map(|c| &c.name).chain(batching.states.iter().map(|s| &s.input_name));
        if let Some(missing) = filled.clone().find(|name| !inputs.contains(name)) {
            return Err(format!("sequence_batching fills input {missing:?}, which the graph does not have"));
        }
        if let Some(missing) = batching.states.iter().find(|s| !outputs.contains(&s.output_name)) {
            return Err(format!(
                "sequence_batching state {:?} is read from output {:?}, which the graph does not have",
                missing.input_name, missing.output_name
            ));
        }
        inputs.retain(|name| !batching.fills_input(name));
        outputs.retain(|name| !batching.keeps_output(name));
    }
    tensor_codec(config, &inputs, &outputs)
}

/// The codec of the tensors `inputs` and `outputs` (in that order), as `config` declares them.
fn tensor_codec(config: &ModelConfig, inputs: &[String], outputs: &[String]) -> Result<TensorCodec, String> {
    let batching = config.max_batch_size > 0;
    let declare = |kind: &str, name: &str, declared: &[TensorConfig]| -> Result<TensorDecl, String> {
        let tensor =
            declared.iter().find(|t| t.name == name).ok_or_else(|| format!("the graph's {kind} {name:?} is not in the configuration"))?;
        let datatype = wire_type(tensor.data_type);
        if element_type(datatype).is_none() {
            return Err(format!("{kind} {name:?} is {}, which the data plane does not carry", tensor.data_type.triton_name()));
        }
        if tensor.optional {
            return Err(format!("{kind} {name:?}: optional inputs are not supported (the model is fed every input)"));
        }
        let shape: Vec<i64> = if batching { std::iter::once(-1).chain(tensor.dims.iter().copied()).collect() } else { tensor.dims.clone() };
        Ok(TensorDecl { name: name.to_string(), shape, datatype, reshape: tensor.reshape.clone() })
    };
    let inputs = inputs.iter().map(|name| declare("input", name, &config.input)).collect::<Result<Vec<_>, _>>()?;
    let outputs = outputs.iter().map(|name| declare("output", name, &config.output)).collect::<Result<Vec<_>, _>>()?;
    Ok(TensorCodec { inputs, outputs, batching, max_batch_size: config.max_batch_size })
}

/// The wire type of a configuration's element type.
fn wire_type(data_type: DataType) -> WireType {
    match data_type {
        DataType::Bool => WireType::Bool,
        DataType::Uint8 => WireType::U8,
        DataType::Uint16 => WireType::U16,
        DataType::Uint32 => WireType::U32,
        DataType::Uint64 => WireType::U64,
        DataType::Int8 => WireType::I8,
        DataType::Int16 => WireType::I16,
        DataType::Int32 => WireType::I32,
        DataType::Int64 => WireType::I64,
        DataType::Fp16 => WireType::F16,
        DataType::Fp32 => WireType::F32,
        DataType::Fp64 => WireType::F64,
        DataType::String => WireType::Bytes,
        DataType::Bf16 => WireType::Bf16,
    }
}

/// The model's profile (one stage, one measured variant): beside it or cached, else
/// measured now on `context`'s device and cached.
fn profiled_stage(
    entry: &ModelEntry,
    version: &ModelVersion,
    spec: &ModelSpec,
    codec: &TensorCodec,
    context: &WorkerContext,
    options: &RepositoryOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<StageDef, String> {
    let store = ProfileStore { dir: options.profile_cache.clone(), device: context.runtime.device().to_string(), threads: options.threads };
    if let Some((stage, source)) = store.find(entry, version)? {
        let from = match &source {
            ProfileSource::Beside(path) => format!("profile from {}", path.display()),
            ProfileSource::Cached(path) => format!("cached profile {}", path.display()),
        };
        progress(&format!("model {}: {from}", entry.name));
        return Ok(stage);
    }
    progress(&format!("model {}: profiling on {} (first load; cached afterwards) …", entry.name, context.runtime.device()));
    let largest = entry.config.max_batch_size.clamp(1, 8) as usize;
    // A request gives the model `items` elements: a batch of b requests is b·items elements.
    let items = entry.settings.items_per_request.max(1) as usize;
    let batches: Vec<usize> =
        std::iter::successors(Some(1usize), |b| Some(b * 2)).take_while(|b| *b <= largest).map(|b| b * items).collect();
    let mut shapes = profile_shapes(entry, codec)?;
    if let Some(sequence) = &spec.sequence {
        // A stateful model is profiled with its control and state inputs too.
        let graph = read_graph_signature(&spec.path).map_err(|e| e.to_string())?;
        let mut given = shapes.into_iter();
        shapes = graph.inputs.iter().map(|t| sequence.filled_shape(&t.name).or_else(|| given.next()).unwrap_or_default()).collect();
    }
    let profile_options = ProfileOptions {
        batches,
        shapes: Some(shapes),
        warmup: 2,
        iterations: options.iterations.max(1),
        threads: options.threads,
        start_repeats: 1,
    };
    let mut report = profile(&context.runtime, spec, &profile_options).map_err(|e| {
        format!(
            "could not be profiled: {e} (measure it yourself with `yardmaster profile` and put the output in {})",
            entry.dir.join(PROFILE_FILE).display()
        )
    })?;
    for point in &mut report.points {
        point.batch /= items;
    }
    let text = report.to_pipeline_toml();
    let cached = store.cached_profile_path(&sha256_of(&spec.path)?);
    if std::fs::create_dir_all(&options.profile_cache).and_then(|()| std::fs::write(&cached, &text)).is_err() {
        tracing::warn!(model = %entry.name, "could not cache its profile in {}", options.profile_cache.display());
    }
    progress(&format!("model {}: profiled, batch 1 takes {:.2} ms", entry.name, report.points[0].mean_ms));
    profile_stage_from_text(&text, "a fresh profile")
}

/// Most batch sizes a GPU worker warms up by default (one session plan each).
const MAX_DEFAULT_WARM_UP_BATCHES: u32 = 64;

/// The warm-up a worker of this model runs at load, before it serves: the
/// configuration's `model_warmup` samples (each input in the model's order; a file read
/// from the model's `warmup/` folder), or — on a GPU, when the configuration gives none —
/// one sample of zeros for every batch size the policy may form (1 to `max_batch_size`,
/// at most 64), so that no first batch of a size pays for a new session plan. On the
/// CPU without samples: none (the worker's own run of a batch of one).
fn warm_up_samples(entry: &ModelEntry, codec: &TensorCodec, device: Device) -> Result<Vec<WarmUp>, String> {
    let config = &entry.config;
    if config.warmup.is_empty() {
        if device == Device::Cpu {
            return Ok(Vec::new());
        }
        let shapes = profile_shapes(entry, codec)?;
        let inputs: Vec<WarmUpInput> = shapes.into_iter().map(|shape| WarmUpInput { shape, data: WarmUpData::Zero }).collect();
        let largest = config.max_batch_size.clamp(1, MAX_DEFAULT_WARM_UP_BATCHES);
        return Ok((1..=largest).map(|batch| WarmUp { name: format!("batch {batch}"), batch, count: 1, inputs: inputs.clone() }).collect());
    }
    config
        .warmup
        .iter()
        .map(|sample| {
            let name = &sample.name;
            if !codec.batching && sample.batch_size != 1 {
                return Err(format!(
                    "model_warmup {name:?}: batch_size {} for a model without a batch dimension (max_batch_size 0) must be 1",
                    sample.batch_size
                ));
            }
            if let Some(extra) = sample.inputs.keys().find(|k| !codec.inputs.iter().any(|d| &d.name == *k)) {
                return Err(format!("model_warmup {name:?}: the model has no input {extra:?}"));
            }
            let inputs = codec
                .inputs
                .iter()
                .map(|decl| {
                    let input =
                        sample.inputs.get(&decl.name).ok_or_else(|| format!("model_warmup {name:?}: input {:?} is missing", decl.name))?;
                    // The model's own shape where the configuration reshapes the input.
                    let shape: Vec<usize> = match &decl.reshape {
                        Some(reshape) if reshape.iter().all(|&d| d >= 0) => reshape.iter().map(|&d| d as usize).collect(),
                        _ => input.dims.iter().map(|&d| d.max(0) as usize).collect(),
                    };
                    let data = match &input.data {
                        WarmupData::Zero => WarmUpData::Zero,
                        WarmupData::Random => WarmUpData::Random,
                        WarmupData::File(file) => {
                            let path = entry.dir.join("warmup").join(file);
                            let bytes = std::fs::read(&path).map_err(|e| format!("model_warmup {name:?}: {}: {e}", path.display()))?;
                            if let Some(width) = wire_type(input.data_type).width() {
                                let needed = width * shape.iter().product::<usize>();
                                if bytes.len() != needed {
                                    return Err(format!(
                                        "model_warmup {name:?}: {} has {} bytes, input {:?} of shape {shape:?} needs {needed}",
                                        path.display(),
                                        bytes.len(),
                                        decl.name
                                    ));
                                }
                            }
                            WarmUpData::Given(bytes)
                        }
                    };
                    Ok(WarmUpInput { shape, data })
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(WarmUp { name: name.clone(), batch: sample.batch_size, count: sample.count, inputs })
        })
        .collect()
}

/// Per-request input shapes to profile with: the model's `yardmaster.profile_shapes`
/// parameter, else the declared shapes without the leading dimension, any size taken
/// as [`PROFILE_ANY_SIZE`].
fn profile_shapes(entry: &ModelEntry, codec: &TensorCodec) -> Result<Vec<Vec<usize>>, String> {
    if let Some(shapes) = &entry.settings.profile_shapes {
        if shapes.len() != codec.inputs.len() {
            return Err(format!("{PROFILE_SHAPES_PARAMETER} gives {} shapes for {} inputs", shapes.len(), codec.inputs.len()));
        }
        return Ok(shapes.clone());
    }
    // A batching model's requests are items (the batch dimension off); a model without
    // one is fed whole inputs.
    // The model's own shape where the configuration reshapes an input.
    let from = usize::from(codec.batching);
    let seen = |t: &TensorDecl| t.reshape.clone().unwrap_or_else(|| t.shape[from..].to_vec());
    Ok(codec.inputs.iter().map(|t| seen(t).iter().map(|&d| if d < 0 { PROFILE_ANY_SIZE } else { d as usize }).collect()).collect())
}
