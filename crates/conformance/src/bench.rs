//! Decision cost of a policy as a WebAssembly component against the same policy code
//! compiled natively, on the same recorded event stream (`yardmaster policy bench`).
//!
//! The stream is recorded once by driving the native policy through a synthetic
//! single-stage cluster: each call carries `batch` events, three in four of them
//! arrivals and the rest idle workers returning. Both variants then replay exactly
//! those calls into a fresh instance; their answers must be identical, and only the
//! `handle` calls are timed (marshalling of events and actions included on both
//! sides). Timings are the median of several repetitions.

use std::time::{Duration, Instant as WallInstant};

use yardmaster_policy::contract::*;
use yardmaster_policy::{CallKind, Limits, Mode, NativePolicy, PolicyInstance, PolicyLoader, PolicyModule, Sandbox, WasmPolicy};

const MS: u64 = 1_000_000;
const WORKERS: u32 = 16;

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Events per call.
    pub batch: usize,
    /// Calls in the stream.
    pub calls: usize,
    /// Median nanoseconds per event as a component.
    pub wasm_ns: f64,
    /// Median nanoseconds per event native.
    pub native_ns: f64,
}

impl BenchRow {
    /// Component cost over native cost.
    pub fn ratio(&self) -> f64 {
        self.wasm_ns / self.native_ns
    }
}

/// The single-stage configuration the stream runs on.
pub fn bench_config() -> Config {
    let profile = [1u32, 2, 4, 8, 16]
        .iter()
        .map(|&b| LatencyPoint { batch: b, mean: 2 * MS + b as u64 * MS / 2, tail: 3 * MS + b as u64 * MS })
        .collect();
    Config {
        arm: "bench".into(),
        stages: vec![Stage {
            id: 0,
            name: "model".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants: vec![Variant { id: 0, name: "model".into(), accuracy: 1.0, profile, memory_bytes: 0, fan_out: 1.0 }],
            max_batch: 16,
            min_replicas: 1,
            max_replicas: WORKERS,
        }],
        workers: (0..WORKERS)
            .map(|id| Worker { id, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 })
            .collect(),
        streams: vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 100 * MS }],
        params: vec![],
        tick_interval: 1_000 * MS,
        max_workers: WORKERS,
        seed: 1,
        now: 0,
        hosts: Vec::new(),
    }
}

/// A recorded stream: (time, events) per call.
pub type EventStream = Vec<(u64, Vec<Event>)>;

/// Record `calls` calls of `batch` events by driving `recorder`.
pub fn record_stream(recorder: &mut dyn PolicyInstance, batch: usize, calls: usize) -> EventStream {
    let config = bench_config();
    recorder.init(&config, 0).expect("recorder init");
    let mut stream = Vec::with_capacity(calls);
    let mut rng = 0x5eed_u64;
    let mut next_id = 1u64;
    // Workers start idle; a dispatched worker comes back after a few calls.
    let mut returning: Vec<(usize, u32)> = Vec::new();
    let mut idle: Vec<u32> = (0..WORKERS).collect();
    for call in 0..calls {
        let now = call as u64 * MS / 4;
        let mut events = Vec::with_capacity(batch);
        // Idle workers first (those released in earlier calls), at most a quarter of the batch.
        let mut back: Vec<u32> = Vec::new();
        returning.retain(|&(due, w)| {
            if due <= call && back.len() < batch / 4 + 1 {
                back.push(w);
                false
            } else {
                true
            }
        });
        for w in back.into_iter().chain(idle.drain(..)) {
            if events.len() < batch {
                events.push(Event::WorkerIdle(w));
            } else {
                returning.push((call, w));
            }
        }
        while events.len() < batch {
            let (state, value) = yardmaster_sdk::splitmix64(rng);
            rng = state;
            // A few deadlines are too tight for even a batch of one (2.5 ms).
            let slack = MS + value % (200 * MS);
            events.push(Event::Arrival(Request {
                id: next_id,
                origin: next_id,
                stage: 0,
                stream: 0,
                sent_at: now,
                arrived_at: now,
                deadline: now + slack,
                priority: 0,
                input_size: 1,
                expected_tokens: 0,
                requeues: 0,
                tags: None,
                items: 1,
                correlation: None,
            }));
            next_id += 1;
        }
        let actions = recorder.handle(&events, now, CallKind::Events).expect("recorder call");
        for action in &actions {
            if let Action::Dispatch(d) = action {
                returning.push((call + 3, d.worker));
            }
        }
        stream.push((now, events));
    }
    stream
}

/// Replay `stream` into `instance`; returns the wall time of the `handle` calls and
/// every answer.
pub fn replay(instance: &mut dyn PolicyInstance, stream: &EventStream) -> (Duration, Vec<Vec<Action>>) {
    instance.init(&bench_config(), 0).expect("init");
    let mut answers = Vec::with_capacity(stream.len());
    let mut total = Duration::ZERO;
    for (now, events) in stream {
        let started = WallInstant::now();
        let actions = instance.handle(events, *now, CallKind::Events).expect("policy call");
        total += started.elapsed();
        answers.push(actions);
    }
    (total, answers)
}

/// Measure one policy: `native` builds the native instance; `module` is its component.
pub fn measure(
    module: &std::sync::Arc<PolicyModule>,
    sandbox: &Sandbox,
    native: &dyn Fn() -> Box<dyn PolicyInstance>,
    batches: &[usize],
    events_per_run: usize,
    repetitions: usize,
) -> anyhow::Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    for &batch in batches {
        let calls = (events_per_run / batch).max(1);
        let stream = record_stream(native().as_mut(), batch, calls);
        let events = (calls * batch) as f64;
        let mut wasm_times = Vec::new();
        let mut native_times = Vec::new();
        for _ in 0..repetitions {
            let mut wasm = WasmPolicy::instantiate(sandbox, module.clone(), 1, None).map_err(|f| anyhow::anyhow!("instantiate: {f}"))?;
            let (wasm_time, wasm_answers) = replay(&mut wasm, &stream);
            let (native_time, native_answers) = replay(native().as_mut(), &stream);
            anyhow::ensure!(wasm_answers == native_answers, "the component and the native build answered differently (batch {batch})");
            wasm_times.push(wasm_time.as_nanos() as f64 / events);
            native_times.push(native_time.as_nanos() as f64 / events);
        }
        rows.push(BenchRow { batch, calls, wasm_ns: median(&mut wasm_times), native_ns: median(&mut native_times) });
    }
    Ok(rows)
}

/// The shipped policy `name` compiled in a sandbox of `mode` with `limits`.
fn shipped_component(name: &str, mode: Mode, limits: Limits) -> anyhow::Result<(Sandbox, std::sync::Arc<PolicyModule>)> {
    let sandbox = Sandbox::new(mode, limits)?;
    let artifact = yardmaster_policy_artifacts::shipped(name).ok_or_else(|| anyhow::anyhow!("{name} is not a shipped policy"))?;
    let module = PolicyLoader::new(sandbox.clone(), None).load(name, artifact.bytes)?;
    Ok((sandbox, module))
}

/// Set to the path of an `edf` component (one built without stripping its names, for
/// a profile), `bench_edf` measures that file instead of the shipped one.
pub const EDF_OVERRIDE_ENV: &str = "YARDMASTER_BENCH_EDF_WASM";

/// Benchmark the shipped `edf` policy.
pub fn bench_edf(batches: &[usize], events_per_run: usize, repetitions: usize) -> anyhow::Result<Vec<BenchRow>> {
    // The deadline bounds runaway policies; a benchmark on a busy machine must not trip it.
    let limits = Limits { event_deadline: std::time::Duration::from_secs(1), ..Limits::default() };
    let (sandbox, module) = match std::env::var_os(EDF_OVERRIDE_ENV) {
        Some(path) => {
            let sandbox = Sandbox::new(Mode::Serve, limits)?;
            let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("read {}: {e}", path.to_string_lossy()))?;
            let module = PolicyLoader::new(sandbox.clone(), None).load("edf", &bytes)?;
            (sandbox, module)
        }
        None => shipped_component("edf", Mode::Serve, limits)?,
    };
    let max_actions = sandbox.limits().max_actions;
    measure(
        &module,
        &sandbox,
        &|| Box::new(NativePolicy::<policy_edf::Edf>::new("edf", 1, max_actions)),
        batches,
        events_per_run,
        repetitions,
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// One row of the CALM frame-plan benchmark: the time of one `FRAME_PLAN` over
/// `requests` waiting requests (CALM spec property 15: at most 20 ms natively for
/// 4,096, the component at most 3× that).
#[derive(Debug, Clone, PartialEq)]
pub struct FramePlanRow {
    /// Requests waiting when the worker becomes idle.
    pub requests: usize,
    /// Requests the plan dispatched.
    pub dispatched: usize,
    /// Median milliseconds of the planning call as a component.
    pub wasm_ms: f64,
    /// Median milliseconds of the planning call native.
    pub native_ms: f64,
}

impl FramePlanRow {
    /// Component time over native time.
    pub fn ratio(&self) -> f64 {
        self.wasm_ms / self.native_ms
    }
}

/// Largest frame of the frame-plan benchmark (the spec's simulated `max_num_seqs`).
const FRAME_BATCH: u32 = 64;

/// One iteration-level worker (B = 64, 80 GiB of KV cache) serving `ls` and `ds`.
fn frame_config() -> Config {
    let profile = [1u32, 16, 64]
        .iter()
        .map(|&b| LatencyPoint { batch: b, mean: 12 * MS + b as u64 * MS / 4, tail: 15 * MS + b as u64 * MS / 3 })
        .collect();
    let mut config = bench_config();
    config.arm = "bench-frame".into();
    config.stages[0] = Stage {
        name: "generate".into(),
        kind: StageKind::Iteration,
        variants: vec![Variant { id: 0, name: "llm".into(), accuracy: 1.0, profile, memory_bytes: 0, fan_out: 1.0 }],
        max_batch: FRAME_BATCH,
        max_replicas: 1,
        ..config.stages[0].clone()
    };
    config.workers =
        vec![Worker { id: 0, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 80 << 30, host: 0, slot: 0 }];
    config.streams = vec![
        Stream { id: 0, name: "ls".into(), entry: 0, slo: 2_000 * MS },
        Stream { id: 1, name: "ds".into(), entry: 0, slo: 20_000 * MS },
    ];
    config.max_workers = 1;
    config
}

/// `requests` arrivals: LS and DS alternating, prompts of 16–4,015 tokens and outputs
/// of 8–519, deterministic.
fn frame_arrivals(requests: usize) -> Vec<Event> {
    let mut rng = 0xca1_u64;
    (1..=requests as u64)
        .map(|id| {
            let (state, value) = yardmaster_sdk::splitmix64(rng);
            rng = state;
            Event::Arrival(Request {
                id,
                origin: id,
                stage: 0,
                stream: (id % 2) as u32,
                sent_at: 0,
                arrived_at: 0,
                deadline: if id % 2 == 0 { 2_000 * MS } else { 20_000 * MS },
                priority: 0,
                input_size: 16 + (value % 4_000) as u32,
                expected_tokens: 8 + ((value >> 32) % 512) as u32,
                requeues: 0,
                tags: None,
                items: 1,
                correlation: None,
            })
        })
        .collect()
}

/// The planning call: `requests` arrive while the worker is busy (not timed), then
/// the worker reports idle and the policy plans one frame over all of them (timed).
/// Returns the planning call's wall time and its answer.
fn plan_once(instance: &mut dyn PolicyInstance, arrivals: &[Event]) -> (Duration, Vec<Action>) {
    instance.init(&frame_config(), 0).expect("init");
    instance.handle(arrivals, MS, CallKind::Events).expect("arrivals");
    let started = WallInstant::now();
    let actions = instance.handle(&[Event::WorkerIdle(0)], 2 * MS, CallKind::Events).expect("frame plan");
    (started.elapsed(), actions)
}

/// Benchmark one CALM frame plan over each of `requests` waiting requests, native and
/// as the shipped component; both must answer alike.
pub fn bench_calm_frame(requests: &[usize], repetitions: usize) -> anyhow::Result<Vec<FramePlanRow>> {
    // A planning call over thousands of requests is far longer than a serving deadline.
    let limits = Limits { event_deadline: Duration::from_secs(30), event_fuel: u64::MAX / 4, ..Limits::default() };
    let (sandbox, module) = shipped_component("calm", Mode::Simulate, limits)?;
    let max_actions = sandbox.limits().max_actions;
    let mut rows = Vec::new();
    for &count in requests {
        let arrivals = frame_arrivals(count);
        let (mut wasm_times, mut native_times) = (Vec::new(), Vec::new());
        let mut dispatched = 0;
        for _ in 0..repetitions.max(1) {
            // Each instance plans twice and the second plan is timed: a serving
            // instance has grown its memory long before (the first plan of a fresh
            // component pays for growing its linear memory).
            let mut wasm = WasmPolicy::instantiate(&sandbox, module.clone(), 1, None).map_err(|f| anyhow::anyhow!("instantiate: {f}"))?;
            plan_once(&mut wasm, &arrivals);
            let (wasm_time, wasm_actions) = plan_once(&mut wasm, &arrivals);
            let mut native = NativePolicy::<policy_calm::Calm>::new("calm", 1, max_actions);
            plan_once(&mut native, &arrivals);
            let (native_time, native_actions) = plan_once(&mut native, &arrivals);
            anyhow::ensure!(wasm_actions == native_actions, "the component and the native build planned differently ({count} requests)");
            dispatched = native_actions.iter().map(|a| if let Action::Dispatch(d) = a { d.requests.len() } else { 0 }).sum();
            wasm_times.push(wasm_time.as_secs_f64() * 1e3);
            native_times.push(native_time.as_secs_f64() * 1e3);
        }
        rows.push(FramePlanRow { requests: count, dispatched, wasm_ms: median(&mut wasm_times), native_ms: median(&mut native_times) });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness itself (timings are reported by `yardmaster policy bench-frame`,
    /// not asserted): the plan fills one frame of at most B sequences from the
    /// waiting requests, and the component plans exactly as the native build.
    #[test]
    fn a_frame_plan_dispatches_one_frame_alike_native_and_as_a_component() {
        let rows = bench_calm_frame(&[200], 1).expect("bench runs");
        assert_eq!(rows[0].requests, 200);
        assert!((1..=FRAME_BATCH as usize).contains(&rows[0].dispatched), "{rows:?}");
        assert!(rows[0].native_ms > 0.0 && rows[0].wasm_ms > 0.0);
    }
}
