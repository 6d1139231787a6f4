//! The WebAssembly engine every policy runs in, and the bounds it enforces.
//!
//! Two modes share one configuration type:
//! - [`Mode::Serve`]: calls are bounded by **epoch interruption**: a ticker thread
//!   advances the engine's epoch every millisecond and each call gets a deadline a
//!   few ticks ahead, so a runaway policy is stopped within about a millisecond of
//!   its deadline without per-instruction overhead;
//! - [`Mode::Simulate`]: calls are bounded by **fuel**, which counts executed
//!   instructions, so a simulation replays exactly whatever the machine's load.
//!
//! In both modes a store limiter caps the policy's memory, and host imports check a
//! wall-clock watchdog so time spent inside host calls is bounded too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Result};
use wasmtime::{Config, Engine};

/// How policy calls are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Live serving: wall-clock deadlines through epoch interruption.
    Serve,
    /// Simulation: deterministic instruction budgets through fuel.
    Simulate,
}

impl Mode {
    /// A short name (`serve`, `simulate`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Serve => "serve",
            Mode::Simulate => "simulate",
        }
    }
}

/// What kind of call a budget applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `init`, and the replay of queued requests into a new instance.
    Init,
    /// A batch of request-level events.
    Events,
    /// A batch containing a telemetry tick (planning policies solve here).
    Tick,
}

/// Bounds applied to every policy call.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Serve mode: deadline of an event batch.
    pub event_deadline: Duration,
    /// Serve mode: deadline of a batch with a tick, and of `init`.
    pub tick_deadline: Duration,
    /// Simulate mode: fuel of an event batch.
    pub event_fuel: u64,
    /// Simulate mode: fuel of a batch with a tick, and of `init`.
    pub tick_fuel: u64,
    /// Largest linear memory a policy may grow to.
    pub memory_bytes: usize,
    /// Most actions one call may return; more is a fault.
    pub max_actions: usize,
    /// Most log lines a call may write (the rest are counted and dropped).
    pub log_lines_per_call: u32,
    /// Longest log line kept (longer ones are truncated).
    pub log_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            event_deadline: Duration::from_millis(5),
            tick_deadline: Duration::from_millis(50),
            event_fuel: 50_000_000,
            tick_fuel: 1_000_000_000,
            memory_bytes: 64 << 20,
            max_actions: 100_000,
            log_lines_per_call: 32,
            log_line_bytes: 1024,
        }
    }
}

impl Limits {
    /// Serve-mode deadline of a call of this kind.
    pub fn deadline(&self, kind: CallKind) -> Duration {
        match kind {
            CallKind::Events => self.event_deadline,
            CallKind::Init | CallKind::Tick => self.tick_deadline,
        }
    }

    /// Simulate-mode fuel of a call of this kind.
    pub fn fuel(&self, kind: CallKind) -> u64 {
        match kind {
            CallKind::Events => self.event_fuel,
            CallKind::Init | CallKind::Tick => self.tick_fuel,
        }
    }

    /// Wall-clock bound checked by host imports: the deadline plus slack in serve
    /// mode, a generous multiple in simulate mode (where fuel is the real bound).
    pub fn watchdog(&self, mode: Mode, kind: CallKind) -> Duration {
        match mode {
            Mode::Serve => self.deadline(kind) * 2 + Duration::from_millis(10),
            Mode::Simulate => (self.deadline(kind) * 200).max(Duration::from_secs(1)),
        }
    }
}

/// Set to `1`, policy code compiled in this process is named in `/tmp/perf-<pid>.map`
/// so that `perf report` can attribute samples in it (the guest's own function names
/// show where the component keeps them).
pub const PERF_MAP_ENV: &str = "YARDMASTER_WASM_PERF_MAP";

/// Period of the epoch ticker in serve mode.
pub const EPOCH_PERIOD: Duration = Duration::from_millis(1);

/// A configured engine, its mode and limits, and (serve mode) its epoch ticker.
///
/// Cheap to clone; the ticker stops when the last clone is dropped.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    mode: Mode,
    limits: Limits,
    _ticker: Option<Arc<EpochTicker>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("mode", &self.mode).field("limits", &self.limits).finish()
    }
}

impl Sandbox {
    /// A sandbox for `mode` with `limits`.
    pub fn new(mode: Mode, limits: Limits) -> Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.max_wasm_stack(512 << 10);
        if std::env::var_os(PERF_MAP_ENV).is_some_and(|v| v == "1") {
            // Names of compiled policy code for `perf report` (/tmp/perf-PID.map).
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        match mode {
            Mode::Serve => {
                config.epoch_interruption(true);
                // Small functions inlined into their callers: a policy's code is mostly
                // small functions (look-ups, accessors), and each call costs a stack
                // check and an epoch check besides the call itself. With it, `edf`
                // decides 8-10 % faster (`policy bench`); compiling takes 2-3× as long
                // and up to ~400 MB at its peak (once per policy and process: the
                // loader caches compiled code). Epoch checks stay in inlined code, so
                // a looping policy is still stopped. Simulate mode does without: its
                // fuel counts stay as they were, and simulations compile many
                // policies.
                config.compiler_inlining(wasmtime::Inlining::Yes);
            }
            Mode::Simulate => {
                config.consume_fuel(true);
            }
        }
        let engine = Engine::new(&config).map_err(|e| anyhow!("create the wasm engine: {e}"))?;
        let ticker = match mode {
            Mode::Serve => Some(Arc::new(EpochTicker::start(engine.clone()))),
            Mode::Simulate => None,
        };
        Ok(Self { engine, mode, limits, _ticker: ticker })
    }

    /// The same sandbox (the same engine, so components compiled for one run in the
    /// other) with other limits: a swapped-in policy's own deadline or memory limit.
    pub fn with_limits(&self, limits: Limits) -> Sandbox {
        Sandbox { limits, ..self.clone() }
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// How calls are bounded.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Epoch ticks that cover `deadline` (at least one).
    pub fn deadline_ticks(deadline: Duration) -> u64 {
        (deadline.as_nanos().div_ceil(EPOCH_PERIOD.as_nanos()) as u64).max(1)
    }
}

/// A thread that advances an engine's epoch every [`EPOCH_PERIOD`].
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("yardmaster-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_PERIOD);
                    engine.increment_epoch();
                }
            })
            .expect("spawn the epoch ticker thread");
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
