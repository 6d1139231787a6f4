//! Contract 0.1.0 (`wit/0.1.0/`, frozen): its generated bindings, its host imports, and
//! the conversions between its types and the latest ones the rest of the host uses.
//!
//! A 0.1.0 policy sees the cluster as 0.1.0 described it: no hosts in its
//! configuration, snapshots and workers, and its `scale` actions carry no placement
//! (the host places those replicas itself, as it did when 0.1.0 was the latest).
//! Everything else converts field by field. Its events are lowered by wasmtime's
//! generic lowering of this version's `event` type; the fast path in
//! [`crate::fast_events`] only knows the latest layout.
#![allow(missing_docs)] // the bindings wasmtime generates from the WIT carry the WIT's own docs only

use wasmtime::Store;

use super::convert::{cases, payloads, record, Convert};
use super::ContractVersion;
use crate::contract as latest;
use crate::instance::HostState;

wasmtime::component::bindgen!({
    path: "../../wit/0.1.0",
    world: "yardmaster:policy/scheduler@0.1.0",
    imports: { default: trappable },
    additional_derives: [PartialEq],
});

use self::yardmaster::policy::host as own_host;
use self::yardmaster::policy::host::Level;
use self::yardmaster::policy::types as own;
use self::yardmaster::policy::types::{Action, Config, Event};

/// The version these bindings were generated from.
pub const VERSION: ContractVersion = ContractVersion::new(0, 1, 0);

super::imports::version_imports!();

// Conversions between this version's types and the latest ones.

// Down: the configuration and the events, as this version sees them.
record!(latest::Config => own::Config { arm, stages, workers, streams, params, tick_interval, max_workers, seed, now });
record!(latest::Stage => own::Stage {
    id, name, kind, successors, predecessors, variants, max_batch, min_replicas, max_replicas
});
record!(latest::Variant => own::Variant { id, name, accuracy, profile, memory_bytes, fan_out });
record!(latest::LatencyPoint => own::LatencyPoint { batch, mean, tail });
cases!(latest::StageKind => own::StageKind { Batch, Iteration });
cases!(latest::DeviceKind => own::DeviceKind { Cpu, Gpu });
// 0.1.0 workers do not know their host and slot.
record!(latest::Worker => own::Worker { id, stage, variant, device, threads, memory_bytes });
record!(latest::Stream => own::Stream { id, name, entry, slo });
record!(latest::Param => own::Param { key, value });
payloads!(latest::Event => own::Event {
    Arrival, WorkerIdle, BatchDone, Frame, Tick, Timer, WorkerAdded, WorkerRemoved, RequestEnded
});
record!(latest::Request => own::Request {
    id, origin, stage, stream, sent_at, arrived_at, deadline, priority, input_size, expected_tokens, requeues, tags
});
record!(latest::Tag => own::Tag { key, value });
record!(latest::BatchOutcome => own::BatchOutcome { worker, started_at, duration, results });
record!(latest::RequestResult => own::RequestResult { id, status, tokens });
cases!(latest::RequestStatus => own::RequestStatus { Ok, Failed });
record!(latest::FrameReport => own::FrameReport { worker, steps, duration, sequences, kv_capacity });
record!(latest::SequenceState => own::SequenceState { id, generated, kv_bytes, finished });
// 0.1.0 snapshots have no per-host state.
record!(latest::Snapshot => own::Snapshot { at, stages, workers, host_memory_used, host_memory_capacity });
record!(latest::StageStats => own::StageStats {
    stage, queue_length, queue_delay, arrival_rate, throughput, mean_batch, replicas, starting, batch_limit
});
record!(latest::WorkerStats => own::WorkerStats {
    worker, stage, variant, busy, utilisation, last_batch, threads, memory_used, memory_capacity
});
cases!(latest::EndReason => own::EndReason { Cancelled, Expired, Failed });

// Up: the actions, as the latest version's.
payloads!(own::Action => latest::Action {
    Drop, Dispatch, Preempt, Evict, Scale, SetVariant, SetRoutes, SetBatchLimit, SetThreads, Defer, SetTimer
});
record!(own::DropRequest => latest::DropRequest { request, reason });
cases!(own::DropReason => latest::DropReason { DeadlineUnreachable, Overload, QueueFull, Preempted, Policy });
record!(own::Dispatch => latest::Dispatch { worker, requests, variant });
record!(own::Evict => latest::Evict { sequence, mode });
cases!(own::EvictMode => latest::EvictMode { Recompute, Swap });
record!(own::SetVariant => latest::SetVariant { target, variant });
payloads!(own::VariantTarget => latest::VariantTarget { Worker, Stage });
record!(own::SetRoutes => latest::SetRoutes { stage, source, targets });
record!(own::Route => latest::Route { worker, weight });
record!(own::SetBatchLimit => latest::SetBatchLimit { stage, limit });
record!(own::SetThreads => latest::SetThreads { worker, threads });
record!(own::Defer => latest::Defer { request, until });
record!(own::SetTimer => latest::SetTimer { at, token });
cases!(own_host::Level => latest::Level { Trace, Debug, Info, Warn, Error });

impl Convert<latest::Scale> for own::Scale {
    /// A 0.1.0 `scale` names no placement: the host places every new replica.
    fn convert(self) -> latest::Scale {
        latest::Scale { stage: self.stage, replicas: self.replicas, variant: self.variant, placement: Vec::new() }
    }
}

/// The configuration as this version sees it.
fn config_from_latest(config: &latest::Config) -> Config {
    config.clone().convert()
}

/// The events as this version sees them.
fn events_from_latest(events: &[latest::Event]) -> Vec<Event> {
    events.iter().cloned().map(Convert::convert).collect()
}

/// This version's actions as the latest ones.
fn actions_into_latest(actions: Vec<Action>) -> Vec<latest::Action> {
    actions.convert()
}

/// This version's log level as the latest one.
fn level_into_latest(level: Level) -> latest::Level {
    level.convert()
}

/// The exports of an instance of this version.
pub(crate) struct Exports {
    bindings: Scheduler,
}

impl Exports {
    /// Instantiate the component and find its exports.
    pub(crate) fn new(linked: &Linked, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
        let instance = linked.pre.instance_pre().instantiate(&mut *store)?;
        let bindings = Scheduler::new(&mut *store, &instance)?;
        Ok(Self { bindings })
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
        let actions = self.bindings.yardmaster_policy_policy().call_handle(store, now, &events)?;
        Ok(actions_into_latest(actions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_1_0_scale_leaves_placement_to_the_host() {
        let scale = own::Action::Scale(own::Scale { stage: 2, replicas: 5, variant: Some(1) });
        let latest = actions_into_latest(vec![scale]);
        assert_eq!(latest, vec![latest::Action::Scale(latest::Scale { stage: 2, replicas: 5, variant: Some(1), placement: vec![] })]);
    }

    #[test]
    fn a_0_1_0_policy_sees_workers_and_snapshots_without_hosts() {
        let worker =
            latest::Worker { id: 3, stage: 1, variant: 0, device: latest::DeviceKind::Gpu, host: 4, slot: 2, threads: 2, memory_bytes: 7 };
        let host = latest::HostStats { id: 4, free_slots: 1, replicas: vec![1], cache_used: 9, cache_capacity: 10, cached: vec![] };
        let snapshot =
            latest::Snapshot { at: 5, stages: vec![], workers: vec![], host_memory_used: 9, host_memory_capacity: 10, hosts: vec![host] };
        let events = events_from_latest(&[latest::Event::WorkerAdded(worker), latest::Event::Tick(snapshot), latest::Event::Timer(8)]);
        assert_eq!(
            events,
            vec![
                own::Event::WorkerAdded(own::Worker {
                    id: 3,
                    stage: 1,
                    variant: 0,
                    device: own::DeviceKind::Gpu,
                    threads: 2,
                    memory_bytes: 7
                }),
                own::Event::Tick(own::Snapshot { at: 5, stages: vec![], workers: vec![], host_memory_used: 9, host_memory_capacity: 10 }),
                own::Event::Timer(8),
            ]
        );
    }
}
