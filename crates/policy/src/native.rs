//! Policies compiled into the host: the same SDK policy code that builds as a
//! component, driven directly. The built-in fallback (`fifo`) runs this way, and the
//! decision-cost benchmark uses it as the native baseline.
//!
//! The conversions here mirror the component's marshalling: host types are copied
//! into the SDK's types on the way in and back on the way out (with the contract's
//! conversion macros, as between contract versions).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant as WallInstant;

use yardmaster_sdk as sdk;

use super::contract as host;
use super::contract::convert::{cases, payloads, record, Convert};
use super::instance::{check_action_count, log_policy_line, CallCost, PolicyFault, PolicyInstance};
use super::sandbox::CallKind;

/// The host services a native policy sees.
struct NativeHost {
    label: Arc<str>,
    now: AtomicU64,
    rng: Mutex<u64>,
    emitted: Mutex<Vec<(String, f64)>>,
}

/// The handle a native policy's context holds.
struct SharedHost(Arc<NativeHost>);

impl sdk::Host for SharedHost {
    fn now(&self) -> u64 {
        self.0.now.load(Ordering::Relaxed)
    }
    fn log(&self, level: sdk::Level, message: &str) {
        log_policy_line(&self.0.label, level.convert(), message);
    }
    fn profile(&self, _stage: u32, _variant: u32, _batch: u32) -> Option<u64> {
        None
    }
    fn emit(&self, name: &str, value: f64) {
        self.0.emitted.lock().unwrap().push((name.to_string(), value));
    }
    fn random(&self) -> u64 {
        let mut state = self.0.rng.lock().unwrap();
        let (next, value) = sdk::splitmix64(*state);
        *state = next;
        value
    }
}

/// An SDK policy running as native code.
pub struct NativePolicy<P: sdk::Policy + Send> {
    name: String,
    host: Arc<NativeHost>,
    driver: Option<sdk::Driver<P>>,
    max_actions: usize,
    last_cost: CallCost,
}

impl<P: sdk::Policy + Send> NativePolicy<P> {
    /// A native instance of `P` named `name`, with the host's random source at `seed`.
    pub fn new(name: &str, seed: u64, max_actions: usize) -> Self {
        let host = Arc::new(NativeHost {
            label: format!("{name}(native)").into(),
            now: AtomicU64::new(0),
            rng: Mutex::new(seed),
            emitted: Mutex::new(Vec::new()),
        });
        Self { name: name.into(), host, driver: None, max_actions, last_cost: CallCost::default() }
    }
}

impl<P: sdk::Policy + Send> PolicyInstance for NativePolicy<P> {
    fn label(&self) -> String {
        self.host.label.to_string()
    }

    fn init(&mut self, config: &host::Config, now: u64) -> Result<Vec<host::Action>, PolicyFault> {
        self.host.now.store(now, Ordering::Relaxed);
        let started = WallInstant::now();
        let config = config_to_sdk(config);
        let host: Box<dyn sdk::Host + Send> = Box::new(SharedHost(self.host.clone()));
        let result = catch_unwind(AssertUnwindSafe(|| sdk::Driver::<P>::new(config, host)))
            .map_err(|panic| PolicyFault::Trap(panic_message(&self.name, panic)))?;
        self.last_cost = CallCost { wall: started.elapsed(), fuel: None };
        let (driver, actions) = result.map_err(PolicyFault::InitRefused)?;
        self.driver = Some(driver);
        check_action_count(actions.into_iter().map(action_from_sdk).collect(), self.max_actions)
    }

    fn handle(&mut self, events: &[host::Event], now: u64, _kind: CallKind) -> Result<Vec<host::Action>, PolicyFault> {
        self.host.now.store(now, Ordering::Relaxed);
        let started = WallInstant::now();
        let driver = self.driver.as_mut().ok_or_else(|| PolicyFault::Trap("handle called before init".into()))?;
        let events: Vec<sdk::Event> = events.iter().map(event_to_sdk).collect();
        let actions = catch_unwind(AssertUnwindSafe(|| driver.handle(now, events)))
            .map_err(|panic| PolicyFault::Trap(panic_message(&self.name, panic)))?;
        let actions: Vec<host::Action> = actions.into_iter().map(action_from_sdk).collect();
        self.last_cost = CallCost { wall: started.elapsed(), fuel: None };
        check_action_count(actions, self.max_actions)
    }

    fn last_cost(&self) -> CallCost {
        self.last_cost
    }

    fn take_emitted(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.host.emitted.lock().unwrap())
    }
}

fn panic_message(name: &str, panic: Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    format!("native policy {name} panicked: {text}")
}

/// Copy a host configuration into the SDK's types.
pub fn config_to_sdk(config: &host::Config) -> sdk::Config {
    config.clone().convert()
}

/// Copy a host event into the SDK's types.
pub fn event_to_sdk(event: &host::Event) -> sdk::Event {
    event.clone().convert()
}

/// Copy an SDK action into the host's types.
pub fn action_from_sdk(action: sdk::Action) -> host::Action {
    action.convert()
}

// The SDK's types are the latest contract's, generated a second time (by wit-bindgen,
// for the guest side): the same records, field by field.
record!(host::Config => sdk::Config { arm, stages, workers, streams, hosts, params, tick_interval, max_workers, seed, now });
record!(host::Stage => sdk::Stage {
    id, name, kind, successors, predecessors, variants, max_batch, min_replicas, max_replicas
});
record!(host::Variant => sdk::Variant { id, name, accuracy, profile, memory_bytes, fan_out });
record!(host::LatencyPoint => sdk::LatencyPoint { batch, mean, tail });
cases!(host::StageKind => sdk::StageKind { Batch, Iteration });
cases!(host::DeviceKind => sdk::DeviceKind { Cpu, Gpu });
record!(host::Worker => sdk::Worker { id, stage, variant, device, host, slot, threads, memory_bytes });
record!(host::HostInfo => sdk::HostInfo { id, name, slots, cache_capacity });
record!(host::Stream => sdk::Stream { id, name, entry, slo });
record!(host::Param => sdk::Param { key, value });
payloads!(host::Event => sdk::Event {
    Arrival, WorkerIdle, BatchDone, Frame, Tick, Timer, WorkerAdded, WorkerRemoved, RequestEnded
});
record!(host::Request => sdk::Request {
    id, origin, stage, stream, sent_at, arrived_at, deadline, priority, input_size, expected_tokens, requeues, tags, items, correlation
});
record!(host::Correlation => sdk::Correlation { id, start, end, worker });
record!(host::Tag => sdk::Tag { key, value });
record!(host::BatchOutcome => sdk::BatchOutcome { worker, started_at, duration, results });
record!(host::RequestResult => sdk::RequestResult { id, status, tokens });
cases!(host::RequestStatus => sdk::RequestStatus { Ok, Failed });
record!(host::FrameReport => sdk::FrameReport { worker, steps, duration, sequences, kv_capacity });
record!(host::SequenceState => sdk::SequenceState { id, generated, kv_bytes, finished });
record!(host::Snapshot => sdk::Snapshot { at, stages, workers, host_memory_used, host_memory_capacity, hosts });
record!(host::StageStats => sdk::StageStats {
    stage, queue_length, queue_delay, arrival_rate, throughput, mean_batch, replicas, starting, batch_limit
});
record!(host::WorkerStats => sdk::WorkerStats {
    worker, stage, variant, busy, utilisation, last_batch, threads, memory_used, memory_capacity
});
record!(host::HostStats => sdk::HostStats { id, free_slots, replicas, cache_used, cache_capacity, cached });
record!(host::CachedParameters => sdk::CachedParameters { stage, variant, bytes, last_used });
cases!(host::EndReason => sdk::EndReason { Cancelled, Expired, Failed });

payloads!(sdk::Action => host::Action {
    Drop, Dispatch, Preempt, Evict, Scale, SetVariant, SetRoutes, SetBatchLimit, SetThreads, Defer, SetTimer
});
record!(sdk::DropRequest => host::DropRequest { request, reason });
cases!(sdk::DropReason => host::DropReason { DeadlineUnreachable, Overload, QueueFull, Preempted, Policy });
record!(sdk::Dispatch => host::Dispatch { worker, requests, variant });
record!(sdk::Evict => host::Evict { sequence, mode });
cases!(sdk::EvictMode => host::EvictMode { Recompute, Swap });
record!(sdk::Scale => host::Scale { stage, replicas, variant, placement });
record!(sdk::Placement => host::Placement { host, slot });
record!(sdk::SetVariant => host::SetVariant { target, variant });
payloads!(sdk::VariantTarget => host::VariantTarget { Worker, Stage });
record!(sdk::SetRoutes => host::SetRoutes { stage, source, targets });
record!(sdk::Route => host::Route { worker, weight });
record!(sdk::SetBatchLimit => host::SetBatchLimit { stage, limit });
record!(sdk::SetThreads => host::SetThreads { worker, threads });
record!(sdk::Defer => host::Defer { request, until });
record!(sdk::SetTimer => host::SetTimer { at, token });
cases!(sdk::Level => host::Level { Trace, Debug, Info, Warn, Error });
