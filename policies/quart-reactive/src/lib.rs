//! `quart-reactive`: the reactive queue-length autoscaler of the QUART reproduction
//! (the reactive rule of Cocktail's resource manager, without its forecast). Every
//! `period_s` (2 s) a stage whose time-averaged queue exceeds `queue_per_replica`
//! (1) request per replica, starting ones counted, gets one more replica while GPUs
//! are free. Every `down_interval_s` (10 s) a stage whose replicas were busy less
//! than `low_utilisation` (50 %) of the time for `down_intervals` (2) intervals in a
//! row gives one back. FIFO per stage, nothing dropped.

use yardmaster_sdk::helpers::{replica_bounds, ScaledFifo, ScalingRule, StageFifo};
use yardmaster_sdk::{Ctx, Instant, Snapshot};

/// Per-stage state of the scale-down rule.
#[derive(Debug, Clone, Default)]
struct StageLoad {
    busy_sum: f64,
    samples: u32,
    low_intervals: u32,
}

/// Queue-length scale-up, utilisation scale-down, per stage; FIFO per stage.
pub type QuartReactive = ScaledFifo<ReactiveRule>;

/// The rule: queue-length scale-up, utilisation scale-down, per stage.
#[derive(Debug)]
pub struct ReactiveRule {
    loads: Vec<StageLoad>,
    bounds: Vec<(u32, u32)>,
    queue_per_replica: f64,
    low_utilisation: f64,
    down_intervals: u32,
    period: u64,
    down_interval: u64,
    next_up: Instant,
    next_down: Instant,
}

impl ScalingRule for ReactiveRule {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let period_s: f64 = ctx.param_or("period_s", 2.0)?;
        let down_interval_s: f64 = ctx.param_or("down_interval_s", 10.0)?;
        if !(period_s > 0.0 && down_interval_s > 0.0) {
            return Err("period_s and down_interval_s must be positive".into());
        }
        let r_min: u32 = ctx.param_or("r_min", 1)?;
        let r_max: u32 = ctx.param_or("r_max", 8)?;
        let config = ctx.config();
        let n = config.stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut bounds = vec![(r_min, r_max); n];
        for s in &config.stages {
            // An offline stage (its model out of service) gets (0, 0).
            bounds[s.id as usize] = replica_bounds(s, r_min, r_max);
        }
        let (period, down_interval) = ((period_s * 1e9) as u64, (down_interval_s * 1e9) as u64);
        Ok(Self {
            loads: vec![StageLoad::default(); n],
            bounds,
            queue_per_replica: ctx.param_or("queue_per_replica", 1.0)?,
            low_utilisation: ctx.param_or("low_utilisation", 0.5)?,
            down_intervals: ctx.param_or("down_intervals", 2)?,
            period,
            down_interval,
            next_up: config.now + period,
            next_down: config.now + down_interval,
        })
    }

    fn tick(&mut self, ctx: &mut Ctx, fifo: &mut StageFifo, snapshot: &Snapshot) {
        let now = ctx.now();
        let n = self.loads.len();
        // Mean busy fraction of each stage's workers over the tick.
        let mut busy = vec![(0.0, 0u32); n];
        for w in &snapshot.workers {
            if let Some(slot) = busy.get_mut(w.stage as usize) {
                slot.0 += w.utilisation;
                slot.1 += 1;
            }
        }
        for (load, (sum, count)) in self.loads.iter_mut().zip(&busy) {
            if *count > 0 {
                load.busy_sum += sum / *count as f64;
                load.samples += 1;
            }
        }
        let mut replicas = vec![0u32; n];
        for s in &snapshot.stages {
            if let Some(slot) = replicas.get_mut(s.stage as usize) {
                *slot = s.replicas + s.starting;
            }
        }
        let mut in_use: u32 = replicas.iter().sum();
        let capacity = ctx.config().max_workers;
        let mut targets = replicas.clone();
        if now >= self.next_down {
            self.next_down = now + self.down_interval;
            for (i, load) in self.loads.iter_mut().enumerate() {
                let mean = if load.samples > 0 { load.busy_sum / load.samples as f64 } else { 1.0 };
                *load = StageLoad {
                    low_intervals: if mean < self.low_utilisation { load.low_intervals + 1 } else { 0 },
                    ..StageLoad::default()
                };
                if load.low_intervals >= self.down_intervals && targets[i] > self.bounds[i].0 {
                    targets[i] -= 1;
                    in_use -= 1;
                    load.low_intervals = 0;
                }
            }
        }
        if now >= self.next_up {
            self.next_up = now + self.period;
            for i in 0..n {
                let queue = fifo.take_mean_len(i as u32, now);
                if queue > self.queue_per_replica * replicas[i] as f64
                    && targets[i] >= replicas[i]
                    && targets[i] < self.bounds[i].1
                    && in_use < capacity
                {
                    targets[i] = replicas[i] + 1;
                    in_use += 1;
                }
            }
        }
        let mut changes: Vec<(usize, u32)> = (0..n).filter(|&i| targets[i] != replicas[i]).map(|i| (i, targets[i])).collect();
        changes.sort_by_key(|&(i, t)| (t > replicas[i], i));
        for (i, t) in changes {
            ctx.scale(i as u32, t, None);
        }
    }
}

yardmaster_sdk::export_policy!(QuartReactive);
