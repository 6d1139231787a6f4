//! The check's second scenario, the *repository cluster*: what
//! `yardmaster serve --model-repository` makes of a Triton model repository — several
//! independent one-stage models, each its own stream, and an ensemble served as a
//! chain entered by its own stream — built as
//! [`yardmaster_formats::model_repository::stages`] builds it, and changed under the
//! running engine as models are unloaded and loaded ([`Engine::reconfigure`]).
//!
//! The run ([`RECONFIGURATIONS`]): at [`UNLOAD_AT`] model `yolo`, the first stream's,
//! is unloaded just as a burst of its requests arrived (its stage stays in place,
//! *offline*: no replica allowed; the host drops what was queued there); at
//! [`LOAD_AT`] a new model, `whisper`, is appended (a new stage and stream); at
//! [`RELOAD_AT`] `yolo` is loaded again. The offline window outlasts the periodic
//! planners of the shipped policies (the Nexus planner's 5 s epoch, for one), so each
//! plans at least once with a stage offline. Requests arrive on every stream that
//! exists at the time, `yolo`'s included while it is offline (the engine fails them
//! at once, as it does for a model out of service). Each change hands the policy a
//! fresh instance initialised with the new configuration and replays the requests it
//! held.
//!
//! [`Engine::reconfigure`]: yardmaster_engine::Engine::reconfigure

use yardmaster_engine::{Pipeline, StageDef, StreamDef, Submission};
use yardmaster_formats::model_repository::stages::{link_chain, repository_pipeline, MAX_REPLICA_FACTOR};

use super::scripted::MS;
use super::CheckOptions;

/// The models' measured profiles, as `yardmaster profile` writes them (the
/// repository's configuration adds the batch bound, the replicas and the SLO). Each
/// profile's mean is `base + per_item · batch` — resnet 2 + 1 ms, bert 6 ms (batch 1
/// only), yolo 4 + 3 ms, whisper 10 + 5 ms — its tail 25 % more; a worker starts in
/// 50 ms.
const PROFILES: &str = r#"
name = "profiles"
slo_ms = 100

[[stage]]
name = "resnet"
max_batch = 8
[[stage.variant]]
name = "resnet"
profile_ms = [[1, 3, 3.75], [2, 4, 5], [4, 6, 7.5], [8, 10, 12.5]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "bert"
max_batch = 1
[[stage.variant]]
name = "bert"
profile_ms = [[1, 6, 7.5]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "yolo"
max_batch = 4
[[stage.variant]]
name = "yolo"
profile_ms = [[1, 7, 8.75], [2, 10, 12.5], [4, 16, 20]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "whisper"
max_batch = 4
[[stage.variant]]
name = "whisper"
profile_ms = [[1, 15, 18.75], [2, 20, 25], [4, 30, 37.5]]
memory_mib = 256
cold_start_ms = 50
warm_start_ms = 50
"#;

/// One model of the repository, as its `config.pbtxt` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    /// Its name (and its stage's and stream's).
    pub name: &'static str,
    /// `max_batch_size`.
    pub max_batch: u32,
    /// `instance_group`'s count: the stage's starting replicas.
    pub instances: u32,
    /// Its SLO (`yardmaster.slo_ms`).
    pub slo_ms: u64,
}

/// The independent models served from the start, in repository order: the first
/// (`yolo`, whose stream is the first) is the one unloaded, and `bert` takes no batch.
pub const MODELS: [Model; 3] = [
    Model { name: "yolo", max_batch: 4, instances: 2, slo_ms: 200 },
    Model { name: "resnet", max_batch: 8, instances: 1, slo_ms: 100 },
    Model { name: "bert", max_batch: 1, instances: 1, slo_ms: 50 },
];

/// The ensemble: `caption`, whose steps run `resnet` then `bert`, a batch of 4 at
/// most, 300 ms end to end.
pub const ENSEMBLE: Model = Model { name: "caption", max_batch: 4, instances: 1, slo_ms: 300 };

/// The models [`ENSEMBLE`]'s steps run, in order.
pub const ENSEMBLE_STEPS: [&str; 2] = ["resnet", "bert"];

/// The model loaded at [`LOAD_AT`], appended after everything served before.
pub const LOADED: Model = Model { name: "whisper", max_batch: 4, instances: 1, slo_ms: 1_000 };

/// The model unloaded at [`UNLOAD_AT`] and loaded again at [`RELOAD_AT`]: the first
/// stream's, which policies that plan for one stream take as the pipeline's.
pub const UNLOADED: &str = "yolo";

/// When [`UNLOADED`] is unloaded (just after a burst of its requests arrived).
pub const UNLOAD_AT: u64 = 400 * MS;
/// When [`LOADED`] is loaded.
pub const LOAD_AT: u64 = 600 * MS;
/// When [`UNLOADED`] is loaded again.
pub const RELOAD_AT: u64 = 6_000 * MS;
/// Steady arrivals are spread over this long from the start.
pub const ARRIVALS_FOR: u64 = 7_000 * MS;

/// What the repository serves at some point of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Whether [`UNLOADED`] is out of service (its stage offline).
    pub unloaded: bool,
    /// Whether [`LOADED`] was loaded (its stage and stream appended).
    pub loaded: bool,
}

impl Served {
    /// What is served at the start: [`MODELS`] and [`ENSEMBLE`].
    pub const START: Served = Served { unloaded: false, loaded: false };

    /// The pipeline serving it: one stage and stream per model of [`MODELS`], then
    /// [`ENSEMBLE`]'s chain and stream, then [`LOADED`]'s when loaded; at most every
    /// stage at its most replicas (as [`repository_pipeline`] sizes a repository).
    pub fn pipeline(self) -> Pipeline {
        let mut stages = Vec::new();
        let mut streams = Vec::new();
        for model in &MODELS {
            let (mut stage, stream) = model_stage(model, stages.len() as u32);
            if self.unloaded && model.name == UNLOADED {
                stage.replicas = 0;
                stage.min_replicas = 0;
                stage.max_replicas = 0;
            }
            stages.push(stage);
            streams.push(stream);
        }
        let from = stages.len();
        for (i, step) in ENSEMBLE_STEPS.iter().enumerate() {
            let model = MODELS.iter().find(|m| m.name == *step).expect("an ensemble step runs a listed model");
            let (mut stage, _) = model_stage(model, 0);
            stage.name = format!("{}/{}:{step}", ENSEMBLE.name, i + 1);
            stage.max_batch = stage.max_batch.min(ENSEMBLE.max_batch);
            stages.push(stage);
        }
        link_chain(&mut stages, from);
        streams.push(StreamDef { name: ENSEMBLE.name.into(), entry: from as u32, slo_ns: ENSEMBLE.slo_ms * MS });
        if self.loaded {
            let (stage, stream) = model_stage(&LOADED, stages.len() as u32);
            stages.push(stage);
            streams.push(stream);
        }
        repository_pipeline(stages, streams).expect("the repository cluster is valid")
    }

    /// The streams whose entry stage is online, in order.
    pub fn online_streams(self) -> Vec<u32> {
        let pipeline = self.pipeline();
        let online = |s: &&StreamDef| pipeline.stages[s.entry as usize].max_replicas > 0;
        pipeline.streams.iter().enumerate().filter(|(_, s)| online(s)).map(|(i, _)| i as u32).collect()
    }
}

/// The repository cluster as served at the start ([`Served::START`]).
pub fn pipeline() -> Pipeline {
    Served::START.pipeline()
}

/// A change of the served repository during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconfiguration {
    /// When it happens.
    pub at: u64,
    /// Why, as the server would say it.
    pub why: &'static str,
    /// What is served from then on.
    pub served: Served,
}

/// The run's changes, in time order: [`UNLOADED`] unloaded, [`LOADED`] loaded,
/// [`UNLOADED`] loaded again.
pub const RECONFIGURATIONS: [Reconfiguration; 3] = [
    Reconfiguration { at: UNLOAD_AT, why: "model yolo unloaded", served: Served { unloaded: true, loaded: false } },
    Reconfiguration { at: LOAD_AT, why: "model whisper loaded", served: Served { unloaded: true, loaded: true } },
    Reconfiguration { at: RELOAD_AT, why: "model yolo loaded again", served: Served { unloaded: false, loaded: true } },
];

/// A model's stage and stream, served as stage and stream `index`, as
/// `yardmaster_formats::model_repository::stages::model_stage` makes them: its profile,
/// `max_batch` as the batch bound, `instances` replicas at start, at least one and at
/// most [`MAX_REPLICA_FACTOR`] times that.
fn model_stage(model: &Model, index: u32) -> (StageDef, StreamDef) {
    let profiles = yardmaster_formats::pipeline::from_toml(PROFILES, "the repository's profiles").expect("the profiles are valid");
    let mut stage = profiles.stages.into_iter().find(|s| s.name == model.name).expect("every model has a profile");
    stage.max_batch = model.max_batch;
    stage.replicas = model.instances;
    stage.min_replicas = 1;
    stage.max_replicas = model.instances * MAX_REPLICA_FACTOR;
    let stream = StreamDef { name: model.name.into(), entry: index, slo_ns: model.slo_ms * MS };
    (stage, stream)
}

/// The scenario's requests, sorted by send time (requests sent at the same time keep
/// the order they are listed in here): steady arrivals over the streams of the start,
/// in turn, for [`ARRIVALS_FOR`] ([`UNLOADED`]'s included while it is offline); at
/// each change of [`RECONFIGURATIONS`], sent just before it at
/// the same instant, a burst over the streams served then (so the policy holds
/// requests the hand-over replays), and at [`UNLOAD_AT`] a larger burst on
/// [`UNLOADED`]'s stream (so some are still queued when it goes offline); and
/// [`LOADED`]'s stream from 10 ms after it was loaded (before its first worker is
/// ready). Each request is due its stream's SLO after it was sent.
pub fn arrivals(options: &CheckOptions) -> Vec<Submission> {
    let start = pipeline();
    let mut rng = options.seed.max(1);
    let mut next = || {
        let (state, value) = yardmaster_sdk::splitmix64(rng);
        rng = state;
        (value >> 11) as f64 / (1u64 << 53) as f64
    };
    let total = options.requests.max(40);
    let (unload_burst, change_burst, late) = (total / 10, total / 20, total / 10);
    let steady = total - unload_burst - change_burst * RECONFIGURATIONS.len() as u32 - late;
    let every = Served { unloaded: false, loaded: true }.pipeline();
    let make = |stream: u32, sent_at: u64| Submission {
        stream,
        sent_at,
        deadline: sent_at + every.streams[stream as usize].slo_ns,
        priority: 0,
        input_size: 64,
        expected_tokens: 0,
        ..Submission::default()
    };
    let mut requests = Vec::with_capacity(total as usize);
    let gap = ARRIVALS_FOR as f64 / steady as f64;
    let mut t = 0u64;
    for i in 0..steady {
        t += (-(1.0 - next()).ln() * gap) as u64 + 1;
        requests.push(make(i % start.streams.len() as u32, t));
    }
    let mut served = Served::START;
    for change in &RECONFIGURATIONS {
        let online = served.online_streams();
        requests.extend((0..change_burst as usize).map(|k| make(online[k % online.len()], change.at)));
        served = change.served;
    }
    let unloaded = start.streams.iter().position(|s| s.name == UNLOADED).expect("the unloaded model has a stream") as u32;
    requests.extend((0..unload_burst).map(|_| make(unloaded, UNLOAD_AT)));
    let loaded = start.streams.len() as u32;
    let from = LOAD_AT + 10 * MS;
    let spacing = (ARRIVALS_FOR.saturating_sub(from) / late as u64).max(1);
    requests.extend((0..late as u64).map(|k| make(loaded, from + k * spacing)));
    requests.sort_by_key(|s| s.sent_at);
    requests
}
