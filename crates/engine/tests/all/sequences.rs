//! Stateful sequences and client batches through the engine: a sequence's requests
//! reach the policy one at a time, in order, and run on the worker holding the
//! sequence; a lost worker ends its sequences with an error that says so; a batch
//! never exceeds the stage's limit in items. Every request ends exactly once.

use std::collections::BTreeMap;

use yardmaster_engine::*;
use yardmaster_policy::contract;
use yardmaster_policy::PolicyInstance;

use crate::engine::{chain, engine_with, success, MS};

fn step(id: u64, start: bool, end: bool) -> Submission {
    Submission { stream: 0, sequence: Some(SequenceStep { id, start, end }), ..Default::default() }
}

/// Finish every started job, recording (worker, request) in order.
fn finish(engine: &mut Engine<ManualClock, crate::engine::TestExecutor>, ran: &mut Vec<(u32, u64)>) -> usize {
    let jobs = std::mem::take(&mut engine.executor_mut().started);
    let n = jobs.len();
    for job in jobs {
        ran.extend(job.items.iter().map(|i| (job.worker, i.id)));
        engine.job_finished(success(&job, &[]));
    }
    engine.flush();
    n
}

#[test]
fn interleaved_sequences_run_in_order_each_on_the_worker_that_ran_its_start() {
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(1, 3));
    // Two sequences of four steps each, submitted interleaved and all at once.
    let mut ids = BTreeMap::new();
    for k in 0..4 {
        for seq in [11u64, 22] {
            let id = engine.submit(step(seq, k == 0, k == 3));
            ids.insert(id, (seq, k));
        }
    }
    engine.flush();
    let mut ran = Vec::new();
    let mut rounds = 0;
    while finish(&mut engine, &mut ran) > 0 {
        rounds += 1;
        clock.set(rounds * MS);
        assert!(rounds < 20, "the sequences finish");
    }
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 8, "every request ends exactly once");
    assert!(ended.iter().all(|e| e.outcome == Outcome::Completed), "{ended:?}");
    for seq in [11u64, 22] {
        let steps: Vec<(u32, u32)> = ran.iter().filter(|(_, id)| ids[id].0 == seq).map(|(worker, id)| (*worker, ids[id].1)).collect();
        assert_eq!(steps.iter().map(|s| s.1).collect::<Vec<_>>(), [0, 1, 2, 3], "sequence {seq} runs in order");
        assert!(steps.iter().all(|s| s.0 == steps[0].0), "sequence {seq} stays on one worker: {steps:?}");
    }
    // One at a time: four rounds, each running one step of each sequence.
    assert_eq!(rounds, 4);
}

#[test]
fn a_request_outside_its_sequence_fails_at_once_and_the_policy_never_sees_it() {
    let (mut engine, _clock) = engine_with::<policy_fifo::Fifo>(chain(1, 1));
    let orphan = engine.submit(step(5, false, false));
    let first = engine.submit(step(6, true, false));
    let again = engine.submit(step(6, true, false));
    engine.flush();
    let ended = engine.take_ended();
    let error = |id| match &ended.iter().find(|e| e.id == id).expect("ended").outcome {
        Outcome::Failed { error } => error.clone(),
        other => panic!("{other:?}"),
    };
    assert!(error(orphan).contains("sequence 5 is not running"), "{}", error(orphan));
    assert!(error(again).contains("sequence 6 is already running"), "{}", error(again));
    assert_eq!(ended.len(), 2);
    let job = engine.executor().started.last().expect("the first step runs");
    assert_eq!(job.items.iter().map(|i| i.id).collect::<Vec<_>>(), [first]);
}

#[test]
fn a_lost_worker_ends_its_sequences_with_an_error_and_never_restarts_their_state() {
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(1, 2));
    engine.submit(step(9, true, false));
    engine.flush();
    let mut ran = Vec::new();
    finish(&mut engine, &mut ran);
    let holder = ran[0].0;
    assert_eq!(engine.take_ended().len(), 1);
    // Two more steps: the first waits with the policy (bound to the holder), the
    // second is held back behind it. Keep the holder busy so neither runs.
    engine.submit(Submission { stream: 0, ..Default::default() });
    engine.flush();
    assert!(
        engine.executor().started.iter().any(|j| j.worker == holder),
        "fifo gives the holder (the lowest idle worker) the plain request"
    );
    let second = engine.submit(step(9, false, false));
    let third = engine.submit(step(9, false, false));
    engine.flush();
    assert!(
        engine.executor().started.iter().all(|j| j.items.iter().all(|i| i.id != second)),
        "the step waits for its holder, though another worker is idle"
    );
    clock.set(5 * MS);
    engine.worker_lost(holder, "its node went away");
    engine.flush();
    let ended = engine.take_ended();
    for id in [second, third] {
        let outcome = &ended.iter().find(|e| e.id == id).expect("ended once").outcome;
        assert!(
            matches!(outcome, Outcome::Failed { error } if error.contains(&format!("replica {holder}, which was lost: its node went away"))),
            "{outcome:?}"
        );
    }
    // A later step of the same id learns why; a new START begins again elsewhere.
    let later = engine.submit(step(9, false, false));
    engine.flush();
    let ended = engine.take_ended();
    assert!(matches!(&ended[0].outcome, Outcome::Failed { error } if error.contains("which was lost")) && ended[0].id == later);
    let restart = engine.submit(step(9, true, true));
    engine.flush();
    assert!(engine.executor().started.iter().any(|j| j.worker != holder && j.items.iter().any(|i| i.id == restart)));
}

#[test]
fn a_batch_never_exceeds_the_stage_limit_in_items() {
    // max_batch 4: client batches of 3, 2, 1, 4, 2 and 1 items.
    let (mut engine, clock) = engine_with::<policy_fifo::Fifo>(chain(1, 1));
    let mut items = BTreeMap::new();
    for n in [3u32, 2, 1, 4, 2, 1] {
        let id = engine.submit(Submission { stream: 0, items: n, ..Default::default() });
        items.insert(id, n);
    }
    engine.flush();
    let mut rounds = 0;
    loop {
        let jobs = std::mem::take(&mut engine.executor_mut().started);
        if jobs.is_empty() {
            break;
        }
        for job in jobs {
            let total: u32 = job.items.iter().map(|i| items[&i.id]).sum();
            assert!(total <= 4, "a job of {total} items: {:?}", job.items.iter().map(|i| items[&i.id]).collect::<Vec<_>>());
            engine.job_finished(success(&job, &[]));
        }
        rounds += 1;
        clock.set(rounds * MS);
        engine.flush();
        assert!(rounds < 20);
    }
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 6);
    assert!(ended.iter().all(|e| e.outcome == Outcome::Completed));
    assert_eq!(engine.arm().stats().rejected_total(), 0, "the SDK kept every batch within the limit");
}

/// A policy as if built against contract 0.2.0: it cannot see items or sequences.
struct BuiltAgainst020(yardmaster_policy::NativePolicy<policy_fifo::Fifo>);

impl PolicyInstance for BuiltAgainst020 {
    fn label(&self) -> String {
        self.0.label()
    }
    fn init(&mut self, config: &contract::Config, now: u64) -> Result<Vec<contract::Action>, yardmaster_policy::PolicyFault> {
        self.0.init(config, now)
    }
    fn handle(
        &mut self,
        events: &[contract::Event],
        now: u64,
        kind: yardmaster_policy::CallKind,
    ) -> Result<Vec<contract::Action>, yardmaster_policy::PolicyFault> {
        self.0.handle(events, now, kind)
    }
    fn last_cost(&self) -> yardmaster_policy::CallCost {
        self.0.last_cost()
    }
    fn take_emitted(&mut self) -> Vec<(String, f64)> {
        self.0.take_emitted()
    }
    fn contract_version(&self) -> contract::ContractVersion {
        contract::ContractVersion::new(0, 2, 0)
    }
}

#[test]
fn a_policy_older_than_contract_0_3_0_gets_no_client_batch_or_sequence_and_each_fails_with_the_reason() {
    let clock = ManualClock::default();
    let mut engine =
        Engine::new(clock.clone(), crate::engine::TestExecutor::default(), chain(1, 1), EngineOptions::default(), |config, view| {
            let old = BuiltAgainst020(yardmaster_policy::NativePolicy::<policy_fifo::Fifo>::new("old", 3, 100_000));
            yardmaster_policy::Arm::start("old", config, Box::new(old), yardmaster_policy::FailureMode::FailOpen, view)
        });
    let batch = engine.submit(Submission { stream: 0, items: 3, ..Default::default() });
    let sequence = engine.submit(step(4, true, false));
    let single = engine.submit(Submission { stream: 0, items: 1, ..Default::default() });
    engine.flush();
    let ended = engine.take_ended();
    assert_eq!(ended.len(), 2, "the batch and the step end at once: {ended:?}");
    for (id, what) in [(batch, "a client batch (3 items)"), (sequence, "a stateful sequence's requests")] {
        let error = match &ended.iter().find(|e| e.id == id).expect("ended").outcome {
            Outcome::Failed { error } => error.clone(),
            other => panic!("{other:?}"),
        };
        assert!(error.contains("speaks contract 0.2.0") && error.contains(what), "{error}");
    }
    let job = engine.executor().started.last().expect("the single-item request runs");
    assert_eq!(job.items.iter().map(|i| i.id).collect::<Vec<_>>(), [single]);
}
