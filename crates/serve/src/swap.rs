//! Hot swap of the policy on a running engine, as the admin API, the CLI and the
//! watched directory trigger it.
//!
//! The expensive work happens on the caller's thread, never the engine's: reading the
//! file, checking and compiling the component ([`PolicyLoader`], which keeps compiled
//! code by SHA-256 so swapping back to a policy seen before skips compilation),
//! instantiating it ([`Candidate::wasm`]), and initialising it and replaying into it
//! the requests the arm holds, from a snapshot the engine hands out in one short
//! visit ([`yardmaster_engine::Engine::handover_snapshot`], [`Candidate::pre_replay`]).
//! Only then does the engine actor get a
//! [`Message::Swap`](super::actor::Message::Swap): between two event batches the arm
//! tells the prepared instance what changed since the snapshot and makes it answer
//! ([`yardmaster_policy::Arm::swap`]); that hand-over is the pause the engine sees, and it
//! is measured there. The retired instance comes back and is dropped here.
//!
//! A candidate that faults in its preparation — traps, runs past its deadline, or
//! refuses in `init`, or faults while the held requests are replayed into it — is
//! refused: the call answers with the reason and the running policy is untouched, so
//! a swap cannot make things worse than they are. The candidate of an A/B run and a
//! shadow are tried the same way first (prepared from the control arm's snapshot, off
//! the engine's thread) and refused likewise. A fault after that, at the hand-over or
//! later, is the arm's failure mode's to handle, as for any policy.
//!
//! Compiling comes first and outside the serialisation: an uncached component can take
//! seconds (13.6 s was reported for a Python policy of 18 MB), and meanwhile
//! the other admin calls answer — reads, and an A/B run's promotion or roll-back. A long
//! call reports its [`Phase`] as it goes (`compiling`, `preparing`, `warming`), which
//! the admin API's operations show ([`super::admin`]). Swapping in a policy starts no
//! worker: the arm keeps its workers, so a swap has nothing to warm up.
//!
//! Swaps are serialised: one at a time per server. A shadow policy
//! ([`yardmaster_policy::Shadow`]) is prepared the same way and started with
//! [`Swapper::start_shadow`], and so is the candidate of an A/B run
//! ([`Swapper::start_ab`], see [`super::ab`]). During a run each arm can be swapped on
//! its own ([`Swapper::swap_arm`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ab::{AbReport, AbStatus, Split};
use super::actor::{AbCommand, ActorHandle, ActorStopped};
use yardmaster_engine::{Clock, Executor};
use yardmaster_policy::contract::Param;
use yardmaster_policy::{
    ArmState, Candidate, FailureMode, Handover, HandoverSnapshot, Limits, LoadError, PolicyLoader, PolicyModule, ProfileSource, Sandbox,
    ShadowReport,
};

/// Where a long admin call stands, as it reports to its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Reading, checking and compiling the component (or taking its compiled code from
    /// the cache).
    Compiling,
    /// Instantiating the policy, initialising it and replaying the held requests into
    /// it; handing over.
    Preparing,
    /// An A/B run's candidate is starting and warming up its workers; no request goes
    /// to it yet.
    Warming,
}

impl Phase {
    /// Its name in the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Compiling => "compiling",
            Phase::Preparing => "preparing",
            Phase::Warming => "warming",
        }
    }
}

/// What a call reports its phases to.
pub type Progress<'a> = &'a (dyn Fn(Phase) + Sync);

/// A [`Progress`] that reports nowhere.
pub fn no_progress(_: Phase) {}

/// Compiles of policies held by tests ([`hold_compiles`]).
static HELD: Mutex<Vec<(String, Gate)>> = Mutex::new(Vec::new());

/// Whether a compile is held, and what wakes it.
type Gate = Arc<(Mutex<bool>, Condvar)>;

/// Holds the compiles of one policy name until dropped ([`hold_compiles`]).
#[doc(hidden)]
pub struct CompileHold {
    name: String,
    gate: Gate,
}

/// A test hook: every compile of a policy named `name` (through a [`Swapper`]) waits,
/// in the `compiling` phase, until the returned hold is dropped. Other names are not
/// affected, so tests running beside each other do not see it.
#[doc(hidden)]
pub fn hold_compiles(name: &str) -> CompileHold {
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push((name.to_string(), gate.clone()));
    CompileHold { name: name.to_string(), gate }
}

impl Drop for CompileHold {
    fn drop(&mut self) {
        HELD.lock().unwrap_or_else(|p| p.into_inner()).retain(|(name, _)| name != &self.name);
        let (held, released) = &*self.gate;
        *held.lock().unwrap_or_else(|p| p.into_inner()) = false;
        released.notify_all();
    }
}

/// Wait while a test holds the compiles of `name`.
fn wait_if_held(name: &str) {
    let gate = HELD.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(held, _)| held == name).map(|(_, gate)| gate.clone());
    if let Some(gate) = gate {
        let (held, released) = &*gate;
        let mut still = held.lock().unwrap_or_else(|p| p.into_inner());
        while *still {
            still = released.wait(still).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Where the new policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// A component's bytes, and the name to give it.
    Bytes {
        /// The policy's name (for logs and the admin API).
        name: String,
        /// The `.wasm` bytes.
        bytes: Vec<u8>,
    },
    /// A `.wasm` file on the server's file system (named after its file stem).
    File(PathBuf),
    /// A policy shipped with Yardmaster, by name.
    Shipped(String),
}

impl PolicySource {
    /// The policy's name and, where it is known without compiling, its size in bytes.
    pub fn describe(&self) -> (String, Option<u64>) {
        match self {
            PolicySource::Bytes { name, bytes } => (name.clone(), Some(bytes.len() as u64)),
            PolicySource::File(path) => (
                path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                std::fs::metadata(path).ok().map(|m| m.len()),
            ),
            PolicySource::Shipped(name) => (name.clone(), yardmaster_policy_artifacts::shipped(name).map(|a| a.bytes.len() as u64)),
        }
    }
}

/// The operator's settings for a policy swapped in, or started as an A/B candidate or
/// a shadow: its own parameters over the server's, its decision deadline and memory
/// limit, and the failure mode of its arm. What is not given is the server's (its
/// configuration's `params` and `[policy]` settings), whatever the policy before had.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySettings {
    /// Parameters, over the server's (a key given here replaces the server's).
    pub params: Vec<Param>,
    /// Serve-mode deadline of one decision (an event batch), in milliseconds.
    pub deadline_ms: Option<f64>,
    /// Largest linear memory, in MiB.
    pub memory_mib: Option<u64>,
    /// What the arm does when the policy faults.
    pub failure: Option<FailureMode>,
}

/// The longest decision deadline a policy may be given.
pub const MAX_DEADLINE_MS: f64 = 10_000.0;

/// The largest memory limit a policy may be given (4 GiB: a 32-bit linear memory).
pub const MAX_MEMORY_MIB: u64 = 4096;

impl PolicySettings {
    /// `base` with these settings' deadline and memory limit; a deadline longer than
    /// the tick deadline raises that too. Out-of-range values are refused with the reason.
    pub fn limits(&self, base: &Limits) -> Result<Limits, String> {
        let mut limits = base.clone();
        if let Some(ms) = self.deadline_ms {
            if !(ms.is_finite() && ms > 0.0 && ms <= MAX_DEADLINE_MS) {
                return Err(format!("deadline_ms {ms}: give a number of milliseconds above 0 and at most {MAX_DEADLINE_MS}"));
            }
            limits.event_deadline = Duration::from_secs_f64(ms / 1e3);
            limits.tick_deadline = limits.tick_deadline.max(limits.event_deadline);
        }
        if let Some(mib) = self.memory_mib {
            if !(1..=MAX_MEMORY_MIB).contains(&mib) {
                return Err(format!("memory_mib {mib}: give 1 to {MAX_MEMORY_MIB} MiB"));
            }
            limits.memory_bytes = (mib as usize) << 20;
        }
        Ok(limits)
    }

    /// The settings a call gives as fields (JSON or query parameters, read by
    /// `field`; `param` may repeat, each `key=value`). Malformed values are refused.
    pub fn from_fields(field: &dyn Fn(&str) -> Vec<String>) -> Result<Self, String> {
        let one = |key: &str| field(key).into_iter().next();
        let params = field("param")
            .into_iter()
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) if !key.trim().is_empty() => Ok(Param { key: key.trim().into(), value: value.into() }),
                _ => Err(format!("param {pair:?}: write key=value")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let deadline_ms = match one("deadline_ms") {
            Some(text) => Some(text.parse::<f64>().map_err(|_| format!("deadline_ms {text:?} is not a number of milliseconds"))?),
            None => None,
        };
        let memory_mib = match one("memory_mib") {
            Some(text) => Some(text.parse::<u64>().map_err(|_| format!("memory_mib {text:?} is not a whole number of MiB"))?),
            None => None,
        };
        let failure = one("failure").map(|text| text.parse::<FailureMode>()).transpose()?;
        let settings = PolicySettings { params, deadline_ms, memory_mib, failure };
        settings.limits(&Limits::default())?;
        Ok(settings)
    }
}

/// Why a swap did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The policy was refused before it reached the engine (unreadable, not a valid
    /// component, outside the policy world, unknown name, or its instantiation
    /// trapped); the running policy is untouched.
    #[error("{0}")]
    Refused(String),
    /// The command does not fit the server's state (no such arm, an A/B run already
    /// in progress or none to end); nothing changed.
    #[error("{0}")]
    Conflict(String),
    /// The engine has stopped.
    #[error(transparent)]
    Stopped(#[from] ActorStopped),
}

/// How an A/B run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbEnd {
    /// The candidate arm becomes the whole.
    Promote,
    /// The control arm becomes the whole again.
    RollBack,
}

/// An A/B run's state and report, as `GET /admin/ab` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AbView {
    /// Where the run stands.
    pub status: AbStatus,
    /// The current run's report, or the last run's (none before any run).
    pub report: Option<AbReport>,
}

impl From<LoadError> for SwapError {
    fn from(error: LoadError) -> Self {
        SwapError::Refused(error.to_string())
    }
}

/// What a swap did, as the admin API answers it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwapSummary {
    /// The new policy's name.
    pub policy: String,
    /// SHA-256 of its component.
    pub sha256: String,
    /// Label of the instance that answered before.
    pub from: String,
    /// Label of the instance swapped in.
    pub to: String,
    /// The arm's state after the swap (`primary`, or `fallback`/`closed` when the new
    /// policy faulted at once).
    pub state: &'static str,
    /// The fault the new policy hit during the hand-over.
    pub fault: Option<String>,
    /// Requests held at the swap and replayed into the new policy.
    pub replayed: usize,
    /// `delta` (the new policy was replayed a snapshot beforehand and told at the
    /// swap what changed since) or `full` (everything replayed at the swap).
    pub handover: &'static str,
    /// Events delivered at the swap of a `delta` hand-over (arrivals since the
    /// snapshot, worker changes, idle workers, the latest tick).
    pub delta_events: usize,
    /// Microseconds the engine was held by the hand-over.
    pub pause_us: f64,
    /// Microseconds spent preparing off the engine's thread (read, compile or cache
    /// hit, instantiate, snapshot, pre-replay).
    pub prepare_us: f64,
    /// Microseconds the engine was held to copy the held requests for the snapshot.
    pub snapshot_us: f64,
    /// Microseconds of the new policy's `init` and the replay of the snapshot, on the
    /// caller's thread.
    pub pre_replay_us: f64,
}

/// A candidate ready for the engine, and what preparing it cost.
struct Prepared {
    candidate: Candidate,
    /// The engine's time taking the snapshot.
    snapshot: Duration,
    /// `init` and the replay of the snapshot.
    pre_replay: Duration,
}

/// The running policy, as `GET /admin/policies` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyReport {
    /// The arm's name (the `arm` label of every metric; it stays across swaps).
    pub arm: String,
    /// The name of the policy the arm runs.
    pub policy: String,
    /// SHA-256 of its component (none for a native policy).
    pub sha256: Option<String>,
    /// The instance answering now (the fallback's label while it answers).
    pub answering: String,
    /// `primary`, `fallback` or `closed`.
    pub state: &'static str,
    /// Swaps so far.
    pub swaps: u64,
    /// Microseconds of the latest swap's pause.
    pub last_swap_pause_us: f64,
    /// Microseconds of the longest swap pause.
    pub max_swap_pause_us: f64,
    /// Switches to the fallback so far.
    pub fallbacks: u64,
    /// Faults so far, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Requests the policy holds now.
    pub held: usize,
    /// Its serve-mode decision deadline (ms), for a component.
    pub deadline_ms: Option<f64>,
    /// The linear memory it may grow to (MiB), for a component.
    pub memory_mib: Option<u64>,
    /// What the arm does when it faults: `fail-open`, `fail-closed`, `reload`.
    pub failure: String,
    /// The parameters it was initialised with (the server's, and its own over them).
    pub params: BTreeMap<String, String>,
}

/// The name of an arm state in the admin API and logs.
pub fn state_name(state: ArmState) -> &'static str {
    match state {
        ArmState::Primary => "primary",
        ArmState::Fallback => "fallback",
        ArmState::Closed => "closed",
    }
}

/// Swaps the policy of one engine.
pub struct Swapper<C: Clock, X: Executor> {
    handle: ActorHandle<C, X>,
    loader: PolicyLoader,
    /// The failure mode of a policy given none (the server's).
    failure: FailureMode,
    one_at_a_time: Mutex<()>,
}

impl<C: Clock, X: Executor> Swapper<C, X> {
    /// A swapper for the engine behind `handle`, compiling for `sandbox` (the one the
    /// running policy uses) with the default on-disk cache of compiled policies.
    /// A policy given no settings runs under `sandbox`'s limits and `failure`.
    pub fn new(handle: ActorHandle<C, X>, sandbox: Sandbox, failure: FailureMode) -> Self {
        Self::with_loader(handle, PolicyLoader::new(sandbox, PolicyLoader::default_cache_dir()), failure)
    }

    /// A swapper compiling with `loader`.
    pub fn with_loader(handle: ActorHandle<C, X>, loader: PolicyLoader, failure: FailureMode) -> Self {
        Self { handle, loader, failure, one_at_a_time: Mutex::new(()) }
    }

    /// Read, check and compile a policy without swapping it in.
    pub fn load(&self, source: &PolicySource) -> Result<Arc<PolicyModule>, SwapError> {
        wait_if_held(&source.describe().0);
        match source {
            PolicySource::Bytes { name, bytes } => Ok(self.loader.load(name, bytes)?),
            PolicySource::File(path) => Ok(self.loader.load_file(path)?),
            PolicySource::Shipped(name) => {
                let artifact = yardmaster_policy_artifacts::shipped(name).ok_or_else(|| {
                    let known: Vec<&str> = yardmaster_policy_artifacts::SHIPPED.iter().map(|a| a.name).collect();
                    SwapError::Refused(format!("no shipped policy named {name:?} (shipped: {})", known.join(", ")))
                })?;
                Ok(self.loader.load(name, artifact.bytes)?)
            }
        }
    }

    /// Swap the policy in from `source` (blocking: call it off any async runtime's
    /// worker threads). A policy that is refused — unreadable, invalid, or faulting
    /// while it is prepared — leaves the running one untouched; one that faults at the
    /// hand-over itself is swapped in and the arm's failure mode applies (the summary
    /// says so).
    pub fn swap(&self, source: &PolicySource) -> Result<SwapSummary, SwapError> {
        self.swap_arm(source, None, &PolicySettings::default())
    }

    /// Swap the policy of the arm labelled `arm` (`None`: the control arm, the only
    /// one outside an A/B run); otherwise as [`Swapper::swap`].
    /// The policy comes with the operator's `settings` (its own parameters, deadline,
    /// memory limit, failure mode), which it keeps in that arm.
    pub fn swap_arm(&self, source: &PolicySource, arm: Option<&str>, settings: &PolicySettings) -> Result<SwapSummary, SwapError> {
        self.swap_arm_with(source, arm, settings, &no_progress)
    }

    /// [`Swapper::swap_arm`], reporting its phases to `progress`. The component is
    /// compiled before the swap waits its turn, so a long compile holds up no other call.
    pub fn swap_arm_with(
        &self,
        source: &PolicySource,
        arm: Option<&str>,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<SwapSummary, SwapError> {
        let started = Instant::now();
        progress(Phase::Compiling);
        let module = self.load(source)?;
        progress(Phase::Preparing);
        let _serial = self.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let prepared = self.prepare_swap(&module, arm, settings)?;
        let prepare = started.elapsed();
        let outcome = self.handle.swap_arm(arm.map(str::to_string), prepared.candidate)?.map_err(SwapError::Conflict)?;
        let report = outcome.report;
        // The retired instance is dropped here, off the engine's thread.
        drop(outcome.retired);
        let (handover, delta_events) = match report.handover {
            Handover::Full => ("full", 0),
            Handover::Delta { events, .. } => ("delta", events),
        };
        let summary = SwapSummary {
            policy: module.name().to_string(),
            sha256: module.sha256_hex(),
            from: report.from,
            to: report.to,
            state: state_name(report.state),
            fault: report.fault.map(|f| f.to_string()),
            replayed: report.replayed,
            handover,
            delta_events,
            pause_us: outcome.pause.as_secs_f64() * 1e6,
            prepare_us: prepare.as_secs_f64() * 1e6,
            snapshot_us: prepared.snapshot.as_secs_f64() * 1e6,
            pre_replay_us: prepared.pre_replay.as_secs_f64() * 1e6,
        };
        match &summary.fault {
            None => {
                tracing::info!(policy = %summary.policy, sha256 = %summary.sha256, pause_us = summary.pause_us, replayed = summary.replayed, "policy swapped in")
            }
            Some(fault) => {
                tracing::warn!(policy = %summary.policy, %fault, state = summary.state, "the swapped-in policy faulted during the hand-over")
            }
        }
        Ok(summary)
    }

    /// Instantiate a loaded policy for the engine's arm, off the engine's thread.
    fn prepare(&self, module: &Arc<PolicyModule>, settings: &PolicySettings) -> Result<Candidate, SwapError> {
        let (seed, profiles) = self.handle.inspect(|engine| engine.arm().candidate_inputs())?;
        self.instantiate(module, seed, profiles, settings)
    }

    /// An instance of `module` in a sandbox with `settings`' limits, carrying its
    /// parameters and failure mode.
    fn instantiate(
        &self,
        module: &Arc<PolicyModule>,
        seed: u64,
        profiles: Option<Arc<dyn ProfileSource>>,
        settings: &PolicySettings,
    ) -> Result<Candidate, SwapError> {
        let base = self.loader.sandbox();
        let sandbox = base.with_limits(settings.limits(base.limits()).map_err(SwapError::Refused)?);
        Candidate::wasm(&sandbox, module.clone(), seed, profiles)
            .map(|candidate| candidate.with_settings(settings.params.clone(), Some(settings.failure.unwrap_or(self.failure))))
            .map_err(|fault| SwapError::Refused(format!("{} cannot be instantiated: it {fault}", module.name())))
    }

    /// Prepare `module` to take over the arm labelled `arm` (`None`: the control
    /// arm), off the engine's thread: one visit to the engine copies what the arm
    /// holds ([`yardmaster_engine::Engine::handover_snapshot`]), then the candidate is
    /// instantiated, initialised and replayed the copy here. A candidate that faults
    /// there is refused (see the module docs).
    fn prepare_swap(&self, module: &Arc<PolicyModule>, arm: Option<&str>, settings: &PolicySettings) -> Result<Prepared, SwapError> {
        let label = arm.map(str::to_string);
        type Taken = ((u64, Option<Arc<dyn ProfileSource>>), HandoverSnapshot, Duration);
        let taken = self.handle.inspect_arms(move |arms| -> Result<Taken, String> {
            let started = Instant::now();
            let slot = match &label {
                None => arms.slots().first(),
                Some(label) => arms.slots().iter().find(|slot| &slot.label == label),
            };
            let Some(slot) = slot else {
                return Err(format!("no arm named {:?} (arms: {})", label.unwrap_or_default(), arms.labels().join(", ")));
            };
            let inputs = slot.engine.arm().candidate_inputs();
            let snapshot = slot.engine.handover_snapshot();
            Ok((inputs, snapshot, started.elapsed()))
        })?;
        let ((seed, profiles), snapshot, hold) = taken.map_err(SwapError::Conflict)?;
        let mut candidate = self.instantiate(module, seed, profiles, settings)?;
        let held = snapshot.held();
        match candidate.pre_replay(snapshot) {
            Ok(took) => Ok(Prepared { candidate, snapshot: hold, pre_replay: took }),
            Err(fault) => {
                tracing::warn!(policy = %module.name(), %fault, held, "refused: the new policy faulted while being prepared");
                Err(SwapError::Refused(format!(
                    "{} faulted while being prepared ({} held requests replayed into it): it {fault}; the running policy is untouched",
                    module.name(),
                    held
                )))
            }
        }
    }

    /// Try `module` as [`Swapper::prepare_swap`] prepares a swap, on the control
    /// arm's snapshot, and throw the trial instance away: an A/B candidate or a shadow
    /// that would fault at once is refused before it reaches the engine.
    fn try_out(&self, module: &Arc<PolicyModule>, settings: &PolicySettings) -> Result<(), SwapError> {
        self.prepare_swap(module, None, settings).map(drop)
    }

    /// Start the policy from `source` as a shadow of the live one (replacing a shadow
    /// already running); its first report (after `init` and the replay of what the
    /// live policy holds).
    pub fn start_shadow(&self, source: &PolicySource, settings: &PolicySettings) -> Result<ShadowReport, SwapError> {
        self.start_shadow_with(source, settings, &no_progress)
    }

    /// [`Swapper::start_shadow`], reporting its phases to `progress`.
    pub fn start_shadow_with(
        &self,
        source: &PolicySource,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<ShadowReport, SwapError> {
        progress(Phase::Compiling);
        let module = self.load(source)?;
        progress(Phase::Preparing);
        let _serial = self.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let candidate = self.prepare(&module, settings)?;
        self.try_out(&module, settings)?;
        if let Some(old) = self.handle.shadow(Some(candidate))? {
            tracing::info!(shadow = %old.policy, "a shadow was replaced");
        }
        let report = self.handle.inspect(|engine| engine.shadow_report())?;
        tracing::info!(shadow = %module.name(), sha256 = %module.sha256_hex(), "shadow policy started");
        Ok(report.expect("a shadow was just started"))
    }

    /// Start an A/B run with the policy from `source` as the candidate arm `label`
    /// (default: the policy's name, with `-b` when the control runs a policy of that
    /// name), given `split`'s share of requests and workers. Returns once the
    /// candidate's workers are warm and the split routes to it (see [`super::ab::arms`]).
    pub fn start_ab(
        &self,
        source: &PolicySource,
        label: Option<&str>,
        split: Split,
        settings: &PolicySettings,
    ) -> Result<AbStatus, SwapError> {
        self.start_ab_with(source, label, split, settings, true, &no_progress)
    }

    /// [`Swapper::start_ab`], reporting its phases to `progress`. With `warm` false
    /// the split routes to the candidate at once, before its workers are ready (as
    /// before warm-ups existed: its first requests wait for the workers to start).
    pub fn start_ab_with(
        &self,
        source: &PolicySource,
        label: Option<&str>,
        split: Split,
        settings: &PolicySettings,
        warm: bool,
        progress: Progress<'_>,
    ) -> Result<AbStatus, SwapError> {
        progress(Phase::Compiling);
        let module = self.load(source)?;
        progress(Phase::Preparing);
        let serial = self.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let candidate = self.prepare(&module, settings)?;
        self.try_out(&module, settings)?;
        let label = match label {
            Some(label) => label.to_string(),
            None => {
                let control = self.handle.inspect_arms(|arms| arms.labels().remove(0))?;
                let name = module.name().to_string();
                if name == control {
                    format!("{name}-b")
                } else {
                    name
                }
            }
        };
        let mut status =
            self.handle.ab(AbCommand::Start { candidate: Box::new(candidate), label, split, warm })?.map_err(SwapError::Conflict)?;
        tracing::info!(candidate = %module.name(), sha256 = %module.sha256_hex(), split = %split.describe(), "A/B run started");
        // The run is in place: other commands (a roll-back) may come while it warms up.
        drop(serial);
        if warm && status.state == "warming" {
            progress(Phase::Warming);
            while status.state == "warming" {
                std::thread::sleep(Duration::from_millis(5));
                status = self.handle.inspect_arms(|arms| arms.status())?;
            }
        }
        Ok(status)
    }

    /// End the A/B run: promote the candidate or roll back to the control. The
    /// losing arm drains what it holds, then hands its workers to the winner.
    pub fn end_ab(&self, end: AbEnd) -> Result<AbStatus, SwapError> {
        let _serial = self.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let labels = self.handle.inspect_arms(|arms| if arms.ab_running() { arms.labels() } else { Vec::new() })?;
        let winner = match (end, labels.as_slice()) {
            (AbEnd::Promote, [_, candidate]) => candidate.clone(),
            (AbEnd::RollBack, [control, _]) => control.clone(),
            _ => return Err(SwapError::Conflict("no A/B run is in progress (or it is already ending)".into())),
        };
        self.handle.ab(AbCommand::End(winner))?.map_err(SwapError::Conflict)
    }

    /// The A/B run's state and report.
    pub fn ab(&self) -> Result<AbView, ActorStopped> {
        self.handle.inspect_arms(|arms| AbView { status: arms.status(), report: arms.report() })
    }

    /// Stop the shadow; its final report (none when no shadow ran).
    pub fn stop_shadow(&self) -> Result<Option<ShadowReport>, ActorStopped> {
        self.handle.shadow(None)
    }

    /// The running shadow's report (none when no shadow runs).
    pub fn shadow_report(&self) -> Result<Option<ShadowReport>, ActorStopped> {
        self.handle.inspect(|engine| engine.shadow_report())
    }

    /// The policy of every arm (one outside an A/B run), control first.
    pub fn policies(&self) -> Result<Vec<PolicyReport>, ActorStopped> {
        self.handle.inspect_arms(|arms| {
            arms.slots()
                .iter()
                .map(|slot| {
                    let arm = slot.engine.arm();
                    let stats = arm.stats();
                    let module = arm.module();
                    PolicyReport {
                        arm: slot.label.clone(),
                        policy: module.map(|m| m.name().to_string()).unwrap_or_else(|| arm.instance_label()),
                        sha256: module.map(|m| m.sha256_hex()),
                        answering: arm.instance_label(),
                        state: state_name(arm.state()),
                        swaps: stats.swaps.count,
                        last_swap_pause_us: stats.swaps.last.as_secs_f64() * 1e6,
                        max_swap_pause_us: stats.swaps.max.as_secs_f64() * 1e6,
                        fallbacks: stats.fallbacks,
                        faults: stats.faults.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                        held: arm.ledger().len(),
                        deadline_ms: arm.limits().map(|l| l.event_deadline.as_secs_f64() * 1e3),
                        memory_mib: arm.limits().map(|l| (l.memory_bytes >> 20) as u64),
                        failure: arm.failure_mode().to_string(),
                        params: arm.config().params.iter().map(|p| (p.key.clone(), p.value.clone())).collect(),
                    }
                })
                .collect()
        })
    }
}

/// What the admin API and the watched directory do to a running server's policies,
/// whatever its engine drives (a batch pipeline's ONNX workers or an LLM pipeline's
/// decoders): the object-safe face of every [`Swapper`], so one admin API serves both.
pub trait PolicyControl: Send + Sync {
    /// [`Swapper::swap`].
    fn swap(&self, source: &PolicySource) -> Result<SwapSummary, SwapError>;
    /// [`Swapper::swap_arm_with`].
    fn swap_arm_with(
        &self,
        source: &PolicySource,
        arm: Option<&str>,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<SwapSummary, SwapError>;
    /// [`Swapper::start_shadow_with`].
    fn start_shadow_with(
        &self,
        source: &PolicySource,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<ShadowReport, SwapError>;
    /// [`Swapper::start_ab_with`].
    fn start_ab_with(
        &self,
        source: &PolicySource,
        label: Option<&str>,
        split: Split,
        settings: &PolicySettings,
        warm: bool,
        progress: Progress<'_>,
    ) -> Result<AbStatus, SwapError>;
    /// [`Swapper::end_ab`].
    fn end_ab(&self, end: AbEnd) -> Result<AbStatus, SwapError>;
    /// [`Swapper::ab`].
    fn ab(&self) -> Result<AbView, ActorStopped>;
    /// [`Swapper::stop_shadow`].
    fn stop_shadow(&self) -> Result<Option<ShadowReport>, ActorStopped>;
    /// [`Swapper::shadow_report`].
    fn shadow_report(&self) -> Result<Option<ShadowReport>, ActorStopped>;
    /// [`Swapper::policies`].
    fn policies(&self) -> Result<Vec<PolicyReport>, ActorStopped>;
}

impl<C: Clock, X: Executor> PolicyControl for Swapper<C, X>
where
    Swapper<C, X>: Send + Sync,
{
    fn swap(&self, source: &PolicySource) -> Result<SwapSummary, SwapError> {
        Swapper::swap(self, source)
    }
    fn swap_arm_with(
        &self,
        source: &PolicySource,
        arm: Option<&str>,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<SwapSummary, SwapError> {
        Swapper::swap_arm_with(self, source, arm, settings, progress)
    }
    fn start_shadow_with(
        &self,
        source: &PolicySource,
        settings: &PolicySettings,
        progress: Progress<'_>,
    ) -> Result<ShadowReport, SwapError> {
        Swapper::start_shadow_with(self, source, settings, progress)
    }
    fn start_ab_with(
        &self,
        source: &PolicySource,
        label: Option<&str>,
        split: Split,
        settings: &PolicySettings,
        warm: bool,
        progress: Progress<'_>,
    ) -> Result<AbStatus, SwapError> {
        Swapper::start_ab_with(self, source, label, split, settings, warm, progress)
    }
    fn end_ab(&self, end: AbEnd) -> Result<AbStatus, SwapError> {
        Swapper::end_ab(self, end)
    }
    fn ab(&self) -> Result<AbView, ActorStopped> {
        Swapper::ab(self)
    }
    fn stop_shadow(&self) -> Result<Option<ShadowReport>, ActorStopped> {
        Swapper::stop_shadow(self)
    }
    fn shadow_report(&self) -> Result<Option<ShadowReport>, ActorStopped> {
        Swapper::shadow_report(self)
    }
    fn policies(&self) -> Result<Vec<PolicyReport>, ActorStopped> {
        Swapper::policies(self)
    }
}
