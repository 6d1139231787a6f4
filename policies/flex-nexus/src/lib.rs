//! `flex-nexus`: the Nexus-like baseline of SHEPHERD's evaluation (spec §6): periodic,
//! per-stream provisioning without preemption.
//!
//! Every epoch (60 s; the first plan at the first tick) the policy plans each stage's
//! workers for the *peak* one-second arrival rate of every session (a stream at a
//! stage) seen since the last plan, by squishy bin packing: a session gets
//! `⌊rate / throughput⌋` saturated GPUs running its batch `b` with `2·l(b) ≤ SLO`, and
//! its residual rate shares GPUs with other residuals (merged in decreasing occupancy
//! while `Σ l(b_i) ≤ d` and `d + l(b_i) ≤ SLO_i` hold for the merged duty cycle `d`).
//! When the plan needs more GPUs than exist, every rate is scaled down until it fits.
//! At run time a request goes to one of its session's GPUs by smooth weighted
//! round-robin; each GPU cycles round-robin through its sessions, running up to `b_i`
//! queued requests per turn (fewer when the most urgent one could not finish), and
//! drops requests whose deadline cannot be met even alone. Before the first plan every
//! worker serves every session.
//!
//! **Pipelines** (several stages; SHEPHERD serves one model per request, Nexus itself
//! serves dataflows of models): a stream's SLO is split over the stages by Nexus's
//! complex-query analysis ([`split_slo`], for the workers the cluster has),
//! and each stage plans and checks deadlines against its own share — its session's
//! SLO is the stage's budget, and a request's deadline there is its end-to-end
//! deadline less the budgets of the stages after it on the longest path. Without the
//! split every stage planned batches for the whole SLO and served with the whole
//! end-to-end deadline, and on a fan-out or a join the later stages received requests
//! that could no longer finish (on a generated fan-out with a join, 39 % on time at a
//! quarter of capacity; docs/flex.md). A single stage keeps the whole SLO.
//!
//! Parameters: `epoch_s` (60), `max_batch` (128).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use yardmaster_sdk::helpers::{dispatch_idle, pieces_per_request, ModelCatalog, ModelInfo, StageGraph};
use yardmaster_sdk::{Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId, Snapshot, StageId, WorkerId};

/// Queue order: (deadline, arrival, id).
type Key = (Instant, Instant, RequestId);

/// A session: a stream's requests at a stage.
type Session = (StageId, u32);

/// One GPU's share of a plan: its sessions and their batch sizes, in turn order.
#[derive(Debug, Clone, Default, PartialEq)]
struct GpuPlan {
    entries: Vec<(u32, u32)>,
}

/// A smooth weighted round-robin over a session's GPUs.
#[derive(Debug, Clone, Default)]
struct Targets {
    /// (worker, weight, current credit).
    workers: Vec<(WorkerId, f64, f64)>,
}

impl Targets {
    fn pick(&mut self) -> Option<WorkerId> {
        let total: f64 = self.workers.iter().map(|w| w.1).sum();
        if self.workers.is_empty() || total <= 0.0 {
            return None;
        }
        for w in &mut self.workers {
            w.2 += w.1;
        }
        let best = (0..self.workers.len()).max_by(|&a, &b| self.workers[a].2.total_cmp(&self.workers[b].2).then(b.cmp(&a)))?;
        self.workers[best].2 -= total;
        Some(self.workers[best].0)
    }
}

/// The Nexus-like policy.
pub struct Nexus {
    catalog: ModelCatalog,
    max_batch: u32,
    epoch: u64,
    /// Per GPU: its sessions.
    gpus: BTreeMap<WorkerId, GpuPlan>,
    /// Per GPU: the next entry of its round-robin.
    cursor: BTreeMap<WorkerId, usize>,
    /// Per session: where its requests go.
    targets: HashMap<Session, Targets>,
    /// Per (GPU, stream): queued requests.
    queues: BTreeMap<(WorkerId, u32), BTreeSet<Key>>,
    /// Where each queued request sits: (GPU, stream, model, key).
    where_queued: HashMap<RequestId, (WorkerId, u32, usize, Key)>,
    /// Per session: arrivals in the current second, and the peak so far this epoch.
    second: (u64, HashMap<Session, (u64, u64)>),
    planned_at: Option<Instant>,
    /// Per session: its stage's share of the stream's SLO (the session's SLO in the
    /// plan) and the time kept for the stages after it (subtracted from a request's
    /// deadline there). Absent: the whole SLO, nothing kept.
    shares: HashMap<Session, (u64, u64)>,
}

/// The most a plan scales the measured rates up to use every worker of a stage.
const MAX_SCALE: f64 = 1e6;

/// Most grid steps [`split_slo`] considers (the grid coarsens for long SLOs).
const SPLIT_STEPS: u64 = 250;

/// Per session of a pipeline: its stage's share of the stream's SLO ([`split_slo`])
/// and the sum of the shares of the stages after it along the longest downstream path.
/// Empty for a single stage; a stream whose SLO no split fits keeps the whole SLO at
/// every stage.
fn slo_shares(ctx: &Ctx, catalog: &ModelCatalog, max_batch: u32) -> HashMap<Session, (u64, u64)> {
    let config = ctx.config();
    let mut shares = HashMap::new();
    if config.stages.len() < 2 {
        return shares;
    }
    let graph = StageGraph::new(&config.stages);
    let mut workers = vec![0u32; graph.len()];
    for w in ctx.workers() {
        if let Some(n) = workers.get_mut(w.info.stage as usize) {
            *n += 1;
        }
    }
    for stream in &config.streams {
        let model = |s: StageId| catalog.model_of(stream.id, s).map(|m| catalog.get(m));
        let fan_out = |s: StageId| {
            let stage = config.stages.iter().find(|st| st.id == s);
            let variant = model(s).map_or(0, |m| m.variant);
            stage.and_then(|st| st.variants.iter().find(|v| v.id == variant).or(st.variants.first())).map_or(1.0, |v| v.fan_out)
        };
        let pieces = pieces_per_request(&graph, &fan_out);
        // Requests per second stage `s` carries within a budget: its workers at the
        // best batch that fits (Nexus's `2·l(b) ≤ budget`), over its pieces per request.
        let rate = |s: StageId, budget: u64| -> f64 {
            let Some(info) = model(s) else { return f64::INFINITY };
            let need = pieces[s as usize];
            let limit = info.max_batch.min(max_batch).max(1);
            if need <= 0.0 || info.latency(limit) == 0 {
                return f64::INFINITY;
            }
            let best = (1..=limit)
                .filter(|&b| 2 * info.latency(b) <= budget)
                .map(|b| b as f64 / info.latency(b).max(1) as f64)
                .fold(0.0, f64::max);
            workers[s as usize] as f64 * best * 1e9 / need
        };
        let Some(budget) = split_slo(&graph, stream.slo, rate) else { continue };
        let after = graph.downstream_reserve(|s| budget[s as usize] as f64, stream.slo as f64);
        for stage in &config.stages {
            let s = stage.id as usize;
            shares.insert((stage.id, stream.id), (budget[s], after[s] as u64));
        }
    }
    shares
}

/// Nexus's split of an end-to-end `slo` over the stages (its complex-query analysis),
/// for a cluster whose workers per stage are fixed: the stages are grouped into levels
/// ([`StageGraph::levels`]; the branches of a fan-out share their level's budget), and
/// the split maximises the request rate the tightest stage carries, `rate(stage,
/// budget)`, by dynamic programming over a grid of at most [`SPLIT_STEPS`] steps.
/// Nexus minimises the GPUs a rate needs; with the workers given, the same plan is the
/// one that carries the most (Nexus with a fixed cluster scales the rate until its plan
/// fits). What the tightest stage leaves unused is shared out in proportion, so the
/// budgets fill the SLO along the longest path. `None` when no split lets every stage
/// run a batch of one.
fn split_slo(graph: &StageGraph, slo: u64, rate: impl Fn(StageId, u64) -> f64) -> Option<Vec<u64>> {
    let grid = slo.div_ceil(SPLIT_STEPS).max(1);
    let steps = (slo / grid) as usize;
    let levels = graph.levels();
    let level_rate: Vec<Vec<f64>> = levels
        .iter()
        .map(|level| (0..=steps).map(|g| level.iter().map(|&s| rate(s, g as u64 * grid)).fold(f64::INFINITY, f64::min)).collect())
        .collect();
    // best[i][g]: the most the levels i.. carry within g steps; choice[i][g]: level i's steps.
    let depth = levels.len();
    let mut best = vec![vec![f64::INFINITY; steps + 1]; depth + 1];
    let mut choice = vec![vec![0usize; steps + 1]; depth];
    for i in (0..depth).rev() {
        for g in 0..=steps {
            best[i][g] = -1.0;
            for own in 0..=g {
                let carried = level_rate[i][own].min(best[i + 1][g - own]);
                if carried > best[i][g] {
                    best[i][g] = carried;
                    choice[i][g] = own;
                }
            }
        }
    }
    if best[0][steps] <= 0.0 {
        return None;
    }
    let mut budget = vec![0u64; graph.len()];
    let mut left = steps;
    for (i, level) in levels.iter().enumerate() {
        let own = choice[i][left];
        left -= own;
        for &s in level {
            budget[s as usize] = own as u64 * grid;
        }
    }
    let longest = graph.longest_path_through(graph.topological_order()[0], |s| budget[s as usize] as f64);
    let longest = (0..graph.len() as StageId).map(|s| graph.longest_path_through(s, |k| budget[k as usize] as f64)).fold(longest, f64::max);
    if longest > 0.0 {
        let scale = slo as f64 / longest;
        budget.iter_mut().for_each(|b| *b = (*b as f64 * scale) as u64);
    }
    Some(budget)
}

impl Nexus {
    fn model_of(&self, session: Session) -> Option<&ModelInfo> {
        self.catalog.model_of(session.1, session.0).map(|m| self.catalog.get(m))
    }

    /// Every worker serves every stream, as it would before any measurement.
    fn serve_everything(&mut self, ctx: &Ctx) {
        let streams: Vec<u32> = ctx.config().streams.iter().map(|s| s.id).collect();
        let stages: Vec<StageId> = ctx.config().stages.iter().map(|s| s.id).collect();
        self.gpus.clear();
        self.targets.clear();
        for w in ctx.workers() {
            let entries = streams.iter().map(|&s| (s, self.max_batch)).collect();
            self.gpus.insert(w.info.id, GpuPlan { entries });
        }
        for &stage in &stages {
            for &stream in &streams {
                let workers = ctx.workers().filter(|w| w.info.stage == stage).map(|w| (w.info.id, 1.0, 0.0)).collect();
                self.targets.insert((stage, stream), Targets { workers });
            }
        }
    }

    /// Squishy bin packing of every stage for the peak rates.
    fn plan(&mut self, ctx: &Ctx) {
        let peaks: HashMap<Session, f64> = self.second.1.iter().map(|(s, (now, peak))| (*s, (*now).max(*peak) as f64)).collect();
        self.gpus.clear();
        self.targets.clear();
        for stage in ctx.config().stages.iter().map(|s| s.id).collect::<Vec<_>>() {
            // Each session's SLO is its stage's share of its stream's.
            let slo: HashMap<u32, u64> =
                ctx.config().streams.iter().map(|s| (s.id, self.shares.get(&(stage, s.id)).map_or(s.slo, |share| share.0))).collect();
            let workers: Vec<WorkerId> = ctx.workers().filter(|w| w.info.stage == stage).map(|w| w.info.id).collect();
            let mut sessions: Vec<(u32, f64)> = peaks.iter().filter(|(s, r)| s.0 == stage && **r > 0.0).map(|(s, r)| (s.1, *r)).collect();
            sessions.sort_by_key(|s| s.0);
            let fits = |scale: f64| self.pack(stage, &sessions, scale, &slo).len() <= workers.len();
            // Scale the rates down until the plan fits the stage's workers, or up until
            // it uses them all: a worker the plan leaves out would stay idle for the
            // epoch while the planned ones run saturated.
            let (mut lo, mut hi) = (0.0, 1.0);
            if !sessions.is_empty() && fits(1.0) {
                lo = 1.0;
                hi = 2.0;
                while hi < MAX_SCALE && fits(hi) {
                    lo = hi;
                    hi *= 2.0;
                }
            }
            let mut scale = 1.0;
            if !sessions.is_empty() {
                for _ in 0..30 {
                    let mid = (lo + hi) / 2.0;
                    if fits(mid) {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                scale = lo;
            }
            let plan = self.pack(stage, &sessions, scale, &slo);
            for (gpu, worker) in plan.into_iter().zip(&workers) {
                for &(stream, _, weight) in &gpu {
                    self.targets.entry((stage, stream)).or_default().workers.push((*worker, weight, 0.0));
                }
                self.gpus.insert(*worker, GpuPlan { entries: gpu.iter().map(|&(s, b, _)| (s, b)).collect() });
            }
            // Sessions the plan left out (no rate yet, or scaled to nothing) share the
            // first GPU rather than being refused.
            for s in ctx.config().streams.iter().map(|s| s.id) {
                let targets = self.targets.entry((stage, s)).or_default();
                if targets.workers.is_empty() {
                    if let Some(&w) = workers.first() {
                        targets.workers.push((w, 1.0, 0.0));
                        self.gpus.entry(w).or_default().entries.push((s, self.max_batch));
                    }
                }
            }
        }
        // Requests already queued follow the new plan.
        let queued: Vec<(RequestId, (WorkerId, u32, usize, Key))> = self.where_queued.drain().collect();
        self.queues.clear();
        let mut queued = queued;
        queued.sort_by_key(|(_, (_, _, _, key))| *key);
        for (_, (worker, stream, model, key)) in queued {
            let stage = ctx.worker(worker).map_or(self.catalog.get(model).stage, |w| w.info.stage);
            self.enqueue(stage, stream, model, key);
        }
        self.cursor.clear();
    }

    /// GPUs for `sessions` (stream, rate) of `stage` with every rate times `scale`: per
    /// GPU, (stream, batch, routing weight).
    fn pack(&self, stage: StageId, sessions: &[(u32, f64)], scale: f64, slo: &HashMap<u32, u64>) -> Vec<Vec<(u32, u32, f64)>> {
        let mut gpus: Vec<Vec<(u32, u32, f64)>> = Vec::new();
        // Residual sessions: (stream, rate per ns, batch, duty cycle, occupancy).
        let mut residuals: Vec<(u32, f64, u32, f64, f64)> = Vec::new();
        // Sessions of models that take no time (a pseudo-task): one GPU serves them all.
        let mut free: Vec<(u32, u32, f64)> = Vec::new();
        for &(stream, rate) in sessions {
            let Some(info) = self.model_of((stage, stream)) else { continue };
            let slo = slo.get(&stream).copied().unwrap_or(u64::MAX / 4);
            let limit = self.max_batch.min(info.max_batch);
            let rate = rate * scale / 1e9;
            if rate <= 0.0 || info.latency(1) > slo {
                continue;
            }
            if info.latency(limit) == 0 {
                free.push((stream, limit, rate));
                continue;
            }
            let saturated = (1..=limit).rev().find(|&b| 2 * info.latency(b) <= slo).unwrap_or(1);
            let throughput = saturated as f64 / info.latency(saturated) as f64;
            let full = (rate / throughput).floor() as usize;
            for _ in 0..full {
                gpus.push(vec![(stream, saturated, throughput)]);
            }
            let residual = rate - full as f64 * throughput;
            if residual * 1e9 < 1e-6 {
                continue;
            }
            let batch = (1..=limit).rev().find(|&b| b as f64 / residual + info.latency(b) as f64 <= slo as f64).unwrap_or(1);
            let duty = batch as f64 / residual;
            residuals.push((stream, residual, batch, duty, info.latency(batch) as f64 / duty));
        }
        residuals.sort_by(|a, b| b.4.total_cmp(&a.4).then(a.0.cmp(&b.0)));
        // Shared GPUs: duty cycle and members (stream, rate).
        let mut shared: Vec<(f64, Vec<(u32, f64)>)> = Vec::new();
        for (stream, rate, _, duty, _) in residuals {
            let merged = shared.iter().position(|(d, members)| {
                let d = d.min(duty);
                let mut total = 0.0;
                for &(s, r) in members.iter().chain(std::iter::once(&(stream, rate))) {
                    let Some(info) = self.model_of((stage, s)) else { return false };
                    let b = (d * r).ceil().max(1.0) as u32;
                    let l = info.latency(b) as f64;
                    total += l;
                    if d + l > slo.get(&s).copied().unwrap_or(u64::MAX / 4) as f64 {
                        return false;
                    }
                }
                total <= d
            });
            match merged {
                Some(i) => {
                    shared[i].0 = shared[i].0.min(duty);
                    shared[i].1.push((stream, rate));
                }
                None => shared.push((duty, vec![(stream, rate)])),
            }
        }
        for (d, members) in shared {
            gpus.push(members.iter().map(|&(s, r)| (s, (d * r).ceil().max(1.0) as u32, r)).collect());
        }
        if !free.is_empty() {
            gpus.push(free);
        }
        gpus
    }

    fn enqueue(&mut self, stage: StageId, stream: u32, model: usize, key: Key) -> bool {
        let Some(worker) = self.targets.get_mut(&(stage, stream)).and_then(Targets::pick) else { return false };
        self.queues.entry((worker, stream)).or_default().insert(key);
        self.where_queued.insert(key.2, (worker, stream, model, key));
        true
    }

    /// The next batch for an idle GPU: its sessions in turn, up to `b_i` requests.
    fn next_batch(&mut self, ctx: &mut Ctx, worker: WorkerId) -> Option<(usize, Vec<RequestId>)> {
        let now = ctx.now();
        let stage = ctx.worker(worker)?.info.stage;
        let entries = self.gpus.get(&worker)?.entries.clone();
        let start = self.cursor.get(&worker).copied().unwrap_or(0);
        for turn in 0..entries.len() {
            let index = (start + turn) % entries.len();
            let (stream, batch) = entries[index];
            let Some(model) = self.catalog.model_of(stream, stage) else { continue };
            let info = self.catalog.get(model).clone();
            let Some(queue) = self.queues.get_mut(&(worker, stream)) else { continue };
            while let Some(&head) = queue.first() {
                if now + info.latency(1) <= head.0 {
                    break;
                }
                queue.pop_first();
                self.where_queued.remove(&head.2);
                ctx.drop_request(head.2, DropReason::DeadlineUnreachable);
            }
            let Some(&head) = queue.first() else { continue };
            let fits = info.largest_batch_within(head.0 - now, batch.min(info.max_batch)).max(1);
            let ids: Vec<RequestId> = (0..fits).filter_map(|_| queue.pop_first()).map(|k| k.2).collect();
            for id in &ids {
                self.where_queued.remove(id);
            }
            self.cursor.insert(worker, index + 1);
            return Some((model, ids));
        }
        None
    }
}

impl Policy for Nexus {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let epoch_s: f64 = ctx.param_or("epoch_s", 60.0)?;
        if epoch_s.is_nan() || epoch_s <= 0.0 {
            return Err("parameter `epoch_s` must be positive".into());
        }
        let max_batch: u32 = ctx.param_or("max_batch", 128)?;
        if max_batch == 0 {
            return Err("parameter `max_batch` must be at least 1".into());
        }
        let mut nexus = Self {
            catalog: ModelCatalog::from_config(ctx.config()),
            max_batch,
            epoch: (epoch_s * 1e9) as u64,
            gpus: BTreeMap::new(),
            cursor: BTreeMap::new(),
            targets: HashMap::new(),
            queues: BTreeMap::new(),
            where_queued: HashMap::new(),
            second: (0, HashMap::new()),
            planned_at: None,
            shares: HashMap::new(),
        };
        nexus.shares = slo_shares(ctx, &nexus.catalog, max_batch);
        nexus.serve_everything(ctx);
        Ok(nexus)
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        let Some(model) = self.catalog.model_of(request.stream, request.stage) else {
            ctx.drop_request(request.id, DropReason::Policy);
            return;
        };
        // Peak of one-second windows.
        let second = ctx.now() / 1_000_000_000;
        if second != self.second.0 {
            for (count, peak) in self.second.1.values_mut() {
                *peak = (*peak).max(*count);
                *count = 0;
            }
            self.second.0 = second;
        }
        self.second.1.entry((request.stage, request.stream)).or_default().0 += 1;
        if let Some((worker, stream, _, old)) = self.where_queued.remove(&request.id) {
            if let Some(q) = self.queues.get_mut(&(worker, stream)) {
                q.remove(&old);
            }
        }
        let kept = self.shares.get(&(request.stage, request.stream)).map_or(0, |share| share.1);
        let key = (request.deadline.saturating_sub(kept), request.arrived_at, request.id);
        if !self.enqueue(request.stage, request.stream, model, key) {
            ctx.drop_request(request.id, DropReason::Policy);
        }
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        if let Some((worker, stream, _, key)) = self.where_queued.remove(&request) {
            if let Some(q) = self.queues.get_mut(&(worker, stream)) {
                q.remove(&key);
            }
        }
    }

    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: Snapshot) {
        let now = ctx.now();
        if self.planned_at.is_none_or(|at| now.saturating_sub(at) >= self.epoch) {
            self.plan(ctx);
            self.planned_at = Some(now);
            for (count, peak) in self.second.1.values_mut() {
                *count = 0;
                *peak = 0;
            }
        }
    }

    fn on_worker_added(&mut self, ctx: &mut Ctx, worker: yardmaster_sdk::Worker) {
        // Until the next plan a new worker serves every stream of its stage.
        let streams: Vec<u32> = ctx.config().streams.iter().map(|s| s.id).collect();
        self.gpus.insert(worker.id, GpuPlan { entries: streams.iter().map(|&s| (s, self.max_batch)).collect() });
        for s in streams {
            self.targets.entry((worker.stage, s)).or_default().workers.push((worker.id, 1.0, 0.0));
        }
    }

    fn on_worker_removed(&mut self, ctx: &mut Ctx, worker: WorkerId) {
        self.gpus.remove(&worker);
        for targets in self.targets.values_mut() {
            targets.workers.retain(|w| w.0 != worker);
        }
        let moved: Vec<(RequestId, (WorkerId, u32, usize, Key))> =
            self.where_queued.iter().filter(|(_, v)| v.0 == worker).map(|(k, v)| (*k, *v)).collect();
        for (id, (_, stream, model, key)) in moved {
            self.where_queued.remove(&id);
            if let Some(q) = self.queues.get_mut(&(worker, stream)) {
                q.remove(&key);
            }
            let stage = self.catalog.get(model).stage;
            if !self.enqueue(stage, stream, model, key) {
                ctx.drop_request(id, DropReason::Policy);
            }
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        dispatch_idle(ctx, |ctx, worker, _| {
            let (model, batch) = self.next_batch(ctx, worker)?;
            Some((self.catalog.get(model).variant, batch))
        });
    }
}

yardmaster_sdk::export_policy!(Nexus);

#[cfg(test)]
mod tests {
    use super::*;

    use yardmaster_sdk::testing::{linear_variant, one_stage, MS};
    use yardmaster_sdk::{Driver, NullHost, Stream};

    /// RN18 (α 0.22 ms, β 3.74 ms) and RS269 (α 4.37 ms, β 74.2 ms) on `workers` GPUs.
    fn nexus(workers: u32) -> Driver<Nexus> {
        let variants = vec![linear_variant(0, "rn18", 220_000, 3_740_000, 128), linear_variant(1, "rs269", 4_370_000, 74_200_000, 128)];
        let mut config = one_stage(variants, 128, workers);
        config.streams = vec![
            Stream { id: 0, name: "rn18".into(), entry: 0, slo: 100 * MS },
            Stream { id: 1, name: "rs269".into(), entry: 0, slo: 250 * MS },
        ];
        Driver::<Nexus>::new(config, Box::new(NullHost::new(0, 1))).unwrap().0
    }

    #[test]
    fn squishy_bin_packing_saturates_then_merges_residuals() {
        let driver = nexus(8);
        let policy = driver.policy();
        let slo: HashMap<u32, u64> = [(0, 100 * MS), (1, 250 * MS)].into_iter().collect();
        // RN18 at 5000 req/s: b = 128 (2·l(128) = 63.8 ms ≤ 100), 4012 req/s per GPU →
        // one saturated GPU and a residual of ~988 req/s; RS269 at 10 req/s: residual.
        let gpus = policy.pack(0, &[(0, 5_000.0), (1, 10.0)], 1.0, &slo);
        assert_eq!(gpus[0].len(), 1);
        assert_eq!((gpus[0][0].0, gpus[0][0].1), (0, 128));
        let residual: Vec<&Vec<(u32, u32, f64)>> = gpus[1..].iter().collect();
        assert!(!residual.is_empty());
        for gpu in &residual {
            // The merged duty cycle must fit every member's batch, and each SLO.
            let total: u64 = gpu.iter().map(|&(s, b, _)| policy.catalog.get(s as usize).latency(b)).sum();
            let duty = gpu.iter().map(|&(_, b, r)| b as f64 / r * 1e9).fold(f64::INFINITY, f64::min);
            assert!(total as f64 <= duty * 1.01, "{gpu:?}");
        }
        // Scaled down, the same load fits fewer GPUs.
        assert!(policy.pack(0, &[(0, 5_000.0), (1, 10.0)], 0.1, &slo).len() < gpus.len());
    }

    #[test]
    fn the_slo_split_gives_the_stage_with_fewer_workers_the_longer_budget() {
        // Two stages of the same linear model (1 ms + 1 ms a request), stage 0 with one
        // worker and stage 1 with four: the split carries the most where stage 0 gets
        // the larger share, and the shares fill the SLO.
        let graph = StageGraph::chain(2);
        let workers = [1.0, 4.0];
        let rate = |s: StageId, budget: u64| {
            let best = (1..=128u64).filter(|&b| 2 * (MS + b * MS) <= budget).map(|b| b as f64 / (MS + b * MS) as f64).fold(0.0, f64::max);
            workers[s as usize] * best * 1e9
        };
        let budget = split_slo(&graph, 100 * MS, rate).unwrap();
        assert!(budget[0] > budget[1], "{budget:?}");
        assert!(budget.iter().sum::<u64>() <= 100 * MS && budget.iter().sum::<u64>() >= 99 * MS, "{budget:?}");
        // No split lets a stage whose batch of one takes longer than the SLO run.
        assert_eq!(split_slo(&graph, MS, rate), None);
    }

    #[test]
    fn sessions_that_take_no_time_share_one_gpu_with_finite_weights() {
        // Before, a model that takes no time had an infinite throughput: its session's
        // residual rate was NaN (0 × ∞) and so was its routing weight.
        let mut config = one_stage(vec![linear_variant(0, "source", 0, 0, 128)], 128, 1);
        config.streams = vec![
            Stream { id: 0, name: "source".into(), entry: 0, slo: 100 * MS },
            Stream { id: 1, name: "source/b".into(), entry: 0, slo: 100 * MS },
        ];
        let (driver, _) = Driver::<Nexus>::new(config, Box::new(NullHost::new(0, 1))).unwrap();
        let slo: HashMap<u32, u64> = [(0, 100 * MS), (1, 100 * MS)].into_iter().collect();
        let gpus = driver.policy().pack(0, &[(0, 5_000.0), (1, 300.0)], 1.0, &slo);
        assert_eq!(gpus.len(), 1, "{gpus:?}");
        assert!(gpus[0].iter().all(|&(_, _, weight)| weight.is_finite() && weight > 0.0), "{gpus:?}");
    }

    #[test]
    fn weighted_round_robin_follows_the_weights() {
        let mut targets = Targets { workers: vec![(0, 3.0, 0.0), (1, 1.0, 0.0)] };
        let picks: Vec<WorkerId> = (0..8).map(|_| targets.pick().unwrap()).collect();
        assert_eq!(picks.iter().filter(|&&w| w == 0).count(), 6);
        assert_eq!(picks.iter().filter(|&&w| w == 1).count(), 2);
        assert_eq!(Targets::default().pick(), None);
    }
}
