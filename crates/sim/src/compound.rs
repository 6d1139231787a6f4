//! Compound (multi-call) LLM jobs in the simulator (CALM spec §2): a job is a chain
//! (or graph) of LLM calls under one end-to-end deadline, revealed at run time. The
//! [`CompoundDriver`] submits a job's first stage at the job's arrival and each
//! later stage once every call of the previous one has completed, like an agent
//! that waits for its calls' answers; a call that does not complete, or completes
//! after the job's deadline, ends the job (it can no longer earn anything).
//! Every call is an engine request on the job's stream with the job's deadline and
//! the tags of [`CallLink`] (job, stage, `last` on the final stage, app), so
//! policies and the LLM accounting see the linkage.

use rustc_hash::FxHashMap;
use yardmaster_sdk::helpers::compound::CallLink;

use yardmaster_engine::metrics::Outcome;
use yardmaster_engine::{Ended, Submission};
use yardmaster_policy::contract::Tag;

/// One LLM call of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Prompt tokens.
    pub input_size: u32,
    /// Output tokens.
    pub expected_tokens: u32,
}

/// A compound job of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct CompoundJob {
    /// When it arrives (ns from the start of the run).
    pub at: u64,
    /// Its stream (a `cp…` stream).
    pub stream: u32,
    /// Its application (the pattern-graph family).
    pub app: String,
    /// End-to-end deadline after arrival, D (ns).
    pub deadline: u64,
    /// Calls of each stage (every stage has at least one).
    pub stages: Vec<Vec<Call>>,
}

/// A job's progress.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// The stage being served (index).
    stage: usize,
    /// Calls of that stage not yet completed.
    open: usize,
    /// A call failed: nothing more is submitted.
    dead: bool,
}

/// Submits compound jobs stage by stage as their calls complete.
#[derive(Debug, Clone)]
pub struct CompoundDriver {
    jobs: Vec<CompoundJob>,
    progress: Vec<Progress>,
    next: usize,
    /// Engine request id → job index.
    calls: FxHashMap<u64, usize>,
    /// Jobs whose last stage completed.
    completed: usize,
}

/// The submissions of one stage: the engine call for each.
type Submit<'a> = dyn FnMut(Submission, Vec<Tag>) -> u64 + 'a;

impl CompoundDriver {
    /// A driver for `jobs` (sorted here by arrival); stages with no call are skipped.
    pub fn new(mut jobs: Vec<CompoundJob>) -> Self {
        jobs.sort_by_key(|j| j.at);
        for job in &mut jobs {
            job.stages.retain(|s| !s.is_empty());
        }
        jobs.retain(|j| !j.stages.is_empty());
        let progress = vec![Progress::default(); jobs.len()];
        Self { jobs, progress, next: 0, calls: FxHashMap::default(), completed: 0 }
    }

    /// When the next job arrives.
    pub fn next_time(&self) -> Option<u64> {
        self.jobs.get(self.next).map(|j| j.at)
    }

    /// The latest absolute deadline of any job (for the drain limit).
    pub fn last_deadline(&self) -> u64 {
        self.jobs.iter().map(|j| j.at + j.deadline).max().unwrap_or(0)
    }

    /// Jobs whose every stage completed.
    pub fn completed(&self) -> usize {
        self.completed
    }

    /// Start every job arriving at or before `now`; returns how many started.
    pub fn start_due(&mut self, now: u64, submit: &mut Submit<'_>) -> usize {
        let mut started = 0;
        while self.jobs.get(self.next).is_some_and(|j| j.at <= now) {
            let index = self.next;
            self.next += 1;
            self.submit_stage(index, now, submit);
            started += 1;
        }
        started
    }

    /// Requests ended: advance their jobs, submitting next stages at `now`.
    pub fn ended(&mut self, ended: &[Ended], now: u64, submit: &mut Submit<'_>) {
        for end in ended {
            let Some(index) = self.calls.remove(&end.id) else { continue };
            let progress = &mut self.progress[index];
            if progress.dead {
                continue;
            }
            let job_deadline = self.jobs[index].at + self.jobs[index].deadline;
            if !matches!(end.outcome, Outcome::Completed) || end.at > job_deadline {
                progress.dead = true;
                continue;
            }
            progress.open = progress.open.saturating_sub(1);
            if progress.open > 0 {
                continue;
            }
            if progress.stage + 1 < self.jobs[index].stages.len() {
                progress.stage += 1;
                self.submit_stage(index, now, submit);
            } else {
                self.completed += 1;
            }
        }
    }

    fn submit_stage(&mut self, index: usize, now: u64, submit: &mut Submit<'_>) {
        let job = &self.jobs[index];
        let stage = self.progress[index].stage;
        let link = CallLink { job: index as u64 + 1, stage: stage as u32 + 1, last: stage + 1 == job.stages.len(), app: job.app.clone() };
        let tags: Vec<Tag> = link.pairs().into_iter().map(|(key, value)| Tag { key, value }).collect();
        let calls = job.stages[stage].clone();
        let (stream, deadline) = (job.stream, job.at + job.deadline);
        self.progress[index].open = calls.len();
        for call in calls {
            let submission = Submission {
                stream,
                sent_at: now,
                deadline,
                input_size: call.input_size,
                expected_tokens: call.expected_tokens,
                ..Submission::default()
            };
            let id = submit(submission, tags.clone());
            self.calls.insert(id, index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(input_size: u32, expected_tokens: u32) -> Call {
        Call { input_size, expected_tokens }
    }

    fn ended(id: u64, outcome: Outcome) -> Ended {
        Ended { id, outcome, at: 0, sent_at: 0, deadline: 0, arrived_at: 0, first_job_at: None }
    }

    #[test]
    fn stages_are_submitted_once_the_previous_one_completed_and_a_failure_ends_the_job() {
        let jobs = vec![
            CompoundJob {
                at: 5,
                stream: 2,
                app: "a".into(),
                deadline: 100,
                stages: vec![vec![call(1, 1)], vec![call(2, 2), call(3, 3)], vec![call(4, 4)]],
            },
            CompoundJob { at: 1, stream: 2, app: "a".into(), deadline: 100, stages: vec![vec![call(9, 9)], vec![call(8, 8)]] },
        ];
        let mut driver = CompoundDriver::new(jobs);
        let mut submitted: Vec<(u64, Submission, CallLink)> = Vec::new();
        let mut next_id = 100u64;
        let mut submit = |s: Submission, tags: Vec<Tag>| {
            next_id += 1;
            let link = CallLink::from_pairs(tags.iter().map(|t| (t.key.as_str(), t.value.as_str()))).expect("tagged");
            submitted.push((next_id, s, link));
            next_id
        };
        assert_eq!(driver.next_time(), Some(1));
        assert_eq!(driver.start_due(5, &mut submit), 2);
        assert_eq!(driver.next_time(), None);
        // Sorted by arrival: the second job is job 1.
        let firsts: Vec<(u64, u32, u32, u64)> = submitted.iter().map(|(id, s, l)| (*id, s.input_size, l.stage, s.deadline)).collect();
        assert_eq!(firsts, vec![(101, 9, 1, 101), (102, 1, 1, 105)]);
        assert_eq!(submitted[0].2.job, 1);
        let log: std::cell::RefCell<Vec<(u64, Submission, CallLink)>> = Default::default();
        let mut submit = |s: Submission, tags: Vec<Tag>| {
            let id = 201 + log.borrow().len() as u64;
            let link = CallLink::from_pairs(tags.iter().map(|t| (t.key.as_str(), t.value.as_str()))).expect("tagged");
            log.borrow_mut().push((id, s, link));
            id
        };
        // Job 2's first call completes: its two parallel calls go out at once, not last.
        driver.ended(&[ended(102, Outcome::Completed)], 10, &mut submit);
        assert_eq!(log.borrow().len(), 2);
        assert!(log.borrow().iter().all(|(_, s, l)| l.stage == 2 && !l.last && s.sent_at == 10 && s.stream == 2));
        // One of them completes: nothing yet; the other too: the last stage goes out.
        driver.ended(&[ended(201, Outcome::Completed)], 11, &mut submit);
        assert_eq!(log.borrow().len(), 2);
        driver.ended(&[ended(202, Outcome::Completed)], 12, &mut submit);
        assert_eq!(log.borrow().len(), 3);
        assert!(log.borrow()[2].2.last && log.borrow()[2].1.input_size == 4);
        driver.ended(&[ended(203, Outcome::Completed)], 13, &mut submit);
        // Job 1's first call is dropped: its second stage never comes.
        driver.ended(&[ended(101, Outcome::Dropped { reason: "x".into() })], 14, &mut submit);
        assert_eq!(log.borrow().len(), 3);
        assert_eq!(driver.completed(), 1);
        assert_eq!(driver.last_deadline(), 105);
    }

    #[test]
    fn a_call_that_completes_after_the_job_deadline_ends_the_job() {
        let job = CompoundJob { at: 0, stream: 2, app: "a".into(), deadline: 100, stages: vec![vec![call(1, 1)], vec![call(2, 2)]] };
        let mut driver = CompoundDriver::new(vec![job]);
        let mut submitted = 0u64;
        let mut submit = |_: Submission, _: Vec<Tag>| {
            submitted += 1;
            submitted
        };
        driver.start_due(0, &mut submit);
        driver.ended(&[Ended { at: 101, ..ended(1, Outcome::Completed) }], 101, &mut submit);
        assert_eq!(submitted, 1, "the second stage is not submitted");
        assert_eq!(driver.completed(), 0);
    }
}
