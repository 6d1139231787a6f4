//! The live cluster: every `yardmaster node` the controller finds is a host of the
//! engine's, and nodes join, leave and are lost while serving.
//!
//! **Hosts.** Host 0 is the controller's own (`[cluster] local_slots` slots; its
//! workers are the per-stage pools of this process). Every node that answers is a
//! host after it, in the order nodes first joined, with the name, slots and cache
//! capacity of its welcome. A host keeps its place for good: a node that leaves or is
//! lost stays, with no slot, and a node that comes back under the same name (a
//! StatefulSet pod restarted on a new address) takes its place again. The engine seats
//! each replica on a host — the policy's `scale.placement`, else the default rule of
//! `yardmaster_engine::hosts` — and the executor runs it on that host's workers.
//!
//! **Replicas.** A model's instance count (Triton's `instance_group` count, or a
//! stage's `replicas`) is per live host, as Triton's is per GPU: a stage runs that many
//! replicas on each host with a slot, and more or fewer as the policy scales it.
//!
//! **Membership changes** go to the engine as a reconfiguration
//! (`yardmaster_engine::Engine::reconfigure_cluster`), the hand-over model loading
//! uses, so the policy receives the new cluster; the pause is logged and counted.
//! - *Join*: a new address from the resolver is connected to (the whole catalogue in
//!   the hello); the node becomes a host with free slots, and each stage is brought up
//!   to its replicas for the larger cluster, seated on the free slots first.
//! - *Leave*: an address the name no longer resolves to (Kubernetes takes a pod out of
//!   the headless Service's records when it stops being ready or terminates) is
//!   drained: its host has no slot from then on, its idle replicas retire at once and
//!   busy ones after their batch.
//! - *Loss*: a connection that ends (the node died, the network went away for the
//!   idle timeout) ends everything in flight there with an error (the pool's rules)
//!   and reports its workers lost; the host has no slot from then on, and stages are
//!   brought back up to their replicas on the hosts left.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::sync::mpsc;
use yardmaster_cluster::discovery::{Membership, NodeSource};
use yardmaster_cluster::pool::{RemoteConfig, RemotePool};
use yardmaster_cluster::transport::{Fingerprint, Trust};
use yardmaster_dataplane::ModelCatalog;
use yardmaster_engine::hosts::HostDef;
use yardmaster_engine::pipeline::MAX_WORKERS;
use yardmaster_engine::Pipeline;

use super::config::ClusterConfig;
use super::executor::{HostGroup, ServeHandle};

/// What a host of the live cluster is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// The controller's own host.
    Local,
    /// A node serving.
    Live,
    /// A node that left (drained).
    Left,
    /// A node whose connection was lost.
    Lost,
}

impl HostState {
    /// As Prometheus labels and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            HostState::Local => "local",
            HostState::Live => "live",
            HostState::Left => "left",
            HostState::Lost => "lost",
        }
    }
}

/// One host of the live cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// Name (the node's, from its welcome).
    pub name: String,
    /// Slots it offers (its welcome's; the engine sees 0 once it left or was lost).
    pub slots: u32,
    /// Parameter-cache capacity, bytes.
    pub cache_bytes: u64,
    /// Intra-op threads each of its workers may use (0: not stated).
    pub threads: u32,
    /// Its address (none for the controller's own host).
    pub address: Option<SocketAddr>,
    /// Where it stands.
    pub state: HostState,
}

impl HostEntry {
    /// The host as the engine sees it: no slot unless it serves.
    pub fn def(&self) -> HostDef {
        let slots = match self.state {
            HostState::Local | HostState::Live => self.slots,
            HostState::Left | HostState::Lost => 0,
        };
        HostDef { threads: self.threads, ..HostDef::new(self.name.clone(), slots, self.cache_bytes) }
    }
}

/// The cluster as the controller knows it, shared with metrics and the banner.
#[derive(Debug, Clone, Default)]
pub struct ClusterStatus {
    /// Hosts by engine id.
    pub hosts: Vec<HostEntry>,
    /// Membership changes applied.
    pub changes: u64,
    /// Wall time the last change held the engine.
    pub last_pause: Duration,
    /// The longest such pause.
    pub max_pause: Duration,
}

/// The cluster as `GET /v2/cluster` answers it: every host in engine order with its
/// state, address, slots (what it offers; none once it left or was lost), parameter
/// cache (capacity and bytes in use), workers, and the speed its batch jobs ran at
/// against their profiles (`measured_speed`, with the `jobs` it was measured on; null
/// before the first) — what `yardmaster cluster hosts` turns into the simulator's
/// host list. `reports` are the engine's (`Engine::host_reports`), matched by name.
pub fn cluster_view(status: &ClusterStatus, reports: &[yardmaster_engine::hosts::HostReport]) -> serde_json::Value {
    let hosts: Vec<serde_json::Value> = status
        .hosts
        .iter()
        .map(|host| {
            let report = reports.iter().find(|r| r.def.name == host.name);
            serde_json::json!({
                "name": host.name,
                "state": host.state.name(),
                "address": host.address.map(|a| a.to_string()),
                "slots": host.def().slots,
                "offered_slots": host.slots,
                "cache_bytes": host.cache_bytes,
                "threads": host.threads,
                "cache_used_bytes": report.map_or(0, |r| r.cache_used),
                "workers": report.map_or(0, |r| r.workers),
                "jobs": report.map_or(0, |r| r.jobs),
                "measured_speed": report.and_then(|r| r.measured_speed),
            })
        })
        .collect();
    serde_json::json!({
        "hosts": hosts,
        "membership_changes": status.changes,
        "last_pause_seconds": status.last_pause.as_secs_f64(),
        "max_pause_seconds": status.max_pause.as_secs_f64(),
    })
}

/// The hosts of a [`cluster_view`] as a simulated cluster: every host with a slot
/// (a node that left or was lost is not simulated; the controller's own host only
/// when it has slots), with its cache capacity and its measured speed (1 where
/// none was measured yet). `Err` when the view has no such host.
pub fn simulated_hosts(view: &serde_json::Value) -> Result<Vec<HostDef>, String> {
    let hosts = view["hosts"].as_array().ok_or("the answer has no \"hosts\" list: is this a Yardmaster cluster controller?")?;
    let mut defs = Vec::new();
    for host in hosts {
        let name = host["name"].as_str().ok_or("a host without a name")?;
        let slots = host["slots"].as_u64().ok_or_else(|| format!("host {name} has no slot count"))? as u32;
        if slots == 0 {
            continue;
        }
        let cache_bytes = host["cache_bytes"].as_u64().unwrap_or(0);
        let speed = host["measured_speed"].as_f64().filter(|s| s.is_finite() && *s > 0.0).unwrap_or(1.0);
        let threads = host["threads"].as_u64().unwrap_or(0) as u32;
        defs.push(HostDef { speed, threads, ..HostDef::new(name, slots, cache_bytes) });
    }
    if defs.is_empty() {
        return Err("no host of the cluster has a slot: no node has joined".into());
    }
    Ok(defs)
}

/// The status, shared.
pub type SharedStatus = Arc<Mutex<ClusterStatus>>;

/// What the cluster needs to connect to a node.
#[derive(Clone)]
pub struct ClusterLink {
    source: NodeSource,
    ca_trust: Option<Trust>,
    pins: BTreeMap<SocketAddr, Fingerprint>,
    catalog: ModelCatalog,
    threads: u32,
    idle_timeout: Duration,
    resolve_every: Duration,
}

impl ClusterLink {
    /// From the `[cluster]` section, for a pipeline whose models are `catalog` (sent
    /// whole to every node) and whose workers use up to `threads` intra-op threads.
    pub fn new(config: &ClusterConfig, catalog: ModelCatalog, threads: u32) -> Result<Self> {
        config.validate()?;
        let source: NodeSource = config.nodes.parse()?;
        let ca_trust = match &config.ca {
            Some(ca) => {
                let name = config.node_name.clone().or_else(|| source.default_node_name().map(str::to_string));
                let name = name.unwrap_or_else(|| yardmaster_cluster::transport::SERVER_NAME.to_string());
                Some(Trust::cluster_ca(ca, &name)?)
            }
            None => None,
        };
        let mut pins = BTreeMap::new();
        for (address, pin) in &config.pins {
            let address: SocketAddr = address.parse().with_context(|| format!("[cluster] pins: {address:?} is not IP:PORT"))?;
            pins.insert(address, Fingerprint::from_argument(pin).with_context(|| format!("[cluster] the pin of {address}"))?);
        }
        Ok(ClusterLink {
            source,
            ca_trust,
            pins,
            catalog,
            threads,
            idle_timeout: Duration::from_secs_f64(config.idle_timeout_secs),
            resolve_every: Duration::from_secs_f64(config.resolve_secs),
        })
    }

    /// Where the nodes are found.
    pub fn source(&self) -> &NodeSource {
        &self.source
    }

    /// How the node at `address` is recognised.
    fn trust(&self, address: SocketAddr) -> Result<Trust> {
        if let Some(trust) = &self.ca_trust {
            return Ok(trust.clone());
        }
        self.pins.get(&address).map(|&pin| Trust::Pin(pin)).ok_or_else(|| anyhow!("node {address} has no pin and no cluster CA is set"))
    }

    /// Connect to the node at `address`.
    pub async fn connect(&self, address: SocketAddr) -> Result<(RemotePool, std::sync::mpsc::Receiver<yardmaster_dataplane::WorkerEvent>)> {
        let mut config = RemoteConfig::new(address, self.trust(address)?, self.catalog.clone());
        config.threads = self.threads;
        config.idle_timeout = self.idle_timeout;
        RemotePool::connect(config).await
    }
}

/// The live cluster: its hosts, the resolver's last look, and the instance counts
/// that spread replicas over it.
pub struct Cluster {
    link: ClusterLink,
    status: SharedStatus,
    membership: Membership,
    /// The connection to each node serving, to notice its end.
    connections: BTreeMap<SocketAddr, quinn::Connection>,
    /// Per stage, replicas per live host (its instance count).
    per_host: Vec<u32>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("source", &self.link.source).field("status", &self.status).finish()
    }
}

impl Cluster {
    /// Find the first nodes: resolve, connect to every address, and wait (up to
    /// `startup_wait`, saying so every few seconds) until some host has a slot. The
    /// controller's own host, `local_name` with `local_slots`, comes first. Returns the
    /// cluster and the workers of each node, to start the executor with; `pipeline`
    /// gets the hosts and its replicas spread over them.
    pub async fn start(
        link: ClusterLink,
        local_name: &str,
        local_slots: u32,
        startup_wait: Duration,
        pipeline: &mut Pipeline,
    ) -> Result<(Cluster, Vec<HostGroup>)> {
        let local = HostEntry {
            name: local_name.to_string(),
            slots: local_slots,
            cache_bytes: yardmaster_engine::hosts::DEFAULT_HOST_CACHE_BYTES,
            threads: (yardmaster_dataplane::parallel::cores() as u32 / local_slots.max(1)).max(1),
            address: None,
            state: HostState::Local,
        };
        let per_host = pipeline.stages.iter().map(|s| s.replicas).collect();
        let status = Arc::new(Mutex::new(ClusterStatus { hosts: vec![local], ..Default::default() }));
        let mut cluster = Cluster { link, status, membership: Membership::new(), connections: BTreeMap::new(), per_host };
        let began = Instant::now();
        let mut groups = Vec::new();
        let mut said = Instant::now();
        loop {
            match cluster.link.source.resolve().await {
                Ok(now) => {
                    let changes = cluster.membership.update(now);
                    for address in changes.appeared {
                        if let Some((group, why)) = cluster.join(address).await {
                            eprintln!("{why}");
                            groups.push(group);
                        }
                    }
                }
                Err(error) => {
                    if said.elapsed() >= Duration::from_secs(5) {
                        eprintln!("waiting for nodes: {error:#}");
                    }
                }
            }
            let slots: u32 = cluster.defs().iter().map(|h| h.slots).sum();
            if slots > 0 {
                break;
            }
            if began.elapsed() >= startup_wait {
                bail!(
                    "no node with a slot joined within {startup_wait:?} ({} resolves to {} address(es)); start nodes, or give this host `local_slots`",
                    cluster.link.source,
                    cluster.membership.seen().len()
                );
            }
            if said.elapsed() >= Duration::from_secs(5) {
                eprintln!("waiting for nodes at {} ({:.0} s so far)", cluster.link.source, began.elapsed().as_secs_f64());
                said = Instant::now();
            }
            tokio::time::sleep(cluster.link.resolve_every.min(Duration::from_secs(1))).await;
        }
        spread(pipeline, &cluster.per_host, cluster.defs());
        Ok((cluster, groups))
    }

    /// The status, shared (metrics read it).
    pub fn status(&self) -> SharedStatus {
        self.status.clone()
    }

    /// The hosts as the engine sees them.
    fn defs(&self) -> Vec<HostDef> {
        lock(&self.status).hosts.iter().map(HostEntry::def).collect()
    }

    /// Take a connected node in: its place (by name, a returning node keeps its own),
    /// and whether it came back.
    fn admit(&mut self, pool: &RemotePool, address: SocketAddr) -> (u32, bool) {
        let welcome = pool.welcome();
        let mut status = lock(&self.status);
        let entry = HostEntry {
            name: welcome.name.clone(),
            slots: welcome.slots,
            cache_bytes: welcome.cache_bytes,
            threads: welcome.threads,
            address: Some(address),
            state: HostState::Live,
        };
        match status.hosts.iter().position(|h| h.name == welcome.name) {
            Some(index) => {
                status.hosts[index] = entry;
                (index as u32, true)
            }
            None => {
                status.hosts.push(entry);
                (status.hosts.len() as u32 - 1, false)
            }
        }
    }

    /// Follow the nodes while serving: resolve every `resolve_secs`, connect what
    /// appeared, drain what vanished, and take in lost connections. Runs until the
    /// actor stops.
    pub fn watch(mut self, handle: ServeHandle) {
        let (lost_tx, mut lost_rx) = mpsc::unbounded_channel::<(SocketAddr, String)>();
        tokio::spawn(async move {
            let initial: Vec<SocketAddr> = self.connections.keys().copied().collect();
            for address in initial {
                self.watch_connection(address, &lost_tx);
            }
            let mut tick = tokio::time::interval(self.link.resolve_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if !self.look(&handle, &lost_tx).await {
                            return;
                        }
                    }
                    Some((address, reason)) = lost_rx.recv() => {
                        if !self.lose(&handle, address, &reason).await {
                            return;
                        }
                    }
                }
            }
        });
    }

    /// Report the end of the connection to `address` on `lost`.
    fn watch_connection(&self, address: SocketAddr, lost: &mpsc::UnboundedSender<(SocketAddr, String)>) {
        let Some(connection) = self.connections.get(&address).cloned() else { return };
        let lost = lost.clone();
        tokio::spawn(async move {
            let reason = connection.closed().await;
            let _ = lost.send((address, yardmaster_cluster::transport::describe_close(&reason)));
        });
    }
}

impl Cluster {
    /// One look at the nodes: drain what vanished, connect what appeared. `false`
    /// once the engine is gone.
    async fn look(&mut self, handle: &ServeHandle, lost: &mpsc::UnboundedSender<(SocketAddr, String)>) -> bool {
        let now = match self.link.source.resolve().await {
            Ok(now) => now,
            Err(error) => {
                tracing::warn!("resolving the nodes: {error:#}; the cluster stays as it is");
                return true;
            }
        };
        let changes = self.membership.update(now);
        for address in changes.vanished {
            let name = {
                let mut status = lock(&self.status);
                let Some(host) = status.hosts.iter_mut().find(|h| h.address == Some(address) && h.state == HostState::Live) else {
                    continue;
                };
                host.state = HostState::Left;
                host.name.clone()
            };
            let why = format!("node {name} left ({address} is no longer among {})", self.link.source);
            if !self.apply(handle, None, &why).await {
                return false;
            }
        }
        for address in changes.appeared {
            if let Some((group, why)) = self.join(address).await {
                self.watch_connection(address, lost);
                if !self.apply(handle, Some(group), &why).await {
                    return false;
                }
            }
        }
        true
    }

    /// Connect to the node at `address` and take it in as a host: its workers for the
    /// executor, and the line that says it joined. A node that cannot join is logged
    /// and forgotten, so the next look tries it again.
    async fn join(&mut self, address: SocketAddr) -> Option<(HostGroup, String)> {
        match self.link.connect(address).await {
            Ok((pool, events)) => {
                let (host, back) = self.admit(&pool, address);
                self.connections.insert(address, pool.connection());
                let welcome = pool.welcome();
                let again = if back { " again" } else { "" };
                let why = format!("node {} joined{again} at {address} ({}, {} slot(s))", welcome.name, welcome.device, welcome.slots);
                Some((HostGroup { host, workers: Box::new(pool), events }, why))
            }
            Err(error) => {
                tracing::warn!("node {address} could not join: {error:#}");
                eprintln!("node {address} could not join: {error:#}");
                self.membership.forget(address);
                None
            }
        }
    }

    /// The connection to `address` ended. `false` once the engine is gone.
    async fn lose(&mut self, handle: &ServeHandle, address: SocketAddr, reason: &str) -> bool {
        if self.connections.remove(&address).is_none() {
            return true;
        }
        // Connected again if the name still resolves to it.
        self.membership.forget(address);
        let name = {
            let mut status = lock(&self.status);
            let Some(host) = status.hosts.iter_mut().find(|h| h.address == Some(address) && h.state != HostState::Lost) else {
                return true;
            };
            let was = host.state;
            host.state = HostState::Lost;
            if was == HostState::Left {
                // Drained already: nothing changes for the engine.
                return true;
            }
            host.name.clone()
        };
        self.apply(handle, None, &format!("node {name} at {address} lost: {reason}")).await
    }

    /// Hand the engine the cluster as it is now, with `joined`'s workers if a node
    /// joined. `false` once the engine is gone.
    async fn apply(&mut self, handle: &ServeHandle, joined: Option<HostGroup>, why: &str) -> bool {
        let (hosts, per_host, reason) = (self.defs(), self.per_host.clone(), why.to_string());
        let handle = handle.clone();
        let changed = tokio::task::spawn_blocking(move || {
            handle.update(move |arms| {
                if arms.ab_running() {
                    tracing::warn!("a membership change during an A/B run reaches the main arm only");
                }
                let engine = arms.main_mut();
                if let Some(group) = joined {
                    engine.executor().borrow_mut().add_host(group);
                }
                let mut pipeline = engine.state().pipeline().clone();
                spread(&mut pipeline, &per_host, hosts);
                engine.reconfigure_cluster(pipeline, &reason)
            })
        })
        .await;
        match changed {
            Ok(Ok(Ok(outcome))) => {
                let pause = outcome.pause;
                drop(outcome.retired);
                let mut status = lock(&self.status);
                status.changes += 1;
                status.last_pause = pause;
                status.max_pause = status.max_pause.max(pause);
                tracing::info!(pause_us = pause.as_secs_f64() * 1e6, "{why}: the policy was handed the new cluster");
                eprintln!("{why} (the policy was handed the new cluster in {:.0} µs)", pause.as_secs_f64() * 1e6);
                true
            }
            Ok(Ok(Err(error))) => {
                tracing::error!("{why}: the engine refused the new cluster: {error}");
                eprintln!("{why}: the engine refused the new cluster: {error}");
                true
            }
            Ok(Err(_)) | Err(_) => false,
        }
    }
}

/// Give `pipeline` the hosts `hosts` and each online stage `per_host[stage]` replicas
/// per host with a slot (a stage beyond `per_host`, a model loaded later, keeps its
/// own count per host).
pub fn spread(pipeline: &mut Pipeline, per_host: &[u32], hosts: Vec<HostDef>) {
    let live = hosts.iter().filter(|h| h.slots > 0).count().max(1) as u32;
    for (stage, def) in pipeline.stages.iter_mut().enumerate() {
        if def.max_replicas == 0 {
            continue; // an offline model
        }
        let per_host = per_host.get(stage).copied().unwrap_or(def.replicas).max(1);
        def.replicas = per_host.saturating_mul(live).max(def.min_replicas);
        def.max_replicas = def.max_replicas.max(def.replicas);
    }
    let replicas: u32 = pipeline.stages.iter().map(|s| s.max_replicas).fold(0u32, u32::saturating_add);
    let slots: u32 = hosts.iter().map(|h| h.slots).sum();
    pipeline.max_workers = replicas.max(slots).min(MAX_WORKERS);
    pipeline.hosts = hosts;
}

fn lock(status: &Mutex<ClusterStatus>) -> std::sync::MutexGuard<'_, ClusterStatus> {
    status.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::hosts::HostReport;

    #[test]
    fn the_cluster_view_becomes_the_simulated_cluster_of_the_hosts_that_serve() {
        let entry =
            |name: &str, slots, state| HostEntry { name: name.into(), slots, cache_bytes: 4 << 30, threads: 2, address: None, state };
        let status = ClusterStatus {
            hosts: vec![
                entry("controller", 0, HostState::Local),
                entry("node-0", 2, HostState::Live),
                entry("node-1", 1, HostState::Lost),
                entry("node-2", 1, HostState::Live),
            ],
            changes: 3,
            ..Default::default()
        };
        let report = |name: &str, speed| HostReport {
            def: HostDef::new(name, 1, 4 << 30),
            cache_used: 0,
            workers: 1,
            jobs: 5,
            measured_speed: speed,
        };
        let view = cluster_view(&status, &[report("node-0", Some(0.5)), report("node-2", None)]);
        assert_eq!(view["hosts"][2]["state"], "lost");
        assert_eq!(view["hosts"][2]["slots"], 0, "a lost node offers nothing");
        assert_eq!(view["hosts"][2]["offered_slots"], 1);
        assert_eq!(view["membership_changes"], 3);
        let hosts = simulated_hosts(&view).unwrap();
        let expected = vec![
            HostDef { speed: 0.5, threads: 2, ..HostDef::new("node-0", 2, 4 << 30) },
            HostDef { threads: 2, ..HostDef::new("node-2", 1, 4 << 30) },
        ];
        assert_eq!(hosts, expected);
        let nobody = ClusterStatus { hosts: vec![entry("controller", 0, HostState::Local)], ..Default::default() };
        assert!(simulated_hosts(&cluster_view(&nobody, &[])).unwrap_err().contains("no node has joined"));
        assert!(simulated_hosts(&serde_json::json!({"error": "x"})).unwrap_err().contains("no \"hosts\""));
    }
}
