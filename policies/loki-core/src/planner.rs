//! The Resource Manager's planning step: hardware scaling first (STEP1, exact); if that needs more than the cluster, accuracy scaling (STEP2, the
//! MILP, warm-started from the previous plan and the greedy single-path plan); if
//! even that is infeasible, the plan for the largest demand any plan serves; and
//! if no plan meets the latency cap at all, `FASTEST`.
//!
//! The MILP runs as a [`PlanJob`] that a policy advances a slice at a time (one
//! slice per tick keeps each host call within its fuel or time limit); until it
//! finishes, the greedy single-path plan serves.

use yardmaster_sdk::helpers::milp::{Budget, Search, Solution, Status};

use crate::model::{Factors, PipelineModel};
use crate::plan::{Plan, Regime};
use crate::single_path::{best_single_path, fastest, fastest_capacity, hardware_scaling};
use crate::step2::{Goal, Step2};

/// Limits of one MILP solve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SolverLimits {
    /// Most branch-and-bound nodes per solve.
    pub max_nodes: u64,
    /// Most simplex pivots per solve.
    pub max_pivots: u64,
    /// Time slice per call in ns of the caller's clock (0: none).
    pub time_slice_ns: u64,
    /// Work (tableau entries touched) per call.
    pub work_slice: u64,
    /// Most paths of the augmented graph the MILP is built over (beyond, no MILP:
    /// the greedy single-path plan serves).
    pub max_paths: u64,
}

impl Default for SolverLimits {
    fn default() -> Self {
        Self { max_nodes: 400, max_pivots: 200_000, time_slice_ns: 0, work_slice: u64::MAX, max_paths: u64::MAX }
    }
}

/// What planning cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanStats {
    /// MILP solves run.
    pub solves: u32,
    /// Branch-and-bound nodes, over all solves.
    pub nodes: u64,
    /// Simplex pivots, over all solves.
    pub pivots: u64,
    /// Calls (slices) the solves took.
    pub slices: u32,
    /// Status of the last accuracy-scaling solve.
    pub status: Option<Status>,
    /// Variables and constraints of the last MILP.
    pub size: (usize, usize),
}

/// Inputs of one planning run.
pub struct PlanRequest<'a> {
    /// The pipeline.
    pub model: &'a PipelineModel,
    /// Multiplicative factors to plan with.
    pub factors: &'a Factors,
    /// Root demand to serve (QPS, headroom included).
    pub demand: f64,
    /// Workers available.
    pub cluster: u32,
    /// Per-path latency cap `L'` (ms).
    pub cap_ms: f64,
    /// Solver limits.
    pub limits: SolverLimits,
    /// The plan in force (a warm start).
    pub previous: Option<&'a Plan>,
    /// Give workers STEP2 leaves idle to the most loaded variants.
    pub fill_spare: bool,
    /// STEP1's slack for queueing ([`hardware_scaling_with_slack`]; 1: the paper's).
    pub slack: f64,
}

/// Where a job stands.
enum Stage {
    /// STEP2 at `demand` (`capped`: the largest feasible demand).
    Accuracy { step: Step2, search: Search, demand: f64, capped: bool, greedy: Option<Plan> },
    /// The largest demand any plan serves.
    Capacity { step: Step2, search: Search },
}

/// The fastest single-path plan on the whole cluster and the demand it serves: the
/// floor under the capacity the planner finds beyond the cluster's reach.
#[derive(Clone, Debug)]
struct Floor {
    capacity: f64,
    plan: Plan,
}

/// The accuracy stage still to build: the demand, the plan in force (a warm start)
/// and the greedy plan (a warm start, and the plan if the MILP finds none).
struct Pending {
    demand: f64,
    previous: Option<Plan>,
    greedy: Option<Plan>,
}

/// A Resource Manager run in progress.
pub struct PlanJob {
    factors: Factors,
    cluster: u32,
    cap_ms: f64,
    limits: SolverLimits,
    fill_spare: bool,
    /// Set once the first stage is built.
    stage: Option<Stage>,
    /// What the first slice builds the first stage from.
    pending: Option<Pending>,
    /// The fastest plan's capacity, computed when hardware scaling fails.
    floor: Option<Floor>,
    stats: PlanStats,
}

/// What starting a plan gives.
pub enum Started {
    /// The plan, found at once (hardware scaling, or nothing left to optimise).
    Done(Plan),
    /// A plan to serve with now (the greedy one, if any) and the job that improves it.
    Pending(Option<Plan>, Box<PlanJob>),
}

/// Start planning for a demand.
///
/// Past the cluster's hardware capacity, the fastest single-path plan and the demand
/// it serves ([`fastest_capacity`]) are computed first: they warm-start the capacity
/// MILP (so the capacity found is never below the fastest plan's, whatever the
/// solver's budget), and they serve meanwhile whenever no greedy plan meets the
/// demand and the plan in force serves less.
///
/// The MILP itself is built in the job's first slice, not here: on a tree of seven
/// tasks its augmented graph has hundreds of paths, and building it (with the warm
/// starts' flow LPs) in a call of request events ran out of that call's fuel. A graph
/// of more than [`SolverLimits::max_paths`] paths is not solved at all: the greedy
/// single-path plan serves, or past every single path's reach the most accurate
/// single path serving the fastest plan's capacity.
pub fn start(request: &PlanRequest) -> Started {
    let (model, factors, cap, cluster) = (request.model, request.factors, request.cap_ms, request.cluster);
    if let Some(plan) = hardware_scaling_with_slack(model, factors, request.demand, request.slack, cap, cluster) {
        return Started::Done(plan);
    }
    let floor = fastest_capacity(model, factors, cap, cluster).map(|(capacity, plan)| Floor { capacity, plan });
    let greedy = best_single_path(model, factors, request.demand, cap, cluster);
    let mut job = PlanJob {
        factors: factors.clone(),
        cluster,
        cap_ms: cap,
        limits: request.limits,
        fill_spare: request.fill_spare,
        stage: None,
        pending: None,
        floor,
        stats: PlanStats::default(),
    };
    if augmented_paths(model) > request.limits.max_paths {
        return Started::Done(job.without_milp(model, greedy, request.demand));
    }
    // The plan to serve with while the MILP runs: the greedy one, else the fastest
    // plan, unless the plan in force already serves as much.
    let served = request.previous.map_or(0.0, |p| p.demand);
    let interim = greedy.clone().or_else(|| {
        let floor = job.floor.as_ref()?;
        (served < floor.capacity * (1.0 - 1e-6)).then(|| job.finish_plan(model, floor.plan.clone(), Regime::Capped))
    });
    job.pending = Some(Pending { demand: request.demand, previous: request.previous.cloned(), greedy });
    Started::Pending(interim, Box::new(job))
}

/// Paths of the augmented graph (one variant per task along each branch): the
/// MILP's size.
pub fn augmented_paths(model: &PipelineModel) -> u64 {
    model
        .branches
        .iter()
        .map(|branch| branch.iter().fold(1u64, |n, &t| n.saturating_mul(model.tasks[t].variants.len() as u64)))
        .fold(0u64, u64::saturating_add)
}

/// Plan for a demand, running the MILP to the end in one go (the `SOLVE` cascade).
pub fn resource_manager(request: &PlanRequest) -> (Plan, PlanStats) {
    match start(request) {
        Started::Done(plan) => (plan, PlanStats::default()),
        Started::Pending(_, mut job) => loop {
            if let Some(plan) = job.advance(request.model, None) {
                return (plan, job.stats.clone());
            }
        },
    }
}

impl PlanJob {
    /// What the job has cost so far.
    pub fn stats(&self) -> &PlanStats {
        &self.stats
    }

    fn accuracy_stage(
        &mut self,
        model: &PipelineModel,
        demand: f64,
        capped: bool,
        previous: Option<&Plan>,
        greedy: Option<Plan>,
    ) -> Option<Stage> {
        let step = Step2::build(model, &self.factors, self.cluster, self.cap_ms, Goal::Accuracy { demand })?;
        self.stats.size = step.size();
        let mut warm = Vec::new();
        if let Some(plan) = &greedy {
            warm.extend(step.point_of(model, self.cap_ms, plan));
        }
        if let Some(plan) = previous {
            warm.extend(step.point_of(model, self.cap_ms, plan));
        }
        let search = step.search(&warm);
        Some(Stage::Accuracy { step, search, demand, capped, greedy })
    }

    fn capacity_stage(&mut self, model: &PipelineModel) -> Option<Stage> {
        let step = Step2::build(model, &self.factors, self.cluster, self.cap_ms, Goal::Capacity)?;
        let warm: Vec<Vec<f64>> = self.floor.iter().filter_map(|f| step.point_of(model, self.cap_ms, &f.plan)).collect();
        let search = step.search(&warm);
        Some(Stage::Capacity { step, search })
    }

    /// The fastest plan at its capacity (planned for `demand` if it serves that
    /// much), or `FASTEST` when no single path meets the latency cap.
    fn floor_or_fastest(&self, model: &PipelineModel, demand: f64) -> Plan {
        match &self.floor {
            Some(floor) => {
                let mut plan = floor.plan.clone();
                plan.demand = plan.demand.min(demand.max(0.0)).max(0.0);
                self.finish_plan(model, plan, Regime::Capped)
            }
            None => fastest(model, &self.factors, demand, self.cluster),
        }
    }

    /// The plan when the MILP is not solved: the greedy plan, else the most accurate
    /// single path serving the fastest plan's capacity, else the fastest plan.
    fn without_milp(&self, model: &PipelineModel, greedy: Option<Plan>, demand: f64) -> Plan {
        if let Some(plan) = greedy {
            return self.finish_plan(model, plan, Regime::Accuracy);
        }
        let capped = self
            .floor
            .as_ref()
            .and_then(|floor| best_single_path(model, &self.factors, floor.capacity.min(demand) * (1.0 - 1e-6), self.cap_ms, self.cluster));
        match capped {
            Some(plan) => self.finish_plan(model, plan, Regime::Capped),
            None => self.floor_or_fastest(model, demand),
        }
    }

    fn finish_plan(&self, model: &PipelineModel, mut plan: Plan, regime: Regime) -> Plan {
        plan.regime = regime;
        if self.fill_spare {
            fill_spare(model, &mut plan, self.cluster);
        }
        plan
    }

    fn record(&mut self, solution: &Solution) {
        self.stats.solves += 1;
        self.stats.nodes += solution.nodes;
        self.stats.pivots += solution.pivots;
    }

    /// Run one slice (bounded by the limits' work slice and, with a clock, time
    /// slice); the plan once the job is finished.
    pub fn advance(&mut self, model: &PipelineModel, clock: Option<&dyn Fn() -> u64>) -> Option<Plan> {
        let deadline = match (clock, self.limits.time_slice_ns) {
            (Some(clock), slice) if slice > 0 => Some((clock().saturating_add(slice), clock)),
            _ => None,
        };
        let budget = Budget {
            max_nodes: self.limits.max_nodes,
            max_pivots: self.limits.max_pivots,
            relative_gap: 1e-6,
            deadline,
            slice_work: self.limits.work_slice,
        };
        self.stats.slices += 1;
        if let Some(pending) = self.pending.take() {
            match self.accuracy_stage(model, pending.demand, false, pending.previous.as_ref(), pending.greedy) {
                Some(stage) => self.stage = Some(stage),
                None => match self.capacity_stage(model) {
                    Some(stage) => self.stage = Some(stage),
                    None => return Some(self.floor_or_fastest(model, pending.demand)),
                },
            }
        }
        match self.stage.as_mut()? {
            Stage::Accuracy { step, search, demand, capped, greedy } => {
                let solution = search.run(&budget)?;
                let (demand, capped, greedy) = (*demand, *capped, greedy.take());
                let plan = solution.has_point().then(|| step.plan(model, &self.factors, &solution.values));
                self.record(&solution);
                self.stats.status = Some(solution.status);
                let regime = if capped { Regime::Capped } else { Regime::Accuracy };
                if let Some(plan) = plan.or(greedy) {
                    return Some(self.finish_plan(model, plan, regime));
                }
                if capped {
                    return Some(self.floor_or_fastest(model, demand));
                }
                match self.capacity_stage(model) {
                    Some(stage) => {
                        self.stage = Some(stage);
                        None
                    }
                    None => Some(self.floor_or_fastest(model, demand)),
                }
            }
            Stage::Capacity { step, search } => {
                let solution = search.run(&budget)?;
                let mut best = (solution.has_point() && solution.objective > 0.0)
                    .then(|| (solution.objective, step.plan(model, &self.factors, &solution.values)));
                self.record(&solution);
                // Never below the fastest plan's capacity (the solver may stop at its
                // budget with a worse incumbent).
                if let Some(floor) = &self.floor {
                    if best.as_ref().is_none_or(|(c, _)| *c < floor.capacity) {
                        best = Some((floor.capacity, floor.plan.clone()));
                    }
                }
                let Some((capacity, fallback)) = best else {
                    return Some(fastest(model, &self.factors, 0.0, self.cluster));
                };
                let demand = capacity * (1.0 - 1e-6);
                let greedy = best_single_path(model, &self.factors, demand, self.cap_ms, self.cluster);
                match self.accuracy_stage(model, demand, true, None, greedy) {
                    Some(stage) => {
                        self.stage = Some(stage);
                        None
                    }
                    None => Some(self.finish_plan(model, fallback, Regime::Capped)),
                }
            }
        }
    }
}

/// STEP1 with slack for queueing: the most accurate variants sized for
/// `slack · demand` when the cluster holds that many workers, else sized for `demand`
/// with the workers left idle given to the busiest variants; `None` when even
/// `demand` needs more than the cluster. `slack` 1 is the paper's STEP1.
pub fn hardware_scaling_with_slack(
    model: &PipelineModel,
    factors: &Factors,
    demand: f64,
    slack: f64,
    cap_ms: f64,
    cluster: u32,
) -> Option<Plan> {
    if slack > 1.0 {
        if let Some(mut plan) = hardware_scaling(model, factors, demand * slack, cap_ms, cluster) {
            scale_loads(&mut plan, demand);
            return Some(plan);
        }
        let mut plan = hardware_scaling(model, factors, demand, cap_ms, cluster)?;
        fill_spare(model, &mut plan, cluster);
        return Some(plan);
    }
    hardware_scaling(model, factors, demand, cap_ms, cluster)
}

/// Planned loads and demand of `plan` rescaled to `demand`.
fn scale_loads(plan: &mut Plan, demand: f64) {
    let ratio = if plan.demand > 0.0 { demand / plan.demand } else { 0.0 };
    for h in &mut plan.hosts {
        h.load *= ratio;
    }
    plan.demand = demand;
}

/// Give the workers a plan leaves idle, one at a time, to the hosted variant with
/// the highest planned load per unit of capacity.
pub fn fill_spare(model: &PipelineModel, plan: &mut Plan, cluster: u32) {
    while plan.workers() < cluster && !plan.hosts.is_empty() {
        let utilisation = |h: &crate::plan::Hosting| {
            let b = model.batches.iter().position(|&x| x == h.batch).unwrap_or(0);
            h.load / (h.replicas as f64 * model.tasks[h.task].variants[h.variant].throughput(b, &model.batches))
        };
        let open: Vec<usize> = (0..plan.hosts.len())
            .filter(|&h| plan.task_workers(plan.hosts[h].task) < model.tasks[plan.hosts[h].task].max_replicas)
            .collect();
        let Some(busiest) = open.into_iter().max_by(|&a, &b| utilisation(&plan.hosts[a]).total_cmp(&utilisation(&plan.hosts[b]))) else {
            break;
        };
        plan.hosts[busiest].replicas += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::toy;

    fn plan_at(model: &PipelineModel, factors: &Factors, demand: f64) -> Plan {
        let request = PlanRequest {
            model,
            factors,
            demand,
            cluster: 10,
            cap_ms: 100.0,
            limits: SolverLimits { max_nodes: 100_000, max_pivots: 50_000_000, ..SolverLimits::default() },
            previous: None,
            fill_spare: false,
            slack: 1.0,
        };
        resource_manager(&request).0
    }

    #[test]
    fn planned_accuracy_matches_the_spec_reference_values() {
        let (model, factors) = toy::chain_model();
        for (demand, expected) in [(700.0, 0.946), (900.0, 0.870), (1200.0, 0.763), (2000.0, 0.630)] {
            let plan = plan_at(&model, &factors, demand);
            assert_eq!(plan.regime, Regime::Accuracy, "D = {demand}");
            assert!((plan.accuracy - expected).abs() < 0.0015, "D = {demand}: {} vs {expected}", plan.accuracy);
        }
    }
}
