//! One simulated run: the engine, the latency-model executor, a workload and a policy
//! on a virtual clock, from the first arrival until every request has ended.
//!
//! The loop jumps from one instant to the next thing that happens (an arrival, a job
//! finishing, a worker becoming ready, an engine timer) and gathers everything that
//! happens at that instant before one policy call: the simulator's decision points are
//! exactly the distinct instants at which something happened. Nothing reads the wall
//! clock, and the policy is metered by fuel, so a run is a pure function of its inputs.

use std::sync::Arc;
use std::time::{Duration, Instant as WallInstant};

use anyhow::{Context, Result};

use super::compound::{CompoundDriver, CompoundJob};
use super::executor::{ExecEvent, SimExecutor, SimExecutorOptions};
use crate::report::RunReport;
use yardmaster_engine::{Engine, EngineOptions, EngineStats, ManualClock, Pipeline, Submission};
use yardmaster_formats::rng::SimRng;
use yardmaster_formats::trace::{ArrivalRecord, BatchRecord, TraceHeader, TraceRecord, TraceWriter};
use yardmaster_formats::workload::Arrival;
use yardmaster_policy::{Arm, ArmStats, FailureMode, PolicyLoader};

/// Most consecutive decision points at one instant that only deliver events the
/// previous answer caused.
const MAX_CAUSED_ROUNDS: u32 = 4;

/// A policy to simulate: its name and component bytes.
#[derive(Clone)]
pub struct PolicySpec {
    /// Name in reports.
    pub name: String,
    /// The component.
    pub bytes: Arc<Vec<u8>>,
}

/// Everything a run needs besides the policy.
#[derive(Clone)]
pub struct SimSpec {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// Seed of every random choice (workload, noise, fan-out, the policy's source).
    pub seed: u64,
    /// Length of the arrival process.
    pub duration: u64,
    /// Executor settings.
    pub executor: SimExecutorOptions,
    /// Engine settings.
    pub engine: EngineOptions,
    /// Decision granularity: 0 makes every distinct instant a decision point (exact);
    /// a positive value rounds instants up to its multiples, so everything that happens
    /// within one interval reaches the policy in one call (as a live scheduler loop
    /// would batch it), at the price of decisions up to one interval late.
    pub decision_interval: u64,
    /// Write each run's arrivals, batches and completions as a JSON-lines trace
    /// (`trace-POLICY.jsonl`) into this directory.
    pub capture_dir: Option<std::path::PathBuf>,
}

/// What a run produced.
pub struct RunOutcome {
    /// Metrics.
    pub report: RunReport,
    /// Engine counters.
    pub engine: EngineStats,
    /// Policy arm counters.
    pub arm: ArmStats,
    /// Simulated events handled (arrivals, job ends, worker starts, engine wake-ups).
    pub events: u64,
    /// Wall time of the run.
    pub wall: Duration,
    /// Simulated time at the end.
    pub simulated: u64,
    /// Requests still in flight at the end (0 unless the drain limit was hit).
    pub unfinished: usize,
    /// LLM goodput by service class (empty for pipelines without LLM stages).
    pub llm: yardmaster_engine::metrics::LlmGoodputSummary,
    /// Tokens each worker generated in completed frames (iteration stages only).
    pub tokens_by_worker: std::collections::BTreeMap<u32, u64>,
    /// Workers started warm (parameters cached on their host) and cold.
    pub starts: (u64, u64),
    /// The policy's linear memory over the run: `(simulated ns, bytes)` after the
    /// policy call at every hundredth of the arrivals' duration (through the drain too),
    /// and at the end.
    pub memory: Vec<(u64, u64)>,
}

impl RunOutcome {
    /// The policy's linear memory at simulated time `at`, bytes: the last sample of
    /// [`RunOutcome::memory`] at or before it (0 before the first).
    pub fn memory_at(&self, at: u64) -> u64 {
        self.memory.iter().take_while(|(t, _)| *t <= at).last().map_or(0, |(_, bytes)| *bytes)
    }
}

/// Run `policy` on `spec` with the arrivals of `workload`; `progress` is called with the
/// fraction of simulated time done, now and then.
pub fn run(
    spec: &SimSpec,
    policy: &PolicySpec,
    loader: &PolicyLoader,
    workload: impl Iterator<Item = Arrival>,
    progress: &mut dyn FnMut(f64),
) -> Result<RunOutcome> {
    run_with_jobs(spec, policy, loader, workload, Vec::new(), progress)
}

/// [`run`] with compound LLM `jobs` besides the single requests of `workload`: each
/// job arriving within the run's duration is submitted stage by stage as its calls
/// complete ([`CompoundDriver`]).
pub fn run_with_jobs(
    spec: &SimSpec,
    policy: &PolicySpec,
    loader: &PolicyLoader,
    workload: impl Iterator<Item = Arrival>,
    jobs: Vec<CompoundJob>,
    progress: &mut dyn FnMut(f64),
) -> Result<RunOutcome> {
    let started = WallInstant::now();
    let module = loader.load(&policy.name, &policy.bytes).with_context(|| format!("loading policy {}", policy.name))?;
    let clock = ManualClock::default();
    let mut root = SimRng::new(spec.seed);
    let executor = SimExecutor::new(&spec.pipeline, spec.executor.clone(), root.fork(1));
    let sandbox = loader.sandbox().clone();
    let mut engine_options = spec.engine.clone();
    engine_options.seed = spec.seed;
    let mut engine = Engine::new(clock.clone(), executor, spec.pipeline.clone(), engine_options, |config, view| {
        Arm::start_wasm(&policy.name, config, &sandbox, module, FailureMode::FailOpen, None, view)
    });
    let streams = spec.pipeline.streams.len() as u32;
    let mut capture = match &spec.capture_dir {
        Some(dir) => Some(Capture::create(dir, &policy.name)?),
        None => None,
    };
    let mut arrivals = workload.take_while(|a| a.at < spec.duration).peekable();
    let mut driver = CompoundDriver::new(jobs.into_iter().filter(|j| j.at < spec.duration).collect());
    let mut drain_limit = (spec.duration + spec.pipeline.streams.iter().map(|s| s.slo_ns).max().unwrap_or(0)).max(driver.last_deadline())
        + spec.engine.expiry_grace
        + 1_000_000_000;
    let llm_streams = engine.accounting().llm().is_active();
    let mut events = 0u64;
    let mut caused_rounds = 0u32;
    let mut next_progress = 0u64;
    let mut memory = Vec::with_capacity(102);
    // The requests that ended at each decision point (one buffer for the run).
    let mut ended = Vec::new();
    let progress_step = (spec.duration / 100).max(1);
    loop {
        let next_arrival = [arrivals.peek().map(|a| a.at), driver.next_time()].into_iter().flatten().min();
        let next_exec = engine.executor().next_time();
        let next_wake = engine.next_wakeup().filter(|_| next_arrival.is_some() || engine.in_flight() > 0);
        // Events the last answer caused (a preempted batch's requests handed back, its
        // worker idle again) reach the policy at the same instant, a few rounds at most
        // (a dispatch the engine keeps refusing must not stop the clock).
        let next_caused = (engine.has_pending() && caused_rounds < MAX_CAUSED_ROUNDS).then(|| clock_now(&clock));
        let Some(next) = [next_arrival, next_exec, next_wake, next_caused].into_iter().flatten().min() else { break };
        let now = match spec.decision_interval {
            0 => next,
            q => next.div_ceil(q) * q,
        };
        if now > drain_limit {
            break;
        }
        caused_rounds = if next_caused == Some(now) && now == clock_now(&clock) { caused_rounds + 1 } else { 0 };
        clock.set(now);
        engine.executor_mut().set_now(now);
        while arrivals.peek().is_some_and(|a| a.at <= now) {
            let a = arrivals.next().expect("peeked");
            events += 1;
            let stream = a.stream % streams;
            if llm_streams {
                // A latency-sensitive stream runs on its token timeline past its first
                // token's deadline (the engine expires it only once it falls behind):
                // the drain waits for its last token.
                let tokens = if a.expected_tokens == 0 { crate::executor::DEFAULT_OUTPUT_TOKENS } else { a.expected_tokens };
                let last_token = a.at + spec.pipeline.streams[stream as usize].slo_ns + tokens as u64 * spec.engine.ls_time_between_tokens;
                drain_limit = drain_limit.max(last_token + spec.engine.expiry_grace + 1_000_000_000);
            }
            let id = engine.submit(Submission {
                stream,
                sent_at: a.at,
                input_size: a.input_size,
                expected_tokens: a.expected_tokens,
                ..Submission::default()
            });
            if let Some(capture) = capture.as_mut() {
                let slo = spec.pipeline.streams[stream as usize].slo_ns;
                let entry = spec.pipeline.streams[stream as usize].entry;
                capture.write(TraceRecord::Arrival(ArrivalRecord {
                    at: a.at,
                    id,
                    stream,
                    stage: entry,
                    deadline: a.at + slo,
                    input_size: a.input_size,
                    expected_tokens: a.expected_tokens,
                }))?;
            }
        }
        events += driver.start_due(now, &mut |s, tags| engine.submit_tagged(s, Some(tags))) as u64;
        while let Some(event) = engine.executor_mut().pop_due(now) {
            events += 1;
            match event {
                ExecEvent::Finished(result) => {
                    if let Some(capture) = capture.as_mut() {
                        let worker = engine.state().workers().get(&result.worker);
                        capture.write(TraceRecord::Batch(BatchRecord {
                            at: now.saturating_sub(result.duration),
                            worker: result.worker,
                            stage: worker.map_or(0, |w| w.info.stage),
                            variant: worker.map_or(0, |w| w.info.variant),
                            requests: result.items.iter().map(|i| i.id).collect(),
                            duration: result.duration,
                        }))?;
                    }
                    engine.job_finished(result)
                }
                ExecEvent::Ready(worker) => engine.worker_ready(worker),
            }
        }
        if engine.next_wakeup().is_some_and(|t| t <= now) {
            events += 1;
            engine.advance();
        }
        engine.flush();
        ended.clear();
        engine.take_ended_into(&mut ended);
        // Compound jobs whose stage completed submit their next one now (delivered to
        // the policy at this instant, as events the last answer caused).
        driver.ended(&ended, now, &mut |s, tags| engine.submit_tagged(s, Some(tags)));
        if let Some(capture) = capture.as_mut() {
            for end in ended.drain(..) {
                capture.write(TraceRecord::Completion(end.into()))?;
            }
        }
        if now >= next_progress {
            progress((now as f64 / spec.duration as f64).min(1.0));
            memory.push((now, engine.arm().stats().memory_bytes));
            next_progress = now + progress_step;
        }
    }
    progress(1.0);
    memory.push((clock_now(&clock), engine.arm().stats().memory_bytes));
    if let Some(capture) = capture {
        capture.finish()?;
    }
    let simulated = clock_now(&clock);
    let mut report = crate::report::RunReport::from_accounting(&policy.name, engine.accounting(), simulated);
    report.health = crate::report::PolicyHealth::from_arm(engine.arm().stats());
    let llm = report.llm.clone();
    Ok(RunOutcome {
        report,
        engine: engine.stats().clone(),
        arm: engine.arm().stats().clone(),
        events,
        wall: started.elapsed(),
        simulated,
        unfinished: engine.in_flight(),
        llm,
        tokens_by_worker: engine.executor().tokens_by_worker.clone(),
        starts: engine.executor().starts,
        memory,
    })
}

/// A trace file being written.
struct Capture {
    path: std::path::PathBuf,
    writer: TraceWriter<std::io::BufWriter<std::fs::File>>,
}

impl Capture {
    fn create(dir: &std::path::Path, policy: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("trace-{policy}.jsonl"));
        let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let header = TraceHeader::new(format!("yardmaster sim ({policy})"), 0);
        let writer = TraceWriter::new(std::io::BufWriter::new(file), &header).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self { path, writer })
    }

    fn write(&mut self, record: TraceRecord) -> Result<()> {
        self.writer.write(&record).with_context(|| format!("writing {}", self.path.display()))
    }

    fn finish(mut self) -> Result<()> {
        self.writer.flush().with_context(|| format!("writing {}", self.path.display()))
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use yardmaster_engine::Clock;
    clock.now()
}
