//! Serving an LLM pipeline on real decode steps: the engine's iteration (LLM) stages run
//! the data plane's tiny decoder ([`yardmaster_dataplane::llm`]) frame by frame, so the
//! CALM policies (`calm`, `calm-fcfs`, `calm-edf`, `calm-sjf`) and any other policy
//! that plans iteration workers schedule real prefills, decode steps and KV-cache
//! evictions.
//!
//! [`executor`] is the engine's [`yardmaster_engine::Executor`] over decoder worker threads;
//! [`service`] submits token-id requests and returns what they generated;
//! [`backend`] answers KServe requests of token ids with it, and [`server`] serves
//! those over HTTP/1.1 and HTTP/3 (`yardmaster serve --pipeline llm-tiny`).
//! [`LlmStack::start`] puts the engine actor, a policy and both together, on a
//! [`ServedLlm`] pipeline: the preset `crates/formats/presets/llm-tiny.toml` with the tiny
//! decoder, by default ([`ServedLlm::tiny`]).

pub mod backend;
pub mod executor;
pub mod remote;
pub mod server;
pub mod service;
pub use yardmaster_cluster::decoder_thread as worker;

use std::sync::Arc;

use yardmaster_dataplane::llm::{tiny_decoder, DecoderConfig};
use yardmaster_dataplane::Runtime;

pub use backend::LlmBackend;
pub use executor::{
    DecoderModel, DecoderPlacement, Holdings, LlmActor, LlmExecutor, LlmHandle, LlmStats, WorkerDirectory, DEFAULT_MAX_TOKENS,
};
pub use remote::{RemoteDecoderConfig, RemoteDecoders};
pub use server::{is_llm_pipeline, LlmServer};
pub use service::{Completion, LlmService, Transcript, Transcripts};

use super::stack::PolicyChoice;
use yardmaster_engine::{Engine, EngineOptions, MonotonicClock, Pipeline, SharedExecutor};
use yardmaster_policy::contract::{Param, StageKind};
use yardmaster_policy::Arm;

pub use yardmaster_formats::presets::LLM_TINY_PRESET;

/// Prefill cost per prompt token the policies are told (the tiny decoder on one CPU
/// core, measured by `crates/dataplane/tests/all/llm.rs`, rounded up).
pub const TINY_PREFILL_NS_PER_TOKEN: f64 = 5_000.0;
/// Swap cost per KV byte: a swapped cache stays in the same host memory, so swapping
/// is a move (a nominal cost keeps it from looking free next to a recompute).
pub const TINY_SWAP_NS_PER_BYTE: f64 = 0.001;

/// An LLM pipeline ready to serve: iteration stages, all running one decoder.
#[derive(Debug, Clone)]
pub struct ServedLlm {
    /// Stages, profiles, streams; the stages' LLM costs follow the decoder.
    pub pipeline: Pipeline,
    /// The decoder every worker loads.
    pub model: DecoderModel,
}

impl ServedLlm {
    /// The `llm-tiny` preset with the tiny decoder, written to the assets folder on
    /// first use.
    pub fn tiny() -> Result<Self, String> {
        let pipeline = yardmaster_formats::pipeline::from_toml(LLM_TINY_PRESET, "llm-tiny preset").map_err(|e| e.to_string())?;
        let (path, config) = tiny_decoder().map_err(|e| e.to_string())?;
        Self::new(pipeline, DecoderModel { path, config })
    }

    /// `pipeline` served by `model`: every stage must be an iteration stage. Sets each
    /// stage's KV bytes per token to the decoder's, so the engine's KV accounting is
    /// the workers' own (the engine counts every token of a sequence; a worker caches
    /// all but the last generated one).
    pub fn new(mut pipeline: Pipeline, model: DecoderModel) -> Result<Self, String> {
        for stage in &mut pipeline.stages {
            if stage.kind != StageKind::Iteration {
                return Err(format!(
                    "pipeline {:?}: stage {:?} is a batch stage; decoder workers run iteration stages",
                    pipeline.name, stage.name
                ));
            }
            stage.llm.kv_bytes_per_token = model.config.kv_bytes_per_token();
            stage.llm.prefill_ns_per_token = TINY_PREFILL_NS_PER_TOKEN;
            stage.llm.swap_ns_per_byte = TINY_SWAP_NS_PER_BYTE;
        }
        if pipeline.streams.is_empty() {
            return Err(format!("pipeline {:?} has no stream to submit to", pipeline.name));
        }
        Ok(Self { pipeline, model })
    }

    /// The decoder's dimensions.
    pub fn config(&self) -> &DecoderConfig {
        &self.model.config
    }

    /// The policy parameters that describe this decoder to the LLM policies (their
    /// defaults describe a 7B model on a GPU, whose 800 KiB per token would not fit
    /// one sequence in the tiny decoder's KV budget): `kv_bytes_per_token`,
    /// `prefill_us_per_token`, `swap_ns_per_byte`.
    pub fn policy_params(&self) -> Vec<Param> {
        let llm = self.pipeline.stages[0].llm;
        [
            ("kv_bytes_per_token", llm.kv_bytes_per_token.to_string()),
            ("prefill_us_per_token", (llm.prefill_ns_per_token / 1e3).to_string()),
            ("swap_ns_per_byte", llm.swap_ns_per_byte.to_string()),
        ]
        .into_iter()
        .map(|(key, value)| Param { key: key.into(), value })
        .collect()
    }
}

/// Builds and starts the LLM serving stack.
#[derive(Debug, Clone, Copy)]
pub struct LlmStack;

impl LlmStack {
    /// Start the engine actor for `served` scheduled by `policy`, its decoder workers on
    /// the process's ONNX Runtime, except those of the stages `placements` put on
    /// nodes. The policy gets [`ServedLlm::policy_params`] unless `options` sets them.
    /// Returns the actor (stop it with [`LlmActor::shutdown`]) and the service to
    /// submit requests with.
    pub fn start(
        served: ServedLlm,
        policy: PolicyChoice,
        mut options: EngineOptions,
        placements: Vec<DecoderPlacement>,
    ) -> Result<(LlmActor, LlmService), String> {
        let runtime = Runtime::global().map_err(|e| e.to_string())?;
        for param in served.policy_params() {
            if !options.params.iter().any(|p| p.key == param.key) {
                options.params.push(param);
            }
        }
        let ServedLlm { pipeline, model } = served;
        let (transcripts, directory) = (Transcripts::default(), WorkerDirectory::default());
        let streams = pipeline.streams.iter().map(|s| s.name.clone()).collect();
        let vocab = model.config.vocab;
        let clock = MonotonicClock::default();
        let actor = {
            let (transcripts, directory) = (transcripts.clone(), directory.clone());
            let label = policy.name.clone();
            LlmActor::spawn("yardmaster-llm-engine", clock.clone(), &label, move |handle| {
                let executor = LlmExecutor::new(handle, &pipeline, Arc::clone(&runtime), model, transcripts, directory, placements);
                let PolicyChoice { name, sandbox, module, failure } = policy;
                Engine::new(clock, SharedExecutor::new(executor), pipeline, options, |config, view| {
                    Arm::start_wasm(&name, config, &sandbox, module, failure, None, view)
                })
            })
            .map_err(|e| format!("starting the engine thread: {e}"))?
        };
        let service = LlmService::new(actor.handle(), transcripts, directory, vocab, streams);
        Ok((actor, service))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preset_is_one_iteration_stage_with_ls_and_ds_streams() {
        let pipeline = yardmaster_formats::pipeline::from_toml(LLM_TINY_PRESET, "llm-tiny").unwrap();
        assert_eq!(pipeline.stages.len(), 1);
        assert_eq!(pipeline.stages[0].kind, StageKind::Iteration);
        let names: Vec<&str> = pipeline.streams.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ls", "ds"]);
        let model = DecoderModel { path: "unused.onnx".into(), config: DecoderConfig::tiny() };
        let served = ServedLlm::new(pipeline.clone(), model.clone()).unwrap();
        assert_eq!(served.pipeline.stages[0].llm.kv_bytes_per_token, 2048);
        let ocr = yardmaster_formats::pipeline::from_toml(yardmaster_formats::presets::OCR_PRESET, "ocr").unwrap();
        assert!(ServedLlm::new(ocr, model).unwrap_err().contains("batch stage"));
    }
}
