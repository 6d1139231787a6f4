//! `yardmaster serve` and `yardmaster load`.
//!
//! `serve` reads the configuration ([`yardmaster::serve::config`]), loads ONNX Runtime
//! and the policy, starts the serving stack (engine actor, ONNX workers, KServe
//! backend), brings HTTP/1.1 and HTTP/3 up on one port with Prometheus text at
//! `/metrics`, and serves until Ctrl-C (or `--for` seconds), then lets requests in
//! flight finish or fail once.
//!
//! `load` is the command line of the open-loop load generator
//! ([`yardmaster::serve::load`]). It turns a workload (a simulator preset at a rate, or
//! a trace) into send instants, builds one request body (from a file, or synthesised
//! from the model's metadata), prints progress while it runs and the report at the end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use yardmaster::engine::EngineOptions;
use yardmaster::policy::{FailureMode, Limits, Mode, PolicyLoader, Sandbox};
use yardmaster::serve::api::{Api, MetricsRenderer};
use yardmaster::serve::capture::Recorder;
use yardmaster::serve::client::Http1Client;
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::executor::Placement;
use yardmaster::serve::listeners::Listeners;
use yardmaster::serve::load::{self, LoadPlan, Transport};
use yardmaster::serve::stack::{PolicyChoice, ServedPipeline, ServingStack};
use yardmaster::serve::{prometheus, tls};
use yardmaster_dataplane::{ModelCache, Runtime, RuntimeConfig, WorkerContext};

/// Arguments of `yardmaster serve`.
#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// Configuration file (TOML; see the README). Without one: the PP-OCR pipeline
    /// with the edf policy on 127.0.0.1:8000.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address (overrides the file's `listen`); port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Pipeline to serve: `ocr` or `tiny` (overrides the file's `pipeline`).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Policy: a shipped name or a `.wasm` file (overrides the file's `policy`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Capture a JSON-lines trace of what is served into this file (overrides the
    /// file's `capture`).
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Serve for this many seconds, then stop (default: until Ctrl-C).
    #[arg(long = "for")]
    pub serve_for: Option<f64>,
}

/// Run `yardmaster serve`.
pub fn serve(args: &ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration `serve` runs with: the file's (or the defaults), then the flags.
pub fn serve_config(args: &ServeArgs) -> Result<ServeConfig> {
    let mut config = match &args.config {
        Some(path) => ServeConfig::load(path)?,
        None => ServeConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(pipeline) = &args.pipeline {
        config.pipeline = pipeline.clone();
    }
    if let Some(policy) = &args.policy {
        config.policy = policy.clone();
    }
    if let Some(capture) = &args.capture {
        config.capture = Some(capture.clone());
    }
    config.validate()?;
    Ok(config)
}

async fn run_serve(args: &ServeArgs) -> Result<()> {
    let config = serve_config(args)?;
    let ort = Runtime::init(RuntimeConfig { library: None, device: config.device_preference()? })
        .map_err(|e| anyhow!("loading ONNX Runtime: {e} (run `bash scripts/setup.sh --deps` to install it)"))?;
    let choice = ort.device_choice();
    eprintln!("device: {} ({})", choice.device, choice.reason);
    let context = WorkerContext { runtime: ort.clone(), cache: Arc::new(ModelCache::default()) };
    let served = match config.pipeline.as_str() {
        "ocr" => ServedPipeline::ocr(&context),
        "tiny" => ServedPipeline::tiny_in_assets(),
        other => Err(format!("pipeline {other:?} cannot be served: the server knows `ocr` (PP-OCR) and `tiny`")),
    }
    .map_err(|e| anyhow!(e))?;
    let models: Vec<String> = served.models.iter().map(|m| m.name.clone()).collect();
    let policy = policy_choice(&config.policy)?;
    let policy_name = policy.name.clone();
    let options = EngineOptions { params: config.policy_params(), ..Default::default() };
    let placements = remote_placements(&config, &served)?;
    let (actor, backend) = ServingStack::start(served, policy, options, context, placements).map_err(|e| anyhow!(e))?;
    let handle = actor.handle();
    if let Some(path) = &config.capture {
        let file = std::fs::File::create(path).with_context(|| format!("creating the capture file {}", path.display()))?;
        let recorder = Recorder::start(Box::new(file), &path.display().to_string())
            .with_context(|| format!("writing {}", path.display()))?;
        handle.capture(Some(recorder)).map_err(|e| anyhow!(e))?;
        eprintln!("capturing a trace into {}", path.display());
    }
    let metrics_handle = handle.clone();
    let arm = policy_name.clone();
    let renderer: MetricsRenderer = Arc::new(move || {
        let arm = arm.clone();
        metrics_handle
            .inspect(move |engine| prometheus::render_engine(engine, &arm))
            .unwrap_or_else(|e| format!("# {e}\n"))
    });
    let api = Arc::new(Api::new(Arc::new(backend)).with_metrics(renderer).with_max_body(config.max_body_bytes));
    let listeners = Listeners::start(&config.listen_options(), api).await?;
    let address = listeners.http1.or(listeners.http3).expect("validate keeps one transport on");
    let mut transports = Vec::new();
    if listeners.http1.is_some() {
        transports.push("HTTP/1.1 over TCP".to_string());
    }
    if let Some(cert) = &listeners.certificate {
        let how = if listeners.certificate_generated { "generated self-signed" } else { "certificate" };
        transports.push(format!("HTTP/3 over UDP ({how}: {})", cert.display()));
    }
    println!("serving {} with policy {policy_name}", models.join(", "));
    println!("listening on {address} ({})", transports.join("; "));
    println!("metrics at http://{address}/metrics; stop with Ctrl-C");
    match args.serve_for {
        Some(seconds) => tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0))).await,
        None => {
            tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        }
    }
    eprintln!("stopping: no new requests; requests in flight finish or fail");
    listeners.stop().await;
    let summary = handle
        .inspect(|engine| {
            let stats = engine.accounting().summary(engine.state().now).overall;
            format!(
                "served {} requests: {} on time, {} late, {} dropped, {} failed",
                stats.arrivals, stats.outcomes.on_time, stats.outcomes.late, stats.outcomes.dropped, stats.outcomes.failed
            )
        })
        .unwrap_or_else(|e| e.to_string());
    let _ = handle.capture(None);
    tokio::task::spawn_blocking(move || actor.shutdown("the server is shutting down")).await?;
    println!("{summary}");
    Ok(())
}

/// A shipped policy by name, or a `.wasm` file.
fn policy_choice(policy: &str) -> Result<PolicyChoice> {
    let path = std::path::Path::new(policy);
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

/// Placements of stages on remote nodes, from the configuration.
fn remote_placements(config: &ServeConfig, _served: &ServedPipeline) -> Result<Vec<Placement>> {
    if !config.remote.is_empty() {
        bail!("remote placements are not supported by this build");
    }
    Ok(Vec::new())
}

/// Arguments of `yardmaster load`.
#[derive(clap::Args, Clone)]
pub struct LoadArgs {
    /// The server (HTTP/1.1 on TCP, HTTP/3 on UDP, same port).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub address: SocketAddr,
    /// The model (pipeline stream) to call.
    #[arg(long, default_value = "ocr")]
    pub model: String,
    /// Transport: `h3` (HTTP/3 over QUIC) or `h1` (HTTP/1.1).
    #[arg(long, default_value = "h3", value_parser = ["h3", "h1"])]
    pub transport: String,
    /// Certificate to trust for HTTP/3 (PEM); by default the one `yardmaster serve`
    /// generated in its state directory.
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Name to check the server's certificate against.
    #[arg(long, default_value = "localhost")]
    pub server_name: String,
    /// HTTP/1.1 connections to spread requests over.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Workload: a preset (poisson, wikipedia, twitter, azure-functions) at --rate, or
    /// `rates:FILE` or `trace:FILE` (a JSON-lines trace, e.g. one captured by `serve`).
    #[arg(long, default_value = "poisson")]
    pub workload: String,
    /// Mean request rate of a preset workload, requests per second.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Seconds of arrivals.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seed of the arrival process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A request counts as good when answered within this many milliseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_ms: f64,
    /// The infer request body (KServe v2 JSON); synthesised from the model's metadata
    /// when absent.
    #[arg(long)]
    pub body: Option<PathBuf>,
}

/// Run `yardmaster load`.
pub fn load(args: &LoadArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_load(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_load(args: &LoadArgs) -> Result<()> {
    if args.duration <= 0.0 {
        bail!("--duration must be positive");
    }
    let workload = yardmaster::sim::WorkloadSpec::parse(&args.workload, args.rate, 1.0)?;
    let arrivals: Vec<_> = workload.arrivals((args.duration * 1e9) as u64, args.seed)?.collect();
    if arrivals.is_empty() {
        bail!("the workload has no arrivals in {} s", args.duration);
    }
    let body = match &args.body {
        Some(path) => Bytes::from(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?),
        None => synthesise_body(args.address, &args.model).await?,
    };
    let transport = if args.transport == "h1" {
        Transport::Http1 { connections: args.connections.max(1) }
    } else {
        let cert = match &args.cert {
            Some(path) => path.clone(),
            None => yardmaster::serve::config::ServeConfig::default().state_dir().join("tls/cert.pem"),
        };
        let trusted = tls::read_certificates(&cert)
            .with_context(|| format!("the server's certificate (give it with --cert); tried {}", cert.display()))?;
        Transport::Http3 { server_name: args.server_name.clone(), trusted }
    };
    let plan = LoadPlan {
        address: args.address,
        model: args.model.clone(),
        body,
        json_length: None,
        slo: Duration::from_secs_f64(args.slo_ms / 1e3),
        transport,
    };
    let total = arrivals.len() as u64;
    eprintln!(
        "sending {total} requests to {} over {} for {:.0} s ({} at {} req/s)",
        args.model,
        if args.transport == "h1" { "HTTP/1.1" } else { "HTTP/3" },
        args.duration,
        args.workload,
        args.rate
    );
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let report = load::run(&plan, arrivals, |sent, answered| {
        let line = format!("  sent {sent}/{total}, answered {answered}");
        if terminal {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    })
    .await?;
    if terminal {
        eprintln!();
    }
    print!("{}", report.render());
    Ok(())
}

/// A request body for `model`, made from its metadata: every input filled with a
/// small constant tensor (variable dimensions taken as 8; an image-like UINT8 input
/// [-1,-1,3] as 64×64×3).
async fn synthesise_body(address: SocketAddr, model: &str) -> Result<Bytes> {
    let mut client = Http1Client::connect(address)
        .await
        .with_context(|| format!("reading {model}'s metadata over HTTP/1.1 from {address} (or give --body)"))?;
    let reply = client.request(Method::GET, &format!("/v2/models/{model}"), &HeaderMap::new(), Bytes::new()).await?;
    if reply.status != StatusCode::OK {
        bail!("model metadata for {model}: {} {}", reply.status, String::from_utf8_lossy(&reply.body));
    }
    let metadata: Value = serde_json::from_slice(&reply.body).context("model metadata is not JSON")?;
    Ok(Bytes::from(serde_json::to_vec(&body_from_metadata(&metadata)?)?))
}

/// The synthetic request for a model's metadata (see [`synthesise_body`]).
fn body_from_metadata(metadata: &Value) -> Result<Value> {
    let inputs = metadata["inputs"].as_array().ok_or_else(|| anyhow!("model metadata has no inputs"))?;
    let mut tensors = Vec::new();
    for input in inputs {
        let name = input["name"].as_str().ok_or_else(|| anyhow!("an input has no name"))?;
        let datatype = input["datatype"].as_str().ok_or_else(|| anyhow!("input {name} has no datatype"))?;
        let declared: Vec<i64> = input["shape"].as_array().into_iter().flatten().filter_map(Value::as_i64).collect();
        let image = datatype == "UINT8" && declared.len() == 3 && declared[2] == 3;
        let shape: Vec<i64> = declared.iter().map(|&d| if d >= 0 { d } else if image { 64 } else { 8 }).collect();
        let count: i64 = shape.iter().product();
        let data: Value = match datatype {
            "BYTES" => json!(vec!["x"; count as usize]),
            "BOOL" => json!(vec![false; count as usize]),
            "FP16" | "FP32" | "FP64" => json!(vec![0.5; count as usize]),
            _ => json!(vec![1; count as usize]),
        };
        tensors.push(json!({"name": name, "datatype": datatype, "shape": shape, "data": data}));
    }
    Ok(json!({ "inputs": tensors }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_bodies_follow_the_metadata() {
        let metadata = json!({"name": "m", "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]},
        ]});
        let body = body_from_metadata(&metadata).unwrap();
        assert_eq!(body["inputs"][0]["shape"], json!([8, 4]));
        assert_eq!(body["inputs"][0]["data"].as_array().unwrap().len(), 32);
        assert_eq!(body["inputs"][1]["shape"], json!([64, 64, 3]));
        let request = yardmaster::serve::kserve::decode_request(&serde_json::to_vec(&body).unwrap(), None).unwrap();
        assert_eq!(request.inputs.len(), 2, "the codec accepts what the generator makes");
        assert!(body_from_metadata(&json!({})).is_err());
    }
}
