//! QUART driven natively through the SDK's `Driver`, event by event: a burst at the
//! entry stage makes it the only key stage and the only one scaled; requests run in
//! arrival order one at a time; new workers get the stage's cores.

use policy_quart::Quart;
use yardmaster_sdk::testing::constant_variant;
use yardmaster_sdk::{
    Action, Config, DeviceKind, Driver, Event, NullHost, Request, Snapshot, Stage, StageKind, StageStats, Stream, Worker,
};

const MS: u64 = 1_000_000;

fn config() -> Config {
    let stage = |id: u32| Stage {
        id,
        name: format!("s{id}"),
        kind: StageKind::Batch,
        successors: if id < 2 { vec![id + 1] } else { vec![] },
        predecessors: if id > 0 { vec![id - 1] } else { vec![] },
        variants: vec![constant_variant(20 * MS)],
        max_batch: 1,
        min_replicas: 1,
        max_replicas: 8,
    };
    Config {
        arm: "quart".into(),
        stages: (0..3).map(stage).collect(),
        workers: (0..3).map(|id| Worker { id, stage: id, variant: 0, device: DeviceKind::Gpu, threads: 2, memory_bytes: 0 }).collect(),
        streams: vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 150 * MS }],
        params: vec![],
        tick_interval: 2_000 * MS,
        max_workers: 24,
        seed: 1,
        now: 0,
    }
}

fn request(id: u64, stage: u32, at: u64) -> Request {
    Request { stage, ..yardmaster_sdk::testing::request(id, 0, at, at + 150 * MS) }
}

fn snapshot(at: u64, replicas: [u32; 3]) -> Snapshot {
    Snapshot {
        at,
        stages: (0..3)
            .map(|s| StageStats {
                stage: s,
                queue_length: 0,
                queue_delay: 0,
                arrival_rate: 0.0,
                throughput: 0.0,
                mean_batch: 1.0,
                replicas: replicas[s as usize],
                starting: 0,
                batch_limit: 1,
            })
            .collect(),
        workers: vec![],
        host_memory_used: 0,
        host_memory_capacity: 0,
    }
}

#[test]
fn a_burst_at_the_entry_scales_the_entry_stage_only_and_requests_run_in_order() {
    let (mut driver, init) = Driver::<Quart>::new(config(), Box::new(NullHost::default())).unwrap();
    assert!(init.is_empty(), "workers already have the base cores: {init:?}");
    let mut events: Vec<Event> = (0..3).map(Event::WorkerIdle).collect();
    // 400 requests within 2 s at the entry stage: far beyond one replica's 50/s.
    for id in 0..400u64 {
        events.push(Event::Arrival(request(id, 0, id * 5 * MS)));
    }
    let actions = driver.handle(2_000 * MS, events);
    let dispatched: Vec<&Action> = actions.iter().filter(|a| matches!(a, Action::Dispatch(_))).collect();
    assert_eq!(dispatched.len(), 1, "one idle replica at the entry stage, one request at a time");
    let Action::Dispatch(d) = dispatched[0] else { unreachable!() };
    assert_eq!(d.requests, vec![0], "the oldest first");
    let actions = driver.handle(2_000 * MS, vec![Event::Tick(snapshot(2_000 * MS, [1, 1, 1]))]);
    let scaled: Vec<(u32, u32)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Scale(s) => Some((s.stage, s.replicas)),
            _ => None,
        })
        .collect();
    assert_eq!(scaled.len(), 1, "{scaled:?}");
    assert_eq!(scaled[0].0, 0, "only the congested entry stage");
    assert!(scaled[0].1 >= 5, "enough for 200/s at 50/s per replica: {scaled:?}");
    // A new worker of the stage gets the stage's cores (the base 2: no action).
    let added = Worker { id: 10, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 4, memory_bytes: 0 };
    let actions = driver.handle(3_000 * MS, vec![Event::WorkerAdded(added), Event::WorkerIdle(10)]);
    assert!(actions.iter().any(|a| matches!(a, Action::SetThreads(t) if t.worker == 10 && t.threads == 2)));
    assert!(actions.iter().any(|a| matches!(a, Action::Dispatch(d) if d.worker == 10 && d.requests == vec![1])));
}
