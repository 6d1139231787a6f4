//! `yardmaster cluster`: the live cluster's set-up and what it measured.
//!
//! - `yardmaster cluster certificates --out DIR --node-name NAME`: a cluster CA and
//!   the node certificate it signs (see docs/kubernetes.md);
//! - `yardmaster cluster hosts [--url HOST:PORT] [--out FILE]`: a running
//!   controller's hosts (`GET /v2/cluster`) as `[[host]]` tables — each node that
//!   serves, with its slots, parameter cache and the speed its jobs ran at against
//!   their profiles — which `yardmaster sim compare --hosts FILE` simulates: "what
//!   would QUART do on these servers" before it runs there.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Subcommand;
use http::{HeaderMap, Method, StatusCode};
use yardmaster::serve::client::Http1Client;

/// `yardmaster cluster …`.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Make a cluster CA and a node certificate it signs, valid for NODE_NAME and
    /// `*.NODE_NAME` (a headless Service's name covers every pod behind it): ca.pem,
    /// ca-key.pem, node.pem and node-key.pem in --out.
    Certificates {
        /// Folder to write the four files into.
        #[arg(long)]
        out: PathBuf,
        /// The name nodes are reached by (e.g. `yardmaster-nodes.default.svc.cluster.local`).
        #[arg(long = "node-name")]
        node_name: String,
    },
    /// A running controller's hosts as the simulator's host list: `[[host]]` tables
    /// (name, slots, cache_gib, and the speed its batch jobs ran at against their
    /// profiles, 1 where none ran yet) for `yardmaster sim compare --hosts FILE`.
    Hosts {
        /// The controller's HTTP address.
        #[arg(long, default_value = "127.0.0.1:8000")]
        url: SocketAddr,
        /// Write the hosts here (stdout when absent).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Run a `yardmaster cluster` command.
pub fn run(command: ClusterCommand) -> ExitCode {
    let outcome = match command {
        ClusterCommand::Certificates { out, node_name } => certificates(&out, &node_name),
        ClusterCommand::Hosts { url, out } => hosts(url, out.as_ref()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn certificates(out: &std::path::Path, node_name: &str) -> Result<()> {
    let files = yardmaster::cluster::tls::issue_cluster_certificates(out, node_name)?;
    println!("cluster CA: {} (give it to the controller: [cluster] ca)", files.ca.display());
    println!("CA key: {} (keep it off the nodes)", files.ca_key.display());
    println!("node certificate: {} for {node_name} and *.{node_name}", files.node.display());
    println!("node key: {}", files.node_key.display());
    Ok(())
}

fn hosts(url: SocketAddr, out: Option<&PathBuf>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let view = runtime.block_on(async {
        let mut client = Http1Client::connect(url).await.context("is the controller running?")?;
        let reply = client.request(Method::GET, "/v2/cluster", &HeaderMap::new(), Bytes::new()).await?;
        let body: serde_json::Value =
            serde_json::from_slice(&reply.body).with_context(|| format!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body)))?;
        if reply.status != StatusCode::OK {
            bail!("{}: {}", reply.status, body["error"].as_str().unwrap_or("no reason given"));
        }
        Ok(body)
    })?;
    let hosts = yardmaster::serve::membership::simulated_hosts(&view).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let mut text = format!("# The hosts of the cluster controlled at {url}, as `yardmaster cluster hosts` read them.\n");
    for host in view["hosts"].as_array().into_iter().flatten() {
        let name = host["name"].as_str().unwrap_or("?");
        match host["measured_speed"].as_f64() {
            Some(speed) => text.push_str(&format!("# {name}: speed {speed:.3} measured over {} batch jobs\n", host["jobs"])),
            None if host["slots"].as_u64().unwrap_or(0) > 0 => text.push_str(&format!("# {name}: no job ran yet, speed 1 assumed\n")),
            None => text.push_str(&format!("# {name}: {} with no slot, left out\n", host["state"].as_str().unwrap_or("?"))),
        }
    }
    text.push('\n');
    text.push_str(&yardmaster::formats::pipeline::hosts_to_toml(&hosts));
    match out {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {} hosts to {}", hosts.len(), path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}
