//! Bookkeeping that every LLM (iteration-level) policy needs: the service class of a
//! request, the live request table kept in step with arrivals, frame reports and
//! ends, the KV-cache footprint of sequences, each worker's measured decode-step
//! time, and a frame plan (drops, evictions, the sequences to run) applied in the
//! order the host needs.
//!
//! Service classes come from the stream's name (CALM spec §2): a stream named `ls`
//! or `ls-…` is latency-sensitive (its SLO is the time to first token; tokens are
//! then due every `tbt`), `ds…` deadline-sensitive (the SLO is end-to-end), `cp…`
//! compound, `be…` best-effort; any other name is deadline-sensitive. The host's
//! accounting reads the same names through [`ServiceClass::from_stream_name`].

use std::collections::{BTreeMap, VecDeque};

use super::ewma::Ewma;
use crate::{Ctx, DropReason, EvictMode, FrameReport, Instant, Request, RequestId, StageId, StageKind, StreamId, VariantId, WorkerId};

/// What a request's SLO is about (CALM spec §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceClass {
    /// Latency-sensitive (streamed): token j is due at sent + TTFT + j·TBT.
    Latency,
    /// Deadline-sensitive: the whole response is due at the deadline.
    Deadline,
    /// Compound: one call of a multi-call job with an end-to-end deadline.
    Compound,
    /// Best-effort: a deadline-sensitive request with a generous deadline.
    BestEffort,
}

impl ServiceClass {
    /// The class a stream's name declares (`ls`, `ds`, `cp`, `be`, optionally
    /// followed by `-` or `_` and anything); deadline-sensitive otherwise.
    pub fn from_stream_name(name: &str) -> Self {
        let prefix = name.split(['-', '_']).next().unwrap_or("").to_ascii_lowercase();
        match prefix.as_str() {
            "ls" => Self::Latency,
            "cp" => Self::Compound,
            "be" => Self::BestEffort,
            _ => Self::Deadline,
        }
    }

    /// A small code for keys (length estimator pools).
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Where a live request's KV cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// Never run (or refused before it started): nothing to restore.
    Waiting,
    /// Resident on a worker (running or paused).
    Resident(WorkerId),
    /// Evicted from a worker; resuming costs a recompute or a swap-in.
    Evicted(EvictMode),
}

/// One live LLM request as a policy tracks it.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    /// The request id.
    pub id: RequestId,
    /// Its stream.
    pub stream: StreamId,
    /// The (iteration-level) stage it waits at.
    pub stage: StageId,
    /// Its service class.
    pub class: ServiceClass,
    /// When the client sent it (a_r).
    pub sent_at: Instant,
    /// Its absolute deadline (the TTFT deadline for latency-sensitive requests).
    pub deadline: Instant,
    /// Prompt tokens (L_in).
    pub prompt: u32,
    /// Tokens generated so far (g).
    pub generated: u32,
    /// The client's output-length hint (0 when none); only oracle predictors read it.
    pub expected_tokens: u32,
    /// Where its KV cache is.
    pub residence: Residence,
    /// Whether it has ever been dispatched.
    pub admitted: bool,
}

impl LlmRequest {
    /// Prompt tokens still to (re)fill before decoding can go on: the prompt when
    /// fresh, prompt + generated after a recompute eviction, none otherwise.
    pub fn prefill_tokens(&self) -> u32 {
        match self.residence {
            Residence::Waiting => self.prompt,
            Residence::Evicted(EvictMode::Recompute) => self.prompt + self.generated,
            _ => 0,
        }
    }

    /// Context length (prompt and generated tokens).
    pub fn context(&self) -> u32 {
        self.prompt + self.generated
    }
}

/// A request that finished generating in a frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// Its class.
    pub class: ServiceClass,
    /// Its prompt tokens.
    pub prompt: u32,
    /// Its total output tokens (L_out).
    pub output: u32,
}

/// The decisions for one idle worker at a frame boundary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FramePlan {
    /// Requests to drop.
    pub drop: Vec<(RequestId, DropReason)>,
    /// Paused resident sequences to evict first (to free KV cache).
    pub evict: Vec<(RequestId, EvictMode)>,
    /// Sequences to run for the next frame.
    pub run: Vec<RequestId>,
}

/// The live request table and per-worker measurements of an LLM policy.
#[derive(Debug, Clone)]
pub struct LlmBook {
    requests: BTreeMap<RequestId, LlmRequest>,
    stream_classes: Vec<ServiceClass>,
    kv_per_token: f64,
    step_ns: BTreeMap<WorkerId, Ewma>,
    step_alpha: f64,
}

impl LlmBook {
    /// A book for the streams of `ctx`'s configuration; `kv_per_token` is the KV
    /// footprint assumed until a frame report measures it; `step_alpha` the EWMA
    /// weight of measured decode-step times.
    pub fn new(ctx: &Ctx, kv_per_token: f64, step_alpha: f64) -> Self {
        let mut stream_classes = Vec::new();
        for stream in &ctx.config().streams {
            let index = stream.id as usize;
            if stream_classes.len() <= index {
                stream_classes.resize(index + 1, ServiceClass::Deadline);
            }
            stream_classes[index] = ServiceClass::from_stream_name(&stream.name);
        }
        Self { requests: BTreeMap::new(), stream_classes, kv_per_token, step_ns: BTreeMap::new(), step_alpha }
    }

    /// The class of a stream.
    pub fn class_of(&self, stream: StreamId) -> ServiceClass {
        self.stream_classes.get(stream as usize).copied().unwrap_or(ServiceClass::Deadline)
    }

    /// Record an arrival: a new request, or one handed back (evicted, or refused by
    /// the host) whose progress is kept. Returns whether it is new.
    pub fn arrive(&mut self, request: &Request) -> bool {
        if let Some(known) = self.requests.get_mut(&request.id) {
            if let Residence::Resident(_) = known.residence {
                // Handed back without an eviction of ours (refused dispatch or a preempt).
                known.residence = if known.generated > 0 { Residence::Evicted(EvictMode::Recompute) } else { Residence::Waiting };
            }
            return false;
        }
        self.requests.insert(
            request.id,
            LlmRequest {
                id: request.id,
                stream: request.stream,
                stage: request.stage,
                class: self.class_of(request.stream),
                sent_at: request.sent_at,
                deadline: request.deadline,
                prompt: request.input_size,
                generated: 0,
                expected_tokens: request.expected_tokens,
                residence: Residence::Waiting,
                admitted: false,
            },
        );
        true
    }

    /// Apply a frame report: progress, residence, measured step time and KV
    /// footprint; finished requests leave the book and are returned, and requests
    /// the book placed on the worker that the report no longer lists are forgotten.
    pub fn frame(&mut self, frame: &FrameReport) -> Vec<Finished> {
        if frame.steps > 0 {
            let alpha = self.step_alpha;
            self.step_ns.entry(frame.worker).or_insert_with(|| Ewma::new(alpha)).update(frame.duration as f64 / frame.steps as f64);
        }
        // The report lists every sequence resident on the worker: one we placed there
        // that is missing has ended on the host's side (expired while running).
        let gone: Vec<RequestId> = self
            .requests
            .values()
            .filter(|r| r.residence == Residence::Resident(frame.worker))
            .filter(|r| !frame.sequences.iter().any(|s| s.id == r.id))
            .map(|r| r.id)
            .collect();
        for id in gone {
            self.requests.remove(&id);
        }
        let mut finished = Vec::new();
        for sequence in &frame.sequences {
            let Some(request) = self.requests.get_mut(&sequence.id) else { continue };
            request.generated = sequence.generated;
            let tokens = request.context();
            if tokens > 0 && sequence.kv_bytes > 0 {
                self.kv_per_token = sequence.kv_bytes as f64 / tokens as f64;
            }
            if sequence.finished {
                finished.push(Finished { id: request.id, class: request.class, prompt: request.prompt, output: sequence.generated });
                self.requests.remove(&sequence.id);
            } else {
                request.residence = Residence::Resident(frame.worker);
            }
        }
        finished
    }

    /// Forget a request (it ended or was dropped).
    pub fn remove(&mut self, id: RequestId) -> Option<LlmRequest> {
        self.requests.remove(&id)
    }

    /// A live request.
    pub fn get(&self, id: RequestId) -> Option<&LlmRequest> {
        self.requests.get(&id)
    }

    /// A live request, mutably.
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut LlmRequest> {
        self.requests.get_mut(&id)
    }

    /// Every live request, by id.
    pub fn iter(&self) -> impl Iterator<Item = &LlmRequest> {
        self.requests.values()
    }

    /// Live requests a worker of `stage` may run now: its own resident sequences and
    /// every request of the stage not resident anywhere.
    pub fn candidates(&self, worker: WorkerId, stage: StageId) -> impl Iterator<Item = &LlmRequest> {
        self.requests.values().filter(move |r| match r.residence {
            Residence::Resident(w) => w == worker,
            _ => r.stage == stage,
        })
    }

    /// Number of live requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether no request is live.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// KV-cache bytes per token (measured once a frame reported a sequence).
    pub fn kv_per_token(&self) -> f64 {
        self.kv_per_token
    }

    /// KV bytes a sequence of `tokens` tokens holds.
    pub fn kv_bytes(&self, tokens: u32) -> u64 {
        (tokens as f64 * self.kv_per_token).ceil() as u64
    }

    /// KV bytes the resident sequences of `worker` hold.
    pub fn kv_used(&self, worker: WorkerId) -> u64 {
        self.requests.values().filter(|r| r.residence == Residence::Resident(worker)).map(|r| self.kv_bytes(r.context())).sum()
    }

    /// The measured decode-step time of `worker` (ns), if a frame was seen.
    pub fn step_ns(&self, worker: WorkerId) -> Option<f64> {
        self.step_ns.get(&worker).and_then(Ewma::value)
    }

    /// Emit `plan` for `worker` in the order the host applies safely (drops, then
    /// evictions, then the dispatch) and update the book accordingly.
    pub fn apply(&mut self, ctx: &mut Ctx, worker: WorkerId, plan: FramePlan) {
        for (id, reason) in plan.drop {
            if self.requests.remove(&id).is_some() {
                ctx.drop_request(id, reason);
            }
        }
        for (id, mode) in plan.evict {
            if let Some(request) = self.requests.get_mut(&id) {
                request.residence = Residence::Evicted(mode);
                ctx.evict(id, mode);
            }
        }
        let run: Vec<RequestId> = plan.run.into_iter().filter(|id| self.requests.contains_key(id)).collect();
        if run.is_empty() {
            return;
        }
        for id in &run {
            let request = self.requests.get_mut(id).expect("filtered");
            request.residence = Residence::Resident(worker);
            request.admitted = true;
        }
        ctx.dispatch(worker, run);
    }
}

/// The idle workers of every iteration-level (LLM) stage, stage by stage in the
/// configuration's order: the workers an LLM policy plans a frame for once its
/// events are handled.
pub fn idle_iteration_workers(ctx: &Ctx) -> Vec<WorkerId> {
    let stages = ctx.config().stages.iter().filter(|s| s.kind == StageKind::Iteration);
    stages.flat_map(|s| ctx.idle_workers(s.id)).collect()
}

/// Dispatch the sequences paused on an iteration-level `worker` again (as many as its
/// stage's batch limit, on the variant it runs), so that they continue before any
/// new request; whether it had any.
pub fn resume_resident(ctx: &mut Ctx, worker: WorkerId) -> bool {
    let Some((stage, variant)) = ctx.worker(worker).map(|w| (w.info.stage, w.info.variant)) else { return false };
    let limit = ctx.batch_limit(stage) as usize;
    let resident: Vec<RequestId> = ctx.resident(worker).iter().take(limit).map(|s| s.id).collect();
    if resident.is_empty() {
        return false;
    }
    ctx.dispatch_variant(worker, resident, Some(variant));
    true
}

/// Give every idle worker work: it continues its paused sequences first (see
/// [`resume_resident`]); otherwise `next` picks a batch for it (the worker and its
/// stage in, the variant and the requests out), if any. Workers in id order.
pub fn dispatch_idle(ctx: &mut Ctx, mut next: impl FnMut(&mut Ctx, WorkerId, StageId) -> Option<(VariantId, Vec<RequestId>)>) {
    let idle: Vec<(WorkerId, StageId)> = ctx.workers().filter(|w| w.idle).map(|w| (w.info.id, w.info.stage)).collect();
    for (worker, stage) in idle {
        if resume_resident(ctx, worker) {
            continue;
        }
        if let Some((variant, batch)) = next(ctx, worker, stage) {
            ctx.dispatch_variant(worker, batch, Some(variant));
        }
    }
}

/// First-in-first-out service of the batch (non-LLM) stages of a pipeline, so that
/// an LLM policy also moves requests through the other stages it may be given.
#[derive(Debug, Clone, Default)]
pub struct BatchStageFifo {
    queues: BTreeMap<StageId, VecDeque<RequestId>>,
}

impl BatchStageFifo {
    /// Whether `stage` is a batch stage of `ctx`'s pipeline.
    pub fn is_batch_stage(ctx: &Ctx, stage: StageId) -> bool {
        ctx.config().stages.iter().any(|s| s.id == stage && s.kind == StageKind::Batch)
    }

    /// Queue a request of a batch stage.
    pub fn push(&mut self, request: &Request) {
        self.queues.entry(request.stage).or_default().push_back(request.id);
    }

    /// Forget a request the host ended.
    pub fn remove(&mut self, id: RequestId) {
        for queue in self.queues.values_mut() {
            queue.retain(|r| *r != id);
        }
    }

    /// Dispatch the oldest requests of each batch stage to its idle workers.
    pub fn dispatch_idle(&mut self, ctx: &mut Ctx) {
        for (&stage, queue) in self.queues.iter_mut() {
            let idle: Vec<WorkerId> = ctx.idle_workers(stage).collect();
            let limit = ctx.batch_limit(stage).max(1) as usize;
            for worker in idle {
                if queue.is_empty() {
                    break;
                }
                let n = limit.min(queue.len());
                ctx.dispatch(worker, queue.drain(..n).collect());
            }
        }
    }
}

/// How a rank-ordered baseline frees KV cache for the sequences it wants to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preemption {
    /// vLLM's default: residents keep running; when their growth no longer fits,
    /// the most recently arrived residents are evicted by recompute; waiting requests
    /// are admitted in order until the first that does not fit (no evictions for
    /// them, nor any while an evicted one waits). Callers order requests by arrival.
    NewestOnOverflow,
    /// Evict paused residents from the low-rank end, unguarded, whenever a
    /// higher-ranked request needs the room.
    Unguarded,
}

/// A frame plan for a rank-ordered baseline: run the first `batch` requests of
/// `order` (ids of candidates of `worker`, best first) that fit in the worker's KV
/// cache of `capacity` bytes with `growth` tokens reserved per sequence, freeing
/// room as `preemption` says.
pub fn plan_by_rank(
    book: &LlmBook,
    worker: WorkerId,
    capacity: u64,
    order: &[RequestId],
    batch: usize,
    growth: u32,
    preemption: Preemption,
) -> FramePlan {
    let mut plan = FramePlan::default();
    let footprint = |r: &LlmRequest| book.kv_bytes(r.context() + growth);
    let resident = |id: &RequestId| book.get(*id).is_some_and(|r| r.residence == Residence::Resident(worker));
    // Bytes held by residents that are neither running nor evicted.
    let mut held: u64 = book.kv_used(worker);
    let mut reserved: u64 = 0;
    let mut evicted: Vec<RequestId> = Vec::new();
    let residents_low_first: Vec<RequestId> = order.iter().rev().filter(|id| resident(id)).copied().collect();
    // Residents neither running in the plan nor evicted: once none is left (or only the
    // candidate itself), no candidate can make room, and the search for victims is
    // skipped. Without this, every candidate that did not fit went over every resident
    // again — under overload thousands of candidates a frame, out of an event call's
    // fuel (`calm-sjf` on a conversation trace at 36× its speed, issue 43).
    let mut evictable = residents_low_first.len();
    for id in order {
        if plan.run.len() >= batch {
            break;
        }
        if evicted.contains(id) {
            continue;
        }
        let Some(request) = book.get(*id) else { continue };
        let is_resident = resident(id);
        if preemption == Preemption::NewestOnOverflow && !is_resident && !evicted.is_empty() {
            // A sequence just preempted waits at the head: admit nothing new.
            break;
        }
        // A resident's current KV is in `held`; it needs room only for its growth.
        let need = if is_resident { book.kv_bytes(growth) } else { footprint(request) };
        let mut fits = held + reserved + need <= capacity;
        if !fits {
            let may_evict = match preemption {
                Preemption::Unguarded => true,
                Preemption::NewestOnOverflow => is_resident,
            };
            if may_evict && evictable > usize::from(is_resident) {
                for victim in &residents_low_first {
                    if held + reserved + need <= capacity {
                        break;
                    }
                    if victim == id || plan.run.contains(victim) || evicted.contains(victim) {
                        continue;
                    }
                    let victim_bytes = book.get(*victim).map_or(0, |r| book.kv_bytes(r.context()));
                    held -= victim_bytes.min(held);
                    evicted.push(*victim);
                    evictable -= 1;
                    plan.evict.push((*victim, EvictMode::Recompute));
                }
                fits = held + reserved + need <= capacity;
            }
        }
        if fits {
            reserved += need;
            plan.run.push(*id);
            if is_resident {
                evictable -= 1;
            }
        } else if preemption == Preemption::NewestOnOverflow {
            if !is_resident {
                // Head-of-line: vLLM admits strictly in order.
                break;
            }
            // In arrival order, this resident is newer than those running: evict it by
            // recompute (it returns to the queue at its arrival position, the head).
            held -= book.kv_bytes(request.context()).min(held);
            evictable -= 1;
            evicted.push(*id);
            plan.evict.push((*id, EvictMode::Recompute));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, DeviceKind, NullHost, Stage, Stream, Worker};

    const KV: u64 = 10;

    fn ctx() -> Ctx {
        let config = Config {
            arm: "t".into(),
            stages: vec![Stage {
                id: 0,
                name: "g".into(),
                kind: StageKind::Iteration,
                successors: vec![],
                predecessors: vec![],
                variants: vec![],
                max_batch: 4,
                min_replicas: 1,
                max_replicas: 1,
            }],
            workers: vec![Worker { id: 0, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 }],
            streams: vec![Stream { id: 0, name: "ds".into(), entry: 0, slo: 1 }],
            params: vec![],
            tick_interval: 1,
            max_workers: 1,
            seed: 1,
            now: 0,
            hosts: Vec::new(),
        };
        Ctx::new(config, Box::new(NullHost::new(0, 1)))
    }

    fn request(id: u64, prompt: u32) -> Request {
        Request { input_size: prompt, ..crate::testing::request(id, 0, id, 1_000) }
    }

    fn frame(sequences: &[(u64, u32, u32, bool)]) -> FrameReport {
        crate::testing::frame_report(0, 10, 100, sequences, KV)
    }

    /// A book with requests 1..=n of `prompt` tokens, 1 and 2 resident on worker 0.
    fn book(n: u64, prompt: u32) -> LlmBook {
        let mut book = LlmBook::new(&ctx(), 1.0, 0.5);
        for id in 1..=n {
            book.arrive(&request(id, prompt));
        }
        book.frame(&frame(&[(1, prompt, 5, false), (2, prompt, 5, false)]));
        book
    }

    #[test]
    fn resume_resident_continues_paused_sequences_up_to_the_batch_limit() {
        let mut ctx = ctx();
        assert!(!resume_resident(&mut ctx, 0), "nothing resident yet");
        ctx.record_frame(&frame(&[(1, 10, 5, false), (2, 10, 5, true), (3, 10, 5, false), (4, 10, 5, false)]));
        ctx.set_batch_limit(0, 2);
        ctx.take_actions();
        assert!(resume_resident(&mut ctx, 0));
        match &ctx.take_actions()[..] {
            [crate::Action::Dispatch(d)] => assert_eq!((d.requests.clone(), d.variant), (vec![1, 3], Some(0))),
            other => panic!("{other:?}"),
        }
        assert!(!resume_resident(&mut ctx, 9), "unknown worker");
    }

    #[test]
    fn dispatch_idle_resumes_residents_before_asking_for_a_batch() {
        let mut ctx = ctx();
        ctx.mark_idle(0);
        ctx.record_frame(&frame(&[(1, 10, 5, false)]));
        let mut asked = Vec::new();
        dispatch_idle(&mut ctx, |_, worker, _| {
            asked.push(worker);
            None
        });
        assert!(asked.is_empty(), "a worker with paused sequences continues them");
        ctx.mark_idle(0);
        ctx.forget_sequence(1);
        ctx.take_actions();
        dispatch_idle(&mut ctx, |_, worker, stage| {
            asked.push(worker);
            Some((0, vec![7 + stage as u64]))
        });
        assert_eq!(asked, vec![0]);
        assert!(matches!(&ctx.take_actions()[..], [crate::Action::Dispatch(d)] if d.requests == vec![7]));
    }

    #[test]
    fn frames_track_progress_measure_kv_and_forget_what_the_host_ended() {
        let mut book = book(3, 100);
        assert_eq!(book.kv_per_token(), KV as f64, "measured from the report");
        assert_eq!(book.get(1).unwrap().residence, Residence::Resident(0));
        assert_eq!(book.kv_used(0), 2 * 105 * KV);
        assert_eq!(book.step_ns(0), Some(10.0));
        // Request 2 finished; request 1 is missing from the report (the host ended it).
        let finished = book.frame(&frame(&[(2, 100, 9, true)]));
        assert_eq!(finished, vec![Finished { id: 2, class: ServiceClass::Deadline, prompt: 100, output: 9 }]);
        assert!(book.get(1).is_none() && book.get(2).is_none());
        assert_eq!(book.candidates(0, 0).map(|r| r.id).collect::<Vec<_>>(), vec![3]);
        // A handed-back request keeps its progress and must re-prefill.
        let mut book = self::book(3, 100);
        book.arrive(&request(1, 100));
        assert_eq!(book.get(1).unwrap().residence, Residence::Evicted(EvictMode::Recompute));
        assert_eq!(book.get(1).unwrap().prefill_tokens(), 105);
    }

    #[test]
    fn fcfs_admits_in_order_and_stops_at_the_first_that_does_not_fit() {
        // Capacity for the two residents (105 + 10 growth each) and one more fresh request.
        let book = book(5, 100);
        let capacity = (2 * 115 + 110) * KV;
        let plan = plan_by_rank(&book, 0, capacity, &[1, 2, 3, 4, 5], 4, 10, Preemption::NewestOnOverflow);
        assert_eq!(plan.run, vec![1, 2, 3]);
        assert!(plan.evict.is_empty());
        // Too little room even for the residents' growth: the newest resident goes.
        let plan = plan_by_rank(&book, 0, 2 * 105 * KV + 15 * KV, &[1, 2, 3], 4, 10, Preemption::NewestOnOverflow);
        assert_eq!(plan.evict, vec![(2, EvictMode::Recompute)]);
        assert_eq!(plan.run, vec![1]);
    }

    #[test]
    fn unguarded_ranking_evicts_low_ranked_residents_for_better_ones() {
        let book = book(3, 100);
        // Request 3 ranks first; only room for it after evicting the last-ranked resident.
        let capacity = 2 * 105 * KV + 50 * KV;
        let plan = plan_by_rank(&book, 0, capacity, &[3, 1, 2], 1, 10, Preemption::Unguarded);
        assert_eq!(plan.run, vec![3]);
        assert_eq!(plan.evict, vec![(2, EvictMode::Recompute)]);
    }

    #[test]
    fn classes_come_from_stream_names() {
        assert_eq!(ServiceClass::from_stream_name("ls"), ServiceClass::Latency);
        assert_eq!(ServiceClass::from_stream_name("LS-chat"), ServiceClass::Latency);
        assert_eq!(ServiceClass::from_stream_name("cp_agents"), ServiceClass::Compound);
        assert_eq!(ServiceClass::from_stream_name("be"), ServiceClass::BestEffort);
        assert_eq!(ServiceClass::from_stream_name("ds"), ServiceClass::Deadline);
        assert_eq!(ServiceClass::from_stream_name("llm"), ServiceClass::Deadline);
        assert_eq!(ServiceClass::from_stream_name("lsd"), ServiceClass::Deadline);
    }
}
