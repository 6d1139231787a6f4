//! Loading and unloading models while serving: Triton's repository extension
//! (`POST /v2/repository/models/{m}/load`, `…/unload`) and its model control modes.
//!
//! - `none`: the repository is read once at start; load and unload are refused.
//! - `explicit`: models load and unload when a client asks (all of them, or those
//!   named with `--load-model`, at start).
//! - `poll`: as `explicit`, and the repository is read again every few seconds: new
//!   and changed models are loaded (again), removed ones unloaded.
//!
//! A change goes through the same steps whatever asked for it ([`ModelControl`]):
//! 1. the model is read and prepared off the engine's thread — configuration,
//!    graph, measured profile (cached after the first load) — so a model that cannot
//!    serve is refused with the reason and nothing else changes;
//! 2. for an unload, new requests for the model are refused (503) and its requests in
//!    flight drain; what is left after the unload timeout fails with the reason;
//! 3. the new pipeline is assembled by place name (`super::repository::assemble`):
//!    stage and stream ids never move, a model unloaded leaves offline places, and
//!    a model loaded again takes its places back;
//! 4. between two event batches the engine actor gives the executor the new stages
//!    and models and reconfigures the engine, which hands the running policy the new
//!    cluster (`yardmaster_engine::Engine::reconfigure`): no request is lost;
//! 5. the client API serves the new set of models.
//!
//! Changes are serialised. While an A/B run or a shadow policy runs they are refused:
//! end it first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use yardmaster_dataplane::{ModelSpec, WorkerContext};
use yardmaster_formats::model_repository::config::Backend as Platform;
use yardmaster_formats::model_repository::config_json::JSON_SOURCE;
use yardmaster_formats::model_repository::{scan, scan_model_with, ModelConfig, ModelEntry, Repository};
use yardmaster_policy::contract::Param;

use super::api::ControlError;
use super::backend::{EngineBackend, ModelController};
use super::executor::{Placement, ServeHandle};
use super::repository::{assemble, prepare, prepare_ensemble, Prepared, RepositoryOptions};
use super::stack::ServedPipeline;

/// How the server treats its model repository while serving (Triton's
/// `--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlMode {
    /// Read once at start; no load or unload while serving.
    #[default]
    None,
    /// Load and unload when a client asks.
    Explicit,
    /// As `Explicit`, and follow the repository's changes every poll interval.
    Poll,
}

impl std::str::FromStr for ControlMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "none" => Ok(ControlMode::None),
            "explicit" => Ok(ControlMode::Explicit),
            "poll" => Ok(ControlMode::Poll),
            other => Err(format!("model control mode {other:?}: expected none, explicit or poll")),
        }
    }
}

impl std::fmt::Display for ControlMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ControlMode::None => "none",
            ControlMode::Explicit => "explicit",
            ControlMode::Poll => "poll",
        })
    }
}

/// What model control needs besides the running server.
#[derive(Debug, Clone)]
pub struct ControlSettings {
    /// The repository directories.
    pub dirs: Vec<PathBuf>,
    /// How profiles are measured and cached.
    pub options: RepositoryOptions,
    /// The operator's own policy parameters (they win over the models').
    pub operator_params: Vec<Param>,
    /// How long an unloaded model's requests may drain before they fail.
    pub unload_timeout: Duration,
}

/// A model served now, as it was prepared.
struct LoadedModel {
    /// Its versions (or the ensemble), latest last.
    prepared: Vec<Prepared>,
    /// The models an ensemble runs (empty for a plain model).
    steps: Vec<String>,
    /// Its folder's files as they were read, to notice changes when polling.
    fingerprint: Fingerprint,
}

/// Files of a model folder with their sizes and modification times.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

struct ControlState {
    /// The pipeline served now, offline places included.
    served: ServedPipeline,
    loaded: BTreeMap<String, LoadedModel>,
}

/// Loads and unloads models of a served repository (see the module docs).
pub struct ModelControl {
    settings: ControlSettings,
    context: WorkerContext,
    handle: ServeHandle,
    backend: Arc<EngineBackend>,
    state: Mutex<ControlState>,
}

impl ModelControl {
    /// Control for a server that serves `served`, loaded from `prepared` (every model
    /// version and ensemble, as `super::repository::load` prepared them).
    pub(crate) fn new(
        settings: ControlSettings,
        context: WorkerContext,
        handle: ServeHandle,
        backend: Arc<EngineBackend>,
        served: ServedPipeline,
        prepared: Vec<Prepared>,
    ) -> Self {
        let mut loaded: BTreeMap<String, LoadedModel> = BTreeMap::new();
        for p in prepared {
            let name = p.model.name.clone();
            let entry = loaded.entry(name.clone()).or_insert_with(|| LoadedModel {
                prepared: Vec::new(),
                steps: p.steps.clone(),
                fingerprint: model_dir(&settings.dirs, &name).map(|d| fingerprint(&d)).unwrap_or_default(),
            });
            entry.prepared.push(p);
        }
        Self { settings, context, handle, backend, state: Mutex::new(ControlState { served, loaded }) }
    }

    fn lock(&self) -> MutexGuard<'_, ControlState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The models served now.
    pub fn loaded(&self) -> Vec<String> {
        self.lock().loaded.keys().cloned().collect()
    }

    /// Load (or load again) `model`: see the module docs.
    pub fn load_model(&self, model: &str) -> Result<(), ControlError> {
        self.load_model_configured(model, None)
    }

    /// Load (or load again) `model`, configured by `config` — a configuration in
    /// Triton's JSON, as `POST …/load` may carry — instead of its `config.pbtxt` when
    /// given. The configuration holds for this load only: a later load without one
    /// reads the folder's again, as Triton does. A configuration that cannot be read is
    /// refused with the reason, and the model stays as it was.
    pub fn load_model_configured(&self, model: &str, config: Option<&str>) -> Result<(), ControlError> {
        let mut state = self.lock();
        let repository = self.read_repository()?;
        let no_model = || {
            ControlError::Refused(format!(
                "no model {model:?} in {}",
                self.settings.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        };
        let configured;
        let entry = match (config, repository.models.get(model)) {
            (Some(json), _) => {
                let dir = model_dir(&self.settings.dirs, model).ok_or_else(no_model)?;
                let refused = |reason: &str| ControlError::Refused(format!("model {model:?}: {JSON_SOURCE}: {reason}"));
                let config = ModelConfig::from_triton_json(json, model).map_err(|e| refused(&e.message))?;
                let mut entry = scan_model_with(&dir, model, config).map_err(|e| refused(&e.message))?;
                entry.complete_from_graph().map_err(|e| refused(&e.message))?;
                configured = entry;
                &configured
            }
            (None, Some(Ok(entry))) => entry,
            (None, Some(Err(error))) => {
                let reason = error.message.clone();
                self.backend.change_tables(|t| set_unavailable(&mut t.unavailable, model, &reason));
                return Err(ControlError::Refused(format!("model {model:?} cannot be served: {reason}")));
            }
            (None, None) => return Err(no_model()),
        };
        let mut loaded = BTreeMap::new();
        let refused = |reason: String| ControlError::Refused(format!("model {model:?} cannot be served: {reason}"));
        let prepared = self.prepare_entry(entry, &state.loaded).map_err(|reason| {
            self.backend.change_tables(|t| set_unavailable(&mut t.unavailable, model, &reason));
            refused(reason)
        })?;
        // Ensembles running the model are made again of its new stages.
        let others = state.loaded.iter().filter(|(name, _)| name.as_str() != model).map(|(_, m)| m);
        let plain = plain_prepared(others.chain([&prepared]));
        loaded.insert(model.to_string(), prepared);
        for (name, dependent) in state.loaded.iter().filter(|(_, m)| m.steps.iter().any(|s| s == model)) {
            let Some(Ok(entry)) = repository.models.get(name) else { continue };
            let again = prepare_ensemble(entry, &plain).map_err(|reason| {
                ControlError::Conflict(format!("model {model:?} would break ensemble {name:?} ({reason}); unload the ensemble first"))
            })?;
            loaded.insert(
                name.clone(),
                LoadedModel { prepared: vec![again], steps: dependent.steps.clone(), fingerprint: dependent.fingerprint.clone() },
            );
        }
        if let Some(warning) = entry.ignored_fields_warning() {
            tracing::warn!("{warning}");
        }
        let mut next: BTreeMap<String, &LoadedModel> = state.loaded.iter().map(|(n, m)| (n.clone(), m)).collect();
        for (name, model) in &loaded {
            next.insert(name.clone(), model);
        }
        let served = assemble(&ordered(&next), Some(&state.served)).map_err(refused)?;
        self.apply(&state.served, &served, &format!("model {model} loaded"), &next)?;
        state.served = served;
        for (name, model) in loaded {
            state.loaded.insert(name, model);
        }
        self.backend.change_tables(|t| t.unavailable.retain(|(name, _)| name != model));
        tracing::info!(model, "model loaded");
        Ok(())
    }

    /// Unload `model` (and, with `unload_dependents`, the ensembles running it): see the
    /// module docs.
    pub fn unload_model(&self, model: &str, unload_dependents: bool) -> Result<(), ControlError> {
        let mut state = self.lock();
        if !state.loaded.contains_key(model) {
            return Err(ControlError::Refused(format!("model {model:?} is not loaded")));
        }
        let dependents: Vec<String> =
            state.loaded.iter().filter(|(_, m)| m.steps.iter().any(|s| s == model)).map(|(n, _)| n.clone()).collect();
        if !dependents.is_empty() && !unload_dependents {
            return Err(ControlError::Conflict(format!(
                "model {model:?} is a step of ensemble {}: unload {} first, or ask with {{\"parameters\": {{\"unload_dependents\": true}}}}",
                dependents.join(", "),
                if dependents.len() == 1 { "it" } else { "them" }
            )));
        }
        let gone: Vec<String> = std::iter::once(model.to_string()).chain(dependents).collect();
        let streams: Vec<u32> = state.served.models.iter().filter(|m| gone.contains(&m.name)).map(|m| m.stream).collect();
        self.backend.change_tables(|t| t.unloading.extend(gone.iter().cloned()));
        let result = self.drain_and_remove(&mut state, &gone, &streams);
        self.backend.change_tables(|t| {
            t.unloading.retain(|m| !gone.contains(m));
            if result.is_ok() {
                for name in &gone {
                    set_unavailable(&mut t.unavailable, name, "unloaded");
                }
            }
        });
        if result.is_ok() {
            tracing::info!(model, "model unloaded");
        }
        result
    }

    fn drain_and_remove(&self, state: &mut ControlState, gone: &[String], streams: &[u32]) -> Result<(), ControlError> {
        let until = Instant::now() + self.settings.unload_timeout;
        let in_flight = |streams: Vec<u32>| {
            self.handle.inspect_arms(move |arms| {
                arms.slots().iter().map(|slot| streams.iter().map(|&s| slot.engine.in_flight_of(s)).sum::<usize>()).sum::<usize>()
            })
        };
        let mut quiet = 0;
        loop {
            let left = in_flight(streams.to_vec()).map_err(|e| ControlError::Failed(e.to_string()))?;
            // Twice quiet, a few milliseconds apart: a request that passed the
            // unloading check just before it was set has reached the engine by then.
            quiet = if left == 0 { quiet + 1 } else { 0 };
            if quiet == 2 {
                break;
            }
            if Instant::now() >= until {
                let error = format!(
                    "model {} was unloaded before this request finished (the unload waited {:.0} s)",
                    gone[0],
                    self.settings.unload_timeout.as_secs_f64()
                );
                let streams = streams.to_vec();
                let failed = self
                    .handle
                    .update(move |arms| streams.iter().map(|&s| arms.main_mut().fail_stream(s, &error)).sum::<usize>())
                    .map_err(|e| ControlError::Failed(e.to_string()))?;
                tracing::warn!(model = %gone[0], failed, "requests still in flight at the unload timeout failed");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let next: BTreeMap<String, &LoadedModel> =
            state.loaded.iter().filter(|(n, _)| !gone.contains(n)).map(|(n, m)| (n.clone(), m)).collect();
        if next.is_empty() {
            return Err(ControlError::Refused(format!(
                "model {:?} is the last one served: a server serves at least one model (load another first)",
                gone[0]
            )));
        }
        let served = assemble(&ordered(&next), Some(&state.served)).map_err(ControlError::Failed)?;
        self.apply(&state.served, &served, &format!("model {} unloaded", gone[0]), &next)?;
        state.served = served;
        for name in gone {
            state.loaded.remove(name);
        }
        Ok(())
    }

    /// Read the repository again, refusing with the reason when it cannot be read.
    fn read_repository(&self) -> Result<Repository, ControlError> {
        let mut repository = scan(&self.settings.dirs).map_err(|e| ControlError::Refused(e.to_string()))?;
        repository.complete_from_graphs();
        Ok(repository)
    }

    /// Prepare a model (profiling it when no profile is cached) or an ensemble of
    /// loaded models.
    fn prepare_entry(&self, entry: &ModelEntry, loaded: &BTreeMap<String, LoadedModel>) -> Result<LoadedModel, String> {
        let fingerprint = fingerprint(&entry.dir);
        if entry.config.backend == Platform::Ensemble {
            let steps: Vec<String> = entry.config.ensemble_steps.iter().map(|s| s.model_name.clone()).collect();
            if let Some(missing) = steps.iter().find(|s| !loaded.contains_key(*s)) {
                return Err(format!("its step model {missing:?} is not loaded: load it first"));
            }
            let ensemble = prepare_ensemble(entry, &plain_prepared(loaded.values()))?;
            return Ok(LoadedModel { prepared: vec![ensemble], steps, fingerprint });
        }
        let prepared = prepare(entry, &self.context, &self.settings.options, &mut |line| tracing::info!("{line}"))?;
        Ok(LoadedModel { prepared, steps: Vec::new(), fingerprint })
    }

    /// Serve `next` instead of `served`: new stages get worker groups, stages loaded
    /// again their new model files, the engine and its policy the new cluster; then the
    /// client API serves the new set of models.
    fn apply(
        &self,
        served: &ServedPipeline,
        next: &ServedPipeline,
        why: &str,
        models: &BTreeMap<String, &LoadedModel>,
    ) -> Result<(), ControlError> {
        let old = served.pipeline.stages.len();
        let mut placements = Vec::new();
        for stage in old..next.pipeline.stages.len() {
            let threads = next.pipeline.stages[stage].threads as usize;
            placements.push(Placement::local(vec![stage as u32], self.context.clone(), next.catalog.clone(), threads));
        }
        let changed: Vec<(u32, Vec<ModelSpec>)> = (0..old)
            .filter(|&s| next.pipeline.stages[s].max_replicas > 0 && next.catalog.stages[s] != served.catalog.stages[s])
            .map(|s| (s as u32, next.catalog.stages[s].clone()))
            .collect();
        let mut params = self.settings.operator_params.clone();
        for param in models.values().flat_map(|m| m.prepared.iter().flat_map(|p| p.params.clone())) {
            if !params.iter().any(|p| p.key == param.key) {
                params.push(param);
            }
        }
        let (pipeline, programs, reason) = (next.pipeline.clone(), next.programs.clone(), why.to_string());
        let outcome = self
            .handle
            .update(move |arms| {
                if arms.ab_running() {
                    return Err(ControlError::Conflict("an A/B run is in progress: end it before loading or unloading models".into()));
                }
                let engine = arms.main_mut();
                if engine.shadow_report().is_some() {
                    return Err(ControlError::Conflict("a shadow policy runs: stop it before loading or unloading models".into()));
                }
                engine.executor().borrow_mut().serve_pipeline(&pipeline, programs, placements, changed).map_err(ControlError::Failed)?;
                engine.set_params(params);
                engine.reconfigure(pipeline, &reason).map_err(ControlError::Failed)
            })
            .map_err(|e| ControlError::Failed(e.to_string()))??;
        tracing::info!(why = %why, pause_us = outcome.pause.as_secs_f64() * 1e6, replayed = outcome.replayed, failed = outcome.failed, "the policy was handed the new cluster");
        drop(outcome.retired);
        let online: Vec<u32> =
            (0..next.pipeline.stages.len() as u32).filter(|&s| next.pipeline.stages[s as usize].max_replicas > 0).collect();
        self.backend.board().set_online(online);
        let (programs, served_models) = (next.programs.clone(), next.models.iter().cloned().map(Arc::new).collect());
        self.backend.change_tables(|t| {
            t.programs = programs;
            t.models = served_models;
        });
        Ok(())
    }

    /// Follow the repository: load new and changed models, unload removed ones (poll
    /// mode). Returns one line per change made or refused.
    pub fn poll(&self) -> Vec<String> {
        let Ok(repository) = self.read_repository() else { return Vec::new() };
        let loaded: BTreeMap<String, Fingerprint> = self.lock().loaded.iter().map(|(n, m)| (n.clone(), m.fingerprint.clone())).collect();
        let mut lines = Vec::new();
        for (name, found) in &repository.models {
            let dir = match found {
                Ok(entry) => entry.dir.clone(),
                Err(_) => match model_dir(&self.settings.dirs, name) {
                    Some(dir) => dir,
                    None => continue,
                },
            };
            let now = fingerprint(&dir);
            if loaded.get(name) == Some(&now) {
                continue;
            }
            if !loaded.contains_key(name) && found.is_err() && self.backend.tables().unavailable.iter().any(|(m, _)| m == name) {
                continue;
            }
            lines.push(match self.load_model(name) {
                Ok(()) => format!("model {name}: loaded"),
                Err(error) => format!("model {name}: {error}"),
            });
        }
        for name in loaded.keys().filter(|n| !repository.models.contains_key(*n)) {
            lines.push(match self.unload_model(name, true) {
                Ok(()) => format!("model {name}: removed from the repository, unloaded"),
                Err(error) => format!("model {name}: {error}"),
            });
        }
        lines
    }
}

impl ModelController for ModelControl {
    fn load(&self, model: &str, parameters: &serde_json::Value) -> Result<(), ControlError> {
        let files = parameters.as_object().into_iter().flatten().any(|(key, _)| key.starts_with("file:"));
        if files {
            return Err(ControlError::Refused(format!(
                "model {model:?}: model files in the load request are not supported; put them in the repository's folder and load it"
            )));
        }
        let config = match parameters.get("config") {
            None | Some(serde_json::Value::Null) => None,
            // Triton's clients send the configuration as a string of JSON.
            Some(serde_json::Value::String(text)) => Some(text.clone()),
            Some(object @ serde_json::Value::Object(_)) => Some(object.to_string()),
            Some(other) => {
                return Err(ControlError::Refused(format!(
                    "model {model:?}: parameters.config must be the configuration as a JSON string, not {other}"
                )))
            }
        };
        self.load_model_configured(model, config.as_deref())
    }

    fn unload(&self, model: &str, parameters: &serde_json::Value) -> Result<(), ControlError> {
        let dependents = parameters.get("unload_dependents").and_then(serde_json::Value::as_bool).unwrap_or(false);
        self.unload_model(model, dependents)
    }
}

/// Plain models' versions first, then ensembles, each in name order.
fn ordered(models: &BTreeMap<String, &LoadedModel>) -> Vec<Prepared> {
    let ensembles = models.values().filter(|m| !m.steps.is_empty()).flat_map(|m| m.prepared.iter().cloned());
    plain_prepared(models.values().copied()).into_iter().chain(ensembles).collect()
}

/// Every version of the plain models (not ensembles) among `models`: what ensembles
/// are made of.
fn plain_prepared<'a>(models: impl Iterator<Item = &'a LoadedModel>) -> Vec<Prepared> {
    models.filter(|m| m.steps.is_empty()).flat_map(|m| m.prepared.iter().cloned()).collect()
}

/// The folder of model `name` in the repository directories `dirs`, if there is one.
fn model_dir(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|d| d.is_dir())
}

fn set_unavailable(unavailable: &mut Vec<(String, String)>, model: &str, reason: &str) {
    unavailable.retain(|(name, _)| name != model);
    unavailable.push((model.to_string(), reason.to_string()));
}

/// The files of a model folder and of its version folders, with sizes and times.
fn fingerprint(dir: &Path) -> Fingerprint {
    let mut files = Vec::new();
    let mut folders = vec![(dir.to_path_buf(), 0)];
    while let Some((folder, depth)) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() && depth == 0 {
                folders.push((path, 1));
            } else if meta.is_file() {
                files.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    files.sort();
    files
}
