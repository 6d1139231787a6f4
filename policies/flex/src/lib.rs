//! `flex`: SHEPHERD's online scheduler FLEX with preemption, and its periodic planner
//! HERD (Zhang et al., NSDI'23; spec `../shared/specs/flex.md`).
//!
//! Workers are GPUs that keep every model of their serving group resident and switch
//! model per batch (a dispatch names the variant); a stream's model is the variant its
//! name starts with (see [`yardmaster_sdk::helpers::models`]). Each serving group runs
//! one FLEX instance ([`group::FlexGroup`]): per-model deadline-ordered queues; on a
//! completion the worker gets the largest feasible batch across all models; on an
//! arrival every worker is offered the largest feasible batch and a running batch is
//! preempted when that batch is at least λ (3.03) times larger; preempted requests that
//! can still finish go back to their queues, the others and every request that can no
//! longer finish even alone are dropped. Two refinements are on by default (each can
//! be turned off for the paper's rules, see [`params`]): while the group could still
//! meet every queued deadline serving earliest deadline first, an idle worker takes the
//! most urgent batch instead of the largest (`select = adaptive`); and a preemption is
//! skipped when the preempting batch would lose fewer than λ·b of its requests by
//! waiting for the group's other workers (`defer_preemption`). HERD ([`herd`]) splits the workers into groups
//! of at most Ḡ = 12 and maps streams to groups, at start-up and every period on ticks,
//! from the arrival rates it measured.
//!
//! The scheduler thinks in logical time; this adapter reconciles it with the host: a
//! preempted batch's requests come back as arrivals (and its worker as idle) at the
//! next decision point, so a batch that needs them, or a worker being aborted, waits
//! in `pending` until both are physically available. The delay from a preemption to
//! the worker's next `worker-idle` is measured and, as a fraction of the aborted
//! batch's latency, used as the preemption delay δ_pre (with `preempt_delay` as a
//! floor). Parameters: [`params`].
//!
//! With the scheduler cost model on (`sched_cost_us`, `sched_cost_per_worker_ns`;
//! [`sched`]), each group's scheduler is serial and every arrival or freed worker is an
//! event that waits for it and costs simulated CPU time; the group acts on the event
//! (through a `set-timer`) when its handling ends. A completion's bookkeeping (the
//! worker is free, its requests done) is immediate; choosing the worker's next batch is
//! the costed event.

pub mod group;
pub mod herd;
pub mod params;
pub mod sched;
pub mod spread;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use yardmaster_sdk::helpers::stage_graph::batch_reserves;
use yardmaster_sdk::helpers::{EntryShedder, Ewma, ModelCatalog, StageGraph};
use yardmaster_sdk::{
    BatchOutcome, Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId, Snapshot, StageId, StageKind, Worker, WorkerId,
};

use group::{Decision, FlexGroup, Forgotten, Key};
use herd::{Plan, PlanInput, StreamLoad};
use params::FlexParams;
use sched::{Handling, SerialScheduler, Step};
use spread::Spreader;

/// An event for a group's serial scheduler (scheduler cost model only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchedEvent {
    /// A fresh request to queue and dispatch.
    Arrival(RequestId),
    /// A worker the group knows is free: give it the largest feasible batch.
    Freed(WorkerId),
}

/// Where a request physically is, as far as the host is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phys {
    /// Held by the policy: it may be dispatched or dropped.
    Held,
    /// In a batch the policy preempted: it comes back as an arrival (then dropped if
    /// `drop`).
    Returning { drop: bool },
    /// In a batch running on a worker.
    Busy(WorkerId),
    /// An unfinished sequence paused on an iteration worker.
    Resident(WorkerId),
}

/// A request the policy knows.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    model: usize,
    stage: StageId,
    key: Key,
    stream: u32,
    phys: Phys,
}

/// A batch decided for a worker, not yet dispatched.
#[derive(Debug, Clone)]
struct PendingStart {
    model: usize,
    requests: Vec<RequestId>,
}

/// The FLEX policy: serving groups, each with its scheduler, and the reconciliation
/// with the host.
pub struct Flex {
    params: FlexParams,
    catalog: ModelCatalog,
    groups: Vec<FlexGroup>,
    worker_group: BTreeMap<WorkerId, usize>,
    /// Group of each stream (by stream id; unknown streams use group 0).
    stream_group: Vec<usize>,
    tracked: HashMap<RequestId, Tracked>,
    /// Fresh arrivals of this call, in order.
    fresh: Vec<RequestId>,
    /// Workers whose batch finished in this call, with the requests of the batch.
    finished: Vec<(WorkerId, Vec<RequestId>)>,
    /// Requests of this call's finished batches (an iteration worker's unfinished
    /// sequences are taken back from here).
    ran: HashMap<RequestId, Tracked>,
    /// `worker-idle` events of this call.
    idled: Vec<WorkerId>,
    pending: BTreeMap<WorkerId, PendingStart>,
    /// Workers running a batch the policy dispatched.
    busy: BTreeSet<WorkerId>,
    /// Workers being aborted: when, and the aborted batch's expected latency.
    aborting: BTreeMap<WorkerId, (Instant, u64)>,
    /// Measured preemption delay as a fraction of the aborted batch's latency.
    measured_delay: Ewma,
    /// Arrivals per stream since the last plan, and when that plan was made.
    arrivals_since_plan: Vec<u64>,
    planned_at: Option<Instant>,
    /// Preemptions sent to the host, and those that only replaced a batch not yet
    /// dispatched.
    physical_preemptions: u64,
    virtual_preemptions: u64,
    /// Each group's serial scheduler (scheduler cost model only; same index as `groups`).
    schedulers: Vec<SerialScheduler<SchedEvent>>,
    /// Groups whose timer fired in this call.
    timers: BTreeSet<usize>,
    /// Per stage: the time held back for the later stages of a pipeline; a request's
    /// deadline at the stage is its own less this ([`stage_reserves`]).
    reserve: Vec<u64>,
    /// Spreads the cluster's workers over the stages (`spread`).
    spreader: Option<Spreader>,
    /// Workers the last HERD plan was made for.
    planned_workers: usize,
    /// Admission at the entry from the later stages' drops (`shed`; none at a single
    /// stage).
    shedder: Option<EntryShedder>,
}

/// Ask the host for `replicas` workers at each stage: the stages that shrink first, so
/// that the cluster's limit leaves room for those that grow.
fn scale_to(ctx: &mut Ctx, replicas: &[u32]) {
    let current = |s: usize| ctx.workers().filter(|w| w.info.stage as usize == s).count() as u32;
    let (shrink, grow): (Vec<usize>, Vec<usize>) = (0..replicas.len()).partition(|&s| replicas[s] < current(s));
    for s in shrink.into_iter().chain(grow) {
        ctx.scale(s as StageId, replicas[s], None);
    }
}

/// Cap every model's batches at the size that serves the most requests per second
/// within its stage's budget: the loosest SLO of the streams less the stage's
/// `reserve` (no budget without an SLO). FLEX's largest window otherwise grows every
/// batch to the most the deadlines allow, and on a profile with a sweet spot (Loki's
/// `yolov5n`: 176 frames/s in batches of 3, 94 in batches of 12, 69 in 16) that serves
/// fewer requests the deeper the queue — a cliff past capacity. Where throughput grows
/// with the batch (SHEPHERD's linear model) the limit is the largest batch that fits
/// the budget, which no window exceeds anyway.
pub fn limit_to_productive_batches(catalog: &mut ModelCatalog, ctx: &Ctx, reserve: &[u64], max_batch: u32) {
    let slo = ctx.config().streams.iter().map(|s| s.slo).filter(|&slo| slo > 0).max().unwrap_or(u64::MAX);
    for model in 0..catalog.len() {
        let info = catalog.get(model);
        let budget = slo.saturating_sub(reserve.get(info.stage as usize).copied().unwrap_or(0));
        let best = info.most_productive_batch_within(budget, max_batch.min(info.max_batch).max(1));
        // A model that cannot finish one request within the budget keeps its limit:
        // FLEX's deadline checks drop what cannot make it.
        if best > 0 {
            catalog.limit_batch(model, best);
        }
    }
}

/// Per stage, the time FLEX holds back for the stages after it (`downstream_reserve`
/// batch durations per later stage, each at that stage's largest batch within the SLO
/// and slowest variant, along the longest downstream path, scaled down to fit the tightest SLO;
/// see [`StageGraph::downstream_reserve`]). FLEX checks a request's deadline only at
/// the stage it is at: without a reserve, an early stage under overload serves requests
/// with the whole end-to-end budget and the later stages receive requests that can no
/// longer finish, so goodput falls off a cliff past capacity. All zeros with a factor
/// of 0 (the paper's rule) and at a single stage (SHEPHERD's setting).
pub fn stage_reserves(ctx: &Ctx, factor: f64, max_batch: u32) -> Vec<u64> {
    reserves(ctx, factor, max_batch).0
}

/// Per stage, the time FLEX holds back from a stage's own budget: the reserve for the
/// stages after it ([`stage_reserves`]) plus, by the same measure, the time the stages
/// before it take along the longest upstream path (SDK
/// [`StageGraph::upstream_reserve`]). Past capacity a request reaches a later stage
/// with about the SLO less the earlier stages' share left, not the whole SLO: a batch
/// limit computed from the SLO less the downstream reserve alone counts on batches
/// that stage never gets to form (a diamond's join after two branches: 80 ms batches
/// assumed, 48 ms left), and the spread, which reads the limits, gives it too few
/// workers (`upstream_share`, docs/flex.md).
pub fn stage_held(ctx: &Ctx, factor: f64, max_batch: u32) -> Vec<u64> {
    let (after, before) = reserves(ctx, factor, max_batch);
    after.iter().zip(before).map(|(a, b)| a + b).collect()
}

/// The stages where a loaded FLEX takes the freshest window (`fresh_window`): those with
/// stages after them and no fan-out above them. Past capacity the window of the
/// earliest deadlines that fit sends every request on with the least time a batch there
/// leaves, so the later stages receive requests with no more than the downstream
/// reserve left and drop what waits longer — and what they drop, the entry worked for.
/// The freshest window serves as many (the entry's queue drops what it cannot serve
/// either way) with the most time left for the stages after it. Not below a fan-out:
/// there each branch would choose its own freshest pieces, and the branches would serve
/// different requests that the join then loses (on the random set's diamonds `r06`,
/// `r12` and `r04`, 0.10–0.28 of the bound lost past capacity; docs/flex.md).
pub fn fresh_stages(graph: &StageGraph) -> Vec<StageId> {
    if graph.len() < 2 {
        return Vec::new();
    }
    (0..graph.len() as StageId)
        .filter(|&s| !graph.successors(s).is_empty() && graph.ancestors(s).iter().all(|&a| graph.successors(a).len() <= 1))
        .collect()
}

/// The downstream and upstream reserves of every stage (see [`stage_reserves`]; SDK
/// [`batch_reserves`]).
fn reserves(ctx: &Ctx, factor: f64, max_batch: u32) -> (Vec<u64>, Vec<u64>) {
    batch_reserves(ctx, factor, max_batch)
}

impl Flex {
    /// Drop at the entry the share of fresh arrivals the shedder does not admit
    /// ([`EntryShedder`]): the later stages are dropping that share anyway.
    fn shed_fresh(&mut self, now: Instant, out: &mut Vec<Decision>) {
        let Some(shedder) = &mut self.shedder else { return };
        shedder.advance(now);
        let tracked = &self.tracked;
        self.fresh.retain(|id| {
            let Some(t) = tracked.get(id) else { return true };
            if shedder.admit(t.stage) {
                return true;
            }
            out.push(Decision::Drop { request: *id, reason: DropReason::Overload });
            false
        });
    }

    /// The scheduler instances (for tests and reports).
    pub fn groups(&self) -> &[FlexGroup] {
        &self.groups
    }

    /// The group each stream maps to.
    pub fn stream_groups(&self) -> &[usize] {
        &self.stream_group
    }

    /// Preemptions sent to the host.
    pub fn physical_preemptions(&self) -> u64 {
        self.physical_preemptions
    }

    /// Per group: nanoseconds its serial scheduler spent on events, and events handled
    /// (empty without the scheduler cost model).
    pub fn scheduler_load(&self) -> Vec<(u64, u64)> {
        self.schedulers.iter().map(SerialScheduler::load).collect()
    }

    fn group_of_stream(&self, stream: u32) -> usize {
        self.stream_group.get(stream as usize).copied().unwrap_or(0).min(self.groups.len() - 1)
    }

    /// Whether HERD plans groups for this configuration: one batch stage whose workers
    /// outnumber Ḡ.
    fn herd_applies(&self, ctx: &Ctx) -> bool {
        let stages = &ctx.config().stages;
        self.params.herd
            && stages.len() == 1
            && stages[0].kind == StageKind::Batch
            && ctx.workers().count() > self.params.group_limit as usize
    }

    /// HERD's input from the current workers and the measured (or, before any
    /// measurement, equal) stream rates.
    fn plan_input(&self, ctx: &Ctx, rates: &[f64]) -> PlanInput {
        let config = ctx.config();
        let gpu_memory = ctx.workers().map(|w| w.info.memory_bytes).min().unwrap_or(0);
        let streams = config
            .streams
            .iter()
            .map(|s| {
                let model = self.catalog.model_of(s.id, s.entry).unwrap_or(0);
                let info = self.catalog.get(model);
                let limit = self.params.settings.max_batch.min(info.max_batch);
                let goodput = herd::single_gpu_goodput(|b| info.latency(b), limit, s.slo).max(1e-9);
                let rate = rates.get(s.id as usize).copied().unwrap_or(1.0).max(1e-6);
                StreamLoad { model, need: rate / goodput }
            })
            .collect();
        PlanInput {
            gpus: ctx.workers().count() as u32,
            group_limit: self.params.group_limit,
            gpu_memory,
            model_memory: self.catalog.models().iter().map(|m| m.memory_bytes).collect(),
            affinity: vec![0; self.catalog.len()],
            streams,
        }
    }

    /// Replace the groups with `plan`'s: workers are dealt to groups in id order,
    /// running batches stay with their worker, queued requests follow their stream.
    fn apply_plan(&mut self, ctx: &Ctx, plan: &Plan) {
        if plan.groups.is_empty() {
            return;
        }
        let mut queued = Vec::new();
        let mut runs = Vec::new();
        for group in &mut self.groups {
            queued.extend(group.take_queued());
            let ids: Vec<WorkerId> = group.worker_ids().collect();
            for id in ids {
                if let Some(worker) = group.remove_worker(id) {
                    runs.push((id, worker));
                }
            }
        }
        runs.sort_by_key(|(id, _)| *id);
        let settings = self.params.settings.clone();
        self.groups = plan.groups.iter().map(|g| FlexGroup::new(settings.clone(), g.models.clone())).collect();
        self.stream_group = plan.stream_group.clone();
        self.worker_group.clear();
        let mut sizes: Vec<u32> = plan.groups.iter().map(|g| g.size).collect();
        let mut current = 0;
        for (id, (stage, run)) in runs {
            while current + 1 < sizes.len() && sizes[current] == 0 {
                current += 1;
            }
            sizes[current] = sizes[current].saturating_sub(1);
            self.groups[current].adopt_worker(id, stage, run);
            self.worker_group.insert(id, current);
        }
        for (model, key) in queued {
            let stream = self.tracked.get(&key.2).map_or(0, |t| t.stream);
            let group = self.group_of_stream(stream);
            self.groups[group].enqueue(model, key);
        }
        let fraction = self.delay_fraction();
        for group in &mut self.groups {
            group.set_preempt_delay_fraction(fraction);
        }
        if self.params.sched_cost.is_some() {
            // Events not yet handled move to the group that now owns their stream or
            // worker; the new schedulers start free.
            let pending: Vec<SchedEvent> = self.schedulers.iter_mut().flat_map(SerialScheduler::take_all).collect();
            self.schedulers = (0..self.groups.len()).map(|_| SerialScheduler::default()).collect();
            for event in pending {
                let group = match event {
                    SchedEvent::Arrival(id) => self.tracked.get(&id).map(|t| self.group_of_stream(t.stream)),
                    SchedEvent::Freed(worker) => self.group_of_worker(worker),
                };
                if let Some(g) = group {
                    self.schedulers[g].push(event);
                    self.timers.insert(g);
                }
            }
        }
        ctx.host().emit("flex.groups", self.groups.len() as f64);
    }

    fn delay_fraction(&self) -> f64 {
        self.params.settings.preempt_delay_fraction.max(self.measured_delay.value().unwrap_or(0.0))
    }

    /// Plan (or re-plan) the groups with the rates measured since the last plan.
    fn replan(&mut self, ctx: &Ctx) {
        let now = ctx.now();
        let elapsed = self.planned_at.map_or(0, |at| now.saturating_sub(at));
        let rates: Vec<f64> = if elapsed > 0 && self.arrivals_since_plan.iter().any(|&n| n > 0) {
            self.arrivals_since_plan.iter().map(|&n| n as f64 / (elapsed as f64 / 1e9)).collect()
        } else {
            vec![1.0; ctx.config().streams.len()]
        };
        let input = self.plan_input(ctx, &rates);
        let plan = herd::plan(&input, self.params.solver, self.params.herd_nodes);
        self.apply_plan(ctx, &plan);
        self.arrivals_since_plan.iter_mut().for_each(|n| *n = 0);
        self.planned_at = Some(now);
        self.planned_workers = self.worker_group.len();
    }

    /// Turn decisions into actions (or pending starts).
    fn apply(&mut self, ctx: &mut Ctx, decisions: Vec<Decision>) {
        let now = ctx.now();
        for decision in decisions {
            match decision {
                Decision::Start { worker, model, requests, .. } => {
                    self.pending.insert(worker, PendingStart { model, requests });
                }
                Decision::Preempt { worker, requests } => {
                    if self.pending.remove(&worker).is_some() {
                        // The batch was never dispatched: nothing to abort.
                        self.virtual_preemptions += 1;
                        continue;
                    }
                    if !self.busy.remove(&worker) {
                        continue;
                    }
                    ctx.preempt(worker);
                    self.physical_preemptions += 1;
                    ctx.host().emit("flex.preempted_batch", requests.len() as f64);
                    let mut expected = 0;
                    let size = requests.len() as u32;
                    for id in requests {
                        if let Some(t) = self.tracked.get_mut(&id) {
                            if matches!(t.phys, Phys::Busy(w) | Phys::Resident(w) if w == worker) {
                                t.phys = Phys::Returning { drop: false };
                            }
                            expected = self.catalog.get(t.model).latency(size);
                        }
                    }
                    self.aborting.insert(worker, (now, expected.max(1)));
                }
                Decision::Drop { request, reason } => match self.tracked.get_mut(&request).map(|t| t.phys) {
                    Some(Phys::Held) => {
                        let stage = self.tracked.remove(&request).map(|t| t.stage);
                        if let (Some(shedder), Some(stage), false) = (&mut self.shedder, stage, reason == DropReason::Overload) {
                            shedder.dropped(stage);
                        }
                        ctx.drop_request(request, reason);
                    }
                    Some(Phys::Returning { .. }) => {
                        self.tracked.get_mut(&request).expect("tracked").phys = Phys::Returning { drop: true };
                    }
                    _ => {}
                },
            }
        }
    }

    /// Dispatch every pending batch whose worker is idle and whose requests are held.
    fn flush_pending(&mut self, ctx: &mut Ctx) {
        let ready: Vec<WorkerId> = self
            .pending
            .iter()
            .filter(|(w, _)| ctx.worker(**w).is_some_and(|v| v.idle))
            .filter(|(w, p)| {
                p.requests.iter().all(|id| self.tracked.get(id).is_some_and(|t| t.phys == Phys::Held || t.phys == Phys::Resident(**w)))
            })
            .map(|(w, _)| *w)
            .collect();
        for worker in ready {
            let start = self.pending.remove(&worker).expect("ready");
            for id in &start.requests {
                if let Some(t) = self.tracked.get_mut(id) {
                    t.phys = Phys::Busy(worker);
                }
            }
            let variant = self.catalog.get(start.model).variant;
            ctx.dispatch_variant(worker, start.requests, Some(variant));
            self.busy.insert(worker);
        }
    }

    fn group_of_worker(&self, worker: WorkerId) -> Option<usize> {
        self.worker_group.get(&worker).copied()
    }

    /// Run group `g`'s serial scheduler up to `now`: handle every event whose handling
    /// has ended or that is light, start the next one, and ask for a timer when it ends.
    fn pump(&mut self, ctx: &mut Ctx, g: usize) {
        let Some(model) = self.params.sched_cost else { return };
        let now = ctx.now();
        let workers = self.groups[g].worker_ids().count();
        loop {
            let (groups, tracked, catalog) = (&self.groups, &self.tracked, &self.catalog);
            let classify = |event: &SchedEvent, start: Instant| match *event {
                SchedEvent::Arrival(id) => match tracked.get(&id) {
                    Some(t) if t.phys == Phys::Held && group::feasible_alone(catalog, t.model, &t.key, start) => Handling::Pass,
                    _ => Handling::Light,
                },
                SchedEvent::Freed(worker) => {
                    let group = &groups[g];
                    if group.has_worker(worker) && group.running(worker).is_none() && group.queued() > 0 {
                        Handling::Pass
                    } else {
                        Handling::Light
                    }
                }
            };
            let step = self.schedulers[g].next(now, classify, |h| model.cost(workers, h == Handling::Pass));
            let event = match step {
                Step::Handle(event) => event,
                Step::WaitUntil(at) => {
                    if self.schedulers[g].arm(at) {
                        ctx.set_timer(at, g as u64);
                    }
                    break;
                }
                Step::Idle => break,
            };
            let mut out = Vec::new();
            match event {
                SchedEvent::Arrival(id) => {
                    let Some(t) = self.tracked.get(&id).copied().filter(|t| t.phys == Phys::Held) else { continue };
                    if self.groups[g].is_queued(t.model, &t.key) {
                        continue;
                    }
                    self.groups[g].arrive(&self.catalog, t.model, t.key, now, &mut out);
                }
                SchedEvent::Freed(worker) => self.groups[g].idle(&self.catalog, worker, now, &mut out),
            }
            self.apply(ctx, out);
        }
        self.flush_pending(ctx);
    }
}

impl Policy for Flex {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let params = FlexParams::from_ctx(ctx)?;
        let catalog = ModelCatalog::from_config(ctx.config());
        if catalog.is_empty() {
            return Err("flex needs at least one stage with a variant".into());
        }
        let all_models: Vec<usize> = (0..catalog.len()).collect();
        let mut params = params;
        if params.fresh_window {
            params.settings.fresh_stages = fresh_stages(&StageGraph::new(&ctx.config().stages));
        }
        let mut group = FlexGroup::new(params.settings.clone(), all_models);
        let mut worker_group = BTreeMap::new();
        for w in &ctx.config().workers {
            group.add_worker(w.id, w.stage);
            worker_group.insert(w.id, 0);
        }
        let streams = ctx.config().streams.len();
        let mut flex = Self {
            params,
            catalog,
            groups: vec![group],
            worker_group,
            stream_group: vec![0; streams],
            tracked: HashMap::new(),
            fresh: Vec::new(),
            finished: Vec::new(),
            ran: HashMap::new(),
            idled: Vec::new(),
            pending: BTreeMap::new(),
            busy: BTreeSet::new(),
            aborting: BTreeMap::new(),
            measured_delay: Ewma::new(0.2),
            arrivals_since_plan: vec![0; streams],
            planned_at: None,
            physical_preemptions: 0,
            virtual_preemptions: 0,
            schedulers: Vec::new(),
            timers: BTreeSet::new(),
            reserve: Vec::new(),
            spreader: None,
            planned_workers: 0,
            shedder: None,
        };
        flex.reserve = stage_reserves(ctx, flex.params.downstream_reserve, flex.params.settings.max_batch);
        if flex.params.productive_batches {
            let held = if flex.params.upstream_share {
                stage_held(ctx, flex.params.downstream_reserve, flex.params.settings.max_batch)
            } else {
                flex.reserve.clone()
            };
            limit_to_productive_batches(&mut flex.catalog, ctx, &held, flex.params.settings.max_batch);
        }
        if flex.params.shed_period > 0 && ctx.config().stages.len() > 1 {
            let graph = StageGraph::new(&ctx.config().stages);
            let entry = (0..graph.len() as StageId).map(|s| graph.predecessors(s).is_empty()).collect();
            flex.shedder = Some(EntryShedder::new(entry, flex.params.shed_period));
        }
        if flex.params.spread {
            let mut spreader =
                Spreader::new(ctx.config(), &flex.catalog, &flex.reserve, flex.params.settings.max_batch, flex.params.spread_period)
                    .with_downstream_margin(flex.params.spread_margin);
            if let Some(replicas) = spreader.initial(ctx.config()) {
                scale_to(ctx, &replicas);
            }
            flex.spreader = Some(spreader);
        }
        if flex.params.sched_cost.is_some() {
            flex.schedulers = vec![SerialScheduler::default()];
        }
        if flex.herd_applies(ctx) {
            flex.replan(ctx);
        }
        Ok(flex)
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        // The same id at another stage is a new arrival (the request moved on).
        if let Some(t) = self.tracked.get_mut(&request.id).filter(|t| t.stage == request.stage) {
            match t.phys {
                Phys::Returning { drop: true } => {
                    self.tracked.remove(&request.id);
                    ctx.drop_request(request.id, DropReason::Preempted);
                    return;
                }
                Phys::Returning { drop: false } | Phys::Busy(_) | Phys::Resident(_) => {
                    // Handed back after a preemption (or a refused dispatch): the
                    // scheduler already placed it.
                    t.phys = Phys::Held;
                    return;
                }
                Phys::Held => return,
            }
        }
        // A request that moved on is forgotten at its last stage: where FLEX still
        // believes it queued or batched (the SDK ran a sequence's step on the worker
        // holding its state, not on the one FLEX chose), nothing of it is left to run.
        if let Some(old) = self.tracked.get(&request.id).copied() {
            let g = self.group_of_stream(old.stream);
            if let crate::group::Forgotten::InBatch(worker) = self.groups[g].forget(old.model, &old.key) {
                if let Some(pending) = self.pending.get_mut(&worker) {
                    pending.requests.retain(|id| *id != request.id);
                    if pending.requests.is_empty() {
                        self.pending.remove(&worker);
                    }
                }
            }
        }
        let Some(model) = self.catalog.model_of(request.stream, request.stage) else {
            ctx.drop_request(request.id, DropReason::Policy);
            return;
        };
        if let Some(n) = self.arrivals_since_plan.get_mut(request.stream as usize) {
            *n += 1;
        }
        if let Some(spreader) = &mut self.spreader {
            spreader.arrived(request.stage);
        }
        if let Some(shedder) = &mut self.shedder {
            shedder.arrived(request.stage);
        }
        // The deadline at this stage keeps what the later stages need.
        let reserve = self.reserve.get(request.stage as usize).copied().unwrap_or(0);
        let key = (request.deadline.saturating_sub(reserve), request.arrived_at, request.id);
        let tracked = Tracked { model, stage: request.stage, key, stream: request.stream, phys: Phys::Held };
        self.tracked.insert(request.id, tracked);
        self.fresh.push(request.id);
    }

    fn on_worker_idle(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.idled.push(worker);
    }

    fn on_batch_done(&mut self, ctx: &mut Ctx, outcome: BatchOutcome) {
        let ours = self.busy.remove(&outcome.worker);
        if let (Some(spreader), Some(worker)) = (&mut self.spreader, ctx.worker(outcome.worker)) {
            spreader.finished(worker.info.stage, outcome.results.len() as u64);
        }
        let ids: Vec<RequestId> = outcome.results.iter().map(|r| r.id).collect();
        // Requests that ran on this worker leave the policy's hands (an iteration
        // worker's unfinished sequences come back under `Resident` below).
        for id in &ids {
            if self.tracked.get(id).is_some_and(|t| t.phys == Phys::Busy(outcome.worker)) {
                let entry = self.tracked.remove(id).expect("tracked");
                self.ran.insert(*id, entry);
            }
        }
        // A batch this instance never dispatched — one a previous instance started
        // before a hand-over (a swap, a reconfiguration) — ends nothing of the group's:
        // the batch the group planned for the worker meanwhile is still to be
        // dispatched when the worker is idle.
        if ours {
            self.finished.push((outcome.worker, ids));
        }
    }

    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: Snapshot) {
        let now = ctx.now();
        let mut out = Vec::new();
        if self.params.tick_sweep {
            for group in &mut self.groups {
                group.sweep(&self.catalog, now, &mut out);
            }
        }
        self.apply(ctx, out);
        if let Some(replicas) = self.spreader.as_mut().and_then(|s| s.respread(now)) {
            scale_to(ctx, &replicas);
        }
        // HERD plans again every period, and as soon as the workers it planned for
        // changed (the spread's workers started).
        let due = self.planned_at.is_some_and(|at| now.saturating_sub(at) >= self.params.herd_period)
            || self.worker_group.len() != self.planned_workers;
        if due && self.herd_applies(ctx) {
            self.replan(ctx);
        }
        ctx.host().emit("flex.preemptions", self.physical_preemptions as f64);
    }

    fn on_timer(&mut self, _ctx: &mut Ctx, token: u64) {
        if (token as usize) < self.schedulers.len() {
            self.timers.insert(token as usize);
        }
    }

    fn on_worker_added(&mut self, _ctx: &mut Ctx, worker: Worker) {
        // The smallest group takes it (HERD re-plans at its next period).
        let group = (0..self.groups.len()).min_by_key(|&g| (self.groups[g].worker_ids().count(), g)).expect("a group");
        self.groups[group].add_worker(worker.id, worker.stage);
        self.worker_group.insert(worker.id, group);
    }

    fn on_worker_removed(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.busy.remove(&worker);
        self.aborting.remove(&worker);
        let pending = self.pending.remove(&worker);
        let Some(group) = self.worker_group.remove(&worker) else { return };
        if let Some((_, Some(run))) = self.groups[group].remove_worker(worker) {
            if pending.is_some() {
                // Never dispatched: its requests go back to the queue.
                for key in run.keys {
                    self.groups[group].enqueue(run.model, key);
                }
            }
        }
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        let Some(t) = self.tracked.remove(&request) else { return };
        self.fresh.retain(|id| *id != request);
        for group in &mut self.groups {
            match group.forget(t.model, &t.key) {
                Forgotten::Unknown => continue,
                Forgotten::Queued => break,
                Forgotten::InBatch(worker) => {
                    if let Some(p) = self.pending.get_mut(&worker) {
                        p.requests.retain(|id| *id != request);
                        if p.requests.is_empty() {
                            self.pending.remove(&worker);
                        }
                    }
                    break;
                }
            }
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        let now = ctx.now();
        let mut out = Vec::new();
        let costed = self.params.sched_cost.is_some();
        // Scheduler cost model: events for each group's serial scheduler.
        let mut events: Vec<(usize, SchedEvent)> = Vec::new();
        // Finished batches: forget their requests (keeping an iteration worker's paused
        // sequences), then the worker takes its next batch.
        for (worker, ids) in std::mem::take(&mut self.finished) {
            let resident: Vec<RequestId> = ctx.resident(worker).iter().map(|s| s.id).collect();
            let _ = ids;
            let stage = ctx.worker(worker).map(|w| w.info.stage);
            let Some(g) = self.group_of_worker(worker) else { continue };
            for id in &resident {
                // Hosts differ in whether a finished frame reports its unfinished
                // sequences as results: take them from either place.
                if let Some(t) = self.tracked.get_mut(id).filter(|t| t.phys == Phys::Busy(worker)) {
                    t.phys = Phys::Resident(worker);
                } else if let Some(t) = self.ran.remove(id).filter(|t| Some(t.stage) == stage) {
                    self.tracked.insert(*id, Tracked { phys: Phys::Resident(worker), ..t });
                }
            }
            // Every paused sequence of the worker, those that sat out this frame too.
            let keys: Vec<(usize, Key)> = resident
                .iter()
                .filter_map(|id| self.tracked.get(id).filter(|t| t.phys == Phys::Resident(worker)))
                .map(|t| (t.model, t.key))
                .collect();
            if let Some(&(model, _)) = keys.first() {
                // An iteration worker continues its paused sequences first.
                let mut keys: Vec<Key> = keys.iter().filter(|(m, _)| *m == model).map(|(_, k)| *k).collect();
                keys.sort_unstable();
                keys.truncate(ctx.batch_limit(self.catalog.get(model).stage) as usize);
                let requests = keys.iter().map(|k| k.2).collect();
                self.groups[g].complete_without_restart(worker);
                self.groups[g].occupy(&self.catalog, worker, model, keys, now);
                out.push(Decision::Start { worker, model, requests, at: now });
            } else if costed {
                self.groups[g].complete_without_restart(worker);
                events.push((g, SchedEvent::Freed(worker)));
            } else {
                self.groups[g].complete(&self.catalog, worker, now, &mut out);
            }
        }
        self.ran.clear();
        // Idle workers: a finished abort (measure its delay), a refused dispatch (its
        // batch goes back to the queue), or a worker with nothing to do yet.
        for worker in std::mem::take(&mut self.idled) {
            if let Some((at, expected)) = self.aborting.remove(&worker) {
                self.measured_delay.update(now.saturating_sub(at) as f64 / expected as f64);
                let fraction = self.delay_fraction();
                for group in &mut self.groups {
                    group.set_preempt_delay_fraction(fraction);
                }
            }
            let Some(g) = self.group_of_worker(worker) else { continue };
            if self.busy.remove(&worker) {
                self.groups[g].requeue_run(worker);
            }
            if !self.pending.contains_key(&worker) {
                if !costed {
                    self.groups[g].idle(&self.catalog, worker, now, &mut out);
                } else if !events.contains(&(g, SchedEvent::Freed(worker))) {
                    events.push((g, SchedEvent::Freed(worker)));
                }
            }
        }
        // Arrivals, one event at a time (or all queued, then one dispatch), those the
        // backlog below would make late dropped first.
        self.shed_fresh(now, &mut out);
        let fresh = std::mem::take(&mut self.fresh);
        let mut touched = BTreeSet::new();
        for id in fresh {
            let Some(t) = self.tracked.get(&id).copied() else { continue };
            let g = self.group_of_stream(t.stream);
            if costed {
                events.push((g, SchedEvent::Arrival(id)));
            } else if self.params.coalesce {
                if crate::group::feasible_alone(&self.catalog, t.model, &t.key, now) {
                    self.groups[g].enqueue(t.model, t.key);
                    touched.insert((g, self.catalog.get(t.model).stage));
                } else {
                    out.push(Decision::Drop { request: id, reason: DropReason::DeadlineUnreachable });
                }
            } else {
                self.groups[g].arrive(&self.catalog, t.model, t.key, now, &mut out);
            }
        }
        // One DISPATCH per stage that received arrivals.
        for (g, stage) in touched {
            self.groups[g].dispatch_stage(&self.catalog, now, Some(stage), &mut out);
        }
        self.apply(ctx, out);
        if costed {
            let mut due = std::mem::take(&mut self.timers);
            for (g, event) in events {
                self.schedulers[g].push(event);
                due.insert(g);
            }
            for g in due {
                self.pump(ctx, g);
            }
        }
        self.flush_pending(ctx);
    }
}

yardmaster_sdk::export_policy!(Flex);
