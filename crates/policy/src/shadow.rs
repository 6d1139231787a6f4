//! A shadow policy: a candidate that receives the live events next to the arm that
//! schedules, whose answers are validated against the live cluster and counted, and
//! never executed.
//!
//! The shadow keeps a [`Ledger`] of its own: arrivals enter it, and its accepted
//! actions take requests out of it as if they had been applied. Its decisions are not
//! carried out, so its picture drifts from the live one (it may try to dispatch a
//! request the live policy already dispatched — a rejection the report counts). The
//! report says whether the candidate's answers are well-formed and within budget on
//! real traffic; how well it would schedule is for the simulator, replaying a trace
//! captured from the same traffic.
//!
//! A fault (trap, overrun, memory) stops the shadow; the report keeps the fault.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::arm::Candidate;
use super::contract::{Action, Config, Event, Request, Snapshot};
use super::instance::{PolicyFault, PolicyInstance};
use super::sandbox::CallKind;
use super::validate::{validate, ClusterView, Ledger};

/// What a shadow did so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShadowReport {
    /// The candidate's name.
    pub policy: String,
    /// SHA-256 of its component (none for a native policy).
    pub sha256: Option<String>,
    /// `running`, or `faulted` once a fault stopped it.
    pub state: &'static str,
    /// Calls made (`init` and the replay included).
    pub calls: u64,
    /// Events delivered.
    pub events: u64,
    /// Actions that would have been applied, by kind.
    pub accepted: BTreeMap<String, u64>,
    /// Actions validation refused, by reason.
    pub rejected: BTreeMap<String, u64>,
    /// Faults by kind (at most one: a fault stops the shadow).
    pub faults: BTreeMap<String, u64>,
    /// The fault that stopped it.
    pub fault: Option<String>,
    /// Microseconds spent in its calls.
    pub call_time_us: f64,
    /// Microseconds of its longest call.
    pub max_call_us: f64,
    /// Requests it holds now.
    pub held: usize,
}

/// A running shadow.
pub struct Shadow {
    instance: Option<Box<dyn PolicyInstance>>,
    ledger: Ledger,
    report: ShadowReport,
    call_time: Duration,
    max_call: Duration,
}

impl Shadow {
    /// Start `candidate` as a shadow: `init` with `config`, then the replay of the
    /// requests the live arm holds (`held`, in arrival order), the idle workers and the
    /// latest snapshot, so it starts from what the live policy knows.
    pub fn start(candidate: Candidate, config: &Config, held: Vec<Request>, snapshot: Option<Snapshot>, view: &dyn ClusterView) -> Self {
        let config = &candidate.configure(config);
        let (instance, module) = candidate.into_parts();
        let report = ShadowReport {
            policy: module.as_ref().map_or_else(|| instance.label(), |m| m.name().to_string()),
            sha256: module.map(|m| m.sha256_hex()),
            state: "running",
            ..ShadowReport::default()
        };
        let mut shadow =
            Self { instance: Some(instance), ledger: Ledger::default(), report, call_time: Duration::ZERO, max_call: Duration::ZERO };
        let now = view.now();
        let mut config = config.clone();
        config.now = now;
        config.workers = view.serving_workers();
        let init = shadow.instance.as_mut().expect("just started").init(&config, now);
        shadow.account(1, 0);
        let Some(actions) = shadow.settle(init) else { return shadow };
        shadow.check(actions, view);
        let mut replay: Vec<Event> = held.into_iter().map(Event::Arrival).collect();
        replay.extend(view.idle_workers().into_iter().map(Event::WorkerIdle));
        replay.extend(snapshot.map(Event::Tick));
        if !replay.is_empty() {
            shadow.deliver(&replay, CallKind::Init, view);
        }
        shadow
    }

    /// Deliver the events the live arm just received (call it before the live
    /// answer is applied, so both answer against the same cluster).
    pub fn observe(&mut self, events: &[Event], view: &dyn ClusterView) {
        if self.instance.is_none() {
            return;
        }
        let kind = if events.iter().any(|e| matches!(e, Event::Tick(_))) { CallKind::Tick } else { CallKind::Events };
        self.deliver(events, kind, view);
    }

    /// What it did so far.
    pub fn report(&self) -> ShadowReport {
        ShadowReport {
            call_time_us: self.call_time.as_secs_f64() * 1e6,
            max_call_us: self.max_call.as_secs_f64() * 1e6,
            held: self.ledger.len(),
            ..self.report.clone()
        }
    }

    fn deliver(&mut self, events: &[Event], kind: CallKind, view: &dyn ClusterView) {
        for event in events {
            match event {
                Event::Arrival(request) => self.ledger.insert(request.clone()),
                Event::RequestEnded((id, _)) => {
                    self.ledger.remove(*id);
                }
                _ => {}
            }
        }
        let instance = self.instance.as_mut().expect("a running shadow");
        let result = instance.handle(events, view.now(), kind);
        self.account(1, events.len() as u64);
        if let Some(actions) = self.settle(result) {
            self.check(actions, view);
        }
    }

    /// The actions of a call, or `None` after recording its fault and stopping.
    fn settle(&mut self, result: Result<Vec<Action>, PolicyFault>) -> Option<Vec<Action>> {
        match result {
            Ok(actions) => Some(actions),
            Err(fault) => {
                tracing::warn!(shadow = %self.report.policy, %fault, "the shadow policy faulted and stopped");
                *self.report.faults.entry(fault.kind().to_string()).or_default() += 1;
                self.report.fault = Some(fault.to_string());
                self.report.state = "faulted";
                self.instance = None;
                None
            }
        }
    }

    fn check(&mut self, actions: Vec<Action>, view: &dyn ClusterView) {
        let verdict = validate(actions, &self.ledger, view);
        for action in &verdict.accepted {
            self.ledger.apply(action);
            *self.report.accepted.entry(action.kind().to_string()).or_default() += 1;
        }
        for (_, reason) in &verdict.rejected {
            *self.report.rejected.entry(reason.kind().to_string()).or_default() += 1;
        }
    }

    fn account(&mut self, calls: u64, events: u64) {
        self.report.calls += calls;
        self.report.events += events;
        if let Some(cost) = self.instance.as_ref().map(|i| i.last_cost()) {
            self.call_time += cost.wall;
            self.max_call = self.max_call.max(cost.wall);
        }
    }
}
