//! `quart`: QUART (ICDCS'24), key-stage scaling for pipelined large-model inference.
//!
//! Every control period (2 s) the policy estimates each stage's latency with an
//! M/M/c model corrected by the observed sojourn time and backlog, marks the stages
//! over their latency target as key stages and adds replicas to them with a PID
//! controller (the Corrector; it never removes replicas and freezes its integral
//! while replicas start). Every smoothing period (30 s) the Smoother gives back at
//! most one surplus replica per non-key stage, blending the stage's allocation with
//! its neighbours' demand by the buffer of its predicted CV and never going below
//! what the latency target needs; the CPU compensator gives the remaining replicas
//! more cores (intra-op threads) or cancels the reclaim, and returns cores that are
//! no longer needed. Requests wait in one FIFO queue per stage and run one at a time
//! on an idle replica. A request taken out of its queue that can no longer finish in
//! time — less left before its deadline than its own batch and the stages after it
//! need ([`unreachable_slack`]) — is dropped (`drop_unreachable`, on by default; the
//! paper's QUART never drops, `drop_unreachable=false`).
//!
//! Each new replica is placed (contract 0.2's `scale.placement`, spec §3.7): a key
//! stage starts warm on a server that caches its parameters; otherwise, at low
//! contention, a key stage goes where it keeps the most headroom and other stages
//! best-fit away from key stages; at high contention key replicas are dispersed over
//! the servers. Warm starts from each server's host-memory cache and draining before
//! removal are the host's mechanisms (see `docs/quart.md`).

pub mod corrector;
pub mod cpu;
pub mod params;
pub mod placement;
pub mod propagation;
pub mod service;
pub mod slack;
pub mod smoother;
pub mod telemetry;
pub mod view;

use yardmaster_sdk::helpers::{replica_bounds, EntryShedder, StageFifo, StageGraph};
use yardmaster_sdk::{
    BatchOutcome, Ctx, DropReason, Duration, EndReason, Instant, Level, Policy, Request, RequestId, Snapshot, StageId, Worker, WorkerId,
};

use corrector::Corrector;
use params::Params;
use placement::Cluster;
use propagation::{predict_cvs, FlowStage};
use service::ServiceModel;
use smoother::{smooth_stage, SmoothInput, SmootherSettings};
use telemetry::StageTelemetry;
use view::{batch_budgets, split_budget, StageView};

/// Service time assumed for a stage without a profile, seconds.
const UNPROFILED_SERVICE_S: f64 = 0.01;

/// The static plan of one stage.
#[derive(Debug, Clone)]
struct StagePlan {
    service: ServiceModel,
    target: f64,
    bounds: (u32, u32),
    predecessors: Vec<usize>,
    neighbours: Vec<usize>,
}

/// The QUART policy.
pub struct Quart {
    params: Params,
    plans: Vec<StagePlan>,
    /// Stages in an order where each follows its predecessors.
    order: Vec<usize>,
    fifo: StageFifo,
    telemetry: Vec<StageTelemetry>,
    corrector: Corrector,
    /// Cores per replica of each stage, `C_i`.
    cores: Vec<u32>,
    /// Last scale action of each stage.
    last_action: Vec<Option<Instant>>,
    /// Last time each stage was granted replicas (key-stage list with a TTL).
    last_key: Vec<Option<Instant>>,
    next_control: Instant,
    next_smooth: Instant,
    /// Whether a control period has run (the first may come before the host's first
    /// tick: [`Params::first_control`]).
    controlled: bool,
    /// Whether the first arrival has set the early first control's timer.
    first_control_set: bool,

    /// Whether this instance took over from another (its first snapshot predates its
    /// configuration): it then waits for a fresh snapshot before it scales.
    handed_over: bool,
    /// The batch sizes each stage runs, which the unreachable-request slack counts
    /// (`measured_batches`); `None` counts every batch at its limit.
    batch_sizes: Option<slack::BatchSizes>,
    /// Admission at the entries from the later stages' drops (`shed_period_ms`; none on
    /// a single stage), and each stage's count of drops it has been told of (`None`
    /// for a stage whose drops it is not told of: an entry, or a stage fed only by
    /// entries that take no time, whose drops cost no accelerator time above them).
    shedder: Option<(EntryShedder, Vec<Option<u64>>)>,
}

/// Timer token of the early first control.
const FIRST_CONTROL_TIMER: u64 = 1;

impl Quart {
    /// The stages on the key-stage list at `now`.
    pub fn key_stages(&self, now: Instant) -> Vec<usize> {
        (0..self.plans.len()).filter(|&i| self.last_key[i].is_some_and(|at| now.saturating_sub(at) <= self.params.key_ttl)).collect()
    }

    /// Cores per replica of every stage.
    pub fn cores(&self) -> &[u32] {
        &self.cores
    }

    fn views(&mut self, snapshot: &Snapshot, ctx: &Ctx, now: Instant) -> Vec<StageView> {
        let mut views = Vec::with_capacity(self.plans.len());
        for (i, plan) in self.plans.iter().enumerate() {
            let stats = snapshot.stages.iter().find(|s| s.stage as usize == i);
            let (ready, pending) = match stats {
                Some(s) => (s.replicas, s.starting),
                None => (ctx.workers().filter(|w| w.info.stage as usize == i).count() as u32, 0),
            };
            let t = &mut self.telemetry[i];
            let lambda = t.rate_short(now);
            views.push(StageView {
                lambda,
                lambda_smooth: lambda.max(t.rate_long(now)),
                cv_measured: t.cv(now, self.params.min_cv_samples),
                ready,
                pending,
                queue: self.fifo.take_mean_len(i as u32, now),
                observed: t.sojourn(now),
                cores: self.cores[i],
                service: plan.service,
                target: plan.target,
            });
        }
        views
    }

    /// One control period: Corrector, and when due the Smoother and CPU release; the
    /// next is due a period from now.
    fn control(&mut self, ctx: &mut Ctx, snapshot: &Snapshot) {
        let now = ctx.now();
        self.controlled = true;
        self.next_control = now + self.params.control_period;
        let views = self.views(snapshot, ctx, now);
        let in_use: u32 = views.iter().map(StageView::replicas).sum();
        let free = ctx.config().max_workers.saturating_sub(in_use);
        let bounds: Vec<(u32, u32)> = self.plans.iter().map(|p| p.bounds).collect();
        let correction = self.corrector.correct(&views, &bounds, free);
        {
            let stages: Vec<String> = views
                .iter()
                .zip(&correction.errors)
                .map(|(v, e)| {
                    format!(
                        "λ {:.0} r {}+{} q {:.1} obs {:.1} ms e {e:.2}",
                        v.lambda,
                        v.ready,
                        v.pending,
                        v.queue,
                        1e3 * v.observed.unwrap_or(0.0)
                    )
                })
                .collect();
            ctx.log(Level::Debug, &format!("quart: control at {} ms, {free} free: [{}]", now / 1_000_000, stages.join("; ")));
        }
        let mut targets = correction.targets.clone();
        let mut cores = self.cores.clone();
        for (i, &granted) in correction.granted.iter().enumerate() {
            if granted > 0 {
                self.last_key[i] = Some(now);
                self.last_action[i] = Some(now);
            }
        }
        if now >= self.next_smooth {
            self.next_smooth = now + self.params.smooth_period;
            if self.params.smoother {
                self.smooth(&views, &correction.key, &mut targets, &mut cores, now);
            }
        }
        // Shrinking first frees room for growing in the same answer.
        let mut changes: Vec<(usize, u32)> =
            (0..views.len()).filter(|&i| targets[i] != views[i].replicas()).map(|i| (i, targets[i])).collect();
        changes.sort_by_key(|&(i, target)| (target > views[i].replicas(), i));
        let key_now = self.key_stages(now);
        let is_key = |stage: u32| key_now.contains(&(stage as usize));
        let mut cluster = Cluster::from_snapshot(&ctx.config().hosts, &snapshot.hosts, self.params.low_contention);
        // Warm starts first, for every stage: a stage whose parameters a server caches
        // takes the free slots there before another stage's cold start does (a cold
        // start loads for 8.65 s in the reproduction, a warm one for 0.8 s).
        let mut warm: Vec<Vec<yardmaster_sdk::Placement>> = vec![Vec::new(); views.len()];
        if self.params.placement {
            for &(i, target) in &changes {
                let new = target.saturating_sub(views[i].replicas());
                warm[i] = (0..new).map_while(|_| cluster.place_warm(i as u32)).collect();
            }
        }
        for (i, target) in changes {
            let new = target.saturating_sub(views[i].replicas()).saturating_sub(warm[i].len() as u32);
            let placement: Vec<_> = if self.params.placement {
                std::mem::take(&mut warm[i])
                    .into_iter()
                    .chain((0..new).map_while(|_| cluster.place(i as u32, is_key(i as u32), &is_key)))
                    .collect()
            } else {
                Vec::new()
            };
            ctx.scale_placed(i as u32, target, None, placement);
        }
        for (i, &c) in cores.iter().enumerate() {
            if c != self.cores[i] {
                self.cores[i] = c;
                let workers: Vec<WorkerId> = ctx.workers().filter(|w| w.info.stage as usize == i).map(|w| w.info.id).collect();
                for worker in workers {
                    ctx.set_threads(worker, c);
                }
            }
        }
        let key: Vec<String> = self.key_stages(now).iter().map(usize::to_string).collect();
        if correction.granted.iter().any(|&g| g > 0) {
            ctx.log(Level::Debug, &format!("quart: key stages [{}], targets {:?}", key.join(","), targets));
        }
    }

    /// The Smoother and the CPU release over every stage.
    fn smooth(&mut self, views: &[StageView], key: &[bool], targets: &mut [u32], cores: &mut [u32], now: Instant) {
        let p = &self.params;
        let flows: Vec<FlowStage> = views
            .iter()
            .map(|v| FlowStage { lambda: v.lambda_smooth, rho: v.utilisation(), servers: v.replicas(), cv_measured: v.cv_measured })
            .collect();
        let predecessors: Vec<Vec<usize>> = self.plans.iter().map(|plan| plan.predecessors.clone()).collect();
        let cvs = predict_cvs(&flows, &predecessors, &self.order, p.service_scv);
        let settings = SmootherSettings {
            r_min: p.r_min,
            r_max: p.r_max,
            base_cores: p.base_cores,
            max_cores: p.max_cores,
            cpu_compensation: p.cpu_compensation,
            buffer_alpha: p.buffer_alpha,
            cv_threshold: p.cv_threshold,
            cooldown: p.cooldown,
        };
        for (i, view) in views.iter().enumerate() {
            let neighbours = &self.plans[i].neighbours;
            let neighbour_demand = if neighbours.is_empty() {
                view.demand()
            } else {
                neighbours.iter().map(|&j| views[j].demand()).sum::<f64>() / neighbours.len() as f64
            };
            let mut settings = settings;
            settings.r_min = self.plans[i].bounds.0;
            settings.r_max = self.plans[i].bounds.1;
            let input =
                SmoothInput { view, target: targets[i], key: key[i], cv: cvs[i], neighbour_demand, last_action: self.last_action[i] };
            if let Some(reclaim) = smooth_stage(&input, &settings, now) {
                targets[i] = reclaim.replicas;
                cores[i] = reclaim.cores;
                self.last_action[i] = Some(now);
            } else if p.cpu_compensation && targets[i] == view.replicas() {
                cores[i] = cpu::released_cores(view, p.base_cores, p.max_cores);
            }
        }
    }
}

/// Cap each stage's batch limit at the batch (of variant 0, the one QUART runs) that
/// serves the most requests per second within the stage's `budgets` entry (its target,
/// or a larger part of its share along its longest path: [`batch_budgets`]), in
/// seconds; at least 1. Where throughput grows with the batch that is the largest batch
/// that fits (a limit that already fits is kept); on a profile with a sweet spot
/// (Loki's `yolov5n`: 176 frames/s in batches of 3, 94 in batches of 12, 69 in 16) it
/// is the sweet spot.
fn fit_batch_limits(ctx: &mut Ctx, budgets: &[f64]) {
    let stages: Vec<(StageId, u32)> = ctx.config().stages.iter().map(|s| (s.id, s.max_batch)).collect();
    for (stage, max_batch) in stages {
        let Some(&budget) = budgets.get(stage as usize) else { continue };
        // An unprofiled stage (a pseudo stage) keeps its limit.
        if ctx.latency().mean(stage, 0, 1).is_none() {
            continue;
        }
        let limit = ctx.batch_limit(stage).min(max_batch.max(1));
        let target = (budget * 1e9) as Duration;
        let fitted = ctx.latency().most_productive_batch_within(stage, 0, target, limit).max(1);
        if fitted < limit {
            ctx.set_batch_limit(stage, fitted);
        }
    }
}

/// Per stage, the least time a request must have left before its deadline when it is
/// taken out of the stage's queue: its own batch at the stage's batch limit, plus
/// `factor` such batches for every later stage on the longest downstream path (the
/// reserve scaled down so that no path asks for more than the tightest SLO; see
/// [`StageGraph::downstream_reserve`]). A request with less left is dropped: it
/// cannot finish in time, and serving it would only delay the ones that can.
/// With `measured_batches` QUART counts each batch at the size the stage runs instead
/// ([`slack`]).
pub fn unreachable_slack(ctx: &Ctx, factor: f64) -> Vec<Duration> {
    slack::slack(ctx, factor, |s| ctx.batch_limit(s) as f64)
}

/// Stages in an order where each comes after its predecessors (Kahn's algorithm;
/// stages on a cycle, which pipelines do not have, go last in id order).
fn topological_order(predecessors: &[Vec<usize>]) -> Vec<usize> {
    let n = predecessors.len();
    let mut indegree: Vec<usize> = predecessors.iter().map(Vec::len).collect();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    while let Some(next) = (0..n).find(|&i| !placed[i] && indegree[i] == 0) {
        placed[next] = true;
        order.push(next);
        for (j, preds) in predecessors.iter().enumerate() {
            indegree[j] -= preds.iter().filter(|&&p| p == next).count();
        }
    }
    order.extend((0..n).filter(|&i| !placed[i]));
    order
}

impl Policy for Quart {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let params = Params::from_ctx(ctx)?;
        let config = ctx.config();
        let n = config.stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut base_times = vec![UNPROFILED_SERVICE_S; n];
        let mut plans: Vec<StagePlan> = (0..n)
            .map(|_| StagePlan {
                service: ServiceModel::anchored(UNPROFILED_SERVICE_S, params.base_cores, params.cpu_serial_share),
                target: 0.0,
                bounds: (params.r_min, params.r_max),
                predecessors: Vec::new(),
                neighbours: Vec::new(),
            })
            .collect();
        for stage in &config.stages {
            let i = stage.id as usize;
            if let Some(ns) = ctx.latency().mean(stage.id, 0, 1) {
                base_times[i] = (ns as f64 / 1e9).max(1e-6);
            }
            let plan = &mut plans[i];
            plan.service = ServiceModel::anchored(base_times[i], params.base_cores, params.cpu_serial_share);
            // An offline stage (its model out of service) gets (0, 0): never scaled up.
            plan.bounds = replica_bounds(stage, params.r_min, params.r_max);
            plan.predecessors = stage.predecessors.iter().map(|&p| p as usize).collect();
            let mut neighbours: Vec<usize> = stage.predecessors.iter().chain(&stage.successors).map(|&s| s as usize).collect();
            neighbours.sort_unstable();
            neighbours.dedup();
            plan.neighbours = neighbours;
        }
        let budget = match params.slo_ctrl_s {
            Some(budget) => budget,
            None => config.streams.iter().map(|s| s.slo as f64 / 1e9).filter(|&s| s > 0.0).reduce(f64::min).unwrap_or(1.0),
        };
        for (plan, target) in plans.iter_mut().zip(split_budget(budget, &base_times)) {
            plan.target = target;
        }
        if params.fit_batches {
            let budgets = batch_budgets(budget, &StageGraph::new(&config.stages), &base_times, params.path_batch_fraction);
            fit_batch_limits(ctx, &budgets);
        }
        let config = ctx.config();
        let predecessors: Vec<Vec<usize>> = plans.iter().map(|p| p.predecessors.clone()).collect();
        let now = config.now;
        let workers: Vec<Worker> = config.workers.clone();
        let mut fifo = StageFifo::new();
        if params.drop_unreachable {
            let slack = unreachable_slack(ctx, params.downstream_reserve);
            let limits: Vec<u32> = (0..n as StageId).map(|s| ctx.batch_limit(s)).collect();
            let targets: Vec<f64> = plans.iter().map(|p| (p.target * 1e4).round() / 10.0).collect();
            let slack_ms: Vec<f64> = slack.iter().map(|&d| (d as f64 / 1e5).round() / 10.0).collect();
            let profiles: Vec<Vec<f64>> = (0..n as StageId)
                .map(|s| [1, 2, 4, 8, 16].iter().map(|&b| (ctx.latency().mean(s, 0, b).unwrap_or(0) as f64 / 1e5).round() / 10.0).collect())
                .collect();
            let workers: Vec<usize> = (0..n as StageId).map(|s| ctx.config().workers.iter().filter(|w| w.stage == s).count()).collect();
            ctx.log(
                Level::Debug,
                &format!("quart: batch limits {limits:?}, targets {targets:?} ms, unreachable slack {slack_ms:?} ms, workers {workers:?}, ms at 1/2/4/8/16 {profiles:?}"),
            );
            fifo.drop_unreachable(slack);
        }
        let policy = Self {
            order: topological_order(&predecessors),
            telemetry: (0..n).map(|_| StageTelemetry::new(&params, now)).collect(),
            corrector: Corrector::new(n, &params),
            cores: vec![params.base_cores; n],
            last_action: vec![None; n],
            last_key: vec![None; n],
            next_control: now,
            next_smooth: now + params.smooth_period,
            controlled: false,
            first_control_set: false,
            handed_over: false,
            batch_sizes: (params.drop_unreachable && params.measured_batches).then(|| slack::BatchSizes::new(ctx, n, now)),
            shedder: (params.drop_unreachable && params.shed_period > 0 && n > 1).then(|| {
                let graph = StageGraph::new(&ctx.config().stages);
                let entry: Vec<bool> = (0..graph.len() as StageId).map(|s| graph.predecessors(s).is_empty()).collect();
                let free = |s: StageId| entry[s as usize] && ctx.latency().mean(s, 0, 1).is_none_or(|ns| ns == 0);
                let told = (0..n as StageId)
                    .map(|s| {
                        let predecessors = graph.predecessors(s);
                        (!predecessors.is_empty() && !predecessors.iter().all(|&p| free(p))).then_some(0)
                    })
                    .collect();
                (EntryShedder::new(entry, params.shed_period), told)
            }),
            fifo,
            plans,
            params,
        };
        for worker in workers {
            policy.align_threads(ctx, &worker);
        }
        Ok(policy)
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        if let Some(t) = self.telemetry.get_mut(request.stage as usize) {
            t.arrival(request.arrived_at.min(ctx.now()));
        }
        if let Some((shedder, _)) = &mut self.shedder {
            shedder.arrived(request.stage);
            shedder.advance(ctx.now());
            if request.requeues == 0 && !shedder.admit(request.stage) {
                ctx.drop_request(request.id, DropReason::Overload);
                return;
            }
        }
        self.fifo.push(ctx.now(), &request);
        if !self.controlled && !self.first_control_set && self.params.first_control > 0 {
            ctx.set_timer(ctx.now() + self.params.first_control, FIRST_CONTROL_TIMER);
            self.first_control_set = true;
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx, token: u64) {
        // The early first control: the rate measured since the first arrival, the
        // workers this instance knows (nothing is starting before the first control),
        // and the host placing the new replicas. A hand-over waits for a fresh tick.
        if token == FIRST_CONTROL_TIMER && !self.controlled && !self.handed_over {
            let snapshot = Snapshot {
                at: ctx.now(),
                stages: Vec::new(),
                workers: Vec::new(),
                host_memory_used: 0,
                host_memory_capacity: 0,
                hosts: Vec::new(),
            };
            self.control(ctx, &snapshot);
        }
    }

    fn on_batch_done(&mut self, ctx: &mut Ctx, outcome: BatchOutcome) {
        let now = ctx.now();
        if let Some((stage, sojourns)) = self.fifo.finish(&outcome, now) {
            if let Some(sizes) = &mut self.batch_sizes {
                sizes.record(stage, sojourns.len());
            }
            if let Some(t) = self.telemetry.get_mut(stage as usize) {
                for sojourn in sojourns {
                    t.finished(now, sojourn);
                }
            }
        }
    }

    fn on_request_ended(&mut self, ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.fifo.forget(ctx.now(), request);
    }

    fn on_worker_added(&mut self, ctx: &mut Ctx, worker: Worker) {
        self.align_threads(ctx, &worker);
    }

    fn on_worker_removed(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.fifo.worker_gone(worker);
    }

    fn on_tick(&mut self, ctx: &mut Ctx, snapshot: Snapshot) {
        // A snapshot taken before this instance was configured (the one a hand-over
        // replays) may describe another cluster — before a model was loaded or
        // unloaded, without the replicas starting since — so replica counts and
        // placements wait for a fresh one.
        let stale = snapshot.at < ctx.config().now;
        self.handed_over |= stale && !self.controlled;
        if !stale && ctx.now() >= self.next_control {
            self.control(ctx, &snapshot);
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        if let Some(sizes) = &mut self.batch_sizes {
            if sizes.due(ctx.now(), self.fifo.dropped()) {
                let slack = slack::slack(ctx, self.params.downstream_reserve, |s| sizes.size(s));
                self.fifo.drop_unreachable(slack);
            }
        }
        self.fifo.dispatch_idle(ctx);
        if let Some((shedder, told)) = &mut self.shedder {
            // Below capacity (under 5 % of the pieces dropped) the drops are QUART's
            // own margins, not a stage short of capacity: they are not shed for.
            let overloaded = self.batch_sizes.as_ref().is_none_or(slack::BatchSizes::overloaded);
            for (stage, told) in told.iter_mut().enumerate() {
                let Some(told) = told else { continue };
                let dropped = self.fifo.dropped_at(stage as StageId);
                if overloaded {
                    for _ in *told..dropped {
                        shedder.dropped(stage as StageId);
                    }
                }
                *told = dropped;
            }
        }
    }
}

impl Quart {
    /// Give a worker its stage's cores when it has others.
    fn align_threads(&self, ctx: &mut Ctx, worker: &Worker) {
        if let Some(&cores) = self.cores.get(worker.stage as usize) {
            if worker.threads != cores {
                ctx.set_threads(worker.id, cores);
            }
        }
    }
}

yardmaster_sdk::export_policy!(Quart);
