//! Fixtures for the tests of policies and helpers (feature `testing`): the small
//! configurations, requests and frame reports that tests build by hand again and
//! again. Not for policies themselves; enable the feature only in `dev-dependencies`.
//!
//! Every fixture fills the fields a test rarely cares about with neutral values
//! (accuracy 1, fan-out 1, no memory, no tags); a test that needs another value sets
//! that field on the returned struct.

use crate::{
    Action, Config, DeviceKind, Duration, FrameReport, Instant, LatencyPoint, Request, RequestId, SequenceState, Stage, StageKind, Variant,
    VariantId, Worker, WorkerId,
};

/// Nanoseconds per millisecond.
pub const MS: u64 = 1_000_000;

/// A variant whose batch latency is exactly linear, `α·b + β` nanoseconds (mean and
/// tail alike), profiled at batch sizes 1 and `max_batch`.
pub fn linear_variant(id: VariantId, name: &str, alpha: u64, beta: u64, max_batch: u32) -> Variant {
    let point = |batch: u32| {
        let latency = alpha * batch as u64 + beta;
        LatencyPoint { batch, mean: latency, tail: latency }
    };
    Variant { id, name: name.into(), accuracy: 1.0, profile: vec![point(1), point(max_batch)], memory_bytes: 0, fan_out: 1.0 }
}

/// Variant 0, `"v"`, whose batches take `latency` whatever their size.
pub fn constant_variant(latency: Duration) -> Variant {
    Variant {
        id: 0,
        name: "v".into(),
        accuracy: 1.0,
        profile: vec![LatencyPoint { batch: 1, mean: latency, tail: latency }],
        memory_bytes: 0,
        fan_out: 1.0,
    }
}

/// A GPU worker `id` of `stage` running variant 0 with one thread and no memory.
pub fn gpu_worker(id: WorkerId, stage: u32) -> Worker {
    Worker { id, stage, variant: 0, device: DeviceKind::Gpu, threads: 1, memory_bytes: 0, host: 0, slot: 0 }
}

/// A cluster of one batch stage (id 0, `"infer"`) offering `variants`, batches of at
/// most `max_batch`, and `workers` GPU workers (ids from 0) fixed at that many
/// replicas. No streams, no parameters, a 1 s tick, seed 1, time zero.
pub fn one_stage(variants: Vec<Variant>, max_batch: u32, workers: u32) -> Config {
    Config {
        arm: "test".into(),
        stages: vec![Stage {
            id: 0,
            name: "infer".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants,
            max_batch,
            min_replicas: workers,
            max_replicas: workers,
        }],
        workers: (0..workers).map(|id| gpu_worker(id, 0)).collect(),
        streams: vec![],
        params: vec![],
        tick_interval: 1_000 * MS,
        max_workers: workers,
        seed: 1,
        now: 0,
        hosts: Vec::new(),
    }
}

/// Request `id` of `stream` at stage 0, sent and arrived at `at`, due at `deadline`;
/// one item; no input size, token hint, requeues, tags or sequence.
pub fn request(id: RequestId, stream: u32, at: Instant, deadline: Instant) -> Request {
    Request {
        id,
        origin: id,
        stage: 0,
        stream,
        sent_at: at,
        arrived_at: at,
        deadline,
        priority: 0,
        input_size: 0,
        expected_tokens: 0,
        requeues: 0,
        tags: None,
        items: 1,
        correlation: None,
    }
}

/// A frame report of `worker` (`steps` decode steps over `duration`): one sequence
/// per `(id, prompt tokens, generated tokens, finished)`, each holding
/// `kv_per_token` bytes of KV cache per token; no capacity reported.
pub fn frame_report(
    worker: WorkerId,
    steps: u32,
    duration: Duration,
    sequences: &[(RequestId, u32, u32, bool)],
    kv_per_token: u64,
) -> FrameReport {
    FrameReport {
        worker,
        steps,
        duration,
        sequences: sequences
            .iter()
            .map(|&(id, prompt, generated, finished)| SequenceState {
                id,
                generated,
                kv_bytes: (prompt + generated) as u64 * kv_per_token,
                finished,
            })
            .collect(),
        kv_capacity: 0,
    }
}

/// Every dispatch in `actions`, in order, as (worker, requests).
pub fn dispatches(actions: &[Action]) -> Vec<(WorkerId, Vec<RequestId>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch(d) => Some((d.worker, d.requests.clone())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LatencyTable;

    #[test]
    fn linear_variant_is_linear_between_its_two_points() {
        let config = one_stage(vec![linear_variant(0, "a", 10, 100, 8)], 8, 2);
        let table = LatencyTable::from_config(&config);
        assert_eq!(table.mean(0, 0, 1), Some(110));
        assert_eq!(table.mean(0, 0, 4), Some(140));
        assert_eq!(table.mean(0, 0, 8), Some(180));
        assert_eq!(config.workers.len(), 2);
        assert_eq!((config.stages[0].min_replicas, config.stages[0].max_replicas), (2, 2));
    }

    #[test]
    fn frame_report_counts_prompt_and_generated_tokens() {
        let report = frame_report(3, 10, 100, &[(1, 5, 2, false), (2, 1, 1, true)], 1000);
        assert_eq!(report.worker, 3);
        let kv: Vec<u64> = report.sequences.iter().map(|s| s.kv_bytes).collect();
        assert_eq!(kv, vec![7000, 2000]);
        assert!(report.sequences[1].finished);
    }
}
