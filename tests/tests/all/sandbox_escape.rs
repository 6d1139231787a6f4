//! A policy cannot reach the filesystem, the environment, the clock or stdout: the
//! WASI imports Rust's standard library links in for them are accepted at load (every
//! Rust policy carries them) and bound to stubs that trap when called. Each attempt of
//! the `escape` fixture must end its call as a trap — not as an error the policy could
//! read, nor as a success — and the arm must fall back with every held request replayed
//! and served once.

use yardmaster::conformance::scripted::Fate;
use yardmaster::policy::{ArmState, FailureMode, Limits, Mode, PolicyFault};
use yardmaster_policy_artifacts::fixtures;
use yardmaster_tests::{fixture, loader, params, Driver};

/// Start the fixture with `probe`, let it hold 12 requests, then let it try on the
/// next call; returns the driver after that call.
fn attempt(probe: &str) -> Driver {
    let loader = loader(Mode::Serve, Limits::default());
    let module = fixture(&loader, fixtures::ESCAPE);
    let mut driver = Driver::start(&loader, module, params(&[("probe", probe), ("after", "3")]), FailureMode::FailOpen);
    driver.send(1, 6);
    driver.send(7, 6);
    assert_eq!(driver.arm().ledger().len(), 12, "{probe}: the fixture holds everything until it tries");
    assert!(driver.outputs().iter().all(|o| o.fault.is_none()), "{probe}: no fault before the attempt");
    driver.send(13, 2);
    driver
}

fn assert_contained(probe: &str, interface: &str) {
    let mut driver = attempt(probe);
    let output = driver.last().clone();
    match &output.fault {
        Some(PolicyFault::Trap(message)) => {
            eprintln!("{probe}: {message}");
            assert!(message.contains(interface), "{probe}: the trap names {interface}: {message}");
        }
        other => panic!("{probe}: expected a trap, got {other:?} (actions {:?})", output.actions),
    }
    assert_eq!(driver.arm().state(), ArmState::Fallback, "{probe}");
    assert_eq!(driver.arm().stats().replayed, 14, "{probe}: every held request went to the fallback");
    driver.settle(10_000);
    assert!(driver.unfinished().is_empty(), "{probe}: unfinished {:?}", driver.unfinished());
    assert!(driver.violations().is_empty(), "{probe}: {:?}", driver.violations());
    assert_eq!(driver.count(Fate::Completed { late: false }), 14, "{probe}");
}

#[test]
fn the_fixture_serves_nothing_but_holds_when_it_tries_nothing() {
    // The probes below are what makes the calls trap, not the fixture itself.
    let driver = attempt("none");
    assert!(driver.outputs().iter().all(|o| o.fault.is_none()));
    assert_eq!(driver.arm().state(), ArmState::Primary);
    assert_eq!(driver.arm().ledger().len(), 14);
}

#[test]
fn reading_a_file_traps_and_the_arm_falls_back() {
    assert_contained("read-file", "wasi:filesystem");
}

#[test]
fn writing_a_file_traps_and_the_arm_falls_back() {
    assert_contained("write-file", "wasi:filesystem");
}

#[test]
fn listing_a_directory_traps_and_the_arm_falls_back() {
    assert_contained("list-dir", "wasi:filesystem");
}

#[test]
fn reading_the_environment_traps_and_the_arm_falls_back() {
    assert_contained("env", "wasi:cli/environment");
}

#[test]
fn reading_the_wall_clock_traps_and_the_arm_falls_back() {
    assert_contained("clock", "wasi:clocks/wall-clock");
}

#[test]
fn printing_traps_and_the_arm_falls_back() {
    assert_contained("stdout", "wasi:cli/stdout");
}
