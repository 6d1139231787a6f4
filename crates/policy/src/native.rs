//! Policies compiled into the host: the same SDK policy code that builds as a
//! component, driven directly. The built-in fallback (`fifo`) runs this way, and the
//! decision-cost benchmark uses it as the native baseline.
//!
//! The conversions here mirror the component's marshalling: host types are copied
//! into the SDK's types on the way in and back on the way out.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant as WallInstant;

use yardmaster_sdk as sdk;

use super::contract as host;
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
        let level = match level {
            sdk::Level::Trace => host::Level::Trace,
            sdk::Level::Debug => host::Level::Debug,
            sdk::Level::Info => host::Level::Info,
            sdk::Level::Warn => host::Level::Warn,
            sdk::Level::Error => host::Level::Error,
        };
        log_policy_line(&self.0.label, level, message);
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
    sdk::Config {
        arm: config.arm.clone(),
        stages: config.stages.iter().map(stage_to_sdk).collect(),
        workers: config.workers.iter().map(worker_to_sdk).collect(),
        streams: config.streams.iter().map(|s| sdk::Stream { id: s.id, name: s.name.clone(), entry: s.entry, slo: s.slo }).collect(),
        params: config.params.iter().map(|p| sdk::Param { key: p.key.clone(), value: p.value.clone() }).collect(),
        tick_interval: config.tick_interval,
        max_workers: config.max_workers,
        seed: config.seed,
        now: config.now,
    }
}

fn stage_to_sdk(stage: &host::Stage) -> sdk::Stage {
    sdk::Stage {
        id: stage.id,
        name: stage.name.clone(),
        kind: match stage.kind {
            host::StageKind::Batch => sdk::StageKind::Batch,
            host::StageKind::Iteration => sdk::StageKind::Iteration,
        },
        successors: stage.successors.clone(),
        predecessors: stage.predecessors.clone(),
        variants: stage
            .variants
            .iter()
            .map(|v| sdk::Variant {
                id: v.id,
                name: v.name.clone(),
                accuracy: v.accuracy,
                profile: v.profile.iter().map(|p| sdk::LatencyPoint { batch: p.batch, mean: p.mean, tail: p.tail }).collect(),
                memory_bytes: v.memory_bytes,
                fan_out: v.fan_out,
            })
            .collect(),
        max_batch: stage.max_batch,
        min_replicas: stage.min_replicas,
        max_replicas: stage.max_replicas,
    }
}

fn worker_to_sdk(worker: &host::Worker) -> sdk::Worker {
    sdk::Worker {
        id: worker.id,
        stage: worker.stage,
        variant: worker.variant,
        device: match worker.device {
            host::DeviceKind::Cpu => sdk::DeviceKind::Cpu,
            host::DeviceKind::Gpu => sdk::DeviceKind::Gpu,
        },
        threads: worker.threads,
        memory_bytes: worker.memory_bytes,
    }
}

fn request_to_sdk(r: &host::Request) -> sdk::Request {
    sdk::Request {
        id: r.id,
        origin: r.origin,
        stage: r.stage,
        stream: r.stream,
        sent_at: r.sent_at,
        arrived_at: r.arrived_at,
        deadline: r.deadline,
        priority: r.priority,
        input_size: r.input_size,
        expected_tokens: r.expected_tokens,
        requeues: r.requeues,
        tags: r.tags.as_ref().map(|tags| tags.iter().map(|t| sdk::Tag { key: t.key.clone(), value: t.value.clone() }).collect()),
    }
}

/// Copy a host event into the SDK's types.
pub fn event_to_sdk(event: &host::Event) -> sdk::Event {
    match event {
        host::Event::Arrival(r) => sdk::Event::Arrival(request_to_sdk(r)),
        host::Event::WorkerIdle(w) => sdk::Event::WorkerIdle(*w),
        host::Event::BatchDone(b) => sdk::Event::BatchDone(sdk::BatchOutcome {
            worker: b.worker,
            started_at: b.started_at,
            duration: b.duration,
            results: b
                .results
                .iter()
                .map(|r| sdk::RequestResult {
                    id: r.id,
                    status: match r.status {
                        host::RequestStatus::Ok => sdk::RequestStatus::Ok,
                        host::RequestStatus::Failed => sdk::RequestStatus::Failed,
                    },
                    tokens: r.tokens,
                })
                .collect(),
        }),
        host::Event::Frame(f) => sdk::Event::Frame(sdk::FrameReport {
            worker: f.worker,
            steps: f.steps,
            duration: f.duration,
            sequences: f
                .sequences
                .iter()
                .map(|s| sdk::SequenceState { id: s.id, generated: s.generated, kv_bytes: s.kv_bytes, finished: s.finished })
                .collect(),
            kv_capacity: f.kv_capacity,
        }),
        host::Event::Tick(s) => sdk::Event::Tick(sdk::Snapshot {
            at: s.at,
            stages: s
                .stages
                .iter()
                .map(|st| sdk::StageStats {
                    stage: st.stage,
                    queue_length: st.queue_length,
                    queue_delay: st.queue_delay,
                    arrival_rate: st.arrival_rate,
                    throughput: st.throughput,
                    mean_batch: st.mean_batch,
                    replicas: st.replicas,
                    starting: st.starting,
                    batch_limit: st.batch_limit,
                })
                .collect(),
            workers: s
                .workers
                .iter()
                .map(|w| sdk::WorkerStats {
                    worker: w.worker,
                    stage: w.stage,
                    variant: w.variant,
                    busy: w.busy,
                    utilisation: w.utilisation,
                    last_batch: w.last_batch,
                    threads: w.threads,
                    memory_used: w.memory_used,
                    memory_capacity: w.memory_capacity,
                })
                .collect(),
            host_memory_used: s.host_memory_used,
            host_memory_capacity: s.host_memory_capacity,
        }),
        host::Event::Timer(t) => sdk::Event::Timer(*t),
        host::Event::WorkerAdded(w) => sdk::Event::WorkerAdded(worker_to_sdk(w)),
        host::Event::WorkerRemoved(w) => sdk::Event::WorkerRemoved(*w),
        host::Event::RequestEnded((id, reason)) => sdk::Event::RequestEnded((
            *id,
            match reason {
                host::EndReason::Cancelled => sdk::EndReason::Cancelled,
                host::EndReason::Expired => sdk::EndReason::Expired,
                host::EndReason::Failed => sdk::EndReason::Failed,
            },
        )),
    }
}

/// Copy an SDK action into the host's types.
pub fn action_from_sdk(action: sdk::Action) -> host::Action {
    match action {
        sdk::Action::Drop(d) => host::Action::Drop(host::DropRequest {
            request: d.request,
            reason: match d.reason {
                sdk::DropReason::DeadlineUnreachable => host::DropReason::DeadlineUnreachable,
                sdk::DropReason::Overload => host::DropReason::Overload,
                sdk::DropReason::QueueFull => host::DropReason::QueueFull,
                sdk::DropReason::Preempted => host::DropReason::Preempted,
                sdk::DropReason::Policy => host::DropReason::Policy,
            },
        }),
        sdk::Action::Dispatch(d) => host::Action::Dispatch(host::Dispatch { worker: d.worker, requests: d.requests, variant: d.variant }),
        sdk::Action::Preempt(w) => host::Action::Preempt(w),
        sdk::Action::Evict(e) => host::Action::Evict(host::Evict {
            sequence: e.sequence,
            mode: match e.mode {
                sdk::EvictMode::Recompute => host::EvictMode::Recompute,
                sdk::EvictMode::Swap => host::EvictMode::Swap,
            },
        }),
        sdk::Action::Scale(s) => host::Action::Scale(host::Scale { stage: s.stage, replicas: s.replicas, variant: s.variant }),
        sdk::Action::SetVariant(s) => host::Action::SetVariant(host::SetVariant {
            target: match s.target {
                sdk::VariantTarget::Worker(w) => host::VariantTarget::Worker(w),
                sdk::VariantTarget::Stage(st) => host::VariantTarget::Stage(st),
            },
            variant: s.variant,
        }),
        sdk::Action::SetRoutes(r) => host::Action::SetRoutes(host::SetRoutes {
            stage: r.stage,
            source: r.source,
            targets: r.targets.into_iter().map(|t| host::Route { worker: t.worker, weight: t.weight }).collect(),
        }),
        sdk::Action::SetBatchLimit(b) => host::Action::SetBatchLimit(host::SetBatchLimit { stage: b.stage, limit: b.limit }),
        sdk::Action::SetThreads(t) => host::Action::SetThreads(host::SetThreads { worker: t.worker, threads: t.threads }),
        sdk::Action::Defer(d) => host::Action::Defer(host::Defer { request: d.request, until: d.until }),
        sdk::Action::SetTimer(t) => host::Action::SetTimer(host::SetTimer { at: t.at, token: t.token }),
    }
}
