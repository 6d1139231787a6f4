//! The simulator's executor: jobs take their profiled latency (with noise), LLM
//! frames generate tokens and pay for prefill, swaps and the spread of input lengths,
//! detectors fan out, and new workers start warm or cold depending on a host-memory
//! cache of model parameters.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::rng::SimRng;
use crate::engine::{BatchJob, Executor, ItemResult, JobResult, Pipeline, Resume};
use crate::policy::contract::{DeviceKind, EvictMode, StageKind};

/// Output tokens assumed for an LLM request that gives no length.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 128;

/// Settings of the simulated executor.
#[derive(Debug, Clone)]
pub struct SimExecutorOptions {
    /// Coefficient of variation of job latency around the profiled mean (0: none).
    pub noise_cv: f64,
    /// Host memory for cached model parameters.
    pub host_cache_bytes: u64,
    /// Evict cached parameters (least recently used first) above this fraction.
    pub cache_high_water: f64,
}

impl Default for SimExecutorOptions {
    fn default() -> Self {
        Self { noise_cv: 0.05, host_cache_bytes: 64 << 30, cache_high_water: 0.85 }
    }
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
    stage: u32,
    variant: u32,
    threads: u32,
    /// Bumped on abort and retire, so a stale completion is ignored.
    generation: u64,
}

/// The latency-model executor.
pub struct SimExecutor {
    pipeline: std::sync::Arc<Pipeline>,
    options: SimExecutorOptions,
    rng: SimRng,
    now: u64,
    workers: FxHashMap<u32, SimWorker>,
    queue: BinaryHeap<Reverse<(u64, u64, u32, u64)>>,
    payloads: FxHashMap<u64, ExecEvent>,
    seq: u64,
    /// Cached (stage, variant) parameters, least recently used first, with bytes.
    cache: Vec<((u32, u32), u64)>,
    /// Warm and cold starts so far.
    pub starts: (u64, u64),
}

impl SimExecutor {
    /// An executor for `pipeline` whose initial workers (as the engine numbers them)
    /// are already serving, with their parameters cached.
    pub fn new(pipeline: &Pipeline, options: SimExecutorOptions, rng: SimRng) -> Self {
        let mut workers = FxHashMap::default();
        let mut cache = Vec::new();
        let mut id = 0;
        for (stage, def) in pipeline.stages.iter().enumerate() {
            for _ in 0..def.replicas {
                workers.insert(id, SimWorker { stage: stage as u32, variant: 0, threads: def.threads, generation: 0 });
                id += 1;
            }
            if def.replicas > 0 {
                cache.push(((stage as u32, 0), def.variants[0].memory_bytes));
            }
        }
        let mut executor = Self {
            pipeline: std::sync::Arc::new(pipeline.clone()),
            options,
            rng,
            now: 0,
            workers,
            queue: BinaryHeap::new(),
            payloads: FxHashMap::default(),
            seq: 0,
            cache,
            starts: (0, 0),
        };
        executor.evict_above_high_water();
        executor
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
        while let Some(Reverse((at, seq, worker, generation))) = self.queue.peek().copied() {
            if at > now {
                return None;
            }
            self.queue.pop();
            let event = self.payloads.remove(&seq).expect("payload");
            let current = self.workers.get(&worker).map(|w| w.generation);
            if current == Some(generation) {
                return Some(event);
            }
        }
        None
    }

    fn push(&mut self, at: u64, worker: u32, event: ExecEvent) {
        self.seq += 1;
        let generation = self.workers.get(&worker).map_or(0, |w| w.generation);
        self.queue.push(Reverse((at, self.seq, worker, generation)));
        self.payloads.insert(self.seq, event);
    }

    fn noise(&mut self) -> f64 {
        if self.options.noise_cv <= 0.0 {
            1.0
        } else {
            self.rng.lognormal_with_mean_cv(1.0, self.options.noise_cv)
        }
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

    fn poisson(&mut self, mean: f64) -> u32 {
        if mean <= 0.0 {
            return 0;
        }
        if mean > 30.0 {
            return self.rng.normal(mean, mean.sqrt()).round().max(0.0) as u32;
        }
        let limit = (-mean).exp();
        let (mut k, mut p) = (0u32, 1.0);
        loop {
            p *= self.rng.uniform();
            if p < limit {
                return k;
            }
            k += 1;
        }
    }

    fn touch_cache(&mut self, key: (u32, u32)) -> bool {
        let bytes = self.pipeline.stages[key.0 as usize].variants[key.1 as usize].memory_bytes;
        let hit = if let Some(i) = self.cache.iter().position(|(k, _)| *k == key) {
            let entry = self.cache.remove(i);
            self.cache.push(entry);
            true
        } else {
            self.cache.push((key, bytes));
            false
        };
        self.evict_above_high_water();
        hit
    }

    /// Evict cached parameters, least recently used first, until the cache is within
    /// its high-water mark of host memory.
    fn evict_above_high_water(&mut self) {
        let limit = (self.options.host_cache_bytes as f64 * self.options.cache_high_water) as u64;
        while self.cache.iter().map(|(_, b)| b).sum::<u64>() > limit {
            self.cache.remove(0);
        }
    }
}

impl Executor for SimExecutor {
    fn start(&mut self, job: BatchJob) {
        let pipeline = self.pipeline.clone();
        let def = &pipeline.stages[job.stage as usize];
        let variant = &def.variants[job.variant as usize];
        let threads = self.workers.get(&job.worker).map_or(def.threads, |w| w.threads);
        let factor = self.thread_factor(job.stage, threads) * self.noise();
        let batch = job.items.len() as u32;
        let (duration, items) = match def.kind {
            StageKind::Batch => {
                let duration = (variant.profile.mean(batch) as f64 * factor) as u64;
                let mut items = Vec::with_capacity(job.items.len());
                for item in &job.items {
                    let mut fan_out = Vec::new();
                    for &(successor, mean) in &variant.fan_out {
                        fan_out.push((successor, self.poisson(mean)));
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
        self.push(at, job.worker, ExecEvent::Finished(JobResult { worker: job.worker, duration: duration.max(1), items }));
    }

    fn abort(&mut self, worker: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.generation += 1;
        }
    }

    fn provision(&mut self, worker: u32, stage: u32, variant: u32) {
        let def = &self.pipeline.stages[stage as usize];
        self.workers.insert(worker, SimWorker { stage, variant, threads: def.threads, generation: 0 });
        let (warm, cold) = (def.variants[variant as usize].warm_start_ns, def.variants[variant as usize].cold_start_ns);
        let delay = if self.touch_cache((stage, variant)) {
            self.starts.0 += 1;
            warm
        } else {
            self.starts.1 += 1;
            cold
        };
        self.push(self.now + delay.max(1), worker, ExecEvent::Ready(worker));
    }

    fn retire(&mut self, worker: u32) {
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
            let key = (w.stage, variant);
            self.touch_cache(key);
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
    use crate::engine::{Executor, JobItem};

    fn pipeline() -> Pipeline {
        crate::sim::presets::pipeline("vision-chain").unwrap()
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
    fn new_workers_start_warm_when_cached_and_cold_otherwise() {
        let p = pipeline();
        let options = SimExecutorOptions { noise_cv: 0.0, ..Default::default() };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        // Stage 0's variant 0 serves at start, so its parameters are cached: warm.
        executor.provision(100, 0, 0);
        // A cold start: make the cache forget everything but one entry.
        executor.cache.clear();
        executor.provision(101, 1, 0);
        let events = drain(&mut executor);
        let warm = p.stages[0].variants[0].warm_start_ns;
        let cold = p.stages[1].variants[0].cold_start_ns;
        assert_eq!(events, vec![(warm, ExecEvent::Ready(100)), (cold, ExecEvent::Ready(101))]);
        assert_eq!(executor.starts, (1, 1));
    }

    /// The vision chain with every stage's parameters `gib` GiB.
    fn sized(gib: u64) -> Pipeline {
        let mut p = pipeline();
        for stage in &mut p.stages {
            stage.variants[0].memory_bytes = gib << 30;
        }
        p
    }

    #[test]
    fn a_removed_replica_restarts_warm_until_its_entry_is_evicted_lru_at_85_percent() {
        // Three 3-GiB entries fit under 85 % of 10 GiB (8.5 GiB) only twice over:
        // the third one evicts the least recently used.
        let p = sized(3);
        let options = SimExecutorOptions { noise_cv: 0.0, host_cache_bytes: 10 << 30, cache_high_water: 0.85 };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        executor.cache.clear();
        executor.provision(10, 0, 0); // cold, cached
        executor.retire(10);
        executor.provision(11, 0, 0); // warm: the entry outlived the replica
        executor.provision(12, 1, 0); // cold, cached: 6 GiB
        executor.provision(13, 0, 0); // warm, stage 0 is now the most recent
        executor.provision(14, 2, 0); // cold: 9 GiB > 8.5, evicts stage 1 (LRU)
        executor.provision(15, 0, 0); // warm: the most recently used survived
        executor.provision(16, 1, 0); // cold again
        assert_eq!(executor.starts, (3, 4));
        let keys: Vec<u32> = executor.cache.iter().map(|(k, _)| k.0).collect();
        assert_eq!(keys, vec![0, 1], "stage 2's entry was the least recently used");
    }

    #[test]
    fn without_host_memory_every_start_is_cold() {
        let p = sized(1);
        let options = SimExecutorOptions { noise_cv: 0.0, host_cache_bytes: 0, cache_high_water: 0.85 };
        let mut executor = SimExecutor::new(&p, options, SimRng::new(1));
        for worker in 0..3 {
            executor.provision(100 + worker, 0, 0);
        }
        assert_eq!(executor.starts, (0, 3));
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
        let p = crate::sim::presets::pipeline("llm").unwrap();
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
}
