//! `yardmaster admin`: the command line of a running server's admin API
//! ([`yardmaster::serve::admin`]).
//!
//! - `yardmaster admin list`: the policy arm, the policy it runs with its SHA-256, its
//!   state and swap counters;
//! - `yardmaster admin swap FILE|NAME`: swap the policy in, from a `.wasm` file (sent
//!   to the server) or a shipped policy by name; prints the engine's pause;
//! - `yardmaster admin shadow start FILE|NAME | report | stop`: run a candidate as a
//!   shadow of the live policy and read what it would have done.
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
    },
    /// What the shadow did so far.
    Report,
    /// Stop the shadow and print its final report.
    Stop,
}

/// Run `yardmaster admin`.
pub fn run(args: &AdminArgs) -> ExitCode {
    crate::serve_cli::run_async(call(args))
}

async fn call(args: &AdminArgs) -> Result<ExitCode> {
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok())
        .ok_or_else(|| anyhow!("no admin token: pass --token or set {ADMIN_TOKEN_ENV}"))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).context("the token is not a valid header value")?,
    );
    let (method, path, body) = match &args.command {
        AdminCommand::List => (Method::GET, "/admin/policies".to_string(), Bytes::new()),
        AdminCommand::Swap { policy } => swap_request(policy, "/admin/swap", &mut headers)?,
        AdminCommand::Shadow(ShadowCommand::Start { policy }) => swap_request(policy, "/admin/shadow", &mut headers)?,
        AdminCommand::Shadow(ShadowCommand::Report) => (Method::GET, "/admin/shadow".to_string(), Bytes::new()),
        AdminCommand::Shadow(ShadowCommand::Stop) => (Method::DELETE, "/admin/shadow".to_string(), Bytes::new()),
    };
    let mut client = Http1Client::connect(args.address).await.context("is the server running with an admin token?")?;
    let reply = client.request(method, &path, &headers, body).await?;
    let value: Value = serde_json::from_slice(&reply.body)
        .with_context(|| format!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body)))?;
    match reply.status {
        StatusCode::OK => {}
        StatusCode::UNAUTHORIZED => bail!("401 unauthorized: the token is not the server's (--token or {ADMIN_TOKEN_ENV})"),
        status => bail!("{status}: {}", value["error"].as_str().unwrap_or("no reason given")),
    }
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
            eprintln!(
                "warning: the new policy {fault} during the hand-over; the arm is now {}",
                summary["state"].as_str().unwrap_or("?")
            );
            ExitCode::FAILURE
        }
    }
}

fn print_shadow(report: &Value) {
    let counts = |v: &Value| -> String {
        let pairs: Vec<String> = v.as_object().into_iter().flatten().map(|(k, n)| format!("{k} {n}")).collect();
        if pairs.is_empty() { "none".into() } else { pairs.join(", ") }
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
