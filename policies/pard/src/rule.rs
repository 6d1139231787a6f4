//! PARD's rule: the Request Broker's drop test and service order at batch formation
//! (spec §3.5), and the State Planner's per-tick synchronisation (§3.3) that freezes
//! the inputs of the test — downstream estimates, batch sizes, modes — until the
//! next tick.

use yardmaster_sdk::helpers::{
    Admitted, BatchBroker, Discipline, FillContext, Filled, NexusPlan, PipelineRule, PriorityQueue, Queued, SlidingWindow, StageGraph,
    WorkerQueue,
};
use yardmaster_sdk::{Ctx, DropReason, Instant, Level, Snapshot, StageId};

use crate::estimate::{downstream_latency, path_wait_quantile, sample_waits, Draws, WaitPool};
use crate::load::{delayed_transition, instant_transition, load_factor, LoadTracker, Mode};
use crate::overload::{Throttle, TickDelay};
use crate::params::{Admission, Budget, Estimate, PardParams, Priority};

const NS_PER_S: f64 = 1e9;

/// One module's statistics and its frozen per-tick state.
#[derive(Debug, Clone)]
pub struct Module {
    /// Queueing delays (t_b − t_r) of admitted requests, by admission time.
    queue_delays: SlidingWindow,
    load: LoadTracker,
    waits: WaitPool,
    tick_delay: TickDelay,
    throttle: Throttle,
    /// Service order.
    pub mode: Mode,
    /// Windowed queueing delay q (ns).
    pub queue_delay: f64,
    /// d(b) at the current batch size (ns).
    pub duration: f64,
    /// d(1) (ns), for the expired purge.
    pub single: f64,
    /// Load factor μ.
    pub mu: f64,
    /// Downstream estimate L_sub (ns).
    pub downstream: f64,
    /// Share of the end-to-end budget (split and WCL budgets).
    pub share: f64,
    /// Mode changes so far.
    pub mode_changes: u64,
}

/// PARD, or one of its ablations (see [`PardParams`]).
#[derive(Debug, Clone)]
pub struct PardRule {
    params: PardParams,
    graph: StageGraph,
    /// Downstream paths of each module.
    paths: Vec<Vec<Vec<StageId>>>,
    modules: Vec<Module>,
    draws: Vec<Vec<f64>>,
    scratch: Vec<f64>,
    seed: u64,
    syncs: u64,
    last_sync: Instant,
    /// Whether each module is an entry (no predecessor).
    entry: Vec<bool>,
    /// The entry limit's token bucket: entry requests per second, tokens, last refill.
    entry_rate: f64,
    tokens: f64,
    refilled: Instant,
}

impl PardRule {
    /// The rule with explicit parameters (the policy reads them from its configuration).
    pub fn with_params(ctx: &Ctx, graph: &StageGraph, params: PardParams) -> Self {
        let modules = (0..graph.len())
            .map(|_| Module {
                queue_delays: SlidingWindow::new(params.queue_window),
                load: LoadTracker::new(params.rate_smoothing_ticks, params.epsilon_horizon_ticks),
                waits: WaitPool::new(params.samples),
                tick_delay: TickDelay::default(),
                throttle: Throttle::default(),
                mode: if params.priority == Priority::Hbf { Mode::Hbf } else { Mode::Lbf },
                queue_delay: 0.0,
                duration: 0.0,
                single: 0.0,
                mu: 0.0,
                downstream: 0.0,
                share: 1.0,
                mode_changes: 0,
            })
            .collect();
        let mut rule = Self {
            paths: (0..graph.len() as StageId).map(|k| graph.downstream_paths(k)).collect(),
            graph: graph.clone(),
            modules,
            draws: Vec::new(),
            scratch: Vec::new(),
            seed: ctx.config().seed,
            syncs: 0,
            last_sync: ctx.now(),
            entry: (0..graph.len() as StageId).map(|k| graph.predecessors(k).is_empty()).collect(),
            entry_rate: f64::INFINITY,
            tokens: 0.0,
            refilled: ctx.now(),
            params,
        };
        rule.refresh_durations(ctx);
        rule.refresh_budgets();
        rule.refresh_downstream();
        rule
    }

    /// The parameters.
    pub fn params(&self) -> &PardParams {
        &self.params
    }

    /// A module's state.
    pub fn module(&self, stage: StageId) -> &Module {
        &self.modules[stage as usize]
    }

    /// Set a module's frozen state directly (for scenario tests).
    pub fn set_module(&mut self, stage: StageId, mode: Mode, downstream: f64) {
        let m = &mut self.modules[stage as usize];
        m.mode = mode;
        m.downstream = downstream;
    }

    /// Whether `request` fails the drop test at module `stage` for a batch expected to
    /// start at `expected_start`: its estimated end-to-end latency exceeds its SLO
    /// (or, with per-module budgets, its local latency exceeds its module's budget).
    pub fn misses(&self, request: &Queued, stage: StageId, expected_start: Instant) -> bool {
        let m = &self.modules[stage as usize];
        match self.params.budget {
            Budget::EndToEnd => expected_start as f64 + m.duration + m.downstream > request.deadline as f64,
            Budget::Split | Budget::WorstCase => {
                let local = expected_start.saturating_sub(request.arrived_at) as f64 + m.duration;
                local > m.share * request.deadline.saturating_sub(request.sent_at) as f64
            }
        }
    }

    fn refresh_durations(&mut self, ctx: &Ctx) {
        for (stage, m) in self.modules.iter_mut().enumerate() {
            let stage = stage as StageId;
            let batch = ctx.batch_limit(stage);
            m.duration = ctx.latency().mean(stage, 0, batch).unwrap_or(0) as f64;
            m.single = ctx.latency().mean(stage, 0, 1).unwrap_or(0) as f64;
        }
    }

    fn refresh_budgets(&mut self) {
        let cost: Vec<f64> = match self.params.budget {
            Budget::EndToEnd => return,
            Budget::Split => self.modules.iter().map(|m| m.duration).collect(),
            Budget::WorstCase => self.modules.iter().map(|m| m.queue_delay + 2.0 * m.duration).collect(),
        };
        let shares = self.graph.proportional_shares(|k| cost[k as usize]);
        for (m, share) in self.modules.iter_mut().zip(shares) {
            m.share = share;
        }
    }

    /// SAMPLE_WAITS and L_sub for every module from the frozen q and d.
    fn refresh_downstream(&mut self) {
        let lambda = self.params.lambda;
        let durations: Vec<f64> = self.modules.iter().map(|m| m.duration).collect();
        let queues: Vec<f64> = self.modules.iter().map(|m| m.queue_delay).collect();
        let sampled = self.params.estimate == Estimate::Full && lambda > 0.0 && lambda < 1.0;
        if sampled {
            let pools: Vec<&WaitPool> = self.modules.iter().map(|m| &m.waits).collect();
            let mut source = Draws::new(self.seed, self.syncs);
            sample_waits(&pools, &durations, self.params.samples, self.params.pool_min, &mut source, &mut self.draws);
        }
        for k in 0..self.modules.len() {
            let paths = &self.paths[k];
            let waits: Vec<f64> = paths
                .iter()
                .map(|p| match self.params.estimate {
                    Estimate::Full => path_wait_quantile(&self.draws, &durations, p, lambda, &mut self.scratch),
                    _ => 0.0,
                })
                .collect();
            self.modules[k].downstream = downstream_latency(self.params.estimate, paths, &queues, &durations, &waits);
        }
    }

    /// STATE_SYNC: close the period since the last sync.
    fn sync(&mut self, ctx: &Ctx, broker: &BatchBroker<PriorityQueue>) {
        let now = ctx.now();
        let period_s = (now.saturating_sub(self.last_sync) as f64 / NS_PER_S).max(1e-9);
        self.last_sync = now;
        self.syncs += 1;
        self.refresh_durations(ctx);
        let mut overloaded = vec![false; self.modules.len()];
        for (stage, m) in self.modules.iter_mut().enumerate() {
            m.queue_delays.expire(now);
            m.queue_delay = m.queue_delays.weighted_mean(now).unwrap_or_else(|| {
                let oldest =
                    broker.workers_of(stage as StageId).iter().filter_map(|&w| broker.slot(w).and_then(|s| s.queue.oldest_arrival())).min();
                oldest.map_or(0.0, |t| now.saturating_sub(t) as f64)
            });
            m.load.sync(period_s, self.params.epsilon_max);
            let workers = broker.workers_of(stage as StageId).len() as f64;
            let batch = ctx.batch_limit(stage as StageId) as f64;
            let throughput = if m.duration > 0.0 { workers * batch * NS_PER_S / m.duration } else { 0.0 };
            m.mu = load_factor(m.load.input_rate, throughput);
            let next = match self.params.priority {
                Priority::Adaptive => delayed_transition(m.mode, m.mu, m.load.epsilon),
                Priority::Instant => instant_transition(m.mu),
                Priority::Fcfs | Priority::Lbf => Mode::Lbf,
                Priority::Hbf => Mode::Hbf,
            };
            m.mode_changes += (next != m.mode) as u64;
            m.mode = next;
            overloaded[stage] = m.tick_delay.take_mean() > self.params.oc_threshold as f64;
        }
        if self.params.admission == Admission::OverloadControl {
            for m in &mut self.modules {
                m.throttle.active = false;
            }
            for k in (0..self.modules.len()).filter(|&k| overloaded[k]) {
                self.modules[k].throttle.active = true;
                for a in self.graph.ancestors(k as StageId) {
                    self.modules[a as usize].throttle.active = true;
                }
            }
        }
        self.refresh_budgets();
        self.refresh_downstream();
        if self.params.log_state {
            let state: Vec<String> = self
                .modules
                .iter()
                .map(|m| {
                    format!(
                        "q={:.1} d={:.1} L={:.1} mu={:.2} eps={:.3} {:?}",
                        m.queue_delay / 1e6,
                        m.duration / 1e6,
                        m.downstream / 1e6,
                        m.mu,
                        m.load.epsilon,
                        m.mode
                    )
                })
                .collect();
            ctx.log(Level::Info, &format!("sync {}: {}", self.syncs, state.join(" | ")));
        }
    }
}

impl Discipline<PriorityQueue> for PardRule {
    fn fill(&mut self, _ctx: &Ctx, queue: &mut PriorityQueue, fill: &FillContext, out: &mut Filled) {
        let stage = fill.stage as usize;
        let now = fill.now;
        let test = self.params.admission == Admission::DropTest;
        // Purge requests that can never pass again (deadline-ordered queues only).
        if test && self.params.purge_expired && self.params.priority != Priority::Fcfs {
            let single = self.modules[stage].single;
            while let Some(min) = queue.peek_min() {
                if (min.deadline as f64) >= now as f64 + single {
                    break;
                }
                let expired = queue.pop_min().expect("peeked");
                out.drop.push((expired, DropReason::DeadlineUnreachable));
            }
        }
        while out.admit.len() < fill.room {
            let next = match self.modules[stage].mode {
                Mode::Hbf => queue.pop_max(),
                Mode::Lbf => queue.pop_min(),
            };
            let Some(request) = next else { break };
            if test && self.misses(&request, fill.stage, fill.expected_start) {
                out.drop.push((request, DropReason::Overload));
                continue;
            }
            let delay = now.saturating_sub(request.arrived_at) as f64;
            let m = &mut self.modules[stage];
            m.queue_delays.push(now, delay);
            m.tick_delay.record(delay);
            out.admit.push(request);
        }
    }

    fn batch_started(&mut self, _ctx: &Ctx, stage: StageId, batch: &[Admitted], now: Instant) {
        let m = &mut self.modules[stage as usize];
        if m.duration <= 0.0 {
            return;
        }
        for admitted in batch {
            m.waits.push(now.saturating_sub(admitted.admitted_at) as f64 / m.duration);
        }
    }
}

impl PipelineRule for PardRule {
    type Queue = PriorityQueue;

    fn init(ctx: &mut Ctx, graph: &StageGraph, _plan: &NexusPlan) -> Result<Self, String> {
        let params = PardParams::from_ctx(ctx)?;
        Ok(Self::with_params(ctx, graph, params))
    }

    fn key(&self, request: &Queued) -> Instant {
        match self.params.priority {
            Priority::Fcfs => request.arrived_at,
            _ => request.deadline,
        }
    }

    fn admit_arrival(&mut self, ctx: &Ctx, request: &Queued) -> Option<DropReason> {
        if self.params.entry_limit && self.entry[request.stage as usize] && self.entry_rate.is_finite() {
            // Refill at the entry rate the workers carry, up to one SLO's worth.
            let now = ctx.now();
            let slo_s = request.deadline.saturating_sub(request.sent_at) as f64 / NS_PER_S;
            let burst = (self.entry_rate * slo_s).max(1.0);
            self.tokens = (self.tokens + now.saturating_sub(self.refilled) as f64 / NS_PER_S * self.entry_rate).min(burst);
            self.refilled = now;
            if self.tokens < 1.0 {
                return Some(DropReason::Overload);
            }
            self.tokens -= 1.0;
        }
        let m = &mut self.modules[request.stage as usize];
        m.load.arrival();
        if self.params.admission == Admission::OverloadControl && !m.throttle.admit(self.params.oc_alpha) {
            return Some(DropReason::Overload);
        }
        None
    }

    fn entry_capacity(&mut self, ctx: &Ctx, capacity: f64) {
        if !self.entry_rate.is_finite() {
            // The first capacity known: the bucket starts full (clamped at the next arrival).
            self.refilled = ctx.now();
            self.tokens = f64::MAX;
        }
        self.entry_rate = if capacity.is_finite() && capacity > 0.0 { capacity } else { f64::INFINITY };
    }

    fn tick(&mut self, ctx: &mut Ctx, broker: &BatchBroker<PriorityQueue>, _snapshot: &Snapshot) {
        // Ticks may come more often than the sync period; allow 1 ms of jitter.
        if ctx.now().saturating_sub(self.last_sync) + 1_000_000 >= self.params.sync_interval {
            self.sync(ctx, broker);
        }
    }
}
