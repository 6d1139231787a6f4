//! `yardmaster admin`: the command line of a running server's admin API
//! ([`yardmaster::serve::admin`]).
//!
//! - `yardmaster admin list`: the policy arm, the policy it runs with its SHA-256, its
//!   state and swap counters;
//! - `yardmaster admin swap FILE|NAME`: swap the policy in, from a `.wasm` file (sent
//!   to the server) or a shipped policy by name; prints the engine's pause;
//! - `yardmaster admin shadow start FILE|NAME | report | stop`: run a candidate as a
//!   shadow of the live policy and read what it would have done;
//! - `yardmaster ab start FILE|NAME [--share S] [--by request|stream|key] [--arm NAME]
//!   | status | report | promote | rollback`: an A/B run of a candidate against the
//!   live policy, its report with confidence intervals, and its end.
//!
//! `admin swap`, `admin shadow start` and `ab start` ask the server to work in the
//! background (`?async=1`) and poll the operation it answers with
//! (`GET /admin/operations/ID`, every 200 ms): while it is not done they print where it
//! stands to stderr — `compiling my-policy (18.0 MB)… 4 s`, `preparing …`, `warming up
//! the candidate's workers …` — at each change and every second, and return when it is
//! done, with its answer, as a direct call would. A server that answers at once (200)
//! is read as before.
//!
//! The token comes from `--token` or `YARDMASTER_ADMIN_TOKEN`. The exit status is
//! non-zero when the call is refused, and when a swapped-in policy faulted at once
//! (the server then serves with the fallback).

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::Value;
use yardmaster::serve::ab::stats::render as render_report;
use yardmaster::serve::ab::AbReport;
use yardmaster::serve::client::Http1Client;
use yardmaster::serve::config::{ADMIN_TOKEN_ENV, DEFAULT_ADMIN_LISTEN};

/// Arguments of `yardmaster admin`.
#[derive(clap::Args, Clone)]
pub struct AdminArgs {
    /// The admin API's address.
    #[arg(long, default_value = DEFAULT_ADMIN_LISTEN, global = true)]
    pub address: SocketAddr,
    /// The admin token (default: the YARDMASTER_ADMIN_TOKEN environment variable).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// The admin calls.
#[derive(clap::Subcommand, Clone)]
pub enum AdminCommand {
    /// List the policy arms: policy, SHA-256, state, swaps.
    List,
    /// Swap the running policy for a `.wasm` file or a shipped policy (by name).
    Swap {
        /// A policy component file, or the name of a shipped policy (`edf`, `fifo`, …).
        policy: String,
        /// The arm to swap during an A/B run (default: the control arm).
        #[arg(long)]
        arm: Option<String>,
        /// The policy's own settings.
        #[command(flatten)]
        settings: PolicySettingsArgs,
    },
    /// Run a candidate policy as a shadow of the live one (its actions are checked and
    /// counted, never executed), read its report, or stop it.
    #[command(subcommand)]
    Shadow(ShadowCommand),
}

/// The shadow calls.
#[derive(clap::Subcommand, Clone)]
pub enum ShadowCommand {
    /// Start (or replace) the shadow.
    Start {
        /// A policy component file, or the name of a shipped policy.
        policy: String,
        /// The policy's own settings.
        #[command(flatten)]
        settings: PolicySettingsArgs,
    },
    /// What the shadow did so far.
    Report,
    /// Stop the shadow and print its final report.
    Stop,
}

/// A policy's own settings for `admin swap`, `admin shadow start` and `ab start`; what
/// is not given stays as the running policy's arm has it.
#[derive(clap::Args, Clone, Default)]
pub struct PolicySettingsArgs {
    /// A parameter for the policy, KEY=VALUE (repeatable), over the server's own.
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// The deadline of one decision, in milliseconds (default 5; raise it for a Python
    /// or JavaScript policy).
    #[arg(long)]
    pub deadline_ms: Option<f64>,
    /// The most linear memory the policy may grow to, in MiB (default 64).
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// What the arm does when the policy faults: fail-open (the built-in fallback
    /// takes over), fail-closed, or reload.
    #[arg(long)]
    pub failure: Option<String>,
}

impl PolicySettingsArgs {
    /// The settings as the admin API's query parameters (empty when none is given).
    fn query(&self) -> Result<String> {
        let mut pairs = Vec::new();
        for param in &self.params {
            if !param.contains('=') {
                bail!("--param {param:?}: write KEY=VALUE");
            }
            pairs.push(format!("param={}", percent_encoded(param)));
        }
        if let Some(ms) = self.deadline_ms {
            pairs.push(format!("deadline_ms={ms}"));
        }
        if let Some(mib) = self.memory_mib {
            pairs.push(format!("memory_mib={mib}"));
        }
        if let Some(failure) = &self.failure {
            pairs.push(format!("failure={}", percent_encoded(failure)));
        }
        Ok(pairs.join("&"))
    }
}

/// `text` with every byte but letters, digits and `-_.~=` escaped as `%XX`.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~=".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// `path` with the settings' query appended, if any.
fn with_settings(path: String, settings: &PolicySettingsArgs) -> Result<String> {
    let query = settings.query()?;
    Ok(if query.is_empty() { path } else { with_query(&path, &query) })
}

/// Arguments of `yardmaster ab`.
#[derive(clap::Args, Clone)]
pub struct AbArgs {
    /// The admin API's address.
    #[arg(long, default_value = DEFAULT_ADMIN_LISTEN, global = true)]
    pub address: SocketAddr,
    /// The admin token (default: the YARDMASTER_ADMIN_TOKEN environment variable).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: AbCommand,
}

/// The A/B calls.
#[derive(clap::Subcommand, Clone)]
pub enum AbCommand {
    /// Start an A/B run: the candidate policy gets its share of the requests and of
    /// each stage's workers; the live policy keeps the rest.
    Start {
        /// A policy component file, or the name of a shipped policy.
        policy: String,
        /// The candidate's share of requests and workers, between 0 and 1.
        #[arg(long, default_value_t = 0.5)]
        share: f64,
        /// What decides a request's arm: `request` (each on its own), `stream`, or
        /// `key` (the client's x-yardmaster-key header or `split_key` parameter).
        #[arg(long, default_value = "request")]
        by: String,
        /// The candidate arm's name (default: the policy's name).
        #[arg(long)]
        arm: Option<String>,
        /// The candidate's own settings.
        #[command(flatten)]
        settings: PolicySettingsArgs,
    },
    /// Where the run stands: its arms, their workers and requests in flight.
    Status,
    /// Compare the arms: goodput, drop rate and latency, with 95 % confidence
    /// intervals, and whether each difference is significant.
    Report {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the candidate the whole: it takes every new request, and the control's
    /// workers once the control has finished what it holds.
    Promote,
    /// Make the control the whole again (stops the run).
    Rollback,
}

/// Run `yardmaster admin`.
pub fn run(args: &AdminArgs) -> ExitCode {
    crate::serve_cli::run_async(call(args))
}

/// Run `yardmaster ab`.
pub fn run_ab(args: &AbArgs) -> ExitCode {
    crate::serve_cli::run_async(call_ab(args))
}

/// The headers of an authenticated admin call.
fn auth_headers(token: &Option<String>) -> Result<HeaderMap> {
    let token = token
        .clone()
        .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok())
        .ok_or_else(|| anyhow!("no admin token: pass --token or set {ADMIN_TOKEN_ENV}"))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).context("the token is not a valid header value")?,
    );
    Ok(headers)
}

/// Make one admin call; its JSON answer, or the server's reason for refusing it.
async fn admin_call(address: SocketAddr, method: Method, path: &str, headers: &HeaderMap, body: Bytes) -> Result<Value> {
    let mut client = Http1Client::connect(address).await.context("is the server running with an admin token?")?;
    let reply = client.request(method, path, headers, body).await?;
    let value: Value =
        serde_json::from_slice(&reply.body).with_context(|| format!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body)))?;
    match reply.status {
        StatusCode::OK => Ok(value),
        StatusCode::UNAUTHORIZED => bail!("401 unauthorized: the token is not the server's (--token or {ADMIN_TOKEN_ENV})"),
        status => bail!("{status}: {}", value["error"].as_str().unwrap_or("no reason given")),
    }
}

/// Make a long admin call (a swap, a shadow's or an A/B run's start) in the
/// background and poll its operation until it is done, printing progress to stderr;
/// its JSON answer, or the server's reason for refusing it.
async fn long_call(address: SocketAddr, path: &str, headers: &HeaderMap, body: Bytes) -> Result<Value> {
    let mut client = Http1Client::connect(address).await.context("is the server running with an admin token?")?;
    let reply = client.request(Method::POST, &with_query(path, "async=1"), headers, body).await?;
    if reply.status != StatusCode::ACCEPTED {
        // A server without background operations answered when done.
        let value: Value =
            serde_json::from_slice(&reply.body).with_context(|| format!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body)))?;
        return match reply.status {
            StatusCode::OK => Ok(value),
            StatusCode::UNAUTHORIZED => bail!("401 unauthorized: the token is not the server's (--token or {ADMIN_TOKEN_ENV})"),
            status => bail!("{status}: {}", value["error"].as_str().unwrap_or("no reason given")),
        };
    }
    let mut operation: Value = serde_json::from_slice(&reply.body).context("the operation does not parse")?;
    let poll = operation["poll"].as_str().map(str::to_string).ok_or_else(|| anyhow!("the server answered 202 without an operation"))?;
    let (mut said, mut said_at) = (String::new(), std::time::Instant::now());
    loop {
        match operation["state"].as_str().unwrap_or("?") {
            "done" => return Ok(operation["result"].clone()),
            "failed" => {
                let status =
                    operation["status"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::BAD_REQUEST);
                bail!("{status}: {}", operation["error"].as_str().unwrap_or("no reason given"));
            }
            state => {
                let long = !said.is_empty() || operation["elapsed_ms"].as_f64().unwrap_or(0.0) >= 200.0;
                if long && (state != said || said_at.elapsed() >= std::time::Duration::from_secs(1)) {
                    eprintln!("{}", progress_line(&operation));
                    (said, said_at) = (state.to_string(), std::time::Instant::now());
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        operation = admin_call(address, Method::GET, &poll, headers, Bytes::new()).await?;
    }
}

/// Where an operation stands, in words: `compiling my-policy (18.0 MB)… 4 s`.
fn progress_line(operation: &Value) -> String {
    let policy = operation["policy"].as_str().unwrap_or("the policy");
    let size = match operation["size_bytes"].as_u64() {
        Some(bytes) if bytes >= 1 << 20 => format!(" ({:.1} MB)", bytes as f64 / (1 << 20) as f64),
        Some(bytes) => format!(" ({} kB)", bytes.div_ceil(1024)),
        None => String::new(),
    };
    let what = match operation["state"].as_str().unwrap_or("?") {
        "compiling" => format!("compiling {policy}{size}"),
        "preparing" => format!("preparing {policy} (instantiating it, replaying the held requests)"),
        "warming" => format!("warming up the candidate {policy}'s workers (no request goes to it yet)"),
        other => format!("{other} {policy}"),
    };
    format!("{what}… {:.0} s", operation["elapsed_ms"].as_f64().unwrap_or(0.0) / 1e3)
}

async fn call_ab(args: &AbArgs) -> Result<ExitCode> {
    let mut headers = auth_headers(&args.token)?;
    let (method, path, body) = match &args.command {
        AbCommand::Start { policy, share, by, arm, settings } => {
            let (method, path, body) = swap_request(policy, "/admin/ab", &mut headers)?;
            let mut query = format!("share={share}&by={by}");
            if let Some(arm) = arm {
                query.push_str(&format!("&arm={arm}"));
            }
            (method, with_settings(with_query(&path, &query), settings)?, body)
        }
        AbCommand::Status | AbCommand::Report { .. } => (Method::GET, "/admin/ab".to_string(), Bytes::new()),
        AbCommand::Promote => (Method::POST, "/admin/ab/promote".to_string(), Bytes::new()),
        AbCommand::Rollback => (Method::POST, "/admin/ab/rollback".to_string(), Bytes::new()),
    };
    let value = match &args.command {
        AbCommand::Start { .. } => long_call(args.address, &path, &headers, body).await?,
        _ => admin_call(args.address, method, &path, &headers, body).await?,
    };
    match &args.command {
        AbCommand::Report { json: true } => println!("{}", serde_json::to_string_pretty(&value["report"])?),
        AbCommand::Report { json: false } => match serde_json::from_value::<Option<AbReport>>(value["report"].clone())? {
            Some(report) => print!("{}", render_report(&report)),
            None => println!("no A/B run has taken place yet (yardmaster ab start POLICY)"),
        },
        AbCommand::Status => print_ab_status(&value["status"]),
        _ => print_ab_status(&value),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_ab_status(status: &Value) {
    let state = status["state"].as_str().unwrap_or("?");
    match state {
        "none" => println!("no A/B run in progress"),
        _ => println!(
            "A/B run {state}{}{}",
            status["split"].as_str().map(|s| format!(", split {s}")).unwrap_or_default(),
            status["winner"].as_str().map(|w| format!("; {w} becomes the whole once the other arm drains")).unwrap_or_default()
        ),
    }
    if let Some(ms) = status["warm_up_ms"].as_f64() {
        println!("  the candidate's workers warmed up in {ms:.0} ms before the split routed to it");
    }
    for arm in status["arms"].as_array().into_iter().flatten() {
        println!(
            "  arm {}: {}, workers per stage {} ({} ready), {} requests in flight",
            arm["arm"].as_str().unwrap_or("?"),
            arm["policy"].as_str().unwrap_or("?"),
            arm["workers"],
            arm["ready"],
            arm["in_flight"]
        );
    }
}

async fn call(args: &AdminArgs) -> Result<ExitCode> {
    let mut headers = auth_headers(&args.token)?;
    let (method, path, body) = match &args.command {
        AdminCommand::List => (Method::GET, "/admin/policies".to_string(), Bytes::new()),
        AdminCommand::Swap { policy, arm, settings } => {
            let (method, path, body) = swap_request(policy, "/admin/swap", &mut headers)?;
            let path = match arm {
                Some(arm) => with_query(&path, &format!("arm={arm}")),
                None => path,
            };
            (method, with_settings(path, settings)?, body)
        }
        AdminCommand::Shadow(ShadowCommand::Start { policy, settings }) => {
            let (method, path, body) = swap_request(policy, "/admin/shadow", &mut headers)?;
            (method, with_settings(path, settings)?, body)
        }
        AdminCommand::Shadow(ShadowCommand::Report) => (Method::GET, "/admin/shadow".to_string(), Bytes::new()),
        AdminCommand::Shadow(ShadowCommand::Stop) => (Method::DELETE, "/admin/shadow".to_string(), Bytes::new()),
    };
    let value = match &args.command {
        AdminCommand::Swap { .. } | AdminCommand::Shadow(ShadowCommand::Start { .. }) => {
            long_call(args.address, &path, &headers, body).await?
        }
        _ => admin_call(args.address, method, &path, &headers, body).await?,
    };
    Ok(match &args.command {
        AdminCommand::List => {
            for arm in value["arms"].as_array().into_iter().flatten() {
                print_arm(arm);
            }
            ExitCode::SUCCESS
        }
        AdminCommand::Swap { .. } => print_swap(&value),
        AdminCommand::Shadow(_) => {
            print_shadow(&value["shadow"]);
            ExitCode::SUCCESS
        }
    })
}

/// `path` with `query` appended (after the query `path` may already carry).
fn with_query(path: &str, query: &str) -> String {
    let joiner = if path.contains('?') { '&' } else { '?' };
    format!("{path}{joiner}{query}")
}

/// A file is sent as bytes (named after its stem); anything else is a shipped name.
fn swap_request(policy: &str, route: &str, headers: &mut HeaderMap) -> Result<(Method, String, Bytes)> {
    let path = Path::new(policy);
    if path.exists() {
        let bytes = std::fs::read(path).with_context(|| format!("reading {policy}"))?;
        let name: String = path
            .file_stem()
            .map(|s| s.to_string_lossy().chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).collect())
            .unwrap_or_default();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/wasm"));
        return Ok((Method::POST, format!("{route}?name={name}"), Bytes::from(bytes)));
    }
    if policy.ends_with(".wasm") {
        bail!("no such file: {policy}");
    }
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok((Method::POST, route.into(), Bytes::from(serde_json::json!({ "shipped": policy }).to_string())))
}

fn print_arm(arm: &Value) {
    println!(
        "arm {}: policy {} (sha256 {}), {}, answered by {}; {} swaps (last pause {:.0} µs, longest {:.0} µs), {} fallbacks, {} requests held",
        arm["arm"].as_str().unwrap_or("?"),
        arm["policy"].as_str().unwrap_or("?"),
        arm["sha256"].as_str().unwrap_or("none: native"),
        arm["state"].as_str().unwrap_or("?"),
        arm["answering"].as_str().unwrap_or("?"),
        arm["swaps"],
        arm["last_swap_pause_us"].as_f64().unwrap_or(0.0),
        arm["max_swap_pause_us"].as_f64().unwrap_or(0.0),
        arm["fallbacks"],
        arm["held"],
    );
    let params: Vec<String> =
        arm["params"].as_object().into_iter().flatten().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    println!(
        "  deadline {} ms, memory {} MiB, {}; params: {}",
        arm["deadline_ms"].as_f64().map_or_else(|| "-".into(), |ms| format!("{ms}")),
        arm["memory_mib"].as_u64().map_or_else(|| "-".into(), |mib| mib.to_string()),
        arm["failure"].as_str().unwrap_or("?"),
        if params.is_empty() { "none".into() } else { params.join(", ") }
    );
}

fn print_swap(summary: &Value) -> ExitCode {
    println!(
        "swapped in {} (sha256 {}) for {}: the engine paused {:.0} µs, {} held requests replayed, prepared in {:.0} µs off the engine",
        summary["policy"].as_str().unwrap_or("?"),
        summary["sha256"].as_str().unwrap_or("?"),
        summary["from"].as_str().unwrap_or("?"),
        summary["pause_us"].as_f64().unwrap_or(0.0),
        summary["replayed"],
        summary["prepare_us"].as_f64().unwrap_or(0.0),
    );
    match summary["fault"].as_str() {
        None => ExitCode::SUCCESS,
        Some(fault) => {
            eprintln!("warning: the new policy {fault} during the hand-over; the arm is now {}", summary["state"].as_str().unwrap_or("?"));
            ExitCode::FAILURE
        }
    }
}

fn print_shadow(report: &Value) {
    let counts = |v: &Value| -> String {
        let pairs: Vec<String> = v.as_object().into_iter().flatten().map(|(k, n)| format!("{k} {n}")).collect();
        if pairs.is_empty() {
            "none".into()
        } else {
            pairs.join(", ")
        }
    };
    println!(
        "shadow {} (sha256 {}), {}: {} calls, {} events, {:.0} µs in calls (longest {:.0} µs), {} requests held",
        report["policy"].as_str().unwrap_or("?"),
        report["sha256"].as_str().unwrap_or("none: native"),
        report["state"].as_str().unwrap_or("?"),
        report["calls"],
        report["events"],
        report["call_time_us"].as_f64().unwrap_or(0.0),
        report["max_call_us"].as_f64().unwrap_or(0.0),
        report["held"],
    );
    println!("  accepted: {}", counts(&report["accepted"]));
    println!("  rejected: {}", counts(&report["rejected"]));
    if let Some(fault) = report["fault"].as_str() {
        println!("  stopped: it {fault}");
    }
}
