//! What the host offers a policy: the clock, logging, profile look-ups, metrics and a
//! seeded random source.
//!
//! Inside a component these are the world's imports ([`ComponentHost`]); natively the
//! host passes its own implementation to [`crate::Driver::new`].

use crate::{Duration, Instant, Level, StageId, VariantId};

/// The host's side of the contract, as a policy calls it.
pub trait Host {
    /// The host's clock in nanoseconds (virtual in the simulator).
    fn now(&self) -> Instant;
    /// Write a line to the host's log.
    fn log(&self, level: Level, message: &str);
    /// The host's current profile of a batch, if it has one.
    fn profile(&self, stage: StageId, variant: VariantId, batch: u32) -> Option<Duration>;
    /// Record a policy-defined metric.
    fn emit(&self, name: &str, value: f64);
    /// The next number of the host's seeded random source.
    fn random(&self) -> u64;
}

/// The imports of the `yardmaster:policy/scheduler` world.
#[cfg(target_arch = "wasm32")]
pub struct ComponentHost;

#[cfg(target_arch = "wasm32")]
impl Host for ComponentHost {
    fn now(&self) -> Instant {
        crate::bindings::yardmaster::policy::host::now()
    }
    fn log(&self, level: Level, message: &str) {
        crate::bindings::yardmaster::policy::host::log(level, message)
    }
    fn profile(&self, stage: StageId, variant: VariantId, batch: u32) -> Option<Duration> {
        crate::bindings::yardmaster::policy::host::profile(stage, variant, batch)
    }
    fn emit(&self, name: &str, value: f64) {
        crate::bindings::yardmaster::policy::host::emit(name, value)
    }
    fn random(&self) -> u64 {
        crate::bindings::yardmaster::policy::host::random()
    }
}

/// A host for native tests: a settable clock, no profiles, logs to nowhere and a
/// SplitMix64 random source.
#[derive(Debug, Default)]
pub struct NullHost {
    /// The time [`Host::now`] returns.
    pub now: std::cell::Cell<Instant>,
    seed: std::cell::Cell<u64>,
}

impl NullHost {
    /// A host whose clock reads `now` and whose random source starts at `seed`.
    pub fn new(now: Instant, seed: u64) -> Self {
        Self { now: now.into(), seed: seed.into() }
    }
}

impl Host for NullHost {
    fn now(&self) -> Instant {
        self.now.get()
    }
    fn log(&self, _level: Level, _message: &str) {}
    fn profile(&self, _stage: StageId, _variant: VariantId, _batch: u32) -> Option<Duration> {
        None
    }
    fn emit(&self, _name: &str, _value: f64) {}
    fn random(&self) -> u64 {
        let next = splitmix64(self.seed.get());
        self.seed.set(next.0);
        next.1
    }
}

/// One step of SplitMix64: the new state and the output.
pub fn splitmix64(state: u64) -> (u64, u64) {
    let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (state, z ^ (z >> 31))
}
