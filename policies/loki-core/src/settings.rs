//! Policy parameters, each with the paper's (or the spec's) default.

use yardmaster_sdk::Ctx;

use crate::balancer::Ties;
use crate::batching::{DropMode, DropWhen};
use crate::budgets::BudgetRule;
use crate::model::DEFAULT_BATCHES;
use crate::planner::SolverLimits;

/// The most paths of the augmented graph (one variant per task along each branch)
/// the MILP is built over by default; beyond, the greedy single-path plan serves
/// (docs/loki.md, "Trees of seven and eight tasks").
pub const MAX_MILP_PATHS: u64 = 500;

/// Which planner a flavour of the policy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannerKind {
    /// Loki: hardware scaling, then accuracy scaling over the augmented graph.
    Loki,
    /// InferLine-like: hardware scaling of the most accurate variants only.
    InferLine,
    /// Proteus-like: per-task accuracy scaling on the whole cluster.
    Proteus,
}

/// Every setting of the runtime.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The planner.
    pub planner: PlannerKind,
    /// Resource Manager period (`rm_period_s`, 10 s).
    pub rm_period_ns: u64,
    /// Relative demand change that triggers an early re-plan (`replan_jump`, 0.2).
    pub replan_jump: f64,
    /// EWMA centre of mass (`ewma_com`, 1.6 → α ≈ 0.385).
    pub ewma_com: f64,
    /// EWMA window in ticks (`ewma_window`, 20).
    pub ewma_window: usize,
    /// Over-provisioning headroom η (`headroom`, 1.5; the paper's is 1.0, the
    /// authors' code ran 1.05 and 1.2). Planned at η = 1 every stage runs at full
    /// utilisation and queueing alone overshoots the budgets (13–25 % of requests
    /// dropped at a tenth of the capacity).
    pub headroom: f64,
    /// Per-hop network latency in ms (`comm_ms`, 0).
    pub comm_ms: f64,
    /// Requests in a worker's multiplicative-factor history (`factor_history`, 50).
    pub factor_history: usize,
    /// Early dropping (`drop_mode`: reroute for Loki, per_task for the baselines).
    pub drop_mode: DropMode,
    /// What an overshoot no backup makes up costs (`drop_when`: `deadline`, the
    /// default, drops only a request that cannot meet its deadline any more; `budget`
    /// is the paper's rule, dropping on the overshoot, and the Proteus-like
    /// baseline's default: its equal SLO shares are what keep its queues short past
    /// capacity).
    pub drop_when: DropWhen,
    /// Workers the planner may use (`cluster_size`; default: the host's maximum
    /// less one per pseudo stage).
    pub cluster: u32,
    /// MILP limits (`milp_nodes` 150, `milp_pivots` 200000 per solve; per tick, a
    /// slice of `milp_work_per_tick` 30 000 000 tableau updates). Every default budget
    /// counts work, never time, so a simulated run is a pure function of its inputs
    /// and seed whatever the machine's load. `milp_ms_per_tick` (default 0: off) also
    /// ends a slice after that many ms of the host's clock. `milp_paths`
    /// ([`MAX_MILP_PATHS`]): the largest augmented graph the MILP is built over.
    pub limits: SolverLimits,
    /// Latency budgets (`budget`: `slo_share`, `task_share` or a multiple of the
    /// batch latency such as `2`, the paper's rule; default `slo_share`, and
    /// `task_share` for the Proteus-like baseline).
    pub budget: BudgetRule,
    /// Hardware scaling's slack for queueing (`hardware_slack`, 2; 1 is the paper's):
    /// STEP1 sizes the most accurate variants for this multiple of the demand while the
    /// cluster has the workers (else for the demand, with the idle workers added to the
    /// busiest variants). Sized for the demand alone (`1`, the paper's STEP1) the
    /// fewest workers run close to saturation, and queueing alone overshoots the
    /// per-task budgets: 13–20 % of requests are dropped at a tenth of the capacity.
    pub hardware_slack: f64,
    /// Give idle workers to the busiest variants after accuracy scaling
    /// (`fill_spare`, true).
    pub fill_spare: bool,
    /// MostAccurateFirst tie handling (`maf_ties`: proportional or sequential).
    pub ties: Ties,
    /// Allowed batch sizes (`batches`, "1,2,4,8,16,32,64").
    pub batches: Vec<u32>,
    /// Join the shortest queue among the workers of the variant the routing table
    /// drew (`shortest_queue`, true; false is the paper's: the drawn worker itself).
    /// The tables fix how a task's load splits over its variants; within a variant
    /// the workers are alike, and a draw per request leaves some queues long while
    /// others idle. The Proteus-like baseline joins the shortest queue only while its
    /// plan covers the whole demand (β = 1); past that it routes by planned load alone
    /// (with the rule there, it lost up to 0.47 of the bound at 10× on `r00-chain`).
    pub shortest_queue: bool,
    /// While a variant has fewer workers than the plan gives it, raise its workers'
    /// max batch to make up the throughput, within the planned batch's budget
    /// (`batch_up`, true; false keeps the planned batch, the Proteus-like baseline's
    /// default: its batch is Proteus's rule, the largest within half its equal share of
    /// the SLO, and larger ones overshot that share: at 10× on `r04-mid-fan-join` it
    /// served 271 on-time requests a second against 382).
    pub batch_up: bool,
    /// While a task's planned workers are still to come, keep its present workers on
    /// their variants when switched to the planned ones they would carry less of the
    /// planned load (`hold_variants`, true; false switches at once).
    pub hold_variants: bool,
}

impl Settings {
    /// Read the parameters; `pseudo_workers` is the number of workers the stages outside
    /// the plan keep (pseudo stages, stages of other streams).
    pub fn from_ctx(ctx: &Ctx, planner: PlannerKind, default_drop: DropMode, pseudo_workers: u32) -> Result<Self, String> {
        let batches: String = ctx.param_or("batches", DEFAULT_BATCHES.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
        let batches = batches
            .split(',')
            .map(|b| b.trim().parse::<u32>().map_err(|_| format!("parameter `batches`: bad size {b:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        if batches.is_empty() || batches.contains(&0) {
            return Err("parameter `batches`: need positive sizes".into());
        }
        let ties = match ctx.param_or("maf_ties", "proportional".to_string())?.as_str() {
            "proportional" => Ties::Proportional,
            "sequential" => Ties::Sequential,
            other => return Err(format!("parameter `maf_ties`: unknown {other:?}")),
        };
        let default_cluster = ctx.config().max_workers.saturating_sub(pseudo_workers).max(1);
        Ok(Self {
            planner,
            rm_period_ns: (ctx.param_or("rm_period_s", 10.0f64)? * 1e9) as u64,
            replan_jump: ctx.param_or("replan_jump", 0.2)?,
            ewma_com: ctx.param_or("ewma_com", 1.6)?,
            ewma_window: ctx.param_or("ewma_window", 20usize)?,
            headroom: ctx.param_or("headroom", 1.5)?,
            comm_ms: ctx.param_or("comm_ms", 0.0)?,
            factor_history: ctx.param_or("factor_history", 50usize)?.max(1),
            drop_mode: ctx.param_or("drop_mode", default_drop)?,
            drop_when: ctx.param_or("drop_when", if planner == PlannerKind::Proteus { DropWhen::Budget } else { DropWhen::Deadline })?,
            cluster: ctx.param_or("cluster_size", default_cluster)?,
            limits: SolverLimits {
                max_nodes: ctx.param_or("milp_nodes", 150u64)?,
                max_pivots: ctx.param_or("milp_pivots", 200_000u64)?,
                time_slice_ns: (ctx.param_or("milp_ms_per_tick", 0.0f64)? * 1e6) as u64,
                work_slice: ctx.param_or("milp_work_per_tick", 30_000_000u64)?,
                max_paths: ctx.param_or("milp_paths", MAX_MILP_PATHS)?,
            },
            budget: ctx.param_or("budget", if planner == PlannerKind::Proteus { BudgetRule::TaskShare } else { BudgetRule::SloShare })?,
            fill_spare: ctx.param_or("fill_spare", true)?,
            hardware_slack: ctx.param_or("hardware_slack", 2.0f64)?.max(1.0),
            ties,
            batches,
            shortest_queue: ctx.param_or("shortest_queue", true)?,
            batch_up: ctx.param_or("batch_up", planner != PlannerKind::Proteus)?,
            hold_variants: ctx.param_or("hold_variants", true)?,
        })
    }
}
