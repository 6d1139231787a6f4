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
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use yardmaster::serve::client::Http1Client;
use yardmaster::serve::config::ServeConfig;
use yardmaster::serve::llm::{is_llm_pipeline, LlmServer};
use yardmaster::serve::load::{self, LoadPlan, Transport};
use yardmaster::serve::server::Server;
use yardmaster::serve::tls;

/// Run `future` on a multi-threaded tokio runtime: its error, or a runtime that cannot
/// start, is printed and fails the command.
pub(crate) fn run_async(future: impl std::future::Future<Output = Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(future) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Arguments of `yardmaster serve`.
#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// Configuration file (TOML; see docs/serving.md). Without one: the PP-OCR pipeline
    /// with the edf policy on 127.0.0.1:8000.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address (overrides the file's `listen`); port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Where KServe v2 over gRPC listens (overrides the file's `grpc_listen`; default:
    /// the listen address's host on the next port, 8001 beside 8000 as Triton).
    #[arg(long = "grpc-listen", value_name = "ADDRESS", conflicts_with = "no_grpc")]
    pub grpc_listen: Option<SocketAddr>,
    /// Serve no gRPC (overrides the file's `grpc`).
    #[arg(long = "no-grpc")]
    pub no_grpc: bool,
    /// Pipeline to serve: `ocr`, `tiny`, or `llm-tiny` (the tiny decoder, scheduled by
    /// `calm` unless --policy says otherwise) (overrides the file's `pipeline`).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Serve every model of this Triton model repository instead of a pipeline: one
    /// stage and one stream per model, profiled on first load (repeat for several
    /// directories; overrides the file's `model_repository`; see docs/model-repository.md).
    #[arg(long = "model-repository", value_name = "DIR")]
    pub model_repository: Vec<PathBuf>,
    /// Whether models load and unload while serving: `none` (the default: the
    /// repository is read once), `explicit` (clients load and unload with
    /// `POST /v2/repository/models/{m}/load` and `…/unload`) or `poll` (as explicit,
    /// and the repository is followed: new and changed models load, removed ones
    /// unload) (overrides the file's `model_control_mode`).
    #[arg(long = "model-control-mode", value_name = "MODE")]
    pub model_control_mode: Option<yardmaster::serve::model_control::ControlMode>,
    /// With `explicit` or `poll`: a model to load at start (repeat for several; none
    /// given: every model) (overrides the file's `load_model`).
    #[arg(long = "load-model", value_name = "MODEL")]
    pub load_model: Vec<String>,
    /// With `poll`: seconds between two reads of the repository (default 15).
    #[arg(long = "repository-poll-secs", value_name = "SECONDS")]
    pub repository_poll_secs: Option<f64>,
    /// Policy: a shipped name or a `.wasm` file (overrides the file's `policy`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Capture a JSON-lines trace of what is served into this file (overrides the
    /// file's `capture`).
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Where Triton's trace extension writes traced requests (overrides the file's
    /// `trace_file`); tracing stays off until a client sets `trace_level`.
    #[arg(long = "trace-file")]
    pub trace_file: Option<PathBuf>,
    /// Serve for this many seconds, then stop (default: until Ctrl-C).
    #[arg(long = "for")]
    pub serve_for: Option<f64>,
    /// Run on a cluster of `yardmaster node`s: `dns:NAME:PORT` (a headless Service's
    /// name, resolved again every few seconds) or `static:IP:PORT,…` (overrides the
    /// file's `[cluster] nodes`; see docs/kubernetes.md).
    #[arg(long, value_name = "SOURCE")]
    pub nodes: Option<String>,
    /// The cluster CA (PEM) whose signature every node's certificate must carry
    /// (overrides the file's `[cluster] ca`).
    #[arg(long = "cluster-ca", value_name = "FILE")]
    pub cluster_ca: Option<PathBuf>,
}

/// Run `yardmaster serve`.
pub fn serve(args: &ServeArgs) -> ExitCode {
    run_async(async { run_serve(args).await.map(|()| ExitCode::SUCCESS) })
}

/// The configuration `serve` runs with: the file's (or the defaults), then the flags.
pub fn serve_config(args: &ServeArgs) -> Result<ServeConfig> {
    let mut config = match &args.config {
        Some(path) => ServeConfig::load(path)?,
        None => ServeConfig::default(),
    };
    if let Some(grpc) = args.grpc_listen {
        config.grpc = true;
        config.grpc_listen = Some(grpc);
    }
    if args.no_grpc {
        config.grpc = false;
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(nodes) = &args.nodes {
        let cluster = config.cluster.get_or_insert_with(|| yardmaster::serve::config::ClusterConfig::new(nodes));
        cluster.nodes = nodes.clone();
    }
    if let Some(ca) = &args.cluster_ca {
        match &mut config.cluster {
            Some(cluster) => cluster.ca = Some(ca.clone()),
            None => anyhow::bail!("--cluster-ca needs nodes to trust: give --nodes (or a [cluster] section)"),
        }
    }
    if let Some(pipeline) = &args.pipeline {
        config.pipeline = pipeline.clone();
    }
    if !args.model_repository.is_empty() {
        config.model_repository = args.model_repository.clone();
    }
    if let Some(mode) = args.model_control_mode {
        config.model_control_mode = mode;
    }
    if !args.load_model.is_empty() {
        config.load_model = args.load_model.clone();
    }
    if let Some(seconds) = args.repository_poll_secs {
        config.repository_poll_secs = seconds;
    }
    if let Some(policy) = &args.policy {
        config.policy = policy.clone();
    }
    if let Some(trace_file) = &args.trace_file {
        config.trace_file = Some(trace_file.clone());
    }
    if let Some(capture) = &args.capture {
        config.capture = Some(capture.clone());
    }
    config.validate()?;
    Ok(config)
}

/// Either server `serve` can run: a batch pipeline or an LLM pipeline.
enum Running {
    Pipeline(Server),
    Llm(LlmServer),
}

impl Running {
    fn banner(&self) -> String {
        match self {
            Running::Pipeline(server) => server.banner(),
            Running::Llm(server) => server.banner(),
        }
    }

    fn summary(&self) -> String {
        match self {
            Running::Pipeline(server) => server.summary(),
            Running::Llm(server) => server.summary(),
        }
    }

    async fn stop(self) {
        match self {
            Running::Pipeline(server) => server.stop().await,
            Running::Llm(server) => server.stop().await,
        }
    }
}

async fn run_serve(args: &ServeArgs) -> Result<()> {
    let config = serve_config(args)?;
    let server = if config.model_repository.is_empty() && is_llm_pipeline(&config.pipeline) {
        Running::Llm(LlmServer::start(&config).await?)
    } else {
        Running::Pipeline(Server::start(&config, Vec::new()).await?)
    };
    print!("{}", server.banner());
    if let Some(path) = &config.capture {
        println!("capturing a trace into {}", path.display());
    }
    if args.serve_for.is_none() {
        println!("stop with Ctrl-C (or SIGTERM)");
    }
    let serve_for = async {
        match args.serve_for {
            Some(seconds) => tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0))).await,
            None => std::future::pending().await,
        }
    };
    // Ctrl-C, or SIGTERM (what service managers and `kill` send), stops gracefully, and so
    // does the end of --for.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        () = serve_for => {}
        interrupted = tokio::signal::ctrl_c() => interrupted.context("waiting for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    eprintln!("stopping: no new requests; requests in flight finish or fail");
    let summary = server.summary();
    server.stop().await;
    println!("{summary}");
    Ok(())
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
    /// Most requests out at once; arrivals past it are shed (counted, not sent), as
    /// clients that give up.
    #[arg(long, default_value_t = yardmaster::serve::load::DEFAULT_MAX_OUTSTANDING)]
    pub max_outstanding: usize,
    /// Workload: a preset (poisson, wikipedia, twitter, azure-functions, or a per-second
    /// rate replay: wikipedia-per-second, twitter-per-second, azure-functions-per-second)
    /// at --rate, or `rates:FILE` or `trace:FILE` (a JSON-lines trace, e.g. one captured
    /// by `serve`).
    #[arg(long, default_value = "poisson")]
    pub workload: String,
    /// Mean request rate of a preset workload, requests per second.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Seconds of arrivals.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seed of the arrival process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A request counts as good when answered within this many milliseconds (the
    /// default is the ocr pipeline's SLO).
    #[arg(long, default_value_t = 3000.0)]
    pub slo_ms: f64,
    /// The infer request body, KServe v2 JSON: given inline (starting with `{`) or as
    /// a file holding it; synthesised from the model's metadata when absent.
    #[arg(long, value_name = "JSON|FILE")]
    pub body: Option<String>,
    /// For the ocr model: send an image of these lines of text (separated by `|`),
    /// rendered with the DejaVu Sans font, instead of a synthetic body.
    #[arg(long, conflicts_with = "body")]
    pub text: Option<String>,
}

/// Run `yardmaster load`.
pub fn load(args: &LoadArgs) -> ExitCode {
    run_async(async { run_load(args).await.map(|()| ExitCode::SUCCESS) })
}

async fn run_load(args: &LoadArgs) -> Result<()> {
    if args.duration <= 0.0 {
        bail!("--duration must be positive");
    }
    let workload = yardmaster::formats::WorkloadSpec::parse(&args.workload, args.rate, 1.0)?;
    let arrivals: Vec<_> = workload.arrivals((args.duration * 1e9) as u64, args.seed)?.collect();
    if arrivals.is_empty() {
        bail!("the workload has no arrivals in {} s", args.duration);
    }
    let (body, json_length) = match (&args.body, &args.text) {
        (Some(body), _) => (request_body(body)?, None),
        (None, Some(text)) => {
            let lines: Vec<&str> = text.split('|').collect();
            let (body, json_length) = ocr_body(&lines)?;
            (body, Some(json_length))
        }
        (None, None) => (synthesise_body(args.address, &args.model).await?, None),
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
        json_length,
        slo: Duration::from_secs_f64(args.slo_ms / 1e3),
        transport,
        max_outstanding: args.max_outstanding,
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

/// The `--body` argument's request: the JSON itself when it starts with `{`, else the
/// file it names (checked to hold JSON either way, so a typo is caught before the run).
fn request_body(argument: &str) -> Result<Bytes> {
    let (bytes, source) = if argument.trim_start().starts_with('{') {
        (argument.as_bytes().to_vec(), "the --body JSON".to_string())
    } else {
        let bytes = std::fs::read(argument)
            .with_context(|| format!("reading the request body file {argument} (--body takes a file or the JSON itself)"))?;
        (bytes, format!("the request body file {argument}"))
    };
    serde_json::from_slice::<Value>(&bytes).with_context(|| format!("{source} is not JSON"))?;
    Ok(Bytes::from(bytes))
}

/// A request body for `model`, made from its metadata: every input filled with a
/// small constant tensor (a leading dimension of any size taken as 1 — one item per
/// request —, other variable dimensions as 8; an image-like UINT8 input [-1,-1,3] as
/// 64×64×3).
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
        let shape: Vec<i64> = declared
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d >= 0 {
                    d
                } else if image {
                    64
                } else if i == 0 {
                    // A batching model's leading dimension: one item per request.
                    1
                } else {
                    8
                }
            })
            .collect();
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
    fn a_body_is_the_json_itself_or_a_file_holding_it() {
        let json = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
        assert_eq!(request_body(json).unwrap(), Bytes::from(json));
        let file = std::env::temp_dir().join(format!("yardmaster-body-{}.json", std::process::id()));
        std::fs::write(&file, json).unwrap();
        assert_eq!(request_body(file.to_str().unwrap()).unwrap(), Bytes::from(json));
        std::fs::write(&file, "not json").unwrap();
        assert!(format!("{:#}", request_body(file.to_str().unwrap()).unwrap_err()).contains("is not JSON"));
        std::fs::remove_file(&file).unwrap();
        let missing = format!("{:#}", request_body("/nonexistent/body.json").unwrap_err());
        assert!(missing.contains("--body takes a file or the JSON itself"), "{missing}");
        assert!(format!("{:#}", request_body("{not json").unwrap_err()).contains("the --body JSON is not JSON"));
    }

    #[test]
    fn synthetic_bodies_follow_the_metadata() {
        let metadata = json!({"name": "m", "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 4, -1]},
            {"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]},
        ]});
        let body = body_from_metadata(&metadata).unwrap();
        assert_eq!(body["inputs"][0]["shape"], json!([1, 4, 8]));
        assert_eq!(body["inputs"][0]["data"].as_array().unwrap().len(), 32);
        assert_eq!(body["inputs"][1]["shape"], json!([64, 64, 3]));
        let request = yardmaster::serve::kserve::decode_request(&serde_json::to_vec(&body).unwrap(), None).unwrap();
        assert_eq!(request.inputs.len(), 2, "the codec accepts what the generator makes");
        assert!(body_from_metadata(&json!({})).is_err());
    }
}

/// An OCR request body with a rendered 736 × 736 page (the size the `ocr` preset's
/// detection profile was measured at; the detector scales smaller images up to it), in
/// the binary-tensor extension: (body, length of its JSON part).
fn ocr_body(lines: &[&str]) -> Result<(Bytes, usize)> {
    let image = yardmaster_dataplane::ocr::sample::render_text(lines, 32.0, 736, 736, 40.0, 60.0)?;
    let header = json!({"inputs": [{
        "name": "image", "datatype": "UINT8", "shape": [image.height, image.width, 3],
        "parameters": {"binary_data_size": image.data.len()}
    }]});
    let mut body = serde_json::to_vec(&header)?;
    let json_length = body.len();
    body.extend_from_slice(&image.data);
    Ok((Bytes::from(body), json_length))
}

/// The main job (`yardmaster` with no arguments): serve the default PP-OCR pipeline
/// with the default policy, read one rendered image through it, send a short
/// open-loop load over HTTP/3 and then HTTP/1.1, print the reports and stop.
pub fn main_job() -> ExitCode {
    run_async(async { run_main_job().await.map(|()| ExitCode::SUCCESS) })
}

async fn run_main_job() -> Result<()> {
    let mut config = ServeConfig::default();
    if std::net::TcpListener::bind(config.listen).is_err() {
        eprintln!("{} is taken; using a free port", config.listen);
        config.listen.set_port(0);
    }
    if let Some(grpc) = config.grpc_address().filter(|a| a.port() != 0 && std::net::TcpListener::bind(a).is_err()) {
        eprintln!("{grpc} (gRPC) is taken; using a free port");
        config.grpc_listen = Some(std::net::SocketAddr::new(grpc.ip(), 0));
    }
    let server = Server::start(&config, Vec::new()).await?;
    print!("{}", server.banner());
    let address = server.address();
    let result = demonstrate(&server, address).await;
    println!("{}", server.summary());
    server.stop().await;
    result?;
    println!("\nTo keep serving: yardmaster serve   (then, elsewhere: yardmaster load --text \"hello world\" --rate 2 --duration 30)");
    Ok(())
}

async fn demonstrate(server: &Server, address: SocketAddr) -> Result<()> {
    let lines = ["Yardmaster serves PP-OCR", "policies decide every batch", "on two CPU cores"];
    let (body, json_length) = ocr_body(&lines)?;
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/octet-stream"));
    headers.insert(yardmaster::serve::kserve::HEADER_CONTENT_LENGTH, http::HeaderValue::from(json_length));
    let mut client = Http1Client::connect(address).await?;
    let started = std::time::Instant::now();
    let reply = client.request(Method::POST, "/v2/models/ocr/infer", &headers, body.clone()).await?;
    if reply.status != StatusCode::OK {
        bail!("the first OCR request got {}: {}", reply.status, String::from_utf8_lossy(&reply.body));
    }
    let answer: Value = serde_json::from_slice(&reply.body).context("the OCR answer is not JSON")?;
    let texts: Vec<String> = answer["outputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["name"] == "texts")
        .flat_map(|o| o["data"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(String::from))
        .collect();
    println!("\nOCR of a rendered image ({:.0} ms, models loaded cold): {texts:?}", started.elapsed().as_secs_f64() * 1e3);
    let trusted = match &server.listeners.certificate {
        Some(cert) => tls::read_certificates(cert)?,
        None => Vec::new(),
    };
    let workload = yardmaster::formats::WorkloadSpec::parse("poisson", 2.0, 1.0)?;
    for transport in [Transport::Http3 { server_name: "localhost".into(), trusted }, Transport::Http1 { connections: 8 }] {
        let name = if matches!(transport, Transport::Http3 { .. }) { "HTTP/3" } else { "HTTP/1.1" };
        println!("\n{name}: open-loop Poisson load, 2 images/s for 5 s, SLO 3 s (the ocr pipeline's)");
        let arrivals: Vec<_> = workload.arrivals(5_000_000_000, 1)?.collect();
        let plan = LoadPlan {
            address,
            model: "ocr".into(),
            body: body.clone(),
            json_length: Some(json_length),
            slo: Duration::from_secs(3),
            transport,
            max_outstanding: load::DEFAULT_MAX_OUTSTANDING,
        };
        let report = load::run(&plan, arrivals, |_, _| {}).await?;
        print!("{}", report.render());
    }
    Ok(())
}

/// Arguments of `yardmaster serve-bench`.
#[derive(clap::Args, Clone)]
pub struct ServeBenchArgs {
    /// Requests sent one at a time, for latency and overhead.
    #[arg(long, default_value_t = 2_000)]
    pub sequential: usize,
    /// Requests of the closed loop, for throughput.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// Concurrent clients of the closed loop.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Policy scheduling the trivial model.
    #[arg(long, default_value = "edf")]
    pub policy: String,
    /// The policy's decision deadline in milliseconds (default 5): past it a call
    /// faults and the built-in fallback serves the rest of the run.
    #[arg(long = "deadline-ms")]
    pub deadline_ms: Option<f64>,
    /// Compare each transport's served ÷ inline throughput with the floors in
    /// crates/cli/bench-floors.toml and exit non-zero below them (by hand before
    /// landing a serving-path change; not in CI).
    #[arg(long)]
    pub check: bool,
}

/// Run `yardmaster serve-bench`.
pub fn serve_bench(args: &ServeBenchArgs) -> ExitCode {
    run_async(async { run_serve_bench(args).await.map(|()| ExitCode::SUCCESS) })
}

async fn run_serve_bench(args: &ServeBenchArgs) -> Result<()> {
    use yardmaster::serve::bench::{self, BenchOptions, BenchTarget, BenchTransport};
    let trace_dir = std::env::temp_dir().join(format!("yardmaster-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&trace_dir)?;
    let trace_file = trace_dir.join("trace.json");
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse()?,
        pipeline: "tiny".into(),
        policy: args.policy.clone(),
        trace_file: Some(trace_file.clone()),
        ..ServeConfig::default()
    };
    config.policy_settings.deadline_ms = args.deadline_ms;
    let server = Server::start(&config, Vec::new()).await?;
    eprintln!("trivial model (y = x + 1 on 4 floats) on {}, policy {}", server.device, server.policy);
    let handle = server.handle.clone();
    let target = BenchTarget {
        address: server.address(),
        trusted: match &server.listeners.certificate {
            Some(cert) => tls::read_certificates(cert)?,
            None => Vec::new(),
        },
        model_time: Arc::new(move || {
            handle
                .inspect(|engine| {
                    let stats = engine.accounting().summary(engine.state().now()).overall;
                    ((stats.accelerator_s * 1e9) as u64, engine.stats().jobs)
                })
                .unwrap_or((0, 0))
        }),
    };
    let options =
        BenchOptions { sequential: args.sequential, requests: args.requests, concurrency: args.concurrency, connections: args.concurrency };
    // The baseline: the same API and transports with the arithmetic inline.
    let baseline_api = Arc::new(yardmaster::serve::api::Api::new(Arc::new(bench::InlineTiny)));
    let baseline = yardmaster::serve::listeners::Listeners::start(
        &ServeConfig { listen: "127.0.0.1:0".parse()?, ..ServeConfig::default() }.listen_options(),
        baseline_api,
    )
    .await?;
    let baseline_target =
        BenchTarget { address: baseline.http1.expect("HTTP/1.1 is on"), trusted: target.trusted.clone(), model_time: Arc::new(|| (0, 0)) };
    let mut result = Ok(());
    let mut checks_pass = true;
    println!("         end-to-end latency of sequential requests; req/s of a closed loop");
    for transport in [BenchTransport::Http1, BenchTransport::Http3] {
        let measured = async {
            let served = bench::run(transport, &target, &options).await?;
            let inline = bench::run(transport, &baseline_target, &options).await?;
            anyhow::Ok((served, inline))
        };
        match measured.await {
            Ok((served, inline)) => {
                println!("served   {}", served.render());
                println!("baseline {}", inline.render());
                println!(
                    "         scheduling path adds p50 {:.1} µs, p99 {:.1} µs; throughput {:.2}× the baseline's",
                    (served.latency.quantile(0.5) as f64 - inline.latency.quantile(0.5) as f64) / 1e3,
                    (served.latency.quantile(0.99) as f64 - inline.latency.quantile(0.99) as f64) / 1e3,
                    served.throughput / inline.throughput.max(1e-9)
                );
                if args.check {
                    let key = match transport {
                        BenchTransport::Http1 => "serve_http1_throughput",
                        BenchTransport::Http3 => "serve_http3_throughput",
                    };
                    let (line, passes) = crate::bench_floors::check(key, served.throughput / inline.throughput.max(1e-9));
                    println!("         {line}");
                    checks_pass &= passes;
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // Where a request's time goes: sequential requests traced (after the measured runs,
    // so tracing costs them nothing).
    if result.is_ok() {
        let traced = args.sequential.clamp(100, 2_000);
        let on = serde_json::json!({ "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": traced.to_string() });
        server.api.tracer().update(None, on.as_object().expect("an object")).map_err(|e| anyhow!(e))?;
        let options = BenchOptions { sequential: traced, requests: 0, concurrency: 1, connections: 1 };
        let report = bench::run(BenchTransport::Http1, &target, &options).await;
        let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace_file).unwrap_or_default()).unwrap_or_default();
        match (report, bench::Breakdown::from_trace(&trace)) {
            (Ok(report), Some(breakdown)) => println!("{}", breakdown.render(report.latency.quantile(0.5), report.model_mean_ns)),
            (Err(e), _) => eprintln!("the per-request breakdown did not run: {e}"),
            (Ok(_), None) => eprintln!("the per-request breakdown found no complete trace in {}", trace_file.display()),
        }
    }
    let _ = std::fs::remove_dir_all(&trace_dir);
    // What the policy cost over both runs: the longest call is what a decision deadline
    // (5 ms unless the policy's settings say otherwise) must leave room for.
    if let Ok((calls, events, total, longest, faults)) = server.handle.inspect(|engine| {
        let stats = engine.arm().stats();
        (stats.calls, stats.events, stats.call_time, stats.max_call_time, stats.faults.values().sum::<u64>())
    }) {
        println!(
            "policy   {}: {calls} calls, {events} events, {:.1} µs per call, longest call {:.2} ms, {faults} faults",
            server.policy,
            total.as_secs_f64() * 1e6 / calls.max(1) as f64,
            longest.as_secs_f64() * 1e3
        );
    }
    baseline.stop().await;
    server.stop().await;
    result?;
    if !checks_pass {
        bail!("a served ÷ inline throughput ratio is below its floor (crates/cli/bench-floors.toml)");
    }
    Ok(())
}
