//! The conformance harness: `yardmaster policy check FILE.wasm`.
//!
//! It drives any policy through a scripted run of a small cluster ([`cluster`]) that
//! covers every event kind — arrivals on a two-stage chain and an LLM stage, idle
//! workers, finished batches, frames, ticks, timers, a worker added and removed, a
//! cancelled request — and checks that:
//! - every action the policy returns is valid (none rejected);
//! - the policy never faults (trap, overrun, memory);
//! - no request is lost: every request ends exactly once (completed, dropped or
//!   cancelled) by the end of the run;
//! - its decisions are deterministic: two simulated runs give the same actions.
//!
//! It reports the decision cost per event kind: wall time (serve mode) and fuel
//! (simulate mode, i.e. instructions, which is what a simulation replay spends).

pub mod bench;
pub mod cluster;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use yardmaster_policy::contract::{Action, Config, EndReason, Event, Param, Request};
use yardmaster_policy::{Arm, ArmOutput, FailureMode, Limits, LoadError, Mode, NativePolicy, PolicyLoader, PolicyModule, Sandbox};
use cluster::{Fate, ScriptedCluster, MS};

/// How to run a check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Bounds of every call.
    pub limits: Limits,
    /// Seed of the arrival script and of the policy's random source.
    pub seed: u64,
    /// Requests in the script.
    pub requests: u32,
    /// Policy parameters.
    pub params: Vec<Param>,
    /// On-disk cache of compiled components.
    pub cache_dir: Option<PathBuf>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self { limits: Limits::default(), seed: 7, requests: 240, params: Vec::new(), cache_dir: None }
    }
}

/// Decision cost of one kind of call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindCost {
    /// Calls whose events were all of this kind (`mixed` otherwise).
    pub calls: u64,
    /// Events in those calls.
    pub events: u64,
    /// Wall time of those calls (serve mode).
    pub wall: Duration,
    /// Fuel of those calls (simulate mode).
    pub fuel: u64,
}

/// Outcome counts of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Requests in the script.
    pub requests: u32,
    /// Completed within their deadline.
    pub on_time: u32,
    /// Completed after their deadline.
    pub late: u32,
    /// Dropped by the policy.
    pub dropped: u32,
    /// Cancelled by the script.
    pub cancelled: u32,
    /// Refused by a closed arm.
    pub refused: u32,
}

/// What a check found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The policy's label.
    pub policy: String,
    /// SHA-256 of the component (none for native policies).
    pub sha256: Option<String>,
    /// Whether compiled code came from the cache.
    pub from_cache: bool,
    /// Outcome counts (from the first simulated run).
    pub outcomes: Outcomes,
    /// Requests that never ended, with where they were.
    pub lost: Vec<String>,
    /// Rejected actions, with reasons.
    pub rejected: Vec<String>,
    /// Faults the policy hit.
    pub faults: Vec<String>,
    /// Other violations (a request ending twice, a run that never settles).
    pub violations: Vec<String>,
    /// Whether two simulated runs made identical decisions (None for native runs).
    pub deterministic: Option<bool>,
    /// Decision cost by call kind.
    pub costs: BTreeMap<&'static str, KindCost>,
    /// Total events delivered.
    pub events: u64,
    /// Total actions accepted.
    pub actions: u64,
}

impl CheckReport {
    /// Whether the policy conforms.
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.rejected.is_empty()
            && self.faults.is_empty()
            && self.violations.is_empty()
            && self.deterministic != Some(false)
    }

    /// A human-readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(out, "{verdict}  {}", self.policy);
        if let Some(sha) = &self.sha256 {
            let _ = writeln!(out, "  sha256      {sha}{}", if self.from_cache { " (compiled code from cache)" } else { "" });
        }
        let o = &self.outcomes;
        let _ = writeln!(
            out,
            "  requests    {} : {} on time, {} late, {} dropped, {} cancelled, {} refused, {} lost",
            o.requests,
            o.on_time,
            o.late,
            o.dropped,
            o.cancelled,
            o.refused,
            self.lost.len()
        );
        let _ = writeln!(out, "  events      {}   actions accepted {}", self.events, self.actions);
        if let Some(d) = self.deterministic {
            let _ = writeln!(
                out,
                "  determinism {}",
                if d { "identical decisions in two simulated runs" } else { "DIFFERENT decisions in two simulated runs" }
            );
        }
        let _ = writeln!(out, "  decision cost per event:");
        let _ = writeln!(out, "    {:<15} {:>7} {:>8} {:>12} {:>12}", "call kind", "calls", "events", "ns/event", "fuel/event");
        for (kind, cost) in &self.costs {
            let events = cost.events.max(1);
            let _ = writeln!(
                out,
                "    {:<15} {:>7} {:>8} {:>12.0} {:>12}",
                kind,
                cost.calls,
                cost.events,
                cost.wall.as_nanos() as f64 / events as f64,
                if cost.fuel > 0 { format!("{}", cost.fuel / events) } else { "-".into() }
            );
        }
        for (title, list) in [
            ("faults", &self.faults),
            ("rejected actions", &self.rejected),
            ("lost requests", &self.lost),
            ("violations", &self.violations),
        ] {
            if !list.is_empty() {
                let _ = writeln!(out, "  {title} ({}):", list.len());
                for line in list.iter().take(10) {
                    let _ = writeln!(out, "    - {line}");
                }
                if list.len() > 10 {
                    let _ = writeln!(out, "    … and {} more", list.len() - 10);
                }
            }
        }
        out
    }
}

/// Check a policy component.
pub fn check_component(name: &str, bytes: &[u8], options: &CheckOptions) -> Result<CheckReport, LoadError> {
    let simulate = Sandbox::new(Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let serve = Sandbox::new(Mode::Serve, options.limits.clone()).expect("wasm engine");
    let sim_loader = PolicyLoader::new(simulate.clone(), options.cache_dir.clone());
    let serve_loader = PolicyLoader::new(serve.clone(), options.cache_dir.clone());
    let sim_module = sim_loader.load(name, bytes)?;
    let serve_module = serve_loader.load(name, bytes)?;

    let start = |sandbox: &Sandbox, module: &Arc<PolicyModule>| {
        let sandbox = sandbox.clone();
        let module = module.clone();
        move |config: Config, cluster: &ScriptedCluster| {
            Arm::start_wasm(name, config, &sandbox, module.clone(), FailureMode::FailOpen, None, cluster)
        }
    };
    let first = run(&start(&simulate, &sim_module), options);
    let second = run(&start(&simulate, &sim_module), options);
    let timed = run(&start(&serve, &serve_module), options);

    let mut report = first.report;
    report.policy = format!("{name} ({} bytes)", bytes.len());
    report.sha256 = Some(sim_module.sha256_hex());
    report.from_cache = sim_module.from_cache();
    report.deterministic = Some(first.actions == second.actions);
    for (kind, cost) in timed.report.costs {
        report.costs.entry(kind).or_default().wall = cost.wall;
    }
    Ok(report)
}

/// Check an SDK policy compiled into the host.
pub fn check_native<P: yardmaster_sdk::Policy + Send>(name: &str, options: &CheckOptions) -> CheckReport {
    let max_actions = options.limits.max_actions;
    let seed = options.seed;
    let result = run(
        &|config: Config, cluster: &ScriptedCluster| {
            let instance = Box::new(NativePolicy::<P>::new(name, seed, max_actions));
            Arm::start(name, config, instance, FailureMode::FailOpen, cluster)
        },
        options,
    );
    let mut report = result.report;
    report.policy = format!("{name} (native)");
    report
}

struct RunResult {
    report: CheckReport,
    actions: Vec<Action>,
}

/// Scripted events at fixed times.
enum Scripted {
    Cancel,
    AddWorker,
    RemoveWorker,
}

/// One scripted run.
fn run(start: &dyn Fn(Config, &ScriptedCluster) -> (Arm, ArmOutput), options: &CheckOptions) -> RunResult {
    let config = ScriptedCluster::config("check", options.params.clone(), options.seed);
    let mut cluster = ScriptedCluster::new(&config);
    let mut report = CheckReport::default();
    let mut log = Vec::new();

    let mut arrivals = arrival_script(&config, options);
    let horizon = arrivals.iter().map(|r| r.deadline).max().unwrap_or(0) + 1_000 * MS;
    arrivals.reverse(); // popped from the back, in time order
    let mut scripted = vec![(700 * MS, Scripted::RemoveWorker), (400 * MS, Scripted::AddWorker), (300 * MS, Scripted::Cancel)];
    let mut next_tick = config.tick_interval;

    let (mut arm, output) = start(config.clone(), &cluster);
    record(&mut report, &mut log, &output, &mut cluster);

    let mut calls = 0u64;
    loop {
        let candidates = [
            arrivals.last().map(|r| r.sent_at),
            scripted.last().map(|s| s.0),
            (next_tick <= horizon).then_some(next_tick),
            cluster.next_internal_time(),
        ];
        let pending_now = cluster.has_pending();
        let Some(next) = (if pending_now { Some(cluster.now) } else { candidates.into_iter().flatten().min() }) else {
            break;
        };
        cluster.advance_to(next);
        while arrivals.last().is_some_and(|r| r.sent_at <= cluster.now) {
            let request = arrivals.pop().expect("checked");
            cluster.arrive(request);
        }
        while scripted.last().is_some_and(|s| s.0 <= cluster.now) {
            let (_, what) = scripted.pop().expect("checked");
            scripted_event(&mut cluster, what);
        }
        if next_tick <= cluster.now {
            let snapshot = cluster.snapshot();
            cluster.push_event(Event::Tick(snapshot));
            next_tick += config.tick_interval;
        }
        let events = cluster.take_events();
        if events.is_empty() {
            continue;
        }
        calls += 1;
        if calls > 100_000 {
            report.violations.push("the run did not settle within 100000 calls".into());
            break;
        }
        let kind = call_kind(&events);
        report.events += events.len() as u64;
        let output = arm.handle(&events, &cluster);
        let cost = report.costs.entry(kind).or_default();
        cost.calls += 1;
        cost.events += events.len() as u64;
        if let Some(last) = arm.last_cost() {
            cost.wall += last.wall;
            cost.fuel += last.fuel.unwrap_or(0);
        }
        record(&mut report, &mut log, &output, &mut cluster);
    }

    let mut outcomes = Outcomes { requests: options.requests, ..Outcomes::default() };
    for (request, fate) in cluster.fates() {
        match fate {
            Fate::Completed { late: false } => outcomes.on_time += 1,
            Fate::Completed { late: true } => outcomes.late += 1,
            Fate::Dropped => outcomes.dropped += 1,
            Fate::Ended => outcomes.cancelled += 1,
            Fate::Refused => outcomes.refused += 1,
            other => report.lost.push(format!("request {} still {other:?} at stage {} at the end", request.id, request.stage)),
        }
    }
    report.lost.sort();
    report.outcomes = outcomes;
    report.violations.extend(cluster.violations.iter().cloned());
    report.actions = arm.stats().accepted_total();
    RunResult { report, actions: log }
}

fn record(report: &mut CheckReport, log: &mut Vec<Action>, output: &ArmOutput, cluster: &mut ScriptedCluster) {
    if let Some(fault) = &output.fault {
        report.faults.push(fault.to_string());
    }
    for (action, reason) in &output.rejected {
        report.rejected.push(format!("{} rejected: {reason}", action.kind()));
    }
    log.extend(output.actions.iter().cloned());
    cluster.apply(output);
}

fn scripted_event(cluster: &mut ScriptedCluster, what: Scripted) {
    match what {
        Scripted::Cancel => {
            if let Some(id) = cluster.some_held() {
                cluster.push_event(Event::RequestEnded((id, EndReason::Cancelled)));
            }
        }
        Scripted::AddWorker => {
            let id = cluster.new_worker_id();
            let mut worker = ScriptedCluster::config("", Vec::new(), 0).workers[2];
            worker.id = id;
            cluster.push_event(Event::WorkerAdded(worker));
            cluster.push_event(Event::WorkerIdle(id));
        }
        Scripted::RemoveWorker => {
            if let Some(id) = cluster.idle_worker_of(1) {
                cluster.push_event(Event::WorkerRemoved(id));
            }
        }
    }
}

/// The kind of a call: its events' kind when they are all alike, `mixed` otherwise.
fn call_kind(events: &[Event]) -> &'static str {
    let first = events[0].kind();
    if events.iter().all(|e| e.kind() == first) {
        first
    } else {
        "mixed"
    }
}

/// The script's requests, sorted by send time: a steady vision stream with a burst
/// and some infeasible deadlines, and a chat stream on the LLM stage.
fn arrival_script(config: &Config, options: &CheckOptions) -> Vec<Request> {
    let mut rng = options.seed.max(1);
    let mut next = || {
        let (state, value) = yardmaster_sdk::splitmix64(rng);
        rng = state;
        (value >> 11) as f64 / (1u64 << 53) as f64
    };
    let total = options.requests.max(10);
    let chat = total / 10;
    let burst = total / 10;
    let steady = total - chat - burst;
    let vision_slo = config.streams[0].slo;
    let chat_slo = config.streams[1].slo;
    let mut requests = Vec::with_capacity(total as usize);
    let mut t = 0u64;
    let mut id = 1u64;
    let make = |id: u64, stage: u32, stream: u32, sent_at: u64, deadline: u64, tokens: u32| Request {
        id,
        origin: id,
        stage,
        stream,
        sent_at,
        arrived_at: sent_at,
        deadline,
        priority: 0,
        input_size: 64,
        expected_tokens: tokens,
        requeues: 0,
        tags: None,
    };
    for i in 0..steady {
        t += (-(1.0 - next()).ln() * 4.0 * MS as f64) as u64 + 1;
        // One request in ten has a deadline no schedule can meet.
        let slo = if i % 10 == 9 { MS } else { vision_slo };
        requests.push(make(id, 0, 0, t, t + slo, 0));
        id += 1;
    }
    let burst_at = 500 * MS;
    for _ in 0..burst {
        requests.push(make(id, 0, 0, burst_at, burst_at + vision_slo, 0));
        id += 1;
    }
    for k in 0..chat {
        let sent = k as u64 * 37 * MS;
        let tokens = 8 + (next() * 32.0) as u32;
        requests.push(make(id, 2, 1, sent, sent + chat_slo, tokens));
        id += 1;
    }
    requests.sort_by_key(|r| (r.sent_at, r.id));
    requests
}
