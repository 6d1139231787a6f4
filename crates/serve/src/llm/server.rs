//! A whole LLM server: what `yardmaster serve --pipeline llm-tiny` runs. It loads ONNX
//! Runtime, starts the LLM engine actor on the tiny decoder ([`super::LlmStack`]) under
//! a policy (`calm` unless one is configured), and brings up the same transports as the
//! pipeline server (HTTP/1.1 and HTTP/3, KServe v2 routes through [`LlmBackend`], and
//! Prometheus text at `/metrics`).
//!
//! The admin API is the pipeline server's ([`crate::admin`]): hot swaps, shadows and
//! A/B runs (each arm with its share of the decoder workers) on live traffic, and the
//! watched directory, with the `[policy]` settings applied to the policy as there; and
//! trace capture, whose arrivals carry each request's prompt length and tokens asked
//! for, so `sim compare --workload trace:FILE` replays the served traffic. A
//! `[[remote]]` section runs its stages' decoder workers on a `yardmaster node`
//! ([`super::remote`]); the texts and the engine stay here.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use yardmaster_dataplane::{Runtime, RuntimeConfig};

use super::backend::LlmBackend;
use super::executor::DecoderPlacement;
use super::remote::{RemoteDecoderConfig, RemoteDecoders};
use super::{LlmActor, LlmHandle, LlmStack, ServedLlm};
use crate::admin::Admin;
use crate::api::{Api, MetricsRenderer};
use crate::config::{RemotePlacement, ServeConfig};
use crate::listeners::Listeners;
use crate::prometheus;
use crate::server::{banner, configured_policy, placed_stages, start_capture, summary};
use crate::swap::Swapper;
use yardmaster_cluster::transport::Fingerprint;

/// The pipeline names served by [`LlmServer`].
pub const LLM_PIPELINES: [&str; 1] = ["llm-tiny"];

/// The policy an LLM pipeline runs when the configuration keeps the default one (which
/// schedules batch stages).
pub const DEFAULT_LLM_POLICY: &str = "calm";

/// Whether `pipeline` names an LLM pipeline (served by [`LlmServer`]).
pub fn is_llm_pipeline(pipeline: &str) -> bool {
    LLM_PIPELINES.contains(&pipeline)
}

/// A running LLM server.
pub struct LlmServer {
    /// The transports.
    pub listeners: Listeners,
    /// A handle to the engine actor.
    pub handle: LlmHandle,
    /// The policy's name.
    pub policy: String,
    /// The models clients can address (one per stream).
    pub models: Vec<String>,
    /// The device line: which device and why.
    pub device: String,
    /// Stages whose decoders run on `yardmaster node`s (the `[[remote]]` sections).
    pub remote: Vec<RemotePlacement>,
    actor: LlmActor,
    admin: Admin,
}

impl LlmServer {
    /// Start serving the LLM pipeline `config` names. Must run inside a tokio runtime.
    pub async fn start(config: &ServeConfig) -> Result<LlmServer> {
        config.validate()?;
        if !is_llm_pipeline(&config.pipeline) {
            bail!("pipeline {:?} is not an LLM pipeline (LLM pipelines: {})", config.pipeline, LLM_PIPELINES.join(", "));
        }
        let ort = Runtime::init(RuntimeConfig { library: None, device: config.device_preference()? })
            .map_err(|e| anyhow!("loading ONNX Runtime: {e} (run `bash scripts/setup.sh --deps` to install it)"))?;
        let choice = ort.device_choice();
        let device = format!("{} ({})", choice.device, choice.reason);
        let policy_name = if config.policy == ServeConfig::default().policy { DEFAULT_LLM_POLICY } else { config.policy.as_str() };
        let policy = configured_policy(policy_name, config)?;
        let policy_label = policy.name.clone();
        let (sandbox, failure) = (policy.sandbox.clone(), policy.failure);
        let served = ServedLlm::tiny().map_err(|e| anyhow!(e))?;
        let streams: Vec<String> = served.pipeline.streams.iter().map(|s| s.name.clone()).collect();
        let options = config.engine_options();
        let mut placements = Vec::with_capacity(config.remote.len());
        for remote in &config.remote {
            placements.push(decoder_placement(remote, &served).await?);
        }
        let (actor, service) = LlmStack::start(served, policy, options, placements).map_err(|e| anyhow!(e))?;
        let handle = service.handle().clone();
        if let Some(path) = &config.capture {
            start_capture(&handle, path)?;
        }
        let metrics_handle = handle.clone();
        let gpu = ort.device();
        let renderer: MetricsRenderer = Arc::new(move || {
            let mut text = metrics_handle.inspect_arms(prometheus::render_arms).unwrap_or_else(|e| format!("# {e}\n"));
            text.push_str(&prometheus::render_gpu_memory(gpu));
            text
        });
        let backend = LlmBackend::new(service, &streams);
        let api = Arc::new(
            Api::new(Arc::new(backend))
                .with_metrics(renderer)
                .with_max_body(config.max_body_bytes)
                .with_max_in_flight(config.max_in_flight)
                .with_trace_file(config.trace_file.clone()),
        );
        let listeners = Listeners::start(&config.listen_options(), api).await?;
        let admin = Admin::start(&config.admin, Arc::new(Swapper::new(handle.clone(), sandbox, failure))).await?;
        Ok(LlmServer { listeners, handle, policy: policy_label, models: streams, device, remote: config.remote.clone(), actor, admin })
    }

    /// The address clients use (TCP and UDP share the port).
    pub fn address(&self) -> std::net::SocketAddr {
        self.listeners.address()
    }

    /// Where the admin API listens, when it runs.
    pub fn admin_address(&self) -> Option<std::net::SocketAddr> {
        self.admin.address
    }

    /// The lines an operator sees at start.
    pub fn banner(&self) -> String {
        banner(&self.listeners, self.admin.address, &self.models, &self.policy, &self.device, &self.remote)
    }

    /// One line: requests by outcome so far.
    pub fn summary(&self) -> String {
        self.handle.inspect_arms(summary).unwrap_or_else(|e| e.to_string())
    }

    /// Stop accepting, fail what is in flight once, stop the engine.
    pub async fn stop(self) {
        self.admin.stop().await;
        self.listeners.stop().await;
        let actor = self.actor;
        let _ = tokio::task::spawn_blocking(move || actor.shutdown("the server is shutting down")).await;
    }
}

/// Connect to the node of a `[[remote]]` section and run the decoder workers of its
/// stages there. The node is sent this host's path of the decoder (a node on another
/// machine needs the file at the same path, or at a path relative to its `--models`
/// folder when this one is relative).
async fn decoder_placement(remote: &RemotePlacement, served: &ServedLlm) -> Result<DecoderPlacement> {
    let stages = placed_stages(remote, &served.pipeline)?;
    let pin = Fingerprint::from_argument(&remote.pin).with_context(|| format!("the pin of node {}", remote.node))?;
    let threads = stages.iter().map(|&s| served.pipeline.stages[s as usize].threads).max().unwrap_or(1);
    let link = RemoteDecoderConfig {
        address: remote.node,
        pin,
        model: served.model.clone(),
        threads,
        idle_timeout: std::time::Duration::from_secs(10),
    };
    let node = RemoteDecoders::connect(link)
        .await
        .with_context(|| format!("connecting to node {} for {}", remote.node, remote.stages.join(", ")))?;
    Ok(DecoderPlacement { stages, node: Arc::new(node) })
}
