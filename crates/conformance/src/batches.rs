//! The check's fourth scenario, *client batches and sequences*: the check's cluster
//! ([`crate::scripted`]) as a Triton model repository with client batches and a
//! stateful model would load it. Vision requests carry one to four items (a client
//! batch's rows), and stateful sequences of [`SEQUENCE_STEPS`] steps each arrive
//! interleaved with them and with each other.
//!
//! Contract 0.3.0 shows a policy both: `request.items`, which a batch counts against
//! its stage's limit, and `request.correlation`, which binds a sequence's steps to the
//! worker holding its state. A policy on the SDK keeps both rules without trying
//! (`Ctx::dispatch`); a policy written without it must count items and follow a
//! sequence's worker itself. The checks are every scenario's: above all, no rejected
//! action (a batch over its limit in items, or a step sent away from its state, is
//! rejected) and no request lost (a request a policy believes it dispatched but the
//! host refused stays in the policy's hands until the host expires it). Besides, no
//! request may fail: at this light load, only a broken sequence would fail one.
//!
//! A policy built against a contract older than 0.3.0 cannot see either field, and the
//! host never gives it a client batch or a sequence step (each fails at once, naming
//! the policy's contract): for it the scenario is not applicable and passes with a note.

use yardmaster_engine::{Pipeline, SequenceStep, Submission};
use yardmaster_policy::contract::ITEMS_AND_SEQUENCES;

use super::scripted::{Harness, MS};
use super::{CheckOptions, Outcomes, ScenarioReport};

/// Judge a run beyond every scenario's checks: a policy older than
/// [`ITEMS_AND_SEQUENCES`] gets a note (the host gave it no batch and no step); for any
/// other no request may fail.
pub(crate) fn judge(harness: &Harness, outcomes: &Outcomes, report: &mut ScenarioReport) {
    if let Some(version) = harness.arm().contract_version().filter(|v| *v < ITEMS_AND_SEQUENCES) {
        report.notes.push(format!(
            "not applicable: the policy speaks contract {version}, which cannot see client batches or sequences (contract {ITEMS_AND_SEQUENCES} added them), so the host gave it none — {} of the requests failed at once naming its contract",
            outcomes.failed
        ));
        return;
    }
    if outcomes.failed > 0 {
        report.violations.push(format!(
            "{} of {} requests failed at a light load: a sequence's step run out of order or away from its state?",
            outcomes.failed, outcomes.requests
        ));
    }
}

/// Steps of each sequence.
pub const SEQUENCE_STEPS: u32 = 5;

/// Concurrent sequences.
pub const SEQUENCES: u64 = 4;

/// Gap between two steps of one sequence (a client sends its next step about when
/// the last has been answered).
pub const STEP_GAP: u64 = 60 * MS;

/// The largest client batch sent, in items (the `classify` stage's batch limit: a
/// request is never split, so none may carry more than a stage it passes takes).
pub const MAX_ITEMS: u32 = 4;

/// Requests of [`MAX_ITEMS`] items sent together at 500 ms: more items than a batch
/// takes, queued at once.
pub const BURST: u64 = 8;

/// The scenario's pipeline: the check's cluster.
pub fn pipeline() -> Pipeline {
    super::scripted::pipeline()
}

/// The requests, sorted by send time: `options.requests` (at least 40) vision requests
/// of 1 to [`MAX_ITEMS`] items over about a second, a burst of [`BURST`] requests of
/// [`MAX_ITEMS`] items at 500 ms, and [`SEQUENCES`] sequences of [`SEQUENCE_STEPS`]
/// steps, started 10 ms apart, a step every [`STEP_GAP`].
pub fn arrivals(options: &CheckOptions) -> Vec<Submission> {
    let slo = pipeline().streams[0].slo_ns;
    let total = options.requests.max(40) as u64;
    let gap = 1_000 * MS / total;
    let mut rng = options.seed.max(1);
    let mut next = || {
        let (state, value) = yardmaster_sdk::splitmix64(rng);
        rng = state;
        value
    };
    let mut requests: Vec<Submission> = (0..total)
        .map(|i| {
            let sent_at = i * gap + next() % gap.max(1);
            let items = 1 + (next() % u64::from(MAX_ITEMS)) as u32;
            Submission { stream: 0, sent_at, deadline: sent_at + slo, input_size: 64, items, ..Submission::default() }
        })
        .collect();
    let burst_at = 500 * MS;
    for _ in 0..BURST {
        requests.push(Submission {
            stream: 0,
            sent_at: burst_at,
            deadline: burst_at + slo,
            input_size: 64,
            items: MAX_ITEMS,
            ..Submission::default()
        });
    }
    for sequence in 0..SEQUENCES {
        for step in 0..SEQUENCE_STEPS {
            let sent_at = sequence * 10 * MS + u64::from(step) * STEP_GAP;
            let place = SequenceStep { id: 1_000 + sequence, start: step == 0, end: step + 1 == SEQUENCE_STEPS };
            requests.push(Submission {
                stream: 0,
                sent_at,
                deadline: sent_at + slo,
                input_size: 64,
                sequence: Some(place),
                ..Submission::default()
            });
        }
    }
    // Stable: requests sent at the same time keep their order (a sequence's steps too).
    requests.sort_by_key(|s| s.sent_at);
    requests
}
