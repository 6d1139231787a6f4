//! Goodput of LLM serving by service class (CALM spec §2), beside the generic
//! metrics: a request's class comes from its stream's name
//! ([`ServiceClass::from_stream_name`]: `ls…`, `ds…`, `cp…`, `be…`, else DS).
//!
//! | class | token goodput G of a request | meets its SLO iff |
//! |---|---|---|
//! | LS (streamed) | output tokens j emitted by τ_j = sent + TTFT + j·TBT (TTFT = the stream's SLO) | every token on time |
//! | DS, BE | L_in + L_out if it completed by its deadline, else 0 | completed by its deadline |
//! | CP | L_in + L_out over the job's calls if its last call completed by the job deadline | that |
//!
//! Dropped requests earn 0, except LS tokens already delivered on time. The emit
//! time of a frame's k-th token (of n steps, duration D, started at s) is
//! s + (k+1)·D/n.
//!
//! A compound (CP) job is either one end-to-end request whose calls are its pieces
//! (then the DS rule applies to it), or, when its calls are submitted one by one
//! with the tags of [`CallLink`], the set of calls sharing a job id: it counts once,
//! when every call of its final stage (tagged `last`) has completed, and earns the
//! prompt and output tokens of all its calls iff every call completed by the job's
//! deadline. A job with a call that did not complete (dropped, failed, late) earns 0
//! and counts once, when its last live call ends. A job still open when the run ends
//! counts as a request that did not meet its SLO.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use serde::{Deserialize, Serialize};
use yardmaster_sdk::helpers::compound::CallLink;
use yardmaster_sdk::helpers::ServiceClass;

use super::account::{Outcome, RequestEnd};

/// One request being tracked.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    class: ServiceClass,
    sent_at: u64,
    deadline: u64,
    input: u32,
    on_time_tokens: u64,
    late_tokens: u64,
    /// The compound job (stream, job id) of a tagged call, and whether the call is
    /// of the job's final stage.
    job: Option<((u32, u64), bool)>,
}

/// A compound job whose calls arrive one stage at a time.
#[derive(Debug, Clone, Copy, Default)]
struct Job {
    /// Calls submitted and not yet ended.
    live: u32,
    /// Calls of the final stage that completed.
    last_done: u32,
    /// Some call did not complete by the deadline.
    failed: bool,
    /// Σ (L_in + L_out) over its calls that completed in time.
    tokens: u64,
}

/// Goodput of one class over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassGoodput {
    /// Requests of the class that ended.
    pub requests: u64,
    /// Of those, the ones that met their SLO.
    pub met: u64,
    /// Σ G over them (tokens).
    pub tokens: u64,
}

/// LLM goodput over a run, per class and overall.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmGoodputSummary {
    /// Elapsed seconds the rates are over.
    pub elapsed_s: f64,
    /// Per class (`ls`, `ds`, `cp`, `be`).
    pub classes: BTreeMap<String, ClassGoodput>,
    /// Token goodput: Σ G / elapsed (tokens/s).
    pub token_goodput: f64,
    /// Request goodput: requests that met their SLO per second.
    pub request_goodput: f64,
    /// Goodput tokens by when they were earned (the end of the request, or of the
    /// compound job), in windows of [`TIMELINE_WINDOW_NS`] from time 0: whether a
    /// policy keeps its goodput up as an overload goes on.
    #[serde(default)]
    pub timeline: Vec<u64>,
}

/// Width of a window of [`LlmGoodputSummary::timeline`] (10 s).
pub const TIMELINE_WINDOW_NS: u64 = 10_000_000_000;

impl LlmGoodputSummary {
    /// The same totals as rates over `elapsed_s` seconds instead (to compare runs over
    /// a common window, e.g. the arrival window, whatever their drain times).
    pub fn over(&self, elapsed_s: f64) -> Self {
        let per_s = |x: u64| if elapsed_s > 0.0 { x as f64 / elapsed_s } else { 0.0 };
        Self {
            elapsed_s,
            classes: self.classes.clone(),
            token_goodput: per_s(self.classes.values().map(|g| g.tokens).sum()),
            request_goodput: per_s(self.classes.values().map(|g| g.met).sum()),
            timeline: self.timeline.clone(),
        }
    }
}

/// Incremental LLM goodput accounting; inactive until streams are given.
#[derive(Debug, Clone, Default)]
pub struct LlmGoodput {
    /// Class of each stream; empty: inactive.
    classes: Vec<ServiceClass>,
    tbt_ns: u64,
    live: HashMap<u64, Tracked>,
    jobs: BTreeMap<(u32, u64), Job>,
    totals: BTreeMap<ServiceClass, ClassGoodput>,
    timeline: Vec<u64>,
    /// Jobs already counted: a call of one submitted later (a driver that goes on
    /// after a late call) is not a new job.
    closed: HashSet<(u32, u64)>,
}

/// The short name of a class in reports.
pub fn class_name(class: ServiceClass) -> &'static str {
    match class {
        ServiceClass::Latency => "ls",
        ServiceClass::Deadline => "ds",
        ServiceClass::Compound => "cp",
        ServiceClass::BestEffort => "be",
    }
}

impl LlmGoodput {
    /// Start tracking requests of streams named `stream_names` (by stream id), with
    /// LS tokens due every `tbt_ns`.
    pub fn activate(&mut self, stream_names: &[&str], tbt_ns: u64) {
        self.classes = stream_names.iter().map(|n| ServiceClass::from_stream_name(n)).collect();
        self.tbt_ns = tbt_ns;
    }

    /// Whether requests are tracked.
    pub fn is_active(&self) -> bool {
        !self.classes.is_empty()
    }

    /// A request was submitted; `link` ties a compound call to its job.
    pub fn submitted(&mut self, id: u64, stream: u32, sent_at: u64, deadline: u64, input: u32, link: Option<CallLink>) {
        let Some(&class) = self.classes.get(stream as usize) else { return };
        let job = link.filter(|_| class == ServiceClass::Compound).map(|l| ((stream, l.job), l.last));
        if let Some((key, _)) = job.filter(|(key, _)| !self.closed.contains(key)) {
            self.jobs.entry(key).or_default().live += 1;
        }
        self.live.insert(id, Tracked { class, sent_at, deadline, input, on_time_tokens: 0, late_tokens: 0, job });
    }

    /// When the next token of request `id`, which has emitted `emitted` tokens, is due
    /// on its token timeline — `None` unless it is a tracked latency-sensitive request.
    /// The engine expires such a request a grace after this, not after its first
    /// token's deadline, so that a long stream on its timeline is not cut off.
    pub fn next_token_due(&self, id: u64, emitted: u32) -> Option<u64> {
        let t = self.live.get(&id)?;
        (t.class == ServiceClass::Latency).then(|| t.deadline.saturating_add(emitted as u64 * self.tbt_ns))
    }

    /// A frame (of `steps` decode steps, `duration` ns, started at `started`) emitted
    /// `count` tokens of request `id`, which had emitted `before` tokens.
    pub fn tokens_emitted(&mut self, id: u64, started: u64, duration: u64, steps: u32, before: u32, count: u32) {
        let tbt = self.tbt_ns;
        let Some(t) = self.live.get_mut(&id) else { return };
        if t.class != ServiceClass::Latency {
            return;
        }
        let steps = steps.max(count).max(1) as u64;
        let ttft = t.deadline.saturating_sub(t.sent_at);
        for k in 0..count as u64 {
            let emitted = started + (k + 1) * duration / steps;
            let due = t.sent_at + ttft + (before as u64 + k) * tbt;
            if emitted <= due {
                t.on_time_tokens += 1;
            } else {
                t.late_tokens += 1;
            }
        }
    }

    /// A request ended (`tokens` = its output tokens).
    pub fn ended(&mut self, end: &RequestEnd) {
        let Some(t) = self.live.remove(&end.id) else { return };
        let completed = matches!(end.outcome, Outcome::Completed);
        if let Some((key, last)) = t.job {
            self.call_ended(key, last, completed && end.ended_at <= t.deadline, t.input as u64 + end.tokens as u64, end.ended_at);
            return;
        }
        let (goodput, met) = match t.class {
            ServiceClass::Latency => (t.on_time_tokens, completed && t.late_tokens == 0 && t.on_time_tokens > 0),
            _ => {
                let met = completed && end.ended_at <= t.deadline;
                (if met { t.input as u64 + end.tokens as u64 } else { 0 }, met)
            }
        };
        self.count(t.class, met, goodput, end.ended_at);
    }

    /// A call of a compound job ended, in time or not, with `tokens` (in + out).
    fn call_ended(&mut self, key: (u32, u64), last: bool, in_time: bool, tokens: u64, at: u64) {
        let Some(job) = self.jobs.get_mut(&key) else { return };
        job.live = job.live.saturating_sub(1);
        if in_time {
            job.tokens += tokens;
            job.last_done += last as u32;
        } else {
            job.failed = true;
        }
        if job.live == 0 && (job.failed || job.last_done > 0) {
            let job = self.jobs.remove(&key).expect("present");
            self.closed.insert(key);
            let met = !job.failed;
            self.count(ServiceClass::Compound, met, if met { job.tokens } else { 0 }, at);
        }
    }

    fn count(&mut self, class: ServiceClass, met: bool, goodput: u64, at: u64) {
        let totals = self.totals.entry(class).or_default();
        totals.requests += 1;
        totals.met += met as u64;
        totals.tokens += goodput;
        let window = (at / TIMELINE_WINDOW_NS) as usize;
        if self.timeline.len() <= window {
            self.timeline.resize(window + 1, 0);
        }
        self.timeline[window] += goodput;
    }

    /// The summary over `elapsed_s` seconds.
    pub fn summary(&self, elapsed_s: f64) -> LlmGoodputSummary {
        let per_s = |x: u64| if elapsed_s > 0.0 { x as f64 / elapsed_s } else { 0.0 };
        let mut totals = self.totals.clone();
        if !self.jobs.is_empty() {
            // Jobs still open did not meet their SLO (yet).
            totals.entry(ServiceClass::Compound).or_default().requests += self.jobs.len() as u64;
        }
        LlmGoodputSummary {
            elapsed_s,
            classes: totals.iter().map(|(c, g)| (class_name(*c).to_string(), g.clone())).collect(),
            token_goodput: per_s(totals.values().map(|g| g.tokens).sum()),
            request_goodput: per_s(totals.values().map(|g| g.met).sum()),
            timeline: self.timeline.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn end(id: u64, ended_at: u64, tokens: u32, outcome: Outcome) -> RequestEnd {
        RequestEnd { id, stream: 0, sent_at: 0, ended_at, deadline: 0, outcome, tokens, accuracy: 1.0, queue_delay: 0 }
    }

    fn goodput() -> LlmGoodput {
        let mut g = LlmGoodput::default();
        g.activate(&["ls", "ds", "be"], 100 * MS);
        g
    }

    #[test]
    fn ls_counts_the_tokens_emitted_on_their_timeline() {
        let mut g = goodput();
        // TTFT 2 s: token j due at 2 s + j·100 ms.
        g.submitted(1, 0, 0, 2000 * MS, 50, None);
        // A frame of 10 steps from 1.9 s to 2.9 s: token k emitted at 2.0 + 0.1k ≤ due.
        g.tokens_emitted(1, 1900 * MS, 1000 * MS, 10, 0, 10);
        // Next frame, 10 steps at 2.9 s .. 4.9 s: token 10+k at 3.1 + 0.2k vs due 3.0 + 0.1k: late.
        g.tokens_emitted(1, 2900 * MS, 2000 * MS, 10, 10, 10);
        g.ended(&end(1, 4900 * MS, 20, Outcome::Completed));
        let s = g.summary(10.0);
        assert_eq!(s.classes["ls"], ClassGoodput { requests: 1, met: 0, tokens: 10 });
        assert!((s.token_goodput - 1.0).abs() < 1e-12);
        assert!((s.over(5.0).token_goodput - 2.0).abs() < 1e-12);
    }

    #[test]
    fn ds_earns_input_and_output_only_by_its_deadline_and_drops_earn_nothing() {
        let mut g = goodput();
        g.submitted(1, 1, 0, 20_000 * MS, 100, None);
        g.submitted(2, 1, 0, 20_000 * MS, 100, None);
        g.submitted(3, 2, 0, 60_000 * MS, 100, None);
        g.submitted(4, 0, 0, 2000 * MS, 100, None);
        g.ended(&end(1, 19_000 * MS, 30, Outcome::Completed));
        g.ended(&end(2, 21_000 * MS, 30, Outcome::Completed));
        g.ended(&end(3, 1000 * MS, 0, Outcome::Dropped { reason: "x".into() }));
        // A dropped LS request keeps the tokens it delivered on time.
        g.tokens_emitted(4, 0, 2000 * MS, 10, 0, 3);
        g.ended(&end(4, 2000 * MS, 3, Outcome::Dropped { reason: "x".into() }));
        let s = g.summary(1.0);
        assert_eq!(s.classes["ds"], ClassGoodput { requests: 2, met: 1, tokens: 130 });
        // Request 1's 130 tokens were earned at 19 s (second window), request 4's 3 at 2 s.
        assert_eq!(s.timeline, [3, 130, 0]);
        assert_eq!(s.classes["be"], ClassGoodput { requests: 1, met: 0, tokens: 0 });
        assert_eq!(s.classes["ls"], ClassGoodput { requests: 1, met: 0, tokens: 3 });
        assert_eq!(s.request_goodput, 1.0);
    }

    fn call(job: u64, stage: u32, last: bool) -> Option<CallLink> {
        Some(CallLink { job, stage, last, app: String::new() })
    }

    #[test]
    fn a_compound_job_earns_all_its_calls_once_only_if_its_last_call_is_in_time() {
        let mut g = LlmGoodput::default();
        g.activate(&["cp", "ds"], 100 * MS);
        let d = 40_000 * MS;
        // Job 1: two stages, the second with two parallel calls, all by the deadline.
        g.submitted(1, 0, 0, d, 100, call(1, 1, false));
        g.ended(&end(1, 5_000 * MS, 50, Outcome::Completed));
        assert!(g.summary(1.0).classes.get("cp").is_none_or(|c| c.requests == 1), "open, not yet counted as ended");
        g.submitted(2, 0, 5_000 * MS, d, 200, call(1, 2, true));
        g.submitted(3, 0, 5_000 * MS, d, 300, call(1, 2, true));
        g.ended(&end(2, 9_000 * MS, 20, Outcome::Completed));
        g.ended(&end(3, 39_000 * MS, 30, Outcome::Completed));
        // Job 2: its last call completes after the deadline: nothing.
        g.submitted(4, 0, 0, d, 100, call(2, 1, false));
        g.ended(&end(4, 1_000 * MS, 10, Outcome::Completed));
        g.submitted(5, 0, 1_000 * MS, d, 100, call(2, 2, true));
        g.ended(&end(5, 41_000 * MS, 10, Outcome::Completed));
        // Job 3: its first call is dropped; the job ends there with nothing.
        g.submitted(6, 0, 0, d, 100, call(3, 1, false));
        g.ended(&end(6, 1_000 * MS, 0, Outcome::Dropped { reason: "x".into() }));
        // Job 4: still open at the end of the run.
        g.submitted(7, 0, 0, d, 100, call(4, 1, false));
        // A DS request on the other stream is not a job.
        g.submitted(8, 1, 0, d, 7, call(5, 1, true));
        g.ended(&end(8, 1_000 * MS, 3, Outcome::Completed));
        let s = g.summary(1.0);
        assert_eq!(s.classes["cp"], ClassGoodput { requests: 4, met: 1, tokens: 100 + 50 + 200 + 20 + 300 + 30 });
        assert_eq!(s.classes["ds"], ClassGoodput { requests: 1, met: 1, tokens: 10 });
        // A call of job 2 submitted after the job was counted is not a new job.
        g.submitted(10, 0, 41_000 * MS, d, 100, call(2, 3, true));
        g.ended(&end(10, 42_000 * MS, 10, Outcome::Completed));
        assert_eq!(g.summary(1.0).classes["cp"].requests, 4);
        // Untagged CP requests keep the end-to-end rule (a job whose calls are pieces).
        g.submitted(9, 0, 0, d, 100, None);
        g.ended(&end(9, 1_000 * MS, 5, Outcome::Completed));
        assert_eq!(g.summary(1.0).classes["cp"].tokens, 700 + 105);
    }
}
