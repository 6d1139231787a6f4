//! A small native harness for CALM's tests: one iteration-level worker with a
//! 10 ms decode step, streams `ls`, `ds` and `be`, and a driver fed by hand.

use yardmaster_sdk::{
    Action, Config, Ctx, DeviceKind, Driver, Event, FrameReport, LatencyPoint, NullHost, Param, Request,
    SequenceState, Stage, StageKind, Stream, Variant, Worker,
};

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
    Config {
        arm: "test".into(),
        stages: vec![Stage {
            id: 0,
            name: "generate".into(),
            kind: StageKind::Iteration,
            successors: vec![],
            predecessors: vec![],
            variants: vec![Variant {
                id: 0,
                name: "llm".into(),
                accuracy: 1.0,
                profile: vec![LatencyPoint { batch: 1, mean: 10 * MS, tail: 10 * MS }],
                memory_bytes: 0,
                fan_out: 1.0,
            }],
            max_batch: batch,
            min_replicas: 1,
            max_replicas: 1,
        }],
        workers: vec![Worker { id: 0, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: kv_tokens * KV }],
        streams: vec![stream(LS, "ls", 2000 * MS), stream(DS, "ds", 20_000 * MS), stream(BE, "be", 60_000 * MS)],
        params,
        tick_interval: 1000 * MS,
        max_workers: 1,
        seed: 1,
        now: 0,
    }
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
    Request {
        id,
        origin: id,
        stage: 0,
        stream,
        sent_at: at,
        arrived_at: at,
        deadline: at + slo,
        priority: 0,
        input_size: prompt,
        expected_tokens: hint,
        requeues: 0,
        tags: None,
    }
}

/// The requests dispatched in `actions` (the first dispatch).
pub fn dispatched(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Dispatch(d) => Some(d.requests.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// A frame report for worker 0: each `(id, generated, finished)` with its KV.
pub fn frame(steps: u32, duration: u64, sequences: &[(u64, u32, u32, bool)]) -> Event {
    Event::Frame(FrameReport {
        worker: 0,
        steps,
        duration,
        sequences: sequences
            .iter()
            .map(|&(id, prompt, generated, finished)| SequenceState {
                id,
                generated,
                kv_bytes: (prompt + generated) as u64 * KV,
                finished,
            })
            .collect(),
        kv_capacity: 0,
    })
}
