//! The policy itself: events in, actions out. Per tick it estimates the root
//! demand, re-plans every `rm_period_s` or on a demand jump (the flavour's planner),
//! applies the plan (scale stages, switch worker variants, set max batch sizes and
//! latency budgets) and rebuilds the routing tables, which it also publishes with
//! `set-routes`. Each request is queued at the worker its routing table draws; an
//! idle worker runs its queue in batches after early dropping; finished batches
//! feed the multiplicative-factor telemetry.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::marker::PhantomData;

use yardmaster_sdk::helpers::CountWindow;
use yardmaster_sdk::{
    splitmix64, BatchOutcome, Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId, Route, Snapshot, StageId, VariantId,
    VariantTarget, Worker, WorkerId,
};

use crate::balancer::{most_accurate_first, planned_load_routing, sample, BalancerWorker, Routing};
use crate::batching::{choose_reroute, form_batch, DropMode, Queued};
use crate::budgets::budget_ns;
use crate::demand::DemandEstimator;
use crate::model::{Factors, PipelineModel};
use crate::plan::Plan;
use crate::planner::{hardware_scaling_with_slack, start, PlanJob, PlanRequest, Started};
use crate::settings::{PlannerKind, Settings};
use crate::single_path::max_served_fraction;
use crate::transition::{batch_within, hold_variants, short_handed_batch};

/// How long after the first request the first plan is made, from the arrivals seen so
/// far: without it the initial workers alone serve until the first tick (1 s), and a
/// load well within the cluster's capacity overruns them (Loki dropped 4 % of a
/// 30-second run at 13 % of its capacity, nearly all in its first two seconds).
pub const FIRST_PLAN_AFTER_NS: u64 = 100_000_000;

/// A flavour of the policy: which planner and which default drop mode.
pub trait Flavour: 'static {
    /// The planner.
    const PLANNER: PlannerKind;
    /// Default `drop_mode`.
    const DROP: DropMode;
}

/// Loki itself.
pub struct LokiFlavour;
impl Flavour for LokiFlavour {
    const PLANNER: PlannerKind = PlannerKind::Loki;
    const DROP: DropMode = DropMode::Reroute;
}

/// The InferLine-like baseline.
pub struct InferLineFlavour;
impl Flavour for InferLineFlavour {
    const PLANNER: PlannerKind = PlannerKind::InferLine;
    const DROP: DropMode = DropMode::PerTask;
}

/// The Proteus-like baseline.
pub struct ProteusFlavour;
impl Flavour for ProteusFlavour {
    const PLANNER: PlannerKind = PlannerKind::Proteus;
    const DROP: DropMode = DropMode::PerTask;
}

/// The policy, generic over its flavour.
pub struct LokiPolicy<F: Flavour> {
    runtime: Runtime,
    flavour: PhantomData<F>,
}

impl<F: Flavour> LokiPolicy<F> {
    /// The runtime state (for tests).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }
}

/// What the runtime knows of a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Assigned {
    /// Its stage.
    pub stage: StageId,
    /// Its task (none on a pseudo stage).
    pub task: Option<usize>,
    /// Variant index.
    pub variant: usize,
    /// Max batch size.
    pub batch: u32,
    /// Latency budget (ns).
    pub budget_ns: u64,
}

/// A map that forgets entries after one to two periods (per-query routing memory).
///
/// Ordered maps, not hash maps: a period holds every sub-request of several seconds
/// (hundreds of thousands at thousands of queries per second), and a hash map that
/// grows from empty after each rotation re-hashes everything at every doubling, one
/// call paying for all of it (63 M fuel at 4,800 req/s on `five-stage`, past an event
/// call's budget). A B-tree's cost per insert stays bounded.
#[derive(Debug, Default)]
struct Recent<K, V> {
    current: BTreeMap<K, V>,
    previous: BTreeMap<K, V>,
    rotated_at: Instant,
}

impl<K: Ord, V: Copy> Recent<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        self.current.get(key).or_else(|| self.previous.get(key)).copied()
    }

    fn insert(&mut self, key: K, value: V) {
        self.current.insert(key, value);
    }

    fn rotate(&mut self, now: Instant, period: u64) {
        if now.saturating_sub(self.rotated_at) >= period {
            self.previous = std::mem::take(&mut self.current);
            self.rotated_at = now;
        }
    }
}

/// Sub-requests the requests of one task and one end-to-end request, processed in
/// this call, produced, waiting to be counted. A sub-request names its end-to-end
/// request (`origin`) but not its parent, so the requests of a task that share an
/// origin (siblings of a fan-out above) and finish in the same call share one
/// entry, and each counts as one sample of the mean: `workers` holds one worker per
/// processed request.
struct PendingChildren {
    workers: Vec<WorkerId>,
    counts: Vec<u32>,
}

/// Planning statistics the runtime keeps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeStats {
    /// Resource Manager runs.
    pub plans: u64,
    /// MILP solves.
    pub solves: u64,
    /// Branch-and-bound nodes over all solves.
    pub nodes: u64,
    /// Simplex pivots over all solves.
    pub pivots: u64,
    /// MILP slices run (one per tick while a job is in progress).
    pub slices: u64,
    /// Plans put in force although no plan meets the SLO (the fastest variants).
    pub infeasible_plans: u64,
    /// Variant switches issued.
    pub switches: u64,
    /// Requests dropped early.
    pub dropped: u64,
    /// Requests dropped early, per task.
    pub dropped_by_task: Vec<u64>,
    /// Requests pinned by opportunistic rerouting.
    pub rerouted: u64,
}

/// The policy's state.
pub struct Runtime {
    model: PipelineModel,
    settings: Settings,
    rng: u64,
    demand: DemandEstimator,
    task_demand: Vec<DemandEstimator>,
    root_arrivals: u64,
    /// When the first root request arrived, until the first plan for the traffic
    /// (made [`FIRST_PLAN_AFTER_NS`] after it rather than at the first tick).
    first_arrival: Option<Instant>,
    /// Whether a plan for the observed traffic was made (by a tick or early).
    planned_for_traffic: bool,
    /// [`Runtime::measured_factors`] when the plan in force (or the job making it) was
    /// started: which fan-outs it planned with were measured, which guessed.
    measured_at_plan: Vec<Vec<bool>>,
    task_arrivals: Vec<u64>,
    last_tick: Instant,
    tick_ns: u64,
    plan: Option<Plan>,
    plan_demand: f64,
    last_plan: Option<Instant>,
    workers: BTreeMap<WorkerId, Assigned>,
    queues: BTreeMap<WorkerId, VecDeque<Queued>>,
    pseudo_queues: BTreeMap<StageId, VecDeque<RequestId>>,
    orphans: BTreeMap<usize, VecDeque<Queued>>,
    ended: HashSet<RequestId>,
    running: HashMap<WorkerId, Vec<(RequestId, RequestId)>>,
    processed_by: Recent<(RequestId, usize), WorkerId>,
    pins: Recent<(RequestId, usize), WorkerId>,
    /// Ordered: its drain feeds the factor windows, so its order is part of what the
    /// policy decides (a hash map's order moved with every other map the policy made).
    /// Keyed by end-to-end request and task: keyed by the end-to-end request alone,
    /// siblings of a fan-out processed in one call (one batch, once requests join the
    /// shortest queue) overwrote each other's entry, and every sub-request of all of
    /// them was counted as one sibling's: measured fan-outs below a fan-out came out
    /// up to twice the true ones (docs/loki.md, *Fan-outs counted twice*).
    pending_children: BTreeMap<(RequestId, usize), PendingChildren>,
    worker_factors: BTreeMap<WorkerId, Vec<CountWindow>>,
    variant_factors: Vec<Vec<Vec<CountWindow>>>,
    child_counts: Vec<Vec<f64>>,
    requested: BTreeMap<StageId, u32>,
    /// When each stage was last scaled up (a request the host refused, or workers
    /// that never came, are forgotten after `SCALE_PATIENCE_NS`).
    scaled_up_at: BTreeMap<StageId, Instant>,
    routing: Routing,
    /// Whether `routing` was rebuilt since it was last sent to the host.
    routes_unsent: bool,
    /// Workers were added in this call: reconcile, rebalance and route the orphans
    /// once, after its events (a call that adds 60 workers did it 60 times and ran
    /// out of an event call's fuel).
    workers_added: bool,
    /// The Resource Manager's MILP in progress, advanced one slice per call.
    job: Option<Box<PlanJob>>,
    stats: RuntimeStats,
}

/// How long requested workers may take to start before the request is forgotten
/// (the host may refuse a scale-up, e.g. while drained workers still count).
const SCALE_PATIENCE_NS: u64 = 5_000_000_000;

/// Samples needed before a variant's observed factor replaces the offline one.
const MIN_FACTOR_SAMPLES: usize = 10;

/// Whether a factor window holds enough samples to plan with ([`MIN_FACTOR_SAMPLES`]).
fn measured(window: &CountWindow) -> bool {
    window.len() >= MIN_FACTOR_SAMPLES
}

/// Whether a re-plan may take the plan in force as serving the demand it was made for
/// (the planner then keeps it while the MILP runs, and warm-starts from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Previous {
    /// It serves what it says.
    Trust,
    /// It was sized with fan-outs now known to be wrong.
    Distrust,
}

impl Runtime {
    /// Build the runtime for the configuration in `ctx`.
    pub fn new(ctx: &mut Ctx, planner: PlannerKind, default_drop: DropMode) -> Result<Self, String> {
        let probe = Settings::from_ctx(ctx, planner, default_drop, 0)?;
        let model = PipelineModel::from_config(ctx.config(), ctx.latency(), &probe.batches)?;
        // Workers the plan cannot have: what every stage outside the modelled pipeline
        // keeps (a pseudo stage, another stream's stages, an LLM stage) — at least one
        // per pseudo stage, its minimum otherwise, and never fewer than it starts with
        // (Loki never scales those stages, so their initial workers stay).
        let kept_elsewhere: u32 = ctx
            .config()
            .stages
            .iter()
            .filter(|stage| model.task_of(stage.id).is_none())
            .map(|stage| {
                let floor = if model.pseudo.contains(&stage.id) { 1 } else { stage.min_replicas };
                let initial = ctx.config().workers.iter().filter(|w| w.stage == stage.id).count() as u32;
                floor.max(initial)
            })
            .sum();
        let settings = Settings::from_ctx(ctx, planner, default_drop, kept_elsewhere)?;
        if settings.cluster < model.tasks.len() as u32 {
            return Err(format!("cluster of {} workers cannot host {} tasks", settings.cluster, model.tasks.len()));
        }
        let mut requested = BTreeMap::new();
        for stage in &ctx.config().stages {
            requested.insert(stage.id, 0);
        }
        let mut workers = BTreeMap::new();
        for w in &ctx.config().workers {
            *requested.entry(w.stage).or_default() += 1;
            workers.insert(w.id, Self::assigned_for(&model, &settings, ctx, w));
        }
        let tasks = model.tasks.len();
        let variant_factors = model
            .tasks
            .iter()
            .map(|t| {
                t.variants.iter().map(|_| t.children.iter().map(|_| CountWindow::new(4 * settings.factor_history)).collect()).collect()
            })
            .collect();
        let child_counts = model.tasks.iter().map(|t| vec![0.0; t.children.len()]).collect();
        let mut runtime = Self {
            demand: DemandEstimator::new(settings.ewma_com, settings.ewma_window),
            task_demand: (0..tasks).map(|_| DemandEstimator::new(settings.ewma_com, settings.ewma_window)).collect(),
            root_arrivals: 0,
            first_arrival: None,
            planned_for_traffic: false,
            measured_at_plan: Vec::new(),
            task_arrivals: vec![0; tasks],
            last_tick: ctx.config().now,
            tick_ns: ctx.config().tick_interval.max(1),
            rng: ctx.config().seed ^ 0x4c6f_6b69,
            plan: None,
            plan_demand: 0.0,
            last_plan: None,
            queues: workers.keys().map(|&w| (w, VecDeque::new())).collect(),
            workers,
            pseudo_queues: BTreeMap::new(),
            orphans: BTreeMap::new(),
            ended: HashSet::new(),
            running: HashMap::new(),
            processed_by: Recent::default(),
            pins: Recent::default(),
            pending_children: BTreeMap::new(),
            worker_factors: BTreeMap::new(),
            variant_factors,
            child_counts,
            requested,
            scaled_up_at: BTreeMap::new(),
            routing: Routing::default(),
            routes_unsent: false,
            workers_added: false,
            job: None,
            stats: RuntimeStats::default(),
            model,
            settings,
        };
        // Start from the plan for no demand (one worker per task), then follow the load;
        // the cluster's start-up workers stay until the first plan for traffic.
        runtime.replan(ctx, 0.0, true, Previous::Trust);
        Ok(runtime)
    }

    fn assigned_for(model: &PipelineModel, settings: &Settings, ctx: &Ctx, w: &Worker) -> Assigned {
        let task = model.task_of(w.stage);
        let batch = ctx.config().stages.iter().find(|s| s.id == w.stage).map_or(1, |s| s.max_batch).max(1);
        let mut assigned = Assigned { stage: w.stage, task, variant: w.variant as usize, batch, budget_ns: u64::MAX };
        if let Some(t) = task {
            assigned.batch = 1;
            assigned.budget_ns = budget_ns(model, None, settings.budget, t, assigned.variant, 1);
        }
        assigned
    }

    /// The plan in force.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// The pipeline model.
    pub fn model(&self) -> &PipelineModel {
        &self.model
    }

    /// Planning statistics.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// The smoothed root demand.
    pub fn demand_estimate(&self) -> f64 {
        self.demand.estimate()
    }

    /// Current assignments of the workers.
    pub fn assignments(&self) -> &BTreeMap<WorkerId, Assigned> {
        &self.workers
    }

    /// The routing tables in force.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    fn unit(&mut self) -> f64 {
        let (state, value) = splitmix64(self.rng);
        self.rng = state;
        (value >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Multiplicative factors to plan with: observed per variant when enough
    /// requests were seen, else the variant's total fan-out split by the observed
    /// child shares of its task (equal shares before any observation).
    pub fn factors(&self) -> Factors {
        self.model
            .tasks
            .iter()
            .enumerate()
            .map(|(t, task)| {
                let seen: f64 = self.child_counts[t].iter().sum();
                task.variants
                    .iter()
                    .enumerate()
                    .map(|(k, v)| {
                        (0..task.children.len())
                            .map(|slot| {
                                let window = &self.variant_factors[t][k][slot];
                                if measured(window) {
                                    window.mean().unwrap_or(0.0)
                                } else {
                                    let share =
                                        if seen > 0.0 { self.child_counts[t][slot] / seen } else { 1.0 / task.children.len() as f64 };
                                    v.fan_out * share
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    /// Whether each variant's fan-out is measured (enough samples in every child's
    /// window) rather than guessed from its task's child shares, per task and variant.
    fn measured_factors(&self) -> Vec<Vec<bool>> {
        self.variant_factors.iter().map(|variants| variants.iter().map(|slots| slots.iter().all(measured)).collect()).collect()
    }

    /// A task the plan in force sized for too little because a fan-out it planned with
    /// was a guess: a hosted variant whose split across its children was not yet
    /// measured when the plan was made (it gets its task's observed child shares,
    /// which the start-up workers' variants set) is measured now, and with the
    /// measured factors a task below it receives more than `1 + replan_jump` times the
    /// sub-requests per root query the plan was sized for. On Loki's traffic
    /// application the first plan sized face recognition for 0.09 faces a frame (the
    /// shares of the large detectors) where the small detector it chose finds 0.6: it
    /// dropped a third of the requests until its next plan, 12 s later, and past the
    /// cluster's reach it kept the undersized plan for good (0.54 of the bound at 5×,
    /// where 0.75 is served at 3×). Fires at most once per variant (a measured
    /// factor stays measured), so it cannot keep restarting the MILP. Only for Loki's
    /// own planner.
    fn undersized_task(&self) -> Option<usize> {
        let plan = self.plan.as_ref()?;
        if self.settings.planner != PlannerKind::Loki || plan.demand <= 0.0 {
            return None;
        }
        let measured = self.measured_factors();
        let newly_measured = plan.hosts.iter().any(|h| {
            let was = self.measured_at_plan.get(h.task).and_then(|v| v.get(h.variant)).copied().unwrap_or(false);
            !self.model.tasks[h.task].children.is_empty() && !was && measured[h.task][h.variant]
        });
        if !newly_measured {
            return None;
        }
        // The plan's path: per task, the variant it sends the most load to.
        let mut choice: Vec<usize> = self.model.tasks.iter().map(|t| t.most_accurate).collect();
        let mut heaviest = vec![f64::NEG_INFINITY; self.model.tasks.len()];
        for h in &plan.hosts {
            if h.load > heaviest[h.task] {
                heaviest[h.task] = h.load;
                choice[h.task] = h.variant;
            }
        }
        let predicted = crate::single_path::per_query_load(&self.model, &self.factors(), &choice);
        let limit = 1.0 + self.settings.replan_jump;
        // Past the cluster's reach (a capped plan) a task sized for more sub-requests
        // than come holds workers the tasks above it could serve with: on
        // `r17-mid-fan` at 5× the first plan (100 ms in, its fan-outs guessed) gave
        // the leaves up to 1.6 times the sub-requests that came, and with the 10-s
        // period it stayed for the whole of a 5-s run (docs/loki.md, *Fan-outs counted
        // twice*).
        let capped = plan.regime == crate::plan::Regime::Capped;
        (0..self.model.tasks.len()).find(|&t| {
            let planned: f64 = plan.hosts.iter().filter(|h| h.task == t).map(|h| h.load).sum::<f64>() / plan.demand;
            planned > 0.0 && (predicted[t] > limit * planned || (capped && predicted[t] * limit < planned))
        })
    }

    /// The early-drop rule in force: the configured one, except past the cluster's
    /// reach (the plan is capped at the most the cluster serves, or no plan meets the
    /// SLO), where an overshoot of the per-task budget always drops, as in the paper.
    /// The deadline rule keeps a request while the path below the task *without
    /// queueing* could still make its deadline; under overload every queue below is
    /// full, so it kept requests that then ended late there (on vision-chain at 2× the
    /// capacity bound Loki served 104 on-time requests/s of 6,620 offered).
    ///
    /// A plan is capped when the demand *with headroom* passes the most the cluster
    /// serves; while the demand measured is still within what the plan serves, the
    /// cluster is not past its reach and the configured rule stays (on the random
    /// applications at half the capacity bound, a headroom of 1.5 capped the plan and
    /// the budget rule dropped 17 % of `r09-root-fan-join`'s requests at its root).
    fn drop_rule(&self) -> crate::batching::DropWhen {
        match self.plan.as_ref() {
            Some(p) if p.regime == crate::plan::Regime::Fastest => crate::batching::DropWhen::Budget,
            Some(p) if p.regime == crate::plan::Regime::Capped && self.plan_demand > p.demand => crate::batching::DropWhen::Budget,
            _ => self.settings.drop_when,
        }
    }

    fn worker_factor(&self, worker: WorkerId, factors: &Factors) -> Vec<f64> {
        let Some(Assigned { task: Some(t), variant, .. }) = self.workers.get(&worker) else { return Vec::new() };
        (0..self.model.tasks[*t].children.len())
            .map(|slot| {
                self.worker_factors
                    .get(&worker)
                    .and_then(|w| w.get(slot))
                    .filter(|w| measured(w))
                    .and_then(CountWindow::mean)
                    .unwrap_or(factors[*t][*variant][slot])
            })
            .collect()
    }

    /// The processing time a path may take (ms): half of what the SLO leaves after
    /// the hops between tasks.
    fn path_cap_ms(&self) -> f64 {
        (self.model.slo_ms - self.settings.comm_ms * self.model.branches.iter().map(Vec::len).max().unwrap_or(1) as f64) / 2.0
    }

    /// Run the flavour's planner for demand `estimate` and apply the plan. With
    /// `slice_now`, a MILP that does not finish at once gets its first slice in this
    /// call; without (a call of request events, whose fuel is a tick's fiftieth), its
    /// first slice waits for the next tick, and the interim plan serves meanwhile.
    fn replan(&mut self, ctx: &mut Ctx, estimate: f64, slice_now: bool, previous: Previous) {
        let factors = self.factors();
        self.measured_at_plan = self.measured_factors();
        let demand = estimate * self.settings.headroom;
        let cap_ms = self.path_cap_ms();
        let cluster = self.settings.cluster;
        let plan = match self.settings.planner {
            PlannerKind::Loki => {
                let request = PlanRequest {
                    model: &self.model,
                    factors: &factors,
                    demand,
                    cluster,
                    cap_ms,
                    limits: self.settings.limits,
                    previous: self.plan.as_ref().filter(|_| previous == Previous::Trust),
                    fill_spare: self.settings.fill_spare,
                    slack: self.settings.hardware_slack,
                };
                self.job = None;
                match start(&request) {
                    Started::Done(plan) => plan,
                    Started::Pending(interim, job) => {
                        self.job = Some(job);
                        // Serve with the greedy plan (or the current one) meanwhile,
                        // and give the MILP its first slice now.
                        if let Some(plan) = interim {
                            self.adopt(ctx, plan, estimate);
                        } else {
                            self.plan_demand = estimate;
                            self.last_plan = Some(ctx.now());
                        }
                        if slice_now {
                            self.advance_job(ctx);
                        }
                        return;
                    }
                }
            }
            PlannerKind::InferLine => {
                let choice: Vec<usize> = self.model.tasks.iter().map(|t| t.most_accurate).collect();
                hardware_scaling_with_slack(&self.model, &factors, demand, self.settings.hardware_slack, cap_ms, cluster)
                    .or_else(|| max_served_fraction(&self.model, &factors, &choice, demand, cap_ms, cluster).map(|(_, p)| p))
                    .unwrap_or_else(|| crate::single_path::fastest(&self.model, &factors, demand, cluster))
            }
            PlannerKind::Proteus => {
                let demands: Vec<f64> = self.task_demand.iter().map(|d| d.estimate() * self.settings.headroom).collect();
                crate::proteus::plan(&self.model, &demands, cluster, self.settings.limits.max_nodes)
            }
        };
        self.adopt(ctx, plan, estimate);
    }

    /// Advance the MILP in progress by one slice; adopt its plan when it is done.
    fn advance_job(&mut self, ctx: &mut Ctx) {
        let Some(job) = self.job.as_mut() else { return };
        // The host's clock bounds a slice only when asked (`milp_ms_per_tick`): by
        // default the slice is counted in work, the same on any machine.
        let clock = || ctx.host().now();
        let clock: Option<&dyn Fn() -> u64> = if self.settings.limits.time_slice_ns > 0 { Some(&clock) } else { None };
        let finished = job.advance(&self.model, clock);
        self.stats.slices += 1;
        let Some(plan) = finished else { return };
        let stats = job.stats().clone();
        self.job = None;
        self.stats.solves += stats.solves as u64;
        self.stats.nodes += stats.nodes;
        self.stats.pivots += stats.pivots;
        ctx.host().emit("loki.milp_nodes", stats.nodes as f64);
        ctx.host().emit("loki.milp_pivots", stats.pivots as f64);
        ctx.host().emit("loki.milp_slices", stats.slices as f64);
        let estimate = self.plan_demand;
        self.adopt(ctx, plan, estimate);
    }

    /// Put a plan in force.
    fn adopt(&mut self, ctx: &mut Ctx, plan: Plan, estimate: f64) {
        self.stats.plans += 1;
        // No plan meets the SLO: the fastest variants serve. Say so, never silently.
        let infeasible = plan.regime == crate::plan::Regime::Fastest;
        ctx.host().emit("loki.plan_infeasible", if infeasible { 1.0 } else { 0.0 });
        if infeasible {
            self.stats.infeasible_plans += 1;
            let was = self.plan.as_ref().is_some_and(|p| p.regime == crate::plan::Regime::Fastest);
            if !was {
                let cap_ms = self.model.slo_ms / 2.0;
                let best: Vec<String> = self
                    .model
                    .branches
                    .iter()
                    .map(|b| {
                        let ms: f64 =
                            b.iter().map(|&t| self.model.tasks[t].variants[self.model.tasks[t].most_accurate].latency_ms[0]).sum();
                        format!("{ms:.1} ms")
                    })
                    .collect();
                let msg = format!(
                    "infeasible plan: no variant set meets the SLO of {} ms (per-path processing cap {cap_ms:.1} ms; the most accurate variants at batch 1 take {} per branch); serving the fastest variants at accuracy {:.3}",
                    self.model.slo_ms,
                    best.join(", "),
                    plan.accuracy
                );
                ctx.log(yardmaster_sdk::Level::Warn, &msg);
            }
        }
        ctx.host().emit("loki.plan_accuracy", plan.accuracy);
        ctx.host().emit("loki.plan_workers", plan.workers() as f64);
        let unchanged = self.plan.as_ref().is_some_and(|old| old.same_allocation(&plan));
        if !unchanged {
            self.plan = Some(plan);
        } else if let Some(old) = self.plan.as_mut() {
            old.accuracy = plan.accuracy;
            old.demand = plan.demand;
        }
        self.plan_demand = estimate;
        self.last_plan = Some(ctx.now());
        self.reconcile(ctx);
        self.balance();
    }

    /// Bring the workers in line with the plan: switch variants where a stage has
    /// workers to spare, scale stages up or down, set batches and budgets.
    fn reconcile(&mut self, ctx: &mut Ctx) {
        let Some(plan) = self.plan.clone() else { return };
        // For Loki and the InferLine-like baseline, whose plans use the whole cluster
        // (`hardware_slack`), scale-downs go out before scale-ups: the host checks each
        // scale against the cluster with the earlier ones of the call counted, so a
        // plan that moves workers from one stage to another must free them first. The
        // Proteus-like baseline scales stage by stage, as its plans always did.
        let ordered = self.settings.planner != PlannerKind::Proteus;
        // Whether the demand measured is within what the plan serves (as in
        // `drop_rule`). Past the cluster's reach plans change often and every worker is
        // busy: holding variants there, or raising batches past the planned budget,
        // cost up to 0.18 of the bound at 2× on the random set (a cliff on
        // `r16-root-fan-join`).
        let within_reach = match plan.regime {
            crate::plan::Regime::Fastest => false,
            crate::plan::Regime::Capped => self.plan_demand <= plan.demand,
            _ => true,
        };
        let mut ups: Vec<(StageId, u32, Option<VariantId>)> = Vec::new();
        for (t, task) in self.model.tasks.iter().enumerate() {
            let stage = task.stage;
            let mut wanted: Vec<(usize, u32, u32)> =
                plan.hosts.iter().filter(|h| h.task == t && h.replicas > 0).map(|h| (h.variant, h.replicas, h.batch)).collect();
            if wanted.is_empty() {
                wanted.push((task.most_accurate, 1, self.model.batches[0]));
            }
            let target: u32 = wanted.iter().map(|w| w.1).sum::<u32>().clamp(1, task.max_replicas);
            let mine: Vec<WorkerId> = self.workers.iter().filter(|(_, a)| a.task == Some(t)).map(|(&w, _)| w).collect();
            let mut free: Vec<WorkerId> = Vec::new();
            let mut kept: Vec<(WorkerId, usize)> = Vec::new();
            let mut deficits: Vec<(usize, u32)> = Vec::new();
            for &(k, n, _) in &wanted {
                let hosting: Vec<WorkerId> = mine.iter().copied().filter(|w| self.workers[w].variant == k).collect();
                for (i, &w) in hosting.iter().enumerate() {
                    if (i as u32) < n {
                        kept.push((w, k));
                    }
                }
                if (hosting.len() as u32) < n {
                    deficits.push((k, n - hosting.len() as u32));
                }
            }
            for &w in &mine {
                if !kept.iter().any(|(x, _)| *x == w) {
                    free.push(w);
                }
            }
            // Switch spare workers of the stage to the variants short of replicas —
            // unless workers are still to come and, switched now, the stage would carry
            // less of its planned load than on the variants it runs (see
            // `hold_variants`): those wait for the new workers.
            // Not for the Proteus-like baseline: it routes by planned load, and a held
            // worker's variant has none planned.
            let hold = self.settings.hold_variants
                && within_reach
                && self.settings.planner != PlannerKind::Proteus
                && target > mine.len() as u32
                && !free.is_empty()
                && hold_variants(&self.model, &plan, self.settings.budget, &self.workers, (t, &mine), &wanted);
            let mut still_short: Vec<(usize, u32)> = Vec::new();
            for (k, mut n) in deficits {
                while n > 0 && !hold {
                    let Some(w) = free.pop() else { break };
                    ctx.set_variant(VariantTarget::Worker(w), task.variants[k].id);
                    self.stats.switches += 1;
                    if let Some(a) = self.workers.get_mut(&w) {
                        a.variant = k;
                    }
                    kept.push((w, k));
                    n -= 1;
                }
                if n > 0 {
                    still_short.push((k, n));
                }
            }
            // Workers held on a variant the plan does not host (for now) serve within
            // the budget of the task's main planned variant.
            if hold {
                let (k0, _, b0) = wanted[0];
                let budget = budget_ns(&self.model, Some(&plan), self.settings.budget, t, k0, b0);
                for &w in &free {
                    if let Some(a) = self.workers.get_mut(&w) {
                        a.batch = batch_within(&self.model, t, a.variant, budget);
                        a.budget_ns = budget;
                    }
                }
            }
            // Batches and budgets of the kept workers.
            for &(w, k) in &kept {
                let batch = match wanted.iter().find(|x| x.0 == k) {
                    Some(&(_, n, batch)) if self.settings.batch_up => {
                        let have = kept.iter().filter(|x| x.1 == k).count() as u32;
                        short_handed_batch(&self.model, &plan, self.settings.budget, t, k, (batch, n, have), within_reach)
                    }
                    Some(&(_, _, batch)) => batch,
                    None => 1,
                };
                let budget = budget_ns(&self.model, Some(&plan), self.settings.budget, t, k, batch);
                if let Some(a) = self.workers.get_mut(&w) {
                    a.batch = batch;
                    a.budget_ns = budget;
                }
            }
            // Scale the stage: starting workers count towards the shortage, unless
            // they were asked for too long ago.
            let mut requested = self.requested.get(&stage).copied().unwrap_or(0);
            let stale = self.scaled_up_at.get(&stage).is_none_or(|&at| ctx.now().saturating_sub(at) > SCALE_PATIENCE_NS);
            if stale && requested > mine.len() as u32 {
                requested = mine.len() as u32;
            }
            let starting = requested.saturating_sub(mine.len() as u32);
            let mut short: u32 = still_short.iter().map(|s| s.1).sum::<u32>().saturating_sub(starting);
            if target > requested {
                let mut total = requested;
                for &(k, n) in &still_short {
                    let add = n.min(short).min(target - total);
                    if add > 0 {
                        total += add;
                        short -= add;
                        ups.push((stage, total, Some(task.variants[k].id)));
                    }
                }
                if total < target {
                    ups.push((stage, target, Some(task.variants[wanted[0].0].id)));
                }
                // Raised to what is granted below.
                self.requested.insert(stage, requested);
                self.scaled_up_at.insert(stage, ctx.now());
                if !ordered {
                    for (stage, replicas, variant) in ups.drain(..) {
                        ctx.scale(stage, replicas, variant);
                        self.requested.insert(stage, replicas);
                    }
                }
            } else if target < requested && self.planned_for_traffic {
                // Before any traffic the plan is for no demand: the workers the cluster
                // starts with stay until the first plan for the traffic (100 ms after
                // the first request) says what to keep, rather than being retired and
                // started again (on five-stage at a quarter of its bound the start-up
                // dropped 1.5 % of the requests).
                ctx.scale(stage, target, None);
                self.requested.insert(stage, target);
            }
        }
        // A scale-up may not take the cluster past its size while workers of earlier
        // scale-downs still drain: each stage holds the larger of its target and its
        // workers, and what does not fit now is asked for again at a later tick. With
        // `hardware_slack` the plans use the whole cluster, so Loki and the
        // InferLine-like baseline meet this; the Proteus-like baseline scales as before.
        let held = |requested: &BTreeMap<StageId, u32>, stage: StageId, workers: &BTreeMap<WorkerId, Assigned>| {
            let present = workers.values().filter(|a| a.stage == stage).count() as u32;
            requested.get(&stage).copied().unwrap_or(0).max(present)
        };
        let stages: Vec<StageId> = ctx.config().stages.iter().map(|s| s.id).collect();
        let max_workers = ctx.config().max_workers;
        for (stage, replicas, variant) in ups {
            let allowed = if ordered {
                let total: u32 = stages.iter().map(|&s| held(&self.requested, s, &self.workers)).sum();
                replicas.min(held(&self.requested, stage, &self.workers) + max_workers.saturating_sub(total))
            } else {
                replicas
            };
            if allowed > self.requested.get(&stage).copied().unwrap_or(0) {
                ctx.scale(stage, allowed, variant);
                self.requested.insert(stage, allowed);
            }
        }
    }

    /// Rebuild the routing tables (MostAccurateFirst, or planned load for the
    /// Proteus-like baseline); [`Runtime::send_routes`] publishes them once the call's
    /// events are all handled.
    fn balance(&mut self) {
        let factors = self.factors();
        let mut list = Vec::new();
        for (&id, a) in &self.workers {
            let Some(t) = a.task else { continue };
            let v = &self.model.tasks[t].variants[a.variant];
            let b = self.model.batches.iter().position(|&x| x == a.batch).unwrap_or(0);
            let planned_load = self.plan.as_ref().and_then(|p| p.hosting(t, a.variant)).map_or(0.0, |h| h.load / h.replicas.max(1) as f64);
            list.push(BalancerWorker {
                id,
                task: t,
                accuracy: v.accuracy,
                capacity: v.throughput(b, &self.model.batches),
                budget_ns: a.budget_ns,
                factors: self.worker_factor(id, &factors),
                planned_load,
            });
        }
        let tick_s = self.tick_ns as f64 / 1e9;
        self.routing = match self.settings.planner {
            PlannerKind::Proteus => planned_load_routing(&self.model, &list),
            _ => most_accurate_first(&self.model, &list, self.demand.estimate(), tick_s, self.settings.ties),
        };
        self.routes_unsent = true;
    }

    /// Send the routing tables to the host if they were rebuilt since last sent. Once
    /// per call, after its events: a table built on one event of a call may name a
    /// worker a later event of the same call removed (several workers removed at
    /// once), which the host would refuse.
    fn send_routes(&mut self, ctx: &mut Ctx) {
        if !std::mem::take(&mut self.routes_unsent) {
            return;
        }
        let to_routes =
            |table: &Vec<(WorkerId, f64)>| -> Vec<Route> { table.iter().map(|&(worker, weight)| Route { worker, weight }).collect() };
        if !self.routing.front.is_empty() {
            ctx.set_routes(self.model.tasks[0].stage, None, to_routes(&self.routing.front));
        }
        if self.settings.planner == PlannerKind::Proteus {
            for (t, table) in self.routing.by_task.iter().enumerate().skip(1) {
                if !table.is_empty() {
                    ctx.set_routes(self.model.tasks[t].stage, None, to_routes(table));
                }
            }
        }
        for (&(source, child), table) in &self.routing.tables {
            if !table.is_empty() {
                ctx.set_routes(self.model.tasks[child].stage, Some(source), to_routes(table));
            }
        }
    }

    fn is_task_worker(&self, worker: WorkerId, task: usize) -> bool {
        self.workers.get(&worker).is_some_and(|a| a.task == Some(task))
    }

    /// The worker a request at `task` goes to.
    fn route(&mut self, task: usize, origin: RequestId) -> Option<WorkerId> {
        let unit = self.unit();
        let drawn = match self.model.tasks[task].parent {
            None => sample(&self.routing.front, unit),
            Some(parent) => match self.pins.get(&(origin, task)).filter(|&w| self.is_task_worker(w, task)) {
                // Opportunistic rerouting chose this worker for its spare capacity.
                Some(pinned) => return Some(pinned),
                None => self
                    .processed_by
                    .get(&(origin, parent))
                    .and_then(|source| self.routing.tables.get(&(source, task)))
                    .and_then(|table| sample(table, unit))
                    .or_else(|| self.routing.by_task.get(task).and_then(|table| sample(table, unit))),
            },
        };
        if let Some(w) = drawn.filter(|&w| self.is_task_worker(w, task)) {
            let join_shortest = self.settings.shortest_queue
                && (self.settings.planner != PlannerKind::Proteus
                    || self.plan.as_ref().is_some_and(|p| p.regime == crate::plan::Regime::Accuracy));
            return Some(if join_shortest { self.shortest_alike(w) } else { w });
        }
        // No table (yet) or a stale one: the task's worker with the shortest queue.
        self.workers
            .iter()
            .filter(|(_, a)| a.task == Some(task))
            .map(|(&w, _)| w)
            .min_by_key(|w| self.queues.get(w).map_or(0, VecDeque::len))
    }

    /// The worker running the same task and variant as `drawn` with the least work
    /// waiting and running (requests), `drawn` on a tie.
    fn shortest_alike(&self, drawn: WorkerId) -> WorkerId {
        let Some(like) = self.workers.get(&drawn) else { return drawn };
        let work = |w: &WorkerId| self.queues.get(w).map_or(0, VecDeque::len) + self.running.get(w).map_or(0, Vec::len);
        let mut best = (work(&drawn), drawn);
        for (w, a) in &self.workers {
            if *w != drawn && a.task == like.task && a.variant == like.variant {
                let load = work(w);
                if load < best.0 {
                    best = (load, *w);
                }
            }
        }
        best.1
    }

    fn enqueue(&mut self, task: usize, queued: Queued) {
        // A step of a stateful sequence runs only on the worker holding its state: queued
        // anywhere else, the SDK's guard moves it there at dispatch (or hands it back as
        // a new arrival once that worker is idle).
        let holder = queued.holder.filter(|&w| self.is_task_worker(w, task));
        match holder.or_else(|| self.route(task, queued.origin)) {
            Some(w) => self.queues.entry(w).or_default().push_back(queued),
            None => self.orphans.entry(task).or_default().push_back(queued),
        }
    }

    fn arrival(&mut self, request: Request) {
        let Some(task) = self.model.task_of(request.stage) else {
            self.pseudo_queues.entry(request.stage).or_default().push_back(request.id);
            return;
        };
        if task == 0 && request.requeues == 0 {
            self.root_arrivals += 1;
            self.first_arrival.get_or_insert(request.arrived_at);
        }
        self.task_arrivals[task] += 1;
        if let Some(parent) = self.model.tasks[task].parent {
            if let Some(pending) = self.pending_children.get_mut(&(request.origin, parent)) {
                if let Some(slot) = self.model.child_slot(parent, task) {
                    pending.counts[slot] += 1;
                }
            }
        }
        let queued = Queued {
            id: request.id,
            origin: request.origin,
            arrived_at: request.arrived_at,
            deadline: request.deadline,
            examined: false,
            holder: request.correlation.as_ref().and_then(|c| c.worker),
        };
        self.enqueue(task, queued);
    }

    fn batch_done(&mut self, outcome: &BatchOutcome) {
        let Some(ran) = self.running.remove(&outcome.worker) else { return };
        let Some(Assigned { task: Some(task), .. }) = self.workers.get(&outcome.worker).cloned() else { return };
        let children = self.model.tasks[task].children.len();
        for (_, origin) in ran {
            self.processed_by.insert((origin, task), outcome.worker);
            if children > 0 {
                self.pending_children
                    .entry((origin, task))
                    .or_insert_with(|| PendingChildren { workers: Vec::new(), counts: vec![0; children] })
                    .workers
                    .push(outcome.worker);
            }
        }
    }

    /// Count the sub-requests of the batches that finished in this call.
    fn flush_telemetry(&mut self) {
        let history = self.settings.factor_history;
        for ((_, task), pending) in std::mem::take(&mut self.pending_children) {
            // The sub-requests of siblings processed together cannot be told apart:
            // each sibling counts as one sample of their mean.
            let share = 1.0 / pending.workers.len().max(1) as f64;
            for &worker in &pending.workers {
                let windows = self
                    .worker_factors
                    .entry(worker)
                    .or_insert_with(|| (0..pending.counts.len()).map(|_| CountWindow::new(history)).collect());
                let variant = self.workers.get(&worker).map(|a| a.variant);
                for (slot, &count) in pending.counts.iter().enumerate() {
                    let count = count as f64 * share;
                    windows[slot].push(count);
                    if let Some(k) = variant {
                        self.variant_factors[task][k][slot].push(count);
                    }
                }
            }
            for (slot, &count) in pending.counts.iter().enumerate() {
                self.child_counts[task][slot] += count as f64;
            }
        }
    }

    /// Make the first plan once [`FIRST_PLAN_AFTER_NS`] have passed since the first
    /// request, for the root rate seen since (a tick makes the later ones). Not for the
    /// Proteus-like baseline, which plans from per-task estimates only ticks make.
    fn plan_first(&mut self, ctx: &mut Ctx) {
        let Some(first) = self.first_arrival else { return };
        // The Proteus-like planner plans per task from the tick's per-task estimates
        // (planned 100 ms after the first request, in a call of request events, its
        // MILPs ran past the call's fuel at twice the capacity bound, and the tasks
        // below the root, seen only from their first pieces, were planned short).
        if self.planned_for_traffic || self.settings.planner == PlannerKind::Proteus {
            return;
        }
        let elapsed = ctx.now().saturating_sub(first);
        if elapsed < FIRST_PLAN_AFTER_NS {
            return;
        }
        self.planned_for_traffic = true;
        let estimate = self.root_arrivals as f64 / (elapsed as f64 / 1e9);
        self.replan(ctx, estimate, false, Previous::Trust);
    }

    /// Take the requests the host ended while they were queued out of every queue, and
    /// forget them. Dispatch skips them lazily, but only in the queues it forms batches
    /// from; an id never met there would stay in `ended` for good (it grew by every
    /// sibling of every dropped request: about 1 MiB per 65,000 ids).
    fn forget_ended(&mut self) {
        if self.ended.is_empty() {
            return;
        }
        let ended = &self.ended;
        for queue in self.queues.values_mut().chain(self.orphans.values_mut()) {
            queue.retain(|q| !ended.contains(&q.id));
        }
        for queue in self.pseudo_queues.values_mut() {
            queue.retain(|id| !ended.contains(id));
        }
        self.ended.clear();
    }

    fn tick(&mut self, ctx: &mut Ctx) {
        let now = ctx.now();
        let elapsed = now.saturating_sub(self.last_tick).max(1) as f64 / 1e9;
        self.last_tick = now;
        self.demand.push(self.root_arrivals as f64 / elapsed);
        self.root_arrivals = 0;
        for (t, estimator) in self.task_demand.iter_mut().enumerate() {
            estimator.push(self.task_arrivals[t] as f64 / elapsed);
            self.task_arrivals[t] = 0;
        }
        let memory = (4.0 * self.model.slo_ms * 1e6) as u64 + 5_000_000_000;
        self.processed_by.rotate(now, memory);
        self.pins.rotate(now, memory);
        self.forget_ended();
        let estimate = self.demand.estimate();
        let due = self.last_plan.is_none_or(|at| now.saturating_sub(at) >= self.settings.rm_period_ns);
        let undersized = self.undersized_task().is_some();
        let jump = estimate > (1.0 + self.settings.replan_jump) * self.plan_demand
            || estimate < (1.0 - self.settings.replan_jump) * self.plan_demand;
        ctx.host().emit("loki.demand", estimate);
        if ctx.param("debug").is_some() {
            let queued: usize = self.queues.values().map(VecDeque::len).sum();
            let longest = self.queues.values().map(VecDeque::len).max().unwrap_or(0);
            #[cfg(target_arch = "wasm32")]
            let pages = core::arch::wasm32::memory_size(0);
            #[cfg(not(target_arch = "wasm32"))]
            let pages = 0;
            let tasks: Vec<String> = self.task_demand.iter().map(|d| format!("{:.0}", d.estimate())).collect();
            let per_worker: Vec<String> = self
                .workers
                .iter()
                .filter_map(|(w, a)| {
                    Some(format!(
                        "{w}:{}/{}/{}q{}b{}",
                        a.task?,
                        a.variant,
                        a.batch,
                        self.queues.get(w).map_or(0, VecDeque::len),
                        a.budget_ns / 1_000_000
                    ))
                })
                .collect();
            let msg = format!(
                "t={:.0}s mem={pages} D={estimate:.1} tasks={tasks:?} stats={:?} plan={:?} queued={queued} longest={longest} ended={} processed={} pins={} orphans={} pseudo={:?} workers={per_worker:?}",
                now as f64 / 1e9,
                self.stats,
                self.plan.as_ref().map(|p| {
                    let hosts: Vec<String> =
                        p.hosts.iter().map(|h| format!("{}/{}/{}x{}@{:.0}", h.task, h.variant, h.batch, h.replicas, h.load)).collect();
                    format!("{:?} for {:.0} QPS: {}", p.regime, p.demand, hosts.join(" "))
                }),
                self.ended.len(),
                self.processed_by.current.len() + self.processed_by.previous.len(),
                self.pins.current.len() + self.pins.previous.len(),
                self.orphans.values().map(VecDeque::len).sum::<usize>(),
                self.pseudo_queues.values().map(VecDeque::len).collect::<Vec<_>>(),
            );
            ctx.log(yardmaster_sdk::Level::Info, &msg);
        }
        if due || jump || undersized {
            self.planned_for_traffic |= self.first_arrival.is_some();
            // An undersized plan's demand overstates what it serves: it must not keep
            // serving while the MILP runs as if it served as much as a fresh plan.
            let previous = if undersized { Previous::Distrust } else { Previous::Trust };
            self.replan(ctx, estimate, true, previous);
        } else if self.job.is_some() {
            self.advance_job(ctx);
        } else {
            self.reconcile(ctx);
            self.balance();
        }
    }

    fn worker_added(&mut self, ctx: &mut Ctx, worker: Worker) {
        let assigned = Self::assigned_for(&self.model, &self.settings, ctx, &worker);
        self.workers.insert(worker.id, assigned);
        self.queues.entry(worker.id).or_default();
        self.workers_added = true;
    }

    /// After a call's events, when workers were added: reconcile the plan, rebalance,
    /// and route the requests that found no worker of their task.
    fn settle_added_workers(&mut self, ctx: &mut Ctx) {
        if !std::mem::take(&mut self.workers_added) {
            return;
        }
        self.reconcile(ctx);
        self.balance();
        let tasks: Vec<usize> = self.orphans.keys().copied().collect();
        for task in tasks {
            let waiting = self.orphans.remove(&task).unwrap_or_default();
            for q in waiting {
                self.enqueue(task, q);
            }
        }
    }

    fn worker_removed(&mut self, ctx: &mut Ctx, worker: WorkerId) {
        let Some(assigned) = self.workers.remove(&worker) else { return };
        self.running.remove(&worker);
        self.worker_factors.remove(&worker);
        let waiting = self.queues.remove(&worker).unwrap_or_default();
        self.reconcile(ctx);
        self.balance();
        if let Some(task) = assigned.task {
            for q in waiting {
                self.enqueue(task, q);
            }
        }
    }

    /// Form and dispatch a batch for every idle worker with work.
    fn dispatch(&mut self, ctx: &mut Ctx) {
        let now = ctx.now();
        let idle: Vec<WorkerId> = self.workers.keys().copied().filter(|&w| ctx.worker(w).is_some_and(|v| v.idle)).collect();
        for w in idle {
            // Idle when the loop began, but a dispatch to another worker may have run
            // here since: the SDK's guard moves a sequence step to the idle worker
            // holding its sequence. A second batch would be rejected (the worker is
            // busy) and its requests lost in the policy's hands until they expired.
            if !ctx.worker(w).is_some_and(|v| v.idle) {
                continue;
            }
            let assigned = self.workers[&w].clone();
            let Some(task) = assigned.task else {
                // Stages outside the tree run first come, first served (an iteration
                // stage keeps its resident sequences running first).
                let limit = ctx.batch_limit(assigned.stage) as usize;
                let queue = self.pseudo_queues.entry(assigned.stage).or_default();
                let mut batch: Vec<RequestId> = ctx.resident(w).iter().take(limit).map(|s| s.id).collect();
                while batch.len() < limit {
                    let Some(id) = queue.pop_front() else { break };
                    if !self.ended.remove(&id) {
                        batch.push(id);
                    }
                }
                if !batch.is_empty() {
                    ctx.dispatch(w, batch);
                }
                continue;
            };
            let mut queue = self.queues.remove(&w).unwrap_or_default();
            if !self.ended.is_empty() {
                queue.retain(|q| !self.ended.remove(&q.id));
            }
            if queue.is_empty() {
                self.queues.insert(w, queue);
                continue;
            }
            let variant = self.model.tasks[task].variants[assigned.variant].id;
            let stage = assigned.stage;
            let latency = |b: u32| ctx.latency().mean(stage, variant, b).unwrap_or(0);
            let max_batch = assigned.batch.min(ctx.batch_limit(stage));
            let spec = crate::batching::Worker {
                max_batch,
                budget_ns: assigned.budget_ns,
                leaf: self.model.tasks[task].children.is_empty(),
                latency: &latency,
                downstream_ns: crate::budgets::below_ns(&self.model, self.plan.as_ref(), task),
                drop_when: self.drop_rule(),
            };
            let factors = self.factors();
            let my_factors = self.worker_factor(w, &factors);
            let mode = self.settings.drop_mode;
            let formed = {
                let routing = &mut self.routing;
                let workers = &self.workers;
                let model = &self.model;
                let rng = &mut self.rng;
                let mut next_unit = move || {
                    let (state, value) = splitmix64(*rng);
                    *rng = state;
                    (value >> 11) as f64 / (1u64 << 53) as f64
                };
                let mut reroute = |_: &Queued, overshoot: u64| -> Option<crate::batching::Pins> {
                    let mut pins = Vec::new();
                    for (slot, &child) in model.tasks[task].children.iter().enumerate() {
                        let need = my_factors.get(slot).copied().unwrap_or(0.0);
                        if need <= 0.0 {
                            continue;
                        }
                        let planned = routing.tables.get(&(w, child)).and_then(|t| sample(t, next_unit()))?;
                        let planned_budget = workers.get(&planned)?.budget_ns;
                        let backups = routing.backup.get_mut(child)?;
                        let target = choose_reroute(backups, planned, planned_budget, overshoot, need, next_unit())?;
                        pins.push((child, target));
                    }
                    Some(pins)
                };
                form_batch(&mut queue, &spec, now, mode, &mut reroute)
            };
            for id in &formed.dropped {
                ctx.drop_request(*id, DropReason::DeadlineUnreachable);
            }
            self.stats.dropped += formed.dropped.len() as u64;
            if self.stats.dropped_by_task.len() <= task {
                self.stats.dropped_by_task.resize(task + 1, 0);
            }
            self.stats.dropped_by_task[task] += formed.dropped.len() as u64;
            for (request, pins) in &formed.pinned {
                self.stats.rerouted += 1;
                for &(child, target) in pins {
                    self.pins.insert((request.origin, child), target);
                }
            }
            if !formed.batch.is_empty() {
                // Origins of the batch, for telemetry and routing of the sub-requests.
                self.running.insert(w, formed.batch.iter().copied().zip(formed.origins.iter().copied()).collect());
                ctx.dispatch(w, formed.batch.clone());
            }
            self.queues.insert(w, queue);
        }
    }
}

impl<F: Flavour> Policy for LokiPolicy<F> {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let mut runtime = Runtime::new(ctx, F::PLANNER, F::DROP)?;
        runtime.send_routes(ctx);
        Ok(Self { runtime, flavour: PhantomData })
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.runtime.arrival(request);
    }

    fn on_batch_done(&mut self, _ctx: &mut Ctx, outcome: BatchOutcome) {
        self.runtime.batch_done(&outcome);
    }

    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: Snapshot) {
        self.runtime.tick(ctx);
    }

    fn on_worker_added(&mut self, ctx: &mut Ctx, worker: Worker) {
        self.runtime.worker_added(ctx, worker);
    }

    fn on_worker_removed(&mut self, ctx: &mut Ctx, worker: WorkerId) {
        self.runtime.worker_removed(ctx, worker);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.runtime.ended.insert(request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.runtime.settle_added_workers(ctx);
        self.runtime.plan_first(ctx);
        self.runtime.flush_telemetry();
        self.runtime.send_routes(ctx);
        self.runtime.dispatch(ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use yardmaster_sdk::{Action, Correlation, DeviceKind, Driver, Event, NullHost, Request, RequestId, Worker, WorkerId};

    use super::{Flavour, InferLineFlavour, LokiFlavour, LokiPolicy, ProteusFlavour};
    use crate::model::toy;

    /// The toy chain with two workers at its root (0 and 1) and one below (2).
    fn two_at_the_root<F: Flavour>() -> Driver<LokiPolicy<F>> {
        let mut config = toy::chain();
        let worker = |id: u32, stage: u32| Worker {
            id,
            stage,
            variant: 0,
            device: DeviceKind::Gpu,
            threads: 1,
            memory_bytes: 1 << 30,
            host: 0,
            slot: id,
        };
        config.workers = vec![worker(0, 0), worker(1, 0), worker(2, 1)];
        Driver::new(config, Box::new(NullHost::new(0, 1))).expect("init").0
    }

    /// Request `id` at the root, a step of a sequence held by `holder` if any.
    fn arrival(id: RequestId, holder: Option<WorkerId>) -> Event {
        let correlation = holder.map(|worker| Correlation { id: 100 + id, start: false, end: false, worker: Some(worker) });
        Event::Arrival(Request { input_size: 1, correlation, ..yardmaster_sdk::testing::request(id, 0, 0, 200_000_000) })
    }

    /// Drive `F` with root requests, every other one a step held by worker 1, and the
    /// workers going idle: every call sends at most one batch to a worker (the host
    /// rejects a second one, and its requests are lost), a step runs only on worker 1,
    /// and every request is dispatched once.
    fn steps_never_strand_a_batch<F: Flavour>() {
        let mut driver = two_at_the_root::<F>();
        let steps: BTreeSet<RequestId> = (1..=8).filter(|id| id % 2 == 0).collect();
        let mut events: Vec<Event> = [0, 1, 2].into_iter().map(Event::WorkerIdle).collect();
        events.extend((1..=8).map(|id| arrival(id, steps.contains(&id).then_some(1))));
        let mut dispatched: Vec<RequestId> = Vec::new();
        for call in 0..20u64 {
            let actions = driver.handle(call * 1_000_000, std::mem::take(&mut events));
            let mut busy = BTreeSet::new();
            for action in &actions {
                let Action::Dispatch(d) = action else { continue };
                assert!(busy.insert(d.worker), "call {call}: a second batch for busy worker {}: {actions:?}", d.worker);
                if d.worker < 2 {
                    for id in &d.requests {
                        assert!(!steps.contains(id) || d.worker == 1, "call {call}: step {id} on worker {}", d.worker);
                    }
                    dispatched.extend(&d.requests);
                }
            }
            // The batches sent finish by the next call.
            events = busy.into_iter().map(Event::WorkerIdle).collect();
        }
        dispatched.sort_unstable();
        assert_eq!(dispatched, (1..=8).collect::<Vec<_>>(), "every root request dispatched once");
    }

    #[test]
    fn a_sequence_step_never_makes_a_second_batch_for_a_busy_worker() {
        steps_never_strand_a_batch::<ProteusFlavour>();
        steps_never_strand_a_batch::<LokiFlavour>();
        steps_never_strand_a_batch::<InferLineFlavour>();
    }
}
