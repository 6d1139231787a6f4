//! The conformance harness: `yardmaster policy check FILE.wasm`.
//!
//! It runs any policy on the real engine ([`yardmaster_engine::Engine`], the one the
//! simulator and the server run) through four scripted scenarios ([`Scenario`]):
//! - the *cluster* scenario: a small cluster ([`scripted`]) and a scripted workload
//!   that covers every event kind — arrivals on a two-stage chain and an LLM stage,
//!   idle workers, finished batches, frames, ticks, timers, a worker added and
//!   removed, a cancelled request;
//! - the *repository* scenario ([`repository`]): a cluster as a model repository is
//!   served — three independent one-stage models, each its own stream, and a
//!   two-step ensemble — with arrivals on every stream, changed under the running
//!   engine: a model unloaded while its requests are queued (its stage offline), a
//!   new model appended, the first loaded again;
//! - the *zero-time* scenario ([`zero_time`]): an entry stage, a fan-out point and a
//!   sink that take no time around two real tasks, under a light load, where a policy
//!   that divides by a zero latency faults, is rejected, or drops what it should
//!   serve (at least [`zero_time::MIN_ON_TIME`] of its requests must end on time);
//! - the *batches* scenario ([`batches`]): client batches of one to four items and
//!   interleaved stateful sequences, where a policy must count a batch in items and
//!   keep each sequence on the worker holding its state (contract 0.3.0; no request
//!   may fail).
//!
//! In each it checks that:
//! - every action the policy returns is valid (none rejected);
//! - the policy never faults (trap, overrun, memory);
//! - no request is lost: every request ends exactly once (completed, dropped,
//!   cancelled, refused, dropped by the host because its model was unloaded while it
//!   was queued, or failed) by the end of the run, and none is left for the host to
//!   expire;
//! - its decisions are deterministic: two simulated runs give the same actions.
//!
//! It reports the decision cost per event kind in the cluster scenario: wall time
//! (serve mode) and fuel (simulate mode, i.e. instructions, which is what a
//! simulation replay spends).

pub mod batches;
pub mod bench;
pub mod repository;
pub mod scripted;
#[cfg(test)]
mod tests;
pub mod zero_time;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use scripted::{Fate, Harness, MS};
use yardmaster_engine::{ClusterState, PieceState, Pipeline, Submission, WorkerPhase};
use yardmaster_policy::contract::{Action, Config, Param};
use yardmaster_policy::{Arm, ArmOutput, FailureMode, Limits, LoadError, Mode, NativePolicy, PolicyLoader, PolicyModule, Sandbox};

/// How to run a check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Bounds of every call.
    pub limits: Limits,
    /// Seed of the arrival script and of the policy's random source.
    pub seed: u64,
    /// Requests in each scenario's script (at least 10 in the cluster scenario and 40
    /// in the repository scenario).
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
    /// Requests in the run's script.
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
    /// Dropped by the host because their model was unloaded while they were queued
    /// (repository scenario).
    pub unloaded: u32,
    /// Failed otherwise (a stage left without workers, or out of service when they
    /// arrived).
    pub failed: u32,
}

/// A scripted run the check makes (see the crate's docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scenario {
    /// The check's cluster ([`scripted::CLUSTER`]) through every event kind.
    #[default]
    Cluster,
    /// The repository cluster ([`repository`]), reconfigured while it serves.
    Repository,
    /// Stages that take no time ([`zero_time`]) under a light load.
    ZeroTime,
    /// Client batches and stateful sequences ([`batches`]) under a light load.
    Batches,
}

impl Scenario {
    /// Every scenario, in the order the check runs them.
    pub const ALL: [Scenario; 4] = [Scenario::Cluster, Scenario::Repository, Scenario::ZeroTime, Scenario::Batches];

    /// Its short name (`cluster`, `repository`, `zero-time`, `batches`).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Cluster => "cluster",
            Scenario::Repository => "repository",
            Scenario::ZeroTime => "zero-time",
            Scenario::Batches => "batches",
        }
    }

    /// What it runs, in one line.
    pub fn summary(self) -> String {
        match self {
            Scenario::Cluster => "a two-stage vision chain and an LLM stage, every event kind".into(),
            Scenario::Repository => {
                let changes: Vec<String> = repository::RECONFIGURATIONS.iter().map(|r| format!("{} at {} ms", r.why, r.at / MS)).collect();
                format!(
                    "{} independent models and a {}-step ensemble; {}",
                    repository::MODELS.len(),
                    repository::ENSEMBLE_STEPS.len(),
                    changes.join(", ")
                )
            }
            Scenario::ZeroTime => format!(
                "stages that take no time ({}) around two tasks, at a light load; at least {:.0} % on time",
                zero_time::ZERO_TIME_STAGES.join(", "),
                100.0 * zero_time::MIN_ON_TIME
            ),
            Scenario::Batches => format!(
                "client batches of 1 to {} items and {} interleaved sequences of {} steps; none may fail",
                batches::MAX_ITEMS,
                batches::SEQUENCES,
                batches::SEQUENCE_STEPS
            ),
        }
    }

    /// The cluster it starts on.
    pub fn pipeline(self) -> Pipeline {
        match self {
            Scenario::Cluster => scripted::pipeline(),
            Scenario::Repository => repository::pipeline(),
            Scenario::ZeroTime => zero_time::pipeline(),
            Scenario::Batches => batches::pipeline(),
        }
    }

    /// Its requests, sorted by send time.
    fn arrivals(self, options: &CheckOptions) -> Vec<Submission> {
        match self {
            Scenario::Cluster => arrival_script(options),
            Scenario::Repository => repository::arrivals(options),
            Scenario::ZeroTime => zero_time::arrivals(options),
            Scenario::Batches => batches::arrivals(options),
        }
    }

    /// What it does to the cluster besides sending requests, in time order.
    fn script(self) -> Vec<(u64, Scripted)> {
        match self {
            Scenario::Cluster => vec![(300 * MS, Scripted::Cancel), (400 * MS, Scripted::AddWorker), (700 * MS, Scripted::RemoveWorker)],
            Scenario::Repository => repository::RECONFIGURATIONS.iter().map(|r| (r.at, Scripted::Reconfigure(*r))).collect(),
            Scenario::ZeroTime | Scenario::Batches => Vec::new(),
        }
    }
}

/// What one scenario's runs found.
#[derive(Debug, Clone, Default)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: Scenario,
    /// Outcome counts (from the first simulated run).
    pub outcomes: Outcomes,
    /// Requests the policy lost — the host expired them, held past their deadline and
    /// its grace, or they never ended — with where they were.
    pub lost: Vec<String>,
    /// Rejected actions, with reasons.
    pub rejected: Vec<String>,
    /// Faults the policy hit.
    pub faults: Vec<String>,
    /// Other violations (a request ending twice, a run that never settles, a
    /// reconfiguration the engine refused).
    pub violations: Vec<String>,
    /// Whether two simulated runs made identical decisions (None for native runs).
    pub deterministic: Option<bool>,
    /// Total events delivered.
    pub events: u64,
    /// Total actions accepted.
    pub actions: u64,
    /// The cluster changes the run made, each with what the engine did (requests
    /// queued at a stage going offline dropped, requests replayed into the policy's
    /// new instance).
    pub reconfigurations: Vec<String>,
    /// What the reader should know that is neither a pass nor a failure (a scenario
    /// that does not apply to the policy, and why).
    pub notes: Vec<String>,
}

impl ScenarioReport {
    /// Whether the policy conforms in this scenario.
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.rejected.is_empty()
            && self.faults.is_empty()
            && self.violations.is_empty()
            && self.deterministic != Some(false)
    }

    /// A human-readable report of this scenario (no decision costs).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(out, "  scenario    {}: {} — {verdict}", self.scenario.name(), self.scenario.summary());
        let o = &self.outcomes;
        let unloaded = if o.unloaded > 0 { format!("{} unloaded, ", o.unloaded) } else { String::new() };
        let failed = if o.failed > 0 { format!("{} failed, ", o.failed) } else { String::new() };
        let _ = writeln!(
            out,
            "  requests    {} : {} on time, {} late, {} dropped, {} cancelled, {} refused, {unloaded}{failed}{} lost",
            o.requests,
            o.on_time,
            o.late,
            o.dropped,
            o.cancelled,
            o.refused,
            self.lost.len()
        );
        for line in &self.reconfigurations {
            let _ = writeln!(out, "  reconfigured {line}");
        }
        for line in &self.notes {
            let _ = writeln!(out, "  note        {line}");
        }
        let _ = writeln!(out, "  events      {}   actions accepted {}", self.events, self.actions);
        if let Some(d) = self.deterministic {
            let _ = writeln!(
                out,
                "  determinism {}",
                if d { "identical decisions in two simulated runs" } else { "DIFFERENT decisions in two simulated runs" }
            );
        }
        for (title, list) in [
            ("faults", &self.faults),
            ("rejected actions", &self.rejected),
            ("lost requests", &self.lost),
            ("violations", &self.violations),
        ] {
            if !list.is_empty() {
                let _ = writeln!(out, "  {title} in the {} scenario ({}):", self.scenario.name(), list.len());
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

/// What a check found. The findings at the top (outcomes to actions) are the cluster
/// scenario's, the first and the one that covers every event kind; `repository`
/// holds the repository scenario's.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The policy's label.
    pub policy: String,
    /// SHA-256 of the component (none for native policies).
    pub sha256: Option<String>,
    /// Whether compiled code came from the cache.
    pub from_cache: bool,
    /// Outcome counts (from the first simulated run of the cluster scenario).
    pub outcomes: Outcomes,
    /// Requests the policy lost in the cluster scenario — the host expired them, held
    /// past their deadline and its grace, or they never ended — with where they were.
    pub lost: Vec<String>,
    /// Rejected actions in the cluster scenario, with reasons.
    pub rejected: Vec<String>,
    /// Faults the policy hit in the cluster scenario.
    pub faults: Vec<String>,
    /// Other violations in the cluster scenario (a request ending twice, a run that
    /// never settles).
    pub violations: Vec<String>,
    /// Whether two simulated runs of the cluster scenario made identical decisions
    /// (None for native runs).
    pub deterministic: Option<bool>,
    /// Decision cost by call kind (cluster scenario).
    pub costs: BTreeMap<&'static str, KindCost>,
    /// Events delivered in the cluster scenario.
    pub events: u64,
    /// Actions accepted in the cluster scenario.
    pub actions: u64,
    /// What the repository scenario found.
    pub repository: ScenarioReport,
    /// What the zero-time scenario found.
    pub zero_time: ScenarioReport,
    /// What the batches scenario found.
    pub batches: ScenarioReport,
}

impl CheckReport {
    /// A report of the cluster scenario's and the repository scenario's findings,
    /// with the cluster scenario's decision costs.
    fn of(cluster: ScenarioReport, [repository, zero_time, batches]: [ScenarioReport; 3], costs: BTreeMap<&'static str, KindCost>) -> Self {
        let ScenarioReport { outcomes, lost, rejected, faults, violations, deterministic, events, actions, .. } = cluster;
        Self {
            outcomes,
            lost,
            rejected,
            faults,
            violations,
            deterministic,
            costs,
            events,
            actions,
            repository,
            zero_time,
            batches,
            ..Self::default()
        }
    }

    /// The cluster scenario's findings, as a scenario report.
    pub fn cluster(&self) -> ScenarioReport {
        ScenarioReport {
            scenario: Scenario::Cluster,
            outcomes: self.outcomes.clone(),
            lost: self.lost.clone(),
            rejected: self.rejected.clone(),
            faults: self.faults.clone(),
            violations: self.violations.clone(),
            deterministic: self.deterministic,
            events: self.events,
            actions: self.actions,
            reconfigurations: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Every scenario's findings, in the order the check ran them.
    pub fn scenarios(&self) -> [ScenarioReport; 4] {
        [self.cluster(), self.repository.clone(), self.zero_time.clone(), self.batches.clone()]
    }

    /// Whether the policy conforms: it passed every scenario.
    pub fn passed(&self) -> bool {
        self.scenarios().iter().all(ScenarioReport::passed)
    }

    /// A human-readable report: the verdict, each scenario's findings, then the
    /// decision cost per event kind.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(out, "{verdict}  {}", self.policy);
        if let Some(sha) = &self.sha256 {
            let _ = writeln!(out, "  sha256      {sha}{}", if self.from_cache { " (compiled code from cache)" } else { "" });
        }
        let scenarios = self.scenarios();
        let failed: Vec<&str> = scenarios.iter().filter(|s| !s.passed()).map(|s| s.scenario.name()).collect();
        if !failed.is_empty() {
            let _ = writeln!(out, "  failed in   {} scenario{}", failed.join(" and "), if failed.len() > 1 { "s" } else { "" });
        }
        for scenario in &scenarios {
            out.push_str(&scenario.render());
        }
        let _ = writeln!(out, "  decision cost per event (cluster scenario):");
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
        out
    }
}

/// Check a policy component: each scenario twice in simulate mode (the second run for
/// determinism), and the cluster scenario once more in serve mode for its wall time.
pub fn check_component(name: &str, bytes: &[u8], options: &CheckOptions) -> Result<CheckReport, LoadError> {
    let simulate = Sandbox::new(Mode::Simulate, options.limits.clone()).expect("wasm engine");
    let serve = Sandbox::new(Mode::Serve, options.limits.clone()).expect("wasm engine");
    let sim_loader = PolicyLoader::new(simulate.clone(), options.cache_dir.clone());
    let serve_loader = PolicyLoader::new(serve.clone(), options.cache_dir.clone());
    let sim_module = sim_loader.load(name, bytes)?;
    let serve_module = serve_loader.load(name, bytes)?;

    let simulated = component_arm(name, &simulate, &sim_module);
    let (cluster, costs) = simulated_twice(Scenario::Cluster, &simulated, options);
    let (repository, _) = simulated_twice(Scenario::Repository, &simulated, options);
    let (zero_time, _) = simulated_twice(Scenario::ZeroTime, &simulated, options);
    let (batches, _) = simulated_twice(Scenario::Batches, &simulated, options);
    let timed = run(Scenario::Cluster, &component_arm(name, &serve, &serve_module), options);

    let mut report = CheckReport::of(cluster, [repository, zero_time, batches], costs);
    report.policy = format!("{name} ({} bytes)", bytes.len());
    report.sha256 = Some(sim_module.sha256_hex());
    report.from_cache = sim_module.from_cache();
    for (kind, cost) in timed.costs {
        report.costs.entry(kind).or_default().wall = cost.wall;
    }
    Ok(report)
}

/// Check an SDK policy compiled into the host (each scenario once).
pub fn check_native<P: yardmaster_sdk::Policy + Send>(name: &str, options: &CheckOptions) -> CheckReport {
    let max_actions = options.limits.max_actions;
    let seed = options.seed;
    let start = |config: Config, view: &ClusterState| {
        let instance = Box::new(NativePolicy::<P>::new(name, seed, max_actions));
        Arm::start(name, config, instance, FailureMode::FailOpen, view)
    };
    let cluster = run(Scenario::Cluster, &start, options);
    let repository = run(Scenario::Repository, &start, options);
    let zero_time = run(Scenario::ZeroTime, &start, options);
    let batches = run(Scenario::Batches, &start, options);
    let mut report = CheckReport::of(cluster.report, [repository.report, zero_time.report, batches.report], cluster.costs);
    report.policy = format!("{name} (native)");
    report
}

/// How a check starts a component's arm.
type StartArm<'a> = Box<dyn Fn(Config, &ClusterState) -> (Arm, ArmOutput) + 'a>;

/// Start arms of a loaded component in `sandbox`.
fn component_arm<'a>(name: &'a str, sandbox: &Sandbox, module: &Arc<PolicyModule>) -> StartArm<'a> {
    let sandbox = sandbox.clone();
    let module = module.clone();
    Box::new(move |config: Config, view: &ClusterState| {
        Arm::start_wasm(name, config, &sandbox, module.clone(), FailureMode::FailOpen, None, view)
    })
}

/// Run `scenario` twice with arms `start` gives: the first run's findings and costs,
/// with whether the second decided the same.
fn simulated_twice(
    scenario: Scenario,
    start: &dyn Fn(Config, &ClusterState) -> (Arm, ArmOutput),
    options: &CheckOptions,
) -> (ScenarioReport, BTreeMap<&'static str, KindCost>) {
    let first = run(scenario, start, options);
    let second = run(scenario, start, options);
    let mut report = first.report;
    report.deterministic = Some(first.actions == second.actions);
    (report, first.costs)
}

struct RunResult {
    report: ScenarioReport,
    costs: BTreeMap<&'static str, KindCost>,
    actions: Vec<Action>,
    /// The run's engine and what it observed (for the crate's tests).
    #[cfg_attr(not(test), allow(dead_code))]
    harness: Harness,
}

/// What the script does to the cluster at fixed times, besides sending requests.
#[derive(Debug, Clone, Copy)]
enum Scripted {
    /// The client of a request the policy holds gives up.
    Cancel,
    /// The host adds a `classify` worker.
    AddWorker,
    /// The host loses a `classify` worker.
    RemoveWorker,
    /// The host serves a changed repository.
    Reconfigure(repository::Reconfiguration),
}

/// Most policy calls of one run.
const MAX_CALLS: usize = 100_000;

/// Most calls in a row at one instant that only deliver events the previous answer
/// caused (as in the simulator).
const MAX_CAUSED_ROUNDS: u32 = 4;

/// One scripted run of `scenario` on the engine. Requests sent at an instant reach
/// the engine before what the script does to the cluster then.
fn run(scenario: Scenario, start: &dyn Fn(Config, &ClusterState) -> (Arm, ArmOutput), options: &CheckOptions) -> RunResult {
    let mut harness = Harness::start_on(scenario.pipeline(), options.params.clone(), options.seed, start);
    let mut report = ScenarioReport { scenario, ..ScenarioReport::default() };

    let mut arrivals = scenario.arrivals(options);
    let requests = arrivals.len() as u32;
    let last_deadline = arrivals.iter().map(|s| s.deadline).max().unwrap_or(0);
    // Ticks go on a second past the last deadline; a policy still holding requests
    // then runs until the engine expires them (5 s after their deadline).
    let ticks_until = last_deadline + 1_000 * MS;
    let stop_at = last_deadline + harness.engine().options().expiry_grace + 2_000 * MS;
    arrivals.reverse(); // popped from the back, in time order
    let mut scripted = scenario.script();
    scripted.reverse();

    let mut caused_rounds = 0;
    loop {
        let script_next = [arrivals.last().map(|s| s.sent_at), scripted.last().map(|s| s.0)].into_iter().flatten().min();
        if script_next.is_none() && harness.now() >= ticks_until && harness.quiet() {
            break;
        }
        // Events the last answer caused (a preempted batch's requests handed back, a
        // refused dispatch's worker idle again) reach the policy at the same instant,
        // a few rounds at most.
        let caused = (harness.engine().has_pending() && caused_rounds < MAX_CAUSED_ROUNDS).then(|| harness.now());
        let Some(next) = [script_next, harness.next_time(), caused].into_iter().flatten().min() else { break };
        if next > stop_at {
            break;
        }
        caused_rounds = if caused == Some(next) { caused_rounds + 1 } else { 0 };
        harness.move_to(next);
        while arrivals.last().is_some_and(|s| s.sent_at <= next) {
            harness.submit(arrivals.pop().expect("checked"));
        }
        while scripted.last().is_some_and(|s| s.0 <= next) {
            let (_, what) = scripted.pop().expect("checked");
            scripted_event(&mut harness, what, &mut report);
        }
        harness.wake();
        harness.flush();
        if harness.calls().len() > MAX_CALLS {
            report.violations.push(format!("the run did not settle within {MAX_CALLS} calls"));
            break;
        }
    }

    let mut log = Vec::new();
    let mut costs: BTreeMap<&'static str, KindCost> = BTreeMap::new();
    for call in harness.calls() {
        if let Some(fault) = &call.output.fault {
            report.faults.push(fault.to_string());
        }
        for (action, reason) in &call.output.rejected {
            report.rejected.push(format!("{} rejected: {reason}", action.kind()));
        }
        log.extend(call.output.actions.iter().cloned());
        if call.kind == "init" {
            continue;
        }
        report.events += call.events.len() as u64;
        let cost = costs.entry(call.kind).or_default();
        cost.calls += 1;
        cost.events += call.events.len() as u64;
        if let Some(last) = call.cost {
            cost.wall += last.wall;
            cost.fuel += last.fuel.unwrap_or(0);
        }
    }

    let mut outcomes = Outcomes { requests, ..Outcomes::default() };
    for (_, fate) in harness.fates() {
        match fate {
            Fate::Completed { late: false } => outcomes.on_time += 1,
            Fate::Completed { late: true } => outcomes.late += 1,
            Fate::Dropped => outcomes.dropped += 1,
            Fate::Cancelled => outcomes.cancelled += 1,
            Fate::Refused => outcomes.refused += 1,
            Fate::Unloaded => outcomes.unloaded += 1,
            Fate::Failed => outcomes.failed += 1,
            Fate::Expired => {} // lost
        }
    }
    report.lost = harness.lost();
    report.lost.sort();
    if scenario == Scenario::ZeroTime && (outcomes.on_time as f64) < zero_time::MIN_ON_TIME * requests as f64 {
        report.violations.push(format!(
            "{} of {requests} requests on time at a light load ({} dropped, {} late): under {:.0} % — a stage that takes no time ({}) mishandled?",
            outcomes.on_time,
            outcomes.dropped,
            outcomes.late,
            100.0 * zero_time::MIN_ON_TIME,
            zero_time::ZERO_TIME_STAGES.join(", ")
        ));
    }
    if scenario == Scenario::Batches {
        batches::judge(&harness, &outcomes, &mut report);
    }
    report.outcomes = outcomes;
    report.violations.extend(harness.violations().iter().cloned());
    report.actions = harness.arm().stats().accepted_total();
    RunResult { report, costs, actions: log, harness }
}

/// Act on the cluster as the script says, through the engine's own operations; a
/// reconfiguration is noted in `report` (a violation if the engine refuses it).
fn scripted_event(harness: &mut Harness, what: Scripted, report: &mut ScenarioReport) {
    const CLASSIFY: u32 = 1;
    let state = harness.engine().state();
    match what {
        Scripted::Cancel => {
            // The oldest request the policy holds in a queue, else the oldest in flight.
            let held = state.pieces().values().filter(|p| p.state == PieceState::Queued).map(|p| p.request.origin).min();
            if let Some(id) = held.or_else(|| state.origins().keys().copied().min()) {
                harness.cancel(id);
            }
        }
        Scripted::AddWorker => {
            let replicas = state.stages()[CLASSIFY as usize].replicas;
            harness.resize(CLASSIFY, replicas + 1);
        }
        Scripted::RemoveWorker => {
            // The newest serving worker of the stage, unless it is the stage's last one
            // (losing that would fail requests for want of a worker, not the policy's
            // doing).
            let workers: Vec<(u32, bool)> = state
                .workers()
                .values()
                .filter(|w| w.info.stage == CLASSIFY)
                .filter(|w| !matches!(w.phase, WorkerPhase::Draining { .. }))
                .map(|w| (w.info.id, w.phase != WorkerPhase::Starting))
                .collect();
            if let Some(&(id, _)) = workers.iter().rev().find(|(_, serving)| *serving).filter(|_| workers.len() > 1) {
                harness.worker_lost(id, "removed by the conformance script");
            }
        }
        Scripted::Reconfigure(change) => match harness.reconfigure(change.served.pipeline(), change.why) {
            Ok(outcome) => report.reconfigurations.push(format!(
                "{:>5} ms  {}: {} queued request{} dropped, {} replayed into a new instance",
                change.at / MS,
                change.why,
                outcome.failed,
                if outcome.failed == 1 { "" } else { "s" },
                outcome.replayed
            )),
            Err(error) => {
                report.violations.push(format!("the engine refused the script's change at {} ms ({}): {error}", change.at / MS, change.why))
            }
        },
    }
}

/// The script's requests, sorted by send time: a steady vision stream (one request in
/// ten with a deadline no schedule can meet), a burst of vision requests at 500 ms,
/// and a chat stream on the LLM stage.
fn arrival_script(options: &CheckOptions) -> Vec<Submission> {
    let pipeline = scripted::pipeline();
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
    let vision_slo = pipeline.streams[0].slo_ns;
    let chat_slo = pipeline.streams[1].slo_ns;
    let make = |stream: u32, sent_at: u64, deadline: u64, expected_tokens: u32| Submission {
        stream,
        sent_at,
        deadline,
        priority: 0,
        input_size: 64,
        expected_tokens,
        ..Submission::default()
    };
    let mut requests = Vec::with_capacity(total as usize);
    let mut t = 0u64;
    for i in 0..steady {
        t += (-(1.0 - next()).ln() * 4.0 * MS as f64) as u64 + 1;
        let slo = if i % 10 == 9 { MS } else { vision_slo };
        requests.push(make(0, t, t + slo, 0));
    }
    let burst_at = 500 * MS;
    for _ in 0..burst {
        requests.push(make(0, burst_at, burst_at + vision_slo, 0));
    }
    for k in 0..chat {
        let sent = k as u64 * 37 * MS;
        let tokens = 8 + (next() * 32.0) as u32;
        requests.push(make(1, sent, sent + chat_slo, tokens));
    }
    // Stable: requests sent at the same time keep the script's order.
    requests.sort_by_key(|s| s.sent_at);
    requests
}
