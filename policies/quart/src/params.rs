//! QUART's parameters, each with the default of the specification (`§3.10`) unless its
//! doc says why not; every one can be overridden with `--param key=value`.

use yardmaster_sdk::{Ctx, Duration};

const NS: f64 = 1e9;

/// Most replicas per stage in the authors' code, and QUART's `r_max` where the cluster
/// names no size.
pub const AUTHORS_R_MAX: u32 = 8;

/// Every tunable constant of QUART.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Corrector period `Δt_c` (`control_period_s`, 2 s).
    pub control_period: Duration,
    /// How long after the first arrival the first control runs (`first_control_ms`,
    /// 100; 0 waits for the host's first tick, one tick interval after start, as the
    /// paper's periodic controller does). Not in the paper: a cluster started for
    /// other demand otherwise serves a tick interval before QUART can scale it.
    pub first_control: Duration,
    /// Smoother and CPU-release period `Δt_s` (`smooth_period_s`, 30 s).
    pub smooth_period: Duration,
    /// No reclaim within this long of a stage's last scale action (`cooldown_s`, 120 s).
    pub cooldown: Duration,
    /// PID gains (`kp`, `ki`, `kd`: 2.0, 0.3, 0.1).
    pub kp: f64,
    /// Integral gain.
    pub ki: f64,
    /// Derivative gain.
    pub kd: f64,
    /// Cap of the relative latency error (`e_max`, 4).
    pub e_max: f64,
    /// Cap of the error integral, in error·seconds (`i_max`, 10).
    pub i_max: f64,
    /// Fewest replicas per stage (`r_min`, 1).
    pub r_min: u32,
    /// Most replicas per stage (`r_max`; default the cluster's `max_workers`, so that
    /// only the stage's own bound and the free workers cap it, or 8 where the cluster
    /// names no size). The authors' code uses 8 (`r_max=8`), sized to their testbed:
    /// on Loki's traffic application it holds the detector under half the bound.
    pub r_max: u32,
    /// End-to-end latency budget split among stages (`slo_ctrl_ms`; default: the
    /// tightest stream SLO, which the presets set to 1.5 × the model's execution time).
    pub slo_ctrl_s: Option<f64>,
    /// Short arrival-rate window `W_λ` (`rate_window_s`, 5 s).
    pub rate_window: Duration,
    /// Long arrival-rate window `W_long` (`long_window_s`, 60 s).
    pub long_window: Duration,
    /// Inter-arrival-time window `W_cv` (`cv_window_s`, 60 s).
    pub cv_window: Duration,
    /// Samples needed for a measured CV (`min_cv_samples`, 20).
    pub min_cv_samples: usize,
    /// Floor of the buffer function β (`buffer_alpha`, 0.5).
    pub buffer_alpha: f64,
    /// CV at which β is halfway up (`cv_threshold`, 1.0).
    pub cv_threshold: f64,
    /// Squared CV of GPU service times in the CV propagation (`service_scv`, 0.05).
    pub service_scv: f64,
    /// Cores per replica the profile was taken with, `C₀` (`base_cores`, 2).
    pub base_cores: u32,
    /// Most cores per replica (`max_cores`, 16).
    pub max_cores: u32,
    /// Share of the service time that more cores do not shorten (`cpu_serial_share`, 0.34).
    pub cpu_serial_share: f64,
    /// How long a stage stays on the key-stage list after its last scale-up (`key_ttl_s`, 600 s).
    pub key_ttl: Duration,
    /// Run the Smoother (`smoother`, true): the `-smooth` ablation turns it off.
    pub smoother: bool,
    /// Run the CPU compensator (`cpu_compensation`, true): without it a reclaim must be
    /// feasible at `C₀` (the `-cpu` ablation).
    pub cpu_compensation: bool,
    /// Free-GPU fraction of the cluster at or above which contention is low, `θ_c`
    /// (`low_contention`, 0.25).
    pub low_contention: f64,
    /// Place new replicas (`placement`, true): cache-aware and dispersing (§3.7);
    /// false leaves placement to the host.
    pub placement: bool,
    /// Drop a request taken out of its stage's queue when it can no longer finish in
    /// time (`drop_unreachable`, true). Not in the paper, whose QUART never drops
    /// (`false`): past capacity its FIFO queues then grow until nearly every request
    /// is late (docs/quart.md, "Past capacity").
    pub drop_unreachable: bool,
    /// With `drop_unreachable`: batch durations (at each stage's batch limit) held back
    /// for every later stage on the longest downstream path (`downstream_reserve`, 2: a
    /// wait for one batch and the batch itself).
    pub downstream_reserve: f64,
    /// Cap each stage's batch limit at the batch that serves the most requests per
    /// second within the stage's share of the SLO — the largest that fits, unless a
    /// smaller one serves more (`fit_batches`, true; the same split as the per-stage
    /// targets). Not in the paper, which runs the configured batch sizes (`false`): a
    /// pipeline whose largest batch alone exceeds the SLO (Loki's traffic application
    /// allows 64 frames, 959 ms at its detector, under a 250 ms SLO) otherwise has
    /// every request unreachable.
    pub fit_batches: bool,
    /// With `fit_batches`, a stage's batch may also take this fraction of its share of
    /// the SLO along the longest path through it, when that is more than its target
    /// (`path_batch_fraction`, 0.75; 0 keeps the target). The targets split the SLO
    /// over every stage as one chain; a fan-out's branches run side by side, and on
    /// the random applications of issue 43 that left QUART's batches at a fraction of
    /// what the SLO allows (docs/quart.md).
    pub path_batch_fraction: f64,
    /// With `drop_unreachable`: count each stage's batches, in the time a request must
    /// have left, at the size the stage runs (a moving average) rather than at its
    /// batch limit (`measured_batches`, true; `false` counts them at the limit). Past
    /// capacity the batches are full and the two agree; below it the limit asked far
    /// more than a request needs (`slack.rs`, docs/quart.md).
    pub measured_batches: bool,
    /// With `drop_unreachable`: every this long, the entry admits a share of the fresh
    /// arrivals that falls by half the share of requests the later stages' drops lost
    /// (SDK `EntryShedder`, as FLEX; `shed_period_ms`, 100; 0 admits everything). A
    /// request a fan-out's branch or a join drops is lost after the stages above it
    /// served it (docs/quart.md).
    pub shed_period: Duration,
}

impl Params {
    /// Read every parameter from `ctx`, with the specification's defaults.
    pub fn from_ctx(ctx: &Ctx) -> Result<Self, String> {
        let secs = |key: &str, default: f64| -> Result<Duration, String> {
            let value: f64 = ctx.param_or(key, default)?;
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("parameter `{key}` must be positive, got {value}"));
            }
            Ok((value * NS) as Duration)
        };
        let first_control_ms: f64 = ctx.param_or("first_control_ms", 100.0)?;
        if !(first_control_ms >= 0.0 && first_control_ms.is_finite()) {
            return Err(format!("parameter `first_control_ms` must be 0 or more, got {first_control_ms}"));
        }
        let slo_ctrl_ms: f64 = ctx.param_or("slo_ctrl_ms", 0.0)?;
        let params = Self {
            control_period: secs("control_period_s", 2.0)?,
            first_control: (first_control_ms * 1e6) as Duration,
            smooth_period: secs("smooth_period_s", 30.0)?,
            cooldown: secs("cooldown_s", 120.0)?,
            kp: ctx.param_or("kp", 2.0)?,
            ki: ctx.param_or("ki", 0.3)?,
            kd: ctx.param_or("kd", 0.1)?,
            e_max: ctx.param_or("e_max", 4.0)?,
            i_max: ctx.param_or("i_max", 10.0)?,
            r_min: ctx.param_or("r_min", 1)?,
            r_max: ctx.param_or("r_max", if ctx.config().max_workers > 0 { ctx.config().max_workers } else { AUTHORS_R_MAX })?,
            slo_ctrl_s: (slo_ctrl_ms > 0.0).then_some(slo_ctrl_ms / 1e3),
            rate_window: secs("rate_window_s", 5.0)?,
            long_window: secs("long_window_s", 60.0)?,
            cv_window: secs("cv_window_s", 60.0)?,
            min_cv_samples: ctx.param_or("min_cv_samples", 20)?,
            buffer_alpha: ctx.param_or("buffer_alpha", 0.5)?,
            cv_threshold: ctx.param_or("cv_threshold", 1.0)?,
            service_scv: ctx.param_or("service_scv", 0.05)?,
            base_cores: ctx.param_or("base_cores", 2)?,
            max_cores: ctx.param_or("max_cores", 16)?,
            cpu_serial_share: ctx.param_or("cpu_serial_share", 0.34)?,
            key_ttl: secs("key_ttl_s", 600.0)?,
            smoother: ctx.param_or("smoother", true)?,
            cpu_compensation: ctx.param_or("cpu_compensation", true)?,
            low_contention: ctx.param_or("low_contention", 0.25)?,
            placement: ctx.param_or("placement", true)?,
            drop_unreachable: ctx.param_or("drop_unreachable", true)?,
            downstream_reserve: ctx.param_or("downstream_reserve", 2.0)?,
            fit_batches: ctx.param_or("fit_batches", true)?,
            path_batch_fraction: {
                let f: f64 = ctx.param_or("path_batch_fraction", 0.75)?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(format!("parameter `path_batch_fraction` must be in [0, 1] (got {f})"));
                }
                f
            },
            measured_batches: ctx.param_or("measured_batches", true)?,
            shed_period: {
                let ms: f64 = ctx.param_or("shed_period_ms", 100.0)?;
                if !(ms >= 0.0 && ms.is_finite()) {
                    return Err(format!("parameter `shed_period_ms` must be 0 or more, got {ms}"));
                }
                (ms * 1e6) as Duration
            },
        };
        if !(0.0..=100.0).contains(&params.downstream_reserve) {
            return Err(format!("parameter `downstream_reserve` must be in [0, 100], got {}", params.downstream_reserve));
        }
        if params.r_min == 0 || params.r_min > params.r_max {
            return Err(format!("need 1 ≤ r_min ≤ r_max, got {} and {}", params.r_min, params.r_max));
        }
        if params.base_cores == 0 || params.base_cores > params.max_cores {
            return Err(format!("need 1 ≤ base_cores ≤ max_cores, got {} and {}", params.base_cores, params.max_cores));
        }
        Ok(params)
    }

    /// The defaults (for native tests).
    pub fn defaults() -> Self {
        let config = yardmaster_sdk::Config {
            arm: String::new(),
            stages: Vec::new(),
            workers: Vec::new(),
            streams: Vec::new(),
            params: Vec::new(),
            tick_interval: 1_000_000_000,
            max_workers: 0,
            seed: 0,
            now: 0,
            hosts: Vec::new(),
        };
        let ctx = Ctx::new(config, Box::new(yardmaster_sdk::NullHost::default()));
        Self::from_ctx(&ctx).expect("defaults are valid")
    }

    /// The Corrector period in seconds.
    pub fn control_period_s(&self) -> f64 {
        self.control_period as f64 / NS
    }
}
