//! A small native harness for CALM's tests: one iteration-level worker with a
//! 10 ms decode step, streams `ls`, `ds` and `be`, and a driver fed by hand.

use yardmaster_sdk::testing::{constant_variant, frame_report, one_stage};
use yardmaster_sdk::{Action, Config, Ctx, Driver, Event, NullHost, Param, Request, StageKind, Stream, Variant};

use crate::Calm;

/// Nanoseconds per millisecond.
pub const MS: u64 = 1_000_000;
/// KV bytes per token in the harness.
pub const KV: u64 = 1000;
/// Stream ids.
pub const LS: u32 = 0;
/// See [`LS`].
pub const DS: u32 = 1;
/// See [`LS`].
pub const BE: u32 = 2;

/// A configuration: B = `batch`, KV capacity `kv_tokens` tokens, exactly the given params.
pub fn config(batch: u32, kv_tokens: u64, params: &[(&str, &str)]) -> Config {
    let stream = |id, name: &str, slo| Stream { id, name: name.into(), entry: 0, slo };
    let params: Vec<Param> = params.iter().map(|(k, v)| Param { key: (*k).into(), value: (*v).into() }).collect();
    let mut config = one_stage(vec![Variant { name: "llm".into(), ..constant_variant(10 * MS) }], batch, 1);
    config.stages[0].name = "generate".into();
    config.stages[0].kind = StageKind::Iteration;
    config.workers[0].memory_bytes = kv_tokens * KV;
    config.streams = vec![stream(LS, "ls", 2000 * MS), stream(DS, "ds", 20_000 * MS), stream(BE, "be", 60_000 * MS)];
    config.params = params;
    config
}

/// A context with no workers' history and the given params (for parameter tests).
pub fn ctx(params: &[(&str, &str)]) -> Ctx {
    Ctx::new(config(4, 1_000_000, params), Box::new(NullHost::new(0, 1)))
}

/// A started CALM driver with the harness's KV footprint ([`KV`]) and Δ = 10 unless
/// `params` say otherwise.
pub fn driver(batch: u32, kv_tokens: u64, params: &[(&str, &str)]) -> Driver<Calm> {
    let kv = KV.to_string();
    let mut all: Vec<(&str, &str)> = vec![("kv_bytes_per_token", &kv), ("frame_steps", "10")];
    all.retain(|(k, _)| !params.iter().any(|(p, _)| p == k));
    all.extend_from_slice(params);
    Driver::<Calm>::new(config(batch, kv_tokens, &all), Box::new(NullHost::new(0, 1))).expect("init").0
}

/// A request of `stream` sent at `at` with `prompt` tokens and a hint of `hint` output tokens.
pub fn request(id: u64, stream: u32, at: u64, prompt: u32, hint: u32) -> Request {
    let slo = [2000 * MS, 20_000 * MS, 60_000 * MS][stream as usize];
    Request { input_size: prompt, expected_tokens: hint, ..yardmaster_sdk::testing::request(id, stream, at, at + slo) }
}

/// The requests dispatched in `actions` (the first dispatch).
pub fn dispatched(actions: &[Action]) -> Vec<u64> {
    yardmaster_sdk::testing::dispatches(actions).into_iter().next().map(|(_, requests)| requests).unwrap_or_default()
}

/// A frame report for worker 0: each `(id, generated, finished)` with its KV.
pub fn frame(steps: u32, duration: u64, sequences: &[(u64, u32, u32, bool)]) -> Event {
    Event::Frame(frame_report(0, steps, duration, sequences, KV))
}
