//! Contract 0.2.0 (`wit/0.2.0/`, frozen): its generated bindings, its host imports, and
//! the conversions between its types and the latest ones the rest of the host uses.
//!
//! A 0.2.0 policy sees requests as 0.2.0 described them: without `items` and
//! `correlation`. It counts every request as one item, so on a model that takes client
//! batches a dispatch of several multi-row requests can exceed the batch limit and is
//! rejected (`batch-over-limit`); a request of a stateful sequence dispatched to a
//! worker other than the one holding the sequence is rejected too. Serve such models
//! with a 0.3.0 policy (every policy under `policies/` is one). Everything else
//! converts field by field. Its events are lowered by wasmtime's generic lowering of
//! this version's `event` type; the fast path in [`crate::fast_events`] only knows the
//! latest layout.
#![allow(missing_docs)] // the bindings wasmtime generates from the WIT carry the WIT's own docs only

use wasmtime::Store;

use super::convert::{cases, payloads, record, Convert};
use super::ContractVersion;
use crate::contract as latest;
use crate::instance::HostState;

wasmtime::component::bindgen!({
    path: "../../wit/0.2.0",
    world: "yardmaster:policy/scheduler@0.2.0",
    imports: { default: trappable },
    additional_derives: [PartialEq],
});

use self::yardmaster::policy::host as own_host;
use self::yardmaster::policy::host::Level;
use self::yardmaster::policy::types as own;
use self::yardmaster::policy::types::{Action, Config, Event};

/// The version these bindings were generated from.
pub const VERSION: ContractVersion = ContractVersion::new(0, 2, 0);

super::imports::version_imports!();

// Conversions between this version's types and the latest ones.

// Down: the configuration and the events, as this version sees them.
record!(latest::Config => own::Config { arm, stages, workers, streams, hosts, params, tick_interval, max_workers, seed, now });
record!(latest::Stage => own::Stage {
    id, name, kind, successors, predecessors, variants, max_batch, min_replicas, max_replicas
});
record!(latest::Variant => own::Variant { id, name, accuracy, profile, memory_bytes, fan_out });
record!(latest::LatencyPoint => own::LatencyPoint { batch, mean, tail });
cases!(latest::StageKind => own::StageKind { Batch, Iteration });
cases!(latest::DeviceKind => own::DeviceKind { Cpu, Gpu });
record!(latest::HostInfo => own::HostInfo { id, name, slots, cache_capacity });
record!(latest::Worker => own::Worker { id, stage, variant, device, host, slot, threads, memory_bytes });
record!(latest::Stream => own::Stream { id, name, entry, slo });
record!(latest::Param => own::Param { key, value });
payloads!(latest::Event => own::Event {
    Arrival, WorkerIdle, BatchDone, Frame, Tick, Timer, WorkerAdded, WorkerRemoved, RequestEnded
});
// 0.2.0 requests do not know their items or their sequence.
record!(latest::Request => own::Request {
    id, origin, stage, stream, sent_at, arrived_at, deadline, priority, input_size, expected_tokens, requeues, tags
});
record!(latest::Tag => own::Tag { key, value });
record!(latest::BatchOutcome => own::BatchOutcome { worker, started_at, duration, results });
record!(latest::RequestResult => own::RequestResult { id, status, tokens });
cases!(latest::RequestStatus => own::RequestStatus { Ok, Failed });
record!(latest::FrameReport => own::FrameReport { worker, steps, duration, sequences, kv_capacity });
record!(latest::SequenceState => own::SequenceState { id, generated, kv_bytes, finished });
record!(latest::Snapshot => own::Snapshot { at, stages, workers, host_memory_used, host_memory_capacity, hosts });
record!(latest::StageStats => own::StageStats {
    stage, queue_length, queue_delay, arrival_rate, throughput, mean_batch, replicas, starting, batch_limit
});
record!(latest::WorkerStats => own::WorkerStats {
    worker, stage, variant, busy, utilisation, last_batch, threads, memory_used, memory_capacity
});
record!(latest::HostStats => own::HostStats { id, free_slots, replicas, cache_used, cache_capacity, cached });
record!(latest::CachedParameters => own::CachedParameters { stage, variant, bytes, last_used });
cases!(latest::EndReason => own::EndReason { Cancelled, Expired, Failed });

// Up: the actions, as the latest version's (0.3.0 changed none).
payloads!(own::Action => latest::Action {
    Drop, Dispatch, Preempt, Evict, Scale, SetVariant, SetRoutes, SetBatchLimit, SetThreads, Defer, SetTimer
});
record!(own::DropRequest => latest::DropRequest { request, reason });
cases!(own::DropReason => latest::DropReason { DeadlineUnreachable, Overload, QueueFull, Preempted, Policy });
record!(own::Dispatch => latest::Dispatch { worker, requests, variant });
record!(own::Evict => latest::Evict { sequence, mode });
cases!(own::EvictMode => latest::EvictMode { Recompute, Swap });
record!(own::Scale => latest::Scale { stage, replicas, variant, placement });
record!(own::Placement => latest::Placement { host, slot });
record!(own::SetVariant => latest::SetVariant { target, variant });
payloads!(own::VariantTarget => latest::VariantTarget { Worker, Stage });
record!(own::SetRoutes => latest::SetRoutes { stage, source, targets });
record!(own::Route => latest::Route { worker, weight });
record!(own::SetBatchLimit => latest::SetBatchLimit { stage, limit });
record!(own::SetThreads => latest::SetThreads { worker, threads });
record!(own::Defer => latest::Defer { request, until });
record!(own::SetTimer => latest::SetTimer { at, token });
cases!(own_host::Level => latest::Level { Trace, Debug, Info, Warn, Error });

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
    fn a_0_2_0_policy_sees_requests_without_items_or_sequence() {
        let request = latest::Request {
            id: 4,
            origin: 4,
            stage: 1,
            stream: 0,
            sent_at: 1,
            arrived_at: 2,
            deadline: 3,
            priority: 0,
            input_size: 5,
            expected_tokens: 0,
            requeues: 1,
            tags: None,
            items: 3,
            correlation: Some(latest::Correlation { id: 9, start: true, end: false, worker: None }),
        };
        let events = events_from_latest(&[latest::Event::Arrival(request)]);
        assert_eq!(
            events,
            vec![own::Event::Arrival(own::Request {
                id: 4,
                origin: 4,
                stage: 1,
                stream: 0,
                sent_at: 1,
                arrived_at: 2,
                deadline: 3,
                priority: 0,
                input_size: 5,
                expected_tokens: 0,
                requeues: 1,
                tags: None,
            })]
        );
    }

    #[test]
    fn a_0_2_0_scale_keeps_its_placement() {
        let scale = own::Action::Scale(own::Scale {
            stage: 2,
            replicas: 5,
            variant: None,
            placement: vec![own::Placement { host: 1, slot: Some(0) }],
        });
        assert_eq!(
            actions_into_latest(vec![scale]),
            vec![latest::Action::Scale(latest::Scale {
                stage: 2,
                replicas: 5,
                variant: None,
                placement: vec![latest::Placement { host: 1, slot: Some(0) }]
            })]
        );
    }
}
