//! Spreading the cluster's workers over a pipeline's stages.
//!
//! SHEPHERD serves with every GPU of its cluster, HERD sharing them out by load so that
//! the group with the least head-room has as much as any split gives it. FLEX does the
//! same with the host's workers: the cluster holds `max-workers`, and a host that
//! started fewer (a pipeline starting one worker per stage) leaves GPUs unused that no
//! scheduling can make up for. The spreader asks for the whole cluster, stage by stage
//! in proportion to each stage's need — its demand in pieces per second over what one
//! worker serves within the stage's deadline budget — maximising the lowest head-room
//! ([`bottleneck_fill`]), within each stage's replica bounds:
//!
//! - at start, from the configured fan-outs (pieces per request at each stage, a
//!   variant's fan-out shared evenly among its successors);
//! - then one second after start and every period after that, from the demand
//!   measured at each stage (a stage's demand is its
//!   parent's times the pieces it received per piece its parent finished, so a drop at
//!   the parent does not hide demand below it), when the new spread raises the lowest
//!   head-room by at least [`GAIN`] (a worker moved costs a start elsewhere).

use yardmaster_sdk::helpers::{bottleneck_fill, is_offline, pieces_per_request, ModelCatalog, StageGraph};
use yardmaster_sdk::{Config, Duration, Instant, StageId};

use crate::herd::single_gpu_goodput;

/// Smallest gain in the lowest head-room that moves workers between stages.
pub const GAIN: f64 = 1.1;

/// When the first measured spread is due, after start (sooner than a period: the
/// configured fan-outs split a variant's pieces evenly among its successors, which
/// a branching application does not).
pub const FIRST_MEASUREMENT: Duration = 1_000_000_000;

/// The spreader: what one worker of each stage serves, the counts measured since the
/// last spread, and the replicas last asked for.
#[derive(Debug, Clone)]
pub struct Spreader {
    graph: StageGraph,
    /// Per stage: pieces per second one worker serves within the stage's budget.
    goodput: Vec<f64>,
    floors: Vec<u32>,
    caps: Vec<u32>,
    cluster: u32,
    period: Duration,
    next: Instant,
    /// Per stage: pieces that arrived, and pieces whose batch finished, this period.
    arrived: Vec<u64>,
    finished: Vec<u64>,
    /// Per stage: the replicas last asked for (at first, the host's).
    replicas: Vec<u32>,
}

impl Spreader {
    /// A spreader for `config`: each stage's worker serves the model its first stream
    /// uses there, at the largest batch whose latency is at most half the stage's
    /// budget (the SLO less `reserve[stage]`, SHEPHERD's single-GPU goodput), batches
    /// capped by `max_batch`.
    pub fn new(config: &Config, catalog: &ModelCatalog, reserve: &[u64], max_batch: u32, period: Duration) -> Self {
        let stages = config.stages.len();
        let slo = config.streams.iter().map(|s| s.slo).min().unwrap_or(Duration::MAX);
        let goodput = (0..stages)
            .map(|s| {
                let model = config.streams.iter().find_map(|stream| catalog.model_of(stream.id, s as StageId));
                let Some(info) = model.map(|m| catalog.get(m)) else { return f64::INFINITY };
                if info.latency(1) == 0 {
                    return f64::INFINITY;
                }
                let budget = slo.saturating_sub(reserve.get(s).copied().unwrap_or(0));
                let limit = max_batch.min(info.max_batch).max(1);
                let goodput = single_gpu_goodput(|b| info.latency(b), limit, budget);
                // Nothing fits the budget: a worker still serves one at a time.
                if goodput > 0.0 {
                    goodput
                } else {
                    1e9 / info.latency(1) as f64
                }
            })
            .collect();
        let mut replicas = vec![0; stages];
        for worker in &config.workers {
            if let Some(r) = replicas.get_mut(worker.stage as usize) {
                *r += 1;
            }
        }
        Self {
            graph: StageGraph::new(&config.stages),
            goodput,
            floors: config.stages.iter().map(|s| if is_offline(s) { 0 } else { s.min_replicas.max(1) }).collect(),
            caps: config.stages.iter().map(|s| s.max_replicas).collect(),
            cluster: config.max_workers,
            period,
            next: config.now.saturating_add(period.min(FIRST_MEASUREMENT)),
            arrived: vec![0; stages],
            finished: vec![0; stages],
            replicas,
        }
    }

    /// Give every stage below the entry `margin` more head-room than the entry stage
    /// (its workers are counted as serving `1 / (1 + margin)` of their goodput), so that
    /// under overload the entry stage is the bottleneck: it drops what the pipeline
    /// cannot carry before any work is spent on it, and the later stages, not saturated,
    /// finish what it admits instead of dropping pieces of requests already served.
    pub fn with_downstream_margin(mut self, margin: f64) -> Self {
        for s in 0..self.goodput.len() {
            if !self.graph.predecessors(s as StageId).is_empty() {
                self.goodput[s] /= 1.0 + margin.max(0.0);
            }
        }
        self
    }

    /// The replicas per stage the configured fan-outs ask for, when they differ from
    /// the host's: the whole cluster spread by need.
    pub fn initial(&mut self, config: &Config) -> Option<Vec<u32>> {
        let fan_out = |s: StageId| config.stages.get(s as usize).and_then(|st| st.variants.first()).map_or(1.0, |v| v.fan_out);
        let demand = pieces_per_request(&self.graph, &fan_out);
        let wanted = self.spread(&demand);
        self.take(wanted)
    }

    /// A piece arrived at `stage` (a first arrival, not a request handed back).
    pub fn arrived(&mut self, stage: StageId) {
        if let Some(n) = self.arrived.get_mut(stage as usize) {
            *n += 1;
        }
    }

    /// `pieces` pieces of `stage` finished their batch.
    pub fn finished(&mut self, stage: StageId, pieces: u64) {
        if let Some(n) = self.finished.get_mut(stage as usize) {
            *n += pieces;
        }
    }

    /// At a tick at `now`: when a period has passed, the replicas per stage the
    /// measured demand asks for, if they raise the lowest head-room by [`GAIN`]. The
    /// period's counts start again either way.
    pub fn respread(&mut self, now: Instant) -> Option<Vec<u32>> {
        if now < self.next {
            return None;
        }
        self.next = now.saturating_add(self.period);
        let demand = self.measured_demand();
        self.arrived.iter_mut().for_each(|n| *n = 0);
        self.finished.iter_mut().for_each(|n| *n = 0);
        if demand.iter().all(|&d| d <= 0.0) {
            return None;
        }
        let wanted = self.spread(&demand);
        if self.headroom(&wanted, &demand) < GAIN * self.headroom(&self.replicas, &demand) {
            return None;
        }
        self.take(wanted)
    }

    /// Per stage, the period's demand in pieces: an entry stage's arrivals; below a
    /// single parent, the parent's demand times the pieces this stage received per
    /// piece the parent finished (below a parent that finished nothing, the arrivals);
    /// at a merge, one piece per request of the entries above it (the host merges every
    /// live piece of a request into one there), or the arrivals if more. A merge's
    /// arrivals alone count only the requests whose every branch finished: past
    /// capacity, with the branches dropping, that hid most of the merge's demand, and
    /// the spread moved its workers to the stages above it (a diamond's join: 3.97
    /// thousand pieces a second served in the first second at 2× the bound, 2.06
    /// after the first measured spread).
    fn measured_demand(&self) -> Vec<f64> {
        let mut demand = vec![0.0; self.graph.len()];
        for &s in self.graph.topological_order() {
            let i = s as usize;
            let arrived = self.arrived[i] as f64;
            demand[i] = match self.graph.predecessors(s) {
                [] => arrived,
                [p] if self.finished[*p as usize] > 0 => demand[*p as usize] * arrived / self.finished[*p as usize] as f64,
                [_] => arrived,
                _ => {
                    let requests: f64 = self
                        .graph
                        .ancestors(s)
                        .iter()
                        .filter(|&&a| self.graph.predecessors(a).is_empty())
                        .map(|&a| demand[a as usize])
                        .sum();
                    requests.max(arrived)
                }
            };
        }
        demand
    }

    /// Per stage, the share of `demand` (pieces per unit of time) one worker covers:
    /// its goodput over the demand (infinite where there is none).
    fn units(&self, demand: &[f64]) -> Vec<f64> {
        demand.iter().zip(&self.goodput).map(|(&d, &g)| if d > 0.0 { g / d } else { f64::INFINITY }).collect()
    }

    /// The cluster spread by `demand`.
    fn spread(&self, demand: &[f64]) -> Vec<u32> {
        let mut replicas = vec![0; demand.len()];
        bottleneck_fill(&self.units(demand), &self.floors, &self.caps, self.cluster, &mut replicas);
        replicas
    }

    /// The lowest head-room over stages with demand: replicas × the share one worker
    /// covers.
    fn headroom(&self, replicas: &[u32], demand: &[f64]) -> f64 {
        let units = self.units(demand);
        (0..demand.len()).filter(|&s| demand[s] > 0.0).map(|s| replicas[s] as f64 * units[s]).fold(f64::INFINITY, f64::min)
    }

    /// Record `wanted` as asked for, unless it is what was asked already.
    fn take(&mut self, wanted: Vec<u32>) -> Option<Vec<u32>> {
        if wanted == self.replicas {
            return None;
        }
        self.replicas = wanted.clone();
        Some(wanted)
    }
}

#[cfg(test)]
mod tests {
    use yardmaster_sdk::testing::{gpu_worker, linear_variant, one_stage};
    use yardmaster_sdk::{Config, Stream};

    use super::*;

    const MS: u64 = 1_000_000;

    /// A chain `a → b`, one worker each started, a cluster of `cluster`; a piece at
    /// `b` costs three times one at `a`, and `a` emits `fan_out` pieces per request.
    fn chain(cluster: u32, fan_out: f64) -> Config {
        let mut config = one_stage(vec![linear_variant(0, "a", MS, MS, 8)], 8, 1);
        config.stages[0].successors = vec![1];
        config.stages[0].variants[0].fan_out = fan_out;
        let mut b = config.stages[0].clone();
        b.id = 1;
        b.name = "b".into();
        b.successors = vec![];
        b.predecessors = vec![0];
        b.variants = vec![linear_variant(0, "b", 3 * MS, 3 * MS, 8)];
        config.stages.push(b);
        for stage in &mut config.stages {
            stage.min_replicas = 1;
            stage.max_replicas = cluster;
        }
        config.workers = vec![gpu_worker(0, 0), gpu_worker(1, 1)];
        config.max_workers = cluster;
        config.streams = vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 200 * MS }];
        config
    }

    fn spreader(config: &Config) -> Spreader {
        Spreader::new(config, &ModelCatalog::from_config(config), &[0, 0], 128, 5_000 * MS)
    }

    #[test]
    fn the_whole_cluster_is_spread_by_need_at_start() {
        let config = chain(8, 1.0);
        // b needs three times a's workers: 2 and 6 of 8.
        assert_eq!(spreader(&config).initial(&config), Some(vec![2, 6]));
        // Already spread so: nothing to ask.
        let mut spread = chain(8, 1.0);
        spread.workers = (0..8).map(|id| gpu_worker(id, if id < 2 { 0 } else { 1 })).collect();
        assert_eq!(spreader(&spread).initial(&spread), None);
    }

    #[test]
    fn measured_demand_moves_workers_only_when_it_pays() {
        let config = chain(8, 1.0);
        let mut spreader = spreader(&config);
        assert_eq!(spreader.initial(&config), Some(vec![2, 6]));
        // Measured: `a` emits four pieces per piece it finished, three in four of what
        // it received were dropped before they finished. Demand at b is 4 × a's, not
        // what arrived there.
        for _ in 0..100 {
            spreader.arrived(0);
        }
        spreader.finished(0, 25);
        for _ in 0..100 {
            spreader.arrived(1);
        }
        assert_eq!(spreader.respread(999 * MS), None, "before the first measurement is due");
        // Need a : b = 1 : 12 → 1 and 7 (the lowest head-room, b's, rises by 7/6).
        assert_eq!(spreader.respread(1_000 * MS), Some(vec![1, 7]));
        // The same demand again: nothing moves.
        for _ in 0..100 {
            spreader.arrived(0);
        }
        spreader.finished(0, 25);
        for _ in 0..100 {
            spreader.arrived(1);
        }
        assert_eq!(spreader.respread(6_000 * MS), None);
    }

    #[test]
    fn a_merge_s_demand_is_one_piece_per_request_above_it_not_what_reached_it() {
        // A diamond a → {b, c} → d, every piece costing the same: 4 workers a stage of 16.
        let mut config = chain(16, 1.0);
        let stage = |id: StageId, name: &str, successors: Vec<StageId>, predecessors: Vec<StageId>| {
            let mut s = config.stages[1].clone();
            s.id = id;
            s.name = name.into();
            s.successors = successors;
            s.predecessors = predecessors;
            s.variants = vec![linear_variant(0, name, MS, MS, 8)];
            s
        };
        let (b, c, d) = (stage(1, "b", vec![3], vec![0]), stage(2, "c", vec![3], vec![0]), stage(3, "d", vec![], vec![1, 2]));
        config.stages[0].successors = vec![1, 2];
        // One piece to each branch (a variant's fan-out is shared among its successors).
        config.stages[0].variants[0].fan_out = 2.0;
        config.stages.truncate(1);
        config.stages.extend([b, c, d]);
        config.workers = (0..16).map(|id| gpu_worker(id, id / 4)).collect();
        let mut spreader = Spreader::new(&config, &ModelCatalog::from_config(&config), &[0; 4], 128, 5_000 * MS);
        let got = spreader.initial(&config);
        assert_eq!(got, None, "the host's 4 + 4 + 4 + 4 already");
        // Past capacity: 100 requests, of which the branches finished 20 and 25 pieces;
        // the 10 requests both finished reached d. d's demand is 100, not 10: nothing
        // moves. Counting its arrivals, d looked a tenth of the others' need and lost
        // three of its four workers to them (5, 5, 5, 1).
        for _ in 0..100 {
            spreader.arrived(0);
            spreader.arrived(1);
            spreader.arrived(2);
        }
        spreader.finished(0, 100);
        spreader.finished(1, 20);
        spreader.finished(2, 25);
        for _ in 0..10 {
            spreader.arrived(3);
        }
        assert_eq!(spreader.respread(1_000 * MS), None);
    }

    #[test]
    fn a_downstream_margin_makes_the_entry_stage_the_bottleneck() {
        // b needs three times a's workers, 3.6 times with a 20 % margin. Of 13 workers
        // the last goes to a without the margin (4 and 9: b is the bottleneck either
        // way, 3 of a's units), to b with it (3 and 10: a, at 3, is the bottleneck).
        let config = chain(13, 1.0);
        assert_eq!(spreader(&config).initial(&config), Some(vec![4, 9]));
        assert_eq!(spreader(&config).with_downstream_margin(0.2).initial(&config), Some(vec![3, 10]));
    }
}
