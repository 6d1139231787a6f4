//! Hostile policies are contained: each is stopped within its bound, its arm applies
//! the failure mode, and no request is lost or handled twice.

use std::time::Duration;

use yardmaster::conformance::scripted::{Fate, MS};
use yardmaster::policy::{ArmState, FailureMode, Limits, Mode, PolicyFault};
use yardmaster_policy_artifacts::fixtures;
use yardmaster_tests::{fixture, loader, params, Driver};

/// Start the hostile fixture, let it hold 12 requests over two calls, then trigger its
/// misbehaviour on the next call; returns the driver after that call. (`after=3`: the
/// replay of the idle workers right after `init` is the instance's first call.)
fn misbehave(mode: Mode, limits: Limits, how: &str, failure: FailureMode) -> Driver {
    let loader = loader(mode, limits);
    let module = fixture(&loader, fixtures::HOSTILE);
    let mut driver = Driver::start(&loader, module, params(&[("mode", how), ("after", "3")]), failure);
    // Calls 2 and 3: 6 requests each, all held.
    driver.send(1, 6);
    driver.send(7, 6);
    assert_eq!(driver.arm().ledger().len(), 12, "the hostile policy holds everything");
    assert!(driver.outputs().iter().all(|o| o.fault.is_none()));
    // Call 3 misbehaves.
    driver.send(13, 2);
    driver
}

/// After the fallback took over, every request completes exactly once.
fn assert_none_lost(driver: &mut Driver) {
    driver.settle(10_000);
    assert!(driver.unfinished().is_empty(), "unfinished requests: {:?}", driver.unfinished());
    assert!(driver.violations().is_empty(), "{:?}", driver.violations());
    assert_eq!(driver.count(Fate::Completed { late: false }), 14);
    assert_eq!(driver.arm().ledger().len(), 0);
}

#[test]
fn an_endless_loop_is_stopped_within_10ms_of_its_deadline_and_the_arm_falls_back() {
    let limits = Limits { event_deadline: Duration::from_millis(5), ..Limits::default() };
    let mut driver = misbehave(Mode::Serve, limits.clone(), "spin", FailureMode::FailOpen);
    let output = driver.last();
    assert_eq!(output.fault, Some(PolicyFault::Timeout(limits.event_deadline)));
    let longest = driver.arm().stats().max_call_time;
    assert!(
        longest <= limits.event_deadline + Duration::from_millis(10),
        "the looping call ran {longest:?}, deadline {:?}",
        limits.event_deadline
    );
    assert!(longest >= limits.event_deadline - Duration::from_millis(2), "stopped too early: {longest:?}");
    assert_eq!(driver.arm().state(), ArmState::Fallback);
    assert_eq!(driver.arm().stats().fallbacks, 1);
    assert_eq!(driver.arm().stats().replayed, 14, "all held requests replayed into the fallback");
    // The fallback dispatched in the same call: nothing waits for another event.
    assert!(!output.actions.is_empty());
    assert_none_lost(&mut driver);
}

#[test]
fn a_memory_bomb_is_stopped_at_the_cap_and_the_arm_falls_back() {
    // A generous deadline, so the memory cap is what stops it.
    let limits = Limits { memory_bytes: 16 << 20, event_deadline: Duration::from_secs(2), ..Limits::default() };
    let mut driver = misbehave(Mode::Serve, limits, "membomb", FailureMode::FailOpen);
    assert_eq!(driver.last().fault, Some(PolicyFault::OutOfMemory(16 << 20)));
    assert_eq!(driver.arm().state(), ArmState::Fallback);
    assert_none_lost(&mut driver);
}

#[test]
fn unbounded_recursion_is_contained() {
    let limits = Limits { event_deadline: Duration::from_secs(2), ..Limits::default() };
    let mut driver = misbehave(Mode::Serve, limits, "recurse", FailureMode::FailOpen);
    // A Rust guest keeps its stack in linear memory: running off its end is an
    // out-of-bounds access; a guest using the wasm stack hits the engine's stack limit.
    match &driver.last().fault {
        Some(PolicyFault::StackOverflow) => {}
        Some(PolicyFault::Trap(message)) => assert!(message.contains("out of bounds"), "{message}"),
        other => panic!("expected a stack fault, got {other:?}"),
    }
    assert_none_lost(&mut driver);
}

#[test]
fn a_panic_is_a_trap_and_the_arm_falls_back() {
    let mut driver = misbehave(Mode::Serve, Limits::default(), "trap", FailureMode::FailOpen);
    match &driver.last().fault {
        Some(PolicyFault::Trap(message)) => assert!(!message.is_empty()),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_none_lost(&mut driver);
}

#[test]
fn a_flood_of_actions_is_refused_whole() {
    let limits = Limits { max_actions: 10_000, event_deadline: Duration::from_secs(5), ..Limits::default() };
    let mut driver = misbehave(Mode::Serve, limits, "flood", FailureMode::FailOpen);
    assert_eq!(driver.last().fault, Some(PolicyFault::TooManyActions(200_000, 10_000)));
    assert_none_lost(&mut driver);
}

#[test]
fn fuel_stops_a_loop_deterministically_in_simulation() {
    let limits = Limits { event_fuel: 2_000_000, ..Limits::default() };
    let first = misbehave(Mode::Simulate, limits.clone(), "spin", FailureMode::FailOpen);
    let second = misbehave(Mode::Simulate, limits.clone(), "spin", FailureMode::FailOpen);
    assert_eq!(first.last().fault, Some(PolicyFault::OutOfFuel(2_000_000)));
    assert_eq!(first.arm().stats().fuel, second.arm().stats().fuel, "fuel use replays exactly");
    assert_eq!(first.outputs(), second.outputs(), "decisions replay exactly");
}

#[test]
fn fail_closed_refuses_held_and_new_requests_with_the_reason() {
    let mut driver = misbehave(Mode::Serve, Limits::default(), "trap", FailureMode::FailClosed);
    let output = driver.last().clone();
    assert_eq!(driver.arm().state(), ArmState::Closed);
    assert_eq!(output.refused.len(), 14, "every held request is handed back to fail");
    let reason = output.refusal.expect("a reason");
    assert!(reason.contains("closed") && reason.contains("trapped"), "{reason}");
    let later = driver.send(15, 3).clone();
    assert_eq!(later.refused, vec![15, 16, 17]);
    driver.settle(1_000);
    assert_eq!(driver.count(Fate::Refused), 17);
    assert!(driver.unfinished().is_empty());
    assert!(driver.violations().is_empty(), "{:?}", driver.violations());
}

#[test]
fn reload_starts_a_fresh_instance_then_backs_off_on_the_fallback() {
    // `after=3`: every fresh instance behaves for three calls (its replay is the first).
    let mut driver = misbehave(Mode::Serve, Limits::default(), "trap", FailureMode::Reload);
    assert_eq!(driver.arm().stats().reloads, 1);
    assert_eq!(driver.arm().state(), ArmState::Primary, "a fresh instance took over at once");
    assert_eq!(driver.arm().ledger().len(), 14, "the fresh instance holds the replayed requests");
    // The fresh instance faults on its fourth call: now the arm backs off.
    driver.send(15, 1);
    driver.send(16, 1);
    assert!(driver.last().fault.is_none());
    driver.send(17, 1);
    assert!(driver.last().fault.is_some());
    assert_eq!(driver.arm().state(), ArmState::Fallback);
    // After the back-off (1 s) the next call starts another fresh instance.
    driver.advance_to(driver.harness.now() + 1_100 * MS);
    driver.send(18, 1);
    assert_eq!(driver.arm().stats().reloads, 2);
    assert_eq!(driver.arm().state(), ArmState::Primary);
    assert!(driver.violations().is_empty(), "{:?}", driver.violations());
}

#[test]
fn a_trap_in_init_starts_the_arm_on_its_fallback() {
    let loader = loader(Mode::Serve, Limits::default());
    let module = fixture(&loader, fixtures::HOSTILE);
    let mut driver = Driver::start(&loader, module, params(&[("mode", "trap-init")]), FailureMode::FailOpen);
    assert!(matches!(driver.outputs()[0].fault, Some(PolicyFault::Trap(_))));
    assert_eq!(driver.arm().state(), ArmState::Fallback);
    driver.send(1, 5);
    driver.settle(1_000);
    assert_eq!(driver.count(Fate::Completed { late: false }), 5);
}

#[test]
fn an_init_error_is_reported_with_the_policys_reason() {
    let loader = loader(Mode::Serve, Limits::default());
    let module = fixture(&loader, fixtures::HOSTILE);
    let driver = Driver::start(&loader, module, params(&[("mode", "refuse-init")]), FailureMode::FailClosed);
    assert_eq!(driver.outputs()[0].fault, Some(PolicyFault::InitRefused("hostile policy refuses to start".into())));
    assert_eq!(driver.arm().state(), ArmState::Closed);
}

#[test]
fn a_bad_parameter_is_refused_at_init_with_the_key_named() {
    let loader = loader(Mode::Serve, Limits::default());
    let module = fixture(&loader, fixtures::HOSTILE);
    let driver = Driver::start(&loader, module, params(&[("after", "soon")]), FailureMode::FailClosed);
    match &driver.outputs()[0].fault {
        Some(PolicyFault::InitRefused(reason)) => assert!(reason.contains("`after`"), "{reason}"),
        other => panic!("expected an init refusal, got {other:?}"),
    }
}
