//! The cluster's hosts: which device slot of which host each worker holds, and each
//! host's cache of model parameters in host memory.
//!
//! A replica whose stage and variant a host holds in its cache starts *warm* there
//! (the executor forks it from memory); elsewhere it starts *cold* (parameters read
//! from disk). The engine keeps this model because the policy decides placement
//! (contract 0.2's `scale.placement`) and needs to see it (`snapshot.hosts`):
//!
//! - **Admission.** Starting a replica on a host caches its parameters there once it
//!   has loaded them (`Engine::worker_ready`): a second replica placed there while the
//!   first is still loading starts cold too, as the host's own cache would have it.
//!   Switching a worker to another variant caches that variant. An entry outlives the
//!   replica; one whose loading replica never became ready is dropped.
//! - **Eviction.** Above [`CACHE_HIGH_WATER`] of a host's cache capacity, entries are
//!   evicted least recently used first (a warm start counts as a use).
//! - **Placement.** A replica goes where the policy says; otherwise to a host that
//!   caches its parameters and has a free slot (the most free slots first), else to
//!   the host with the most free slots (lowest id on ties). When every slot is held —
//!   by draining workers that have not left yet — it shares a slot beyond the host's
//!   count on the host with the most slots, rather than not starting.
//!
//! A pipeline that names no hosts runs on one implicit host, `local`, with as many
//! slots as the cluster's `max_workers` and [`DEFAULT_HOST_CACHE_BYTES`] of cache.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use yardmaster_policy::contract::{self, Placement};
use yardmaster_policy::HostSlots;

/// Cache capacity of the implicit host of a pipeline that names none.
pub const DEFAULT_HOST_CACHE_BYTES: u64 = 64 << 30;

/// Fraction of a host's cache capacity above which entries are evicted.
pub const CACHE_HIGH_WATER: f64 = 0.85;

/// Name of the implicit host.
pub const IMPLICIT_HOST: &str = "local";

/// A host of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct HostDef {
    /// Name (for logs and the policy's configuration).
    pub name: String,
    /// Device slots (GPUs); each worker holds one.
    pub slots: u32,
    /// Host memory for cached model parameters.
    pub cache_bytes: u64,
    /// Speed of its devices relative to the stages' profiles: 1 runs a job in its
    /// profiled time, 2 in half of it. The simulator runs jobs at this speed; live, the
    /// engine measures each host's own ([`HostReport::measured_speed`]).
    pub speed: f64,
    /// Intra-op threads each of its workers may use (its cores per slot; 0: not
    /// stated). The policy may give a worker no more threads than the fewest any
    /// host with a slot offers.
    pub threads: u32,
}

impl HostDef {
    /// A host of `slots` slots and `cache_bytes` of parameter cache, at the profiles' speed.
    pub fn new(name: impl Into<String>, slots: u32, cache_bytes: u64) -> Self {
        Self { name: name.into(), slots, cache_bytes, speed: 1.0, threads: 0 }
    }
}

/// A host as an operator (and the simulator's host list) sees it: its definition,
/// what it caches and runs, and how fast its jobs ran against their profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct HostReport {
    /// Its definition (slots, cache capacity, configured speed).
    pub def: HostDef,
    /// Bytes of parameters cached.
    pub cache_used: u64,
    /// Workers seated on it.
    pub workers: u32,
    /// Batch jobs whose time was measured on it.
    pub jobs: u64,
    /// Profiled time over measured time of those jobs (`None` before the first):
    /// the speed to give this host in a simulated cluster.
    pub measured_speed: Option<f64>,
}

/// Where a new worker starts, and whether from the host's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerStart {
    /// The host.
    pub host: u32,
    /// The slot it holds there.
    pub slot: u32,
    /// Its parameters were cached on the host: a warm start.
    pub warm: bool,
}

/// Where the engine seats a pipeline's initial workers (the default rule, in worker
/// order): `(worker, stage, start)`. Executors that start these workers themselves
/// provision each where this says; they all load at once, so each is a cold start.
pub fn initial_seats(pipeline: &crate::Pipeline) -> Vec<(u32, u32, WorkerStart)> {
    let mut hosts = Hosts::new(&pipeline.hosts, pipeline.max_workers);
    pipeline
        .initial_workers()
        .into_iter()
        .map(|(worker, stage)| {
            let bytes = pipeline.stages[stage as usize].variants[0].memory_bytes;
            (worker, stage, hosts.place(worker, stage, 0, bytes, None, 0, true))
        })
        .collect()
}

/// Model parameters cached on a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheEntry {
    stage: u32,
    variant: u32,
    bytes: u64,
    last_used: u64,
    /// The worker still loading these parameters (not a warm source until it is ready).
    loader: Option<u32>,
}

/// One host's slots and cache.
#[derive(Debug, Clone)]
struct HostModel {
    def: HostDef,
    /// Held slots and the worker holding each.
    taken: BTreeMap<u32, u32>,
    /// Least recently used first.
    cache: Vec<CacheEntry>,
    /// Batch jobs measured here: (jobs, profiled ns, measured ns).
    measured: (u64, u128, u128),
}

impl HostModel {
    /// A host with every slot free and nothing cached or measured.
    fn new(def: HostDef) -> Self {
        HostModel { def, taken: BTreeMap::new(), cache: Vec::new(), measured: (0, 0, 0) }
    }

    fn free_slots(&self) -> u32 {
        self.def.slots - self.taken.range(..self.def.slots).count() as u32
    }

    fn first_free_slot(&self) -> Option<u32> {
        (0..self.def.slots).find(|s| !self.taken.contains_key(s))
    }

    fn caches(&self, stage: u32, variant: u32) -> bool {
        self.cache.iter().any(|e| e.stage == stage && e.variant == variant)
    }

    /// Use (or admit, loaded by `loader` when given) an entry; whether it was there and
    /// loaded: a warm start. Evicts above the high-water mark.
    fn touch(&mut self, stage: u32, variant: u32, bytes: u64, now: u64, loader: Option<u32>) -> bool {
        let hit = if let Some(i) = self.cache.iter().position(|e| e.stage == stage && e.variant == variant) {
            let mut entry = self.cache.remove(i);
            entry.last_used = now;
            let loaded = entry.loader.is_none();
            self.cache.push(entry);
            loaded
        } else {
            self.cache.push(CacheEntry { stage, variant, bytes, last_used: now, loader });
            false
        };
        let limit = (self.def.cache_bytes as f64 * CACHE_HIGH_WATER) as u64;
        while self.cache.iter().map(|e| e.bytes).sum::<u64>() > limit {
            self.cache.remove(0);
        }
        hit
    }

    fn cache_used(&self) -> u64 {
        self.cache.iter().map(|e| e.bytes).sum()
    }
}

/// Where a worker sits.
#[derive(Debug, Clone, Copy)]
struct Seat {
    host: u32,
    slot: u32,
    stage: u32,
}

/// The hosts of a cluster, their slots and caches.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    hosts: Vec<HostModel>,
    /// The pipeline named no host: one host whose slots follow `max_workers`.
    implicit: bool,
    seats: FxHashMap<u32, Seat>,
}

impl Hosts {
    /// The hosts `defs` names, or the implicit one with `max_workers` slots.
    pub(crate) fn new(defs: &[HostDef], max_workers: u32) -> Self {
        let implicit = defs.is_empty();
        let defs = if implicit { vec![HostDef::new(IMPLICIT_HOST, max_workers, DEFAULT_HOST_CACHE_BYTES)] } else { defs.to_vec() };
        let hosts = defs.into_iter().map(HostModel::new).collect();
        Self { hosts, implicit, seats: FxHashMap::default() }
    }

    /// The cluster's size changed (an A/B share, a node joining): the implicit host
    /// follows it; named hosts keep their slots.
    pub(crate) fn set_max_workers(&mut self, max_workers: u32) {
        if self.implicit {
            self.hosts[0].def.slots = max_workers;
        }
    }

    /// The cluster's hosts changed while serving (a node joined, left or was lost).
    /// Hosts keep their places by name: a host of `defs` already known keeps its id
    /// and takes the new slots and cache capacity (a host that left stays, with no
    /// slot); a new name is appended. `Err` names a known host that `defs` leaves out.
    pub(crate) fn set_defs(&mut self, defs: &[HostDef]) -> Result<(), String> {
        if defs.is_empty() {
            return Ok(());
        }
        if self.implicit {
            // The implicit host gives way to named ones; seats keep their numbers.
            self.implicit = false;
            let first = &defs[0];
            self.hosts[0].def = first.clone();
        }
        for (i, host) in self.hosts.iter().enumerate() {
            if !defs.iter().any(|d| d.name == host.def.name) {
                return Err(format!("host {i} ({}) is missing from the new host list: a host keeps its place", host.def.name));
            }
        }
        for def in defs {
            match self.hosts.iter_mut().find(|h| h.def.name == def.name) {
                Some(host) => host.def = def.clone(),
                None => self.hosts.push(HostModel::new(def.clone())),
            }
        }
        Ok(())
    }

    /// The workers seated on `host`.
    pub(crate) fn workers_on(&self, host: u32) -> Vec<u32> {
        let mut workers: Vec<u32> = self.seats.iter().filter(|(_, seat)| seat.host == host).map(|(w, _)| *w).collect();
        workers.sort_unstable();
        workers
    }

    /// Seat a new worker of `stage` running `variant` (`bytes` of parameters) where
    /// `placement` says, or by the default rule; cache its parameters there — from
    /// when it is ready ([`Hosts::loaded`]) if it is `loading` them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn place(
        &mut self,
        worker: u32,
        stage: u32,
        variant: u32,
        bytes: u64,
        placement: Option<&Placement>,
        now: u64,
        loading: bool,
    ) -> WorkerStart {
        let host = match placement {
            Some(p) if (p.host as usize) < self.hosts.len() => p.host,
            _ => self.default_host(stage, variant),
        };
        let model = &mut self.hosts[host as usize];
        let wanted = placement.and_then(|p| p.slot).filter(|s| *s < model.def.slots && !model.taken.contains_key(s));
        let slot = wanted.or_else(|| model.first_free_slot()).unwrap_or_else(|| {
            // Every slot is held: share one beyond the count.
            (model.def.slots..).find(|s| !model.taken.contains_key(s)).expect("a free number")
        });
        model.taken.insert(slot, worker);
        let warm = model.touch(stage, variant, bytes, now, loading.then_some(worker));
        self.seats.insert(worker, Seat { host, slot, stage });
        WorkerStart { host, slot, warm }
    }

    /// The default rule: a host caching the parameters with a free slot, else the most
    /// free slots, else the most slots; the lowest id on ties.
    fn default_host(&self, stage: u32, variant: u32) -> u32 {
        let best = |candidates: &mut dyn Iterator<Item = (usize, &HostModel)>| {
            candidates.max_by_key(|(i, h)| (h.free_slots(), std::cmp::Reverse(*i))).map(|(i, _)| i as u32)
        };
        best(&mut self.hosts.iter().enumerate().filter(|(_, h)| h.free_slots() > 0 && h.caches(stage, variant)))
            .or_else(|| best(&mut self.hosts.iter().enumerate().filter(|(_, h)| h.free_slots() > 0)))
            // Every slot held: the most slots, so a host without any (a node that
            // left) is chosen only when every host has none.
            .or_else(|| self.hosts.iter().enumerate().max_by_key(|(i, h)| (h.def.slots, std::cmp::Reverse(*i))).map(|(i, _)| i as u32))
            .unwrap_or(0)
    }

    /// A worker left: its slot is free again (its host's cache keeps its parameters,
    /// unless it left before it had loaded them).
    pub(crate) fn release(&mut self, worker: u32) {
        if let Some(seat) = self.seats.remove(&worker) {
            let host = &mut self.hosts[seat.host as usize];
            host.taken.remove(&seat.slot);
            host.cache.retain(|e| e.loader != Some(worker));
        }
    }

    /// `worker` has loaded its parameters: its host's cache holds them from now on.
    pub(crate) fn loaded(&mut self, worker: u32) {
        if let Some(seat) = self.seats.get(&worker) {
            for entry in &mut self.hosts[seat.host as usize].cache {
                if entry.loader == Some(worker) {
                    entry.loader = None;
                }
            }
        }
    }

    /// A worker switched to `variant`: its host loads (and caches) those parameters.
    pub(crate) fn switch_variant(&mut self, worker: u32, variant: u32, bytes: u64, now: u64) {
        if let Some(seat) = self.seats.get(&worker).copied() {
            self.hosts[seat.host as usize].touch(seat.stage, variant, bytes, now, None);
        }
    }

    /// The hosts as the policy's configuration lists them.
    pub(crate) fn info(&self) -> Vec<contract::HostInfo> {
        let info = |(i, h): (usize, &HostModel)| contract::HostInfo {
            id: i as u32,
            name: h.def.name.clone(),
            slots: h.def.slots,
            cache_capacity: h.def.cache_bytes,
        };
        self.hosts.iter().enumerate().map(info).collect()
    }

    /// Every host's state for a snapshot, with replica counts for `stages` stages.
    pub(crate) fn stats(&self, stages: usize) -> Vec<contract::HostStats> {
        let mut replicas = vec![vec![0u32; stages]; self.hosts.len()];
        for seat in self.seats.values() {
            if let Some(count) = replicas[seat.host as usize].get_mut(seat.stage as usize) {
                *count += 1;
            }
        }
        let cached =
            |e: &CacheEntry| contract::CachedParameters { stage: e.stage, variant: e.variant, bytes: e.bytes, last_used: e.last_used };
        self.hosts
            .iter()
            .zip(replicas)
            .enumerate()
            .map(|(i, (h, replicas))| contract::HostStats {
                id: i as u32,
                free_slots: h.free_slots(),
                replicas,
                cache_used: h.cache_used(),
                cache_capacity: h.def.cache_bytes,
                cached: h.cache.iter().map(cached).collect(),
            })
            .collect()
    }

    /// Cached bytes and cache capacity over all hosts.
    pub(crate) fn cache_totals(&self) -> (u64, u64) {
        self.hosts.iter().fold((0, 0), |(used, cap), h| (used + h.cache_used(), cap + h.def.cache_bytes))
    }

    /// The most intra-op threads a worker may use on every host with a slot (`None`
    /// when no such host states it).
    pub(crate) fn thread_limit(&self) -> Option<u32> {
        self.hosts.iter().filter(|h| h.def.slots > 0 && h.def.threads > 0).map(|h| h.def.threads).min()
    }

    /// A batch job on `worker` took `measured` ns against `profiled` ns by its profile.
    pub(crate) fn job_measured(&mut self, worker: u32, profiled: u64, measured: u64) {
        if let Some(seat) = self.seats.get(&worker) {
            let total = &mut self.hosts[seat.host as usize].measured;
            *total = (total.0 + 1, total.1 + profiled as u128, total.2 + measured as u128);
        }
    }

    /// Every host as an operator sees it.
    pub(crate) fn reports(&self) -> Vec<HostReport> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let (jobs, profiled, measured) = h.measured;
                HostReport {
                    def: h.def.clone(),
                    cache_used: h.cache_used(),
                    workers: self.seats.values().filter(|seat| seat.host == i as u32).count() as u32,
                    jobs,
                    measured_speed: (jobs > 0 && measured > 0).then(|| profiled as f64 / measured as f64),
                }
            })
            .collect()
    }

    /// A host's slots as the validator sees them.
    pub(crate) fn slots(&self, host: u32) -> Option<HostSlots> {
        let h = self.hosts.get(host as usize)?;
        Some(HostSlots { slots: h.def.slots, free: (0..h.def.slots).filter(|s| !h.taken.contains_key(s)).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_hosts() -> Hosts {
        let def = |name: &str, slots| HostDef::new(name, slots, 10 << 30);
        Hosts::new(&[def("a", 2), def("b", 4)], 6)
    }

    #[test]
    fn an_unplaced_replica_goes_where_its_parameters_are_cached_else_to_the_most_free_slots() {
        let mut hosts = two_hosts();
        // Nothing cached: host b has more free slots.
        let first = hosts.place(1, 0, 0, 1 << 30, None, 10, false);
        assert_eq!(first, WorkerStart { host: 1, slot: 0, warm: false });
        // Host a now has as many free slots (2, against 3): b still has more.
        assert_eq!(hosts.place(2, 1, 0, 1 << 30, None, 20, false).host, 1);
        // Stage 1 cached on b, which has a free slot: warm there.
        hosts.release(2);
        assert_eq!(hosts.place(3, 1, 0, 1 << 30, None, 30, false), WorkerStart { host: 1, slot: 1, warm: true });
        // A named host and slot are honoured; the cache of a is cold for stage 0.
        let named = Placement { host: 0, slot: Some(1) };
        assert_eq!(hosts.place(4, 0, 0, 1 << 30, Some(&named), 40, false), WorkerStart { host: 0, slot: 1, warm: false });
        assert_eq!(hosts.slots(0), Some(HostSlots { slots: 2, free: vec![0] }));
        let stats = hosts.stats(2);
        assert_eq!(stats[0].free_slots, 1);
        assert_eq!(stats[1].free_slots, 2);
        assert_eq!(stats[1].replicas, vec![1, 1]);
        assert_eq!(stats[1].cached.iter().map(|c| (c.stage, c.last_used)).collect::<Vec<_>>(), vec![(0, 10), (1, 30)]);
    }

    #[test]
    fn a_replica_placed_while_the_parameters_are_still_loading_there_starts_cold() {
        let mut hosts = Hosts::new(&[HostDef::new("a", 4, 10 << 30)], 4);
        assert!(!hosts.place(1, 0, 0, 1 << 20, None, 0, true).warm);
        assert!(!hosts.place(2, 0, 0, 1 << 20, None, 1, true).warm, "worker 1 has not loaded them yet");
        hosts.loaded(1);
        assert!(hosts.place(3, 0, 0, 1 << 20, None, 2, true).warm);
        // A loader that leaves before it is ready takes its entry with it.
        assert!(!hosts.place(4, 1, 0, 1 << 20, None, 3, true).warm);
        hosts.release(4);
        assert_eq!(hosts.stats(2)[0].cached.iter().map(|c| c.stage).collect::<Vec<_>>(), vec![0]);
        assert!(!hosts.place(5, 1, 0, 1 << 20, None, 4, false).warm);
        assert!(hosts.place(6, 1, 0, 1 << 20, None, 5, false).warm, "loaded at once when not loading");
    }

    #[test]
    fn entries_are_evicted_least_recently_used_first_above_85_percent_of_the_cache() {
        let mut hosts = Hosts::new(&[HostDef::new("a", 8, 10 << 30)], 8);
        // 8.5 GiB fit: 3 × 2.5 GiB = 7.5 fit, a fourth does not.
        let gib = |x: f64| (x * (1u64 << 30) as f64) as u64;
        for stage in 0..3 {
            hosts.place(stage, stage, 0, gib(2.5), None, stage as u64, false);
        }
        // Stage 0 starts warm again: it becomes the most recently used.
        hosts.release(0);
        assert!(hosts.place(10, 0, 0, gib(2.5), None, 5, false).warm);
        hosts.place(11, 3, 0, gib(2.5), None, 6, false);
        let cached: Vec<u32> = hosts.stats(4)[0].cached.iter().map(|c| c.stage).collect();
        assert_eq!(cached, vec![2, 0, 3], "stage 1, the least recently used, was evicted");
        assert_eq!(hosts.cache_totals(), (gib(7.5), 10 << 30));
    }

    #[test]
    fn without_cache_memory_every_start_is_cold() {
        let mut hosts = Hosts::new(&[HostDef::new("a", 4, 0)], 4);
        for worker in 0..3 {
            assert!(!hosts.place(worker, 0, 0, 1 << 30, None, 0, false).warm);
            hosts.release(worker);
        }
        assert_eq!(hosts.cache_totals(), (0, 0));
    }

    #[test]
    fn with_every_slot_held_a_replica_shares_one_beyond_the_count() {
        let mut hosts = two_hosts();
        for worker in 0..6 {
            hosts.place(worker, 0, 0, 0, None, 0, false);
        }
        assert!(hosts.stats(1).iter().all(|h| h.free_slots == 0));
        let extra = hosts.place(6, 0, 0, 0, None, 0, false);
        assert_eq!((extra.host, extra.slot), (1, 4));
        assert_eq!(hosts.slots(1), Some(HostSlots { slots: 4, free: vec![] }));
    }

    #[test]
    fn the_implicit_host_follows_the_cluster_size() {
        let mut hosts = Hosts::new(&[], 3);
        assert_eq!(hosts.info()[0].name, IMPLICIT_HOST);
        assert_eq!(hosts.slots(0).unwrap().slots, 3);
        hosts.set_max_workers(5);
        assert_eq!(hosts.slots(0).unwrap().free, vec![0, 1, 2, 3, 4]);
        assert_eq!(hosts.info()[0].cache_capacity, DEFAULT_HOST_CACHE_BYTES);
    }

    #[test]
    fn a_host_measures_its_speed_from_the_jobs_seated_on_it() {
        let mut hosts = two_hosts();
        let on_b = hosts.place(1, 0, 0, 0, None, 0, false);
        assert_eq!(on_b.host, 1);
        assert_eq!(hosts.reports()[1].measured_speed, None);
        hosts.job_measured(1, 10_000, 20_000);
        hosts.job_measured(1, 30_000, 60_000);
        hosts.job_measured(99, 10, 1_000); // not seated: ignored
        let reports = hosts.reports();
        assert_eq!((reports[1].jobs, reports[1].measured_speed), (2, Some(0.5)));
        assert_eq!((reports[0].jobs, reports[0].workers, reports[1].workers), (0, 0, 1));
    }

    #[test]
    fn the_thread_limit_is_the_fewest_threads_a_serving_host_offers() {
        let mut hosts = two_hosts();
        assert_eq!(hosts.thread_limit(), None, "not stated");
        let def = |name: &str, slots, threads| HostDef { threads, ..HostDef::new(name, slots, 10 << 30) };
        hosts.set_defs(&[def("a", 2, 4), def("b", 4, 0)]).unwrap();
        assert_eq!(hosts.thread_limit(), Some(4));
        hosts.set_defs(&[def("a", 2, 4), def("b", 4, 0), def("c", 1, 2)]).unwrap();
        assert_eq!(hosts.thread_limit(), Some(2));
        hosts.set_defs(&[def("a", 2, 4), def("b", 4, 0), def("c", 0, 2)]).unwrap();
        assert_eq!(hosts.thread_limit(), Some(4), "a host without a slot (it left) limits nothing");
    }
}
