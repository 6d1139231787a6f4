//! A model repository as engine stages and streams — what the server and the
//! simulator share, so that `sim compare --model-repository DIR` schedules the same
//! pipeline `yardmaster serve --model-repository DIR` does.
//!
//! A served model is one stage (its latest served version the one variant, its
//! measured latency profile, `max_batch_size` as the batch bound, `instance_group`'s
//! count as the starting replicas, scalable to four times that) and one stream (its
//! SLO). Its profile is found here: `profile.toml` beside `config.pbtxt`, else the
//! profile cache (`<cache>/<sha256>-<device>-t<threads>.toml`, keyed by the model
//! file's SHA-256). Measuring one needs ONNX Runtime, which only the server has: it
//! measures a missing profile and writes it to [`cached_profile_path`].

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use yardmaster_engine::pipeline::{Pipeline, StageDef, StreamDef};
use yardmaster_policy::contract::{DeviceKind, Param};

use super::config::ModelConfig;
use super::repository::{ModelEntry, ModelVersion};

/// The file beside a model's `config.pbtxt` whose profile is used instead of measuring.
pub const PROFILE_FILE: &str = "profile.toml";

/// The most replicas of a model's stage, as a multiple of its starting count.
pub const MAX_REPLICA_FACTOR: u32 = 4;

/// Most starting replicas of one model.
pub const MAX_STARTING_REPLICAS: u32 = 64;

/// Where a model's measured profiles are kept: the cache folder, and the device and
/// thread count they were measured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileStore {
    /// The cache folder.
    pub dir: PathBuf,
    /// Device name (`cpu`, `cuda:0`).
    pub device: String,
    /// Intra-op threads of a worker.
    pub threads: usize,
}

/// Where a profile was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// `profile.toml` beside the model's configuration.
    Beside(PathBuf),
    /// The profile cache.
    Cached(PathBuf),
}

impl ProfileStore {
    /// The cache file of a model file with SHA-256 `sha256`.
    pub fn cached_profile_path(&self, sha256: &str) -> PathBuf {
        cached_profile_path(&self.dir, sha256, &self.device, self.threads)
    }

    /// The profile of `entry`'s served `version`: beside it, else cached; `None` when
    /// neither exists (a profile that exists but cannot be read is an error).
    pub fn find(&self, entry: &ModelEntry, version: &ModelVersion) -> Result<Option<(StageDef, ProfileSource)>, String> {
        let beside = entry.dir.join(PROFILE_FILE);
        if beside.is_file() {
            return Ok(Some((profile_stage(&beside)?, ProfileSource::Beside(beside))));
        }
        let Some(file) = &version.model_file else { return Ok(None) };
        let cached = self.cached_profile_path(&sha256_of(file)?);
        if cached.is_file() {
            return Ok(Some((profile_stage(&cached)?, ProfileSource::Cached(cached))));
        }
        Ok(None)
    }
}

/// The cache file of a profile: `<dir>/<sha256>-<device>-t<threads>.toml`.
pub fn cached_profile_path(dir: &Path, sha256: &str, device: &str, threads: usize) -> PathBuf {
    dir.join(format!("{sha256}-{}-t{threads}.toml", device.replace([':', '/'], "-")))
}

/// The hex SHA-256 of a file.
pub fn sha256_of(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// The first stage of a profile file (the output of `yardmaster profile`, a
/// one-stage pipeline in our TOML format).
pub fn profile_stage(path: &Path) -> Result<StageDef, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    profile_stage_from_text(&text, &path.display().to_string())
}

/// The first stage of a profile's text.
pub fn profile_stage_from_text(text: &str, source: &str) -> Result<StageDef, String> {
    let mut pipeline = crate::pipeline::from_toml(text, source).map_err(|e| e.to_string())?;
    Ok(pipeline.stages.remove(0))
}

/// The name of the stage and stream serving `version` of `entry`: the model's name for
/// its latest served version (what a request without a version runs), `model:version`
/// for the others.
pub fn version_stage_name(entry: &ModelEntry, version: u64) -> String {
    let latest = entry.versions.last().map(|v| v.version);
    if latest == Some(version) {
        entry.name.clone()
    } else {
        format!("{}:{version}", entry.name)
    }
}

/// The stage and stream of `version` of `entry` served as stage and stream `index`,
/// from its measured `profile` (whose first variant is kept), running `threads`
/// intra-op threads per worker on `device`.
pub fn model_stage(
    entry: &ModelEntry,
    version: u64,
    mut profile: StageDef,
    index: u32,
    device: DeviceKind,
    threads: usize,
) -> (StageDef, StreamDef) {
    let config = &entry.config;
    let count = u32::try_from(config.instance_count()).unwrap_or(u32::MAX).clamp(1, MAX_STARTING_REPLICAS);
    let name = version_stage_name(entry, version);
    profile.name = name.clone();
    profile.max_batch = config.max_batch_size.max(1);
    profile.replicas = count;
    profile.min_replicas = 1;
    profile.max_replicas = entry.settings.max_replicas.unwrap_or_else(|| count.saturating_mul(MAX_REPLICA_FACTOR)).max(count);
    profile.device = device;
    profile.threads = threads.max(1) as u32;
    profile.successors.clear();
    profile.predecessors.clear();
    profile.variants.truncate(1);
    profile.variants[0].name = format!("{}:{version}", entry.name);
    profile.variants[0].fan_out.clear();
    let stream = StreamDef { name, entry: index, slo_ns: (entry.settings.slo_ms * 1e6) as u64 };
    (profile, stream)
}

/// The pipeline of a repository's stages and streams (one of each per model, in
/// order), validated; the cluster may run every stage at its most replicas.
pub fn repository_pipeline(stages: Vec<StageDef>, streams: Vec<StreamDef>) -> Result<Pipeline, String> {
    let max_workers = stages.iter().map(|s| s.max_replicas).sum();
    let pipeline = Pipeline { name: "model-repository".into(), stages, streams, max_workers, hosts: Vec::new() };
    pipeline.validate("the model repository").map_err(|e| e.to_string())?;
    Ok(pipeline)
}

/// Policy parameters from the model's `dynamic_batching`, named after the model:
/// `<model>.max_queue_delay_us`, `<model>.preferred_batch_sizes`,
/// `<model>.priority_levels`. The policy forms every batch; these say what the model's
/// owner asked for.
pub fn dynamic_batching_params(model: &str, config: &ModelConfig) -> Vec<Param> {
    let Some(batching) = &config.dynamic_batching else { return Vec::new() };
    let param = |key: &str, value: String| Param { key: format!("{model}.{key}"), value };
    let mut params = vec![param("max_queue_delay_us", batching.max_queue_delay_microseconds.to_string())];
    if !batching.preferred_batch_size.is_empty() {
        let sizes: Vec<String> = batching.preferred_batch_size.iter().map(u32::to_string).collect();
        params.push(param("preferred_batch_sizes", sizes.join(",")));
    }
    if batching.priority_levels > 0 {
        params.push(param("priority_levels", batching.priority_levels.to_string()));
    }
    params
}

/// The order an ensemble's steps run in (indices into `ensemble_steps`): every step
/// after the steps whose outputs it reads, otherwise as listed; `Err` names a tensor
/// that neither the ensemble's inputs nor any step produce, or an output no step makes.
pub fn ensemble_order(config: &ModelConfig) -> Result<Vec<usize>, String> {
    let steps = &config.ensemble_steps;
    let mut known: Vec<&String> = config.input.iter().map(|t| &t.name).collect();
    let mut waiting: Vec<usize> = (0..steps.len()).collect();
    let mut order = Vec::with_capacity(steps.len());
    while !waiting.is_empty() {
        let Some(position) = waiting.iter().position(|&k| steps[k].input_map.values().all(|t| known.contains(&t))) else {
            let k = waiting[0];
            let missing: Vec<&String> = steps[k].input_map.values().filter(|t| !known.contains(t)).collect();
            return Err(format!(
                "step {} ({}) reads {missing:?}, which neither the ensemble's inputs nor any step produce",
                k + 1,
                steps[k].model_name
            ));
        };
        let k = waiting.remove(position);
        known.extend(steps[k].output_map.values());
        order.push(k);
    }
    if let Some(output) = config.output.iter().find(|t| !known.contains(&&t.name)) {
        return Err(format!("output {:?} is produced by no step", output.name));
    }
    Ok(order)
}

/// A step model's stage as [`ensemble_stages`] needs it.
#[derive(Debug, Clone)]
pub struct StepModel {
    /// The model's own stage.
    pub stage: StageDef,
    /// Whether it runs a built-in program (and so serves only as this step).
    pub builtin: bool,
}

/// The stages of an ensemble served as a chain: one per step, in [`ensemble_order`],
/// each a copy of its step model's stage (`step_model(model)`) named
/// `<ensemble>/<n>:<model>`, its batch bound the smaller of the model's and the
/// ensemble's; and the ensemble's stream. A step running a built-in program is the
/// model's only stage: it keeps the model's name and batch bound (its requests are
/// images, which the ensemble does not batch; the program batches their parts).
pub fn ensemble_stages(entry: &ModelEntry, step_model: &dyn Fn(&str) -> Option<StepModel>) -> Result<(Vec<StageDef>, StreamDef), String> {
    let config = &entry.config;
    let mut stages = Vec::new();
    for (i, k) in ensemble_order(config)?.into_iter().enumerate() {
        let step = &config.ensemble_steps[k];
        let StepModel { mut stage, builtin } =
            step_model(&step.model_name).ok_or_else(|| format!("step {} runs model {:?}, which is not served", k + 1, step.model_name))?;
        if builtin {
            stage.name = step.model_name.clone();
        } else {
            stage.name = step_stage_name(&entry.name, i + 1, &step.model_name);
            stage.max_batch = stage.max_batch.min(config.max_batch_size.max(1));
        }
        stages.push(stage);
    }
    let stream = StreamDef { name: entry.name.clone(), entry: 0, slo_ns: (entry.settings.slo_ms * 1e6) as u64 };
    Ok((stages, stream))
}

/// The name of an ensemble's step stage that runs a copy of a served model:
/// `ENSEMBLE/N:MODEL` (N counts the steps in data order from 1).
pub fn step_stage_name(ensemble: &str, step: usize, model: &str) -> String {
    format!("{ensemble}/{step}:{model}")
}

/// The model a step stage runs, when `stage` is named as [`step_stage_name`] names one.
pub fn step_stage_model(stage: &str) -> Option<&str> {
    let (ensemble_and_step, model) = stage.rsplit_once(':')?;
    let (_, step) = ensemble_and_step.rsplit_once('/')?;
    step.parse::<usize>().ok().map(|_| model)
}

/// Link consecutive stages of `stages[from..]` into a chain (each feeding the next).
pub fn link_chain(stages: &mut [StageDef], from: usize) {
    let places: Vec<usize> = (from..stages.len()).collect();
    link_places(stages, &places);
}

/// Chain the stages at `places`, in that order (a model's stages wherever they sit:
/// one, or an ensemble's steps), each feeding the next.
pub fn link_places(stages: &mut [StageDef], places: &[usize]) {
    for (i, &place) in places.iter().enumerate() {
        stages[place].predecessors = if i > 0 { vec![places[i - 1] as u32] } else { Vec::new() };
        stages[place].successors = places.get(i + 1).map(|&next| vec![next as u32]).unwrap_or_default();
    }
}

/// A repository as the simulator runs it.
#[derive(Debug, Clone)]
pub struct SimulatedRepository {
    /// Every model that has a profile for the device, as one pipeline.
    pub pipeline: Pipeline,
    /// The models' policy parameters.
    pub params: Vec<Param>,
    /// The models left out, each with the reason (no profile: serve the repository
    /// once on that device, or put a `profile.toml` beside the model).
    pub left_out: Vec<String>,
}

/// A repository ready to simulate: every servable ONNX model that has a profile for
/// `store`'s device; `Err` when none has, listing why for each.
pub fn simulated_repository(dirs: &[PathBuf], store: &ProfileStore) -> Result<SimulatedRepository, String> {
    let mut repository = super::scan(dirs).map_err(|e| e.to_string())?;
    repository.complete_from_graphs();
    let mut problems: Vec<String> = repository.errors().map(|e| e.to_string()).collect();
    let (mut stages, mut streams, mut params) = (Vec::new(), Vec::new(), Vec::new());
    let (ensembles, models): (Vec<&ModelEntry>, Vec<&ModelEntry>) =
        repository.ready().partition(|e| e.config.backend == super::config::Backend::Ensemble);
    // Models running a built-in program serve only as ensemble steps.
    let mut step_models: Vec<StepModel> = Vec::new();
    for entry in models {
        let Some(version) = entry.versions.last() else { continue };
        match store.find(entry, version) {
            Ok(Some((profile, _))) => {
                let (stage, stream) = model_stage(entry, version.version, profile, stages.len() as u32, DeviceKind::Cpu, store.threads);
                if entry.settings.program.is_some() {
                    step_models.push(StepModel { stage, builtin: true });
                    continue;
                }
                step_models.push(StepModel { stage: stage.clone(), builtin: false });
                stages.push(stage);
                streams.push(stream);
                params.extend(dynamic_batching_params(&entry.name, &entry.config));
            }
            Ok(None) => problems.push(format!(
                "model {:?}: no profile for {} with {} threads (serve the repository once on that device, or put `yardmaster profile`'s output in {})",
                entry.name,
                store.device,
                store.threads,
                entry.dir.join(PROFILE_FILE).display()
            )),
            Err(e) => problems.push(format!("model {:?}: {e}", entry.name)),
        }
    }
    let step_model = |model: &str| step_models.iter().find(|s| s.stage.name == model).cloned();
    for entry in ensembles {
        match ensemble_stages(entry, &step_model) {
            Ok((chain, stream)) => {
                let from = stages.len();
                stages.extend(chain);
                link_chain(&mut stages, from);
                streams.push(StreamDef { entry: from as u32, ..stream });
            }
            Err(e) => problems.push(format!("model {:?}: {e}", entry.name)),
        }
    }
    if stages.is_empty() {
        return Err(format!("no model of the repository can be simulated:\n  {}", problems.join("\n  ")));
    }
    Ok(SimulatedRepository { pipeline: repository_pipeline(stages, streams)?, params, left_out: problems })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_repository::onnx_graph::encode::tiny_model;
    use crate::model_repository::test_dir::TempDir;

    const PROFILE: &str = "name = \"m\"\nslo_ms = 10\n[[stage]]\nname = \"m\"\nmax_batch = 8\n[[stage.variant]]\nname = \"v\"\nprofile_ms = [[1, 1.0, 1.5], [8, 4.0, 5.0]]\nmemory_mib = 12\ncold_start_ms = 300\nwarm_start_ms = 30\n";

    #[test]
    fn step_stage_names_read_back_their_model() {
        let name = step_stage_name("add_twice", 2, "add_cfg");
        assert_eq!(name, "add_twice/2:add_cfg");
        assert_eq!(step_stage_model(&name), Some("add_cfg"));
        for plain in ["det", "add_cfg", "a:b", "x/y:z"] {
            assert_eq!(step_stage_model(plain), None, "{plain}");
        }
    }

    #[test]
    fn a_repository_with_profiles_becomes_one_stage_and_stream_per_model() {
        let dir = TempDir::new("stages");
        let tiny = tiny_model();
        dir.file("a/1/model.onnx", &tiny).file("a/profile.toml", PROFILE);
        dir.file("b/2/model.onnx", &tiny).file(
            "b/config.pbtxt",
            "max_batch_size: 4\ninstance_group [ { count: 2 } ]\ndynamic_batching { max_queue_delay_microseconds: 300 preferred_batch_size: [2, 4] }\nparameters { key: \"yardmaster.slo_ms\" value { string_value: \"40\" } }",
        );
        let cache = dir.0.join(".cache");
        let store = ProfileStore { dir: cache.clone(), device: "cpu".into(), threads: 1 };
        // b has no profile yet: it is left out, naming how to get one.
        let first = simulated_repository(std::slice::from_ref(&dir.0), &store).unwrap();
        assert_eq!(first.pipeline.stages.len(), 1);
        assert_eq!(first.left_out.len(), 1);
        assert!(first.left_out[0].contains("model \"b\": no profile for cpu with 1 threads"), "{:?}", first.left_out);
        // Once cached (as the server writes it), both simulate.
        let sha = sha256_of(&dir.0.join("b/2/model.onnx")).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::write(store.cached_profile_path(&sha), PROFILE).unwrap();
        let SimulatedRepository { pipeline, params, left_out } = simulated_repository(std::slice::from_ref(&dir.0), &store).unwrap();
        assert!(left_out.is_empty(), "{left_out:?}");
        let names: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let b = &pipeline.stages[1];
        assert_eq!((b.max_batch, b.replicas, b.max_replicas), (4, 2, 8));
        assert_eq!(b.variants[0].name, "b:2");
        assert_eq!(b.variants[0].profile.mean(8), 4_000_000);
        assert_eq!(pipeline.streams[1].slo_ns, 40_000_000);
        assert_eq!((pipeline.streams[1].entry, pipeline.max_workers), (1, 4 + 8));
        let keys: Vec<(&str, &str)> = params.iter().map(|p| (p.key.as_str(), p.value.as_str())).collect();
        // a has no configuration: auto-complete gave it `dynamic_batching { }`, as Triton does.
        assert_eq!(keys, [("a.max_queue_delay_us", "0"), ("b.max_queue_delay_us", "300"), ("b.preferred_batch_sizes", "2,4")]);
        // An ensemble of a then b is their stages again, as a chain with its own stream.
        dir.file("both/1/.keep", "").file(
            "both/config.pbtxt",
            "platform: \"ensemble\"\nmax_batch_size: 2\ninput [ { name: \"in\" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: \"out\" data_type: TYPE_FP32 dims: [ 4 ] } ]\nensemble_scheduling { step [ { model_name: \"b\" input_map { key: \"x\" value: \"mid\" } output_map { key: \"y\" value: \"out\" } }, { model_name: \"a\" input_map { key: \"x\" value: \"in\" } output_map { key: \"y\" value: \"mid\" } } ] }",
        );
        let with_ensemble = simulated_repository(std::slice::from_ref(&dir.0), &store).unwrap();
        let names: Vec<&str> = with_ensemble.pipeline.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "both/1:a", "both/2:b"], "steps in data order: {:?}", with_ensemble.left_out);
        let chain = &with_ensemble.pipeline.stages[2];
        assert_eq!((chain.successors.clone(), chain.max_batch), (vec![3], 2));
        assert_eq!(with_ensemble.pipeline.streams[2].entry, 2);
        // With no profile at all, nothing can be simulated.
        let empty = TempDir::new("stages-empty");
        empty.file("c/1/model.onnx", &tiny);
        let elsewhere = ProfileStore { dir: empty.0.join(".cache"), ..store };
        let none = simulated_repository(std::slice::from_ref(&empty.0), &elsewhere).unwrap_err();
        assert!(none.contains("model \"c\": no profile"), "{none}");
    }
}
