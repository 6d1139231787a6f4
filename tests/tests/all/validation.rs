//! Invalid actions are rejected whole and counted; valid ones in the same answer stand.

use yardmaster::conformance::scripted::Fate;
use yardmaster::policy::{FailureMode, Limits, Mode};
use yardmaster_policy_artifacts::fixtures;
use yardmaster_tests::{fixture, loader, params, Driver};

#[test]
fn invalid_actions_are_rejected_and_counted_and_the_valid_drop_applies() {
    let loader = loader(Mode::Serve, Limits::default());
    let module = fixture(&loader, fixtures::HOSTILE);
    let mut driver = Driver::start(&loader, module, params(&[("mode", "invalid"), ("after", "2")]), FailureMode::FailOpen);
    driver.send(1, 3); // held
    let output = driver.send(4, 1).clone(); // answers with the invalid actions
    assert!(output.fault.is_none(), "invalid actions are not a fault: {:?}", output.fault);
    let reasons: Vec<&str> = output.rejected.iter().map(|(_, r)| r.kind()).collect();
    assert_eq!(
        reasons,
        vec!["unknown-request", "unknown-worker", "batch-over-limit", "replicas-out-of-range", "bad-threads", "request-reused",]
    );
    assert_eq!(output.actions.len(), 1, "only the valid drop is applied");
    let stats = driver.arm().stats();
    assert_eq!(stats.rejected_total(), 6);
    assert_eq!(stats.rejected.get("unknown-request"), Some(&1));
    assert_eq!(stats.accepted.get("drop"), Some(&1));
    // The dropped request ended once; the others are still held.
    assert_eq!(driver.count(Fate::Dropped), 1);
    assert_eq!(driver.arm().ledger().len(), 3);
    assert!(driver.violations().is_empty());
}
