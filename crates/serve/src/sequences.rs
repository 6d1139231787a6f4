//! Stateful sequences at the door: a model with a sequence batcher (Triton's
//! `sequence_batching`) keeps a table of its running sequences, and each request is
//! checked against it before it reaches the engine.
//!
//! A request of such a model must name its sequence (`sequence_id`, a non-zero integer
//! or a non-empty string; a string is hashed to the 64-bit id the engine and the worker
//! key the sequence by, and kept for a string CORRID), carry one item, and fit the
//! sequence's state: a START for a sequence already running is refused, and so is a
//! request without START for a sequence that is not running — never started, ended, or
//! idle for longer than `max_sequence_idle_microseconds` since its last request. Each
//! refusal is the client's error, naming the model and the parameter. A request of a
//! sequence that ends without completing (failed — its replica was lost, say — dropped
//! or cancelled) ends the sequence here: the state would otherwise silently miss a
//! step, so the next request must START it again ([`SequenceTable::failed`]).
//!
//! The state itself lives with the replica that runs the sequence
//! (`yardmaster_dataplane::sequence`); the engine keeps a sequence's requests in order
//! and on that replica. A sequence that outlives its idle time here is taken out of the
//! table and queued ([`SequenceTable::take_expired`]) for the backend to release in the
//! engine, which frees its state on the replica: the table is swept when a request
//! meets an idle sequence, and every quarter of the idle time by a sweeper task
//! ([`SequenceTable::sweep`]), so an abandoned sequence does not hold its replica's
//! memory.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use yardmaster_dataplane::SequenceStep;

use super::kserve::{CorrelationId, SequenceParams};

/// Sweep idle sequences out of the table once it holds this many.
const SWEEP_AT: usize = 1024;

/// A model's running sequences.
#[derive(Debug)]
pub struct SequenceTable {
    model: String,
    idle: Duration,
    /// Running sequence → when its last request was admitted, and the number of the
    /// START that began it (so that a late failure of an earlier run of the same id
    /// does not end a new one).
    running: Mutex<HashMap<u64, (Instant, u64)>>,
    /// STARTs admitted so far.
    starts: std::sync::atomic::AtomicU64,
    /// Sequences found idle past their time, not yet released in the engine.
    expired: Mutex<Vec<u64>>,
    /// Set once the sweeper task runs.
    sweeper: OnceLock<()>,
}

impl PartialEq for SequenceTable {
    /// Two tables are alike when they judge alike (model and idle time).
    fn eq(&self, other: &Self) -> bool {
        self.model == other.model && self.idle == other.idle
    }
}

/// A request admitted into its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// Its place in the sequence, for the engine and the worker.
    pub step: SequenceStep,
    /// Which run of the sequence's id it belongs to (one per START).
    pub run: u64,
}

/// How many sequences `running` holds.
fn running_len(running: &Mutex<HashMap<u64, (Instant, u64)>>) -> usize {
    running.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// A string correlation id's 64-bit key: FNV-1a of its bytes, never 0 (the same string
/// always gives the same key, in every process).
pub fn string_key(text: &str) -> u64 {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    hash.max(1)
}

impl SequenceTable {
    /// An empty table for `model`, whose sequences end after `idle` without a request.
    pub fn new(model: &str, idle: Duration) -> Self {
        SequenceTable {
            model: model.to_string(),
            idle,
            running: Mutex::new(HashMap::new()),
            starts: std::sync::atomic::AtomicU64::new(0),
            expired: Mutex::new(Vec::new()),
            sweeper: OnceLock::new(),
        }
    }

    /// The model's idle time (`max_sequence_idle_microseconds`).
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Whether this call is the first to ask (the caller starts the sweeper task).
    pub fn claim_sweeper(&self) -> bool {
        self.sweeper.set(()).is_ok()
    }

    /// Take every sequence idle past its time at `now` out of the table and queue it
    /// for release ([`SequenceTable::take_expired`]).
    pub fn sweep(&self, now: Instant) {
        let idle = self.idle;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut expired = Vec::new();
        running.retain(|&id, (last, _)| {
            let alive = now.saturating_duration_since(*last) <= idle;
            if !alive {
                expired.push(id);
            }
            alive
        });
        drop(running);
        if !expired.is_empty() {
            self.expired.lock().unwrap_or_else(|p| p.into_inner()).extend(expired);
        }
    }

    /// The sequences taken out of the table for being idle since the last call: the
    /// engine is to forget them (and free their state on their replica).
    pub fn take_expired(&self) -> Vec<u64> {
        std::mem::take(&mut *self.expired.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sequences running now (idle ones not yet swept included).
    pub fn len(&self) -> usize {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no sequence is running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Check a request of `items` items with sequence parameters `params` against the
    /// table at `now`, and record it: its step for the engine and the worker, or the
    /// client's error naming the model and the parameter.
    pub fn admit(&self, params: Option<&SequenceParams>, items: u32, now: Instant) -> Result<Admitted, String> {
        let model = &self.model;
        let Some(params) = params.filter(|p| p.id.is_some()) else {
            return Err(format!(
                "model {model:?}: sequence_id: the model has a sequence batcher, so every request names its sequence with a non-zero sequence_id"
            ));
        };
        let (id, label) = match params.id.as_ref().expect("checked above") {
            CorrelationId::Number(id) => (*id, None),
            CorrelationId::Text(text) => (string_key(text), Some(text.clone())),
        };
        let shown = label.clone().unwrap_or_else(|| id.to_string());
        if items > 1 {
            return Err(format!(
                "model {model:?}: sequence {shown}: a request of a sequence carries one item, this one carries a batch of {items}"
            ));
        }
        if running_len(&self.running) >= SWEEP_AT {
            self.sweep(now);
        }
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let alive = match running.get(&id) {
            Some(&(last, _)) if now.saturating_duration_since(last) > self.idle => {
                // Idle past its time: it ended; the engine is to forget it before this
                // request reaches it.
                running.remove(&id);
                self.expired.lock().unwrap_or_else(|p| p.into_inner()).push(id);
                false
            }
            known => known.is_some(),
        };
        if params.start {
            if alive {
                return Err(format!(
                    "model {model:?}: sequence_start: sequence {shown} is already running; end it (sequence_end) before starting it again"
                ));
            }
        } else if !alive {
            return Err(format!(
                "model {model:?}: sequence_start: sequence {shown} is not running (never started, ended, or idle for more than {} µs): its first request must set sequence_start",
                self.idle.as_micros()
            ));
        }
        let run = match running.get(&id) {
            Some(&(_, run)) if !params.start => run,
            _ => self.starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        };
        if params.end {
            running.remove(&id);
        } else {
            running.insert(id, (now, run));
        }
        Ok(Admitted { step: SequenceStep { id, label, start: params.start, end: params.end }, run })
    }

    /// A request of run `run` of sequence `id` ended without completing (it failed, was
    /// dropped or cancelled): the sequence ends here, since its state would otherwise
    /// silently miss a step or was lost with its replica; its next request must START
    /// it again. A newer run of the same id is left alone.
    pub fn failed(&self, id: u64, run: u64) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.get(&id).is_some_and(|&(_, r)| r == run) {
            running.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(id: u64, start: bool, end: bool) -> SequenceParams {
        SequenceParams { id: Some(CorrelationId::Number(id)), start, end }
    }

    #[test]
    fn a_sequence_starts_runs_and_ends_and_every_misstep_is_named() {
        let table = SequenceTable::new("acc", Duration::from_millis(100));
        let t0 = Instant::now();
        let error = table.admit(None, 1, t0).unwrap_err();
        assert!(error.starts_with("model \"acc\": sequence_id"), "{error}");
        let zero = SequenceParams { id: None, start: true, end: false };
        assert!(table.admit(Some(&zero), 1, t0).unwrap_err().contains("sequence_id"));
        let error = table.admit(Some(&params(5, false, false)), 1, t0).unwrap_err();
        assert!(error.starts_with("model \"acc\": sequence_start: sequence 5 is not running"), "{error}");
        let step = table.admit(Some(&params(5, true, false)), 1, t0).unwrap().step;
        assert_eq!((step.id, step.start, step.end), (5, true, false));
        let error = table.admit(Some(&params(5, true, false)), 1, t0).unwrap_err();
        assert!(error.contains("sequence 5 is already running"), "{error}");
        assert!(table.admit(Some(&params(5, false, false)), 3, t0).unwrap_err().contains("carries one item"));
        table.admit(Some(&params(5, false, false)), 1, t0 + Duration::from_millis(90)).unwrap();
        table.admit(Some(&params(5, false, true)), 1, t0 + Duration::from_millis(180)).unwrap();
        assert!(table.is_empty(), "END ends it");
        assert!(table.admit(Some(&params(5, false, false)), 1, t0).unwrap_err().contains("not running"));
    }

    #[test]
    fn an_idle_sequence_ends_and_may_start_again_and_string_ids_hash_stably() {
        let table = SequenceTable::new("acc", Duration::from_millis(100));
        let t0 = Instant::now();
        table.admit(Some(&params(9, true, false)), 1, t0).unwrap();
        let late = t0 + Duration::from_millis(101);
        assert!(table.admit(Some(&params(9, false, false)), 1, late).unwrap_err().contains("idle for more than 100000 µs"));
        assert_eq!(table.take_expired(), [9], "the idle sequence is queued for the engine to release");
        assert!(table.take_expired().is_empty(), "once");
        table.admit(Some(&params(9, true, false)), 1, late).expect("a START begins it again");
        assert!(table.take_expired().is_empty(), "not idle since");
        let text = SequenceParams { id: Some(CorrelationId::Text("user-7".into())), start: true, end: false };
        let step = table.admit(Some(&text), 1, t0).unwrap().step;
        assert_eq!((step.id, step.label.as_deref()), (string_key("user-7"), Some("user-7")));
        assert_eq!(string_key("user-7"), 0xf84b_a0aa_754a_486e, "FNV-1a, the same in every process");
        assert_ne!(string_key("user-7"), string_key("user-8"));
    }

    #[test]
    fn a_sweep_takes_out_only_the_sequences_idle_past_their_time() {
        let table = SequenceTable::new("acc", Duration::from_millis(100));
        let t0 = Instant::now();
        table.admit(Some(&params(1, true, false)), 1, t0).unwrap();
        table.admit(Some(&params(2, true, false)), 1, t0 + Duration::from_millis(60)).unwrap();
        table.sweep(t0 + Duration::from_millis(100));
        assert!(table.take_expired().is_empty(), "neither is idle past 100 ms yet");
        table.sweep(t0 + Duration::from_millis(130));
        assert_eq!(table.take_expired(), [1]);
        assert_eq!(table.len(), 1, "sequence 2 runs on");
        table.admit(Some(&params(2, false, false)), 1, t0 + Duration::from_millis(150)).expect("still running");
        assert!(table.claim_sweeper() && !table.claim_sweeper(), "one sweeper per table");
    }

    #[test]
    fn a_step_that_does_not_complete_ends_its_run_but_not_a_newer_one() {
        let table = SequenceTable::new("acc", Duration::from_secs(10));
        let t0 = Instant::now();
        let first = table.admit(Some(&params(4, true, false)), 1, t0).unwrap();
        let second = table.admit(Some(&params(4, false, false)), 1, t0).unwrap();
        assert_eq!(first.run, second.run, "one run until the next START");
        table.failed(4, second.run);
        let error = table.admit(Some(&params(4, false, false)), 1, t0).unwrap_err();
        assert!(error.contains("sequence 4 is not running"), "{error}");
        let again = table.admit(Some(&params(4, true, false)), 1, t0).unwrap();
        assert_ne!(again.run, first.run);
        table.failed(4, first.run);
        table.admit(Some(&params(4, false, false)), 1, t0).expect("a late failure of the old run leaves the new one");
    }
}
