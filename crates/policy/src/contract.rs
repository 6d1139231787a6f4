//! The host side of the policy contract (`wit/`): which contract versions a component
//! may be built against, one bindings module per supported version, and the types of
//! the latest version, which the rest of the host uses for events and actions.
//!
//! Every released version of `yardmaster:policy` is a frozen directory `wit/X.Y.Z/`
//! with a module here (`v0_1_0` for `wit/0.1.0/`, `v0_2_0` for `wit/0.2.0/`, `v0_3_0` for
//! `wit/0.3.0/`) holding
//! its own `bindgen!`, its host imports and the conversions between its types and the
//! latest ones (written with the helpers of [`convert`]). The loader reads
//! the version a component exports (`yardmaster:policy/policy@X.Y.Z`), checks it
//! against [`ACCEPTED`] and links the component through that version's module
//! ([`Binding`]); an instance calls it through the same module, so a policy built
//! against an older contract keeps loading after the contract moves on. The re-exports
//! below ([`Event`], [`Action`], [`Config`], …) are always the latest version's types;
//! `wit/README.md` describes how a new version is added.

pub(crate) mod convert;
mod imports;
pub mod v0_1_0;
pub mod v0_2_0;
pub mod v0_3_0;
mod version;

use wasmtime::component::{InstancePre, Linker};
use wasmtime::Store;

pub use self::v0_3_0::yardmaster::policy::host::Level;
pub use self::v0_3_0::yardmaster::policy::types::*;
pub use self::version::{exported_version, Accepted, ContractVersion, VersionError, POLICY_EXPORT};

use super::instance::HostState;

/// The latest contract version: the one whose types the host uses.
pub const LATEST: ContractVersion = v0_3_0::VERSION;

/// The first contract version that shows a policy a request's items (a client
/// batch's rows) and its place in a stateful sequence: an older policy is never given
/// either.
pub const ITEMS_AND_SEQUENCES: ContractVersion = v0_3_0::VERSION;

/// The contract versions this host accepts: from the oldest still supported to
/// [`LATEST`], each served by its own bindings module (see [`Binding::ALL`]).
pub const ACCEPTED: Accepted = Accepted { oldest: v0_1_0::VERSION, latest: LATEST };

/// The version of the contract this host implements natively (the latest), as text.
pub const CONTRACT_VERSION: &str = "0.3.0";

/// The interfaces of the world a policy may import (without their version).
pub const WORLD_IMPORTS: &[&str] = &["yardmaster:policy/types", "yardmaster:policy/host"];

/// The bindings module that serves one supported contract version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binding {
    /// `wit/0.1.0`, module [`v0_1_0`].
    V0_1_0,
    /// `wit/0.2.0`, module [`v0_2_0`].
    V0_2_0,
    /// `wit/0.3.0`, module [`v0_3_0`].
    V0_3_0,
}

impl Binding {
    /// Every supported version's bindings, oldest first.
    pub const ALL: &'static [Binding] = &[Binding::V0_1_0, Binding::V0_2_0, Binding::V0_3_0];

    /// The contract version this module binds.
    pub const fn version(self) -> ContractVersion {
        match self {
            Binding::V0_1_0 => v0_1_0::VERSION,
            Binding::V0_2_0 => v0_2_0::VERSION,
            Binding::V0_3_0 => v0_3_0::VERSION,
        }
    }

    /// The bindings for a component built against `version`, or why there are none.
    pub fn for_version(version: ContractVersion) -> Result<Binding, VersionError> {
        Binding::ALL
            .iter()
            .copied()
            .find(|binding| binding.version() == version && ACCEPTED.contains(version))
            .ok_or_else(|| VersionError::Unsupported { found: version.to_string() })
    }

    /// Add this version's host imports to a linker.
    pub(crate) fn add_to_linker(self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        match self {
            Binding::V0_1_0 => v0_1_0::add_to_linker(linker),
            Binding::V0_2_0 => v0_2_0::add_to_linker(linker),
            Binding::V0_3_0 => v0_3_0::add_to_linker(linker),
        }
    }

    /// Find this version's exports in a linked component.
    pub(crate) fn link(self, instance_pre: InstancePre<HostState>) -> wasmtime::Result<Linked> {
        match self {
            Binding::V0_1_0 => Ok(Linked::V0_1_0(v0_1_0::Linked::new(instance_pre)?)),
            Binding::V0_2_0 => Ok(Linked::V0_2_0(v0_2_0::Linked::new(instance_pre)?)),
            Binding::V0_3_0 => Ok(Linked::V0_3_0(v0_3_0::Linked::new(instance_pre)?)),
        }
    }
}

/// A component linked through its version's bindings, ready to instantiate.
pub(crate) enum Linked {
    /// Built against 0.1.0.
    V0_1_0(v0_1_0::Linked),
    /// Built against 0.2.0.
    V0_2_0(v0_2_0::Linked),
    /// Built against 0.3.0.
    V0_3_0(v0_3_0::Linked),
}

impl Linked {
    /// The contract version the component was built against.
    pub(crate) fn binding(&self) -> Binding {
        match self {
            Linked::V0_1_0(_) => Binding::V0_1_0,
            Linked::V0_2_0(_) => Binding::V0_2_0,
            Linked::V0_3_0(_) => Binding::V0_3_0,
        }
    }

    /// Instantiate the component in `store` and find its exports.
    pub(crate) fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Exports> {
        match self {
            Linked::V0_1_0(linked) => Ok(Exports::V0_1_0(v0_1_0::Exports::new(linked, store)?)),
            Linked::V0_2_0(linked) => Ok(Exports::V0_2_0(v0_2_0::Exports::new(linked, store)?)),
            Linked::V0_3_0(linked) => Ok(Exports::V0_3_0(v0_3_0::Exports::new(linked, store)?)),
        }
    }
}

/// The exports of an instance, called with the latest types whatever the component's
/// version: its module converts on the way in and out.
pub(crate) enum Exports {
    /// Built against 0.1.0.
    V0_1_0(v0_1_0::Exports),
    /// Built against 0.2.0.
    V0_2_0(v0_2_0::Exports),
    /// Built against 0.3.0.
    V0_3_0(v0_3_0::Exports),
}

impl Exports {
    /// Call `init`.
    pub(crate) fn init(&self, store: &mut Store<HostState>, config: &Config) -> wasmtime::Result<Result<Vec<Action>, String>> {
        match self {
            Exports::V0_1_0(exports) => exports.init(store, config),
            Exports::V0_2_0(exports) => exports.init(store, config),
            Exports::V0_3_0(exports) => exports.init(store, config),
        }
    }

    /// Call `handle` with a batch of events.
    pub(crate) fn handle(&self, store: &mut Store<HostState>, now: u64, events: &[Event]) -> wasmtime::Result<Vec<Action>> {
        match self {
            Exports::V0_1_0(exports) => exports.handle(store, now, events),
            Exports::V0_2_0(exports) => exports.handle(store, now, events),
            Exports::V0_3_0(exports) => exports.handle(store, now, events),
        }
    }
}

impl Event {
    /// A short name of the event's kind, for metrics and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Arrival(_) => "arrival",
            Event::WorkerIdle(_) => "worker-idle",
            Event::BatchDone(_) => "batch-done",
            Event::Frame(_) => "frame",
            Event::Tick(_) => "tick",
            Event::Timer(_) => "timer",
            Event::WorkerAdded(_) => "worker-added",
            Event::WorkerRemoved(_) => "worker-removed",
            Event::RequestEnded(_) => "request-ended",
        }
    }
}

impl Action {
    /// Every name [`Action::kind`] gives (metrics export each from the start, at zero).
    pub const KINDS: &'static [&'static str] = &[
        "drop",
        "dispatch",
        "preempt",
        "evict",
        "scale",
        "set-variant",
        "set-routes",
        "set-batch-limit",
        "set-threads",
        "defer",
        "set-timer",
    ];

    /// A short name of the action's kind, for metrics and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Drop(_) => "drop",
            Action::Dispatch(_) => "dispatch",
            Action::Preempt(_) => "preempt",
            Action::Evict(_) => "evict",
            Action::Scale(_) => "scale",
            Action::SetVariant(_) => "set-variant",
            Action::SetRoutes(_) => "set-routes",
            Action::SetBatchLimit(_) => "set-batch-limit",
            Action::SetThreads(_) => "set-threads",
            Action::Defer(_) => "defer",
            Action::SetTimer(_) => "set-timer",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_bindings_cover_the_accepted_range_oldest_first() {
        let versions: Vec<ContractVersion> = Binding::ALL.iter().map(|b| b.version()).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "Binding::ALL is sorted oldest first, without repeats: {versions:?}");
        assert_eq!(versions.first(), Some(&ACCEPTED.oldest));
        assert_eq!(versions.last(), Some(&ACCEPTED.latest));
        assert_eq!(ACCEPTED.latest, LATEST);
        assert_eq!(CONTRACT_VERSION, LATEST.to_string());
        for &binding in Binding::ALL {
            assert_eq!(Binding::for_version(binding.version()), Ok(binding));
        }
    }

    #[test]
    fn every_supported_version_has_its_frozen_wit_directory() {
        let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit");
        for binding in Binding::ALL {
            let dir = wit.join(binding.version().to_string());
            assert!(dir.join("policy.wit").is_file(), "{} has no WIT", dir.display());
        }
        // Every released version directory inside the accepted range has bindings.
        for entry in std::fs::read_dir(&wit).unwrap().flatten() {
            let Some(version) = entry.file_name().to_str().and_then(ContractVersion::parse) else { continue };
            if ACCEPTED.contains(version) {
                assert!(Binding::for_version(version).is_ok(), "wit/{version} is accepted but has no bindings module");
            }
        }
    }

    #[test]
    fn versions_outside_the_range_have_no_bindings() {
        let ContractVersion { major, minor, patch } = LATEST;
        let newer = [
            ContractVersion::new(major, minor, patch + 1),
            ContractVersion::new(major, minor + 1, 0),
            ContractVersion::new(major + 1, 0, 0),
        ];
        let older = ContractVersion::new(0, 0, 1);
        for version in newer.into_iter().chain((older < ACCEPTED.oldest).then_some(older)) {
            assert_eq!(Binding::for_version(version), Err(VersionError::Unsupported { found: version.to_string() }));
        }
    }
}
