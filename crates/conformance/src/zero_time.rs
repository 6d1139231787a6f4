//! The check's third scenario, *stages that take no time*: a pipeline whose entry
//! stage, whose fan-out point and whose sink are pseudo stages with a zero latency
//! profile — as Loki's applications have a `source` root and a `sink` — around two
//! real tasks, under a light, steady load.
//!
//! A policy that divides by a stage's latency (a throughput `batch / latency`, a
//! budget split in proportion to latencies, a batch sized by `budget / latency`) meets
//! a zero there: in integer arithmetic a trap, which the check reports as a fault; in
//! floating point an infinity or a NaN that ends up in an action the host rejects, or
//! in a decision that drops what it should serve. So besides the checks of every
//! scenario (no fault, no rejected action, no request lost, deterministic), this one
//! asks that at least [`MIN_ON_TIME`] of its requests end on time: the load is a small
//! fraction of what the cluster serves, and the SLO several times the path's latency,
//! so a policy that serves the real tasks at all meets it.

use yardmaster_engine::{Pipeline, Submission};

use super::scripted::MS;
use super::CheckOptions;

/// The pipeline: `source` → `detect` → `split` → {`classify`, `faces`} → `sink`;
/// `source`, `split` and `sink` take no time (their one variant's profile is zero,
/// written both ways a file may write it: linear and measured points).
const PIPELINE: &str = r#"
name = "zero-time"
slo_ms = 150
max_workers = 12

[[stage]]
name = "source"
successors = ["detect"]
max_batch = 32
[[stage.variant]]
name = "source"
alpha_ms = 0.0
beta_ms = 0.0
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "detect"
successors = ["split"]
max_batch = 8
replicas = 2
max_replicas = 4
[[stage.variant]]
name = "detect"
alpha_ms = 1.0
beta_ms = 4.0
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "split"
successors = ["classify", "faces"]
max_batch = 32
[[stage.variant]]
name = "split"
profile_ms = [[1, 0.0, 0.0], [32, 0.0, 0.0]]
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "classify"
successors = ["sink"]
max_batch = 8
replicas = 2
max_replicas = 4
[[stage.variant]]
name = "classify"
alpha_ms = 0.5
beta_ms = 2.0
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "faces"
successors = ["sink"]
max_batch = 8
replicas = 1
max_replicas = 2
[[stage.variant]]
name = "faces"
alpha_ms = 0.5
beta_ms = 3.0
cold_start_ms = 50
warm_start_ms = 50

[[stage]]
name = "sink"
max_batch = 32
[[stage.variant]]
name = "sink"
alpha_ms = 0.0
beta_ms = 0.0
cold_start_ms = 50
warm_start_ms = 50
"#;

/// The stages that take no time, by name.
pub const ZERO_TIME_STAGES: [&str; 3] = ["source", "split", "sink"];

/// The share of the requests that must end on time (see the module's documentation).
pub const MIN_ON_TIME: f64 = 0.9;

/// Steady arrivals are spread over this long from the start.
pub const ARRIVALS_FOR: u64 = 3_000 * MS;

/// The scenario's pipeline.
pub fn pipeline() -> Pipeline {
    yardmaster_formats::pipeline::from_toml(PIPELINE, "the zero-time cluster").expect("the zero-time cluster is valid")
}

/// The requests: `options.requests` (at least 40) evenly spread over
/// [`ARRIVALS_FOR`], jittered by the seed — about 80 a second by default, where the
/// cluster serves more than ten times that.
pub fn arrivals(options: &CheckOptions) -> Vec<Submission> {
    let slo = pipeline().streams[0].slo_ns;
    let total = options.requests.max(40) as u64;
    let gap = ARRIVALS_FOR / total;
    let mut rng = options.seed.max(1);
    (0..total)
        .map(|i| {
            let (state, value) = yardmaster_sdk::splitmix64(rng);
            rng = state;
            let sent_at = i * gap + value % gap.max(1);
            Submission {
                stream: 0,
                sent_at,
                deadline: sent_at + slo,
                priority: 0,
                input_size: 64,
                expected_tokens: 0,
                ..Submission::default()
            }
        })
        .collect()
}
