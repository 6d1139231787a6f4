//! `quart-uniform`: the uniform-scaling baseline of the QUART reproduction (the
//! spec's Uniform-QPS, after the QUART repository's legacy scaler). Every `period_s`
//! (3 s) it sets **every** stage to `r = ⌈λ₁·max_i t_i / utilisation⌉` replicas,
//! clamped to `[r_min, r_max]`, where `λ₁` is the arrival rate at the entry stages
//! over the last period and `t_i` a stage's profiled service time; offline stages
//! (models out of service) are left out. It scales up at once and down only
//! `cooldown_s` (6 min) after its last scale-up. FIFO per stage, nothing dropped.

use yardmaster_sdk::helpers::{is_offline, ScaledFifo, ScalingRule, SlidingWindow, StageFifo};
use yardmaster_sdk::{Ctx, Instant, Request, Snapshot, StageId};

/// Uniform QPS-driven scaling of the whole pipeline; FIFO per stage.
pub type QuartUniform = ScaledFifo<UniformRule>;

/// The rule: every stage at the replicas the entry rate needs.
#[derive(Debug)]
pub struct UniformRule {
    entry_arrivals: SlidingWindow,
    entry: Vec<bool>,
    /// The stages it scales: every stage but the offline ones (models out of service).
    stages: Vec<StageId>,
    slowest_s: f64,
    utilisation: f64,
    r_min: u32,
    r_max: u32,
    period: u64,
    cooldown: u64,
    current: u32,
    last_up: Option<Instant>,
    next_decision: Instant,
    started: Instant,
}

impl ScalingRule for UniformRule {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let period_s: f64 = ctx.param_or("period_s", 3.0)?;
        let cooldown_s: f64 = ctx.param_or("cooldown_s", 360.0)?;
        let utilisation: f64 = ctx.param_or("utilisation", 0.7)?;
        if !(period_s > 0.0 && utilisation > 0.0 && cooldown_s >= 0.0) {
            return Err("period_s and utilisation must be positive".into());
        }
        let config = ctx.config();
        let n = config.stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut entry = vec![false; n];
        for stage in &config.stages {
            entry[stage.id as usize] = stage.predecessors.is_empty();
        }
        let slowest_s = config.stages.iter().filter_map(|s| ctx.latency().mean(s.id, 0, 1)).max().map_or(0.01, |ns| ns as f64 / 1e9);
        // An offline stage allows no replica: it is left out of the uniform count.
        let online: Vec<_> = config.stages.iter().filter(|s| !is_offline(s)).collect();
        let room = (config.max_workers / online.len().max(1) as u32).max(1);
        let low = online.iter().map(|s| s.min_replicas).max().unwrap_or(1);
        let high = online.iter().map(|s| s.max_replicas).min().unwrap_or(1);
        let r_max: u32 = ctx.param_or::<u32>("r_max", 8)?.min(high).min(room).max(low);
        let r_min: u32 = ctx.param_or::<u32>("r_min", 1)?.max(low).min(r_max);
        let current = online.iter().map(|s| config.workers.iter().filter(|w| w.stage == s.id).count() as u32).max().unwrap_or(1);
        let stages = online.iter().map(|s| s.id).collect();
        let period = (period_s * 1e9) as u64;
        Ok(Self {
            entry_arrivals: SlidingWindow::new(period),
            entry,
            stages,
            slowest_s,
            utilisation,
            r_min,
            r_max,
            period,
            cooldown: (cooldown_s * 1e9) as u64,
            current,
            last_up: None,
            next_decision: config.now + period,
            started: config.now,
        })
    }

    fn arrival(&mut self, ctx: &Ctx, request: &Request) {
        if self.entry.get(request.stage as usize).copied().unwrap_or(false) && request.requeues == 0 {
            self.entry_arrivals.push(request.arrived_at.min(ctx.now()), 1.0);
        }
    }

    fn tick(&mut self, ctx: &mut Ctx, _fifo: &mut StageFifo, _snapshot: &Snapshot) {
        let now = ctx.now();
        if now < self.next_decision {
            return;
        }
        self.next_decision = now + self.period;
        self.entry_arrivals.expire(now);
        let span = self.period.min(now.saturating_sub(self.started).max(1));
        let rate = self.entry_arrivals.len() as f64 * 1e9 / span as f64;
        let wanted = ((rate * self.slowest_s / self.utilisation).ceil() as u32).clamp(self.r_min, self.r_max);
        let cooled = self.last_up.is_none_or(|at| now.saturating_sub(at) >= self.cooldown);
        let next = if wanted > self.current || (wanted < self.current && cooled) { wanted } else { self.current };
        if next == self.current {
            return;
        }
        if next > self.current {
            self.last_up = Some(now);
        }
        self.current = next;
        for &stage in &self.stages {
            ctx.scale(stage, next, None);
        }
    }
}

yardmaster_sdk::export_policy!(QuartUniform);
