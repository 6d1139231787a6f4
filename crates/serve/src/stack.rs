//! The serving stack in one call: a pipeline with its models and stage programs
//! ([`ServedPipeline`]), a policy ([`PolicyChoice`]) and worker placements in,
//! the running engine actor and the KServe [`EngineBackend`] out
//! ([`ServingStack::start`]).
//!
//! Two pipelines ship: PP-OCR text recognition ([`ServedPipeline::ocr`], the default,
//! preset `crates/formats/presets/ocr.toml`) and a one-stage trivial model for measuring the
//! server's own overhead ([`ServedPipeline::tiny`], preset `crates/formats/presets/tiny.toml`).

use std::path::Path;
use std::sync::Arc;

use yardmaster_dataplane::ocr::rec::Dictionary;
use yardmaster_dataplane::ocr::{OcrModels, OcrOptions};
use yardmaster_dataplane::{ModelCatalog, ModelKey, ModelSession, ModelSpec, WorkerContext, WorkerPool};

use super::backend::{Codec, EngineBackend, ModelDescription, ServedModel};
use super::executor::{check_placements, OnnxExecutor, Placement, ServeActor, WorkerBoard};
use super::payload::PayloadStore;
use super::stages::{ClsProgram, DetProgram, RecProgram, StageProgram, TensorProgram};
use super::tiny_model;
use yardmaster_engine::{Engine, EngineOptions, MonotonicClock, Pipeline, SharedExecutor};
use yardmaster_policy::contract::StageKind;
use yardmaster_policy::{Arm, FailureMode, Limits, Mode, PolicyLoader, PolicyModule, Sandbox};

pub use yardmaster_formats::presets::{OCR_PRESET, TINY_PRESET};

/// Name of the OCR model clients address.
pub const OCR_MODEL: &str = "ocr";
/// Name of the trivial model clients address.
pub const TINY_MODEL: &str = "tiny";

/// A pipeline ready to serve: the engine's description, the model of every (stage,
/// variant), the program around every stage, and the models clients see.
#[derive(Clone)]
pub struct ServedPipeline {
    /// Stages, profiles, streams.
    pub pipeline: Pipeline,
    /// `catalog.stages[stage][variant]`: the model file.
    pub catalog: ModelCatalog,
    /// `programs[stage]`.
    pub programs: Vec<Arc<dyn StageProgram>>,
    /// Models clients address, one per stream served.
    pub models: Vec<ServedModel>,
}

impl std::fmt::Debug for ServedPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedPipeline").field("pipeline", &self.pipeline.name).field("models", &self.models).finish()
    }
}

impl ServedPipeline {
    /// PP-OCR with the models the set-up script installs, on the preset pipeline.
    pub fn ocr(context: &WorkerContext) -> Result<Self, String> {
        let pipeline = yardmaster_formats::pipeline::from_toml(OCR_PRESET, "ocr preset").map_err(|e| e.to_string())?;
        let models = OcrModels::from_assets().map_err(|e| e.to_string())?;
        Self::ocr_with(pipeline, models, context)
    }

    /// PP-OCR on `pipeline` (stages named `det`, `cls`, `rec`, a chain, one variant
    /// each) with `models`. Reads the recogniser's dictionary from its metadata (which
    /// also leaves the recogniser in the model cache, so its worker starts warm).
    pub fn ocr_with(pipeline: Pipeline, models: OcrModels, context: &WorkerContext) -> Result<Self, String> {
        let rec = ModelSession::start(&context.runtime, &context.cache, &models.rec, 1).map_err(|e| e.to_string())?.session;
        let dictionary = Dictionary::from_session(&rec).map_err(|e| e.to_string())?;
        let options = OcrOptions::default();
        let mut programs: Vec<Arc<dyn StageProgram>> = Vec::new();
        let mut catalog = ModelCatalog::default();
        for stage in &pipeline.stages {
            let (program, spec): (Arc<dyn StageProgram>, &ModelSpec) = match stage.name.as_str() {
                "det" => (Arc::new(DetProgram { options }), &models.det),
                "cls" => (Arc::new(ClsProgram { options }), &models.cls),
                "rec" => (Arc::new(RecProgram { options, dictionary: dictionary.clone() }), &models.rec),
                other => return Err(format!("pipeline {:?}: stage {other:?} is not an OCR stage (det, cls, rec)", pipeline.name)),
            };
            programs.push(program);
            catalog.stages.push(vec![spec.clone(); stage.variants.len()]);
        }
        let entry = pipeline.streams[0].entry;
        let models = vec![ServedModel {
            name: OCR_MODEL.into(),
            stream: 0,
            entry,
            stages: (0..pipeline.stages.len() as u32).collect(),
            codec: Codec::OcrImage,
            description: ModelDescription::default(),
        }];
        let served = Self { pipeline, catalog, programs, models };
        served.check()?;
        Ok(served)
    }

    /// The trivial pipeline: `y = x + 1` on 4 floats, its model written to `dir` on
    /// first use (see [`tiny_model`]).
    pub fn tiny(dir: &Path) -> Result<Self, String> {
        let pipeline = yardmaster_formats::pipeline::from_toml(TINY_PRESET, "tiny preset").map_err(|e| e.to_string())?;
        let path = tiny_model::ensure(dir).map_err(|e| format!("writing the trivial model to {}: {e}", dir.display()))?;
        let spec = ModelSpec::new(ModelKey::new(TINY_MODEL, "add"), path);
        let catalog = ModelCatalog { stages: vec![vec![spec; pipeline.stages[0].variants.len()]] };
        let programs: Vec<Arc<dyn StageProgram>> = vec![Arc::new(TensorProgram { name: TINY_MODEL.into() })];
        let shape = vec![tiny_model::WIDTH];
        let codec =
            Codec::Fp32 { inputs: vec![(tiny_model::INPUT.into(), shape.clone())], outputs: vec![(tiny_model::OUTPUT.into(), shape)] };
        let models = vec![ServedModel {
            name: TINY_MODEL.into(),
            stream: 0,
            entry: pipeline.streams[0].entry,
            stages: vec![pipeline.streams[0].entry],
            codec,
            description: ModelDescription::default(),
        }];
        let served = Self { pipeline, catalog, programs, models };
        served.check()?;
        Ok(served)
    }

    /// The trivial pipeline with its model in the assets folder
    /// (`yardmaster_dataplane::assets::assets_dir`), where `yardmaster serve` keeps it.
    pub fn tiny_in_assets() -> Result<Self, String> {
        Self::tiny(&yardmaster_dataplane::assets::assets_dir())
    }

    /// Check that the executor can serve it: a chain of batch stages (one request id
    /// from entry to exit, no fan-out), a program and a model for every stage and
    /// variant, every served model on a stream of the pipeline.
    pub fn check(&self) -> Result<(), String> {
        let name = &self.pipeline.name;
        let stages = &self.pipeline.stages;
        if self.programs.len() != stages.len() || self.catalog.stages.len() != stages.len() {
            return Err(format!(
                "pipeline {name:?}: {} stages but {} programs and {} catalogue entries",
                stages.len(),
                self.programs.len(),
                self.catalog.stages.len()
            ));
        }
        for (i, stage) in stages.iter().enumerate() {
            if stage.kind != StageKind::Batch {
                return Err(format!(
                    "pipeline {name:?}: stage {:?} is an iteration (LLM) stage; ONNX workers run batch stages",
                    stage.name
                ));
            }
            if stage.successors.len() > 1 || stage.predecessors.len() > 1 || stage.variants.iter().any(|v| !v.fan_out.is_empty()) {
                return Err(format!("pipeline {name:?}: stage {:?} branches or fans out; the ONNX executor serves chains", stage.name));
            }
            if self.catalog.stages[i].len() < stage.variants.len() {
                return Err(format!(
                    "pipeline {name:?}: stage {:?} has {} variants but {} models",
                    stage.name,
                    stage.variants.len(),
                    self.catalog.stages[i].len()
                ));
            }
        }
        for model in &self.models {
            let Some(stream) = self.pipeline.streams.get(model.stream as usize) else {
                return Err(format!("model {:?} feeds stream {}, which pipeline {name:?} lacks", model.name, model.stream));
            };
            if stream.entry != model.entry {
                return Err(format!(
                    "model {:?}: stream {:?} enters at stage {}, not {}",
                    model.name, stream.name, stream.entry, model.entry
                ));
            }
        }
        Ok(())
    }
}

/// The policy that schedules: a loaded module, its sandbox, its failure mode.
#[derive(Clone)]
pub struct PolicyChoice {
    /// Name (for logs and metrics).
    pub name: String,
    /// The sandbox it runs in.
    pub sandbox: Sandbox,
    /// The compiled component.
    pub module: Arc<PolicyModule>,
    /// What happens when it traps or overruns.
    pub failure: FailureMode,
}

impl PolicyChoice {
    /// A policy shipped with Yardmaster (e.g. `edf`), in a serve-mode sandbox with
    /// default limits, failing open.
    pub fn shipped(name: &str) -> Result<Self, String> {
        let sandbox = Sandbox::new(Mode::Serve, Limits::default()).map_err(|e| e.to_string())?;
        let artifact = yardmaster_policy_artifacts::shipped(name).ok_or_else(|| format!("no shipped policy named {name:?}"))?;
        let module = PolicyLoader::new(sandbox.clone(), None).load(name, artifact.bytes).map_err(|e| e.to_string())?;
        Ok(Self { name: name.into(), sandbox, module, failure: FailureMode::FailOpen })
    }
}

/// Builds and starts the serving stack.
#[derive(Debug, Clone, Copy)]
pub struct ServingStack;

impl ServingStack {
    /// Start the engine actor for `served` scheduled by `policy`, with the workers of
    /// `placements`; stages no placement names run in this process (one
    /// [`WorkerPool`] per stage over `context`, with the stage's intra-op threads).
    /// Returns the actor (stop it with [`ServeActor::shutdown`]) and the backend for
    /// the client API.
    pub fn start(
        served: ServedPipeline,
        policy: PolicyChoice,
        options: EngineOptions,
        context: WorkerContext,
        mut placements: Vec<Placement>,
    ) -> Result<(ServeActor, EngineBackend), String> {
        served.check()?;
        let ServedPipeline { pipeline, catalog, programs, models } = served;
        let stages = pipeline.stages.len() as u32;
        let placed: Vec<u32> = placements.iter().flat_map(|p| p.stages.iter().copied()).collect();
        for stage in (0..stages).filter(|s| !placed.contains(s)) {
            let threads = pipeline.stages[stage as usize].threads as usize;
            let (pool, events) = WorkerPool::new(context.clone(), catalog.clone(), threads);
            placements.push(Placement { stages: vec![stage], workers: Box::new(pool), events });
        }
        check_placements(&placements, stages)?;

        let clock = MonotonicClock::default();
        let store = PayloadStore::new();
        let board = WorkerBoard::new(stages);
        let actor = {
            let (clock, store, board, programs) = (clock.clone(), store.clone(), board.clone(), programs.clone());
            let label = policy.name.clone();
            ServeActor::spawn("yardmaster-engine", clock.clone(), &label, move |handle| {
                let executor = OnnxExecutor::new(handle, &pipeline, programs, store, board, placements);
                let PolicyChoice { name, sandbox, module, failure } = policy;
                Engine::new(clock, SharedExecutor::new(executor), pipeline, options, |config, view| {
                    Arm::start_wasm(&name, config, &sandbox, module, failure, None, view)
                })
            })
            .map_err(|e| format!("starting the engine thread: {e}"))?
        };
        let backend = EngineBackend::new(actor.handle(), clock, store, board, programs, models);
        Ok((actor, backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presets_parse_as_chains() {
        for (text, name, stages) in [(OCR_PRESET, "ocr", 3), (TINY_PRESET, "tiny", 1)] {
            let pipeline = yardmaster_formats::pipeline::from_toml(text, name).unwrap();
            assert_eq!(pipeline.stages.len(), stages, "{name}");
            assert!(pipeline.stages.iter().all(|s| s.successors.len() <= 1));
        }
        let ocr = yardmaster_formats::pipeline::from_toml(OCR_PRESET, "ocr").unwrap();
        let names: Vec<&str> = ocr.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["det", "cls", "rec"]);
    }
}
