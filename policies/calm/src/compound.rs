//! Compound jobs in CALM (spec §3.2 A4, §3.7, §4.2): each live job's revealed
//! calls by stage, the sub-deadline d_s of its current stage from the pattern graph
//! it matches (re-amortised when missed), the value Ĝ_R its stage competes with, and
//! the pattern store fed with the jobs that finish.
//!
//! Calls carry the tags of [`CallLink`]; a call without them is an ordinary deadline
//! request. A job's arrival a_R is its first call's, its deadline d_R the calls'.

use std::collections::BTreeMap;

use yardmaster_sdk::helpers::compound::{reamortise, sub_deadline, CallCost, CallLink, CallNode, PatternGraph, PatternStore, StageShare};
use yardmaster_sdk::{RequestId, StreamId};

/// A job: its stream and its id there.
pub type JobKey = (StreamId, u64);

/// One call of a live job.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Call {
    id: RequestId,
    node: CallNode,
}

/// The current stage's plan: the matching result and d_s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StagePlan {
    /// The stage (from 1).
    pub stage: u32,
    /// Calls of the stage when it was matched.
    calls: usize,
    /// φ(s), φ(s−1) and the matched future tokens.
    pub share: StageShare,
    /// d_s (ns).
    pub deadline: u64,
}

#[derive(Debug, Clone)]
struct Job {
    app: String,
    arrival: u64,
    deadline: u64,
    /// Revealed calls by stage (index s−1).
    stages: Vec<Vec<Call>>,
    /// The final stage is revealed.
    last: bool,
    plan: Option<StagePlan>,
    /// d_{s−1}: sub-deadlines never go back.
    previous_deadline: u64,
    /// Some call of the job was dispatched: the job is admitted.
    admitted: bool,
}

impl Job {
    fn finished_tokens(&self) -> u64 {
        self.stages.iter().flatten().filter_map(|c| c.node.output.map(|o| c.node.prompt as u64 + o as u64)).sum()
    }
}

/// Every live compound job and the pattern store.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    store: PatternStore,
    jobs: BTreeMap<JobKey, Job>,
    calls: BTreeMap<RequestId, JobKey>,
}

impl Jobs {
    /// An empty table over a store of `capacity` graphs per application.
    pub fn new(capacity: usize) -> Self {
        Self { store: PatternStore::new(capacity), ..Self::default() }
    }

    /// The pattern store.
    pub fn store(&self) -> &PatternStore {
        &self.store
    }

    /// The job of a call, if it is one.
    pub fn job_of(&self, id: RequestId) -> Option<JobKey> {
        self.calls.get(&id).copied()
    }

    /// Live jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job is live.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// A call arrived (its request `id`, stream, link, when it was sent, d_R, L_in).
    pub fn arrive(&mut self, id: RequestId, stream: StreamId, link: &CallLink, sent_at: u64, deadline: u64, prompt: u32) {
        let key = (stream, link.job);
        let job = self.jobs.entry(key).or_insert_with(|| Job {
            app: link.app.clone(),
            arrival: sent_at,
            deadline,
            stages: Vec::new(),
            last: false,
            plan: None,
            previous_deadline: sent_at,
            admitted: false,
        });
        job.arrival = job.arrival.min(sent_at);
        let index = link.stage as usize - 1;
        if job.stages.len() <= index {
            job.stages.resize(index + 1, Vec::new());
        }
        job.stages[index].push(Call { id, node: CallNode { prompt, output: None } });
        job.last |= link.last;
        self.calls.insert(id, key);
    }

    /// The current stage's plan of `key` at `now`: matched once per stage (again if
    /// calls were added), re-amortised when d_s passed before d_R; `cost` prices
    /// the calls for φ.
    pub fn plan(&mut self, key: JobKey, now: u64, cost: CallCost) -> Option<StagePlan> {
        let job = self.jobs.get_mut(&key)?;
        let stage = job.stages.len() as u32;
        let calls = job.stages.last().map_or(0, Vec::len);
        let fresh = job.plan.is_some_and(|p| p.stage == stage && p.calls == calls);
        if !fresh {
            if let Some(old) = job.plan.filter(|p| p.stage < stage) {
                job.previous_deadline = job.previous_deadline.max(old.deadline);
            }
            let partial: Vec<Vec<CallNode>> = job.stages.iter().map(|s| s.iter().map(|c| c.node).collect()).collect();
            let share = self.store.share(&job.app, &partial, job.last, cost);
            let deadline = sub_deadline(job.arrival, job.deadline, share.phi, job.previous_deadline);
            job.plan = Some(StagePlan { stage, calls, share, deadline });
        }
        let plan = job.plan.as_mut().expect("planned");
        if now > plan.deadline && now < job.deadline {
            plan.deadline = reamortise(now, job.deadline, &plan.share);
        }
        Some(*plan)
    }

    /// Mark the job of `id` admitted (one of its calls was dispatched).
    pub fn admit(&mut self, id: RequestId) {
        if let Some(job) = self.calls.get(&id).and_then(|key| self.jobs.get_mut(key)) {
            job.admitted = true;
        }
    }

    /// Whether the job of `id` was admitted (so its later calls are too).
    pub fn admitted(&self, id: RequestId) -> bool {
        self.calls.get(&id).and_then(|key| self.jobs.get(key)).is_some_and(|j| j.admitted)
    }

    /// Tokens of the job's finished calls.
    pub fn finished_tokens(&self, key: JobKey) -> u64 {
        self.jobs.get(&key).map_or(0, Job::finished_tokens)
    }

    /// A call finished with `output` tokens. When it completes the job's final
    /// stage, the job becomes a pattern graph and leaves the table.
    pub fn finished(&mut self, id: RequestId, output: u32) {
        let Some(key) = self.calls.remove(&id) else { return };
        let Some(job) = self.jobs.get_mut(&key) else { return };
        if let Some(call) = job.stages.iter_mut().flatten().find(|c| c.id == id) {
            call.node.output = Some(output);
        }
        let done = job.last && job.stages.last().is_some_and(|s| s.iter().all(|c| c.node.output.is_some()));
        if done {
            let job = self.jobs.remove(&key).expect("present");
            let graph = PatternGraph::new(job.stages.into_iter().map(|s| s.into_iter().map(|c| c.node).collect()).collect());
            self.store.record(&job.app, graph);
        }
    }

    /// A call ended without finishing: its job can earn nothing and is forgotten.
    /// Returns its other calls still waiting or running (to drop them too).
    pub fn failed(&mut self, id: RequestId) -> Vec<RequestId> {
        let Some(key) = self.calls.remove(&id) else { return Vec::new() };
        let Some(job) = self.jobs.remove(&key) else { return Vec::new() };
        let siblings: Vec<RequestId> =
            job.stages.iter().flatten().filter(|c| c.node.output.is_none() && c.id != id).map(|c| c.id).collect();
        for s in &siblings {
            self.calls.remove(s);
        }
        siblings
    }

    /// Forget jobs past their deadline by `grace` ns (their calls ended unseen),
    /// and decay the store's reuse counts by `decay`.
    pub fn sweep(&mut self, now: u64, grace: u64, decay: f64) {
        let stale: Vec<JobKey> = self.jobs.iter().filter(|(_, j)| now > j.deadline.saturating_add(grace)).map(|(k, _)| *k).collect();
        for key in stale {
            self.jobs.remove(&key);
            self.calls.retain(|_, k| *k != key);
        }
        if decay != 1.0 {
            self.store.decay(decay);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COST: CallCost = CallCost { prefill_s: 0.0, step_s: 0.01 };
    const S: u64 = 1_000_000_000;

    fn link(job: u64, stage: u32, last: bool) -> CallLink {
        CallLink { job, stage, last, app: "a".into() }
    }

    #[test]
    fn finished_jobs_become_patterns_that_set_later_jobs_sub_deadlines() {
        let mut jobs = Jobs::new(10);
        // Job 1: stage 1 decodes 100 tokens, stage 2 300: φ(1) = 0.25.
        jobs.arrive(1, 0, &link(1, 1, false), 0, 40 * S, 50);
        let first = jobs.plan((0, 1), 0, COST).unwrap();
        assert_eq!(first.share.similarity, None, "nothing to match yet");
        assert_eq!(first.deadline, 8 * S, "φ = 1/5 without history");
        assert!(!jobs.admitted(1));
        jobs.admit(1);
        jobs.finished(1, 100);
        jobs.arrive(2, 0, &link(1, 2, true), 3 * S, 40 * S, 60);
        assert!(jobs.admitted(2), "a job admitted once is admitted for its later calls");
        assert_eq!(jobs.plan((0, 1), 3 * S, COST).unwrap().deadline, 40 * S, "the last stage is due at d_R");
        jobs.finished(2, 300);
        assert!(jobs.is_empty());
        assert_eq!(jobs.store().len("a"), 1);
        // Job 2 looks the same: d_1 = a + 0.25·D, and its value counts the matched future.
        jobs.arrive(3, 0, &link(2, 1, false), 100 * S, 140 * S, 50);
        let plan = jobs.plan((0, 2), 100 * S, COST).unwrap();
        assert_eq!(plan.deadline, 110 * S);
        assert_eq!(plan.share.future_tokens, 360);
        // Missed: re-amortised over what is left of D.
        let late = jobs.plan((0, 2), 120 * S, COST).unwrap();
        assert_eq!(late.deadline, 120 * S + (0.25 * 20.0 * S as f64) as u64);
    }

    #[test]
    fn a_failed_call_ends_its_job_and_names_its_siblings() {
        let mut jobs = Jobs::new(10);
        jobs.arrive(1, 0, &link(7, 1, false), 0, 40 * S, 50);
        jobs.finished(1, 10);
        jobs.arrive(2, 0, &link(7, 2, false), S, 40 * S, 50);
        jobs.arrive(3, 0, &link(7, 2, false), S, 40 * S, 50);
        assert_eq!(jobs.job_of(3), Some((0, 7)));
        assert_eq!(jobs.finished_tokens((0, 7)), 60);
        assert_eq!(jobs.failed(2), vec![3]);
        assert!(jobs.is_empty() && jobs.job_of(3).is_none());
        assert_eq!(jobs.store().len("a"), 0, "an unfinished job is no pattern");
        // Stale jobs are swept.
        jobs.arrive(4, 0, &link(8, 1, false), 0, 40 * S, 50);
        jobs.sweep(41 * S, 5 * S, 1.0);
        assert_eq!(jobs.len(), 1);
        jobs.sweep(46 * S, 5 * S, 1.0);
        assert!(jobs.is_empty());
    }
}
