//! PARD's parameters, with the paper's defaults, and the switches that turn PARD
//! into one of the paper's ablations.

use yardmaster_sdk::Ctx;

/// What the downstream estimate L_sub counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimate {
    /// Queueing, execution and the λ-quantile of the batch waits downstream (PARD).
    Full,
    /// Nothing downstream (PARD-back, like Clockwork, Nexus, Scrooge).
    Back,
    /// Downstream execution only (PARD-sf, like DREAM).
    ServiceOnly,
}

/// How the broker orders a worker's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// HBF when overloaded, LBF when not, with the delayed transition (PARD).
    Adaptive,
    /// HBF iff μ > 1 at each tick, no hysteresis (PARD-instant).
    Instant,
    /// First come, first served by arrival at the stage (PARD-FCFS).
    Fcfs,
    /// Always high budget first (PARD-HBF).
    Hbf,
    /// Always low budget first (PARD-LBF).
    Lbf,
}

/// What the drop test compares against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// The end-to-end deadline with the downstream estimate (PARD).
    EndToEnd,
    /// A fixed per-module budget proportional to profiled durations (PARD-split).
    Split,
    /// A per-module budget proportional to worst-case latency q + 2d (PARD-WCL).
    WorstCase,
}

/// How requests are shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The per-request drop test at batch formation (PARD).
    DropTest,
    /// DAGOR-style overload control: no per-request test; an overloaded module and
    /// its ancestors admit a fraction 1 − α of their arrivals (PARD-oc).
    OverloadControl,
}

/// Every constant of PARD (keys and defaults in the field docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PardParams {
    /// `lambda` [0.1]: quantile of the downstream batch-wait distribution.
    pub lambda: f64,
    /// `samples` [10000]: Monte-Carlo draws per module per sync; also the wait-pool size.
    pub samples: usize,
    /// `queue_window_ms` [5000]: span of the linear-weighted queueing-delay window (H_q).
    pub queue_window: u64,
    /// `sync_ms` [1000]: state synchronisation period (T_sync).
    pub sync_interval: u64,
    /// `rate_smoothing_s` [5]: sliding-average window of the smoothed input rate (H_s).
    pub rate_smoothing_ticks: usize,
    /// `epsilon_horizon_s` [30]: horizon of the sums in ε (H_ε).
    pub epsilon_horizon_ticks: usize,
    /// `epsilon_max` [0.5]: clamp on ε.
    pub epsilon_max: f64,
    /// `pool_min` [200]: below this many recorded waits a module's draws are U[0,1]·d.
    pub pool_min: usize,
    /// `purge_expired` [true]: drop queued requests once D_r < now + d_k(1).
    pub purge_expired: bool,
    /// `estimate` [full]: `full`, `back` or `sf`.
    pub estimate: Estimate,
    /// `priority` [adaptive]: `adaptive`, `instant`, `fcfs`, `hbf` or `lbf`.
    pub priority: Priority,
    /// `budget` [e2e]: `e2e`, `split` or `wcl`.
    pub budget: Budget,
    /// `admission` [test]: `test` or `oc`.
    pub admission: Admission,
    /// `oc_alpha` [0.4]: fraction of arrivals an overloaded module sheds (PARD-oc).
    pub oc_alpha: f64,
    /// `oc_threshold_ms` [25]: mean queueing delay over a tick above which a module
    /// is overloaded (PARD-oc; the paper tuned 20 ms for wiki, 25 ms for tweet and azure).
    pub oc_threshold: u64,
    /// `log_state` [false]: log every module's q, d, L_sub, μ, ε and mode at each sync.
    pub log_state: bool,
    /// `entry_limit` [true]: admit at the pipeline's entry at most the entry requests
    /// per second the serving workers carry at the plan's batches (a token bucket
    /// holding one SLO's worth), dropping the rest on arrival (not in the paper; issue
    /// 43: past capacity an entry stage faster than the branches below it passed what
    /// they then dropped, each branch other requests).
    pub entry_limit: bool,
}

impl Default for PardParams {
    fn default() -> Self {
        Self {
            lambda: 0.1,
            samples: 10_000,
            queue_window: 5_000 * MS,
            sync_interval: 1_000 * MS,
            rate_smoothing_ticks: 5,
            epsilon_horizon_ticks: 30,
            epsilon_max: 0.5,
            pool_min: 200,
            purge_expired: true,
            estimate: Estimate::Full,
            priority: Priority::Adaptive,
            budget: Budget::EndToEnd,
            admission: Admission::DropTest,
            oc_alpha: 0.4,
            oc_threshold: 25 * MS,
            log_state: false,
            entry_limit: true,
        }
    }
}

const MS: u64 = 1_000_000;

impl PardParams {
    /// The parameters of a policy's configuration (defaults for absent keys); an
    /// unparsable or out-of-range value is an error naming the key.
    pub fn from_ctx(ctx: &Ctx) -> Result<Self, String> {
        let d = Self::default();
        let lambda: f64 = ctx.param_or("lambda", d.lambda)?;
        if !(0.0..=1.0).contains(&lambda) {
            return Err(format!("parameter `lambda`: {lambda} is not in [0, 1]"));
        }
        let oc_alpha: f64 = ctx.param_or("oc_alpha", d.oc_alpha)?;
        if !(0.0..=1.0).contains(&oc_alpha) {
            return Err(format!("parameter `oc_alpha`: {oc_alpha} is not in [0, 1]"));
        }
        let positive = |key: &str, value: u64| if value == 0 { Err(format!("parameter `{key}` must be positive")) } else { Ok(value) };
        Ok(Self {
            lambda,
            samples: positive("samples", ctx.param_or("samples", d.samples as u64)?)? as usize,
            queue_window: positive("queue_window_ms", ctx.param_or("queue_window_ms", d.queue_window / MS)?)? * MS,
            sync_interval: positive("sync_ms", ctx.param_or("sync_ms", d.sync_interval / MS)?)? * MS,
            rate_smoothing_ticks: positive("rate_smoothing_s", ctx.param_or("rate_smoothing_s", d.rate_smoothing_ticks as u64)?)? as usize,
            epsilon_horizon_ticks: positive("epsilon_horizon_s", ctx.param_or("epsilon_horizon_s", d.epsilon_horizon_ticks as u64)?)?
                as usize,
            epsilon_max: ctx.param_or("epsilon_max", d.epsilon_max)?,
            pool_min: ctx.param_or("pool_min", d.pool_min)?,
            purge_expired: ctx.param_or("purge_expired", d.purge_expired)?,
            estimate: match ctx.param("estimate").unwrap_or("full") {
                "full" | "pard" => Estimate::Full,
                "back" => Estimate::Back,
                "sf" => Estimate::ServiceOnly,
                other => return Err(format!("parameter `estimate`: {other:?} is not full, back or sf")),
            },
            priority: match ctx.param("priority").unwrap_or("adaptive") {
                "adaptive" => Priority::Adaptive,
                "instant" => Priority::Instant,
                "fcfs" => Priority::Fcfs,
                "hbf" => Priority::Hbf,
                "lbf" => Priority::Lbf,
                other => return Err(format!("parameter `priority`: {other:?} is not adaptive, instant, fcfs, hbf or lbf")),
            },
            budget: match ctx.param("budget").unwrap_or("e2e") {
                "e2e" => Budget::EndToEnd,
                "split" => Budget::Split,
                "wcl" => Budget::WorstCase,
                other => return Err(format!("parameter `budget`: {other:?} is not e2e, split or wcl")),
            },
            admission: match ctx.param("admission").unwrap_or("test") {
                "test" => Admission::DropTest,
                "oc" => Admission::OverloadControl,
                other => return Err(format!("parameter `admission`: {other:?} is not test or oc")),
            },
            oc_alpha,
            oc_threshold: ctx.param_or("oc_threshold_ms", d.oc_threshold / MS)? * MS,
            log_state: ctx.param_or("log_state", d.log_state)?,
            entry_limit: ctx.param_or("entry_limit", d.entry_limit)?,
        })
    }
}
