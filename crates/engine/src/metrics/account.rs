//! [`Accounting`]: the incremental bookkeeping behind every metric, fed by the engine
//! (live server and simulator alike) as things happen.
//!
//! The engine reports five kinds of facts, each stamped with its time in nanoseconds:
//!
//! - [`Accounting::arrival`]: a request was offered (offered load);
//! - [`Accounting::batch_finished`]: a batch ran on a worker for some duration
//!   (accelerator time, split in equal shares between the batch's requests);
//! - [`Accounting::request_ended`]: a request ended — completed (on time or late),
//!   dropped or failed;
//! - [`Accounting::workers_changed`]: the number of active workers changed
//!   (GPU-seconds, utilisation);
//! - [`Accounting::set_capacity`]: the most the cluster can serve, in requests per
//!   second (the optimal goodput bound's capacity; the engine gives its
//!   `capacity_bound`).
//!
//! Every call is O(1) amortised and allocates nothing beyond amortised growth of
//! vectors and maps (the one exception: the first time a new drop or failure reason
//! string is seen, it is kept). Memory stays bounded by the requests in flight, the
//! requests that ended within the last [`SETTLE_HORIZON`] or two, the number of
//! streams, and the closed windows (about 100 bytes each).
//!
//! Times are expected in non-decreasing order. An event stamped before the latest
//! time seen (a straggler from another thread of the live server) is counted in the
//! window that is open at the moment, never in a window already closed.
//!
//! The metrics themselves are defined once, in [`Stats`], [`Summary`] and [`Window`];
//! see the [parent module](super) for the list.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use serde::{Deserialize, Serialize};

use super::histogram::Histogram;
use super::llm_goodput::{LlmGoodput, LlmGoodputSummary};

/// Default length of a time-series window: one second.
pub const DEFAULT_WINDOW: u64 = 1_000_000_000;

/// How long (ns) the accounting remembers how a request ended, so that accelerator
/// time of a batch reported *after* its request ended (a piece still running when the
/// request was dropped) is still settled to that request: one minute.
pub const SETTLE_HORIZON: u64 = 60_000_000_000;

/// Most distinct drop (and, separately, failure) reasons counted by name; further
/// reasons are counted under [`OTHER_REASON`].
pub const MAX_REASONS: usize = 64;

/// The name under which reasons beyond [`MAX_REASONS`] are counted.
pub const OTHER_REASON: &str = "(other reasons)";

const NS_PER_S: f64 = 1e9;

/// `numerator / denominator`, or 0 when the denominator is 0.
fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator == 0.0 {
        0.0
    } else {
        numerator / denominator
    }
}

/// A count over a span of nanoseconds, per second (0 for an empty span).
fn per_second(count: f64, span_ns: u64) -> f64 {
    ratio(count * NS_PER_S, span_ns as f64)
}

/// How a request ended, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It went through every stage; on time or late depends on its deadline.
    Completed,
    /// It was dropped (by the policy, by expiry, by cancellation...).
    Dropped {
        /// Why, in a few words (counted per distinct text in the summary).
        reason: String,
    },
    /// It ended with an error.
    Failed {
        /// The error, in a few words (counted per distinct text in the summary).
        error: String,
    },
}

/// The end of one end-to-end request, as reported to [`Accounting::request_ended`].
#[derive(Debug, Clone, PartialEq)]
pub struct RequestEnd {
    /// The request's id (the one used in [`BatchRecord::requests`]).
    pub id: u64,
    /// Its stream.
    pub stream: u32,
    /// When the client sent it.
    pub sent_at: u64,
    /// When it ended (completion, drop or failure).
    pub ended_at: u64,
    /// Its absolute deadline: it is on time when `ended_at <= deadline`.
    pub deadline: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Tokens it delivered (0 for non-LLM requests).
    pub tokens: u32,
    /// Product of the accuracies of the variants that served each stage it passed.
    pub accuracy: f64,
    /// Total time it waited in queues, over every stage.
    pub queue_delay: u64,
}

impl RequestEnd {
    /// The one definition of how an ended request is classified.
    pub fn class(&self) -> Class {
        match self.outcome {
            Outcome::Completed if self.ended_at <= self.deadline => Class::OnTime,
            Outcome::Completed => Class::Late,
            Outcome::Dropped { .. } => Class::Dropped,
            Outcome::Failed { .. } => Class::Failed,
        }
    }

    /// End-to-end latency: `ended_at − sent_at` (0 if the clock went backwards).
    pub fn latency(&self) -> u64 {
        self.ended_at.saturating_sub(self.sent_at)
    }
}

/// The four ways a request can end, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Completed at or before its deadline.
    OnTime,
    /// Completed after its deadline.
    Late,
    /// Dropped.
    Dropped,
    /// Ended with an error.
    Failed,
}

impl Class {
    /// Whether the request completed (on time or late).
    pub fn is_completed(self) -> bool {
        matches!(self, Class::OnTime | Class::Late)
    }

    /// Whether accelerator time spent on the request was wasted (dropped or late);
    /// failed requests are not counted as invalid.
    pub fn is_invalid(self) -> bool {
        matches!(self, Class::Late | Class::Dropped)
    }
}

/// A batch that finished on a worker, as reported to [`Accounting::batch_finished`].
#[derive(Debug, Clone, Copy)]
pub struct BatchRecord<'a> {
    /// When it finished (it ran during `[at − duration, at]`).
    pub at: u64,
    /// The worker it ran on (informational: the accounting keeps totals only).
    pub worker: u32,
    /// How long it ran: its accelerator time.
    pub duration: u64,
    /// The end-to-end requests it served; each gets `duration / requests.len()`.
    pub requests: &'a [u64],
}

/// Counts of ended requests by [`Class`], with the rates defined on them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes {
    /// Completed within their deadline.
    pub on_time: u64,
    /// Completed after their deadline.
    pub late: u64,
    /// Dropped.
    pub dropped: u64,
    /// Ended with an error.
    pub failed: u64,
}

impl Outcomes {
    /// Count one ended request.
    pub fn add(&mut self, class: Class) {
        let slot = match class {
            Class::OnTime => &mut self.on_time,
            Class::Late => &mut self.late,
            Class::Dropped => &mut self.dropped,
            Class::Failed => &mut self.failed,
        };
        *slot += 1;
    }

    /// Every request that ended, failed ones included.
    pub fn ended(&self) -> u64 {
        self.on_time + self.late + self.dropped + self.failed
    }

    /// Requests that completed, on time or late.
    pub fn completed(&self) -> u64 {
        self.on_time + self.late
    }

    /// Drop rate: (dropped + late) / ended. Failed requests are in the denominator
    /// only; 0 when nothing ended.
    pub fn drop_rate(&self) -> f64 {
        ratio((self.dropped + self.late) as f64, self.ended() as f64)
    }

    /// SLO attainment: on time / ended (0 when nothing ended).
    pub fn slo_attainment(&self) -> f64 {
        ratio(self.on_time as f64, self.ended() as f64)
    }
}

/// Mean and percentiles of a distribution of nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Exact mean.
    pub mean: f64,
    /// Median (within the histogram's 1 % relative error, as are p90–p99).
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Exact maximum.
    pub max: u64,
}

impl Percentiles {
    /// The percentiles of `histogram` (all 0 when it is empty).
    pub fn of(histogram: &Histogram) -> Self {
        Self {
            mean: histogram.mean(),
            p50: histogram.quantile(0.5),
            p90: histogram.quantile(0.9),
            p95: histogram.quantile(0.95),
            p99: histogram.quantile(0.99),
            max: histogram.max(),
        }
    }
}

/// The metrics of a group of requests (the whole run, or one stream) over the
/// elapsed time of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests offered (arrivals).
    pub arrivals: u64,
    /// Requests that ended (completed, dropped or failed).
    pub ended: u64,
    /// Requests that completed, on time or late.
    pub completed: u64,
    /// Ended requests by class.
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// Goodput: requests completed within their deadline per second of elapsed time.
    pub goodput: f64,
    /// Throughput: requests completed (on time or not) per second.
    pub throughput: f64,
    /// Tokens of the requests completed within their deadline.
    pub tokens_on_time: u64,
    /// Tokens of every completed request.
    pub tokens_completed: u64,
    /// Token goodput: `tokens_on_time` per second (0 for non-LLM workloads).
    pub token_goodput: f64,
    /// (dropped + late) / ended; failed requests are in the denominator only.
    pub drop_rate: f64,
    /// on time / ended.
    pub slo_attainment: f64,
    /// Accelerator time of the group, seconds. For the whole run: every batch's
    /// duration (requests still in flight included). For a stream: the time settled
    /// to its ended requests.
    pub accelerator_s: f64,
    /// Accelerator time spent on requests that were dropped or completed late, s.
    pub invalid_s: f64,
    /// Invalid rate: `invalid_s / accelerator_s`.
    pub invalid_rate: f64,
    /// End-to-end latency (completion − sent) of completed requests, ns.
    pub latency: Percentiles,
    /// Total queueing delay (over every stage) of completed requests, ns.
    pub queue_delay: Percentiles,
    /// Pipeline accuracy: mean over completed requests of the product of the
    /// accuracies of the variants that served them (0 when none completed).
    pub accuracy: f64,
}

/// Everything about a run up to some instant: see [`Accounting::summary`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Start of the accounting (ns).
    pub start: u64,
    /// The instant summarised (ns).
    pub now: u64,
    /// `now − start`, seconds.
    pub elapsed_s: f64,
    /// Length of a time-series window, seconds.
    pub window_s: f64,
    /// Metrics over every request.
    pub overall: Stats,
    /// Metrics per stream.
    pub streams: BTreeMap<u32, Stats>,
    /// Optimal goodput bound over the run, req/s: the most requests any schedule could
    /// complete (arrivals before a window boundary plus what the capacity serves after
    /// it, at the least over the boundaries) over the elapsed time. No run's goodput
    /// exceeds it.
    pub optimal_goodput: f64,
    /// `overall.goodput / optimal_goodput` (0 when the bound is 0).
    pub goodput_of_optimal: f64,
    /// GPU-seconds: the integral of the number of active workers over time.
    pub gpu_seconds: f64,
    /// Utilisation: busy accelerator time / GPU-seconds, i.e. busy time over
    /// (workers × elapsed) with the number of workers varying in time (0 when no
    /// worker was ever active).
    pub utilisation: f64,
    /// Accelerator time of requests still in flight (not yet settled), seconds.
    pub unsettled_s: f64,
    /// Dropped requests per reason.
    pub drop_reasons: BTreeMap<String, u64>,
    /// Failed requests per error.
    pub failure_reasons: BTreeMap<String, u64>,
}

/// One window of the time series. Requests are counted in the window in which they
/// arrived (offered) or ended (everything else).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Start (ns).
    pub start: u64,
    /// Length (ns): the configured window, or less for a run's last, partial window.
    pub duration: u64,
    /// Requests that arrived.
    pub offered: u64,
    /// Requests that ended in the window, by class.
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// 99th percentile of the end-to-end latency of the requests that completed in
    /// the window, ns (0 when none did).
    pub p99_latency: u64,
    /// Mean number of active workers over the window.
    pub active_workers: f64,
    /// Mean accuracy of the requests that completed in the window (0 when none did).
    #[serde(default)]
    pub accuracy: f64,
    /// Mean capacity bound (req/s) given by the caller over the part of the window for
    /// which one was set; `None` before the first [`Accounting::set_capacity`].
    pub capacity: Option<f64>,
    /// Mean capacity of the workers serving during the window, req/s, as given to
    /// [`Accounting::set_serving_capacity`] (what a fixed plan provisioned; `None` when
    /// never given).
    #[serde(default)]
    pub serving_capacity: Option<f64>,
    /// The window's share of the bound, req/s: min(offered rate, capacity), or the
    /// offered rate when no capacity is known (for plots; the run's bound,
    /// [`Summary::optimal_goodput`], also counts what a backlog lets later windows serve).
    pub optimal: f64,
}

impl Window {
    /// Offered load, req/s.
    pub fn offered_rate(&self) -> f64 {
        per_second(self.offered as f64, self.duration)
    }

    /// Goodput, req/s: requests completed on time in the window per second.
    pub fn goodput(&self) -> f64 {
        per_second(self.outcomes.on_time as f64, self.duration)
    }

    /// Drop rate of the requests that ended in the window.
    pub fn drop_rate(&self) -> f64 {
        self.outcomes.drop_rate()
    }

    /// Duration in seconds.
    pub fn duration_s(&self) -> f64 {
        self.duration as f64 / NS_PER_S
    }
}

/// Optimal goodput bound of a window: min(offered rate, capacity).
fn optimal_bound(offered_rate: f64, capacity: Option<f64>) -> f64 {
    capacity.map_or(offered_rate, |c| offered_rate.min(c))
}

/// Running totals of one group of requests (the run, or one stream).
#[derive(Debug, Clone, Default)]
struct Tally {
    arrivals: u64,
    outcomes: Outcomes,
    tokens_on_time: u64,
    tokens_completed: u64,
    accuracy_sum: f64,
    /// Accelerator time settled to ended requests, ns.
    settled_ns: f64,
    /// The part of `settled_ns` spent on dropped or late requests.
    invalid_ns: f64,
    latency: Histogram,
    queue_delay: Histogram,
}

impl Tally {
    fn end(&mut self, class: Class, end: &RequestEnd, share: f64) {
        self.outcomes.add(class);
        self.settle(class, share);
        if class.is_completed() {
            let tokens = u64::from(end.tokens);
            self.tokens_completed += tokens;
            if class == Class::OnTime {
                self.tokens_on_time += tokens;
            }
            self.accuracy_sum += end.accuracy;
            self.latency.record(end.latency());
            self.queue_delay.record(end.queue_delay);
        }
    }

    fn settle(&mut self, class: Class, share: f64) {
        self.settled_ns += share;
        if class.is_invalid() {
            self.invalid_ns += share;
        }
    }

    /// The group's metrics over `elapsed` ns, with `accelerator_ns` as the
    /// denominator of the invalid rate.
    fn stats(&self, elapsed: u64, accelerator_ns: f64) -> Stats {
        let o = &self.outcomes;
        Stats {
            arrivals: self.arrivals,
            ended: o.ended(),
            completed: o.completed(),
            outcomes: *o,
            goodput: per_second(o.on_time as f64, elapsed),
            throughput: per_second(o.completed() as f64, elapsed),
            tokens_on_time: self.tokens_on_time,
            tokens_completed: self.tokens_completed,
            token_goodput: per_second(self.tokens_on_time as f64, elapsed),
            drop_rate: o.drop_rate(),
            slo_attainment: o.slo_attainment(),
            accelerator_s: accelerator_ns / NS_PER_S,
            invalid_s: self.invalid_ns / NS_PER_S,
            invalid_rate: ratio(self.invalid_ns, accelerator_ns),
            latency: Percentiles::of(&self.latency),
            queue_delay: Percentiles::of(&self.queue_delay),
            accuracy: ratio(self.accuracy_sum, o.completed() as f64),
        }
    }
}

/// Time integrals accrued over part of a window.
#[derive(Debug, Clone, Copy, Default)]
struct Integrals {
    /// ∫ active workers dt (worker·ns).
    worker_ns: f64,
    /// ∫ capacity dt over the time a capacity was known (req/s · ns).
    capacity_ns: f64,
    /// Time during which a capacity was known (ns).
    capacity_known_ns: u64,
    /// ∫ serving capacity dt over the time one was known (req/s · ns).
    serving_ns: f64,
    /// Time during which a serving capacity was known (ns).
    serving_known_ns: u64,
}

impl Integrals {
    fn accrue(&mut self, dt: u64, workers: u32, capacity: Option<f64>, serving: Option<f64>) {
        self.worker_ns += f64::from(workers) * dt as f64;
        if let Some(c) = capacity {
            self.capacity_ns += c * dt as f64;
            self.capacity_known_ns += dt;
        }
        if let Some(c) = serving {
            self.serving_ns += c * dt as f64;
            self.serving_known_ns += dt;
        }
    }
}

/// The window being filled.
#[derive(Debug, Clone)]
struct OpenWindow {
    start: u64,
    end: u64,
    offered: u64,
    outcomes: Outcomes,
    integrals: Integrals,
    latency: Histogram,
    accuracy_sum: f64,
}

impl OpenWindow {
    fn new(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            offered: 0,
            outcomes: Outcomes::default(),
            integrals: Integrals::default(),
            latency: Histogram::new(),
            accuracy_sum: 0.0,
        }
    }

    /// Start afresh over `[start, end)`, keeping the histogram's buckets.
    fn restart(&mut self, start: u64, end: u64) {
        let mut latency = std::mem::take(&mut self.latency);
        latency.clear();
        *self = Self { latency, ..Self::new(start, end) };
    }

    /// The window `[start, until)` with the given integrals.
    fn to_window(&self, integrals: &Integrals, until: u64) -> Window {
        let duration = until.saturating_sub(self.start);
        let capacity = (integrals.capacity_known_ns > 0).then(|| integrals.capacity_ns / integrals.capacity_known_ns as f64);
        let serving_capacity = (integrals.serving_known_ns > 0).then(|| integrals.serving_ns / integrals.serving_known_ns as f64);
        let offered_rate = per_second(self.offered as f64, duration);
        Window {
            start: self.start,
            duration,
            offered: self.offered,
            outcomes: self.outcomes,
            p99_latency: self.latency.quantile(0.99),
            active_workers: ratio(integrals.worker_ns, duration as f64),
            accuracy: ratio(self.accuracy_sum, self.outcomes.completed() as f64),
            capacity,
            serving_capacity,
            optimal: optimal_bound(offered_rate, capacity),
        }
    }
}

/// The time series: fixed windows aligned on `start`, and the time integrals.
#[derive(Debug, Clone)]
struct Series {
    start: u64,
    window: u64,
    /// Time up to which the integrals are accrued: the latest time seen.
    clock: u64,
    workers: u32,
    capacity: Option<f64>,
    serving: Option<f64>,
    /// ∫ active workers dt since `start` (worker·ns).
    gpu_ns: f64,
    closed: Vec<Window>,
    open: OpenWindow,
}

impl Series {
    fn new(start: u64, window: u64) -> Self {
        let window = window.max(1);
        Self {
            start,
            window,
            clock: start,
            workers: 0,
            capacity: None,
            serving: None,
            gpu_ns: 0.0,
            closed: Vec::new(),
            open: OpenWindow::new(start, start.saturating_add(window)),
        }
    }

    /// Move the clock to `t`, closing every window that ends at or before it.
    fn advance(&mut self, t: u64) {
        while t >= self.open.end {
            self.accrue(self.open.end);
            self.close();
        }
        self.accrue(t);
    }

    fn accrue(&mut self, to: u64) {
        if to <= self.clock {
            return;
        }
        let dt = to - self.clock;
        self.clock = to;
        self.gpu_ns += f64::from(self.workers) * dt as f64;
        self.open.integrals.accrue(dt, self.workers, self.capacity, self.serving);
    }

    /// Close the open window at the clock and open the next one, which ends on the
    /// next boundary `start + k·window`.
    fn close(&mut self) {
        let end = self.clock;
        let window = self.open.to_window(&self.open.integrals, end);
        self.closed.push(window);
        let k = (end - self.start) / self.window + 1;
        self.open.restart(end, self.start.saturating_add(k.saturating_mul(self.window)));
    }

    /// GPU·ns since start, up to `now` (≥ clock).
    fn gpu_ns_until(&self, now: u64) -> f64 {
        self.gpu_ns + f64::from(self.workers) * now.saturating_sub(self.clock) as f64
    }

    /// The most requests any schedule could complete by `now` (≥ clock): completions
    /// by then are at most the requests that arrived before some window boundary `s`
    /// plus what the capacity could serve from `s` to `now`, for every `s` (a queue
    /// served at the capacity; the unknown capacity of a window counts as unbounded).
    /// Unlike the sum of the windows' `min(offered, capacity)`, this counts the backlog
    /// a burst leaves for later windows, so no run's completions exceed it.
    fn optimal_until(&self, now: u64) -> f64 {
        let windows = self.windows_until(now);
        let mut capacity_after = vec![0.0f64; windows.len() + 1];
        for (k, w) in windows.iter().enumerate().rev() {
            capacity_after[k] = capacity_after[k + 1] + w.capacity.map_or(f64::INFINITY, |c| c * w.duration_s());
        }
        let mut arrived = 0.0;
        let mut bound = f64::INFINITY;
        for (k, after) in capacity_after.iter().enumerate() {
            bound = bound.min(arrived + after);
            if let Some(w) = windows.get(k) {
                arrived += w.offered as f64;
            }
        }
        bound
    }

    /// Every window from start up to `now`, the last one partial.
    fn windows_until(&self, now: u64) -> Vec<Window> {
        let mut series = self.clone();
        series.advance(now);
        if series.clock > series.open.start {
            series.close();
        }
        series.closed
    }
}

/// How a request ended, remembered for batches reported after its end.
#[derive(Debug, Clone, Copy)]
struct Settled {
    stream: u32,
    class: Class,
}

/// Requests that ended within the last one or two horizons, in two generations.
#[derive(Debug, Clone)]
struct RecentEnds {
    horizon: u64,
    rotate_at: u64,
    current: HashMap<u64, Settled>,
    previous: HashMap<u64, Settled>,
    /// The highest id ever inserted: a higher one (a request newer than every end,
    /// as most are at their first batch) is not here, without a look into the maps.
    highest: Option<u64>,
}

impl RecentEnds {
    fn new(start: u64) -> Self {
        Self {
            horizon: SETTLE_HORIZON,
            rotate_at: start.saturating_add(SETTLE_HORIZON),
            current: HashMap::default(),
            previous: HashMap::default(),
            highest: None,
        }
    }

    fn insert(&mut self, at: u64, id: u64, settled: Settled) {
        if at >= self.rotate_at {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
            self.rotate_at = at.saturating_add(self.horizon);
        }
        self.current.insert(id, settled);
        self.highest = self.highest.max(Some(id));
    }

    fn get(&self, id: u64) -> Option<Settled> {
        if self.highest.is_none_or(|highest| id > highest) {
            return None;
        }
        self.current.get(&id).or_else(|| self.previous.get(&id)).copied()
    }
}

/// Counts per reason text, at most [`MAX_REASONS`] distinct texts.
#[derive(Debug, Clone, Default)]
struct Reasons(Vec<(String, u64)>);

impl Reasons {
    fn add(&mut self, reason: String) {
        if let Some(slot) = self.0.iter_mut().find(|(r, _)| *r == reason) {
            slot.1 += 1;
        } else if self.0.len() + 1 < MAX_REASONS {
            self.0.push((reason, 1));
        } else {
            self.add_other();
        }
    }

    fn add_other(&mut self) {
        match self.0.iter_mut().find(|(r, _)| r == OTHER_REASON) {
            Some(slot) => slot.1 += 1,
            None => self.0.push((OTHER_REASON.to_owned(), 1)),
        }
    }

    fn to_map(&self) -> BTreeMap<String, u64> {
        self.0.iter().cloned().collect()
    }
}

/// The incremental accounting of one run; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Accounting {
    series: Series,
    overall: Tally,
    streams: BTreeMap<u32, Tally>,
    /// Accelerator time (ns) of requests that have not ended yet.
    in_flight: HashMap<u64, f64>,
    recent: RecentEnds,
    /// Every batch's duration, ns.
    accelerator_ns: f64,
    drop_reasons: Reasons,
    failure_reasons: Reasons,
    /// Goodput by LLM service class (inactive unless the engine activates it).
    llm: LlmGoodput,
    /// The work each stage did: its model's executions, whoever's requests they served.
    stage_work: BTreeMap<u32, StageWork>,
}

/// What one stage's workers ran: batches, their accelerator time, and the items they
/// served per stream (a model that is a step of an ensemble serves the ensemble's
/// stream as well as its own) — Triton's per-model execution statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageWork {
    /// Batches that finished (preempted ones are not counted).
    pub batches: u64,
    /// Their accelerator time, ns.
    pub busy_ns: u64,
    /// Items served, by the stream of the request each belonged to.
    pub items_by_stream: BTreeMap<u32, u64>,
}

impl StageWork {
    /// Items served for streams other than `stream`.
    pub fn items_for_others(&self, stream: u32) -> u64 {
        self.items_by_stream.iter().filter(|(s, _)| **s != stream).map(|(_, n)| n).sum()
    }
}

impl Default for Accounting {
    /// Windows of [`DEFAULT_WINDOW`], starting at time 0.
    fn default() -> Self {
        Self::new(DEFAULT_WINDOW)
    }
}

impl Accounting {
    /// An accounting starting at time 0 with windows of `window` ns (at least 1).
    pub fn new(window: u64) -> Self {
        Self::starting_at(0, window)
    }

    /// An accounting starting at `start` with windows of `window` ns (at least 1):
    /// window k covers `[start + k·window, start + (k+1)·window)`, and elapsed time is
    /// measured from `start`.
    pub fn starting_at(start: u64, window: u64) -> Self {
        Self {
            series: Series::new(start, window),
            overall: Tally::default(),
            streams: BTreeMap::new(),
            in_flight: HashMap::default(),
            recent: RecentEnds::new(start),
            accelerator_ns: 0.0,
            drop_reasons: Reasons::default(),
            failure_reasons: Reasons::default(),
            llm: LlmGoodput::default(),
            stage_work: BTreeMap::new(),
        }
    }

    /// A batch of `stage` finished after `duration` ns, serving one item per entry of
    /// `streams` (the stream of that item's request).
    pub fn stage_ran(&mut self, stage: u32, duration: u64, streams: impl IntoIterator<Item = u32>) {
        let work = self.stage_work.entry(stage).or_default();
        work.batches += 1;
        work.busy_ns += duration;
        for stream in streams {
            *work.items_by_stream.entry(stream).or_insert(0) += 1;
        }
    }

    /// The work of every stage that ran a batch so far.
    pub fn stage_work(&self) -> &BTreeMap<u32, StageWork> {
        &self.stage_work
    }

    /// Start of the accounting (ns).
    pub fn start(&self) -> u64 {
        self.series.start
    }

    /// Length of a window (ns).
    pub fn window(&self) -> u64 {
        self.series.window
    }

    /// A request of `stream` was offered at `at`.
    pub fn arrival(&mut self, at: u64, stream: u32) {
        self.series.advance(at);
        self.series.open.offered += 1;
        self.overall.arrivals += 1;
        self.stream_mut(stream).arrivals += 1;
    }

    /// A request ended. Its accelerator time so far is settled: it counts as invalid
    /// when the request was dropped or completed late.
    pub fn request_ended(&mut self, end: RequestEnd) {
        self.series.advance(end.ended_at);
        if self.llm.is_active() {
            self.llm.ended(&end);
        }
        let class = end.class();
        let share = self.in_flight.remove(&end.id).unwrap_or(0.0);
        self.recent.insert(end.ended_at, end.id, Settled { stream: end.stream, class });
        let open = &mut self.series.open;
        open.outcomes.add(class);
        if class.is_completed() {
            open.latency.record(end.latency());
            open.accuracy_sum += end.accuracy;
        }
        self.overall.end(class, &end, share);
        self.stream_mut(end.stream).end(class, &end, share);
        match end.outcome {
            Outcome::Completed => {}
            Outcome::Dropped { reason } => self.drop_reasons.add(reason),
            Outcome::Failed { error } => self.failure_reasons.add(error),
        }
    }

    /// A batch finished: its duration is accelerator time, attributed to its requests
    /// in equal shares. Shares of requests still in flight wait for their end; shares
    /// of requests that ended within [`SETTLE_HORIZON`] are settled at once.
    pub fn batch_finished(&mut self, batch: BatchRecord<'_>) {
        self.series.advance(batch.at);
        self.accelerator_ns += batch.duration as f64;
        if batch.requests.is_empty() {
            return;
        }
        let share = batch.duration as f64 / batch.requests.len() as f64;
        for &id in batch.requests {
            // A request with time in flight has not ended (an end takes its entry out),
            // so the small map of requests in flight answers most batches without a
            // look into the large one of recent ends.
            if let Some(in_flight) = self.in_flight.get_mut(&id) {
                *in_flight += share;
                continue;
            }
            match self.recent.get(id) {
                Some(Settled { stream, class }) => {
                    self.overall.settle(class, share);
                    self.stream_mut(stream).settle(class, share);
                }
                None => *self.in_flight.entry(id).or_insert(0.0) += share,
            }
        }
    }

    /// From `at` on, `active_workers` workers are active (0 before the first call).
    pub fn workers_changed(&mut self, at: u64, active_workers: u32) {
        self.series.advance(at);
        self.series.workers = active_workers;
    }

    /// From `at` on, the cluster can serve `req_per_sec` requests per second (the
    /// optimal bound's capacity). A negative value counts as 0; NaN as unknown.
    pub fn set_capacity(&mut self, at: u64, req_per_sec: f64) {
        self.series.advance(at);
        self.series.capacity = (!req_per_sec.is_nan()).then(|| req_per_sec.max(0.0));
    }

    /// From `at` on, the workers serving now can do `req_per_sec` requests per second
    /// (reported per window; the bound uses [`Accounting::set_capacity`]). A negative
    /// value counts as 0; NaN as unknown.
    pub fn set_serving_capacity(&mut self, at: u64, req_per_sec: f64) {
        self.series.advance(at);
        self.series.serving = (!req_per_sec.is_nan()).then(|| req_per_sec.max(0.0));
    }

    /// Every metric from start up to `now` (taken as the latest time seen if earlier).
    pub fn summary(&self, now: u64) -> Summary {
        let now = now.max(self.series.clock);
        let elapsed = now - self.series.start;
        let overall = self.overall.stats(elapsed, self.accelerator_ns);
        let optimal_goodput = ratio(self.series.optimal_until(now) * NS_PER_S, elapsed as f64);
        let gpu_ns = self.series.gpu_ns_until(now);
        Summary {
            start: self.series.start,
            now,
            elapsed_s: elapsed as f64 / NS_PER_S,
            window_s: self.series.window as f64 / NS_PER_S,
            goodput_of_optimal: ratio(overall.goodput, optimal_goodput),
            optimal_goodput,
            gpu_seconds: gpu_ns / NS_PER_S,
            utilisation: ratio(self.accelerator_ns, gpu_ns),
            unsettled_s: self.in_flight.values().fold(0.0, |sum, ns| sum + ns) / NS_PER_S,
            streams: self.streams.iter().map(|(&id, t)| (id, t.stats(elapsed, t.settled_ns))).collect(),
            overall,
            drop_reasons: self.drop_reasons.to_map(),
            failure_reasons: self.failure_reasons.to_map(),
        }
    }

    /// The closed windows: those that ended at or before the latest time seen.
    pub fn windows(&self) -> &[Window] {
        &self.series.closed
    }

    /// Every window from start up to `now` (taken as the latest time seen if
    /// earlier), the last one partial unless `now` is on a window boundary. For
    /// reports at the end of a run.
    pub fn windows_until(&self, now: u64) -> Vec<Window> {
        self.series.windows_until(now)
    }

    /// The LLM goodput accounting, to read (see [`LlmGoodput`]).
    pub fn llm(&self) -> &LlmGoodput {
        &self.llm
    }

    /// The LLM goodput accounting (the engine feeds it; see [`LlmGoodput`]).
    pub fn llm_mut(&mut self) -> &mut LlmGoodput {
        &mut self.llm
    }

    /// LLM goodput by service class as of `now`.
    pub fn llm_goodput(&self, now: u64) -> LlmGoodputSummary {
        let now = now.max(self.series.clock);
        self.llm.summary((now - self.series.start) as f64 / NS_PER_S)
    }

    /// End-to-end latency of every completed request (ns).
    pub fn latency(&self) -> &Histogram {
        &self.overall.latency
    }

    /// The latency and queueing delay (ns) of the completed requests of `stream`;
    /// `None` before its first request.
    pub fn stream_distributions(&self, stream: u32) -> Option<(&Histogram, &Histogram)> {
        self.streams.get(&stream).map(|t| (&t.latency, &t.queue_delay))
    }

    /// Requests holding accelerator time that is not yet settled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn stream_mut(&mut self, stream: u32) -> &mut Tally {
        self.streams.entry(stream).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    macro_rules! assert_close {
        ($a:expr, $b:expr) => {
            assert!(close($a, $b), "{} = {} but expected {}", stringify!($a), $a, $b)
        };
    }

    /// Within the histogram's relative error.
    fn assert_about(got: u64, want: u64) {
        let err = (got as f64 - want as f64).abs() / want as f64;
        assert!(err <= super::super::histogram::RELATIVE_ERROR, "{got} vs {want}");
    }

    fn completed(id: u64, stream: u32, sent: u64, ended: u64, deadline: u64) -> RequestEnd {
        RequestEnd {
            id,
            stream,
            sent_at: sent,
            ended_at: ended,
            deadline,
            outcome: Outcome::Completed,
            tokens: 0,
            accuracy: 1.0,
            queue_delay: 0,
        }
    }

    fn dropped(id: u64, stream: u32, at: u64, reason: &str) -> RequestEnd {
        RequestEnd { outcome: Outcome::Dropped { reason: reason.into() }, ..completed(id, stream, 0, at, u64::MAX) }
    }

    /// The hand-computed case: five requests, two batches, two one-second windows.
    ///
    /// | id | stream | sent  | ended | deadline | outcome        | tokens | acc | queue |
    /// |----|--------|-------|-------|----------|----------------|--------|-----|-------|
    /// | 1  | 0      | 0.10  | 0.50  | 0.60     | completed (on) | 10     | 0.9 | 0.10  |
    /// | 2  | 0      | 0.15  | 0.50  | 0.40     | completed late | 20     | 0.8 | 0.05  |
    /// | 3  | 1      | 0.20  | 0.90  | 1.00     | dropped        | –      | –   | –     |
    /// | 4  | 1      | 1.20  | 1.70  | 2.00     | completed (on) | 30     | 0.7 | 0.20  |
    /// | 5  | 1      | 1.30  | 1.80  | 2.00     | failed         | –      | –   | –     |
    ///
    /// Batch A ends at 0.5 s, runs 0.3 s for [1, 2, 3] (0.1 s each); batch B ends at
    /// 1.7 s, runs 0.2 s for [4]. Two workers active on [0, 1), one on [1, 2);
    /// capacity 3 req/s on [0, 1), 1.5 req/s on [1, 2). Summary at 2 s.
    fn hand_computed_run() -> Accounting {
        let mut a = Accounting::new(S);
        a.workers_changed(0, 2);
        a.set_capacity(0, 3.0);
        a.arrival(100 * MS, 0);
        a.arrival(150 * MS, 0);
        a.arrival(200 * MS, 1);
        a.batch_finished(BatchRecord { at: 500 * MS, worker: 0, duration: 300 * MS, requests: &[1, 2, 3] });
        a.request_ended(RequestEnd { tokens: 10, accuracy: 0.9, queue_delay: 100 * MS, ..completed(1, 0, 100 * MS, 500 * MS, 600 * MS) });
        a.request_ended(RequestEnd { tokens: 20, accuracy: 0.8, queue_delay: 50 * MS, ..completed(2, 0, 150 * MS, 500 * MS, 400 * MS) });
        a.request_ended(RequestEnd { sent_at: 200 * MS, deadline: S, ..dropped(3, 1, 900 * MS, "queue full") });
        a.workers_changed(S, 1);
        a.set_capacity(S, 1.5);
        a.arrival(1200 * MS, 1);
        a.arrival(1300 * MS, 1);
        a.batch_finished(BatchRecord { at: 1700 * MS, worker: 1, duration: 200 * MS, requests: &[4] });
        a.request_ended(RequestEnd { tokens: 30, accuracy: 0.7, queue_delay: 200 * MS, ..completed(4, 1, 1200 * MS, 1700 * MS, 2 * S) });
        a.request_ended(RequestEnd {
            outcome: Outcome::Failed { error: "worker lost".into() },
            ..completed(5, 1, 1300 * MS, 1800 * MS, 2 * S)
        });
        a
    }

    #[test]
    fn hand_computed_summary() {
        let a = hand_computed_run();
        let s = a.summary(2 * S);
        let o = &s.overall;
        assert_eq!((s.start, s.now), (0, 2 * S));
        assert_close!(s.elapsed_s, 2.0);
        assert_eq!((o.arrivals, o.ended, o.completed), (5, 5, 3));
        assert_eq!(o.outcomes, Outcomes { on_time: 2, late: 1, dropped: 1, failed: 1 });
        // Goodput: 2 on time over 2 s; throughput 3 completed over 2 s.
        assert_close!(o.goodput, 1.0);
        assert_close!(o.throughput, 1.5);
        // Tokens on time: 10 + 30 over 2 s; the late request's 20 do not count.
        assert_eq!((o.tokens_on_time, o.tokens_completed), (40, 60));
        assert_close!(o.token_goodput, 20.0);
        // Drop rate (1 dropped + 1 late) / 5 ended, the failed one in the denominator.
        assert_close!(o.drop_rate, 0.4);
        assert_close!(o.slo_attainment, 0.4);
        // Invalid: shares of 2 (late) and 3 (dropped), 0.1 s each, over 0.5 s.
        assert_close!(o.accelerator_s, 0.5);
        assert_close!(o.invalid_s, 0.2);
        assert_close!(o.invalid_rate, 0.4);
        // Accuracy: (0.9 + 0.8 + 0.7) / 3.
        assert_close!(o.accuracy, 0.8);
        // Latencies 400, 350, 500 ms: p50 = 400 (rank 2), p90..max = 500.
        assert_close!(o.latency.mean, 1250.0 * MS as f64 / 3.0);
        assert_about(o.latency.p50, 400 * MS);
        assert_about(o.latency.p90, 500 * MS);
        assert_about(o.latency.p99, 500 * MS);
        assert_eq!(o.latency.max, 500 * MS);
        // Queue delays 100, 50, 200 ms.
        assert_close!(o.queue_delay.mean, 350.0 * MS as f64 / 3.0);
        assert_about(o.queue_delay.p99, 200 * MS);
        // GPU-seconds: 2 workers × 1 s + 1 worker × 1 s; busy 0.5 s.
        assert_close!(s.gpu_seconds, 3.0);
        assert_close!(s.utilisation, 0.5 / 3.0);
        // Bound: window 0 min(3 offered/s, 3) = 3, window 1 min(2, 1.5) = 1.5.
        assert_close!(s.optimal_goodput, 2.25);
        assert_close!(s.goodput_of_optimal, 1.0 / 2.25);
        assert_close!(s.unsettled_s, 0.0);
        assert_eq!(s.drop_reasons, BTreeMap::from([("queue full".to_owned(), 1)]));
        assert_eq!(s.failure_reasons, BTreeMap::from([("worker lost".to_owned(), 1)]));
        assert_eq!(a.in_flight(), 0, "every share was settled");
    }

    #[test]
    fn hand_computed_streams() {
        let s = hand_computed_run().summary(2 * S);
        assert_eq!(s.streams.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        let (s0, s1) = (&s.streams[&0], &s.streams[&1]);
        assert_eq!((s0.arrivals, s0.ended), (2, 2));
        assert_eq!(s0.outcomes, Outcomes { on_time: 1, late: 1, dropped: 0, failed: 0 });
        assert_close!(s0.goodput, 0.5);
        assert_close!(s0.drop_rate, 0.5);
        assert_close!(s0.accelerator_s, 0.2);
        assert_close!(s0.invalid_rate, 0.5);
        assert_close!(s0.accuracy, 0.85);
        assert_close!(s0.token_goodput, 5.0);
        assert_eq!((s1.arrivals, s1.ended), (3, 3));
        assert_eq!(s1.outcomes, Outcomes { on_time: 1, late: 0, dropped: 1, failed: 1 });
        assert_close!(s1.drop_rate, 1.0 / 3.0);
        assert_close!(s1.slo_attainment, 1.0 / 3.0);
        assert_close!(s1.accelerator_s, 0.3);
        assert_close!(s1.invalid_rate, 1.0 / 3.0);
        assert_close!(s1.accuracy, 0.7);
        assert_eq!(s1.latency.max, 500 * MS);
    }

    #[test]
    fn hand_computed_windows() {
        let a = hand_computed_run();
        // The last event was at 1.8 s: only window 0 is closed.
        assert_eq!(a.windows().len(), 1);
        let w = a.windows_until(2 * S);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0], a.windows()[0]);
        assert_eq!((w[0].start, w[0].duration, w[0].offered), (0, S, 3));
        assert_eq!(w[0].outcomes, Outcomes { on_time: 1, late: 1, dropped: 1, failed: 0 });
        assert_about(w[0].p99_latency, 400 * MS);
        assert_close!(w[0].active_workers, 2.0);
        assert_eq!(w[0].capacity, Some(3.0));
        assert_close!(w[0].offered_rate(), 3.0);
        assert_close!(w[0].optimal, 3.0);
        assert_close!(w[0].goodput(), 1.0);
        assert_close!(w[0].drop_rate(), 2.0 / 3.0);
        assert_eq!((w[1].start, w[1].duration, w[1].offered), (S, S, 2));
        assert_eq!(w[1].outcomes, Outcomes { on_time: 1, late: 0, dropped: 0, failed: 1 });
        assert_eq!(w[1].p99_latency, 500 * MS);
        assert_close!(w[1].active_workers, 1.0);
        assert_eq!(w[1].capacity, Some(1.5));
        assert_close!(w[1].optimal, 1.5);
        assert_close!(w[1].drop_rate(), 0.0);
    }

    #[test]
    fn a_request_twice_in_a_batch_gets_two_shares() {
        let mut a = Accounting::new(S);
        a.batch_finished(BatchRecord { at: 300 * MS, worker: 0, duration: 300 * MS, requests: &[1, 1, 2] });
        a.request_ended(completed(1, 0, 0, 400 * MS, 100 * MS));
        let s = a.summary(S);
        assert_close!(s.overall.invalid_s, 0.2);
        assert_close!(s.unsettled_s, 0.1);
    }

    #[test]
    fn partial_last_window_and_empty_gaps() {
        let mut a = Accounting::new(S);
        a.workers_changed(0, 4);
        a.arrival(100 * MS, 0);
        a.arrival(3500 * MS, 0);
        let w = a.windows_until(3750 * MS);
        assert_eq!(
            w.iter().map(|w| (w.start, w.duration, w.offered)).collect::<Vec<_>>(),
            vec![(0, S, 1), (S, S, 0), (2 * S, S, 0), (3 * S, 750 * MS, 1)]
        );
        // No capacity known: the bound is the offered rate.
        assert_eq!(w[3].capacity, None);
        assert_close!(w[3].optimal, 1.0 / 0.75);
        assert!(w.iter().all(|w| close(w.active_workers, 4.0)));
        // The bound over the run is 2 arrivals over 3.75 s.
        assert_close!(a.summary(3750 * MS).optimal_goodput, 2.0 / 3.75);
        // Exactly on a boundary there is no empty partial window.
        assert_eq!(a.windows_until(4 * S).len(), 4);
    }

    #[test]
    fn capacity_changing_mid_window_is_time_weighted() {
        let mut a = Accounting::new(S);
        for i in 0..10 {
            match i {
                5 => a.set_capacity(500 * MS, 4.0),
                8 => a.set_capacity(750 * MS, 8.0),
                _ => {}
            }
            a.arrival(i * 100 * MS, 0);
        }
        let w = &a.windows_until(S)[0];
        // Known for 0.5 s: 4 × 0.25 + 8 × 0.25 over 0.5 s = 6 req/s < 10 offered.
        assert_eq!(w.capacity, Some(6.0));
        assert_close!(w.optimal, 6.0);
        assert_close!(a.summary(S).optimal_goodput, 6.0);
    }

    #[test]
    fn the_serving_capacity_is_reported_beside_the_bound_and_does_not_change_it() {
        let mut a = Accounting::new(S);
        a.set_capacity(0, 10.0);
        a.set_serving_capacity(0, 2.0);
        a.set_serving_capacity(500 * MS, 4.0);
        for t in 0..5 {
            a.arrival(t * 100 * MS, 0);
        }
        let w = &a.windows_until(S)[0];
        assert_eq!((w.capacity, w.serving_capacity), (Some(10.0), Some(3.0)));
        assert_close!(a.summary(S).optimal_goodput, 5.0);
    }

    #[test]
    fn the_run_bound_counts_what_a_backlog_lets_later_windows_serve() {
        // Two-second windows: 4 arrivals then 2; capacity 1.5 req/s, 3 per window.
        let mut a = Accounting::new(2 * S);
        a.set_capacity(0, 1.5);
        for t in [0, 500, 1000, 1500, 2000, 3000] {
            a.arrival(t * MS, 0);
        }
        let w = a.windows_until(4 * S);
        assert_eq!((w[0].optimal, w[1].optimal), (1.5, 1.0), "per window: min(offered, capacity)");
        // The first window can serve 3 of its 4; the fourth waits and is served in the
        // second window with its 2: 6 in 4 s, where the windows' sum says 5.
        assert_close!(a.summary(4 * S).optimal_goodput, 1.5);
        a.arrival(4 * S, 0);
        assert_close!(a.summary(4 * S).optimal_goodput, 1.5);
        // A lone burst: 6 arrivals at once, then nothing for 8 s; 3 per window.
        let mut burst = Accounting::new(2 * S);
        burst.set_capacity(0, 1.5);
        for _ in 0..6 {
            burst.arrival(0, 0);
        }
        // Served over two windows; by the end of the first, only 3 fit.
        assert_close!(burst.summary(10 * S).optimal_goodput, 6.0 / 10.0);
        assert_close!(burst.summary(2 * S).optimal_goodput, 3.0 / 2.0);
    }

    #[test]
    fn batch_reported_after_its_request_ended_is_settled_to_it() {
        let mut a = Accounting::new(S);
        a.batch_finished(BatchRecord { at: 10 * MS, worker: 0, duration: 10 * MS, requests: &[7] });
        a.request_ended(dropped(7, 2, 20 * MS, "cancelled"));
        a.batch_finished(BatchRecord { at: 30 * MS, worker: 0, duration: 30 * MS, requests: &[7] });
        assert_eq!(a.in_flight(), 0, "no share is left waiting for an end that came before");
        let s = a.summary(S);
        assert_close!(s.overall.accelerator_s, 0.04);
        assert_close!(s.overall.invalid_rate, 1.0);
        assert_close!(s.streams[&2].invalid_s, 0.04);
    }

    #[test]
    fn in_flight_time_counts_in_the_denominator_only() {
        let mut a = Accounting::new(S);
        a.batch_finished(BatchRecord { at: 100 * MS, worker: 0, duration: 100 * MS, requests: &[1, 2] });
        a.request_ended(dropped(1, 0, 200 * MS, "x"));
        let s = a.summary(S);
        assert_eq!(a.in_flight(), 1);
        assert_close!(s.unsettled_s, 0.05);
        assert_close!(s.overall.invalid_rate, 0.5);
        assert_close!(s.streams[&0].invalid_rate, 1.0);
        // A batch with no requests is still busy time.
        a.batch_finished(BatchRecord { at: 300 * MS, worker: 0, duration: 100 * MS, requests: &[] });
        assert_close!(a.summary(S).overall.accelerator_s, 0.2);
    }

    #[test]
    fn on_time_boundary_is_inclusive() {
        assert_eq!(completed(1, 0, 0, 5, 5).class(), Class::OnTime);
        assert_eq!(completed(1, 0, 0, 6, 5).class(), Class::Late);
        assert!(Class::Late.is_invalid() && Class::Dropped.is_invalid());
        assert!(!Class::Failed.is_invalid() && !Class::OnTime.is_invalid());
        assert_eq!(completed(1, 0, 9, 5, 5).latency(), 0);
    }

    #[test]
    fn stragglers_count_in_the_open_window() {
        let mut a = Accounting::new(S);
        a.arrival(1500 * MS, 0);
        a.arrival(500 * MS, 0); // reported late, after window 0 closed
        let w = a.windows_until(2 * S);
        assert_eq!((w[0].offered, w[1].offered), (0, 2));
    }

    #[test]
    fn start_offset_aligns_windows_and_elapsed_time() {
        let mut a = Accounting::starting_at(10 * S, S);
        a.workers_changed(10 * S, 1);
        a.request_ended(completed(1, 0, 10 * S, 10 * S + 250 * MS, 11 * S));
        let s = a.summary(12 * S);
        assert_close!(s.elapsed_s, 2.0);
        assert_close!(s.overall.goodput, 0.5);
        assert_close!(s.gpu_seconds, 2.0);
        assert_eq!(a.windows_until(12 * S).iter().map(|w| w.start).collect::<Vec<_>>(), vec![10 * S, 11 * S]);
        // `now` earlier than the latest time seen is taken as that time.
        assert_eq!(a.summary(0).now, 10 * S + 250 * MS);
    }

    #[test]
    fn empty_accounting_reports_zeros_not_nans() {
        let a = Accounting::default();
        assert_eq!(a.window(), DEFAULT_WINDOW);
        let s = a.summary(0);
        let json = serde_json::to_string(&s).expect("serialises");
        assert!(!json.contains("NaN") && !json.contains("null"), "{json}");
        assert_eq!(s.overall.drop_rate, 0.0);
        assert_eq!(s.utilisation, 0.0);
        assert!(a.windows_until(0).is_empty());
    }

    #[test]
    fn distinct_reasons_are_capped() {
        let mut a = Accounting::new(S);
        for i in 0..(MAX_REASONS as u64 + 10) {
            a.request_ended(dropped(i, 0, 1, &format!("reason {i}")));
        }
        a.request_ended(dropped(999, 0, 1, "reason 0"));
        let reasons = a.summary(1).drop_reasons;
        assert_eq!(reasons.len(), MAX_REASONS);
        assert_eq!(reasons["reason 0"], 2);
        assert_eq!(reasons[OTHER_REASON], 11);
        assert_eq!(reasons.values().sum::<u64>(), MAX_REASONS as u64 + 11);
    }

    #[test]
    fn negative_and_nan_capacities() {
        let mut a = Accounting::new(S);
        a.arrival(0, 0);
        a.set_capacity(0, -5.0);
        assert_eq!(a.windows_until(S)[0].capacity, Some(0.0));
        a.set_capacity(S, f64::NAN);
        a.arrival(S, 0);
        assert_eq!(a.windows_until(2 * S)[1].capacity, None);
    }

    #[test]
    fn summary_round_trips_through_json() {
        let s = hand_computed_run().summary(2 * S);
        let json = serde_json::to_string(&s).expect("serialises");
        let back: Summary = serde_json::from_str(&json).expect("parses");
        // serde_json parses floats to within one ulp; compare the rest exactly.
        assert_eq!((back.overall.outcomes, back.overall.latency.p50), (s.overall.outcomes, s.overall.latency.p50));
        assert_eq!((&back.drop_reasons, &back.failure_reasons), (&s.drop_reasons, &s.failure_reasons));
        assert_eq!(back.streams.keys().collect::<Vec<_>>(), s.streams.keys().collect::<Vec<_>>());
        assert_close!(back.overall.queue_delay.mean, s.overall.queue_delay.mean);
        assert_close!(back.optimal_goodput, s.optimal_goodput);
    }

    #[test]
    fn recent_ends_are_forgotten_after_two_horizons() {
        let mut recent = RecentEnds::new(0);
        let settled = Settled { stream: 0, class: Class::OnTime };
        recent.insert(0, 1, settled);
        recent.insert(SETTLE_HORIZON, 2, settled);
        assert!(recent.get(1).is_some() && recent.get(2).is_some());
        recent.insert(2 * SETTLE_HORIZON, 3, settled);
        assert!(recent.get(1).is_none() && recent.get(2).is_some());
        // Ids above every end, and ids below it that did not end, are not there.
        assert!(recent.get(4).is_none() && RecentEnds::new(0).get(1).is_none());
        recent.insert(2 * SETTLE_HORIZON, 9, settled);
        assert!(recent.get(9).is_some() && recent.get(5).is_none() && recent.get(10).is_none());
    }

    #[test]
    fn stage_work_counts_batches_time_and_items_per_stream() {
        let mut a = Accounting::new(1000 * MS);
        a.stage_ran(2, 10 * MS, [0, 0, 5]);
        a.stage_ran(2, 4 * MS, [5]);
        a.stage_ran(3, MS, []);
        let work = &a.stage_work()[&2];
        assert_eq!((work.batches, work.busy_ns), (2, 14 * MS));
        assert_eq!(work.items_by_stream, BTreeMap::from([(0, 2), (5, 2)]));
        assert_eq!((work.items_for_others(0), work.items_for_others(5), work.items_for_others(9)), (2, 2, 4));
        assert_eq!(a.stage_work()[&3].batches, 1);
    }
}
