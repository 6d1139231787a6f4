//! Stateful sequences (Triton's sequence batcher): the requests of one correlation id
//! at one stage run one at a time, in the order they were submitted, on the worker
//! that ran the sequence's first request — the worker holding its state.
//!
//! The engine keeps, per live sequence, the worker it is bound to, the request in
//! flight (the one the policy holds or a worker runs) and the requests held back
//! behind it, which the policy has not seen yet. The policy sees each request with a
//! `correlation` naming the bound worker, and the validator rejects a dispatch of it
//! anywhere else. A sequence whose worker is lost or scaled down is gone: its requests
//! fail with a message that says so, and so do later requests of the same id until a
//! new START — never a silently restarted state.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use yardmaster_policy::contract::Request;

use crate::SequenceStep;

/// A sequence's key: its stage and its correlation id.
type Key = (u32, u64);

/// One live sequence.
#[derive(Debug, Default)]
struct Live {
    /// The worker holding its state, once a request of it has run.
    worker: Option<u32>,
    /// The origin of the request in flight (held by the policy or running).
    in_flight: Option<u64>,
    /// Whether the request in flight ends the sequence.
    in_flight_ends: bool,
    /// Requests held back behind the one in flight, in submission order.
    held: VecDeque<Request>,
    /// An END has been admitted: only a new START may follow.
    ending: bool,
}

/// What [`Sequences::admit`] decided for a request.
#[derive(Debug, PartialEq)]
pub(crate) enum Admission {
    /// Queue it now, bound to this worker (`None`: any worker of the stage).
    Now(Option<u32>),
    /// Held back behind the sequence's request in flight.
    Held,
}

/// What happens once a sequence's request in flight has ended.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct AfterEnd {
    /// The next request to queue, with the worker it is bound to.
    pub next: Option<(Request, Option<u32>)>,
    /// Held requests that can no longer run, with the error they end with.
    pub failed: Vec<(u64, String)>,
    /// A worker whose state for the sequence can be freed.
    pub release: Option<(u32, u64)>,
}

/// The live sequences of one engine.
#[derive(Debug, Default)]
pub(crate) struct Sequences {
    live: HashMap<Key, Live>,
    /// The sequence of each origin in flight or held.
    of_origin: HashMap<u64, Key>,
    /// Why sequences that ended without their END are gone (their worker was lost),
    /// until the id starts again.
    gone: HashMap<Key, String>,
}

impl Sequences {
    /// Whether no sequence is live.
    pub(crate) fn is_empty(&self) -> bool {
        self.live.is_empty() && self.of_origin.is_empty()
    }

    /// Admit `request` (an origin at `stage`) as a step of a sequence, or refuse it
    /// with the reason.
    pub(crate) fn admit(&mut self, stage: u32, step: SequenceStep, request: &Request) -> Result<Admission, String> {
        let key = (stage, step.id);
        let id = step.id;
        match self.live.get_mut(&key) {
            None if !step.start => Err(self
                .gone
                .get(&key)
                .cloned()
                .unwrap_or_else(|| format!("sequence {id} is not running: its first request must set sequence_start"))),
            None => {
                self.gone.remove(&key);
                let live = Live { in_flight: Some(request.origin), in_flight_ends: step.end, ending: step.end, ..Live::default() };
                self.live.insert(key, live);
                self.of_origin.insert(request.origin, key);
                Ok(Admission::Now(None))
            }
            Some(live) if step.start && !live.ending => Err(format!("sequence {id} is already running: a START can only begin a new one")),
            Some(live) if !step.start && live.ending => {
                Err(format!("sequence {id} has ended: a request after its END must start a new sequence"))
            }
            Some(live) => {
                live.ending = step.end;
                self.of_origin.insert(request.origin, key);
                if live.in_flight.is_none() && live.held.is_empty() {
                    live.in_flight = Some(request.origin);
                    live.in_flight_ends = step.end;
                    Ok(Admission::Now(live.worker))
                } else {
                    let mut held = request.clone();
                    held.correlation = Some(correlation(step, None));
                    live.held.push_back(held);
                    Ok(Admission::Held)
                }
            }
        }
    }

    /// A sequence's request ran to completion at its stage on `worker`: the sequence is
    /// bound there (its state is there now).
    pub(crate) fn ran(&mut self, origin: u64, worker: u32) {
        if let Some(live) = self.of_origin.get(&origin).and_then(|key| self.live.get_mut(key)) {
            if live.in_flight == Some(origin) {
                live.worker = Some(worker);
            }
        }
    }

    /// An origin ended (completed, dropped or failed): if it was a sequence's request
    /// in flight, the next one may go; if it was held, it leaves the queue.
    pub(crate) fn origin_ended(&mut self, origin: u64, completed: bool) -> AfterEnd {
        let Some(key) = self.of_origin.remove(&origin) else { return AfterEnd::default() };
        let Some(live) = self.live.get_mut(&key) else { return AfterEnd::default() };
        if live.in_flight != Some(origin) {
            live.held.retain(|r| r.origin != origin);
            return AfterEnd::default();
        }
        live.in_flight = None;
        let mut after = AfterEnd::default();
        let ended_sequence = live.in_flight_ends;
        let never_ran = live.worker.is_none();
        if ended_sequence || never_ran {
            // The sequence is over: it ended, or its first request never ran (there is
            // no state to continue from).
            if !completed {
                if let Some(worker) = live.worker {
                    after.release = Some((worker, key.1));
                }
            }
            let live = self.live.remove(&key).expect("live");
            let mut held = live.held.into_iter();
            // A START held behind an END begins the id afresh.
            if let Some(next) = held.next() {
                let starts = next.correlation.as_ref().is_some_and(|c| c.start);
                if starts && ended_sequence {
                    let step = step_of(&next);
                    let rest: VecDeque<Request> = held.collect();
                    let ending = rest.back().map_or(step.end, |r| r.correlation.as_ref().is_some_and(|c| c.end));
                    let live = Live { in_flight: Some(next.origin), in_flight_ends: step.end, held: rest, ending, worker: None };
                    self.live.insert(key, live);
                    after.next = Some((next, None));
                    return after;
                }
                let why = if never_ran {
                    format!("sequence {} did not start: its first request ended without running", key.1)
                } else {
                    format!("sequence {} ended before this request", key.1)
                };
                for request in std::iter::once(next).chain(held) {
                    self.of_origin.remove(&request.origin);
                    after.failed.push((request.origin, why.clone()));
                }
            }
            return after;
        }
        if let Some(next) = live.held.pop_front() {
            live.in_flight = Some(next.origin);
            live.in_flight_ends = step_of(&next).end;
            after.next = Some((next, live.worker));
        }
        after
    }

    /// `worker` is gone (lost or scaled down): every sequence bound to it is gone too.
    /// Returns the origins to fail (in flight and held) with the error they end with.
    pub(crate) fn worker_gone(&mut self, worker: u32, why: &str) -> Vec<(u64, String)> {
        let keys: Vec<Key> = self.live.iter().filter(|(_, l)| l.worker == Some(worker)).map(|(k, _)| *k).collect();
        let mut failed = Vec::new();
        for key in keys {
            let live = self.live.remove(&key).expect("listed");
            let error = format!("sequence {}'s state was on replica {worker}, which {why}; start the sequence again", key.1);
            for origin in live.in_flight.into_iter().chain(live.held.iter().map(|r| r.origin)) {
                self.of_origin.remove(&origin);
                failed.push((origin, error.clone()));
            }
            if !live.ending {
                self.gone.insert(key, error);
            }
        }
        failed
    }

    /// Forget an idle sequence (its idle timeout passed): returns the worker holding
    /// its state, if any, or `None` when the sequence is not live or still busy.
    pub(crate) fn release(&mut self, stage: u32, id: u64) -> Option<Option<u32>> {
        let key = (stage, id);
        let live = self.live.get(&key)?;
        if live.in_flight.is_some() || !live.held.is_empty() {
            return None;
        }
        Some(self.live.remove(&key).expect("live").worker)
    }
}

/// The contract's view of a step, bound to `worker`.
pub(crate) fn correlation(step: SequenceStep, worker: Option<u32>) -> yardmaster_policy::contract::Correlation {
    yardmaster_policy::contract::Correlation { id: step.id, start: step.start, end: step.end, worker }
}

/// The step a request of a sequence is (it carries its correlation).
pub(crate) fn step_of(request: &Request) -> SequenceStep {
    let c = request.correlation.as_ref().expect("a held request has its correlation");
    SequenceStep { id: c.id, start: c.start, end: c.end }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: u64) -> Request {
        crate::test_support::request(origin, origin)
    }

    fn step(id: u64, start: bool, end: bool) -> SequenceStep {
        SequenceStep { id, start, end }
    }

    #[test]
    fn one_request_at_a_time_in_order_on_the_worker_that_ran_the_first() {
        let mut s = Sequences::default();
        assert_eq!(s.admit(0, step(7, true, false), &request(1)), Ok(Admission::Now(None)));
        assert_eq!(s.admit(0, step(7, false, false), &request(2)), Ok(Admission::Held));
        assert_eq!(s.admit(0, step(7, false, true), &request(3)), Ok(Admission::Held));
        s.ran(1, 4);
        let after = s.origin_ended(1, true);
        let (next, worker) = after.next.expect("the second goes");
        assert_eq!((next.origin, worker), (2, Some(4)));
        s.ran(2, 4);
        let after = s.origin_ended(2, true);
        assert_eq!(after.next.map(|(r, w)| (r.origin, w)), Some((3, Some(4))));
        s.ran(3, 4);
        assert_eq!(s.origin_ended(3, true), AfterEnd::default());
        assert!(s.is_empty(), "an ended sequence is forgotten");
    }

    #[test]
    fn protocol_errors_are_refused_with_their_reason() {
        let mut s = Sequences::default();
        assert!(s.admit(0, step(7, false, false), &request(1)).unwrap_err().contains("must set sequence_start"));
        s.admit(0, step(7, true, false), &request(2)).unwrap();
        assert!(s.admit(0, step(7, true, false), &request(3)).unwrap_err().contains("already running"));
        // Another stage's sequence 7 is another sequence.
        assert_eq!(s.admit(1, step(7, true, false), &request(4)), Ok(Admission::Now(None)));
        s.admit(0, step(7, false, true), &request(5)).unwrap();
        assert!(s.admit(0, step(7, false, false), &request(6)).unwrap_err().contains("has ended"));
        // A new START may follow the END; it waits behind it and begins afresh.
        assert_eq!(s.admit(0, step(7, true, false), &request(8)), Ok(Admission::Held));
        s.ran(2, 1);
        let after = s.origin_ended(2, true);
        assert_eq!(after.next.map(|(r, w)| (r.origin, w)), Some((5, Some(1))));
        s.ran(5, 1);
        let after = s.origin_ended(5, true);
        assert_eq!(after.next.map(|(r, w)| (r.origin, w)), Some((8, None)), "the new sequence may run anywhere");
    }

    #[test]
    fn a_lost_worker_ends_its_sequences_with_an_error_that_says_so() {
        let mut s = Sequences::default();
        s.admit(0, step(7, true, false), &request(1)).unwrap();
        s.ran(1, 3);
        s.origin_ended(1, true);
        s.admit(0, step(7, false, false), &request(2)).unwrap();
        s.admit(0, step(7, false, false), &request(3)).unwrap();
        let failed = s.worker_gone(3, "was lost: host down");
        assert_eq!(failed.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [2, 3]);
        assert!(failed[0].1.contains("replica 3, which was lost"), "{}", failed[0].1);
        let later = s.admit(0, step(7, false, false), &request(4)).unwrap_err();
        assert!(later.contains("which was lost"), "later requests learn why: {later}");
        assert_eq!(s.admit(0, step(7, true, false), &request(5)), Ok(Admission::Now(None)), "a new START begins again");
    }

    #[test]
    fn a_first_request_that_never_ran_fails_the_ones_behind_it() {
        let mut s = Sequences::default();
        s.admit(0, step(9, true, false), &request(1)).unwrap();
        s.admit(0, step(9, false, false), &request(2)).unwrap();
        let after = s.origin_ended(1, false);
        assert_eq!(after.failed.len(), 1);
        assert!(after.failed[0].1.contains("did not start"));
        assert!(s.is_empty());
    }

    #[test]
    fn a_held_request_that_ends_leaves_the_queue_and_idle_sequences_can_be_released() {
        let mut s = Sequences::default();
        s.admit(0, step(5, true, false), &request(1)).unwrap();
        s.admit(0, step(5, false, false), &request(2)).unwrap();
        assert_eq!(s.release(0, 5), None, "busy");
        assert_eq!(s.origin_ended(2, false), AfterEnd::default(), "held, expired");
        s.ran(1, 2);
        assert_eq!(s.origin_ended(1, true).next, None);
        assert_eq!(s.release(0, 5), Some(Some(2)));
        assert!(s.is_empty());
    }
}
