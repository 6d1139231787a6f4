//! Native tests of the decision rules (the cross-language tests live in `tests/`).

use super::*;
use yardmaster_sdk::{Action, Config, DeviceKind, Driver, Event, LatencyPoint, NullHost, Param, Scale, Stage, StageStats, Variant, Worker};

/// One batch stage, max batch 4, latency 10 ms + 2 ms per request, two workers,
/// at most 3 replicas and 4 workers in the cluster.
fn config(params: &[(&str, &str)]) -> Config {
    Config {
        arm: "test".into(),
        stages: vec![Stage {
            id: 0,
            name: "s".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants: vec![Variant {
                id: 0,
                name: "v".into(),
                accuracy: 1.0,
                profile: (1..=4).map(|b| LatencyPoint { batch: b, mean: (10 + 2 * b as u64) * MS, tail: 0 }).collect(),
                memory_bytes: 0,
                fan_out: 1.0,
            }],
            max_batch: 4,
            min_replicas: 1,
            max_replicas: 3,
        }],
        workers: (0..2)
            .map(|id| Worker { id, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 })
            .collect(),
        streams: vec![],
        params: params.iter().map(|(k, v)| Param { key: k.to_string(), value: v.to_string() }).collect(),
        tick_interval: 1000 * MS,
        max_workers: 4,
        seed: 1,
        now: 0,
        hosts: Vec::new(),
    }
}

fn start(params: &[(&str, &str)]) -> Driver<DeadlineScaler> {
    Driver::new(config(params), Box::new(NullHost::new(0, 1))).expect("init").0
}

fn arrival(id: u64, at: Instant, deadline_ms: u64) -> Event {
    Event::Arrival(Request {
        id,
        origin: id,
        stage: 0,
        stream: 0,
        sent_at: at,
        arrived_at: at,
        deadline: at + deadline_ms * MS,
        priority: 0,
        input_size: 1,
        expected_tokens: 0,
        requeues: 0,
        tags: None,
        items: 1,
        correlation: None,
    })
}

fn tick(replicas: u32, starting: u32) -> Event {
    Event::Tick(Snapshot {
        at: 0,
        stages: vec![StageStats {
            stage: 0,
            queue_length: 0,
            queue_delay: 0,
            arrival_rate: 0.0,
            throughput: 0.0,
            mean_batch: 0.0,
            replicas,
            starting,
            batch_limit: 4,
        }],
        workers: vec![],
        host_memory_used: 0,
        host_memory_capacity: 0,
        hosts: Vec::new(),
    })
}

fn dispatched(actions: &[Action]) -> Vec<(WorkerId, Vec<RequestId>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch(d) => Some((d.worker, d.requests.clone())),
            _ => None,
        })
        .collect()
}

fn dropped(actions: &[Action]) -> Vec<RequestId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Drop(d) => Some(d.request),
            _ => None,
        })
        .collect()
}

#[test]
fn a_request_that_cannot_finish_alone_is_dropped_at_arrival() {
    let mut driver = start(&[]);
    // 11 ms: a batch of one takes 12 ms.
    let actions = driver.handle(0, vec![arrival(1, 0, 11), arrival(2, 0, 12)]);
    assert_eq!(dropped(&actions), vec![1]);
    assert!(dispatched(&actions).is_empty(), "no idle worker yet");
}

#[test]
fn idle_workers_take_the_earliest_deadlines_in_batches_the_earliest_can_afford() {
    let mut driver = start(&[]);
    driver.handle(0, vec![arrival(1, 0, 100), arrival(2, 0, 15), arrival(3, 0, 40), arrival(4, 0, 90)]);
    let actions = driver.handle(0, vec![Event::WorkerIdle(1), Event::WorkerIdle(0)]);
    // Request 2 (15 ms) binds: a batch of two takes 14 ms, of three 16 ms.
    assert_eq!(dispatched(&actions), vec![(0, vec![2, 3]), (1, vec![4, 1])]);
}

#[test]
fn a_head_that_became_unreachable_is_dropped_when_a_worker_looks_at_it() {
    let mut driver = start(&[]);
    driver.handle(0, vec![arrival(1, 0, 20), arrival(2, 0, 50)]);
    let actions = driver.handle(10 * MS, vec![Event::WorkerIdle(0)]);
    assert_eq!(dropped(&actions), vec![1]);
    assert_eq!(dispatched(&actions), vec![(0, vec![2])]);
}

#[test]
fn an_ended_request_is_forgotten() {
    let mut driver = start(&[]);
    driver.handle(0, vec![arrival(1, 0, 100), arrival(2, 0, 100)]);
    let actions = driver.handle(0, vec![Event::RequestEnded((1, EndReason::Cancelled)), Event::WorkerIdle(0)]);
    assert_eq!(dispatched(&actions), vec![(0, vec![2])]);
}

/// 2 replicas × 4 per batch every 18 ms is 444 requests per second of capacity; 90 % of
/// it is 400 per second.
fn scales(driver: &mut Driver<DeadlineScaler>, second: u64, arrivals: u64, replicas: u32, starting: u32) -> Vec<Action> {
    let start = second * 1000 * MS;
    let events: Vec<Event> = (0..arrivals).map(|i| arrival(second * 10_000 + i, start, 1)).collect();
    driver.handle(start, events);
    let actions = driver.handle(start + 999 * MS, vec![tick(replicas, starting)]);
    actions.into_iter().filter(|a| matches!(a, Action::Scale(_))).collect()
}

#[test]
fn sustained_overload_scales_up_once_per_streak_and_never_past_the_bounds() {
    let mut driver = start(&[]);
    let scale_to = |replicas| vec![Action::Scale(Scale { stage: 0, replicas, variant: None, placement: Vec::new() })];
    // 400 arrivals a second is not above 90 % of capacity; 401 is.
    assert!(scales(&mut driver, 0, 400, 2, 0).is_empty());
    assert!(scales(&mut driver, 1, 401, 2, 0).is_empty());
    assert!(scales(&mut driver, 2, 401, 2, 0).is_empty());
    assert_eq!(scales(&mut driver, 3, 401, 2, 0), scale_to(3));
    // The streak restarts; a replica still starting holds the next step back.
    assert!(scales(&mut driver, 4, 700, 2, 1).is_empty());
    assert!(scales(&mut driver, 5, 700, 2, 1).is_empty());
    assert!(scales(&mut driver, 6, 700, 2, 1).is_empty());
    // At the stage's maximum (3) nothing more is asked for.
    for second in 7..12 {
        assert!(scales(&mut driver, second, 2000, 3, 0).is_empty());
    }
}

#[test]
fn a_quiet_tick_breaks_the_streak_and_old_arrivals_leave_the_window() {
    let mut driver = start(&[("sustain-ticks", "2")]);
    assert!(scales(&mut driver, 0, 500, 2, 0).is_empty());
    assert!(scales(&mut driver, 1, 100, 2, 0).is_empty(), "the 500 of second 0 left the window");
    assert!(scales(&mut driver, 2, 500, 2, 0).is_empty());
    assert_eq!(scales(&mut driver, 3, 500, 2, 0).len(), 1);
}

#[test]
fn bad_parameters_refuse_the_policy() {
    let refuse = |params: &[(&str, &str)]| Driver::<DeadlineScaler>::new(config(params), Box::new(NullHost::new(0, 1))).err();
    assert!(refuse(&[("window-ms", "0")]).unwrap().contains("window-ms"));
    assert!(refuse(&[("overload-permille", "lots")]).unwrap().contains("overload-permille"));
    assert!(refuse(&[("sustain-ticks", "3")]).is_none());
}
