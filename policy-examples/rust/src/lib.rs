//! `deadline-scaler` in Rust: the reference version of the example policy that
//! `policy-examples/` writes four times (Rust, Python, JavaScript, Zig). The four make
//! the same decisions on the same events; `policy-examples/README.md` specifies them
//! step by step, and this file follows that specification with the SDK's helpers.
//!
//! - Each stage keeps its requests ordered by (deadline, id).
//! - A request that cannot finish even alone on the stage's fastest variant is dropped
//!   at arrival (`deadline-unreachable`); so is a queue head that cannot finish alone on
//!   the worker about to take it.
//! - An idle worker (lowest id first) gets its resident LLM sequences, then the most
//!   urgent requests, as many as keep the earliest deadline in the batch reachable.
//! - Every fresh arrival is counted in a sliding window per stage; on each tick a batch
//!   stage whose windowed arrivals exceed `overload-permille` of what its serving
//!   replicas can run at full batches is overloaded, and after `sustain-ticks`
//!   overloaded ticks in a row (with no replica starting) it gets one more replica.

use std::collections::{BTreeSet, HashMap};

use yardmaster_sdk::helpers::SlidingWindow;
use yardmaster_sdk::{Ctx, DropReason, EndReason, Instant, Level, Policy, Request, RequestId, Snapshot, StageId, StageKind, WorkerId};

/// Nanoseconds in a millisecond.
const MS: u64 = 1_000_000;

/// The policy's parameters (all integers, so every language computes alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Span of the arrival-rate window (`window-ms`, default 1000).
    pub window: u64,
    /// Load, in thousandths of capacity, above which a stage is overloaded
    /// (`overload-permille`, default 900).
    pub overload_permille: u64,
    /// Overloaded ticks in a row before scaling up (`sustain-ticks`, default 3).
    pub sustain_ticks: u32,
}

impl Params {
    /// Read the parameters, with their defaults.
    pub fn from_ctx(ctx: &Ctx) -> Result<Self, String> {
        let window_ms: u64 = ctx.param_or("window-ms", 1000)?;
        if window_ms == 0 {
            return Err("parameter `window-ms` must be positive".into());
        }
        Ok(Self {
            window: window_ms * MS,
            overload_permille: ctx.param_or("overload-permille", 900)?,
            sustain_ticks: ctx.param_or("sustain-ticks", 3)?,
        })
    }
}

/// What the policy knows about one stage.
#[derive(Debug)]
struct StageState {
    id: StageId,
    kind: StageKind,
    max_batch: u32,
    max_replicas: u32,
    /// Latency of a batch of one on the stage's fastest variant.
    fastest_single: u64,
    /// Latency of a full batch on the stage's first variant (what scaling starts).
    full_batch: u64,
    /// Pending requests, most urgent first.
    queue: BTreeSet<(Instant, RequestId)>,
    /// Fresh arrivals of the last `window` nanoseconds.
    arrivals: SlidingWindow,
    /// Overloaded ticks in a row.
    streak: u32,
}

/// Deadline-aware EDF that drops what cannot finish and scales under sustained overload.
#[derive(Debug)]
pub struct DeadlineScaler {
    params: Params,
    /// Stages in configuration order.
    stages: Vec<StageState>,
    /// Stage id → index into `stages`.
    index: HashMap<StageId, usize>,
    /// Queued request → (stage index, deadline), for removal when the host ends it.
    queued: HashMap<RequestId, (usize, Instant)>,
}

impl DeadlineScaler {
    /// Choose the next batch for `worker` of stage `s`: its resident sequences, then
    /// queue heads while the earliest deadline in the batch stays reachable; heads that
    /// cannot finish even alone are dropped on the way.
    fn form_batch(&mut self, ctx: &mut Ctx, s: usize, worker: WorkerId) -> Vec<RequestId> {
        let now = ctx.now();
        let limit = ctx.batch_limit(self.stages[s].id) as usize;
        let mut batch: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|q| q.id).collect();
        let mut binding: Option<Instant> = None;
        while batch.len() < limit {
            let Some(&(deadline, id)) = self.stages[s].queue.first() else { break };
            let finish = now.saturating_add(ctx.batch_latency(worker, batch.len() as u32 + 1));
            if binding.is_none() && finish > deadline {
                self.unqueue(s, deadline, id);
                ctx.drop_request(id, DropReason::DeadlineUnreachable);
                continue;
            }
            let earliest = binding.map_or(deadline, |b| b.min(deadline));
            if finish > earliest {
                break;
            }
            binding = Some(earliest);
            self.unqueue(s, deadline, id);
            batch.push(id);
        }
        batch
    }

    fn unqueue(&mut self, s: usize, deadline: Instant, id: RequestId) {
        self.stages[s].queue.remove(&(deadline, id));
        self.queued.remove(&id);
    }

    /// Whether `count` arrivals in the window exceed the overload threshold of
    /// `replicas` serving replicas running full batches.
    fn overloaded(&self, stage: &StageState, count: u64, replicas: u32) -> bool {
        let demand = count as u128 * stage.full_batch as u128 * 1000;
        let capacity = self.params.overload_permille as u128 * replicas as u128 * stage.max_batch as u128 * self.params.window as u128;
        demand > capacity
    }
}

impl Policy for DeadlineScaler {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let params = Params::from_ctx(ctx)?;
        let mut stages = Vec::new();
        let mut index = HashMap::new();
        for stage in &ctx.config().stages {
            let latency = ctx.latency();
            let fastest_single = stage.variants.iter().filter_map(|v| latency.mean(stage.id, v.id, 1)).min().unwrap_or(0);
            let full_batch = stage.variants.first().and_then(|v| latency.mean(stage.id, v.id, stage.max_batch)).unwrap_or(0);
            index.insert(stage.id, stages.len());
            stages.push(StageState {
                id: stage.id,
                kind: stage.kind,
                max_batch: stage.max_batch,
                max_replicas: stage.max_replicas,
                fastest_single,
                full_batch,
                queue: BTreeSet::new(),
                arrivals: SlidingWindow::new(params.window),
                streak: 0,
            });
        }
        Ok(Self { params, stages, index, queued: HashMap::new() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        let Some(&s) = self.index.get(&request.stage) else {
            ctx.drop_request(request.id, DropReason::Policy);
            return;
        };
        let now = ctx.now();
        let stage = &mut self.stages[s];
        if request.requeues == 0 {
            stage.arrivals.push(now, 1.0);
        }
        if now.saturating_add(stage.fastest_single) > request.deadline {
            ctx.drop_request(request.id, DropReason::DeadlineUnreachable);
            return;
        }
        stage.queue.insert((request.deadline, request.id));
        self.queued.insert(request.id, (s, request.deadline));
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        if let Some((s, deadline)) = self.queued.remove(&request) {
            self.stages[s].queue.remove(&(deadline, request));
        }
    }

    fn on_tick(&mut self, ctx: &mut Ctx, snapshot: Snapshot) {
        let now = ctx.now();
        let mut total: u32 = snapshot.stages.iter().map(|st| st.replicas + st.starting).sum();
        for stats in &snapshot.stages {
            let Some(&s) = self.index.get(&stats.stage) else { continue };
            if self.stages[s].kind != StageKind::Batch {
                continue;
            }
            self.stages[s].arrivals.expire(now);
            let count = self.stages[s].arrivals.len() as u64;
            let overloaded = self.overloaded(&self.stages[s], count, stats.replicas);
            let stage = &mut self.stages[s];
            stage.streak = if overloaded { stage.streak + 1 } else { 0 };
            let target = stats.replicas + 1;
            if stage.streak >= self.params.sustain_ticks
                && stats.starting == 0
                && target <= stage.max_replicas
                && total < ctx.config().max_workers
            {
                stage.streak = 0;
                total += 1;
                let id = stage.id;
                ctx.scale(id, target, None);
                ctx.log(Level::Info, &format!("stage {id}: {count} arrivals in the window, scaling to {target}"));
            }
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        for s in 0..self.stages.len() {
            let stage = self.stages[s].id;
            loop {
                let Some(worker) = ctx.idle_workers(stage).next() else { break };
                let batch = self.form_batch(ctx, s, worker);
                if batch.is_empty() {
                    break;
                }
                ctx.dispatch(worker, batch);
            }
        }
    }
}

yardmaster_sdk::export_policy!(DeadlineScaler);

#[cfg(test)]
mod tests;
