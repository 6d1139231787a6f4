//! The simulator's executor: jobs take their profiled latency (with noise), LLM
//! frames generate tokens and pay for prefill, swaps and the spread of input lengths,
//! detectors fan out, and new workers start warm or cold as the engine's model of the
//! hosts' parameter caches says (`yardmaster_engine::hosts`); a job runs at its
//! host's speed (`HostDef::speed`) times its worker's own (`--worker-speed`), and
//! replicas seated beyond a host's slots share its devices.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use rustc_hash::FxHashMap;

use yardmaster_engine::{BatchJob, Executor, ItemResult, JobResult, Pipeline, Resume, WorkerStart};
use yardmaster_formats::rng::{LogNormal, SimRng};
use yardmaster_policy::contract::{DeviceKind, EvictMode, StageKind};

/// Output tokens assumed for an LLM request that gives no length.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 128;

/// Settings of the simulated executor.
#[derive(Debug, Clone)]
pub struct SimExecutorOptions {
    /// Coefficient of variation of job latency around the profiled mean (0: none).
    pub noise_cv: f64,
    /// Speed of particular workers, by worker id, relative to the stage's profile: a
    /// job on a worker of speed 2 takes half its profiled time. Workers not named run
    /// at speed 1. A heterogeneous cluster, for policies that route by measured speed.
    pub worker_speed: BTreeMap<u32, f64>,
}

impl Default for SimExecutorOptions {
    fn default() -> Self {
        Self { noise_cv: 0.05, worker_speed: BTreeMap::new() }
    }
}

impl SimExecutorOptions {
    /// The speed of `worker` (1 unless [`Self::worker_speed`] names it).
    pub fn speed_of(&self, worker: u32) -> f64 {
        self.worker_speed.get(&worker).copied().unwrap_or(1.0)
    }

    /// The speed of `worker` seated on `host` of `pipeline`: the host's times its own.
    pub fn speed_on(&self, pipeline: &Pipeline, worker: u32, host: u32) -> f64 {
        pipeline.hosts.get(host as usize).map_or(1.0, |h| h.speed) * self.speed_of(worker)
    }
}

/// Parse a worker speed `WORKER=SPEED` (as the simulator's `--worker-speed` takes it).
pub fn parse_worker_speed(raw: &str) -> Result<(u32, f64), String> {
    let (worker, speed) = raw.split_once('=').ok_or_else(|| format!("expected WORKER=SPEED, got {raw:?}"))?;
    let worker = worker.trim().parse::<u32>().map_err(|e| format!("worker id {:?}: {e}", worker.trim()))?;
    let speed = speed.trim().parse::<f64>().map_err(|e| format!("speed {:?}: {e}", speed.trim()))?;
    if !(speed.is_finite() && speed > 0.0) {
        return Err(format!("speed of worker {worker} must be a positive number, got {speed}"));
    }
    Ok((worker, speed))
}

/// Something that will happen on the executor.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    /// A job finished.
    Finished(JobResult),
    /// A worker finished starting.
    Ready(u32),
}

#[derive(Debug, Clone)]
struct SimWorker {
    variant: u32,
    threads: u32,
    /// Its speed against the profile: its host's, times its own `worker_speed`.
    speed: f64,
    /// Bumped on abort and retire, so a stale completion is ignored.
    generation: u64,
    /// The host it is seated on.
    host: u32,
    /// A job of it is running (counted in its host's busy workers).
    running: bool,
}

/// An event on the executor's queue: `(at, seq, worker, generation, slot)`, due `at`,
/// ordered by `(at, seq)` (`seq` is unique, so ties at one instant go in the order they
/// were scheduled), for `worker` as of its `generation` (a later generation makes it
/// stale), its payload in `slot` of [`Payloads`].
type Scheduled = (u64, u64, u32, u64, u32);

/// The payloads of the events on the queue, in slots reused once taken: a queue entry
/// stays small (the heap moves entries as it sifts) and finds its payload by index.
#[derive(Default)]
struct Payloads {
    slots: Vec<Option<ExecEvent>>,
    free: Vec<u32>,
}

impl Payloads {
    /// Keep `event`; its slot.
    fn insert(&mut self, event: ExecEvent) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(event);
                slot
            }
            None => {
                self.slots.push(Some(event));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Take the event in `slot` (the slot is free again).
    fn take(&mut self, slot: u32) -> ExecEvent {
        self.free.push(slot);
        self.slots[slot as usize].take().expect("a queued event's payload")
    }
}

/// The latency-model executor.
pub struct SimExecutor {
    pipeline: std::sync::Arc<Pipeline>,
    options: SimExecutorOptions,
    /// The jobs' noise ([`SimExecutorOptions::noise_cv`]; `None`: none).
    noise: Option<LogNormal>,
    rng: SimRng,
    now: u64,
    workers: FxHashMap<u32, SimWorker>,
    /// What will happen, soonest first.
    queue: BinaryHeap<Reverse<Scheduled>>,
    payloads: Payloads,
    seq: u64,
    /// Warm and cold starts so far.
    pub starts: (u64, u64),
    /// Tokens generated by each worker in frames that completed (iteration stages).
    pub tokens_by_worker: BTreeMap<u32, u64>,
    /// Workers running a job on each named host (empty without named hosts).
    host_busy: Vec<u32>,
}

impl SimExecutor {
    /// An executor for `pipeline` whose initial workers (as the engine numbers them)
    /// are already serving.
    pub fn new(pipeline: &Pipeline, options: SimExecutorOptions, rng: SimRng) -> Self {
        let mut workers = FxHashMap::default();
        for (worker, stage, start) in yardmaster_engine::hosts::initial_seats(pipeline) {
            let threads = pipeline.stages[stage as usize].threads;
            let speed = options.speed_on(pipeline, worker, start.host);
            workers.insert(worker, SimWorker { variant: 0, threads, speed, generation: 0, host: start.host, running: false });
        }
        Self {
            pipeline: std::sync::Arc::new(pipeline.clone()),
            noise: LogNormal::with_mean_cv(1.0, options.noise_cv),
            options,
            rng,
            now: 0,
            workers,
            queue: BinaryHeap::new(),
            payloads: Payloads::default(),
            seq: 0,
            starts: (0, 0),
            tokens_by_worker: BTreeMap::new(),
            host_busy: vec![0; pipeline.hosts.len()],
        }
    }

    /// Move the executor's notion of now (the driver does this before calling the engine).
    pub fn set_now(&mut self, now: u64) {
        self.now = now;
    }

    /// When the next executor event happens.
    pub fn next_time(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, ..))| *at)
    }

    /// The next event due at or before `now`, if any (stale ones are skipped).
    pub fn pop_due(&mut self, now: u64) -> Option<ExecEvent> {
        while let Some(Reverse((at, _, worker, generation, slot))) = self.queue.peek().copied() {
            if at > now {
                return None;
            }
            self.queue.pop();
            let event = self.payloads.take(slot);
            let current = self.workers.get(&worker).map(|w| w.generation);
            if current == Some(generation) {
                if let ExecEvent::Finished(result) = &event {
                    self.job_ended(worker);
                    let tokens: u64 = result.items.iter().map(|i| u64::from(i.tokens)).sum();
                    if tokens > 0 {
                        *self.tokens_by_worker.entry(worker).or_default() += tokens;
                    }
                }
                return Some(event);
            }
        }
        None
    }

    /// `worker`'s job ended (finished, aborted, or the worker retired).
    fn job_ended(&mut self, worker: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            if std::mem::take(&mut w.running) {
                if let Some(busy) = self.host_busy.get_mut(w.host as usize) {
                    *busy = busy.saturating_sub(1);
                }
            }
        }
    }

    /// Schedule `event` of `worker` (as of its current generation) at `at`.
    fn push(&mut self, at: u64, worker: u32, event: ExecEvent) {
        let generation = self.workers.get(&worker).map_or(0, |w| w.generation);
        self.push_as_of(at, worker, generation, event);
    }

    /// Schedule `event` of `worker` as of `generation` at `at`.
    fn push_as_of(&mut self, at: u64, worker: u32, generation: u64, event: ExecEvent) {
        self.seq += 1;
        let slot = self.payloads.insert(event);
        self.queue.push(Reverse((at, self.seq, worker, generation, slot)));
    }

    /// Latency multiplier of a worker running with `threads` instead of the stage's
    /// profiled thread count: Amdahl's law when the stage gives its parallel fraction,
    /// otherwise a sub-linear speed-up on CPU workers and none on GPU workers.
    fn thread_factor(&self, stage: u32, threads: u32) -> f64 {
        let def = &self.pipeline.stages[stage as usize];
        if threads == def.threads {
            return 1.0;
        }
        if let Some(parallel) = def.parallel_fraction {
            return (1.0 - parallel) + parallel * def.threads.max(1) as f64 / threads.max(1) as f64;
        }
        if def.device == DeviceKind::Gpu {
            return 1.0;
        }
        (def.threads.max(1) as f64 / threads.max(1) as f64).powf(0.8)
    }
}

/// A job starts on `worker`, seated on a host whose busy workers `host_busy` counts:
/// the slowdown of its host's devices being shared. A host runs as many jobs at once
/// as it has slots at full speed; beyond that (a replica seated beyond the slot count)
/// its jobs share the devices, each at slots / busy of the speed, as of the job's start.
fn shared_device_factor(worker: &mut SimWorker, host_busy: &mut [u32], hosts: &[yardmaster_engine::hosts::HostDef]) -> f64 {
    let Some(busy) = host_busy.get_mut(worker.host as usize) else { return 1.0 };
    if !worker.running {
        worker.running = true;
        *busy += 1;
    }
    let slots = hosts[worker.host as usize].slots.max(1);
    if *busy > slots {
        *busy as f64 / slots as f64
    } else {
        1.0
    }
}

/// A job's latency multiplier drawn from `noise` (1 without noise).
fn noise(noise: Option<LogNormal>, rng: &mut SimRng) -> f64 {
    match noise {
        Some(distribution) => rng.lognormal(distribution),
        None => 1.0,
    }
}

/// A Poisson-distributed count of mean `mean` (normal beyond a mean of 30).
fn poisson(rng: &mut SimRng, mean: f64) -> u32 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 30.0 {
        return rng.normal(mean, mean.sqrt()).round().max(0.0) as u32;
    }
    let limit = (-mean).exp();
    let (mut k, mut p) = (0u32, 1.0);
    loop {
        p *= rng.uniform();
        if p < limit {
            return k;
        }
        k += 1;
    }
}

impl Executor for SimExecutor {
    fn start(&mut self, job: BatchJob) {
        let def = &self.pipeline.stages[job.stage as usize];
        let variant = &def.variants[job.variant as usize];
        // One look-up of the worker: its threads, speed, share of its host's devices
        // (it is running now) and generation (its completion's).
        let (threads, speed, shared, generation) = match self.workers.get_mut(&job.worker) {
            Some(w) => (w.threads, w.speed, shared_device_factor(w, &mut self.host_busy, &self.pipeline.hosts), w.generation),
            None => (def.threads, self.options.speed_of(job.worker), 1.0, 0),
        };
        let factor = self.thread_factor(job.stage, threads) * noise(self.noise, &mut self.rng) / speed * shared;
        let batch = job.items.len() as u32;
        let (duration, items) = match def.kind {
            StageKind::Batch => {
                let duration = (variant.profile.mean(batch) as f64 * factor) as u64;
                let mut items = Vec::with_capacity(job.items.len());
                for item in &job.items {
                    let mut fan_out = Vec::new();
                    for &(successor, mean) in &variant.fan_out {
                        fan_out.push((successor, poisson(&mut self.rng, mean)));
                    }
                    items.push(ItemResult { id: item.id, error: None, tokens: 0, finished: true, fan_out });
                }
                (duration, items)
            }
            StageKind::Iteration => {
                let llm = def.llm;
                let step = variant.profile.mean(batch) as f64;
                let lengths: Vec<f64> = job.items.iter().map(|i| i.input_size as f64).collect();
                let spread = coefficient_of_variation(&lengths);
                let mut duration = step * job.frame_steps as f64 * (1.0 + llm.spread_penalty * spread);
                let mut items = Vec::with_capacity(job.items.len());
                for item in &job.items {
                    let context = item.input_size as f64 + item.generated as f64;
                    duration += match item.resume {
                        Resume::Fresh => item.input_size as f64 * llm.prefill_ns_per_token,
                        Resume::Recompute => context * llm.prefill_ns_per_token,
                        Resume::SwapIn => context * llm.kv_bytes_per_token as f64 * llm.swap_ns_per_byte,
                        Resume::Continue => 0.0,
                    };
                    let target = if item.expected_tokens == 0 { DEFAULT_OUTPUT_TOKENS } else { item.expected_tokens };
                    let tokens = job.frame_steps.min(target.saturating_sub(item.generated)).max(1);
                    let finished = item.generated + tokens >= target;
                    items.push(ItemResult { id: item.id, error: None, tokens, finished, fan_out: Vec::new() });
                }
                ((duration * factor) as u64, items)
            }
        };
        let at = self.now + duration.max(1);
        self.push_as_of(
            at,
            job.worker,
            generation,
            ExecEvent::Finished(JobResult { worker: job.worker, duration: duration.max(1), items }),
        );
    }

    fn abort(&mut self, worker: u32) {
        self.job_ended(worker);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.generation += 1;
        }
    }

    fn provision(&mut self, worker: u32, stage: u32, variant: u32, start: WorkerStart) {
        let def = &self.pipeline.stages[stage as usize];
        let speed = self.options.speed_on(&self.pipeline, worker, start.host);
        self.workers.insert(worker, SimWorker { variant, threads: def.threads, speed, generation: 0, host: start.host, running: false });
        let (warm, cold) = (def.variants[variant as usize].warm_start_ns, def.variants[variant as usize].cold_start_ns);
        let delay = if start.warm {
            self.starts.0 += 1;
            warm
        } else {
            self.starts.1 += 1;
            cold
        };
        self.push(self.now + delay.max(1), worker, ExecEvent::Ready(worker));
    }

    fn retire(&mut self, worker: u32) {
        self.job_ended(worker);
        self.workers.remove(&worker);
    }

    fn set_threads(&mut self, worker: u32, threads: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.threads = threads;
        }
    }

    fn set_variant(&mut self, worker: u32, variant: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.variant = variant;
        }
    }

    fn evict(&mut self, _worker: u32, _sequence: u64, _mode: EvictMode) {}
}

fn coefficient_of_variation(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if mean <= 0.0 {
        return 0.0;
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
    variance.sqrt() / mean
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::{Executor, JobItem};

    fn pipeline() -> Pipeline {
        yardmaster_formats::presets::pipeline("vision-chain").unwrap()
    }

    fn drain(executor: &mut SimExecutor) -> Vec<(u64, ExecEvent)> {
        let mut out = Vec::new();
        while let Some(at) = executor.next_time() {
            executor.set_now(at);
            while let Some(event) = executor.pop_due(at) {
                out.push((at, event));
            }
        }
        out
    }

    #[test]
    fn a_job_runs_at_its_hosts_speed_times_its_workers_own() {
        use yardmaster_engine::hosts::HostDef;
        let mut p = pipeline();
        p.hosts = vec![HostDef { speed: 0.5, ..HostDef::new("slow", 64, 0) }, HostDef { speed: 2.0, ..HostDef::new("fast", 64, 0) }];
        let mut options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        options.worker_speed.insert(200, 2.0);
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        executor.provision(100, 0, 0, WorkerStart { host: 0, slot: 0, warm: true });
        executor.provision(200, 0, 0, WorkerStart { host: 1, slot: 0, warm: true });
        let _ = drain(&mut executor);
        let item = |id| JobItem { id, input_size: 0, generated: 0, expected_tokens: 0, resume: Resume::Fresh };
        let profiled = p.stages[0].variants[0].profile.mean(1);
        for (worker, expected) in [(100, profiled * 2), (200, profiled / 4)] {
            let now = executor.now;
            executor.start(BatchJob { worker, stage: 0, variant: 0, items: vec![item(worker as u64)], frame_steps: 1 });
            let events = drain(&mut executor);
            assert_eq!(events[0].0 - now, expected, "worker {worker}");
        }
    }

    #[test]
    fn replicas_beyond_a_hosts_slots_share_its_devices() {
        use yardmaster_engine::hosts::HostDef;
        let mut p = pipeline();
        p.hosts = vec![HostDef::new("one-slot", 1, 0)];
        let options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        executor.provision(100, 0, 0, WorkerStart { host: 0, slot: 0, warm: true });
        executor.provision(101, 0, 0, WorkerStart { host: 0, slot: 1, warm: true });
        let _ = drain(&mut executor);
        let item = |id| JobItem { id, input_size: 0, generated: 0, expected_tokens: 0, resume: Resume::Fresh };
        let profiled = p.stages[0].variants[0].profile.mean(1);
        let start = executor.now;
        executor.start(BatchJob { worker: 100, stage: 0, variant: 0, items: vec![item(1)], frame_steps: 1 });
        executor.start(BatchJob { worker: 101, stage: 0, variant: 0, items: vec![item(2)], frame_steps: 1 });
        let events = drain(&mut executor);
        assert_eq!(events[0].0 - start, profiled, "alone on the slot: its profiled time");
        assert_eq!(events[1].0 - start, profiled * 2, "a second job on one slot: half the speed");
        // Both ended: the next job runs alone again, and an aborted one frees its share.
        let start = executor.now;
        executor.start(BatchJob { worker: 100, stage: 0, variant: 0, items: vec![item(3)], frame_steps: 1 });
        executor.abort(100);
        executor.start(BatchJob { worker: 101, stage: 0, variant: 0, items: vec![item(4)], frame_steps: 1 });
        let events = drain(&mut executor);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0 - start, profiled);
    }

    #[test]
    fn new_workers_start_warm_when_the_engine_says_their_parameters_are_cached() {
        let p = pipeline();
        let options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        executor.provision(100, 0, 0, WorkerStart { host: 0, slot: 5, warm: true });
        executor.provision(101, 1, 0, WorkerStart { host: 0, slot: 6, warm: false });
        let events = drain(&mut executor);
        let warm = p.stages[0].variants[0].warm_start_ns;
        let cold = p.stages[1].variants[0].cold_start_ns;
        assert_eq!(events, vec![(warm, ExecEvent::Ready(100)), (cold, ExecEvent::Ready(101))]);
        assert_eq!(executor.starts, (1, 1));
    }

    #[test]
    fn threads_follow_amdahl_when_the_stage_gives_its_parallel_fraction() {
        let mut p = pipeline();
        p.stages[0].threads = 2;
        p.stages[0].parallel_fraction = Some(0.66);
        let executor = SimExecutor::new(&p, SimExecutorOptions::default(), SimRng::new(1));
        assert_eq!(executor.thread_factor(0, 2), 1.0);
        assert!((executor.thread_factor(0, 4) - 0.67).abs() < 1e-12);
        assert!((executor.thread_factor(0, 16) - 0.4225).abs() < 1e-12);
        assert_eq!(executor.thread_factor(1, 8), 1.0, "a GPU stage without a fraction ignores threads");
    }

    #[test]
    fn jobs_take_their_profiled_latency_and_aborted_jobs_never_finish() {
        let p = pipeline();
        let options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        let item = |id| JobItem { id, input_size: 1, generated: 0, expected_tokens: 0, resume: Resume::Fresh };
        executor.start(BatchJob { worker: 0, stage: 0, variant: 0, items: vec![item(1), item(2)], frame_steps: 0 });
        executor.start(BatchJob { worker: 1, stage: 0, variant: 0, items: vec![item(3)], frame_steps: 0 });
        executor.abort(1);
        let events = drain(&mut executor);
        assert_eq!(events.len(), 1, "the aborted job's completion is discarded");
        let (at, ExecEvent::Finished(result)) = &events[0] else { panic!("{events:?}") };
        assert_eq!(*at, p.stages[0].variants[0].profile.mean(2));
        assert_eq!(result.items.iter().map(|i| i.id).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn llm_frames_generate_tokens_and_pay_for_prefill_and_spread() {
        let p = yardmaster_formats::presets::pipeline("llm").unwrap();
        let options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        let seq = |id, input, generated, resume| JobItem { id, input_size: input, generated, expected_tokens: 10, resume };
        let frame = |items| BatchJob { worker: 0, stage: 0, variant: 0, items, frame_steps: 8 };
        // Two resident sequences of equal length: no prefill, no spread.
        executor.start(frame(vec![seq(1, 100, 0, Resume::Continue), seq(2, 100, 6, Resume::Continue)]));
        let plain = drain(&mut executor);
        let (at, ExecEvent::Finished(result)) = &plain[0] else { panic!() };
        assert_eq!(*at, p.stages[0].variants[0].profile.mean(2) * 8);
        assert_eq!((result.items[0].tokens, result.items[0].finished), (8, false));
        assert_eq!((result.items[1].tokens, result.items[1].finished), (4, true), "only 4 tokens were left");
        // A fresh sequence pays its prefill; unequal prompts pay the spread penalty.
        executor.set_now(0);
        executor.start(frame(vec![seq(3, 100, 0, Resume::Fresh), seq(4, 1_000, 0, Resume::Continue)]));
        let costly = drain(&mut executor);
        let llm = p.stages[0].llm;
        let spread = coefficient_of_variation(&[100.0, 1_000.0]);
        let expected = *at as f64 * (1.0 + llm.spread_penalty * spread) + 100.0 * llm.prefill_ns_per_token;
        assert!((costly[0].0 as f64 - expected).abs() < 2.0, "{} vs {expected}", costly[0].0);
        assert!(costly[0].0 > *at);
    }

    #[test]
    fn a_faster_worker_takes_its_share_of_the_time_and_counts_its_tokens() {
        let p = yardmaster_formats::presets::pipeline("llm").unwrap();
        let mut options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        options.worker_speed.insert(0, 2.0);
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        let seq = |id| JobItem { id, input_size: 100, generated: 0, expected_tokens: 10, resume: Resume::Continue };
        executor.start(BatchJob { worker: 0, stage: 0, variant: 0, items: vec![seq(1), seq(2)], frame_steps: 8 });
        let events = drain(&mut executor);
        let (at, ExecEvent::Finished(_)) = &events[0] else { panic!() };
        assert_eq!(*at, p.stages[0].variants[0].profile.mean(2) * 8 / 2, "speed 2 halves the frame");
        assert_eq!(executor.tokens_by_worker.get(&0), Some(&16));
        // An aborted frame's tokens are not counted.
        executor.set_now(0);
        executor.start(BatchJob { worker: 0, stage: 0, variant: 0, items: vec![seq(3)], frame_steps: 8 });
        executor.abort(0);
        assert!(drain(&mut executor).is_empty());
        assert_eq!(executor.tokens_by_worker.get(&0), Some(&16));
    }

    #[test]
    fn worker_speeds_parse_with_reasons() {
        assert_eq!(parse_worker_speed("3=2.5"), Ok((3, 2.5)));
        assert!(parse_worker_speed("3").unwrap_err().contains("WORKER=SPEED"));
        assert!(parse_worker_speed("x=2").unwrap_err().contains("worker id"));
        assert!(parse_worker_speed("1=0").unwrap_err().contains("positive"));
        assert!(parse_worker_speed("1=nan").unwrap_err().contains("positive"));
    }
}
