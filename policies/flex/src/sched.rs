//! The scheduler cost model (spec §5 item 8): each serving group's FLEX instance is one
//! serial scheduler whose every event costs simulated CPU time, so that the scalability
//! experiment (Fig. 11b, Ḡ ∈ {1, 12, ∞}) sees a large group's scheduler saturate.
//!
//! An event (an arrival, or a worker freed by a completion) waits in its group's FIFO
//! backlog while the group's scheduler is busy. Handling it takes
//! `fixed + per_worker · group size` nanoseconds (a scheduling pass of Algorithm 1 looks
//! at every GPU of the group); its decisions take effect when that time has passed (the
//! policy asks the host for a timer then). An event with nothing to schedule costs only
//! the fixed part: an arrival that can no longer finish even alone (it is dropped), a
//! freed worker that an earlier pass already filled or whose group has nothing queued.
//!
//! [`SerialScheduler`] is the bookkeeping of one group's scheduler, independent of what
//! the events are; the policy adapter (`lib.rs`) feeds it and acts on what it releases.

use std::collections::VecDeque;

use yardmaster_sdk::Instant;

/// Cost of one scheduler event, in nanoseconds of simulated CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Paid by every event.
    pub fixed_ns: f64,
    /// Paid per worker of the group by an event that runs a scheduling pass.
    pub per_worker_ns: f64,
}

impl CostModel {
    /// The cost of an event: the fixed part, plus the per-worker part for a group of
    /// `workers` when the event runs a scheduling pass (at least 1 ns, so that time
    /// always moves).
    pub fn cost(&self, workers: usize, pass: bool) -> Instant {
        let ns = self.fixed_ns + if pass { self.per_worker_ns * workers as f64 } else { 0.0 };
        (ns.round() as Instant).max(1)
    }
}

/// How the scheduler would handle an event if it started it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// A scheduling pass: costs the full price, its decisions come when it is done.
    Pass,
    /// Nothing to schedule (a drop, or a worker already filled): costs the fixed part,
    /// and its effect (if any) is applied at once.
    Light,
}

/// One group's serial scheduler: a FIFO backlog of events and the event in service.
#[derive(Debug, Clone)]
pub struct SerialScheduler<E> {
    backlog: VecDeque<E>,
    /// The event being handled and when its handling ends.
    current: Option<(E, Instant)>,
    /// When the scheduler is free of everything started so far.
    free_at: Instant,
    /// Nanoseconds spent handling events.
    busy: u64,
    /// Events handled.
    handled: u64,
    /// The instant a timer was last asked for.
    armed: Option<Instant>,
}

impl<E> Default for SerialScheduler<E> {
    fn default() -> Self {
        Self { backlog: VecDeque::new(), current: None, free_at: 0, busy: 0, handled: 0, armed: None }
    }
}

/// What [`SerialScheduler::next`] hands the caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<E> {
    /// Handle this event now: its (pass) handling has ended, or it is light.
    Handle(E),
    /// Nothing more until this instant (set a timer for it).
    WaitUntil(Instant),
    /// The backlog is empty and nothing is in service.
    Idle,
}

impl<E> SerialScheduler<E> {
    /// Queue an event.
    pub fn push(&mut self, event: E) {
        self.backlog.push_back(event);
    }

    /// Events waiting (not counting the one in service).
    pub fn backlog(&self) -> usize {
        self.backlog.len()
    }

    /// Every event not yet handled, the one in service first (a re-plan moves them).
    pub fn take_all(&mut self) -> Vec<E> {
        let mut out: Vec<E> = self.current.take().map(|(e, _)| e).into_iter().collect();
        out.extend(self.backlog.drain(..));
        out
    }

    /// Whether a timer for `at` still has to be asked for (false when one was already).
    pub fn arm(&mut self, at: Instant) -> bool {
        let fresh = self.armed != Some(at);
        self.armed = Some(at);
        fresh
    }

    /// Nanoseconds spent handling events, and how many were handled.
    pub fn load(&self) -> (u64, u64) {
        (self.busy, self.handled)
    }

    /// The next thing to do at `now`. `classify(event, start)` says how the event would
    /// be handled if started at `start`; `cost(handling)` what that costs. A light event
    /// is released at once (its start may lie a little ahead of `now` when the backlog
    /// is long: its effect, a drop, cannot depend on the wait); a pass is released when
    /// its handling ends.
    pub fn next(&mut self, now: Instant, mut classify: impl FnMut(&E, Instant) -> Handling, cost: impl Fn(Handling) -> Instant) -> Step<E> {
        if let Some((_, done)) = &self.current {
            if *done > now {
                return Step::WaitUntil(*done);
            }
            let (event, _) = self.current.take().expect("in service");
            return Step::Handle(event);
        }
        let Some(event) = self.backlog.pop_front() else { return Step::Idle };
        let start = self.free_at.max(now);
        let handling = classify(&event, start);
        let price = cost(handling);
        self.free_at = start + price;
        self.busy += price;
        self.handled += 1;
        match handling {
            Handling::Light => Step::Handle(event),
            Handling::Pass => {
                let done = self.free_at;
                if done <= now {
                    Step::Handle(event)
                } else {
                    self.current = Some((event, done));
                    Step::WaitUntil(done)
                }
            }
        }
    }
}
