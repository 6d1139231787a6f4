//! Worker starts as they really happened, against what the engine predicted.
//!
//! The engine seats every new worker on a host and predicts from its model of the
//! hosts' parameter caches whether it starts warm (`yardmaster_engine::hosts`); the
//! policy plans with that prediction (QUART places replicas where their parameters
//! are cached for exactly this). The worker's own `Ready` then says where it ran (the
//! connection it came from) and whether its session came from the model cache of the
//! process that runs it (a node's, or the controller's) and how long it took. This log
//! keeps both, so that a policy's placement and its warm starts can be checked live
//! (`yardmaster_worker_starts_total`, labelled with the host, the real start kind and
//! the predicted one).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Starts of one kind on one host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartCount {
    /// The host the workers ran on (engine host id).
    pub host: u32,
    /// The engine predicted a warm start.
    pub predicted_warm: bool,
    /// The start was warm (the session came from the model cache).
    pub warm: bool,
    /// How many.
    pub starts: u64,
    /// Their start time together, seconds.
    pub seconds: f64,
}

/// The log: predictions waiting for their worker's `Ready`, and the counts so far.
#[derive(Debug, Default)]
pub struct StartLog {
    /// Worker → (host it was seated on, predicted warm).
    predicted: HashMap<u32, (u32, bool)>,
    /// (host, predicted warm, warm) → (starts, seconds).
    counts: BTreeMap<(u32, bool, bool), (u64, f64)>,
    /// Workers that started on another host than the one they were seated on.
    misplaced: u64,
}

impl StartLog {
    /// The engine seated `worker` on `host`, predicting a warm start or not.
    pub fn seated(&mut self, worker: u32, host: u32, warm: bool) {
        self.predicted.insert(worker, (host, warm));
    }

    /// `worker` is ready on `host`, warm or cold, after `took`. A worker the log was
    /// not told about (none should be) counts as predicted cold on the host it ran on.
    pub fn ready(&mut self, worker: u32, host: u32, warm: bool, took: Duration) {
        let (seated, predicted) = self.predicted.remove(&worker).unwrap_or((host, false));
        if seated != host {
            self.misplaced += 1;
        }
        let entry = self.counts.entry((host, predicted, warm)).or_default();
        entry.0 += 1;
        entry.1 += took.as_secs_f64();
    }

    /// `worker` will not start (it failed, or retired first).
    pub fn forget(&mut self, worker: u32) {
        self.predicted.remove(&worker);
    }

    /// The counts, by host, predicted and real kind.
    pub fn counts(&self) -> Vec<StartCount> {
        self.counts
            .iter()
            .map(|(&(host, predicted_warm, warm), &(starts, seconds))| StartCount { host, predicted_warm, warm, starts, seconds })
            .collect()
    }

    /// Workers that started on another host than the engine seated them on.
    pub fn misplaced(&self) -> u64 {
        self.misplaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_counted_by_host_with_the_prediction_beside_what_happened() {
        let mut log = StartLog::default();
        log.seated(1, 2, false);
        log.seated(2, 2, true);
        log.seated(3, 1, true);
        log.seated(4, 1, false);
        log.ready(1, 2, false, Duration::from_millis(300));
        log.ready(2, 2, true, Duration::from_millis(20));
        log.ready(3, 1, false, Duration::from_millis(250)); // predicted warm, was cold
        log.forget(4);
        log.ready(4, 3, false, Duration::from_millis(100)); // unknown by then: as it ran
        let counts = log.counts();
        let find = |host, predicted_warm, warm| {
            counts.iter().find(|c| (c.host, c.predicted_warm, c.warm) == (host, predicted_warm, warm)).copied()
        };
        assert_eq!(find(2, false, false).map(|c| c.starts), Some(1));
        assert!((find(2, true, true).unwrap().seconds - 0.02).abs() < 1e-9);
        assert_eq!(find(1, true, false).map(|c| c.starts), Some(1), "a wrong prediction shows");
        assert_eq!(find(3, false, false).map(|c| c.starts), Some(1));
        assert_eq!(counts.len(), 4);
        assert_eq!(log.misplaced(), 0);
        log.seated(5, 1, true);
        log.ready(5, 2, true, Duration::ZERO);
        assert_eq!(log.misplaced(), 1);
    }
}
