//! A policy arm: one long-lived policy instance with the requests it holds, the
//! validation of its answers, and what happens when it fails.
//!
//! Every call goes through [`Arm::handle`]: arrivals enter the arm's [`Ledger`] before
//! the policy sees them, the policy's answer is validated against the ledger and the
//! cluster, and accepted actions take their requests out of the ledger. When a call
//! faults (trap, overrun, memory), the arm's [`FailureMode`] applies:
//! - `fail-open`: the built-in fallback (`fifo`, native) takes over; it is initialised
//!   and replayed every held request, the idle workers, the events of the failed call
//!   and the latest snapshot, so no request is lost;
//! - `fail-closed`: the arm refuses new work; the held requests are handed back to the
//!   host to fail with a clear error;
//! - `reload`: a fresh instance of the same component takes over at once; if it faults
//!   again, the fallback serves while the arm backs off (1 s, doubling to 60 s) before
//!   the next fresh instance.
//!
//! [`Arm::swap`] hands the arm over to another policy on a running engine, and the
//! old instance is returned for the caller to drop wherever it likes. The new
//! instance ([`Candidate`]) is instantiated by the caller, off the engine's thread,
//! and comes in one of two ways:
//! - plain: it is initialised and replayed the held requests, the idle workers and
//!   the latest snapshot by the same hand-over the failure modes use;
//! - prepared ([`Candidate::pre_replay`]): the caller took a [`HandoverSnapshot`] of
//!   the arm (its configuration and held requests, [`Arm::handover_snapshot`]) and
//!   initialised and replayed the candidate from it on its own thread. At the swap
//!   the candidate is only told what changed since: the requests that arrived, the
//!   workers added and removed, the idle workers and the latest snapshot. The
//!   actions it took during the pre-replay are validated against the arm's ledger
//!   and the cluster as they are now; the requests of the ones refused are handed
//!   to it again. Requests that left the arm meanwhile (dispatched, dropped or
//!   deferred by the old policy, or ended) are not announced — an id may come back
//!   later, at the next stage of a chain or when a deferral comes due, and a policy
//!   that forgets ended ids lazily would then skip it — so the candidate may still
//!   hold them: its uses of them are taken out of its answers, once each
//!   ([`ArmStats::forgiven`]), instead of failing the actions they are in.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::contract::{Action, Config, Event, Param, Request, Snapshot, Worker};
use super::instance::{PolicyFault, PolicyInstance, ProfileSource, WasmPolicy};
use super::loader::PolicyModule;
use super::native::NativePolicy;
use super::sandbox::{CallKind, Sandbox};
use super::validate::{validate, ClusterView, Ledger, LedgerChanges, LedgerSnapshot, Rejection};

/// What an arm does when its policy faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Switch to the built-in fallback and replay the held requests into it.
    FailOpen,
    /// Refuse new work; fail the held requests with the fault as the error.
    FailClosed,
    /// Start a fresh instance; on repeated faults back off, serving with the fallback.
    Reload,
}

impl std::str::FromStr for FailureMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail-open" => Ok(Self::FailOpen),
            "fail-closed" => Ok(Self::FailClosed),
            "reload" => Ok(Self::Reload),
            other => Err(format!("unknown failure mode {other:?} (fail-open, fail-closed, reload)")),
        }
    }
}

impl std::fmt::Display for FailureMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::FailOpen => "fail-open",
            Self::FailClosed => "fail-closed",
            Self::Reload => "reload",
        })
    }
}

/// First and largest back-off of `reload`.
pub const RELOAD_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Which instance is answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmState {
    /// The arm's own policy.
    Primary,
    /// The built-in fallback, after a fault.
    Fallback,
    /// Refusing work after a fault (`fail-closed`).
    Closed,
}

/// Counters of an arm, for metrics and reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArmStats {
    /// Policy calls made.
    pub calls: u64,
    /// Events delivered.
    pub events: u64,
    /// Accepted actions by kind.
    pub accepted: BTreeMap<&'static str, u64>,
    /// Rejected actions by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Switches to the fallback.
    pub fallbacks: u64,
    /// Fresh instances started by `reload`.
    pub reloads: u64,
    /// Requests replayed into new instances.
    pub replayed: u64,
    /// Uses of requests that had left the arm while a prepared candidate was being
    /// replayed, taken out of its answers (see the module docs).
    pub forgiven: u64,
    /// Total wall time in policy calls.
    pub call_time: Duration,
    /// Longest call.
    pub max_call_time: Duration,
    /// Total fuel (simulate mode).
    pub fuel: u64,
    /// Hot swaps to another policy, and how long each held the engine.
    pub swaps: SwapPauses,
    /// Linear memory of the answering instance after its latest call, bytes (0 while a
    /// native policy answers, as the built-in fallback).
    pub memory_bytes: u64,
    /// The most linear memory any instance of the arm held after a call, bytes.
    pub peak_memory_bytes: u64,
    /// Why a policy refused to start (its `init` returned an error), when one did:
    /// the first such reason. A policy refuses a pipeline it does not support (Loki
    /// one that is not a tree of tasks, for example).
    pub init_refusal: Option<String>,
    /// The metrics its policies emitted (`host.emit`), by name.
    pub metrics: BTreeMap<String, EmittedMetric>,
    /// Emitted values not counted because [`MAX_METRIC_NAMES`] names were already
    /// tracked.
    pub metrics_dropped: u64,
}

/// Most distinct metric names an arm tracks; values of further names are counted in
/// [`ArmStats::metrics_dropped`] only, so a policy cannot grow the host's memory.
pub const MAX_METRIC_NAMES: usize = 256;

/// What an arm saw of one metric its policy emitted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EmittedMetric {
    /// Values emitted.
    pub count: u64,
    /// Values above zero (for a flag such as `…plan_infeasible`, how often it was set).
    pub positive: u64,
    /// Their sum.
    pub sum: f64,
    /// The latest value.
    pub last: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl EmittedMetric {
    /// Count one value.
    fn record(&mut self, value: f64) {
        if self.count == 0 {
            (self.min, self.max) = (value, value);
        }
        self.count += 1;
        self.positive += u64::from(value > 0.0);
        self.sum += value;
        self.last = value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }
}

/// Upper bounds of the [`SwapPauses`] buckets, in microseconds (the last bucket,
/// beyond these, is unbounded).
pub const SWAP_PAUSE_BUCKETS_US: [u64; 10] = [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000];

/// How long swaps paused the engine: a count, a sum, the longest, the last, and a
/// histogram over [`SWAP_PAUSE_BUCKETS_US`] (one more bucket for anything longer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwapPauses {
    /// Swaps done.
    pub count: u64,
    /// Sum of the pauses.
    pub total: Duration,
    /// Longest pause.
    pub max: Duration,
    /// Pause of the latest swap.
    pub last: Duration,
    /// Per-bucket counts (not cumulative).
    pub buckets: [u64; SWAP_PAUSE_BUCKETS_US.len() + 1],
}

impl SwapPauses {
    /// Count one swap that held the engine for `pause`.
    pub fn record(&mut self, pause: Duration) {
        self.count += 1;
        self.total += pause;
        self.max = self.max.max(pause);
        self.last = pause;
        let micros = pause.as_micros() as u64;
        let bucket = SWAP_PAUSE_BUCKETS_US.iter().position(|&bound| micros <= bound).unwrap_or(SWAP_PAUSE_BUCKETS_US.len());
        self.buckets[bucket] += 1;
    }
}

impl ArmStats {
    /// All rejected actions.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }

    /// All accepted actions.
    pub fn accepted_total(&self) -> u64 {
        self.accepted.values().sum()
    }

    /// How often the policy reported planning with no plan that meets its SLO (and so
    /// serving its own infeasible-plan fallback): the values above zero of every metric
    /// named [`PLAN_INFEASIBLE_METRIC`] or ending in `.` and that name
    /// (as `loki.plan_infeasible`).
    pub fn infeasible_plans(&self) -> u64 {
        self.metrics.iter().filter(|(name, _)| is_plan_infeasible_metric(name)).map(|(_, m)| m.positive).sum()
    }

    /// Whether the policy fell back in any way: a fault, a switch to the built-in
    /// fallback, or a plan of its own reported infeasible.
    pub fn fell_back(&self) -> bool {
        !self.faults.is_empty() || self.fallbacks > 0 || self.infeasible_plans() > 0
    }

    /// Count the metrics an instance emitted.
    fn record_emitted(&mut self, emitted: Vec<(String, f64)>) {
        for (name, value) in emitted {
            let tracked = self.metrics.len();
            match self.metrics.get_mut(name.as_str()) {
                Some(metric) => metric.record(value),
                None if tracked < MAX_METRIC_NAMES => self.metrics.entry(name).or_default().record(value),
                None => self.metrics_dropped += 1,
            }
        }
    }
}

/// The name (alone or after a `policy.` prefix, as `loki.plan_infeasible`) of the metric
/// a policy emits at every plan it makes: 1 when no plan meets its SLO and it serves
/// its own infeasible-plan fallback, 0 otherwise. Reports count the ones
/// ([`ArmStats::infeasible_plans`]).
pub const PLAN_INFEASIBLE_METRIC: &str = "plan_infeasible";

/// Whether `name` is the infeasible-plan metric ([`PLAN_INFEASIBLE_METRIC`],
/// alone or after a `prefix.`).
pub fn is_plan_infeasible_metric(name: &str) -> bool {
    let flag = PLAN_INFEASIBLE_METRIC;
    name == flag || name.strip_suffix(flag).is_some_and(|prefix| prefix.ends_with('.'))
}

/// What one call of the arm produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ArmOutput {
    /// Validated actions to apply, in order.
    pub actions: Vec<Action>,
    /// Rejected actions with reasons.
    pub rejected: Vec<(Action, Rejection)>,
    /// The fault this call hit, if any (already handled per the failure mode).
    pub fault: Option<PolicyFault>,
    /// Requests the arm will not schedule (fail-closed): the host must fail them with
    /// `refusal` as the error.
    pub refused: Vec<u64>,
    /// Why requests are refused.
    pub refusal: Option<String>,
    /// Workers a dispatch named whose every request was forgiven (see the module
    /// docs): the policy believes them busy, but they are idle. The host tells the
    /// policy so (`worker-idle`) at once, once this answer is applied.
    pub idle_again: Vec<u32>,
}

impl ArmOutput {
    /// Append what a later call of the same hand-over produced.
    fn merge(&mut self, next: ArmOutput) {
        self.actions.extend(next.actions);
        self.rejected.extend(next.rejected);
        self.fault = self.fault.take().or(next.fault);
        self.refused.extend(next.refused);
        self.refusal = self.refusal.take().or(next.refusal);
        self.idle_again.extend(next.idle_again);
    }
}

/// A policy ready to take over an arm: instantiated (which is the expensive part,
/// and can happen on any thread), and either not yet initialised or initialised and
/// replayed from a [`HandoverSnapshot`] ([`Candidate::pre_replay`]).
pub struct Candidate {
    instance: Box<dyn PolicyInstance>,
    source: Option<Reloadable>,
    prepared: Option<PreReplay>,
    /// Parameters the operator gave this policy, over the arm's.
    params: Vec<Param>,
    /// The failure mode the operator gave it, instead of the arm's.
    failure: Option<FailureMode>,
}

/// What the arm needs to know at the swap about a candidate's pre-replay.
struct PreReplay {
    /// The arm the snapshot was taken of.
    arm: String,
    /// The ledger at the snapshot.
    ledger: LedgerSnapshot,
    /// The workers of the configuration the candidate was initialised with.
    workers: Vec<Worker>,
    /// Its answers to `init` and to the replay, not yet validated.
    actions: Vec<Action>,
}

/// What a candidate is prepared from, off the engine's thread: an arm's configuration
/// (with the clock and the serving workers of the moment) and the requests it holds,
/// in arrival order. Taken with [`Arm::handover_snapshot`], used by
/// [`Candidate::pre_replay`].
pub struct HandoverSnapshot {
    arm: String,
    config: Config,
    held: Vec<Request>,
    ledger: LedgerSnapshot,
}

impl HandoverSnapshot {
    /// Requests held at the snapshot.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The arm it was taken of.
    pub fn arm(&self) -> &str {
        &self.arm
    }
}

impl std::fmt::Debug for HandoverSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandoverSnapshot").field("arm", &self.arm).field("held", &self.held.len()).finish_non_exhaustive()
    }
}

impl Candidate {
    /// Instantiate `module` in `sandbox` for an arm whose policies get `seed` and
    /// `profiles` (see [`Arm::candidate_inputs`]). A fault here (a trap in the
    /// component's start function) is the caller's to report; the arm is untouched.
    pub fn wasm(
        sandbox: &Sandbox,
        module: Arc<PolicyModule>,
        seed: u64,
        profiles: Option<Arc<dyn ProfileSource>>,
    ) -> Result<Self, PolicyFault> {
        let instance = WasmPolicy::instantiate(sandbox, module.clone(), seed, profiles.clone())?;
        let source = Reloadable { sandbox: sandbox.clone(), module, profiles };
        Ok(Self { instance: Box::new(instance), source: Some(source), prepared: None, params: Vec::new(), failure: None })
    }

    /// Give the candidate its own settings: `params` over the arm's parameters (a key
    /// given here replaces the arm's), and a failure mode instead of the arm's. They
    /// are used from its `init` on and stay with the arm it takes over.
    pub fn with_settings(mut self, params: Vec<Param>, failure: Option<FailureMode>) -> Self {
        self.params = params;
        self.failure = failure;
        self
    }

    /// `config` with the candidate's parameters over its own.
    pub(crate) fn configure(&self, config: &Config) -> Config {
        Config { params: merged_params(&config.params, &self.params), ..config.clone() }
    }

    /// An already built instance (native policies, tests). Under `reload` the arm
    /// cannot start a fresh copy of it and serves with the fallback instead.
    pub fn native(instance: Box<dyn PolicyInstance>) -> Self {
        Self { instance, source: None, prepared: None, params: Vec::new(), failure: None }
    }

    /// Initialise the candidate with the snapshot's configuration and replay the
    /// snapshot's held requests into it, on the caller's thread, so that the swap
    /// only has to tell it what changed since (see the module docs). Its actions are
    /// kept for the swap, which validates them against the arm as it is then. A
    /// fault here is the caller's to handle: the instance is spent (the arm never saw
    /// it). Returns how long the calls took. A candidate is prepared at most once.
    pub fn pre_replay(&mut self, snapshot: HandoverSnapshot) -> Result<Duration, PolicyFault> {
        if self.prepared.is_some() {
            return Err(PolicyFault::InitRefused("the candidate was already initialised".into()));
        }
        let started = Instant::now();
        let HandoverSnapshot { arm, config, held, ledger } = snapshot;
        let config = self.configure(&config);
        let now = config.now;
        let mut actions = self.instance.init(&config, now)?;
        if !held.is_empty() {
            let arrivals: Vec<Event> = held.into_iter().map(Event::Arrival).collect();
            actions.extend(self.instance.handle(&arrivals, now, CallKind::Init)?);
        }
        self.prepared = Some(PreReplay { arm, ledger, workers: config.workers, actions });
        Ok(started.elapsed())
    }

    /// Whether the candidate was prepared with [`Candidate::pre_replay`].
    pub fn is_prepared(&self) -> bool {
        self.prepared.is_some()
    }

    /// The label of the candidate's instance.
    pub fn label(&self) -> String {
        self.instance.label()
    }

    /// The instance and the component it runs (for a shadow, which never reloads).
    pub(super) fn into_parts(self) -> (Box<dyn PolicyInstance>, Option<Arc<PolicyModule>>) {
        (self.instance, self.source.map(|s| s.module))
    }
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate").field("instance", &self.instance.label()).finish()
    }
}

/// How a swap handed the held requests over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Everything held was replayed at the swap.
    Full,
    /// The candidate had been replayed a snapshot; at the swap it was told what
    /// changed since.
    Delta {
        /// Events delivered at the swap.
        events: usize,
        /// Requests that arrived after the snapshot (or were handed back after a
        /// refused pre-replay action) and were delivered at the swap.
        arrived: usize,
        /// Requests of the snapshot that had left the arm by the swap.
        left: usize,
    },
}

/// What a swap did.
#[derive(Debug, Clone, PartialEq)]
pub struct SwapReport {
    /// Label of the instance that answered before (`closed` when none did).
    pub from: String,
    /// Label of the instance swapped in.
    pub to: String,
    /// Requests the arm held at the swap: all replayed into the new instance at the
    /// swap, or (prepared) before it and brought up to date at it.
    pub replayed: usize,
    /// How they were handed over.
    pub handover: Handover,
    /// The arm's state after the swap: `Primary`, unless the new policy faulted at
    /// once and the failure mode applied.
    pub state: ArmState,
    /// The fault the new policy hit during the hand-over, if any.
    pub fault: Option<PolicyFault>,
}

/// Where a fresh primary instance comes from (for `reload`).
#[derive(Clone)]
struct Reloadable {
    sandbox: Sandbox,
    module: Arc<PolicyModule>,
    profiles: Option<Arc<dyn ProfileSource>>,
}

/// A policy arm.
pub struct Arm {
    name: String,
    config: Config,
    mode: FailureMode,
    state: ArmState,
    instance: Option<Box<dyn PolicyInstance>>,
    reloadable: Option<Reloadable>,
    ledger: Ledger,
    stats: ArmStats,
    last_snapshot: Option<Snapshot>,
    closed_reason: Option<String>,
    /// Consecutive faults under `reload`, and when the next fresh instance may start.
    reload_attempts: u32,
    retry_at: Option<u64>,
    healthy_since: u64,
    /// Requests the answering instance may still hold though they left the arm
    /// before a prepared hand-over, with how many uses of each to forgive.
    stale: HashMap<u64, u32>,
    /// The parameters the arm was given (the server's), without its policy's own.
    base_params: Vec<Param>,
    /// The parameters its policy was given over the server's (a swap's or A/B
    /// candidate's own); `config.params` is the two merged.
    policy_params: Vec<Param>,
    /// Workers of dispatches emptied by forgiving, for the answer being accepted.
    idle_again: Vec<u32>,
}

impl Arm {
    /// Start an arm on a policy component. A fault in `init` applies the failure mode
    /// straight away (the arm then starts on its fallback, or closed).
    pub fn start_wasm(
        name: &str,
        config: Config,
        sandbox: &Sandbox,
        module: Arc<PolicyModule>,
        mode: FailureMode,
        profiles: Option<Arc<dyn ProfileSource>>,
        view: &dyn ClusterView,
    ) -> (Self, ArmOutput) {
        let reloadable = Reloadable { sandbox: sandbox.clone(), module, profiles };
        let mut arm = Self::empty(name, config, mode);
        arm.reloadable = Some(reloadable);
        let output = match arm.fresh_primary() {
            Ok(instance) => arm.hand_over(instance, ArmState::Primary, Vec::new(), view),
            Err(fault) => arm.fault(fault, Vec::new(), view),
        };
        (arm, output)
    }

    /// Start an arm on an already built instance (native policies, tests).
    pub fn start(
        name: &str,
        config: Config,
        instance: Box<dyn PolicyInstance>,
        mode: FailureMode,
        view: &dyn ClusterView,
    ) -> (Self, ArmOutput) {
        let mut arm = Self::empty(name, config, mode);
        let output = arm.hand_over(instance, ArmState::Primary, Vec::new(), view);
        (arm, output)
    }

    /// Start an arm on a [`Candidate`] (instantiated off the engine's thread, as for
    /// a swap): the second arm of an A/B run. A fault in `init` applies the failure
    /// mode straight away.
    pub fn start_candidate(
        name: &str,
        config: Config,
        candidate: Candidate,
        mode: FailureMode,
        view: &dyn ClusterView,
    ) -> (Self, ArmOutput) {
        let mut arm = Self::empty(name, config, candidate.failure.unwrap_or(mode));
        arm.set_policy_params(candidate.params);
        arm.reloadable = candidate.source;
        let output = arm.hand_over(candidate.instance, ArmState::Primary, Vec::new(), view);
        (arm, output)
    }

    /// What the arm does when its policy faults.
    pub fn failure_mode(&self) -> FailureMode {
        self.mode
    }

    /// Give its policy `params` over the server's parameters.
    fn set_policy_params(&mut self, params: Vec<Param>) {
        self.config.params = merged_params(&self.base_params, &params);
        self.policy_params = params;
    }

    /// The arm's configuration with the server's parameters only: what a policy about
    /// to replace or shadow the running one starts from (before its own parameters).
    pub fn base_config(&self) -> Config {
        Config { params: self.base_params.clone(), ..self.config.clone() }
    }

    /// The limits its policy component runs under (`None` for a native policy).
    pub fn limits(&self) -> Option<&super::sandbox::Limits> {
        self.reloadable.as_ref().map(|r| r.sandbox.limits())
    }

    fn empty(name: &str, config: Config, mode: FailureMode) -> Self {
        let base_params = config.params.clone();
        Self {
            name: name.into(),
            config,
            mode,
            state: ArmState::Primary,
            instance: None,
            reloadable: None,
            ledger: Ledger::default(),
            stats: ArmStats::default(),
            last_snapshot: None,
            closed_reason: None,
            reload_attempts: 0,
            retry_at: None,
            healthy_since: 0,
            base_params,
            policy_params: Vec::new(),
            stale: HashMap::default(),
            idle_again: Vec::new(),
        }
    }

    /// The arm's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which instance answers now.
    pub fn state(&self) -> ArmState {
        self.state
    }

    /// A label of the instance answering now.
    pub fn instance_label(&self) -> String {
        self.instance.as_ref().map(|i| i.label()).unwrap_or_else(|| "closed".into())
    }

    /// Whether the instance answering now sees a request's items and its place in a
    /// stateful sequence (contract 0.3.0 on); a closed arm sees nothing to refuse.
    pub fn sees_items_and_sequences(&self) -> bool {
        self.instance.as_ref().is_none_or(|i| i.contract_version() >= super::contract::ITEMS_AND_SEQUENCES)
    }

    /// The contract version of the instance answering now, if one answers.
    pub fn contract_version(&self) -> Option<super::contract::ContractVersion> {
        self.instance.as_ref().map(|i| i.contract_version())
    }

    /// The counters.
    pub fn stats(&self) -> &ArmStats {
        &self.stats
    }

    /// The requests the policy holds.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The component the arm's primary runs (also while the fallback answers for it),
    /// if the primary is a component.
    pub fn module(&self) -> Option<&Arc<PolicyModule>> {
        self.reloadable.as_ref().map(|r| &r.module)
    }

    /// The configuration the arm's policies are initialised with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest telemetry snapshot the arm delivered.
    pub fn last_snapshot(&self) -> Option<&Snapshot> {
        self.last_snapshot.as_ref()
    }

    /// What a [`Candidate`] for this arm is built with: the arm's seed and its
    /// profile source.
    pub fn candidate_inputs(&self) -> (u64, Option<Arc<dyn ProfileSource>>) {
        (self.config.seed, self.reloadable.as_ref().and_then(|r| r.profiles.clone()))
    }

    /// What a candidate is prepared from off the engine's thread
    /// ([`Candidate::pre_replay`]): the arm's configuration with the clock and the
    /// workers serving now, and a copy of the held requests in arrival order. Costs
    /// one sequential copy of the ledger.
    pub fn handover_snapshot(&self, view: &dyn ClusterView) -> HandoverSnapshot {
        // A candidate starts from the server's parameters, not the running policy's own.
        let mut config = self.base_config();
        config.now = view.now();
        config.workers = view.serving_workers();
        let (ledger, held) = self.ledger.snapshot();
        HandoverSnapshot { arm: self.name.clone(), config, held, ledger }
    }

    /// Hand the arm over to `candidate`: initialise it, replay every held request,
    /// the idle workers and the latest snapshot into it (the same hand-over the
    /// failure modes use, so no request is lost or handled twice), and make it the
    /// primary, whatever state the arm was in (a closed arm opens again). If the new
    /// policy faults during the hand-over, the failure mode applies as for any fault.
    /// Returns the hand-over's actions, what happened, and the retired instance (for
    /// the caller to drop off the hot path).
    ///
    /// A candidate prepared from a snapshot of this arm ([`Candidate::pre_replay`])
    /// is only told what changed since (see the module docs). One prepared from a
    /// snapshot of another arm is not used: a fresh instance of its component takes
    /// over by the plain hand-over (a native one cannot be made afresh, which counts
    /// as a fault of the new policy).
    pub fn swap(&mut self, candidate: Candidate, view: &dyn ClusterView) -> (ArmOutput, SwapReport, Option<Box<dyn PolicyInstance>>) {
        let retired = self.instance.take();
        let from = retired.as_ref().map(|i| i.label()).unwrap_or_else(|| "closed".into());
        let to = candidate.label();
        let replayed = self.ledger.len();
        let Candidate { instance, source, prepared, params, failure } = candidate;
        self.set_policy_params(params);
        if let Some(mode) = failure {
            self.mode = mode;
        }
        self.reloadable = source;
        self.reload_attempts = 0;
        self.retry_at = None;
        self.closed_reason = None;
        let (output, handover) = match prepared {
            None => (self.hand_over(instance, ArmState::Primary, Vec::new(), view), Handover::Full),
            Some(pre) => match self.ledger.changes_since(&pre.ledger).filter(|_| pre.arm == self.name) {
                Some(changes) => self.hand_over_prepared(instance, pre, changes, view),
                None => {
                    tracing::warn!(arm = %self.name, snapshot = %pre.arm, "the candidate was prepared from another arm: a fresh instance takes over");
                    let output = match self.fresh_primary() {
                        Ok(fresh) => self.hand_over(fresh, ArmState::Primary, Vec::new(), view),
                        Err(fault) => {
                            self.state = ArmState::Primary;
                            self.fault(fault, Vec::new(), view)
                        }
                    };
                    (output, Handover::Full)
                }
            },
        };
        let report = SwapReport { from, to, replayed, handover, state: self.state, fault: output.fault.clone() };
        (output, report, retired)
    }

    /// Give the arm a new configuration — the cluster changed under it (models loaded
    /// or unloaded while serving) — and hand it over to an instance initialised with
    /// it, by the same hand-over the failure modes use (every held request, the idle
    /// workers and the latest snapshot replayed, so nothing is lost): a fresh instance
    /// of the component while the primary answers (a native primary is initialised
    /// again), a fresh fallback while the fallback answers. A closed arm only takes the
    /// configuration. The arm keeps its name and seed. A fault of the new instance
    /// applies the failure mode as for any fault. Returns the hand-over's actions and
    /// the retired instance (for the caller to drop off the hot path).
    pub fn reconfigure(&mut self, config: Config, view: &dyn ClusterView) -> (ArmOutput, Option<Box<dyn PolicyInstance>>) {
        let (arm, seed) = (std::mem::take(&mut self.config.arm), self.config.seed);
        self.base_params = config.params.clone();
        self.config = Config { arm, seed, ..config };
        // The running policy keeps the parameters it was given over the server's.
        let own = std::mem::take(&mut self.policy_params);
        self.set_policy_params(own);
        // The latest snapshot describes the cluster before the change (no entry for a
        // stage just added): the next tick brings one of the new cluster.
        self.last_snapshot = None;
        match self.state {
            ArmState::Closed => (ArmOutput::default(), None),
            ArmState::Fallback => {
                let retired = self.instance.take();
                let fallback = self.fallback();
                (self.hand_over(fallback, ArmState::Fallback, Vec::new(), view), retired)
            }
            ArmState::Primary => {
                let retired = self.instance.take();
                match (self.reloadable.is_some(), retired) {
                    (false, Some(native)) => (self.hand_over(native, ArmState::Primary, Vec::new(), view), None),
                    (_, retired) => match self.fresh_primary() {
                        Ok(instance) => (self.hand_over(instance, ArmState::Primary, Vec::new(), view), retired),
                        Err(fault) => (self.fault(fault, Vec::new(), view), retired),
                    },
                }
            }
        }
    }

    /// Make a candidate prepared from a snapshot of this arm answer: validate what it
    /// did in the pre-replay against the arm as it is now, and tell it what changed
    /// since the snapshot, in one call.
    fn hand_over_prepared(
        &mut self,
        instance: Box<dyn PolicyInstance>,
        pre: PreReplay,
        changes: LedgerChanges,
        view: &dyn ClusterView,
    ) -> (ArmOutput, Handover) {
        let now = view.now();
        self.state = ArmState::Primary;
        self.instance = Some(instance);
        self.healthy_since = now;
        self.stats.replayed += (pre.ledger.len() + changes.arrived.len()) as u64;

        // The pre-replay's actions were decided against the snapshot: they stand only
        // if they hold against the arm now. A timer due meanwhile fires at once.
        let mut actions: Vec<Action> = pre
            .actions
            .into_iter()
            .map(|action| match action {
                Action::SetTimer(mut timer) if timer.at < now => {
                    timer.at = now;
                    Action::SetTimer(timer)
                }
                other => other,
            })
            .collect();
        // What left the arm since the snapshot, the candidate may still hold: its uses
        // of those requests are forgiven, from the pre-replay's actions on.
        self.stale.clear();
        for id in &changes.left {
            *self.stale.entry(*id).or_default() += 1;
        }
        self.idle_again.clear();
        self.forgive_stale(&mut actions, view);
        let verdict = validate(actions.clone(), &self.ledger, view);
        // Requests the candidate gave away in a refused action, but the arm still
        // holds, are handed to it again; workers it dispatched to are not idle.
        let consumed_by = |action: &Action| -> Vec<u64> {
            match action {
                Action::Dispatch(d) => d.requests.clone(),
                Action::Drop(d) => vec![d.request],
                Action::Defer(d) => vec![d.request],
                _ => Vec::new(),
            }
        };
        let used: HashSet<u64> = verdict.accepted.iter().flat_map(consumed_by).collect();
        let mut given_back: Vec<u64> = verdict
            .rejected
            .iter()
            .flat_map(|(action, _)| consumed_by(action))
            .filter(|id| !used.contains(id) && self.ledger.get(*id).is_some())
            .collect::<HashSet<u64>>()
            .into_iter()
            .collect();
        given_back.sort_by_key(|id| self.ledger.position(*id));
        let taken: HashSet<u32> = verdict
            .accepted
            .iter()
            .filter_map(|action| match action {
                Action::Dispatch(d) => Some(d.worker),
                _ => None,
            })
            .collect();

        let serving = view.serving_workers();
        let known: HashSet<u32> = pre.workers.iter().map(|w| w.id).collect();
        let serving_ids: HashSet<u32> = serving.iter().map(|w| w.id).collect();
        let mut delta: Vec<Event> = Vec::new();
        delta.extend(pre.workers.iter().filter(|w| !serving_ids.contains(&w.id)).map(|w| Event::WorkerRemoved(w.id)));
        delta.extend(serving.into_iter().filter(|w| !known.contains(&w.id)).map(Event::WorkerAdded));
        let arrived = given_back.len() + changes.arrived.len();
        delta.extend(given_back.iter().filter_map(|id| self.ledger.get(*id).cloned()).map(Event::Arrival));
        delta.extend(changes.arrived.into_iter().map(Event::Arrival));
        let idle: Vec<u32> = view.idle_workers().into_iter().filter(|w| !taken.contains(w)).collect();
        // A worker whose pre-replay dispatch was forgiven whole is in this list if idle.
        self.idle_again.clear();
        delta.extend(idle.into_iter().map(Event::WorkerIdle));
        if let Some(snapshot) = &self.last_snapshot {
            delta.push(Event::Tick(snapshot.clone()));
        }
        let handover = Handover::Delta { events: delta.len(), arrived, left: changes.left.len() };
        if !delta.is_empty() {
            self.stats.calls += 1;
            self.stats.events += delta.len() as u64;
            let instance = self.instance.as_mut().expect("just installed");
            let result = instance.handle(&delta, now, CallKind::Init);
            self.account_cost();
            match result {
                Ok(more) => actions.extend(more),
                // The pre-replay's actions go with the faulty instance: the failure
                // mode's hand-over replays everything the arm holds.
                Err(fault) => return (self.fault(fault, Vec::new(), view), handover),
            }
        }
        // One validation for both answers: the later actions see the earlier ones.
        (self.accept(actions, view), handover)
    }

    /// Count a swap that held the engine for `pause` (measured by the engine, which
    /// also applies the hand-over's actions).
    pub fn record_swap_pause(&mut self, pause: Duration) {
        self.stats.swaps.record(pause);
    }

    /// Cost of the last call of the answering instance.
    pub fn last_cost(&self) -> Option<super::instance::CallCost> {
        self.instance.as_ref().map(|i| i.last_cost())
    }

    /// Deliver a batch of events and return the validated actions.
    pub fn handle(&mut self, events: &[Event], view: &dyn ClusterView) -> ArmOutput {
        let now = view.now();
        let mut refused = Vec::new();
        for event in events {
            match event {
                Event::Arrival(request) => {
                    if self.state == ArmState::Closed {
                        refused.push(request.id);
                    } else {
                        self.ledger.insert(request.clone());
                    }
                }
                Event::RequestEnded((id, _)) => {
                    self.ledger.remove(*id);
                }
                Event::Tick(snapshot) => self.last_snapshot = Some(snapshot.clone()),
                _ => {}
            }
        }
        if self.state == ArmState::Closed {
            return ArmOutput { refused, refusal: self.closed_reason.clone(), ..ArmOutput::default() };
        }
        if self.retry_at.is_some_and(|at| now >= at) {
            self.retry_at = None;
            if let Ok(instance) = self.fresh_primary() {
                self.stats.reloads += 1;
                let mut output = self.hand_over(instance, ArmState::Primary, events.to_vec(), view);
                output.refused.extend(refused);
                return output;
            }
        }
        let kind = if events.iter().any(|e| matches!(e, Event::Tick(_))) { CallKind::Tick } else { CallKind::Events };
        self.stats.calls += 1;
        self.stats.events += events.len() as u64;
        let instance = self.instance.as_mut().expect("an open arm has an instance");
        let result = instance.handle(events, now, kind);
        self.account_cost();
        let mut output = match result {
            Ok(actions) => {
                if self.state == ArmState::Primary
                    && self.reload_attempts > 0
                    && now.saturating_sub(self.healthy_since) > backoff(self.reload_attempts).as_nanos() as u64
                {
                    self.reload_attempts = 0;
                }
                self.accept(actions, view)
            }
            Err(fault) => self.fault(fault, events.to_vec(), view),
        };
        output.refused.extend(refused);
        output
    }

    fn fresh_primary(&self) -> Result<Box<dyn PolicyInstance>, PolicyFault> {
        let Some(source) = self.reloadable.as_ref() else {
            return Err(PolicyFault::InitRefused("a native policy cannot be reloaded".into()));
        };
        let instance = WasmPolicy::instantiate(&source.sandbox, source.module.clone(), self.config.seed, source.profiles.clone())?;
        Ok(Box::new(instance))
    }

    fn fallback(&self) -> Box<dyn PolicyInstance> {
        let max_actions =
            self.reloadable.as_ref().map(|r| r.sandbox.limits().max_actions).unwrap_or(super::sandbox::Limits::default().max_actions);
        Box::new(NativePolicy::<policy_fifo::Fifo>::new("fifo", self.config.seed, max_actions))
    }

    /// Initialise `instance`, replay what the arm holds into it, and make it answer.
    /// `pending` are the events of a call that faulted (their arrivals are already
    /// held, so only their other events are re-delivered).
    fn hand_over(
        &mut self,
        mut instance: Box<dyn PolicyInstance>,
        state: ArmState,
        pending: Vec<Event>,
        view: &dyn ClusterView,
    ) -> ArmOutput {
        let now = view.now();
        let mut config = self.config.clone();
        config.now = now;
        // The workers serving now, not those of the arm's start: a fresh instance must
        // know the workers scaled up (or handed over) since.
        config.workers = view.serving_workers();
        // The new state holds from here, so a fault in the fallback's own init closes
        // the arm instead of starting another fallback.
        self.state = state;
        // A fresh instance is replayed exactly what the arm holds.
        self.stale.clear();
        let init = instance.init(&config, now);
        self.stats.calls += 1;
        self.instance = Some(instance);
        self.account_cost();
        let init_actions = match init {
            Ok(actions) => actions,
            Err(fault) => return self.fault(fault, pending, view),
        };
        self.healthy_since = now;

        // The last snapshot first (unless a tick is pending): the fresh instance learns
        // the state in force — the batch limits its predecessor set among it — before
        // it is handed the requests and the idle workers to dispatch to.
        let mut replay: Vec<Event> = Vec::new();
        let had_tick = pending.iter().any(|e| matches!(e, Event::Tick(_)));
        if !had_tick {
            if let Some(snapshot) = &self.last_snapshot {
                let mut snapshot = snapshot.clone();
                for stats in &mut snapshot.stages {
                    if let Some(stage) = view.stage(stats.stage) {
                        stats.batch_limit = stage.batch_limit;
                    }
                }
                replay.push(Event::Tick(snapshot));
            }
        }
        let arrivals: Vec<Event> = self.ledger.in_arrival_order().into_iter().map(Event::Arrival).collect();
        self.stats.replayed += arrivals.len() as u64;
        replay.extend(arrivals);
        replay.extend(view.idle_workers().into_iter().map(Event::WorkerIdle));
        replay.extend(pending.into_iter().filter(|e| !matches!(e, Event::Arrival(_) | Event::WorkerIdle(_) | Event::RequestEnded(_))));
        let mut output = self.accept(init_actions, view);
        if replay.is_empty() {
            return output;
        }
        self.stats.calls += 1;
        self.stats.events += replay.len() as u64;
        let instance = self.instance.as_mut().expect("just installed");
        let result = instance.handle(&replay, now, CallKind::Init);
        self.account_cost();
        let next = match result {
            Ok(actions) => self.accept(actions, view),
            Err(fault) => self.fault(fault, replay, view),
        };
        output.merge(next);
        output
    }

    /// Handle a fault per the failure mode.
    fn fault(&mut self, fault: PolicyFault, pending: Vec<Event>, view: &dyn ClusterView) -> ArmOutput {
        *self.stats.faults.entry(fault.kind()).or_default() += 1;
        if let PolicyFault::InitRefused(reason) = &fault {
            self.stats.init_refusal.get_or_insert_with(|| reason.clone());
        }
        let culprit = self.instance_label();
        tracing::error!(arm = %self.name, policy = %culprit, %fault, mode = ?self.mode, "policy fault");
        self.instance = None;
        let now = view.now();

        let output = match (self.state, self.mode) {
            (ArmState::Fallback, _) | (_, FailureMode::FailClosed) => {
                // The fallback itself failed, or the operator asked for fail-closed.
                self.state = ArmState::Closed;
                let reason = format!("policy arm {} is closed: {culprit} {fault}", self.name);
                self.closed_reason = Some(reason.clone());
                let refused = self.ledger.drain().into_iter().map(|r| r.id).collect();
                ArmOutput { refused, refusal: Some(reason), ..ArmOutput::default() }
            }
            (ArmState::Primary, FailureMode::Reload) if self.reload_attempts == 0 => {
                self.reload_attempts = 1;
                match self.fresh_primary() {
                    Ok(instance) => {
                        self.stats.reloads += 1;
                        tracing::warn!(arm = %self.name, "reloading a fresh instance of the policy");
                        self.hand_over(instance, ArmState::Primary, pending, view)
                    }
                    Err(again) => self.fault(again, pending, view),
                }
            }
            (ArmState::Primary, FailureMode::Reload) => {
                let wait = backoff(self.reload_attempts);
                self.reload_attempts += 1;
                self.retry_at = Some(now + wait.as_nanos() as u64);
                tracing::warn!(arm = %self.name, ?wait, "policy faulted again: serving with the fallback while backing off");
                self.stats.fallbacks += 1;
                let fallback = self.fallback();
                self.hand_over(fallback, ArmState::Fallback, pending, view)
            }
            (ArmState::Primary, FailureMode::FailOpen) => {
                tracing::warn!(arm = %self.name, held = self.ledger.len(), "switching to the built-in fallback policy (fifo)");
                self.stats.fallbacks += 1;
                let fallback = self.fallback();
                self.hand_over(fallback, ArmState::Fallback, pending, view)
            }
            (ArmState::Closed, _) => ArmOutput::default(),
        };
        ArmOutput { fault: Some(fault), ..output }
    }

    fn accept(&mut self, mut actions: Vec<Action>, view: &dyn ClusterView) -> ArmOutput {
        if !self.stale.is_empty() {
            self.forgive_stale(&mut actions, view);
        }
        let verdict = validate(actions, &self.ledger, view);
        for action in &verdict.accepted {
            self.ledger.apply(action);
            *self.stats.accepted.entry(action.kind()).or_default() += 1;
        }
        for (action, reason) in &verdict.rejected {
            *self.stats.rejected.entry(reason.kind()).or_default() += 1;
            tracing::debug!(arm = %self.name, action = action.kind(), %reason, "rejected a policy action");
        }
        let idle_again = std::mem::take(&mut self.idle_again);
        ArmOutput { actions: verdict.accepted, rejected: verdict.rejected, idle_again, ..ArmOutput::default() }
    }

    /// Take out of `actions` the uses of requests that left the arm before a prepared
    /// hand-over and that the policy could not know of (see the module docs): a
    /// dispatch keeps its other requests (and goes when none is left), a drop or a
    /// defer goes. Only a use that would be refused is taken out — one of a request
    /// the arm does not hold (at that worker's stage), or a second use in one answer —
    /// and each stale request is forgiven as many times as it left.
    fn forgive_stale(&mut self, actions: &mut Vec<Action>, view: &dyn ClusterView) {
        let ledger = &self.ledger;
        let stale = &mut self.stale;
        let idle_again = &mut self.idle_again;
        let mut seen: HashSet<u64> = HashSet::default();
        let mut forgiven = 0u64;
        let mut forgive = |id: u64, valid: bool, stale: &mut HashMap<u64, u32>| -> bool {
            if valid {
                return false;
            }
            match stale.get_mut(&id) {
                Some(count) => {
                    *count -= 1;
                    if *count == 0 {
                        stale.remove(&id);
                    }
                    forgiven += 1;
                    true
                }
                None => false,
            }
        };
        actions.retain_mut(|action| match action {
            Action::Dispatch(d) => {
                if d.requests.is_empty() {
                    return true;
                }
                let stage = view.worker(d.worker).map(|w| w.stage);
                let worker = d.worker;
                d.requests.retain(|&id| {
                    let first = seen.insert(id);
                    let held_here = match ledger.get(id) {
                        Some(request) => Some(request.stage) == stage,
                        None => view.sequence(id).is_some_and(|s| s.worker == worker),
                    };
                    !forgive(id, first && held_here, stale)
                });
                if d.requests.is_empty() {
                    idle_again.push(worker);
                    return false;
                }
                true
            }
            Action::Drop(d) => {
                let first = seen.insert(d.request);
                let held = ledger.get(d.request).is_some() || view.sequence(d.request).is_some();
                !forgive(d.request, first && held, stale)
            }
            Action::Defer(d) => {
                let first = seen.insert(d.request);
                !forgive(d.request, first && ledger.get(d.request).is_some(), stale)
            }
            _ => true,
        });
        self.stats.forgiven += forgiven;
    }

    /// Count what the answering instance's latest call cost, what it emitted and the
    /// memory it holds now.
    fn account_cost(&mut self) {
        let Some(instance) = self.instance.as_mut() else { return };
        let cost = instance.last_cost();
        self.stats.call_time += cost.wall;
        self.stats.max_call_time = self.stats.max_call_time.max(cost.wall);
        self.stats.fuel += cost.fuel.unwrap_or(0);
        let memory = instance.memory_bytes().unwrap_or(0) as u64;
        self.stats.memory_bytes = memory;
        self.stats.peak_memory_bytes = self.stats.peak_memory_bytes.max(memory);
        let emitted = instance.take_emitted();
        if !emitted.is_empty() {
            self.stats.record_emitted(emitted);
        }
    }
}

/// Back-off before the `attempt`-th fresh instance: 1 s doubling, at most 60 s.
fn backoff(attempt: u32) -> Duration {
    let (first, max) = RELOAD_BACKOFF;
    first.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(max)
}

/// `base` with `over` laid on it: a key `over` gives replaces `base`'s, new keys are
/// added after.
pub(crate) fn merged_params(base: &[Param], over: &[Param]) -> Vec<Param> {
    let mut params: Vec<Param> = base.iter().filter(|p| !over.iter().any(|o| o.key == p.key)).cloned().collect();
    params.extend(over.iter().cloned());
    params
}

#[cfg(test)]
mod emitted_tests {
    use super::*;

    #[test]
    fn the_infeasible_plan_metric_is_recognised_with_or_without_a_prefix() {
        assert!(is_plan_infeasible_metric("plan_infeasible"));
        assert!(is_plan_infeasible_metric("loki.plan_infeasible"));
        assert!(!is_plan_infeasible_metric("loki_plan_infeasible"));
        assert!(!is_plan_infeasible_metric("loki.plan_infeasible_count"));
        assert!(!is_plan_infeasible_metric("loki.demand"));
    }

    #[test]
    fn emitted_metrics_are_counted_and_their_names_capped() {
        let mut stats = ArmStats::default();
        let flag = |v: f64| ("loki.plan_infeasible".to_owned(), v);
        stats.record_emitted(vec![flag(0.0), flag(1.0), ("loki.demand".into(), 40.0), flag(1.0), ("loki.demand".into(), 10.0)]);
        assert_eq!(stats.infeasible_plans(), 2);
        assert!(stats.fell_back());
        let demand = stats.metrics["loki.demand"];
        assert_eq!((demand.count, demand.sum, demand.last, demand.min, demand.max), (2, 50.0, 10.0, 10.0, 40.0));
        assert_eq!(stats.metrics["loki.plan_infeasible"].count, 3);
        assert!(!ArmStats::default().fell_back());
        // A policy cannot grow the host's memory with names.
        stats.record_emitted((0..2 * MAX_METRIC_NAMES).map(|i| (format!("m{i}"), 1.0)).collect());
        assert_eq!(stats.metrics.len(), MAX_METRIC_NAMES);
        assert_eq!(stats.metrics_dropped as usize, 2 * MAX_METRIC_NAMES - (MAX_METRIC_NAMES - 2));
        stats.record_emitted(vec![flag(1.0)]);
        assert_eq!(stats.infeasible_plans(), 3, "known names are still counted");
    }
}
