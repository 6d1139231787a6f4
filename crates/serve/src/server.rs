//! A whole server in one value: what `yardmaster serve` runs, and what the main job,
//! the serving benchmark and the end-to-end tests start in-process. [`Server::start`]
//! loads ONNX Runtime and the policy, starts the serving stack (engine actor, ONNX
//! workers, KServe backend), optionally a trace capture, and brings the transports up
//! with Prometheus text at `/metrics`, and the admin API ([`super::admin`]) when it is
//! configured; [`Server::stop`] stops accepting, fails what is
//! still in flight exactly once, and stops the engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use yardmaster_dataplane::{ModelCache, ModelCatalog, Runtime, RuntimeConfig, WorkerContext};

use super::ab::Arms;
use super::admin::Admin;
use super::api::{Api, MetricsRenderer};
use super::backend::Codec;
use super::builtin_repository::BuiltinRepository;
use super::capture::Recorder;
use super::config::{RemotePlacement, ServeConfig};
use super::executor::{Placement, ServeActor, ServeHandle};
use super::listeners::Listeners;
use super::membership::{Cluster, ClusterLink, SharedStatus};
use super::model_control::{ControlMode, ControlSettings, ModelControl};
use super::prometheus;
use super::repository::{self, LoadedRepository, RepositoryOptions};
use super::stack::{PolicyChoice, ServedPipeline, ServingStack};
use super::swap::Swapper;
use yardmaster_cluster::node::host_name;
use yardmaster_cluster::pool::{RemoteConfig, RemotePool};
use yardmaster_cluster::transport::Fingerprint;
use yardmaster_engine::pipeline::StageDef;
use yardmaster_engine::{Clock, Executor, Pipeline};
use yardmaster_policy::{FailureMode, Limits, Mode, PolicyLoader, Sandbox};

/// A running server.
pub struct Server {
    /// The transports.
    pub listeners: Listeners,
    /// A handle to the engine actor.
    pub handle: ServeHandle,
    /// The policy's name (the `arm` label of every metric).
    pub policy: String,
    /// The models clients can address.
    pub models: Vec<String>,
    /// The device line: which device and why.
    pub device: String,
    /// Stages served on `yardmaster node`s (the config's `[[remote]]` sections).
    pub remote: Vec<RemotePlacement>,
    /// The live cluster's hosts, when serving on `yardmaster node`s (`[cluster]`).
    pub cluster: Option<SharedStatus>,
    /// The client API the transports answer with (its tracer, for one).
    pub api: Arc<Api>,
    actor: ServeActor,
    admin: Admin,
    /// Model control, when models load and unload while serving.
    control: Option<Arc<ModelControl>>,
    /// Stops the repository poll (poll mode).
    stop_polling: Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    /// Start serving `config`: the stages its `[[remote]]` sections name on those
    /// nodes, the stages `placements` name on their worker groups, the rest here.
    /// Must run inside a tokio runtime.
    pub async fn start(config: &ServeConfig, mut placements: Vec<Placement>) -> Result<Server> {
        config.validate()?;
        let ort = Runtime::init(RuntimeConfig { library: None, device: config.device_preference()? })
            .map_err(|e| anyhow!("loading ONNX Runtime: {e} (run `bash scripts/setup.sh --deps` to install it)"))?;
        let choice = ort.device_choice();
        let device = format!("{} ({})", choice.device, choice.reason);
        let context = WorkerContext { runtime: ort.clone(), cache: Arc::new(ModelCache::default()) };
        let mut options = config.engine_options();
        // `--pipeline` serves a shipped repository, laid out in the assets folder.
        let (dirs, overlay) = if config.model_repository.is_empty() {
            let choice = pipeline_choice(&config.pipeline)?;
            let dir = choice.repository.lay_out(&repository::default_profile_cache()).map_err(|e| anyhow!(e))?;
            (vec![dir], choice.overlay)
        } else {
            (config.model_repository.clone(), None)
        };
        if overlay.is_some() && config.model_control_mode != ControlMode::None {
            return Err(anyhow!(
                "a pipeline file's stage settings cannot be kept across model loads: serve it with --model-control-mode none"
            ));
        }
        let selected = config.load_model.clone();
        let select = move |name: &str| selected.is_empty() || selected.iter().any(|m| m == name);
        let loaded = load_repository(dirs.clone(), context.clone(), Box::new(select)).await?;
        let mut prepared = Some(loaded.prepared);
        for param in loaded.params {
            // The operator's own parameters win over the models' configurations.
            if !options.params.iter().any(|p| p.key == param.key) {
                options.params.push(param);
            }
        }
        let unavailable: Vec<(String, String)> = loaded.refused.into_iter().map(|r| (r.name, r.reason)).collect();
        let mut served = loaded.served;
        if let Some((pipeline, file)) = &overlay {
            overlay_pipeline(&mut served, pipeline, file).map_err(|e| anyhow!(e))?;
            prepared = None;
        }
        // The models clients send requests to (a built-in step is described, not served).
        let models: Vec<String> =
            served.models.iter().filter(|m| !matches!(m.codec, Codec::BuiltinStep { .. })).map(|m| m.name.clone()).collect();
        for remote in &config.remote {
            placements.push(remote_placement(remote, &served).await?);
        }
        let mut cluster = None;
        let mut host_groups = Vec::new();
        if let Some(settings) = &config.cluster {
            let threads = served.pipeline.stages.iter().map(|s| s.threads).max().unwrap_or(1);
            let link = ClusterLink::new(settings, served.catalog.clone(), threads)?;
            let wait = std::time::Duration::from_secs_f64(settings.startup_wait_secs);
            let (found, groups) = Cluster::start(link, &host_name(), settings.local_slots, wait, &mut served.pipeline).await?;
            host_groups = groups;
            cluster = Some(found);
        }
        let policy = configured_policy(&config.policy, config)?;
        let policy_name = policy.name.clone();
        let (sandbox, failure) = (policy.sandbox.clone(), policy.failure);
        let kept = prepared.as_ref().map(|_| served.clone());
        let (actor, backend) =
            ServingStack::start_cluster(served, policy, options, context.clone(), placements, host_groups).map_err(|e| anyhow!(e))?;
        let backend = Arc::new(backend.with_unavailable(unavailable));
        let handle = actor.handle();
        let cluster = cluster.map(|cluster| {
            let status = cluster.status();
            cluster.watch(handle.clone());
            status
        });
        let stop_polling = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let control = match (config.model_control_mode, kept, prepared) {
            (ControlMode::None, _, _) | (_, None, _) | (_, _, None) => None,
            (mode, Some(served), Some(prepared)) => {
                let settings = ControlSettings {
                    dirs,
                    options: RepositoryOptions::default(),
                    operator_params: config.policy_params(),
                    unload_timeout: std::time::Duration::from_secs_f64(config.unload_timeout_secs),
                };
                let control = Arc::new(ModelControl::new(settings, context, handle.clone(), backend.clone(), served, prepared));
                backend.set_controller(control.clone());
                if mode == ControlMode::Poll {
                    start_polling(control.clone(), config.repository_poll_secs, stop_polling.clone());
                }
                Some(control)
            }
        };
        let watchdog = config.watchdog;
        handle.inspect(move |engine| engine.executor().borrow().set_watchdog(watchdog)).map_err(|e| anyhow!(e))?;
        if let Some(path) = &config.capture {
            start_capture(&handle, path)?;
        }
        let metrics_handle = handle.clone();
        let metrics_backend = backend.clone();
        let gpu = ort.device();
        let cluster_metrics = cluster.clone();
        let renderer: MetricsRenderer = Arc::new(move || {
            let mut text = metrics_handle.inspect_arms(prometheus::render_arms).unwrap_or_else(|e| format!("# {e}\n"));
            if let Some(status) = &cluster_metrics {
                let reports = metrics_handle.inspect(|engine| engine.host_reports()).unwrap_or_default();
                text.push_str(&prometheus::render_cluster(&status.lock().unwrap_or_else(|p| p.into_inner()), &reports));
            }
            let starts = metrics_handle.inspect(|engine| {
                let hosts: Vec<String> = engine.host_reports().into_iter().map(|r| r.def.name).collect();
                let (counts, misplaced) = engine.executor().borrow().worker_starts();
                prometheus::render_worker_starts(&counts, misplaced, &hosts)
            });
            text.push_str(&starts.unwrap_or_default());
            text.push_str(&prometheus::render_gpu_memory(gpu));
            text.push_str(&metrics_backend.triton_metrics());
            text
        });
        let mut api = Api::new(backend)
            .with_metrics(renderer)
            .with_max_body(config.max_body_bytes)
            .with_max_in_flight(config.max_in_flight)
            .with_trace_file(config.trace_file.clone())
            .with_cuda_device(matches!(ort.device(), yardmaster_dataplane::Device::Cuda(_)));
        if let Some(status) = &cluster {
            let (status, engine) = (status.clone(), handle.clone());
            api = api.with_cluster(Arc::new(move || {
                let reports = engine.inspect(|engine| engine.host_reports()).unwrap_or_default();
                super::membership::cluster_view(&status.lock().unwrap_or_else(|p| p.into_inner()), &reports)
            }));
        }
        let api = Arc::new(api);
        let listeners = Listeners::start(&config.listen_options(), Arc::clone(&api)).await?;
        let admin = Admin::start(&config.admin, Arc::new(Swapper::new(handle.clone(), sandbox, failure))).await?;
        let remote = config.remote.clone();
        Ok(Server { listeners, handle, policy: policy_name, models, device, remote, cluster, api, actor, admin, control, stop_polling })
    }

    /// The address clients use (TCP and UDP share the port).
    pub fn address(&self) -> std::net::SocketAddr {
        self.listeners.address()
    }

    /// Where the admin API listens, when it runs.
    pub fn admin_address(&self) -> Option<std::net::SocketAddr> {
        self.admin.address
    }

    /// The lines an operator sees at start: what is served, where, and how to stop.
    pub fn banner(&self) -> String {
        let mut text = banner(&self.listeners, self.admin.address, &self.models, &self.policy, &self.device, &self.remote);
        if let Some(status) = &self.cluster {
            let status = status.lock().unwrap_or_else(|p| p.into_inner());
            for host in &status.hosts {
                let address = host.address.map(|a| format!(" at {a}")).unwrap_or_default();
                text.push_str(&format!("host {} ({}){address}: {} slot(s)\n", host.name, host.state.name(), host.slots));
            }
        }
        text
    }

    /// One line: requests by outcome so far.
    /// (Summed over the arms of an A/B run, with one line per arm after it.)
    pub fn summary(&self) -> String {
        self.handle.inspect_arms(summary).unwrap_or_else(|e| e.to_string())
    }

    /// Model control, when models load and unload while serving.
    pub fn model_control(&self) -> Option<&Arc<ModelControl>> {
        self.control.as_ref()
    }

    /// Stop accepting, end the capture, fail what is in flight once, stop the engine.
    pub async fn stop(self) {
        self.stop_polling.store(true, std::sync::atomic::Ordering::Release);
        self.admin.stop().await;
        self.listeners.stop().await;
        let _ = self.handle.capture(None);
        let actor = self.actor;
        let _ = tokio::task::spawn_blocking(move || actor.shutdown("the server is shutting down")).await;
    }
}

/// The lines an operator sees at start: the models, the policy and the device, which
/// stages run on which node, where the transports listen, where the metrics are, and
/// the admin API when it runs.
pub fn banner(
    listeners: &Listeners,
    admin: Option<std::net::SocketAddr>,
    models: &[String],
    policy: &str,
    device: &str,
    remote: &[RemotePlacement],
) -> String {
    let address = listeners.address();
    let mut transports = Vec::new();
    if listeners.http1.is_some() {
        transports.push("HTTP/1.1 over TCP".to_string());
    }
    if let Some(cert) = &listeners.certificate {
        let how = if listeners.certificate_generated { "generated self-signed" } else { "certificate" };
        transports.push(format!("HTTP/3 over UDP ({how}: {})", cert.display()));
    }
    let grpc = listeners.grpc.map(|grpc| format!("; gRPC on {grpc}")).unwrap_or_default();
    let admin = admin.map(|admin| format!("admin API at http://{admin}/admin/\n")).unwrap_or_default();
    let nodes: String = remote
        .iter()
        .map(|r| format!("{} {} on node {}\n", if r.stages.len() == 1 { "stage" } else { "stages" }, r.stages.join(", "), r.node))
        .collect();
    let rest = if remote.is_empty() { "" } else { " (stages not placed on a node below)" };
    format!(
        "serving {} with policy {policy} on {device}{rest}\n{nodes}listening on {address} ({}){grpc}\nmetrics at http://{address}/metrics\n{admin}",
        models.join(", "),
        transports.join("; ")
    )
}

/// One line: requests by outcome so far, summed over the arms, with one line per arm
/// after it during an A/B run.
pub fn summary<C: Clock, X: Executor>(arms: &Arms<C, X>) -> String {
    let lines: Vec<(String, [u64; 5])> = arms
        .slots()
        .iter()
        .map(|slot| {
            let stats = slot.engine.accounting().summary(slot.engine.state().now()).overall;
            let o = &stats.outcomes;
            (slot.label.clone(), [stats.arrivals, o.on_time, o.late, o.dropped, o.failed])
        })
        .collect();
    let line = |n: &[u64; 5]| format!("{} requests: {} on time, {} late, {} dropped, {} failed", n[0], n[1], n[2], n[3], n[4]);
    let mut total = [0u64; 5];
    for (_, n) in &lines {
        for (t, v) in total.iter_mut().zip(n) {
            *t += v;
        }
    }
    let mut text = format!("served {}", line(&total));
    if lines.len() > 1 {
        for (arm, n) in &lines {
            text.push_str(&format!("\n  arm {arm}: {}", line(n)));
        }
    }
    text
}

/// The indices of the stages a `[[remote]]` section names, or an error naming the
/// stages `pipeline` has.
pub fn placed_stages(remote: &RemotePlacement, pipeline: &yardmaster_engine::Pipeline) -> Result<Vec<u32>> {
    let stage_names: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
    remote
        .stages
        .iter()
        .map(|name| {
            let index = stage_names
                .iter()
                .position(|s| s == name)
                .ok_or_else(|| anyhow!("[[remote]] names stage {name:?}; pipeline {:?} has {}", pipeline.name, stage_names.join(", ")))?;
            Ok(index as u32)
        })
        .collect()
}

/// Connect to the node of a `[[remote]]` section and place its stages there. The
/// node is sent the catalogue of those stages only, with this host's model paths
/// (a node on another machine needs the models at the same paths).
pub async fn remote_placement(remote: &RemotePlacement, served: &ServedPipeline) -> Result<Placement> {
    let stages = placed_stages(remote, &served.pipeline)?;
    let catalog = ModelCatalog {
        stages: (0..served.catalog.stages.len())
            .map(|s| if stages.contains(&(s as u32)) { served.catalog.stages[s].clone() } else { Vec::new() })
            .collect(),
    };
    let pin = Fingerprint::from_argument(&remote.pin).with_context(|| format!("the pin of node {}", remote.node))?;
    let mut link = RemoteConfig::new(remote.node, pin, catalog);
    link.threads = stages.iter().map(|&s| served.pipeline.stages[s as usize].threads).max().unwrap_or(1);
    let (pool, events) =
        RemotePool::connect(link).await.with_context(|| format!("connecting to node {} for {}", remote.node, remote.stages.join(", ")))?;
    Ok(Placement { stages, workers: Box::new(pool), events: events.into() })
}

/// Read the repository again every `seconds` on a thread of its own (poll mode),
/// printing each change on stderr, until `stop` is set.
fn start_polling(control: Arc<ModelControl>, seconds: f64, stop: Arc<std::sync::atomic::AtomicBool>) {
    let period = std::time::Duration::from_secs_f64(seconds);
    let spawned = std::thread::Builder::new().name("yardmaster-repository-poll".into()).spawn(move || loop {
        let until = std::time::Instant::now() + period;
        while std::time::Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50).min(period));
        }
        for line in control.poll() {
            eprintln!("repository poll: {line}");
        }
    });
    if let Err(error) = spawned {
        tracing::error!("starting the repository poll: {error}; the repository will not be followed");
    }
}

/// Load the models `select` accepts from the repositories `dirs` (profiling models on
/// first load, off the async threads), printing progress, the warnings and the refused
/// models on stderr.
pub async fn load_repository(
    dirs: Vec<PathBuf>,
    context: WorkerContext,
    select: Box<dyn Fn(&str) -> bool + Send>,
) -> Result<LoadedRepository> {
    let loaded = tokio::task::spawn_blocking(move || {
        let options = RepositoryOptions::default();
        repository::load_selected(&dirs, &context, &options, &*select, &mut |line| eprintln!("{line}"))
    })
    .await
    .context("loading the model repository")?
    .map_err(|e| anyhow!(e))?;
    // Plain lines beside the progress lines (the log would print each twice).
    for warning in &loaded.warnings {
        eprintln!("warning: {warning}");
    }
    for reason in &loaded.refused {
        eprintln!("not served: {reason}");
    }
    Ok(loaded)
}

/// What `--pipeline` names: the repository to serve and, for a pipeline file, the
/// stages it lays over PP-OCR's.
#[derive(Debug, Clone)]
pub struct PipelineChoice {
    /// The shipped repository served.
    pub repository: BuiltinRepository,
    /// A pipeline file's stages and SLO, laid over the repository's, and the file.
    pub overlay: Option<(Pipeline, String)>,
}

/// The shipped repository `--pipeline NAME` serves (laid out in the assets folder by
/// [`BuiltinRepository::lay_out`]): `ocr` (PP-OCR, the default), `tiny` (the trivial model), or a pipeline file
/// (`.toml`) whose stages `det`, `cls`, `rec` give PP-OCR's stages the operator's own
/// settings and profiles (e.g. measured on this machine's GPU with `yardmaster profile`).
pub fn pipeline_choice(name: &str) -> Result<PipelineChoice> {
    let (repository, overlay) = match name {
        file if file.ends_with(".toml") => {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading the pipeline file {file}"))?;
            let pipeline = yardmaster_formats::pipeline::from_toml(&text, file).map_err(|e| anyhow!(e.to_string()))?;
            (BuiltinRepository::Ocr, Some((pipeline, file.to_string())))
        }
        other => match BuiltinRepository::from_name(other) {
            Some(repository) => (repository, None),
            None => return Err(anyhow!("pipeline {other:?} cannot be served here: this server knows `ocr` (PP-OCR), `tiny`, and a PP-OCR pipeline file (`.toml` with stages det, cls, rec); serve your own models with --model-repository DIR (and `llm-tiny`, the tiny decoder, with `yardmaster serve --pipeline llm-tiny`)")),
        },
    };
    Ok(PipelineChoice { repository, overlay })
}

/// Lay the stages and SLO of the pipeline file `file` over `served`: each of its
/// stages replaces the settings, variants and profiles of the served stage of the same
/// name (keeping its edges and model); its first stream's SLO becomes the SLO of every
/// served stream. A stage the file names that is not served is refused.
pub fn overlay_pipeline(served: &mut ServedPipeline, file: &Pipeline, source: &str) -> std::result::Result<(), String> {
    let names: Vec<String> = served.pipeline.stages.iter().map(|s| s.name.clone()).collect();
    for stage in &file.stages {
        let place = names.iter().position(|n| *n == stage.name).ok_or_else(|| {
            format!(
                "pipeline file {source}: stage {:?} is not served (a pipeline file is served as PP-OCR: stages {})",
                stage.name,
                names.join(", ")
            )
        })?;
        let served_stage = &mut served.pipeline.stages[place];
        let spec = served.catalog.stages[place][0].clone();
        *served_stage = StageDef {
            successors: std::mem::take(&mut served_stage.successors),
            predecessors: std::mem::take(&mut served_stage.predecessors),
            ..stage.clone()
        };
        served.catalog.stages[place] = vec![spec; stage.variants.len()];
    }
    if let Some(stream) = file.streams.first() {
        for served_stream in &mut served.pipeline.streams {
            served_stream.slo_ns = stream.slo_ns;
        }
    }
    served.pipeline.max_workers = served.pipeline.stages.iter().map(|s| s.max_replicas).sum();
    served.pipeline.validate(source).map_err(|e| e.to_string())?;
    served.check()
}

/// The pipeline `--pipeline NAME` serves (see [`pipeline_choice`]), loaded on
/// `context`'s device (profiling its models there on first use).
pub fn served_pipeline(name: &str, context: &WorkerContext) -> Result<ServedPipeline> {
    let choice = pipeline_choice(name)?;
    let assets = yardmaster_dataplane::assets::assets_dir();
    let mut served = choice.repository.serve(&assets, &repository::default_profile_cache(), context).map_err(|e| anyhow!(e))?;
    if let Some((pipeline, file)) = &choice.overlay {
        overlay_pipeline(&mut served, pipeline, file).map_err(|e| anyhow!(e))?;
    }
    Ok(served)
}

/// Start writing what the engine behind `handle` serves as a trace to `path`.
pub fn start_capture<C: Clock, X: Executor>(handle: &super::actor::ActorHandle<C, X>, path: &Path) -> Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("creating the capture file {}", path.display()))?;
    let recorder = Recorder::start(Box::new(file), &path.display().to_string()).with_context(|| format!("writing {}", path.display()))?;
    handle.capture(Some(recorder)).map_err(|e| anyhow!(e))
}

/// The policy `policy` names with the operator's `[policy]` settings of `config`: its
/// decision deadline, memory limit and failure mode.
pub fn configured_policy(policy: &str, config: &ServeConfig) -> Result<PolicyChoice> {
    let mut policy = policy_choice(policy)?;
    let settings = &config.policy_settings;
    policy.sandbox = policy.sandbox.with_limits(settings.limits(policy.sandbox.limits()).map_err(|e| anyhow!("[policy] {e}"))?);
    if let Some(failure) = settings.failure {
        policy.failure = failure;
    }
    Ok(policy)
}

/// A shipped policy by name, or a `.wasm` file (refused with the reason when it is not
/// a valid policy component), in the serve-mode sandbox with its default limits,
/// failing open.
pub fn policy_choice(policy: &str) -> Result<PolicyChoice> {
    let path = Path::new(policy);
    if !path.exists() {
        return PolicyChoice::shipped(policy).map_err(|e| anyhow!(e));
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {policy}"))?;
    let name = path.file_stem().map_or_else(|| policy.to_string(), |s| s.to_string_lossy().into_owned());
    let sandbox = Sandbox::new(Mode::Serve, Limits::default())?;
    let module = PolicyLoader::new(sandbox.clone(), PolicyLoader::default_cache_dir())
        .load(&name, &bytes)
        .map_err(|e| anyhow!("policy {policy} refused: {e}"))?;
    Ok(PolicyChoice { name, sandbox, module, failure: FailureMode::FailOpen })
}
