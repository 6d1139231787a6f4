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

use crate::policy::contract::*;
use crate::policy::{
    CallKind, Limits, Mode, NativePolicy, PolicyInstance, PolicyLoader, PolicyModule, Sandbox,
    WasmPolicy,
};

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
            .map(|id| Worker { id, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0 })
            .collect(),
        streams: vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 100 * MS }],
        params: vec![],
        tick_interval: 1_000 * MS,
        max_workers: WORKERS,
        seed: 1,
        now: 0,
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
            let mut wasm = WasmPolicy::instantiate(sandbox, module.clone(), 1, None)
                .map_err(|f| anyhow::anyhow!("instantiate: {f}"))?;
            let (wasm_time, wasm_answers) = replay(&mut wasm, &stream);
            let (native_time, native_answers) = replay(native().as_mut(), &stream);
            anyhow::ensure!(
                wasm_answers == native_answers,
                "the component and the native build answered differently (batch {batch})"
            );
            wasm_times.push(wasm_time.as_nanos() as f64 / events);
            native_times.push(native_time.as_nanos() as f64 / events);
        }
        rows.push(BenchRow { batch, calls, wasm_ns: median(&mut wasm_times), native_ns: median(&mut native_times) });
    }
    Ok(rows)
}

/// Benchmark the shipped `edf` policy.
pub fn bench_edf(batches: &[usize], events_per_run: usize, repetitions: usize) -> anyhow::Result<Vec<BenchRow>> {
    // The deadline bounds runaway policies; a benchmark on a busy machine must not trip it.
    let limits = Limits { event_deadline: std::time::Duration::from_secs(1), ..Limits::default() };
    let sandbox = Sandbox::new(Mode::Serve, limits)?;
    let loader = PolicyLoader::new(sandbox.clone(), None);
    let artifact = yardmaster_policy_artifacts::shipped("edf").expect("edf is shipped");
    let module = loader.load("edf", artifact.bytes)?;
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
