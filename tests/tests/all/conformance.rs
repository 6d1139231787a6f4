//! The conformance harness passes the shipped policies and fails broken ones.

use yardmaster::conformance::{check_component, check_native, CheckOptions};
use yardmaster_policy_artifacts::{fixtures, SHIPPED};
use yardmaster_tests::params;

#[test]
fn every_shipped_policy_conforms() {
    let options = CheckOptions::default();
    for artifact in SHIPPED {
        let report = check_component(artifact.name, artifact.bytes, &options).expect("loads");
        assert!(report.passed(), "{}", report.render());
        assert_eq!(report.deterministic, Some(true));
        let o = &report.outcomes;
        assert_eq!(o.on_time + o.late + o.dropped + o.cancelled + o.refused, o.requests);
        // Every event kind of the contract was exercised.
        let kinds = ["arrival", "tick"];
        for kind in kinds {
            assert!(report.costs.contains_key(kind), "{kind} missing: {}", report.render());
        }
        assert!(report.costs.values().all(|c| c.fuel > 0 || c.calls == 0), "fuel measured");
    }
}

#[test]
fn edf_drops_what_cannot_finish_and_fifo_drops_nothing() {
    let options = CheckOptions::default();
    let edf = SHIPPED.iter().find(|a| a.name == "edf").unwrap();
    let fifo = SHIPPED.iter().find(|a| a.name == "fifo").unwrap();
    let edf = check_component("edf", edf.bytes, &options).unwrap();
    let fifo = check_component("fifo", fifo.bytes, &options).unwrap();
    assert_eq!(fifo.outcomes.dropped, 0);
    assert!(fifo.outcomes.late > 0, "the script has infeasible deadlines");
    assert!(edf.outcomes.dropped > 0);
    assert_eq!(edf.outcomes.late, 0, "edf drops rather than finishing late here");
}

#[test]
fn the_native_fallback_conforms() {
    let report = check_native::<policy_fifo::Fifo>("fifo", &CheckOptions::default());
    assert!(report.passed(), "{}", report.render());
}

#[test]
fn a_policy_that_holds_requests_forever_fails_with_them_listed() {
    let bytes = std::fs::read(fixtures::HOSTILE).unwrap();
    let options = CheckOptions { params: params(&[("mode", "hold")]), ..CheckOptions::default() };
    let report = check_component("hostile", &bytes, &options).unwrap();
    assert!(!report.passed());
    assert!(!report.lost.is_empty());
    assert!(report.render().contains("lost requests"), "{}", report.render());
}

#[test]
fn a_policy_with_invalid_actions_fails() {
    let bytes = std::fs::read(fixtures::HOSTILE).unwrap();
    let options = CheckOptions { params: params(&[("mode", "invalid")]), ..CheckOptions::default() };
    let report = check_component("hostile", &bytes, &options).unwrap();
    assert!(!report.passed());
    assert!(!report.rejected.is_empty());
}

#[test]
fn a_looping_policy_fails_with_the_fault_reported() {
    let bytes = std::fs::read(fixtures::HOSTILE).unwrap();
    let options = CheckOptions { params: params(&[("mode", "spin"), ("after", "5")]), ..CheckOptions::default() };
    let report = check_component("hostile", &bytes, &options).unwrap();
    assert!(!report.passed());
    assert!(report.faults.iter().any(|f| f.contains("fuel")), "{}", report.render());
    // Even so, the fallback finished every request.
    assert!(report.lost.is_empty(), "{}", report.render());
}
