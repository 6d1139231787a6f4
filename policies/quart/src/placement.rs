//! Where QUART starts a new replica (spec §3.7, the paper's KeysManager placement):
//! a key stage goes warm to a server that caches its parameters; otherwise, at low
//! contention, a key stage goes where it leaves the most headroom and any other stage
//! best-fits away from key stages; at high contention, key replicas are dispersed over
//! the GPU servers by the least Kullback–Leibler divergence from the uniform spread.

use yardmaster_sdk::{HostInfo, HostStats, Placement};

/// One server as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// Host id.
    pub id: u32,
    /// Device slots (GPUs).
    pub slots: u32,
    /// Slots free now.
    pub free: u32,
    /// Replicas (starting or serving) per stage.
    pub replicas: Vec<u32>,
    /// Stages whose parameters (variant 0) the server caches.
    pub cached: Vec<u32>,
}

/// The cluster's servers during one round of placements; each placement updates it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    servers: Vec<Server>,
    /// Free-slot fraction at or above which contention is low (`θ_c`).
    low_contention: f64,
}

impl Cluster {
    /// The cluster from the configuration's hosts and a snapshot's host states.
    pub fn from_snapshot(hosts: &[HostInfo], stats: &[HostStats], low_contention: f64) -> Self {
        let servers = stats
            .iter()
            .map(|s| Server {
                id: s.id,
                slots: hosts.iter().find(|h| h.id == s.id).map_or(s.free_slots, |h| h.slots),
                free: s.free_slots,
                replicas: s.replicas.clone(),
                cached: s.cached.iter().filter(|c| c.variant == 0).map(|c| c.stage).collect(),
            })
            .collect();
        Self::new(servers, low_contention)
    }

    /// A cluster of `servers`.
    pub fn new(servers: Vec<Server>, low_contention: f64) -> Self {
        Self { servers, low_contention }
    }

    /// The servers as placed so far.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// Place one replica of `stage` (`key`: the stage is on the key-stage list, whose
    /// membership `is_key` tells for every stage); the server chosen, updated as the
    /// host will update it (one slot fewer, one replica more, the parameters cached).
    /// `None` when no server has a free slot.
    pub fn place(&mut self, stage: u32, key: bool, is_key: &dyn Fn(u32) -> bool) -> Option<Placement> {
        let chosen = self.choose(stage, key, is_key)?;
        let server = &mut self.servers[chosen];
        server.free -= 1;
        if let Some(count) = server.replicas.get_mut(stage as usize) {
            *count += 1;
        }
        if !server.cached.contains(&stage) {
            server.cached.push(stage);
        }
        Some(Placement { host: server.id, slot: None })
    }

    /// Place one replica of `stage` on a server that caches its parameters and has a
    /// free slot (the one with the most free slots), as [`Cluster::place`] updates it;
    /// `None` when there is none. A control places these warm starts of every stage
    /// before the others take the free slots.
    pub fn place_warm(&mut self, stage: u32) -> Option<Placement> {
        let chosen = (0..self.servers.len())
            .filter(|&m| self.servers[m].free > 0 && self.servers[m].cached.contains(&stage))
            .min_by_key(|&m| (std::cmp::Reverse(self.servers[m].free), self.servers[m].id))?;
        let server = &mut self.servers[chosen];
        server.free -= 1;
        if let Some(count) = server.replicas.get_mut(stage as usize) {
            *count += 1;
        }
        Some(Placement { host: server.id, slot: None })
    }

    /// Index of the server for one replica (spec §3.7, steps 1–3).
    fn choose(&self, stage: u32, key: bool, is_key: &dyn Fn(u32) -> bool) -> Option<usize> {
        let eligible: Vec<usize> = (0..self.servers.len()).filter(|&m| self.servers[m].free > 0).collect();
        if eligible.is_empty() {
            return None;
        }
        let key_replicas =
            |m: usize| -> u32 { self.servers[m].replicas.iter().enumerate().filter(|(s, _)| is_key(*s as u32)).map(|(_, n)| *n).sum() };
        // 1. A key stage whose parameters a server caches starts warm there.
        if key {
            let warm = eligible.iter().copied().filter(|&m| self.servers[m].cached.contains(&stage));
            if let Some(m) = warm.min_by_key(|&m| (std::cmp::Reverse(self.servers[m].free), key_replicas(m), self.servers[m].id)) {
                return Some(m);
            }
        }
        let slots: u32 = self.servers.iter().map(|s| s.slots).sum();
        let free: u32 = self.servers.iter().map(|s| s.free).sum();
        let low = slots > 0 && free as f64 / slots as f64 >= self.low_contention;
        if !key {
            // Best fit, first among servers with no key replicas or key entries.
            let clear = |m: usize| key_replicas(m) == 0 && !self.servers[m].cached.iter().any(|&s| is_key(s));
            let best_fit =
                |candidates: &mut dyn Iterator<Item = usize>| candidates.min_by_key(|&m| (self.servers[m].free, self.servers[m].id));
            return best_fit(&mut eligible.iter().copied().filter(|&m| clear(m))).or_else(|| best_fit(&mut eligible.iter().copied()));
        }
        if low {
            // 2. Low contention: the key replica keeps headroom next to it.
            return eligible.iter().copied().min_by_key(|&m| (std::cmp::Reverse(self.servers[m].free), self.servers[m].id));
        }
        // 3. High contention: disperse key replicas (least KL divergence from uniform).
        let counts: Vec<u32> = (0..self.servers.len()).map(key_replicas).collect();
        let total = counts.iter().sum::<u32>() as f64 + 1.0;
        let uniform = 1.0 / self.servers.len() as f64;
        let divergence = |candidate: usize| -> f64 {
            counts
                .iter()
                .enumerate()
                .map(|(j, &k)| {
                    let p = (k as f64 + if j == candidate { 1.0 } else { 0.0 }) / total;
                    if p > 0.0 {
                        p * (p / uniform).ln()
                    } else {
                        0.0
                    }
                })
                .sum()
        };
        eligible.iter().copied().min_by(|&a, &b| {
            divergence(a)
                .total_cmp(&divergence(b))
                .then(self.servers[b].free.cmp(&self.servers[a].free))
                .then(self.servers[a].id.cmp(&self.servers[b].id))
        })
    }
}

#[cfg(test)]
mod tests {
    //! Spec property 8 (placement), on the placement rule itself; the end-to-end test
    //! through the engine is in the workspace's `tests/` (`quart_placement.rs`).

    use super::*;

    /// `n` servers of 4 slots with `free[m]` free, `stages` stages, nothing cached.
    fn cluster(free: &[u32], stages: usize) -> Cluster {
        let servers = free
            .iter()
            .enumerate()
            .map(|(m, &f)| Server { id: m as u32, slots: 4, free: f, replicas: vec![0; stages], cached: Vec::new() })
            .collect();
        Cluster::new(servers, 0.25)
    }

    #[test]
    fn at_low_contention_a_key_replica_takes_the_emptiest_server_and_others_best_fit() {
        let key = |s: u32| s == 0;
        let mut c = cluster(&[2, 4, 3, 1], 2);
        assert_eq!(c.place(0, true, &key).unwrap().host, 1, "most free GPUs");
        // Non-key: best fit = fewest free GPUs, away from key replicas (server 1 now).
        assert_eq!(c.place(1, false, &key).unwrap().host, 3);
        // Server 3 is full now; the next best fit is server 0 (2 free).
        assert_eq!(c.place(1, false, &key).unwrap().host, 0);
    }

    #[test]
    fn a_non_key_replica_avoids_servers_with_key_replicas_or_key_entries_when_it_can() {
        let key = |s: u32| s == 0;
        let mut c = cluster(&[1, 2, 3], 2);
        c.servers[0].replicas[0] = 1; // a key replica on server 0
        c.servers[1].cached.push(0); // a key entry on server 1
        assert_eq!(c.place(1, false, &key).unwrap().host, 2, "the only server clear of key stages");
        let mut crowded = cluster(&[1, 2], 2);
        crowded.servers[0].replicas[0] = 1;
        crowded.servers[1].replicas[0] = 1;
        assert_eq!(crowded.place(1, false, &key).unwrap().host, 0, "no clear server: plain best fit");
    }

    #[test]
    fn a_key_stage_with_a_cached_entry_on_a_server_with_a_free_gpu_always_goes_there() {
        let key = |s: u32| s < 2;
        for free in [[4, 4, 1, 4], [1, 1, 1, 1]] {
            let mut c = cluster(&free, 2);
            c.servers[2].cached.push(1);
            assert_eq!(c.place(1, true, &key).unwrap().host, 2, "free {free:?}");
        }
        // Not when that server is full.
        let mut c = cluster(&[4, 4, 0, 4], 2);
        c.servers[2].cached.push(1);
        assert_ne!(c.place(1, true, &key).unwrap().host, 2);
    }

    #[test]
    fn at_high_contention_key_replicas_spread_so_per_server_counts_differ_by_at_most_one() {
        // 8 servers of 4 GPUs; 3 eligible with 2 free each: 6 free of 32 (< 0.25).
        let key = |s: u32| s < 3;
        for k in 1..=6u32 {
            let mut c = cluster(&[2, 2, 2, 0, 0, 0, 0, 0], 4);
            for i in 0..k {
                assert!(c.place(i % 3, true, &key).is_some());
            }
            let counts: Vec<u32> = c.servers[..3].iter().map(|s| s.replicas[..3].iter().sum()).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert_eq!(counts.iter().sum::<u32>(), k);
            assert!(hi - lo <= 1, "K = {k}: key replicas per eligible server {counts:?}");
        }
        // Key replicas already on a server count: the next ones go elsewhere first.
        let mut c = cluster(&[2, 2, 2, 0, 0, 0, 0, 0], 4);
        c.servers[0].replicas[1] = 2;
        assert_ne!(c.place(0, true, &key).unwrap().host, 0);
        assert_ne!(c.place(0, true, &key).unwrap().host, 0);
    }

    #[test]
    fn with_no_free_slot_nothing_is_placed() {
        let mut c = cluster(&[0, 0], 1);
        assert_eq!(c.place(0, true, &|_| true), None);
    }
}
