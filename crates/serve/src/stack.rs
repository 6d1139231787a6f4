//! The serving stack in one call: a pipeline with its models and stage programs
//! ([`ServedPipeline`]), a policy ([`PolicyChoice`]) and worker placements in,
//! the running engine actor and the KServe [`EngineBackend`] out
//! ([`ServingStack::start`]).
//!
//! Every pipeline served is a model repository's (`super::repository`); two ship
//! ([`BuiltinRepository`]): PP-OCR text recognition ([`ServedPipeline::ocr`], the
//! default) and a one-stage trivial model for measuring the server's own overhead
//! ([`ServedPipeline::tiny`]).

use std::path::Path;
use std::sync::Arc;

use yardmaster_dataplane::{ModelCatalog, WorkerContext};

use super::backend::{Codec, EngineBackend, ServedModel};
use super::builtin_repository::BuiltinRepository;
use super::executor::{check_placements, HostGroup, OnnxExecutor, Placement, ServeActor, WorkerBoard};
use super::payload::PayloadStore;
use super::repository::default_profile_cache;
use super::stages::StageProgram;
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
    /// PP-OCR: the shipped `ocr` repository, laid out in the assets folder and loaded
    /// (see [`BuiltinRepository`]).
    pub fn ocr(context: &WorkerContext) -> Result<Self, String> {
        BuiltinRepository::Ocr.serve(&yardmaster_dataplane::assets::assets_dir(), &default_profile_cache(), context)
    }

    /// The trivial model (`y = x + 1` on `[batch, 4]` floats): the shipped `tiny`
    /// repository laid out under `dir`, its profile cached there too.
    pub fn tiny(dir: &Path, context: &WorkerContext) -> Result<Self, String> {
        BuiltinRepository::Tiny.serve(dir, &dir.join("profiles"), context)
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
            if stream.entry != model.entry && !matches!(model.codec, Codec::BuiltinStep { .. }) {
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
    /// [`WorkerPool`](yardmaster_dataplane::WorkerPool) per stage over `context`, with the stage's intra-op threads).
    /// Returns the actor (stop it with [`ServeActor::shutdown`]) and the backend for
    /// the client API.
    pub fn start(
        served: ServedPipeline,
        policy: PolicyChoice,
        options: EngineOptions,
        context: WorkerContext,
        placements: Vec<Placement>,
    ) -> Result<(ServeActor, EngineBackend), String> {
        Self::start_cluster(served, policy, options, context, placements, Vec::new())
    }

    /// [`ServingStack::start`] on a cluster: `served.pipeline.hosts` names the hosts,
    /// and `hosts` holds the workers of each host that is not this process (a
    /// `yardmaster node`); workers the engine seats on a host run there.
    pub fn start_cluster(
        served: ServedPipeline,
        policy: PolicyChoice,
        options: EngineOptions,
        context: WorkerContext,
        mut placements: Vec<Placement>,
        hosts: Vec<HostGroup>,
    ) -> Result<(ServeActor, EngineBackend), String> {
        served.check()?;
        let ServedPipeline { pipeline, catalog, programs, models } = served;
        let stages = pipeline.stages.len() as u32;
        let placed: Vec<u32> = placements.iter().flat_map(|p| p.stages.iter().copied()).collect();
        for stage in (0..stages).filter(|s| !placed.contains(s)) {
            let threads = pipeline.stages[stage as usize].threads as usize;
            placements.push(Placement::local(vec![stage], context.clone(), catalog.clone(), threads));
        }
        check_placements(&placements, stages)?;

        let clock = MonotonicClock::default();
        let store = PayloadStore::new();
        let board = WorkerBoard::new(stages);
        let actor = {
            let (clock, store, board, programs) = (clock.clone(), store.clone(), board.clone(), programs.clone());
            let label = policy.name.clone();
            ServeActor::spawn("yardmaster-engine", clock.clone(), &label, move |handle| {
                let executor = OnnxExecutor::new(handle, &pipeline, programs, store, board, placements, hosts);
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
