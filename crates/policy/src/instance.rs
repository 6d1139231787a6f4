//! One running policy: the [`PolicyInstance`] trait the arm drives, its WebAssembly
//! implementation [`WasmPolicy`], the host state behind the world's imports, and the
//! classification of what can go wrong in a call ([`PolicyFault`]).

use std::sync::Arc;
use std::time::{Duration, Instant as WallInstant};

use wasmtime::{ResourceLimiter, Store, Trap};

use super::contract::{Action, Config, Event, Exports, Level};
use super::loader::PolicyModule;
use super::sandbox::{CallKind, Mode, Sandbox};

/// What went wrong in a policy call. After any fault the instance is poisoned and
/// must not be called again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFault {
    /// The call ran past its wall-clock deadline (serve mode).
    #[error("ran past its {0:?} deadline")]
    Timeout(Duration),
    /// The call used up its fuel (simulate mode).
    #[error("used up its fuel budget of {0} units")]
    OutOfFuel(u64),
    /// The policy tried to grow its memory past the cap.
    #[error("exceeded its memory cap of {0} bytes")]
    OutOfMemory(usize),
    /// The policy's stack overflowed (unbounded recursion).
    #[error("overflowed its stack")]
    StackOverflow,
    /// Time spent in host calls crossed the watchdog.
    #[error("crossed the wall-clock watchdog of {0:?}")]
    Watchdog(Duration),
    /// The call returned more actions than allowed.
    #[error("returned {0} actions, more than the limit of {1}")]
    TooManyActions(usize, usize),
    /// `init` returned an error.
    #[error("refused to start: {0}")]
    InitRefused(String),
    /// Any other trap (a panic, an unreachable, a call to an inert import).
    #[error("trapped: {0}")]
    Trap(String),
}

impl PolicyFault {
    /// Every name [`PolicyFault::kind`] gives (metrics export each from the start, at
    /// zero).
    pub const KINDS: &'static [&'static str] =
        &["timeout", "out-of-fuel", "out-of-memory", "stack-overflow", "watchdog", "too-many-actions", "init-refused", "trap"];

    /// A short name of the fault's kind, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyFault::Timeout(_) => "timeout",
            PolicyFault::OutOfFuel(_) => "out-of-fuel",
            PolicyFault::OutOfMemory(_) => "out-of-memory",
            PolicyFault::StackOverflow => "stack-overflow",
            PolicyFault::Watchdog(_) => "watchdog",
            PolicyFault::TooManyActions(..) => "too-many-actions",
            PolicyFault::InitRefused(_) => "init-refused",
            PolicyFault::Trap(_) => "trap",
        }
    }
}

/// What the last call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCost {
    /// Wall-clock time of the call, marshalling included.
    pub wall: Duration,
    /// Fuel consumed (simulate mode only).
    pub fuel: Option<u64>,
}

/// A running policy, whatever it is made of (a component, or native code).
pub trait PolicyInstance: Send {
    /// A label for logs: the policy's name and, for components, its hash prefix.
    fn label(&self) -> String;
    /// Start the policy.
    fn init(&mut self, config: &Config, now: u64) -> Result<Vec<Action>, PolicyFault>;
    /// Deliver a batch of events at time `now`.
    fn handle(&mut self, events: &[Event], now: u64, kind: CallKind) -> Result<Vec<Action>, PolicyFault>;
    /// The cost of the last call.
    fn last_cost(&self) -> CallCost;
    /// Metrics the policy emitted since the last call to this method.
    fn take_emitted(&mut self) -> Vec<(String, f64)>;
    /// The size of the instance's linear memories, in bytes (`None` where it has
    /// none, as a native policy).
    fn memory_bytes(&self) -> Option<usize> {
        None
    }
    /// The contract version the policy was built against: what it can see of a
    /// request (a native policy is built with the host, so it speaks the latest).
    fn contract_version(&self) -> super::contract::ContractVersion {
        super::contract::LATEST
    }
}

/// A source of up-to-date latency profiles for the `profile` import.
pub trait ProfileSource: Send + Sync {
    /// Latency of a batch of `batch` on (stage, variant), if known.
    fn profile(&self, stage: u32, variant: u32, batch: u32) -> Option<u64>;
}

/// Caps a policy's linear memory, remembers that it tried to exceed the cap, and
/// counts the bytes its memories hold (wasmtime asks it before creating a memory and
/// before every growth; memories never shrink).
struct MemoryCap {
    limit: usize,
    exceeded: bool,
    bytes: usize,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = true;
            return Err(wasmtime::Error::msg(format!("policy memory cap of {} bytes reached (wanted {desired})", self.limit)));
        }
        if maximum.is_some_and(|max| desired > max) {
            // Past the memory's own maximum: the growth fails (`memory.grow` gives -1).
            return Ok(false);
        }
        self.bytes += desired.saturating_sub(current);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// The state behind a component's imports. Each contract version's module implements
/// its own `host` interface with the version-neutral `host_*` methods here.
pub struct HostState {
    label: Arc<str>,
    now: u64,
    seed: u64,
    rng: u64,
    memory: MemoryCap,
    call_started: WallInstant,
    watchdog: Duration,
    watchdog_fired: bool,
    log_lines: u32,
    log_lines_per_call: u32,
    log_line_bytes: usize,
    emitted: Vec<(String, f64)>,
    profiles: Option<Arc<dyn ProfileSource>>,
}

impl HostState {
    /// The value a component's `insecure-seed` import returns: fixed per instance.
    pub(crate) fn hash_seed(&self) -> (u64, u64) {
        (self.seed, self.seed.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn check_watchdog(&mut self) -> wasmtime::Result<()> {
        if self.call_started.elapsed() > self.watchdog {
            self.watchdog_fired = true;
            return Err(wasmtime::Error::msg("host-call watchdog expired"));
        }
        Ok(())
    }

    /// `host.now`.
    pub(crate) fn host_now(&mut self) -> wasmtime::Result<u64> {
        self.check_watchdog()?;
        Ok(self.now)
    }

    /// `host.log`: rate-limited per call and truncated.
    pub(crate) fn host_log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.check_watchdog()?;
        self.log_lines += 1;
        if self.log_lines > self.log_lines_per_call {
            return Ok(());
        }
        let mut message = message;
        if message.len() > self.log_line_bytes {
            let mut cut = self.log_line_bytes;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        log_policy_line(&self.label, level, &message);
        Ok(())
    }

    /// `host.profile`.
    pub(crate) fn host_profile(&mut self, stage: u32, variant: u32, batch: u32) -> wasmtime::Result<Option<u64>> {
        self.check_watchdog()?;
        Ok(self.profiles.as_ref().and_then(|p| p.profile(stage, variant, batch)))
    }

    /// `host.emit`: at most 10000 metrics between two reads.
    pub(crate) fn host_emit(&mut self, name: String, value: f64) -> wasmtime::Result<()> {
        self.check_watchdog()?;
        if self.emitted.len() < 10_000 {
            self.emitted.push((name, value));
        }
        Ok(())
    }

    /// `host.random`: the arm's seeded source.
    pub(crate) fn host_random(&mut self) -> wasmtime::Result<u64> {
        self.check_watchdog()?;
        let (state, value) = yardmaster_sdk::splitmix64(self.rng);
        self.rng = state;
        Ok(value)
    }
}

/// Write a policy's log line to the host's log at its level.
pub(crate) fn log_policy_line(policy: &str, level: Level, message: &str) {
    match level {
        Level::Trace => tracing::trace!(policy, "{message}"),
        Level::Debug => tracing::debug!(policy, "{message}"),
        Level::Info => tracing::info!(policy, "{message}"),
        Level::Warn => tracing::warn!(policy, "{message}"),
        Level::Error => tracing::error!(policy, "{message}"),
    }
}

/// A policy component instance with its store.
pub struct WasmPolicy {
    module: Arc<PolicyModule>,
    sandbox: Sandbox,
    store: Store<HostState>,
    exports: Exports,
    last_cost: CallCost,
}

impl WasmPolicy {
    /// Instantiate `module` in a fresh store (a few tens of microseconds).
    pub fn instantiate(
        sandbox: &Sandbox,
        module: Arc<PolicyModule>,
        seed: u64,
        profiles: Option<Arc<dyn ProfileSource>>,
    ) -> Result<Self, PolicyFault> {
        let limits = sandbox.limits();
        let state = HostState {
            label: format!("{}@{}", module.name(), &module.sha256_hex()[..12]).into(),
            now: 0,
            seed,
            rng: seed,
            memory: MemoryCap { limit: limits.memory_bytes, exceeded: false, bytes: 0 },
            call_started: WallInstant::now(),
            watchdog: limits.watchdog(sandbox.mode(), CallKind::Init),
            watchdog_fired: false,
            log_lines: 0,
            log_lines_per_call: limits.log_lines_per_call,
            log_line_bytes: limits.log_line_bytes,
            emitted: Vec::new(),
            profiles,
        };
        let mut store = Store::new(sandbox.engine(), state);
        store.limiter(|state| &mut state.memory);
        arm_budget(sandbox, &mut store, CallKind::Init);
        let exports = module.linked().instantiate(&mut store).map_err(|e| classify(sandbox, &mut store, CallKind::Init, e))?;
        Ok(Self { module, sandbox: sandbox.clone(), store, exports, last_cost: CallCost::default() })
    }

    /// The module this instance runs.
    pub fn module(&self) -> &Arc<PolicyModule> {
        &self.module
    }

    fn call<R>(
        &mut self,
        now: u64,
        kind: CallKind,
        body: impl FnOnce(&Exports, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyFault> {
        let state = self.store.data_mut();
        state.now = now;
        state.log_lines = 0;
        state.watchdog = self.sandbox.limits().watchdog(self.sandbox.mode(), kind);
        state.call_started = WallInstant::now();
        let started = state.call_started;
        arm_budget(&self.sandbox, &mut self.store, kind);
        let result = body(&self.exports, &mut self.store);
        let fuel = match self.sandbox.mode() {
            Mode::Simulate => {
                let left = self.store.get_fuel().unwrap_or(0);
                Some(self.sandbox.limits().fuel(kind).saturating_sub(left))
            }
            Mode::Serve => None,
        };
        self.last_cost = CallCost { wall: started.elapsed(), fuel };
        let suppressed = self.store.data().log_lines.saturating_sub(self.store.data().log_lines_per_call);
        if suppressed > 0 {
            tracing::warn!(policy = %self.store.data().label, suppressed, "policy log lines over the per-call limit were dropped");
        }
        result.map_err(|e| classify(&self.sandbox, &mut self.store, kind, e))
    }
}

/// Set the call's budget: an epoch deadline (serve) or fuel (simulate).
fn arm_budget(sandbox: &Sandbox, store: &mut Store<HostState>, kind: CallKind) {
    match sandbox.mode() {
        Mode::Serve => {
            store.set_epoch_deadline(Sandbox::deadline_ticks(sandbox.limits().deadline(kind)));
        }
        Mode::Simulate => {
            store.set_fuel(sandbox.limits().fuel(kind)).expect("fuel is enabled in simulate mode");
        }
    }
}

/// Turn a wasmtime error into a [`PolicyFault`].
fn classify(sandbox: &Sandbox, store: &mut Store<HostState>, kind: CallKind, error: wasmtime::Error) -> PolicyFault {
    // With its wasm backtrace (function names where the policy kept them): where a
    // policy trapped or ran out of fuel, for whoever debugs it.
    tracing::debug!(?kind, "policy call failed: {error:?}");
    let limits = sandbox.limits();
    let state = store.data_mut();
    if state.memory.exceeded {
        return PolicyFault::OutOfMemory(limits.memory_bytes);
    }
    if state.watchdog_fired {
        return PolicyFault::Watchdog(state.watchdog);
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => PolicyFault::Timeout(limits.deadline(kind)),
        Some(Trap::OutOfFuel) => PolicyFault::OutOfFuel(limits.fuel(kind)),
        Some(Trap::StackOverflow) => PolicyFault::StackOverflow,
        _ => PolicyFault::Trap(concise(&error)),
    }
}

/// The error's root cause (a trap's description, or what a host call reported),
/// without the wasm backtrace.
fn concise(error: &wasmtime::Error) -> String {
    match error.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        None => error.root_cause().to_string(),
    }
}

impl PolicyInstance for WasmPolicy {
    fn label(&self) -> String {
        self.store.data().label.to_string()
    }

    fn contract_version(&self) -> super::contract::ContractVersion {
        self.module.contract_version()
    }

    fn init(&mut self, config: &Config, now: u64) -> Result<Vec<Action>, PolicyFault> {
        let max_actions = self.sandbox.limits().max_actions;
        let result = self.call(now, CallKind::Init, |exports, store| exports.init(store, config))?;
        let actions = result.map_err(PolicyFault::InitRefused)?;
        check_action_count(actions, max_actions)
    }

    fn handle(&mut self, events: &[Event], now: u64, kind: CallKind) -> Result<Vec<Action>, PolicyFault> {
        let max_actions = self.sandbox.limits().max_actions;
        let actions = self.call(now, kind, |exports, store| exports.handle(store, now, events))?;
        check_action_count(actions, max_actions)
    }

    fn last_cost(&self) -> CallCost {
        self.last_cost
    }

    fn take_emitted(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.store.data_mut().emitted)
    }

    fn memory_bytes(&self) -> Option<usize> {
        Some(self.store.data().memory.bytes)
    }
}

/// Refuse an answer with more actions than the limit.
pub(crate) fn check_action_count(actions: Vec<Action>, max_actions: usize) -> Result<Vec<Action>, PolicyFault> {
    if actions.len() > max_actions {
        return Err(PolicyFault::TooManyActions(actions.len(), max_actions));
    }
    Ok(actions)
}

#[cfg(test)]
mod fault_kind_tests {
    use super::*;

    #[test]
    fn every_fault_kind_is_listed() {
        let faults = [
            PolicyFault::Timeout(Duration::ZERO),
            PolicyFault::OutOfFuel(1),
            PolicyFault::OutOfMemory(1),
            PolicyFault::StackOverflow,
            PolicyFault::Watchdog(Duration::ZERO),
            PolicyFault::TooManyActions(2, 1),
            PolicyFault::InitRefused(String::new()),
            PolicyFault::Trap(String::new()),
        ];
        let kinds: Vec<&str> = faults.iter().map(PolicyFault::kind).collect();
        assert_eq!(kinds, PolicyFault::KINDS);
    }
}
