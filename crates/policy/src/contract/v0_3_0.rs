//! Contract 0.3.0 (`wit/0.3.0/`): its generated bindings, its host imports, and the
//! conversions between its types and the latest ones the rest of the host uses.
//!
//! 0.3.0 is the latest version, so its types *are* the latest ones (the parent module
//! re-exports them) and the conversions are the identity: an event list is lowered
//! straight from the host's slice by the fast path in [`crate::fast_events`], and the
//! actions lifted by the one in [`crate::fast_actions`]. The
//! conversion functions are written against both names (`latest::…` and this module's
//! own types), so when a newer version becomes the latest they stop compiling until
//! they convert for real (as `v0_1_0`'s do) — and `handle` must then call through
//! wasmtime's generic lowering of this version's own event type (and lifting of its
//! action type) instead of the fast paths, which only know the latest layout.
#![allow(missing_docs)] // the bindings wasmtime generates from the WIT carry the WIT's own docs only

use std::borrow::Cow;

use wasmtime::component::TypedFunc;
use wasmtime::Store;

use super::ContractVersion;
use crate::contract as latest;
use crate::fast_actions::ActionList;
use crate::fast_events::EventList;
use crate::instance::HostState;

wasmtime::component::bindgen!({
    path: "../../wit/0.3.0",
    world: "yardmaster:policy/scheduler@0.3.0",
    imports: { default: trappable },
    additional_derives: [PartialEq],
});

use self::yardmaster::policy::host::Level;
use self::yardmaster::policy::types::{Action, Config, Event};

/// The version these bindings were generated from.
pub const VERSION: ContractVersion = ContractVersion::new(0, 3, 0);

/// The name of the exported policy interface in a component of this version.
const POLICY_EXPORT: &str = "yardmaster:policy/policy@0.3.0";

super::imports::version_imports!();

// Conversions between this version's types and the latest ones (the identity while
// 0.3.0 is the latest; see the module docs).

/// The configuration as this version sees it.
fn config_from_latest(config: &latest::Config) -> Cow<'_, Config> {
    Cow::Borrowed(config)
}

/// The events as this version sees them (an event this version does not know would
/// be left out here).
fn events_from_latest(events: &[latest::Event]) -> Cow<'_, [Event]> {
    Cow::Borrowed(events)
}

/// This version's actions as the latest ones.
fn actions_into_latest(actions: Vec<Action>) -> Vec<latest::Action> {
    actions
}

/// This version's log level as the latest one.
fn level_into_latest(level: Level) -> latest::Level {
    level
}

/// The typed `handle` export, called with the fast event lowering and the fast action
/// lifting.
type HandleFunc = TypedFunc<(u64, EventList), (ActionList,)>;

/// The exports of an instance of this version.
pub(crate) struct Exports {
    bindings: Scheduler,
    handle: HandleFunc,
}

impl Exports {
    /// Instantiate the component and find its exports.
    pub(crate) fn new(linked: &Linked, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
        let instance = linked.pre.instance_pre().instantiate(&mut *store)?;
        let bindings = Scheduler::new(&mut *store, &instance)?;
        let missing = || wasmtime::Error::msg(format!("the component does not export {POLICY_EXPORT}#handle"));
        let interface = instance.get_export_index(&mut *store, None, POLICY_EXPORT).ok_or_else(missing)?;
        let handle = instance.get_export_index(&mut *store, Some(&interface), "handle").ok_or_else(missing)?;
        let handle = instance.get_typed_func::<(u64, EventList), (ActionList,)>(&mut *store, &handle)?;
        Ok(Self { bindings, handle })
    }

    /// Call `init`.
    pub(crate) fn init(
        &self,
        store: &mut Store<HostState>,
        config: &latest::Config,
    ) -> wasmtime::Result<Result<Vec<latest::Action>, String>> {
        let config = config_from_latest(config);
        let result = self.bindings.yardmaster_policy_policy().call_init(store, &config)?;
        Ok(result.map(actions_into_latest))
    }

    /// Call `handle`.
    pub(crate) fn handle(&self, store: &mut Store<HostState>, now: u64, events: &[latest::Event]) -> wasmtime::Result<Vec<latest::Action>> {
        let events = events_from_latest(events);
        // SAFETY: the list view lives only for this call, while `events` is borrowed.
        let list = unsafe { EventList::new(&events) };
        let (ActionList(actions),) = self.handle.call(store, (now, list))?;
        Ok(actions_into_latest(actions))
    }
}
