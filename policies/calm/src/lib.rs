//! `calm`: Concord's Criticality-Aware Length Matching scheduler for LLM serving
//! (Z. Wu, UIUC 2025; spec `calm.md`).
//!
//! Every frame boundary of an iteration-level worker, each request it could run is
//! analysed ([`analyze`](mod@analyze)): a conservative upper bound of its remaining output
//! ([`predict`], a conditional quantile learned online from finished requests and
//! refined as tokens are generated) gives the compute it still needs, hence its
//! minimum serving bandwidth, its quota for the frame and its priority P = goodput /
//! remaining generation time, inflated for every frame it went unserved. The frame
//! plan ([`plan`]) keeps the requests within a factor p of the capacity cut-off,
//! picks the input-length window with the highest summed priority, evicts resident
//! sequences for it only under the guard (much higher goodput, gain above the
//! stall), and tops up idle slots. Requests not admitted within `waiting_time`, and
//! deadline requests past their deadline, are dropped.
//!
//! Calls of compound jobs (tagged with their job and stage, see
//! [`yardmaster_sdk::helpers::compound`]) are paced to their stage's sub-deadline d_s,
//! from the pattern graph of a finished job their job matches ([`compound`]); every
//! call of a stage shares the stage's priority, the job's whole estimated goodput
//! over the stage's remaining compute.
//!
//! Service classes come from the stream names (see
//! [`yardmaster_sdk::helpers::ServiceClass`]): for a latency-sensitive stream the request's
//! deadline is its first-token deadline and tokens are then due every `tbt_ms`.

pub mod analyze;
pub mod compound;
pub mod params;
pub mod plan;
pub mod predict;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
pub mod tune;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};

use yardmaster_sdk::helpers::{idle_iteration_workers, BatchStageFifo, FramePlan, LlmBook, LlmRequest, Residence, ServiceClass};
use yardmaster_sdk::{Ctx, DropReason, EndReason, EvictMode, FrameReport, Policy, Request, RequestId, Snapshot, WorkerId};

use analyze::{analyze, remaining_compute, JobTerms, RequestView, WorkerRates};
use compound::{JobKey, Jobs};
use params::{EvictChoice, Params, Timeout};
use plan::{plan_frame, Candidate, FrameSetting, Selection};
use predict::{Bound, LengthPredictor, LengthQuery};
use tune::PTuner;
use yardmaster_sdk::helpers::compound::{CallCost, CallLink};

/// Decode-step time assumed when the host has neither a profile nor a measurement.
const FALLBACK_STEP_NS: f64 = 20e6;
/// A compound job is forgotten this long after its deadline (its calls ended unseen).
const JOB_GRACE_NS: u64 = 10_000_000_000;
/// Pattern reuse counts decay ×0.9 every hour (spec §4.2).
const PATTERN_DECAY_NS: u64 = 3_600_000_000_000;

/// What CALM keeps per live request beyond the shared book.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tracking {
    bound: Option<Bound>,
    multiplier: f64,
    frames_unserved: u32,
    aged_at: u64,
}

/// The CALM policy.
pub struct Calm {
    params: Params,
    book: LlmBook,
    predictor: LengthPredictor,
    tracking: BTreeMap<RequestId, Tracking>,
    /// Δ as the host runs it (its frame reports), the parameter until then.
    frame_steps: u32,
    /// The last plan per worker (for tests and telemetry).
    last_plan: BTreeMap<WorkerId, Selection>,
    /// The online tuner of p (when `p_tune`).
    tuner: Option<PTuner>,
    /// Requests of batch (non-LLM) stages, served first come first served.
    batch_stages: BatchStageFifo,
    /// Live compound jobs and the pattern store.
    jobs: Jobs,
    /// When the pattern store last decayed.
    decayed_at: u64,
    /// Power-of-K (`power_k` > 0): the replicas a request may bind to (its K sampled
    /// copies), then the one it bound to.
    replicas: BTreeMap<RequestId, Vec<WorkerId>>,
}

impl Calm {
    /// The last frame plan made for `worker`.
    pub fn last_plan(&self, worker: WorkerId) -> Option<&Selection> {
        self.last_plan.get(&worker)
    }

    /// The current bound L̂ of a request.
    pub fn bound(&self, id: RequestId) -> Option<u32> {
        self.tracking.get(&id).and_then(|t| t.bound).map(|b| b.tokens)
    }

    /// The shared request table.
    pub fn book(&self) -> &LlmBook {
        &self.book
    }

    /// Live compound jobs and the pattern graphs learned so far.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// Drop the calls of `failed`'s job still waiting here (its job can earn nothing
    /// once one call failed); the calls, for the caller to drop.
    fn failed_siblings(&mut self, failed: RequestId) -> Vec<RequestId> {
        let siblings = self.jobs.failed(failed);
        siblings.into_iter().filter(|id| self.book.get(*id).is_some_and(|r| !matches!(r.residence, Residence::Resident(_)))).collect()
    }

    /// The replicas `id` may still run on under power-of-K (`None`: any).
    pub fn replicas(&self, id: RequestId) -> Option<&[WorkerId]> {
        self.replicas.get(&id).map(Vec::as_slice)
    }

    /// Power-of-K (spec §3.8): sample K of the stage's M replicas for a new request
    /// (none when K = 0 or K ≥ M: every replica holds a copy).
    fn sample_replicas(&mut self, ctx: &Ctx, request: &Request) {
        let k = self.params.power_k as usize;
        let mut workers: Vec<WorkerId> = ctx.workers().filter(|w| w.info.stage == request.stage).map(|w| w.info.id).collect();
        if k == 0 || k >= workers.len() {
            return;
        }
        let mut state = ctx.host().random();
        for i in 0..k {
            let (next, word) = yardmaster_sdk::splitmix64(state);
            state = next;
            let j = i + (word % (workers.len() - i) as u64) as usize;
            workers.swap(i, j);
        }
        workers.truncate(k);
        workers.sort_unstable();
        self.replicas.insert(request.id, workers);
    }

    /// The cut-off p in force.
    pub fn p(&self) -> f64 {
        self.tuner.as_ref().map_or(self.params.p, PTuner::p)
    }

    /// Credit the tuner with the goodput a frame delivered within SLOs (the policy's
    /// own estimate, from the frame's timing).
    fn credit_frame(&mut self, frame: &FrameReport, now: u64) {
        let Some(tuner) = self.tuner.as_mut() else { return };
        let started = now.saturating_sub(frame.duration);
        for s in &frame.sequences {
            let Some(r) = self.book.get(s.id) else { continue };
            let new = s.generated.saturating_sub(r.generated);
            match r.class {
                ServiceClass::Latency => {
                    let steps = frame.steps.max(new).max(1) as u64;
                    let on_time = (0..new as u64)
                        .filter(|k| {
                            let emitted = started + (k + 1) * frame.duration / steps;
                            emitted <= r.deadline + (r.generated as u64 + k) * self.params.tbt_ns
                        })
                        .count();
                    tuner.credit(self.params.omega_out * on_time as f64);
                }
                _ if s.finished && now <= r.deadline => {
                    tuner.credit(self.params.omega_in * r.prompt as f64 + self.params.omega_out * s.generated as f64);
                }
                _ => {}
            }
        }
    }

    fn rates(&self, ctx: &Ctx, worker: WorkerId) -> WorkerRates {
        let batch = ctx.worker(worker).map_or(1, |w| ctx.batch_limit(w.info.stage));
        let profiled = ctx.batch_latency(worker, batch) as f64;
        let step_ns = self.book.step_ns(worker).unwrap_or(if profiled > 0.0 { profiled } else { FALLBACK_STEP_NS });
        WorkerRates { step_s: step_ns / 1e9, frame_steps: self.frame_steps }
    }

    /// Under the `slo` admission timeout: whether a request never admitted can no
    /// longer meet its SLO even if it started now (its prefill and one decode step of
    /// `step_ns`): an LS request's first token, a deadline request's deadline.
    fn missed_its_slo(&self, r: &LlmRequest, now: u64, step_ns: f64) -> bool {
        let soonest = now as f64 + r.prefill_tokens() as f64 * self.params.prefill_ns_per_token + step_ns;
        soonest > r.deadline as f64
    }

    /// F3: the drops due now among `worker`'s candidates (or every non-resident
    /// request when `worker` is `None`); `step_ns` is the decode step the shedding
    /// rule assumes.
    fn due_drops(&self, now: u64, worker: Option<WorkerId>, step_ns: f64) -> Vec<(RequestId, DropReason)> {
        let mut drops = Vec::new();
        for r in self.book.iter() {
            let eligible = match (r.residence, worker) {
                (Residence::Resident(w), Some(worker)) => w == worker,
                (Residence::Resident(_), None) => false,
                _ => true,
            };
            if !eligible {
                continue;
            }
            // A compound job is admitted once (its first dispatched call); its later
            // calls are not shed by the admission timeout, only by d_R.
            let admitted = r.admitted || self.jobs.admitted(r.id);
            let shed = match self.params.timeout {
                Timeout::Fixed => now.saturating_sub(r.sent_at) >= self.params.waiting_time_ns,
                Timeout::Slo => self.missed_its_slo(r, now, step_ns),
            };
            if !admitted && shed {
                drops.push((r.id, DropReason::Overload));
            } else if self.params.drop_expired && matches!(r.class, ServiceClass::Deadline | ServiceClass::Compound) && now > r.deadline {
                drops.push((r.id, DropReason::DeadlineUnreachable));
            }
        }
        drops
    }

    /// FRAME_PLAN for an idle worker.
    fn plan(&mut self, ctx: &mut Ctx, worker: WorkerId) {
        let now = ctx.now();
        let now_s = now as f64 / 1e9;
        let Some(info) = ctx.worker(worker).map(|w| w.info) else { return };
        let batch = ctx.batch_limit(info.stage) as usize;
        let rates = self.rates(ctx, worker);
        let mut drops = self.due_drops(now, Some(worker), rates.step_s * 1e9);
        for i in 0..drops.len() {
            for sibling in self.failed_siblings(drops[i].0) {
                if !drops.iter().any(|(id, _)| *id == sibling) {
                    drops.push((sibling, drops[i].1));
                }
            }
        }
        let cost = CallCost { prefill_s: self.params.prefill_ns_per_token / 1e9, step_s: rates.step_s };
        let dropped: BTreeSet<RequestId> = drops.iter().map(|(id, _)| *id).collect();
        let frame_ns = (rates.frame_s() * 1e9) as u64;
        // One pass over the candidates, none sorted: ANALYZE, and F11's aging of every
        // candidate once per elapsed frame (undone below for the members), with the
        // value it had before, in id order.
        let mut aged: Vec<(RequestId, u64)> = Vec::new();
        // Compound calls: their candidate's index, view and job.
        let mut calls: Vec<(usize, RequestView, JobKey, f64)> = Vec::new();
        let mut candidates = Vec::new();
        let Self { book, tracking, predictor, jobs, replicas, params, .. } = self;
        // The tracking of each candidate, walked alongside (both in id order).
        let mut tracks = tracking.iter_mut().peekable();
        for r in book.candidates(worker, info.stage) {
            if dropped.contains(&r.id) {
                continue;
            }
            // Power-of-K: only the replicas holding a copy (or the bound one) plan it.
            if replicas.get(&r.id).is_some_and(|ws| !ws.contains(&worker)) {
                continue;
            }
            let track = loop {
                match tracks.peek() {
                    Some((id, _)) if **id < r.id => {
                        tracks.next();
                    }
                    Some((id, _)) if **id == r.id => break tracks.next().map(|(_, track)| track),
                    _ => break None,
                }
            };
            let Some(track) = track else { continue };
            let query = LengthQuery { class: r.class, prompt: r.prompt, generated: r.generated, hint: r.expected_tokens };
            let bound = predictor.bound(query, track.bound, track.multiplier);
            track.bound = Some(bound);
            let frames_unserved = track.frames_unserved;
            if now.saturating_sub(track.aged_at) >= frame_ns {
                aged.push((r.id, track.aged_at));
                track.frames_unserved += 1;
                track.aged_at = now;
            }
            let resident = r.residence == Residence::Resident(worker);
            let restore_s = match r.residence {
                Residence::Evicted(EvictMode::Swap) => book.kv_bytes(r.context()) as f64 * params.swap_ns_per_byte / 1e9,
                _ => 0.0,
            };
            let job = jobs.job_of(r.id);
            // A compound call is paced to its stage's sub-deadline d_s.
            let deadline = job.and_then(|key| jobs.plan(key, now, cost)).map_or(r.deadline, |plan| plan.deadline);
            let view = RequestView {
                class: r.class,
                arrival_s: r.sent_at as f64 / 1e9,
                deadline_s: deadline as f64 / 1e9,
                prompt: r.prompt,
                generated: r.generated,
                bound: bound.tokens,
                prefill: r.prefill_tokens(),
                restore_s,
                frames_unserved,
                job: None,
            };
            if let Some(key) = job {
                calls.push((candidates.len(), view, key, r.deadline as f64 / 1e9));
            }
            let analysis = analyze(&view, now_s, rates, params);
            let (stall_s, evict_mode) = eviction_cost(book, params, r);
            candidates.push(Candidate {
                id: r.id,
                key: r.prompt,
                arrival: r.sent_at,
                resident,
                held: if resident { book.kv_bytes(r.context()) } else { 0 },
                footprint: book.kv_bytes(r.context() + rates.frame_steps),
                analysis,
                stall_s,
                evict_mode,
                latency: r.class == ServiceClass::Latency,
                admitted: r.admitted,
            });
        }
        // A4/A9 for compound calls: Ĝ_R and the stage's t_gen, summed over the job's
        // calls among the candidates (the live calls of its current stage).
        let mut terms: BTreeMap<JobKey, JobTerms> = BTreeMap::new();
        for (_, view, key, job_deadline_s) in &calls {
            let entry = terms.entry(*key).or_insert_with(|| {
                let future = self.jobs.plan(*key, now, cost).map_or(0, |p| p.share.future_tokens);
                let known = self.jobs.finished_tokens(*key) + future;
                JobTerms { value: self.params.omega_in * known as f64, stage_t_gen: 0.0, job_deadline_s: *job_deadline_s }
            });
            entry.value += self.params.omega_in * view.prompt as f64 + self.params.omega_out * view.bound as f64;
            entry.stage_t_gen += remaining_compute(view, rates, &self.params);
        }
        for (index, view, key, _) in &calls {
            if let Some(terms) = terms.get(key) {
                candidates[*index].analysis = analyze(&RequestView { job: Some(*terms), ..*view }, now_s, rates, &self.params);
            }
        }
        // The stage's pool: never-dispatched deadline requests ranked past
        // `queue_cap` batches per replica are shed, so that a plan's cost stays bounded
        // however far past capacity the arrivals are.
        let replicas = ctx.workers().filter(|w| w.info.stage == info.stage).count();
        let cap = self.params.queue_cap.saturating_mul(batch).saturating_mul(replicas);
        let jobs = &self.jobs;
        for id in window::shed(&mut candidates, cap, |c| c.resident || c.latency || c.admitted || jobs.job_of(c.id).is_some()) {
            drops.push((id, DropReason::Overload));
        }
        let residents = candidates.iter().filter(|c| c.resident).count().max(1);
        let ls_slots = (self.params.ls_share * batch as f64).floor() as usize;
        let candidates = window::bounded(candidates, batch, ls_slots, self.params.plan_window);
        let setting = FrameSetting {
            batch,
            kv_capacity: info.memory_bytes,
            p: self.p(),
            packing: self.params.packing,
            delta_pre: self.params.delta_pre,
            frame_s: rates.frame_s(),
            token_rate: residents.min(batch) as f64 / rates.step_s.max(1e-9),
            ls_share: self.params.ls_share,
        };
        let selection = plan_frame(&candidates, &setting);
        // F11: the members were served; their aging by this plan is undone.
        for (id, _) in &selection.run {
            if let Ok(i) = aged.binary_search_by_key(id, |(aged, _)| *aged) {
                if let Some(track) = self.tracking.get_mut(id) {
                    track.frames_unserved -= 1;
                    track.aged_at = aged[i].1;
                }
            }
        }
        let plan = FramePlan { drop: drops, evict: selection.evict.clone(), run: selection.run.iter().map(|(id, _)| *id).collect() };
        for (id, _) in &plan.drop {
            self.tracking.remove(id);
            self.jobs.failed(*id);
        }
        for id in &plan.run {
            self.jobs.admit(*id);
        }
        if self.params.power_k > 0 {
            // The first replica that selects a request binds it; the other copies go.
            for id in &plan.run {
                self.replicas.insert(*id, vec![worker]);
            }
        }
        self.book.apply(ctx, worker, plan);
        self.last_plan.insert(worker, selection);
    }
}

impl Policy for Calm {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let params = Params::from_ctx(ctx)?;
        Ok(Self {
            book: LlmBook::new(ctx, params.kv_bytes_per_token, params.alpha_v),
            predictor: LengthPredictor::new(&params),
            tracking: BTreeMap::new(),
            frame_steps: params.frame_steps,
            last_plan: BTreeMap::new(),
            batch_stages: BatchStageFifo::default(),
            jobs: Jobs::new(params.pattern_capacity),
            decayed_at: 0,
            replicas: BTreeMap::new(),
            tuner: params.p_tune.then(|| PTuner::new(params.p, params.tune_epoch_frames, params.tune_epsilon, 0.3)),
            params,
        })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        if BatchStageFifo::is_batch_stage(ctx, request.stage) {
            self.batch_stages.push(&request);
            return;
        }
        if !self.book.arrive(&request) {
            return;
        }
        let now = ctx.now();
        let class = self.book.class_of(request.stream);
        if class == ServiceClass::Compound {
            if let Some(link) = CallLink::from_tags(request.tags.as_deref()) {
                self.jobs.arrive(request.id, request.stream, &link, request.sent_at, request.deadline, request.input_size);
            }
        }
        if class == ServiceClass::BestEffort {
            if let Some(r) = self.book.get_mut(request.id) {
                r.deadline = r.sent_at.saturating_add(self.params.be_deadline_ns);
            }
        }
        // A deadline request that cannot finish even its prefill and one step: drop now.
        if matches!(class, ServiceClass::Deadline | ServiceClass::Compound) {
            let step = ctx.workers().filter_map(|w| self.book.step_ns(w.info.id)).fold(f64::INFINITY, f64::min);
            let step = if step.is_finite() { step } else { 0.0 };
            let minimum = request.input_size as f64 * self.params.prefill_ns_per_token + step;
            if (request.deadline.saturating_sub(now) as f64) < minimum {
                self.book.remove(request.id);
                ctx.drop_request(request.id, DropReason::DeadlineUnreachable);
                for sibling in self.failed_siblings(request.id) {
                    self.book.remove(sibling);
                    self.tracking.remove(&sibling);
                    ctx.drop_request(sibling, DropReason::DeadlineUnreachable);
                }
                return;
            }
        }
        let multiplier = self.predictor.draw_multiplier(ctx.host().random());
        let query = LengthQuery { class, prompt: request.input_size, generated: 0, hint: request.expected_tokens };
        let bound = self.predictor.bound(query, None, multiplier);
        if let Some(tuner) = self.tuner.as_mut() {
            let input = if class == ServiceClass::Latency { 0.0 } else { self.params.omega_in * request.input_size as f64 };
            tuner.offer(input + self.params.omega_out * bound.tokens as f64);
        }
        self.tracking.insert(request.id, Tracking { bound: Some(bound), multiplier, frames_unserved: 0, aged_at: now });
        self.sample_replicas(ctx, &request);
    }

    fn on_frame(&mut self, ctx: &mut Ctx, frame: FrameReport) {
        if frame.steps > 0 {
            self.frame_steps = frame.steps;
        }
        self.credit_frame(&frame, ctx.now());
        if self.tuner.is_some() {
            let uniform = |word: u64| (word >> 11) as f64 / (1u64 << 53) as f64;
            let (explore, pick) = (uniform(ctx.host().random()), uniform(ctx.host().random()));
            if let Some(tuner) = self.tuner.as_mut() {
                tuner.frame_done(explore, pick);
            }
        }
        for finished in self.book.frame(&frame) {
            self.predictor.observe(finished.class, finished.prompt, finished.output);
            self.tracking.remove(&finished.id);
            self.jobs.finished(finished.id, finished.output);
        }
    }

    fn on_request_ended(&mut self, ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.book.remove(request);
        self.tracking.remove(&request);
        self.batch_stages.remove(request);
        for sibling in self.failed_siblings(request) {
            self.book.remove(sibling);
            self.tracking.remove(&sibling);
            ctx.drop_request(sibling, DropReason::DeadlineUnreachable);
        }
    }

    fn on_tick(&mut self, ctx: &mut Ctx, _snapshot: Snapshot) {
        // The timeout sweep for requests no worker planned lately.
        let now = ctx.now();
        // The fastest measured step of any worker (none measured yet: no step).
        let step = ctx.workers().filter_map(|w| self.book.step_ns(w.info.id)).fold(f64::INFINITY, f64::min);
        let mut drops = self.due_drops(now, None, if step.is_finite() { step } else { 0.0 });
        for i in 0..drops.len() {
            for sibling in self.failed_siblings(drops[i].0) {
                if !drops.iter().any(|(id, _)| *id == sibling) {
                    drops.push((sibling, drops[i].1));
                }
            }
        }
        for (id, reason) in drops {
            self.book.remove(id);
            self.tracking.remove(&id);
            self.jobs.failed(id);
            ctx.drop_request(id, reason);
        }
        // Pattern-store upkeep: forget jobs long past their deadline, decay reuse hourly.
        let decay = if now.saturating_sub(self.decayed_at) >= PATTERN_DECAY_NS {
            self.decayed_at = now;
            0.9
        } else {
            1.0
        };
        self.jobs.sweep(now, JOB_GRACE_NS, decay);
        let book = &self.book;
        self.replicas.retain(|id, _| book.get(*id).is_some());
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.batch_stages.dispatch_idle(ctx);
        for worker in idle_iteration_workers(ctx) {
            self.plan(ctx, worker);
        }
    }
}

/// Seconds of stall if `request`'s resident sequence were evicted, and the mode.
fn eviction_cost(book: &LlmBook, params: &Params, request: &LlmRequest) -> (f64, EvictMode) {
    let bytes = book.kv_bytes(request.context()) as f64;
    let swap = bytes * params.swap_ns_per_byte / 1e9;
    let recompute = request.context() as f64 * params.prefill_ns_per_token / 1e9;
    match params.evict {
        EvictChoice::Fixed(EvictMode::Swap) => (swap, EvictMode::Swap),
        EvictChoice::Fixed(EvictMode::Recompute) => (recompute, EvictMode::Recompute),
        EvictChoice::Auto if swap < recompute => (swap, EvictMode::Swap),
        EvictChoice::Auto => (recompute, EvictMode::Recompute),
    }
}

yardmaster_sdk::export_policy!(Calm);
