//! Validation of a policy's actions against the host's truth, before anything is
//! applied. An invalid action is rejected whole — a dispatch with one bad request id
//! runs none of its requests — and counted; the valid ones in the same answer stand.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::contract::{Action, Dispatch, Request, Scale, SetRoutes, StageKind, VariantTarget};

/// A worker as the validator needs to see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerState {
    /// The stage it serves.
    pub stage: u32,
    /// Running a batch (or a frame) right now.
    pub busy: bool,
}

/// A stage as the validator needs to see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageState {
    /// Batch or iteration-level.
    pub kind: StageKind,
    /// Largest batch the host accepts.
    pub max_batch: u32,
    /// The current batch limit (at most `max_batch`).
    pub batch_limit: u32,
    /// Number of variants.
    pub variants: u32,
    /// Replica bounds.
    pub min_replicas: u32,
    /// Replica bounds.
    pub max_replicas: u32,
    /// Replicas serving or starting now.
    pub replicas: u32,
}

/// A sequence resident on an iteration-level worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceState {
    /// The worker holding its KV cache.
    pub worker: u32,
    /// In the frame running now (cannot be evicted until the frame ends).
    pub running: bool,
}

/// The host's truth the validator checks actions against. The scheduling engine's
/// cluster state implements it (the runtime does not depend on the engine).
pub trait ClusterView {
    /// The host's clock.
    fn now(&self) -> u64;
    /// A worker, if it exists.
    fn worker(&self, id: u32) -> Option<WorkerState>;
    /// Workers that are idle now (for replays into a new instance).
    fn idle_workers(&self) -> Vec<u32>;
    /// Every worker serving now (not starting), as a new instance's configuration
    /// lists them: the ones it must know of, whatever was added or removed since the
    /// arm started.
    fn serving_workers(&self) -> Vec<super::contract::Worker>;
    /// A stage, if it exists.
    fn stage(&self, id: u32) -> Option<StageState>;
    /// A resident sequence of an iteration-level worker, if any.
    fn sequence(&self, id: u64) -> Option<SequenceState>;
    /// Most workers the cluster can run.
    fn max_workers(&self) -> u32;
    /// Workers serving or starting now, over all stages.
    fn total_replicas(&self) -> u32;
    /// Most intra-op threads one worker may use.
    fn max_threads(&self) -> u32;
    /// A host's device slots, if the host exists.
    fn host_slots(&self, host: u32) -> Option<HostSlots>;
}

/// A host's device slots as the validator needs to see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSlots {
    /// Slots on the host.
    pub slots: u32,
    /// Slots no worker holds, ascending.
    pub free: Vec<u32>,
}

/// Why an action was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The request is not one the policy holds (unknown, finished, or dispatched).
    #[error("request {0} is not queued with the policy")]
    UnknownRequest(u64),
    /// The request is queued at another stage than the worker serves.
    #[error("request {request} waits at stage {queued}, worker serves stage {worker_stage}")]
    WrongStage {
        /// The request.
        request: u64,
        /// Where it waits.
        queued: u32,
        /// What the worker serves.
        worker_stage: u32,
    },
    /// The same request appears twice in this answer.
    #[error("request {0} is used twice in one answer")]
    RequestReused(u64),
    /// No such worker.
    #[error("worker {0} does not exist")]
    UnknownWorker(u32),
    /// The worker is running something.
    #[error("worker {0} is busy")]
    WorkerBusy(u32),
    /// An empty batch.
    #[error("dispatch to worker {0} names no request")]
    EmptyBatch(u32),
    /// A batch larger than the stage's limit, in items (a request alone may carry up to
    /// the stage's `max-batch`).
    #[error("batch of {len} items over the limit of {limit} of stage {stage}")]
    BatchOverLimit {
        /// Stage.
        stage: u32,
        /// Batch size asked for, in items.
        len: usize,
        /// The limit.
        limit: u32,
    },
    /// No such stage.
    #[error("stage {0} does not exist")]
    UnknownStage(u32),
    /// No such variant.
    #[error("variant {variant} does not exist at stage {stage}")]
    UnknownVariant {
        /// Stage.
        stage: u32,
        /// Variant asked for.
        variant: u32,
    },
    /// Replicas outside the stage's bounds.
    #[error("{replicas} replicas outside [{min}, {max}] for stage {stage}")]
    ReplicasOutOfRange {
        /// Stage.
        stage: u32,
        /// Asked for.
        replicas: u32,
        /// Bound.
        min: u32,
        /// Bound.
        max: u32,
    },
    /// More workers than the cluster has.
    #[error("scaling to {wanted} workers in all exceeds the cluster's {max}")]
    OverCapacity {
        /// Workers after the change.
        wanted: u32,
        /// Cluster size.
        max: u32,
    },
    /// Preempting an idle worker.
    #[error("worker {0} runs nothing to preempt")]
    NothingToPreempt(u32),
    /// Evicting a sequence that is not resident.
    #[error("sequence {0} is not resident on any worker")]
    NotResident(u64),
    /// Evicting a sequence in the running frame.
    #[error("sequence {0} is running in the current frame")]
    SequenceRunning(u64),
    /// A malformed routing table.
    #[error("routes for stage {stage}: {reason}")]
    BadRoutes {
        /// Stage.
        stage: u32,
        /// What is wrong.
        reason: String,
    },
    /// A batch limit of 0 or over the stage's maximum.
    #[error("batch limit {limit} outside [1, {max}] for stage {stage}")]
    BadBatchLimit {
        /// Stage.
        stage: u32,
        /// Asked for.
        limit: u32,
        /// Maximum.
        max: u32,
    },
    /// A thread count of 0 or over the host's maximum.
    #[error("{threads} threads outside [1, {max}] for worker {worker}")]
    BadThreads {
        /// Worker.
        worker: u32,
        /// Asked for.
        threads: u32,
        /// Maximum.
        max: u32,
    },
    /// A placement that names no host, a slot the host lacks or that is taken, more
    /// replicas than a host has free slots, or more entries than new replicas.
    #[error("placement for stage {stage}: {reason}")]
    BadPlacement {
        /// Stage.
        stage: u32,
        /// What is wrong.
        reason: String,
    },
    /// A request of a stateful sequence dispatched to a worker other than the one
    /// holding the sequence's state.
    #[error("request {request} is a step of a sequence held by worker {holder}, not worker {worker}")]
    SequenceElsewhere {
        /// The request.
        request: u64,
        /// The worker holding its sequence.
        holder: u32,
        /// The worker it was dispatched to.
        worker: u32,
    },
    /// A defer or timer in the past.
    #[error("time {at} is not after now ({now})")]
    InThePast {
        /// Asked for.
        at: u64,
        /// Now.
        now: u64,
    },
}

impl Rejection {
    /// Every name [`Rejection::kind`] gives (metrics export each from the start, at
    /// zero).
    pub const KINDS: &'static [&'static str] = &[
        "unknown-request",
        "wrong-stage",
        "request-reused",
        "unknown-worker",
        "worker-busy",
        "empty-batch",
        "batch-over-limit",
        "unknown-stage",
        "unknown-variant",
        "replicas-out-of-range",
        "over-capacity",
        "nothing-to-preempt",
        "not-resident",
        "sequence-running",
        "bad-routes",
        "bad-batch-limit",
        "bad-threads",
        "in-the-past",
        "bad-placement",
        "sequence-elsewhere",
    ];

    /// A short name of the reason, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Rejection::UnknownRequest(_) => "unknown-request",
            Rejection::WrongStage { .. } => "wrong-stage",
            Rejection::RequestReused(_) => "request-reused",
            Rejection::UnknownWorker(_) => "unknown-worker",
            Rejection::WorkerBusy(_) => "worker-busy",
            Rejection::EmptyBatch(_) => "empty-batch",
            Rejection::BatchOverLimit { .. } => "batch-over-limit",
            Rejection::UnknownStage(_) => "unknown-stage",
            Rejection::UnknownVariant { .. } => "unknown-variant",
            Rejection::ReplicasOutOfRange { .. } => "replicas-out-of-range",
            Rejection::OverCapacity { .. } => "over-capacity",
            Rejection::NothingToPreempt(_) => "nothing-to-preempt",
            Rejection::NotResident(_) => "not-resident",
            Rejection::SequenceRunning(_) => "sequence-running",
            Rejection::BadRoutes { .. } => "bad-routes",
            Rejection::BadBatchLimit { .. } => "bad-batch-limit",
            Rejection::BadThreads { .. } => "bad-threads",
            Rejection::InThePast { .. } => "in-the-past",
            Rejection::BadPlacement { .. } => "bad-placement",
            Rejection::SequenceElsewhere { .. } => "sequence-elsewhere",
        }
    }
}

/// The requests a policy holds: delivered as arrivals and not yet dispatched,
/// dropped, deferred or ended. This is what a new instance is replayed.
///
/// The held requests are kept in arrival order, so a replay reads them sequentially:
/// a queue of slots in the order the requests arrived, with holes where requests left
/// (holes at the front are popped at once; the queue is compacted when holes
/// outnumber the requests), and an index from request id to slot. Every arrival gets
/// a sequence number, so what changed since a [`LedgerSnapshot`] — which requests
/// left, which arrived — is told by a walk over the sequence numbers, without looking
/// anything up.
#[derive(Debug)]
pub struct Ledger {
    /// Slot of every held request, as an absolute position (`front` + index).
    index: HashMap<u64, usize>,
    /// Sequence number of each slot; [`HOLE`] is set once its request has left.
    seqs: VecDeque<u64>,
    /// The requests, in arrival order; `None` where one has left.
    slots: VecDeque<Option<Request>>,
    /// Absolute position of the first slot.
    front: usize,
    /// Slots whose request has left.
    holes: usize,
    /// Sequence number of the next arrival.
    next_seq: u64,
    /// Tells ledgers apart, so a snapshot is only compared with its own ledger.
    identity: u64,
}

/// Marks a slot whose request has left (sequence numbers stay below it).
const HOLE: u64 = 1 << 63;

/// Compaction waits for at least this many holes.
const MIN_HOLES_TO_COMPACT: usize = 64;

fn next_identity() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            index: HashMap::default(),
            seqs: VecDeque::new(),
            slots: VecDeque::new(),
            front: 0,
            holes: 0,
            next_seq: 0,
            identity: next_identity(),
        }
    }
}

impl Clone for Ledger {
    /// A copy with the same requests in the same order, as a ledger of its own: a
    /// snapshot of the original does not apply to it.
    fn clone(&self) -> Self {
        Self {
            index: self.index.clone(),
            seqs: self.seqs.clone(),
            slots: self.slots.clone(),
            front: self.front,
            holes: self.holes,
            next_seq: self.next_seq,
            identity: next_identity(),
        }
    }
}

/// What a [`Ledger`] held at one moment: enough to tell later, cheaply, what changed
/// since ([`Ledger::changes_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSnapshot {
    identity: u64,
    next_seq: u64,
    /// Sequence number and id of every held request, in arrival order.
    held: Vec<(u64, u64)>,
}

impl LedgerSnapshot {
    /// Requests held at the snapshot.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing was held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// What changed in a ledger since a [`LedgerSnapshot`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerChanges {
    /// Requests held at the snapshot that are held no more (dispatched, dropped,
    /// deferred or ended since), by id, in arrival order. An id may be held again
    /// under a later arrival (the next stage of a chain, a deferral come due).
    pub left: Vec<u64>,
    /// Requests that arrived after the snapshot and are held now, in arrival order.
    pub arrived: Vec<Request>,
}

impl Ledger {
    /// Record an arrival (a request already held under the same id is replaced and
    /// counts as arriving now).
    pub fn insert(&mut self, request: Request) {
        self.remove(request.id);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.index.insert(request.id, self.front + self.slots.len());
        self.seqs.push_back(seq);
        self.slots.push_back(Some(request));
    }

    /// Forget a request; returns it if it was held.
    pub fn remove(&mut self, id: u64) -> Option<Request> {
        let at = self.index.remove(&id)? - self.front;
        self.seqs[at] |= HOLE;
        let request = self.slots[at].take();
        self.holes += 1;
        while self.seqs.front().is_some_and(|seq| seq & HOLE != 0) {
            self.seqs.pop_front();
            self.slots.pop_front();
            self.front += 1;
            self.holes -= 1;
        }
        if self.holes >= MIN_HOLES_TO_COMPACT && self.holes > self.index.len() {
            self.compact();
        }
        request
    }

    /// Close the holes (every request keeps its place in arrival order).
    fn compact(&mut self) {
        let mut seqs = VecDeque::with_capacity(self.index.len());
        let mut slots = VecDeque::with_capacity(self.index.len());
        for (seq, slot) in self.seqs.drain(..).zip(self.slots.drain(..)) {
            if let Some(request) = slot {
                *self.index.get_mut(&request.id).expect("a held request is indexed") = self.front + slots.len();
                seqs.push_back(seq);
                slots.push_back(Some(request));
            }
        }
        self.seqs = seqs;
        self.slots = slots;
        self.holes = 0;
    }

    /// A held request.
    pub fn get(&self, id: u64) -> Option<&Request> {
        let at = *self.index.get(&id)?;
        self.slots[at - self.front].as_ref()
    }

    /// Where a held request stands in arrival order (smaller: arrived earlier).
    pub fn position(&self, id: u64) -> Option<usize> {
        self.index.get(&id).copied()
    }

    /// Number of held requests.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Held requests in the order they arrived.
    pub fn in_arrival_order(&self) -> Vec<Request> {
        let mut held = Vec::with_capacity(self.len());
        held.extend(self.slots.iter().flatten().cloned());
        held
    }

    /// The held requests in the order they arrived, and a snapshot to tell later
    /// what changed since.
    pub fn snapshot(&self) -> (LedgerSnapshot, Vec<Request>) {
        let mut held = Vec::with_capacity(self.len());
        let mut ids = Vec::with_capacity(self.len());
        for (seq, slot) in self.seqs.iter().zip(&self.slots) {
            if let Some(request) = slot {
                ids.push((*seq, request.id));
                held.push(request.clone());
            }
        }
        (LedgerSnapshot { identity: self.identity, next_seq: self.next_seq, held: ids }, held)
    }

    /// What changed since `snapshot`; `None` when the snapshot is of another ledger.
    /// Costs a walk over the sequence numbers of what is held (no lookups) and a
    /// copy of what arrived since.
    pub fn changes_since(&self, snapshot: &LedgerSnapshot) -> Option<LedgerChanges> {
        if snapshot.identity != self.identity {
            return None;
        }
        let first_new = self.seqs.partition_point(|seq| seq & !HOLE < snapshot.next_seq);
        // What is held now from before the snapshot was held at the snapshot (a
        // request never comes back under the same sequence number): both lists are in
        // sequence order, so one merge finds what left.
        let mut still_held = self.seqs.range(..first_new).filter(|seq| *seq & HOLE == 0).copied().peekable();
        let mut left = Vec::new();
        for &(seq, id) in &snapshot.held {
            if still_held.peek() == Some(&seq) {
                still_held.next();
            } else {
                left.push(id);
            }
        }
        debug_assert!(still_held.next().is_none(), "a request held from before the snapshot was not in it");
        let arrived = self.slots.range(first_new..).flatten().cloned().collect();
        Some(LedgerChanges { left, arrived })
    }

    /// Forget everything; returns what was held, in arrival order.
    pub fn drain(&mut self) -> Vec<Request> {
        let held = self.slots.drain(..).flatten().collect();
        self.front += self.seqs.len();
        self.seqs.clear();
        self.index.clear();
        self.holes = 0;
        held
    }

    /// Remove the requests an accepted action consumes from the policy's hands.
    pub fn apply(&mut self, action: &Action) {
        match action {
            Action::Drop(d) => {
                self.remove(d.request);
            }
            Action::Dispatch(d) => {
                for id in &d.requests {
                    self.remove(*id);
                }
            }
            Action::Defer(d) => {
                self.remove(d.request);
            }
            _ => {}
        }
    }
}

/// The first id that appears twice in a batch (batches are small: a quadratic scan
/// avoids allocating a set per dispatch).
fn first_duplicate(ids: &[u64]) -> Option<u64> {
    if ids.len() > 64 {
        let mut seen = HashSet::with_capacity_and_hasher(ids.len(), Default::default());
        return ids.iter().copied().find(|id| !seen.insert(*id));
    }
    ids.iter().enumerate().find(|(i, id)| ids[..*i].contains(id)).map(|(_, id)| *id)
}

/// The outcome of validating one answer.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Verdict {
    /// Actions to apply, in the policy's order.
    pub accepted: Vec<Action>,
    /// Rejected actions with their reasons.
    pub rejected: Vec<(Action, Rejection)>,
}

/// Validate `actions` in order against the ledger and the view; later actions see the
/// effects of earlier accepted ones (a worker dispatched to is busy, a request used is
/// gone).
pub fn validate(actions: Vec<Action>, ledger: &Ledger, view: &dyn ClusterView) -> Verdict {
    let mut checker = Checker {
        ledger,
        view,
        used: HashSet::default(),
        taken: HashSet::default(),
        preempted: HashSet::default(),
        replica_delta: HashMap::default(),
        placed: HashMap::default(),
    };
    let mut verdict = Verdict::default();
    for action in actions {
        match checker.check(&action) {
            Ok(()) => verdict.accepted.push(action),
            Err(reason) => verdict.rejected.push((action, reason)),
        }
    }
    verdict
}

struct Checker<'a> {
    ledger: &'a Ledger,
    view: &'a dyn ClusterView,
    /// Requests consumed by accepted actions of this answer.
    used: HashSet<u64>,
    /// Workers dispatched to by accepted actions of this answer.
    taken: HashSet<u32>,
    /// Workers preempted by accepted actions of this answer.
    preempted: HashSet<u32>,
    /// Replica changes made by accepted scale actions of this answer, per stage.
    replica_delta: HashMap<u32, i64>,
    /// Slots claimed by accepted placements of this answer, per host (`None`: a free
    /// slot the host picks).
    placed: HashMap<u32, Vec<Option<u32>>>,
}

impl Checker<'_> {
    fn check(&mut self, action: &Action) -> Result<(), Rejection> {
        let view = self.view;
        match action {
            Action::Drop(d) => {
                self.held_or_resident(d.request)?;
                self.used.insert(d.request);
            }
            Action::Dispatch(d) => self.check_dispatch(d)?,
            Action::Preempt(w) => {
                let worker = view.worker(*w).ok_or(Rejection::UnknownWorker(*w))?;
                if !worker.busy || !self.preempted.insert(*w) {
                    return Err(Rejection::NothingToPreempt(*w));
                }
            }
            Action::Evict(e) => {
                let sequence = view.sequence(e.sequence).ok_or(Rejection::NotResident(e.sequence))?;
                if sequence.running {
                    return Err(Rejection::SequenceRunning(e.sequence));
                }
                if !self.used.insert(e.sequence) {
                    return Err(Rejection::RequestReused(e.sequence));
                }
            }
            Action::Scale(s) => self.check_scale(s)?,
            Action::SetVariant(s) => {
                let stage_id = match s.target {
                    VariantTarget::Worker(w) => view.worker(w).ok_or(Rejection::UnknownWorker(w))?.stage,
                    VariantTarget::Stage(stage) => stage,
                };
                let stage = view.stage(stage_id).ok_or(Rejection::UnknownStage(stage_id))?;
                if s.variant >= stage.variants {
                    return Err(Rejection::UnknownVariant { stage: stage_id, variant: s.variant });
                }
            }
            Action::SetRoutes(r) => self.check_routes(r)?,
            Action::SetBatchLimit(b) => {
                let stage = view.stage(b.stage).ok_or(Rejection::UnknownStage(b.stage))?;
                if b.limit == 0 || b.limit > stage.max_batch {
                    return Err(Rejection::BadBatchLimit { stage: b.stage, limit: b.limit, max: stage.max_batch });
                }
            }
            Action::SetThreads(t) => {
                view.worker(t.worker).ok_or(Rejection::UnknownWorker(t.worker))?;
                let max = view.max_threads();
                if t.threads == 0 || t.threads > max {
                    return Err(Rejection::BadThreads { worker: t.worker, threads: t.threads, max });
                }
            }
            Action::Defer(d) => {
                if self.ledger.get(d.request).is_none() {
                    return Err(Rejection::UnknownRequest(d.request));
                }
                if self.used.contains(&d.request) {
                    return Err(Rejection::RequestReused(d.request));
                }
                if d.until <= view.now() {
                    return Err(Rejection::InThePast { at: d.until, now: view.now() });
                }
                self.used.insert(d.request);
            }
            Action::SetTimer(t) => {
                if t.at < view.now() {
                    return Err(Rejection::InThePast { at: t.at, now: view.now() });
                }
            }
        }
        Ok(())
    }

    fn check_dispatch(&mut self, d: &Dispatch) -> Result<(), Rejection> {
        let view = self.view;
        let worker = view.worker(d.worker).ok_or(Rejection::UnknownWorker(d.worker))?;
        if worker.busy || self.taken.contains(&d.worker) {
            return Err(Rejection::WorkerBusy(d.worker));
        }
        let stage = view.stage(worker.stage).ok_or(Rejection::UnknownStage(worker.stage))?;
        if d.requests.is_empty() {
            return Err(Rejection::EmptyBatch(d.worker));
        }
        if d.requests.len() > stage.batch_limit as usize && d.requests.len() > 1 {
            return Err(Rejection::BatchOverLimit { stage: worker.stage, len: d.requests.len(), limit: stage.batch_limit });
        }
        if let Some(variant) = d.variant {
            if variant >= stage.variants {
                return Err(Rejection::UnknownVariant { stage: worker.stage, variant });
            }
        }
        if let Some(id) = first_duplicate(&d.requests) {
            return Err(Rejection::RequestReused(id));
        }
        let mut items = 0usize;
        for &id in &d.requests {
            if self.used.contains(&id) {
                return Err(Rejection::RequestReused(id));
            }
            match self.ledger.get(id) {
                Some(request) if request.stage != worker.stage => {
                    return Err(Rejection::WrongStage { request: id, queued: request.stage, worker_stage: worker.stage })
                }
                Some(request) => {
                    items += request.items.max(1) as usize;
                    if let Some(holder) = request.correlation.as_ref().and_then(|c| c.worker).filter(|w| *w != d.worker) {
                        return Err(Rejection::SequenceElsewhere { request: id, holder, worker: d.worker });
                    }
                }
                None => {
                    items += 1;
                    // Iteration workers may also re-run their own resident sequences.
                    let resident = stage.kind == StageKind::Iteration && view.sequence(id).is_some_and(|s| s.worker == d.worker);
                    if !resident {
                        return Err(Rejection::UnknownRequest(id));
                    }
                }
            }
        }
        // A batch is at most the current limit in items; one request alone may carry
        // up to the stage's largest batch (a client batch is never split).
        let limit = if d.requests.len() == 1 { stage.max_batch.max(stage.batch_limit) } else { stage.batch_limit };
        if items > limit as usize {
            return Err(Rejection::BatchOverLimit { stage: worker.stage, len: items, limit });
        }
        self.used.extend(d.requests.iter().copied());
        self.taken.insert(d.worker);
        Ok(())
    }

    fn check_scale(&mut self, s: &Scale) -> Result<(), Rejection> {
        let view = self.view;
        let stage = view.stage(s.stage).ok_or(Rejection::UnknownStage(s.stage))?;
        if s.replicas < stage.min_replicas || s.replicas > stage.max_replicas {
            return Err(Rejection::ReplicasOutOfRange {
                stage: s.stage,
                replicas: s.replicas,
                min: stage.min_replicas,
                max: stage.max_replicas,
            });
        }
        if let Some(variant) = s.variant {
            if variant >= stage.variants {
                return Err(Rejection::UnknownVariant { stage: s.stage, variant });
            }
        }
        let delta = s.replicas as i64 - stage.replicas as i64;
        let others: i64 = self.replica_delta.iter().filter(|(stage, _)| **stage != s.stage).map(|(_, d)| *d).sum();
        let wanted = view.total_replicas() as i64 + others + delta;
        if wanted > view.max_workers() as i64 {
            return Err(Rejection::OverCapacity { wanted: wanted.max(0) as u32, max: view.max_workers() });
        }
        let placed = self.check_placement(s, delta)?;
        self.replica_delta.insert(s.stage, delta);
        for (host, slot) in placed {
            self.placed.entry(host).or_default().push(slot);
        }
        Ok(())
    }

    /// Check a scale's placement against the hosts' free slots (less those claimed
    /// earlier in this answer); the claims it would make.
    fn check_placement(&self, s: &Scale, delta: i64) -> Result<Vec<(u32, Option<u32>)>, Rejection> {
        let bad = |reason: String| Rejection::BadPlacement { stage: s.stage, reason };
        if s.placement.is_empty() {
            return Ok(Vec::new());
        }
        if s.placement.len() as i64 > delta.max(0) {
            return Err(bad(format!("{} entries for {} new replicas", s.placement.len(), delta.max(0))));
        }
        let mut claims: Vec<(u32, Option<u32>)> = Vec::with_capacity(s.placement.len());
        for p in &s.placement {
            let host = self.view.host_slots(p.host).ok_or_else(|| bad(format!("host {} does not exist", p.host)))?;
            let earlier = self.placed.get(&p.host).into_iter().flatten().chain(claims.iter().filter(|(h, _)| *h == p.host).map(|(_, s)| s));
            let earlier: Vec<Option<u32>> = earlier.copied().collect();
            if let Some(slot) = p.slot {
                if slot >= host.slots {
                    return Err(bad(format!("host {} has no slot {slot} (it has {})", p.host, host.slots)));
                }
                if !host.free.contains(&slot) || earlier.contains(&Some(slot)) {
                    return Err(bad(format!("slot {slot} of host {} is taken", p.host)));
                }
            }
            if earlier.len() >= host.free.len() {
                return Err(bad(format!("host {} has {} free slots", p.host, host.free.len())));
            }
            claims.push((p.host, p.slot));
        }
        Ok(claims)
    }

    fn check_routes(&self, r: &SetRoutes) -> Result<(), Rejection> {
        let view = self.view;
        view.stage(r.stage).ok_or(Rejection::UnknownStage(r.stage))?;
        let bad = |reason: String| Rejection::BadRoutes { stage: r.stage, reason };
        if let Some(source) = r.source {
            view.worker(source).ok_or(Rejection::UnknownWorker(source))?;
        }
        if r.targets.is_empty() {
            return Err(bad("no targets".into()));
        }
        let mut total = 0.0;
        for target in &r.targets {
            let worker = view.worker(target.worker).ok_or(Rejection::UnknownWorker(target.worker))?;
            if worker.stage != r.stage {
                return Err(bad(format!("worker {} serves stage {}", target.worker, worker.stage)));
            }
            if !target.weight.is_finite() || target.weight < 0.0 {
                return Err(bad(format!("weight {} of worker {}", target.weight, target.worker)));
            }
            total += target.weight;
        }
        if total <= 0.0 {
            return Err(bad("weights sum to zero".into()));
        }
        Ok(())
    }

    /// A drop may name a queued request or a resident sequence, once per answer.
    fn held_or_resident(&self, id: u64) -> Result<(), Rejection> {
        if self.used.contains(&id) {
            return Err(Rejection::RequestReused(id));
        }
        if self.ledger.get(id).is_none() && self.view.sequence(id).is_none() {
            return Err(Rejection::UnknownRequest(id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Defer, DropReason, DropRequest, Evict, EvictMode, Placement, Route, SetBatchLimit, SetThreads, SetVariant};

    /// Two batch stages (0: workers 0, 1; 1: worker 2) and an iteration stage (2:
    /// worker 3, with resident sequences 500 running and 501 paused).
    struct View;

    impl ClusterView for View {
        fn now(&self) -> u64 {
            1_000
        }
        fn worker(&self, id: u32) -> Option<WorkerState> {
            match id {
                0 => Some(WorkerState { stage: 0, busy: false }),
                1 => Some(WorkerState { stage: 0, busy: true }),
                2 => Some(WorkerState { stage: 1, busy: false }),
                3 => Some(WorkerState { stage: 2, busy: false }),
                _ => None,
            }
        }
        fn idle_workers(&self) -> Vec<u32> {
            vec![0, 2, 3]
        }
        fn serving_workers(&self) -> Vec<crate::contract::Worker> {
            Vec::new()
        }
        fn stage(&self, id: u32) -> Option<StageState> {
            let kind = if id == 2 { StageKind::Iteration } else { StageKind::Batch };
            (id < 3).then_some(StageState {
                kind,
                max_batch: 8,
                batch_limit: 4,
                variants: 2,
                min_replicas: 1,
                max_replicas: 3,
                replicas: if id == 0 { 2 } else { 1 },
            })
        }
        fn sequence(&self, id: u64) -> Option<SequenceState> {
            match id {
                500 => Some(SequenceState { worker: 3, running: true }),
                501 => Some(SequenceState { worker: 3, running: false }),
                _ => None,
            }
        }
        fn max_workers(&self) -> u32 {
            5
        }
        fn total_replicas(&self) -> u32 {
            4
        }
        fn max_threads(&self) -> u32 {
            8
        }
        /// Host 0: slots 0–3, 1 and 3 free; host 1: slots 0–1, none free.
        fn host_slots(&self, host: u32) -> Option<HostSlots> {
            match host {
                0 => Some(HostSlots { slots: 4, free: vec![1, 3] }),
                1 => Some(HostSlots { slots: 2, free: vec![] }),
                _ => None,
            }
        }
    }

    fn ledger() -> Ledger {
        let mut ledger = Ledger::default();
        for (id, stage) in [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 1)] {
            ledger.insert(Request { stage, ..request(id) });
        }
        ledger
    }

    fn dispatch(worker: u32, requests: &[u64]) -> Action {
        Action::Dispatch(Dispatch { worker, requests: requests.to_vec(), variant: None })
    }

    fn reasons(actions: Vec<Action>) -> Vec<&'static str> {
        validate(actions, &ledger(), &View).rejected.iter().map(|(_, r)| r.kind()).collect()
    }

    #[test]
    fn dispatch_rules() {
        assert!(reasons(vec![dispatch(0, &[1, 2])]).is_empty());
        assert_eq!(reasons(vec![dispatch(1, &[1])]), ["worker-busy"]);
        assert_eq!(reasons(vec![dispatch(9, &[1])]), ["unknown-worker"]);
        assert_eq!(reasons(vec![dispatch(0, &[])]), ["empty-batch"]);
        assert_eq!(reasons(vec![dispatch(0, &[1, 2, 3, 4, 5])]), ["batch-over-limit"]);
        assert_eq!(reasons(vec![dispatch(0, &[6])]), ["wrong-stage"]);
        assert_eq!(reasons(vec![dispatch(0, &[1, 1])]), ["request-reused"]);
        assert_eq!(reasons(vec![dispatch(0, &[77])]), ["unknown-request"]);
        // The same worker twice, and the same request in two batches, in one answer.
        assert_eq!(reasons(vec![dispatch(0, &[1]), dispatch(0, &[2])]), ["worker-busy"]);
        assert_eq!(reasons(vec![dispatch(0, &[1]), dispatch(2, &[6]), dispatch(2, &[6])]), ["worker-busy"]);
        let with_variant = Action::Dispatch(Dispatch { worker: 0, requests: vec![1], variant: Some(2) });
        assert_eq!(reasons(vec![with_variant]), ["unknown-variant"]);
    }

    #[test]
    fn a_batch_counts_items_and_a_sequence_step_runs_only_where_its_state_is() {
        // Stage 0: limit 4, max 8. Requests 10 (3 items), 11 (2 items), 12 (8 items),
        // 13 (9 items), 14 (a sequence step held by worker 2), 15 (a first step).
        let mut ledger = ledger();
        for (id, items) in [(10, 3), (11, 2), (12, 8), (13, 9)] {
            ledger.insert(Request { stage: 0, items, ..request(id) });
        }
        let step = |worker: Option<u32>| Some(crate::contract::Correlation { id: 7, start: worker.is_none(), end: false, worker });
        ledger.insert(Request { stage: 0, correlation: step(Some(1)), ..request(14) });
        ledger.insert(Request { stage: 0, correlation: step(None), ..request(15) });
        let reasons = |actions: Vec<Action>| validate(actions, &ledger, &View).rejected.iter().map(|(_, r)| r.kind()).collect::<Vec<_>>();
        assert!(reasons(vec![dispatch(0, &[10, 1])]).is_empty(), "3 + 1 items fit a limit of 4");
        assert_eq!(reasons(vec![dispatch(0, &[10, 11])]), ["batch-over-limit"], "3 + 2 items do not");
        assert!(reasons(vec![dispatch(0, &[12])]).is_empty(), "a client batch alone may fill the stage's max batch");
        assert_eq!(reasons(vec![dispatch(0, &[13])]), ["batch-over-limit"], "but never more");
        assert_eq!(reasons(vec![dispatch(0, &[14])]), ["sequence-elsewhere"]);
        assert!(reasons(vec![dispatch(0, &[15, 1])]).is_empty(), "a first step goes anywhere");
    }

    #[test]
    fn a_rejected_dispatch_consumes_nothing() {
        // The first dispatch is rejected (request 77 unknown), so 1 is still free.
        let verdict = validate(vec![dispatch(0, &[1, 77]), dispatch(0, &[1])], &ledger(), &View);
        assert_eq!(verdict.rejected.len(), 1);
        assert_eq!(verdict.accepted, vec![dispatch(0, &[1])]);
    }

    #[test]
    fn iteration_workers_may_rerun_their_resident_sequences() {
        assert!(reasons(vec![dispatch(3, &[500, 501])]).is_empty());
        // Not on another worker's stage, and evicting needs a paused sequence.
        let evict = |sequence| Action::Evict(Evict { sequence, mode: EvictMode::Recompute });
        assert_eq!(reasons(vec![evict(500)]), ["sequence-running"]);
        assert!(reasons(vec![evict(501)]).is_empty());
        assert_eq!(reasons(vec![evict(502)]), ["not-resident"]);
    }

    #[test]
    fn drops_defers_and_timers() {
        let drop = |request| Action::Drop(DropRequest { request, reason: DropReason::Policy });
        assert!(reasons(vec![drop(1), drop(501)]).is_empty());
        assert_eq!(reasons(vec![drop(1), drop(1)]), ["request-reused"]);
        assert_eq!(reasons(vec![drop(99)]), ["unknown-request"]);
        let defer = |request, until| Action::Defer(Defer { request, until });
        assert!(reasons(vec![defer(1, 2_000)]).is_empty());
        assert_eq!(reasons(vec![defer(1, 1_000)]), ["in-the-past"]);
        assert_eq!(reasons(vec![defer(1, 2_000), dispatch(0, &[1])]), ["request-reused"]);
    }

    #[test]
    fn scaling_respects_stage_bounds_and_cluster_capacity() {
        let scale = |stage, replicas| Action::Scale(Scale { stage, replicas, variant: None, placement: Vec::new() });
        assert!(reasons(vec![scale(0, 3)]).is_empty());
        assert_eq!(reasons(vec![scale(0, 4)]), ["replicas-out-of-range"]);
        assert_eq!(reasons(vec![scale(0, 0)]), ["replicas-out-of-range"]);
        // 4 workers now, 5 at most: one more fits, two more do not.
        assert_eq!(reasons(vec![scale(0, 3), scale(1, 2)]), ["over-capacity"]);
        // Shrinking one stage makes room for another in the same answer.
        assert!(reasons(vec![scale(0, 1), scale(1, 3)]).is_empty());
        assert_eq!(reasons(vec![scale(7, 1)]), ["unknown-stage"]);
    }

    #[test]
    fn placements_name_free_slots_of_existing_hosts_one_entry_per_new_replica_at_most() {
        let at = |host, slot| Placement { host, slot };
        let scale = |stage, replicas, placement: Vec<Placement>| Action::Scale(Scale { stage, replicas, variant: None, placement });
        // Stage 1 has 1 replica; the cluster has room for one more worker.
        assert!(reasons(vec![scale(1, 2, vec![at(0, None)])]).is_empty());
        assert!(reasons(vec![scale(1, 2, vec![at(0, Some(3))])]).is_empty());
        assert_eq!(reasons(vec![scale(1, 2, vec![at(0, Some(2))])]), ["bad-placement"], "slot 2 is taken");
        assert_eq!(reasons(vec![scale(1, 2, vec![at(0, Some(4))])]), ["bad-placement"], "host 0 has no slot 4");
        assert_eq!(reasons(vec![scale(1, 2, vec![at(1, None)])]), ["bad-placement"], "host 1 is full");
        assert_eq!(reasons(vec![scale(1, 2, vec![at(2, None)])]), ["bad-placement"], "no host 2");
        assert_eq!(reasons(vec![scale(1, 2, vec![at(0, None), at(0, None)])]), ["bad-placement"], "one new replica, two entries");
        assert_eq!(reasons(vec![scale(1, 1, vec![at(0, None)])]), ["bad-placement"], "no new replica");
        // Claims add up over an answer: stage 0 gives back a replica, stage 1 takes
        // both free slots of host 0, and a third claim on host 0 is refused.
        assert!(reasons(vec![scale(0, 1, vec![]), scale(1, 3, vec![at(0, Some(1)), at(0, None)])]).is_empty());
        assert_eq!(
            reasons(vec![scale(0, 1, vec![]), scale(1, 2, vec![at(0, Some(1))]), scale(2, 2, vec![at(0, Some(1))])]),
            ["bad-placement"]
        );
        // Fewer entries than new replicas: the host places the rest.
        assert!(reasons(vec![scale(0, 1, vec![]), scale(1, 3, vec![at(0, None)])]).is_empty());
    }

    #[test]
    fn routes_limits_threads_and_variants() {
        let routes = |targets: Vec<Route>| Action::SetRoutes(SetRoutes { stage: 0, source: None, targets });
        assert!(reasons(vec![routes(vec![Route { worker: 0, weight: 0.7 }, Route { worker: 1, weight: 0.3 }])]).is_empty());
        assert_eq!(reasons(vec![routes(vec![])]), ["bad-routes"]);
        assert_eq!(reasons(vec![routes(vec![Route { worker: 2, weight: 1.0 }])]), ["bad-routes"]);
        assert_eq!(reasons(vec![routes(vec![Route { worker: 0, weight: f64::NAN }])]), ["bad-routes"]);
        assert_eq!(reasons(vec![routes(vec![Route { worker: 0, weight: 0.0 }])]), ["bad-routes"]);
        let limit = |limit| Action::SetBatchLimit(SetBatchLimit { stage: 0, limit });
        assert!(reasons(vec![limit(8)]).is_empty());
        assert_eq!(reasons(vec![limit(9), limit(0)]), ["bad-batch-limit", "bad-batch-limit"]);
        let threads = |threads| Action::SetThreads(SetThreads { worker: 0, threads });
        assert!(reasons(vec![threads(8)]).is_empty());
        assert_eq!(reasons(vec![threads(9)]), ["bad-threads"]);
        let variant = |target, variant| Action::SetVariant(SetVariant { target, variant });
        assert!(reasons(vec![variant(VariantTarget::Stage(0), 1)]).is_empty());
        assert_eq!(reasons(vec![variant(VariantTarget::Worker(0), 2)]), ["unknown-variant"]);
    }

    #[test]
    fn the_ledger_replays_in_arrival_order_and_forgets_what_is_consumed() {
        let mut ledger = ledger();
        ledger.apply(&dispatch(0, &[2, 3]));
        ledger.apply(&Action::Drop(DropRequest { request: 6, reason: DropReason::Overload }));
        let ids: Vec<u64> = ledger.in_arrival_order().iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 4, 5]);
        assert_eq!(ledger.drain().len(), 3);
        assert!(ledger.is_empty());
    }

    fn request(id: u64) -> Request {
        Request {
            id,
            origin: id,
            stage: (id % 2) as u32,
            stream: 0,
            sent_at: 0,
            arrived_at: 0,
            deadline: 10_000,
            priority: 0,
            input_size: 0,
            expected_tokens: 0,
            requeues: 0,
            tags: None,
            items: 1,
            correlation: None,
        }
    }

    #[test]
    fn the_ledger_keeps_arrival_order_through_removals_reinsertions_and_compactions() {
        // A reference: (arrival number, id) in arrival order, searched linearly.
        let mut model: Vec<(u64, u64)> = Vec::new();
        let mut ledger = Ledger::default();
        let (mut state, mut arrivals) = (7u64, 0u64);
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            state >> 33
        };
        for step in 0..20_000 {
            let roll = next() % 100;
            // Arrivals outnumber removals early on, then removals win: the ledger
            // grows to thousands, then empties through many compactions.
            let arrive = if step < 10_000 { roll < 60 } else { roll < 35 };
            if arrive || model.is_empty() {
                // Mostly fresh ids; sometimes an id held or seen before comes again.
                let id = if roll % 7 == 0 && arrivals > 0 { next() % arrivals } else { 1_000_000 + arrivals };
                model.retain(|(_, held)| *held != id);
                model.push((arrivals, id));
                ledger.insert(request(id));
                arrivals += 1;
            } else {
                let at = (next() as usize) % model.len();
                let (_, id) = model.remove(at);
                assert_eq!(ledger.remove(id).map(|r| r.id), Some(id));
                assert!(ledger.remove(id).is_none(), "removed once");
            }
            if step % 997 == 0 {
                let ids: Vec<u64> = ledger.in_arrival_order().iter().map(|r| r.id).collect();
                let expected: Vec<u64> = model.iter().map(|(_, id)| *id).collect();
                assert_eq!(ids, expected, "step {step}");
            }
            assert_eq!(ledger.len(), model.len());
        }
        for (_, id) in &model {
            assert_eq!(ledger.get(*id).map(|r| r.id), Some(*id));
        }
        let positions: Vec<usize> = model.iter().map(|(_, id)| ledger.position(*id).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions follow arrival order");
        let drained: Vec<u64> = ledger.drain().iter().map(|r| r.id).collect();
        assert_eq!(drained, model.iter().map(|(_, id)| *id).collect::<Vec<_>>());
        assert!(ledger.is_empty() && ledger.get(model[0].1).is_none());
    }

    #[test]
    fn changes_since_a_snapshot_name_what_left_and_what_arrived_in_order() {
        let mut ledger = Ledger::default();
        for id in 1..=200 {
            ledger.insert(request(id));
        }
        ledger.remove(5);
        let (snapshot, held) = ledger.snapshot();
        assert_eq!(held.len(), 199);
        assert_eq!(snapshot.len(), 199);
        assert_eq!(held.iter().map(|r| r.id).collect::<Vec<_>>(), ledger.in_arrival_order().iter().map(|r| r.id).collect::<Vec<_>>());

        // Nothing changed: nothing to tell.
        assert_eq!(ledger.changes_since(&snapshot), Some(LedgerChanges::default()));

        // Many leave (enough to compact), some arrive, one that left comes back (a
        // chain's next stage), one arrives and leaves before anyone looks.
        for id in (1..=150).filter(|id| id % 3 != 0) {
            ledger.remove(id);
        }
        ledger.insert(request(1_000));
        ledger.insert(request(7));
        ledger.insert(request(1_001));
        ledger.remove(1_001);
        ledger.insert(request(1_002));
        ledger.remove(9);
        let changes = ledger.changes_since(&snapshot).expect("its own ledger");
        let mut left: Vec<u64> = (1..=150).filter(|id| id % 3 != 0 && *id != 5).collect();
        left.push(9);
        left.sort();
        assert_eq!(changes.left, left, "in arrival order");
        assert_eq!(changes.arrived.iter().map(|r| r.id).collect::<Vec<_>>(), [1_000, 7, 1_002]);

        // Another ledger, or a copy, cannot be compared with it.
        assert_eq!(Ledger::default().changes_since(&snapshot), None);
        assert_eq!(ledger.clone().changes_since(&snapshot), None);
    }
}
