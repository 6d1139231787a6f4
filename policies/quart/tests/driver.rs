//! QUART driven natively through the SDK's `Driver`, event by event: a burst at the
//! entry stage makes it the only key stage and the only one scaled; requests run in
//! arrival order one at a time; new workers get the stage's cores; the new replicas
//! are placed warm where the stage's parameters are cached, then where they keep the
//! most headroom (spec property 8, through the control loop).

use policy_quart::Quart;
use yardmaster_sdk::testing::constant_variant;
use yardmaster_sdk::{
    Action, CachedParameters, Config, DeviceKind, Driver, Event, HostInfo, HostStats, NullHost, Param, Request, Snapshot, Stage, StageKind,
    StageStats, Stream, Worker,
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
        workers: (0..3)
            .map(|id| Worker { id, stage: id, variant: 0, device: DeviceKind::Gpu, threads: 2, memory_bytes: 0, host: 0, slot: 0 })
            .collect(),
        streams: vec![Stream { id: 0, name: "s".into(), entry: 0, slo: 150 * MS }],
        // The paper's never-dropping FIFO: the burst below is delivered 2 s after its
        // first arrivals, which the default (`drop_unreachable`) would drop unserved.
        params: vec![Param { key: "drop_unreachable".into(), value: "false".into() }],
        tick_interval: 2_000 * MS,
        max_workers: 24,
        seed: 1,
        now: 0,
        hosts: Vec::new(),
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
        hosts: Vec::new(),
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
    let added = Worker { id: 10, stage: 0, variant: 0, device: DeviceKind::Gpu, threads: 4, memory_bytes: 0, host: 0, slot: 0 };
    let actions = driver.handle(3_000 * MS, vec![Event::WorkerAdded(added), Event::WorkerIdle(10)]);
    assert!(actions.iter().any(|a| matches!(a, Action::SetThreads(t) if t.worker == 10 && t.threads == 2)));
    assert!(actions.iter().any(|a| matches!(a, Action::Dispatch(d) if d.worker == 10 && d.requests == vec![1])));
}

/// Four servers of 4 GPUs; workers 0–2 (stages 0–2) on servers 0–2; stage 0's
/// parameters cached on server 0 only.
fn four_servers() -> (Config, Vec<HostStats>) {
    let mut config = config();
    config.hosts = (0..4).map(|id| HostInfo { id, name: format!("gpu-{id}"), slots: 4, cache_capacity: 1 << 40 }).collect();
    config.max_workers = 16;
    for worker in &mut config.workers {
        worker.host = worker.id;
    }
    let hosts = (0..4u32)
        .map(|id| HostStats {
            id,
            free_slots: if id < 3 { 3 } else { 4 },
            replicas: (0..3).map(|stage| u32::from(stage == id)).collect(),
            cache_used: 0,
            cache_capacity: 1 << 40,
            cached: if id == 0 { vec![CachedParameters { stage: 0, variant: 0, bytes: 1 << 30, last_used: 0 }] } else { vec![] },
        })
        .collect();
    (config, hosts)
}

#[test]
fn new_key_replicas_go_warm_where_their_parameters_are_cached_then_where_headroom_is_largest() {
    let (config, hosts) = four_servers();
    let (mut driver, _) = Driver::<Quart>::new(config, Box::new(NullHost::default())).unwrap();
    let mut events: Vec<Event> = (0..3).map(Event::WorkerIdle).collect();
    events.extend((0..400u64).map(|id| Event::Arrival(request(id, 0, id * 5 * MS))));
    driver.handle(2_000 * MS, events);
    let mut tick = snapshot(2_000 * MS, [1, 1, 1]);
    tick.hosts = hosts;
    let actions = driver.handle(2_000 * MS, vec![Event::Tick(tick)]);
    let scales: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Scale(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(scales.len(), 1, "{scales:?}");
    let scale = scales[0];
    assert_eq!(scale.stage, 0);
    let new = scale.replicas - 1;
    assert!(new >= 4, "{scale:?}");
    let hosts: Vec<u32> = scale.placement.iter().map(|p| p.host).collect();
    assert_eq!(hosts.len() as u32, new, "every new replica is placed: {hosts:?}");
    // Server 0 caches stage 0 and has 3 free GPUs: those starts are warm. After that
    // (13 free of 16 at first, low contention) the server with the most free GPUs,
    // server 3, which then caches the stage too.
    assert_eq!(&hosts[..3], &[0, 0, 0], "{hosts:?}");
    assert_eq!(hosts[3], 3, "{hosts:?}");
    assert!(hosts[3..].iter().take(4).all(|&h| h == 3), "{hosts:?}");
}
