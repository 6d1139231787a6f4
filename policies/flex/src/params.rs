//! FLEX's parameters (`--param key=value`), with SHEPHERD's defaults.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `lambda` | 3.03 | preemption factor λ; `inf` gives non-preemptive FLEX (FLEX-NP) |
//! | `max_batch` | 128 | B_max (also capped by each stage's `max-batch`) |
//! | `preempt_delay` | 0 | estimated preemption delay δ_pre as a fraction of the running batch's latency; the policy uses the larger of this and the delay it measures (preempt → the worker's next `worker-idle`) |
//! | `batch_mode` | `largest` | `largest` (largest feasible deadline window) or `prefix` (literal Algorithm 2) |
//! | `select` | `adaptive` | `adaptive` (an idle worker serves the most urgent batch while the group could meet every queued deadline in earliest-deadline order, the largest batch once it could not), `largest` (FLEX as the paper writes it: the largest batch always) or `earliest` (the EDF-inside-FLEX ablation) |
//! | `defer_preemption` | true | skip a preemption unless the preempting batch would lose at least λ·b of its requests by waiting for the group's other workers; `false` is Algorithm 1 as written |
//! | `busy_order` | `latest_start` | order of busy workers offered a preempting batch: `latest_start` (most recently started batch first), `id` (spec §9 choice 4), `latest_end` (batch ending last first) |
//! | `coalesce` | true in a pipeline, false at a single stage | queue every arrival of a decision point before dispatching once (a fan-out's burst of pieces then costs one DISPATCH, not one per piece; refused with the scheduler cost model, whose default stays false) |
//! | `tick_sweep` | true | drop unreachable queued requests on every tick |
//! | `downstream_reserve` | 2 | batch durations (at the stage's largest batch) held back for each later stage of a pipeline: a request's deadline at a stage is its end-to-end deadline less the longest downstream path's reserve (scaled down to fit the SLO); `0` is the paper's rule (every stage checks the end-to-end deadline; SHEPHERD has one stage) |
//! | `productive_batches` | true | cap each model's batches at the size that serves the most requests per second within the stage's budget (the SLO less the stage's reserve; [`yardmaster_sdk::helpers::ModelInfo::most_productive_batch_within`]), so that under overload the largest window does not form batches past the model's sweet spot; `false` is the paper's rule (every batch up to B_max; SHEPHERD's linear profiles have no sweet spot, and there the two agree) |
//! | `upstream_share` | true | each model's batch limit (`productive_batches`) is the most productive batch within its stage's share of the SLO — the SLO less the downstream reserve and less, by the same measure, the longest upstream path ([`crate::stage_held`]) — rather than within the SLO less the downstream reserve alone; the spread reads these limits. `false`: the SLO less the downstream reserve |
//! | `shed_period_ms` | 100 | in a pipeline, every period admit at the entry a share of the arrivals that falls by half the share of requests the later stages' drops lost in the period and climbs back by 5 % while they lose under 1 % ([`yardmaster_sdk::helpers::EntryShedder`]): past capacity the entry drops what the later stages cannot carry before work is spent on it; `0` admits by the entry stage's deadlines only |
//! | `fresh_window` | true | in a pipeline, at a stage with stages after it and no fan-out above it ([`crate::fresh_stages`]), a group that could not meet every queued deadline (the adaptive selection's loaded state, or always with `select=largest`) takes the freshest window — the requests with the latest deadlines, as many as fit a batch — instead of the earliest that fit, so what it serves reaches the later stages with the most time left; `false` is the paper's window |
//! | `spread` | true | use the whole cluster: spread its `max-workers` over the stages by need, at start from the configured fan-outs, one second later and every `spread_period_s` after that from the measured demand ([`crate::spread`]); `false` serves with the workers the host started (the paper's experiments start every GPU of the cluster) |
//! | `spread_margin` | 0.2 | head-room the spread gives every stage below the entry over the entry stage (its workers count as serving 1/(1 + margin) of their goodput): under overload the entry stage drops what the pipeline cannot carry before work is spent on it; `0` spreads for equal head-room |
//! | `spread_period_s` | 5 | how often the spread is measured again (workers move only when the lowest head-room rises by 10 %) |
//! | `herd` | true | plan serving groups with HERD (only when the workers outnumber `group_limit`) |
//! | `group_limit` | 12 | Ḡ: most GPUs per serving group; `inf`: one group of every worker |
//! | `herd_period_s` | 1800 | re-planning period P in seconds |
//! | `herd_solver` | `heuristic` | `heuristic` (§3.4 steps 1–5) or `exact` (exhaustive, small instances) |
//! | `herd_nodes` | 200000 | budget of the exact solver in search nodes (a deterministic stand-in for a time budget) |
//! | `sched_cost_us` | 0 | scheduler cost model ([`crate::sched`]): µs of serial scheduler time every event of a group costs |
//! | `sched_cost_per_worker_ns` | 0 | ns more per worker of the group for an event that runs a scheduling pass; the model is on when either is above 0 |

use yardmaster_sdk::Ctx;

use crate::group::{BatchMode, BusyOrder, Selection, Settings};
use crate::herd::Solver;
use crate::sched::CostModel;

/// Every parameter of the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct FlexParams {
    /// The scheduler's settings.
    pub settings: Settings,
    /// Queue simultaneous arrivals before one dispatch.
    pub coalesce: bool,
    /// Drop unreachable requests on ticks.
    pub tick_sweep: bool,
    /// Batch durations held back at each stage for every later stage (0: none).
    pub downstream_reserve: f64,
    /// Cap each model's batches at its most productive size within the stage's budget.
    pub productive_batches: bool,
    /// A stage's budget (batch limit, the spread's goodput) also keeps what the stages
    /// before it take.
    pub upstream_share: bool,
    /// Period of the entry shedder in nanoseconds (0: off).
    pub shed_period: u64,
    /// A loaded group takes the freshest window at the stages [`crate::fresh_stages`]
    /// names.
    pub fresh_window: bool,
    /// Spread the cluster's workers over the stages.
    pub spread: bool,
    /// Head-room the spread gives every stage below the entry over the entry stage.
    pub spread_margin: f64,
    /// Period of the spread's measurement, in nanoseconds.
    pub spread_period: u64,
    /// Plan serving groups with HERD.
    pub herd: bool,
    /// Ḡ.
    pub group_limit: u32,
    /// HERD's period in nanoseconds.
    pub herd_period: u64,
    /// HERD's solver.
    pub solver: Solver,
    /// Search-node budget of the exact solver.
    pub herd_nodes: u64,
    /// The scheduler cost model (`None`: decisions are free and immediate).
    pub sched_cost: Option<CostModel>,
}

impl FlexParams {
    /// Read the parameters from the configuration; an error names the bad one.
    pub fn from_ctx(ctx: &Ctx) -> Result<Self, String> {
        let lambda: f64 = ctx.param_or("lambda", 3.03)?;
        if lambda.is_nan() || lambda <= 1.0 {
            return Err(format!("parameter `lambda` must be above 1 (got {lambda})"));
        }
        let max_batch: u32 = ctx.param_or("max_batch", 128)?;
        if max_batch == 0 {
            return Err("parameter `max_batch` must be at least 1".into());
        }
        let preempt_delay: f64 = ctx.param_or("preempt_delay", 0.0)?;
        if !(0.0..10.0).contains(&preempt_delay) {
            return Err(format!("parameter `preempt_delay` must be in [0, 10) (got {preempt_delay})"));
        }
        let batch_mode = match ctx.param_or("batch_mode", String::from("largest"))?.as_str() {
            "largest" => BatchMode::Largest,
            "prefix" => BatchMode::Prefix,
            other => return Err(format!("parameter `batch_mode`: {other:?} is neither largest nor prefix")),
        };
        let selection = match ctx.param_or("select", String::from("adaptive"))?.as_str() {
            "adaptive" => Selection::Adaptive,
            "largest" => Selection::Largest,
            "earliest" => Selection::Earliest,
            other => return Err(format!("parameter `select`: {other:?} is not adaptive, largest or earliest")),
        };
        let busy_order = match ctx.param_or("busy_order", String::from("latest_start"))?.as_str() {
            "id" => BusyOrder::Id,
            "latest_start" => BusyOrder::LatestStart,
            "latest_end" => BusyOrder::LatestEnd,
            other => return Err(format!("parameter `busy_order`: {other:?} is not id, latest_start or latest_end")),
        };
        let solver = match ctx.param_or("herd_solver", String::from("heuristic"))?.as_str() {
            "heuristic" => Solver::Heuristic,
            "exact" => Solver::Exact,
            other => return Err(format!("parameter `herd_solver`: {other:?} is neither heuristic nor exact")),
        };
        let group_limit = match ctx.param_or("group_limit", String::from("12"))?.trim() {
            "inf" | "infinity" => u32::MAX,
            text => match text.parse::<u32>() {
                Ok(0) | Err(_) => return Err(format!("parameter `group_limit` must be a positive integer or inf (got {text:?})")),
                Ok(n) => n,
            },
        };
        let fixed_us: f64 = ctx.param_or("sched_cost_us", 0.0)?;
        let per_worker_ns: f64 = ctx.param_or("sched_cost_per_worker_ns", 0.0)?;
        for (name, value) in [("sched_cost_us", fixed_us), ("sched_cost_per_worker_ns", per_worker_ns)] {
            if !(0.0..1e9).contains(&value) {
                return Err(format!("parameter `{name}` must be in [0, 1e9) (got {value})"));
            }
        }
        let sched_cost = (fixed_us > 0.0 || per_worker_ns > 0.0).then_some(CostModel { fixed_ns: fixed_us * 1e3, per_worker_ns });
        // A pipeline coalesces by default: a stage's batch that fans out hands the next
        // stage its pieces at one instant, and one DISPATCH per piece (each offering every
        // busy worker a preempting batch) ran a call out of its 50 M units of fuel on the
        // random set (r04-mid-fan-join at 5×). A single stage keeps the paper's
        // per-arrival DISPATCH, and so does the scheduler cost model (one event each).
        let pipeline = ctx.config().stages.len() > 1;
        let coalesce = ctx.param_or("coalesce", pipeline && sched_cost.is_none())?;
        if coalesce && sched_cost.is_some() {
            return Err("parameter `coalesce` cannot be combined with the scheduler cost model (every arrival is one event)".into());
        }
        let downstream_reserve: f64 = ctx.param_or("downstream_reserve", 2.0)?;
        if !(0.0..=100.0).contains(&downstream_reserve) {
            return Err(format!("parameter `downstream_reserve` must be in [0, 100] (got {downstream_reserve})"));
        }
        let period_s: f64 = ctx.param_or("herd_period_s", 1800.0)?;
        if period_s.is_nan() || period_s <= 0.0 {
            return Err("parameter `herd_period_s` must be positive".into());
        }
        let spread_period_s: f64 = ctx.param_or("spread_period_s", 5.0)?;
        if !(spread_period_s > 0.0 && spread_period_s <= 1e6) {
            return Err(format!("parameter `spread_period_s` must be in (0, 1e6] (got {spread_period_s})"));
        }
        let shed_period_ms: f64 = ctx.param_or("shed_period_ms", 100.0)?;
        if !(0.0..=1e6).contains(&shed_period_ms) {
            return Err(format!("parameter `shed_period_ms` must be in [0, 1e6] (got {shed_period_ms})"));
        }
        let spread_margin: f64 = ctx.param_or("spread_margin", 0.2)?;
        if !(0.0..=10.0).contains(&spread_margin) {
            return Err(format!("parameter `spread_margin` must be in [0, 10] (got {spread_margin})"));
        }
        Ok(Self {
            settings: Settings {
                lambda,
                max_batch,
                preempt_delay_fraction: preempt_delay,
                batch_mode,
                selection,
                busy_order,
                defer_preemption: ctx.param_or("defer_preemption", true)?,
                fresh_stages: Vec::new(),
            },
            coalesce,
            tick_sweep: ctx.param_or("tick_sweep", true)?,
            downstream_reserve,
            productive_batches: ctx.param_or("productive_batches", true)?,
            shed_period: (shed_period_ms * 1e6) as u64,
            fresh_window: ctx.param_or("fresh_window", true)?,
            upstream_share: ctx.param_or("upstream_share", true)?,
            spread: ctx.param_or("spread", true)?,
            spread_period: (spread_period_s * 1e9) as u64,
            spread_margin,
            herd: ctx.param_or("herd", true)?,
            group_limit,
            herd_period: (period_s * 1e9) as u64,
            solver,
            herd_nodes: ctx.param_or("herd_nodes", 200_000)?,
            sched_cost,
        })
    }
}
