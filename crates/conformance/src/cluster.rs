//! A small scripted cluster for the conformance harness: three stages (a two-stage
//! vision chain and an iteration-level LLM stage), four workers, two streams, and a
//! virtual clock. It applies validated actions the way the engine will (batches take
//! their profiled time, frames generate tokens, preempted and deferred requests come
//! back as arrivals, scaling starts workers after a delay) and produces the events.

use std::collections::{BTreeMap, HashMap};

use yardmaster_policy::contract::*;
use yardmaster_policy::validate::{ClusterView, SequenceState as SeqView, StageState, WorkerState};
use yardmaster_policy::ArmOutput;

/// Milliseconds in nanoseconds.
pub const MS: u64 = 1_000_000;
/// Decode steps in one frame of the iteration stage.
pub const FRAME_STEPS: u32 = 4;
/// Start-up time of a worker added by `scale`.
pub const STARTUP: u64 = 50 * MS;

/// How a request ended (or where it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Held by the policy.
    Held,
    /// In a running batch or resident on an iteration worker.
    Running,
    /// Handed back to the host until a time.
    Deferred,
    /// Finished its last stage.
    Completed {
        /// After its deadline.
        late: bool,
    },
    /// Dropped by the policy.
    Dropped,
    /// Ended by the host (cancelled).
    Ended,
    /// Refused by a closed arm.
    Refused,
}

impl Fate {
    /// Whether the request has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Fate::Completed { .. } | Fate::Dropped | Fate::Ended | Fate::Refused)
    }
}

struct Running {
    until: u64,
    requests: Vec<u64>,
    started: u64,
}

struct SimWorker {
    info: Worker,
    running: Option<Running>,
    /// Iteration workers: resident sequences (generated, target tokens).
    resident: BTreeMap<u64, (u32, u32)>,
}

/// The scripted cluster.
pub struct ScriptedCluster {
    /// The virtual clock.
    pub now: u64,
    config: Config,
    workers: BTreeMap<u32, SimWorker>,
    batch_limits: Vec<u32>,
    replicas: Vec<u32>,
    starting: Vec<(u64, Worker)>,
    requests: HashMap<u64, (Request, Fate)>,
    timers: Vec<(u64, u64)>,
    deferred: Vec<(u64, u64)>,
    pending: Vec<Event>,
    next_worker: u32,
    /// Ends recorded per request, to prove each ends exactly once.
    ends: HashMap<u64, u32>,
    /// Problems the cluster saw (a request ending twice, a preempted batch lost…).
    pub violations: Vec<String>,
}

impl ScriptedCluster {
    /// The cluster's configuration for an arm named `arm`, with `params`.
    pub fn config(arm: &str, params: Vec<Param>, seed: u64) -> Config {
        let profile = |per_item: u64, base: u64| -> Vec<LatencyPoint> {
            [1u32, 2, 4, 8]
                .iter()
                .map(|&b| LatencyPoint { batch: b, mean: base + per_item * b as u64, tail: (base + per_item * b as u64) * 5 / 4 })
                .collect()
        };
        let variant = |id: u32, name: &str, accuracy: f64, p: Vec<LatencyPoint>| Variant {
            id,
            name: name.into(),
            accuracy,
            profile: p,
            memory_bytes: 256 << 20,
            fan_out: 1.0,
        };
        let worker = |id: u32, stage: u32, device: DeviceKind| Worker { id, stage, variant: 0, device, threads: 2, memory_bytes: 4 << 30 };
        Config {
            arm: arm.into(),
            stages: vec![
                Stage {
                    id: 0,
                    name: "detect".into(),
                    kind: StageKind::Batch,
                    successors: vec![1],
                    predecessors: vec![],
                    variants: vec![
                        variant(0, "detect-large", 0.92, profile(3 * MS, 4 * MS)),
                        variant(1, "detect-small", 0.85, profile(MS, 2 * MS)),
                    ],
                    max_batch: 8,
                    min_replicas: 1,
                    max_replicas: 4,
                },
                Stage {
                    id: 1,
                    name: "classify".into(),
                    kind: StageKind::Batch,
                    successors: vec![],
                    predecessors: vec![0],
                    variants: vec![variant(0, "classify", 0.9, profile(MS, 2 * MS))],
                    max_batch: 4,
                    min_replicas: 1,
                    max_replicas: 2,
                },
                Stage {
                    id: 2,
                    name: "generate".into(),
                    kind: StageKind::Iteration,
                    successors: vec![],
                    predecessors: vec![],
                    variants: vec![variant(0, "llm", 1.0, profile(MS / 4, 3 * MS))],
                    max_batch: 8,
                    min_replicas: 1,
                    max_replicas: 1,
                },
            ],
            workers: vec![
                worker(0, 0, DeviceKind::Gpu),
                worker(1, 0, DeviceKind::Gpu),
                worker(2, 1, DeviceKind::Cpu),
                worker(3, 2, DeviceKind::Gpu),
            ],
            streams: vec![
                Stream { id: 0, name: "vision".into(), entry: 0, slo: 150 * MS },
                Stream { id: 1, name: "chat".into(), entry: 2, slo: 3_000 * MS },
            ],
            params,
            tick_interval: 100 * MS,
            max_workers: 7,
            seed,
            now: 0,
        }
    }

    /// A cluster running `config`; every worker starts idle.
    pub fn new(config: &Config) -> Self {
        let workers: BTreeMap<u32, SimWorker> =
            config.workers.iter().map(|w| (w.id, SimWorker { info: *w, running: None, resident: BTreeMap::new() })).collect();
        let mut replicas = vec![0; config.stages.len()];
        for w in &config.workers {
            replicas[w.stage as usize] += 1;
        }
        Self {
            now: 0,
            batch_limits: config.stages.iter().map(|s| s.max_batch).collect(),
            replicas,
            next_worker: workers.keys().max().map_or(0, |m| m + 1),
            // The arm's hand-over tells the policy which workers are idle.
            pending: Vec::new(),
            workers,
            config: config.clone(),
            starting: Vec::new(),
            requests: HashMap::new(),
            timers: Vec::new(),
            deferred: Vec::new(),
            ends: HashMap::new(),
            violations: Vec::new(),
        }
    }

    /// Where every request stands.
    pub fn fates(&self) -> impl Iterator<Item = (&Request, Fate)> {
        self.requests.values().map(|(r, f)| (r, *f))
    }

    /// Queue an arrival event for a new request.
    pub fn arrive(&mut self, request: Request) {
        self.requests.insert(request.id, (request.clone(), Fate::Held));
        self.pending.push(Event::Arrival(request));
    }

    /// Queue an event as is (scripted worker changes, cancellations).
    pub fn push_event(&mut self, event: Event) {
        if let Event::RequestEnded((id, _)) = &event {
            self.finish(*id, Fate::Ended);
        }
        if let Event::WorkerRemoved(id) = &event {
            if let Some(w) = self.workers.remove(id) {
                self.replicas[w.info.stage as usize] -= 1;
            }
        }
        if let Event::WorkerAdded(w) = &event {
            self.workers.insert(w.id, SimWorker { info: *w, running: None, resident: BTreeMap::new() });
            self.replicas[w.stage as usize] += 1;
            self.next_worker = self.next_worker.max(w.id + 1);
        }
        self.pending.push(event);
    }

    /// A fresh worker id.
    pub fn new_worker_id(&mut self) -> u32 {
        self.next_worker += 1;
        self.next_worker - 1
    }

    /// An idle worker of a stage, if any.
    pub fn idle_worker_of(&self, stage: u32) -> Option<u32> {
        self.workers.values().find(|w| w.info.stage == stage && w.running.is_none() && w.resident.is_empty()).map(|w| w.info.id)
    }

    /// A request held by the policy, if any.
    pub fn some_held(&self) -> Option<u64> {
        let mut held: Vec<u64> = self.requests.iter().filter(|(_, (_, f))| *f == Fate::Held).map(|(id, _)| *id).collect();
        held.sort_unstable();
        held.first().copied()
    }

    /// Whether events are waiting to be delivered.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Take the events gathered so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.pending)
    }

    /// When something will next happen on its own, if anything.
    pub fn next_internal_time(&self) -> Option<u64> {
        let running = self.workers.values().filter_map(|w| w.running.as_ref().map(|r| r.until));
        let timers = self.timers.iter().map(|t| t.0);
        let deferred = self.deferred.iter().map(|d| d.0);
        let starting = self.starting.iter().map(|s| s.0);
        running.chain(timers).chain(deferred).chain(starting).min()
    }

    /// Move the clock to `t` and gather what happens up to then.
    pub fn advance_to(&mut self, t: u64) {
        self.now = self.now.max(t);
        let now = self.now;
        let due: Vec<u32> =
            self.workers.values().filter(|w| w.running.as_ref().is_some_and(|r| r.until <= now)).map(|w| w.info.id).collect();
        for id in due {
            self.finish_batch(id);
        }
        let (fired, rest): (Vec<_>, Vec<_>) = self.timers.drain(..).partition(|t| t.0 <= now);
        self.timers = rest;
        self.pending.extend(fired.into_iter().map(|(_, token)| Event::Timer(token)));
        let (back, rest): (Vec<_>, Vec<_>) = self.deferred.drain(..).partition(|d| d.0 <= now);
        self.deferred = rest;
        for (_, id) in back {
            self.requeue(id);
        }
        let (ready, rest): (Vec<_>, Vec<_>) = self.starting.drain(..).partition(|s| s.0 <= now);
        self.starting = rest;
        for (_, worker) in ready {
            let id = worker.id;
            self.workers.insert(id, SimWorker { info: worker, running: None, resident: BTreeMap::new() });
            self.pending.push(Event::WorkerAdded(worker));
            self.pending.push(Event::WorkerIdle(id));
        }
    }

    /// The telemetry snapshot now.
    pub fn snapshot(&self) -> Snapshot {
        let stages = self
            .config
            .stages
            .iter()
            .map(|s| {
                let held: Vec<&Request> =
                    self.requests.values().filter(|(r, f)| *f == Fate::Held && r.stage == s.id).map(|(r, _)| r).collect();
                let oldest = held.iter().map(|r| r.arrived_at).min().unwrap_or(self.now);
                StageStats {
                    stage: s.id,
                    queue_length: held.len() as u32,
                    queue_delay: self.now - oldest,
                    arrival_rate: 0.0,
                    throughput: 0.0,
                    mean_batch: 0.0,
                    replicas: self.replicas[s.id as usize],
                    starting: self.starting.iter().filter(|(_, w)| w.stage == s.id).count() as u32,
                    batch_limit: self.batch_limits[s.id as usize],
                }
            })
            .collect();
        let workers = self
            .workers
            .values()
            .map(|w| WorkerStats {
                worker: w.info.id,
                stage: w.info.stage,
                variant: w.info.variant,
                busy: w.running.is_some(),
                utilisation: if w.running.is_some() { 1.0 } else { 0.0 },
                last_batch: w.running.as_ref().map_or(0, |r| r.requests.len() as u32),
                threads: w.info.threads,
                memory_used: w.resident.len() as u64 * (1 << 20),
                memory_capacity: w.info.memory_bytes,
            })
            .collect();
        Snapshot { at: self.now, stages, workers, host_memory_used: 1 << 30, host_memory_capacity: 8 << 30 }
    }

    /// Apply an arm's validated answer.
    pub fn apply(&mut self, output: &ArmOutput) {
        for id in &output.refused {
            self.finish(*id, Fate::Refused);
        }
        for action in &output.actions {
            self.apply_action(action);
        }
    }

    fn apply_action(&mut self, action: &Action) {
        let now = self.now;
        match action {
            Action::Drop(d) => {
                for w in self.workers.values_mut() {
                    w.resident.remove(&d.request);
                }
                self.finish(d.request, Fate::Dropped);
            }
            Action::Dispatch(d) => {
                let Some(worker) = self.workers.get_mut(&d.worker) else { return };
                if let Some(variant) = d.variant {
                    worker.info.variant = variant;
                }
                let stage = &self.config.stages[worker.info.stage as usize];
                let profile = &stage.variants[worker.info.variant as usize].profile;
                let batch = d.requests.len() as u32;
                let per_call = interpolate(profile, batch);
                let duration = match stage.kind {
                    StageKind::Batch => per_call,
                    StageKind::Iteration => per_call * FRAME_STEPS as u64,
                };
                if stage.kind == StageKind::Iteration {
                    for id in &d.requests {
                        let target = self.requests.get(id).map_or(16, |(r, _)| r.expected_tokens.max(1));
                        worker.resident.entry(*id).or_insert((0, target));
                    }
                }
                worker.running = Some(Running { until: now + duration, requests: d.requests.clone(), started: now });
                for id in &d.requests {
                    if let Some((_, fate)) = self.requests.get_mut(id) {
                        *fate = Fate::Running;
                    }
                }
            }
            Action::Preempt(w) => {
                let Some(worker) = self.workers.get_mut(w) else { return };
                if let Some(running) = worker.running.take() {
                    for id in &running.requests {
                        worker.resident.remove(id);
                    }
                    for id in running.requests {
                        self.requeue(id);
                    }
                    self.pending.push(Event::WorkerIdle(*w));
                }
            }
            Action::Evict(e) => {
                for w in self.workers.values_mut() {
                    w.resident.remove(&e.sequence);
                }
                self.requeue(e.sequence);
            }
            Action::Scale(s) => self.scale(s.stage, s.replicas, s.variant.unwrap_or(0)),
            Action::SetVariant(v) => match v.target {
                VariantTarget::Worker(w) => {
                    if let Some(worker) = self.workers.get_mut(&w) {
                        worker.info.variant = v.variant;
                    }
                }
                VariantTarget::Stage(stage) => {
                    for worker in self.workers.values_mut().filter(|w| w.info.stage == stage) {
                        worker.info.variant = v.variant;
                    }
                }
            },
            Action::SetRoutes(_) => {}
            Action::SetBatchLimit(b) => self.batch_limits[b.stage as usize] = b.limit,
            Action::SetThreads(t) => {
                if let Some(worker) = self.workers.get_mut(&t.worker) {
                    worker.info.threads = t.threads;
                }
            }
            Action::Defer(d) => {
                if let Some((_, fate)) = self.requests.get_mut(&d.request) {
                    *fate = Fate::Deferred;
                }
                self.deferred.push((d.until, d.request));
            }
            Action::SetTimer(t) => self.timers.push((t.at, t.token)),
        }
    }

    fn scale(&mut self, stage: u32, replicas: u32, variant: u32) {
        let current = self.replicas[stage as usize];
        if replicas > current {
            for _ in current..replicas {
                let id = self.new_worker_id();
                let template = self.config.workers.iter().find(|w| w.stage == stage).cloned();
                let mut worker =
                    template.unwrap_or(Worker { id, stage, variant, device: DeviceKind::Gpu, threads: 1, memory_bytes: 4 << 30 });
                worker.id = id;
                worker.variant = variant;
                self.starting.push((self.now + STARTUP, worker));
            }
        } else {
            let idle: Vec<u32> = self
                .workers
                .values()
                .filter(|w| w.info.stage == stage && w.running.is_none() && w.resident.is_empty())
                .map(|w| w.info.id)
                .take((current - replicas) as usize)
                .collect();
            for id in idle {
                self.workers.remove(&id);
                self.pending.push(Event::WorkerRemoved(id));
            }
        }
        self.replicas[stage as usize] = replicas;
    }

    fn finish_batch(&mut self, id: u32) {
        let now = self.now;
        let worker = self.workers.get_mut(&id).expect("worker exists");
        let running = worker.running.take().expect("worker was running");
        let stage = self.config.stages[worker.info.stage as usize].clone();
        let mut results = Vec::new();
        let mut forwarded = Vec::new();
        let mut completed = Vec::new();
        match stage.kind {
            StageKind::Batch => {
                for rid in &running.requests {
                    results.push(RequestResult { id: *rid, status: RequestStatus::Ok, tokens: 0 });
                    match stage.successors.first() {
                        Some(&next) => forwarded.push((*rid, next)),
                        None => completed.push(*rid),
                    }
                }
            }
            StageKind::Iteration => {
                for rid in &running.requests {
                    if let Some(seq) = worker.resident.get_mut(rid) {
                        seq.0 += FRAME_STEPS;
                    }
                }
                let sequences = worker
                    .resident
                    .iter()
                    .map(|(sid, (generated, target))| SequenceState {
                        id: *sid,
                        generated: *generated,
                        kv_bytes: (*generated as u64 + 64) * 4096,
                        finished: generated >= target,
                    })
                    .collect::<Vec<_>>();
                for s in &sequences {
                    if s.finished {
                        worker.resident.remove(&s.id);
                        completed.push(s.id);
                        results.push(RequestResult { id: s.id, status: RequestStatus::Ok, tokens: s.generated });
                    }
                }
                self.pending.push(Event::Frame(FrameReport {
                    worker: id,
                    steps: FRAME_STEPS,
                    duration: now - running.started,
                    sequences,
                    kv_capacity: 1 << 30,
                }));
            }
        }
        self.pending.push(Event::BatchDone(BatchOutcome {
            worker: id,
            started_at: running.started,
            duration: now - running.started,
            results,
        }));
        self.pending.push(Event::WorkerIdle(id));
        for rid in completed {
            let late = self.requests.get(&rid).is_some_and(|(r, _)| now > r.deadline);
            self.finish(rid, Fate::Completed { late });
        }
        for (rid, next) in forwarded {
            if let Some((request, fate)) = self.requests.get_mut(&rid) {
                request.stage = next;
                request.arrived_at = now;
                *fate = Fate::Held;
                self.pending.push(Event::Arrival(request.clone()));
            }
        }
    }

    fn requeue(&mut self, id: u64) {
        if let Some((request, fate)) = self.requests.get_mut(&id) {
            request.requeues += 1;
            request.arrived_at = self.now;
            *fate = Fate::Held;
            self.pending.push(Event::Arrival(request.clone()));
        }
    }

    fn finish(&mut self, id: u64, fate: Fate) {
        let count = self.ends.entry(id).or_default();
        *count += 1;
        if *count > 1 {
            self.violations.push(format!("request {id} ended twice (second time: {fate:?})"));
        }
        if let Some((_, f)) = self.requests.get_mut(&id) {
            *f = fate;
        } else {
            self.violations.push(format!("request {id} ended but was never seen"));
        }
    }
}

/// Mean latency of a batch from a profile (the SDK's interpolation rule).
fn interpolate(profile: &[LatencyPoint], batch: u32) -> u64 {
    yardmaster_sdk::interpolate(profile, batch, |p| p.batch, |p| p.mean).unwrap_or(0)
}

impl ClusterView for ScriptedCluster {
    fn now(&self) -> u64 {
        self.now
    }

    fn worker(&self, id: u32) -> Option<WorkerState> {
        self.workers.get(&id).map(|w| WorkerState { stage: w.info.stage, busy: w.running.is_some() })
    }

    fn idle_workers(&self) -> Vec<u32> {
        self.workers.values().filter(|w| w.running.is_none()).map(|w| w.info.id).collect()
    }

    fn serving_workers(&self) -> Vec<yardmaster_policy::contract::Worker> {
        self.workers.values().map(|w| w.info).collect()
    }

    fn stage(&self, id: u32) -> Option<StageState> {
        let s = self.config.stages.get(id as usize)?;
        Some(StageState {
            kind: s.kind,
            max_batch: s.max_batch,
            batch_limit: self.batch_limits[id as usize],
            variants: s.variants.len() as u32,
            min_replicas: s.min_replicas,
            max_replicas: s.max_replicas,
            replicas: self.replicas[id as usize],
        })
    }

    fn sequence(&self, id: u64) -> Option<SeqView> {
        self.workers.values().find_map(|w| {
            w.resident
                .contains_key(&id)
                .then(|| SeqView { worker: w.info.id, running: w.running.as_ref().is_some_and(|r| r.requests.contains(&id)) })
        })
    }

    fn max_workers(&self) -> u32 {
        self.config.max_workers
    }

    fn total_replicas(&self) -> u32 {
        self.replicas.iter().sum()
    }

    fn max_threads(&self) -> u32 {
        16
    }
}
