//! The accuracy-scaling MILP (the spec's C1–C9 over the augmented graph), built for
//! the SDK's solver, with its two goals: the most accurate plan serving a demand
//! (STEP2), and the largest demand any plan serves (used when STEP2 is infeasible).
//!
//! Variables: `n(i,k,b)` replicas of variant `k` of task `i` at max batch `b`,
//! `z(i,k,b)` its batch choice, per path `p` its flow `c(p)` (a fraction of the
//! queries, or a rate for the capacity goal) and `I(p)` whether it carries traffic.
//! Batch sizes that cannot meet the per-path latency cap even beside the fastest
//! variants of the other tasks are left out, and so are paths that cannot.

use yardmaster_sdk::helpers::milp::{self, Problem, Relation, Search, Sense, Status, Var};

use crate::model::{multiplier, Factors, PipelineModel};
use crate::plan::{Hosting, Plan, Regime};

/// What the MILP optimises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// Serve `demand` root queries per second with the highest accuracy.
    Accuracy {
        /// Root demand (QPS).
        demand: f64,
    },
    /// The largest root demand the cluster can serve within the latency cap.
    Capacity,
}

/// One path's variables.
#[derive(Clone, Debug)]
struct PathVars {
    branch: usize,
    path: Vec<usize>,
    flow: Var,
    used: Var,
    accuracy: f64,
}

/// The MILP with the meaning of its variables.
pub struct Step2 {
    /// The program.
    pub problem: Problem,
    goal: Goal,
    /// `(task, variant, batch index, n, z)`.
    hosts: Vec<(usize, usize, usize, Var, Var)>,
    paths: Vec<PathVars>,
    demand_var: Option<Var>,
    branches: usize,
}

/// Weight of the worker count in the accuracy objective (tie-break: fewest workers).
const WORKER_EPSILON: f64 = 1e-6;

impl Step2 {
    /// Build the MILP; `None` when some branch has no path meeting the cap.
    pub fn build(model: &PipelineModel, factors: &Factors, cluster: u32, cap_ms: f64, goal: Goal) -> Option<Self> {
        let mut problem = Problem::new(Sense::Maximize);
        let tasks = model.tasks.len();
        let s = cluster as f64;
        // Slack each task has beside the fastest variants of the others, on its tightest branch.
        let slack: Vec<f64> = (0..tasks)
            .map(|t| {
                model
                    .branches
                    .iter()
                    .filter(|b| b.contains(&t))
                    .map(|b| cap_ms - b.iter().filter(|&&u| u != t).map(|&u| model.fastest_ms(u)).sum::<f64>())
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let worker_cost = match goal {
            Goal::Accuracy { .. } => -WORKER_EPSILON,
            Goal::Capacity => 0.0,
        };
        let big_n = (cluster.saturating_sub(tasks as u32 - 1)).max(1) as f64;
        let mut hosts = Vec::new();
        for (t, task) in model.tasks.iter().enumerate() {
            for (k, v) in task.variants.iter().enumerate() {
                for (b, &latency) in v.latency_ms.iter().enumerate() {
                    if latency <= slack[t] + 1e-9 {
                        let n = problem.add_var(0.0, big_n, true, worker_cost);
                        let z = problem.add_var(0.0, 1.0, true, 0.0);
                        hosts.push((t, k, b, n, z));
                    }
                }
            }
        }
        let host_vars = |t: usize, k: usize| hosts.iter().filter(move |h| h.0 == t && h.1 == k);
        // Flow bound for the capacity goal: every worker on the fastest root variant.
        let root = &model.tasks[0];
        let flow_bound = match goal {
            Goal::Accuracy { .. } => 1.0,
            Goal::Capacity => {
                s * root
                    .variants
                    .iter()
                    .flat_map(|v| (0..model.batches.len()).map(move |b| v.throughput(b, &model.batches)))
                    .filter(|q| q.is_finite())
                    .fold(0.0, f64::max)
            }
        };
        let demand_var = match goal {
            Goal::Capacity => Some(problem.add_var(0.0, flow_bound, false, 1.0)),
            Goal::Accuracy { .. } => None,
        };
        let branch_count = model.branches.len();
        let mut paths = Vec::new();
        for b in 0..branch_count {
            let mut any = false;
            for path in model.paths(b) {
                let tasks_on = &model.branches[b];
                // Cheapest latency of the path over allowed batches.
                let min_latency: f64 = tasks_on
                    .iter()
                    .zip(&path)
                    .map(|(&t, &k)| host_vars(t, k).map(|h| model.tasks[t].variants[k].latency_ms[h.2]).fold(f64::INFINITY, f64::min))
                    .sum();
                if min_latency.is_nan() || min_latency > cap_ms + 1e-9 {
                    continue;
                }
                any = true;
                let accuracy = model.path_accuracy(b, &path);
                let objective = match goal {
                    Goal::Accuracy { .. } => accuracy / branch_count as f64,
                    Goal::Capacity => 0.0,
                };
                let flow = problem.add_var(0.0, flow_bound, false, objective);
                let used = problem.add_var(0.0, 1.0, true, 0.0);
                paths.push(PathVars { branch: b, path, flow, used, accuracy });
            }
            if !any {
                return None;
            }
        }
        // C1, C2: one batch size per variant, replicas only at that size.
        for t in 0..tasks {
            for k in 0..model.tasks[t].variants.len() {
                let zs: Vec<(Var, f64)> = host_vars(t, k).map(|h| (h.4, 1.0)).collect();
                if zs.len() > 1 {
                    problem.add_constraint(zs, Relation::Le, 1.0);
                }
                for h in host_vars(t, k) {
                    problem.add_constraint(vec![(h.3, 1.0), (h.4, -big_n)], Relation::Le, 0.0);
                }
            }
        }
        // C3: throughput of each variant covers the load of the paths through it
        // (counted on one branch per task).
        for (t, task) in model.tasks.iter().enumerate() {
            let counting = model.counting_branch(t);
            let pos = model.branches[counting].iter().position(|&u| u == t).expect("on branch");
            for k in 0..task.variants.len() {
                let mut terms: Vec<(Var, f64)> = Vec::new();
                for p in paths.iter().filter(|p| p.branch == counting && p.path[pos] == k) {
                    let m = multiplier(model, factors, counting, &p.path, pos);
                    let coefficient = match goal {
                        Goal::Accuracy { demand } => demand * m,
                        Goal::Capacity => m,
                    };
                    if coefficient > 0.0 {
                        terms.push((p.flow, coefficient));
                    }
                }
                if terms.is_empty() {
                    continue;
                }
                for h in host_vars(t, k) {
                    terms.push((h.3, -task.variants[k].throughput(h.2, &model.batches)));
                }
                problem.add_constraint(terms, Relation::Le, 0.0);
            }
        }
        // C4: cluster size.
        problem.add_constraint(hosts.iter().map(|h| (h.3, 1.0)).collect(), Relation::Le, s);
        // C5: every query goes down every branch.
        for b in 0..branch_count {
            let mut terms: Vec<(Var, f64)> = paths.iter().filter(|p| p.branch == b).map(|p| (p.flow, 1.0)).collect();
            match demand_var {
                Some(d) => {
                    terms.push((d, -1.0));
                    problem.add_constraint(terms, Relation::Eq, 0.0);
                }
                None => problem.add_constraint(terms, Relation::Eq, 1.0),
            }
        }
        // C6: branches sharing a prefix split it alike.
        for a in 0..branch_count {
            for b in a + 1..branch_count {
                let shared = model.branches[a].iter().zip(&model.branches[b]).take_while(|(x, y)| x == y).count();
                let mut prefixes: Vec<Vec<usize>> = paths.iter().filter(|p| p.branch == a).map(|p| p.path[..shared].to_vec()).collect();
                prefixes.sort();
                prefixes.dedup();
                for prefix in prefixes {
                    let mut terms: Vec<(Var, f64)> = Vec::new();
                    for p in &paths {
                        if p.path[..shared] == prefix[..] {
                            if p.branch == a {
                                terms.push((p.flow, 1.0));
                            } else if p.branch == b {
                                terms.push((p.flow, -1.0));
                            }
                        }
                    }
                    problem.add_constraint(terms, Relation::Eq, 0.0);
                }
            }
        }
        // C7, C8: a path carries flow only if all its variants are hosted and its
        // latency at the chosen batch sizes meets the cap.
        for p in &paths {
            problem.add_constraint(vec![(p.flow, 1.0), (p.used, -flow_bound)], Relation::Le, 0.0);
            let tasks_on = &model.branches[p.branch];
            let mut latency_terms: Vec<(Var, f64)> = Vec::new();
            let mut big_m = 0.0;
            for (pos, (&t, &k)) in tasks_on.iter().zip(&p.path).enumerate() {
                let mut hosted: Vec<(Var, f64)> = vec![(p.used, 1.0)];
                let mut worst: f64 = 0.0;
                for h in host_vars(t, k) {
                    let latency = model.tasks[t].variants[k].latency_ms[h.2];
                    hosted.push((h.4, -1.0));
                    latency_terms.push((h.4, latency));
                    worst = worst.max(latency);
                }
                big_m += worst;
                // Where the path brings load to the variant, C3 already forces it to be
                // hosted; the explicit row is needed only where no load arrives.
                let counted = model.counting_branch(t) == p.branch;
                if !counted || multiplier(model, factors, p.branch, &p.path, pos) <= 0.0 {
                    problem.add_constraint(hosted, Relation::Le, 0.0);
                }
            }
            latency_terms.push((p.used, big_m));
            problem.add_constraint(latency_terms, Relation::Le, cap_ms + big_m);
        }
        // C9: every task keeps a worker.
        for t in 0..tasks {
            let terms: Vec<(Var, f64)> = hosts.iter().filter(|h| h.0 == t).map(|h| (h.3, 1.0)).collect();
            if terms.is_empty() {
                return None;
            }
            let cap = model.tasks[t].max_replicas;
            if cap < cluster {
                problem.add_constraint(terms.clone(), Relation::Le, cap as f64);
            }
            problem.add_constraint(terms, Relation::Ge, 1.0);
        }
        Some(Self { problem, goal, hosts, paths, demand_var, branches: branch_count })
    }

    /// The MILP point of `plan` (its replicas and batch sizes, with the most accurate
    /// flows they allow), if the plan is expressible and feasible here. With the
    /// replicas, batch choices and path indicators fixed, what is left is a small LP
    /// over the path flows (the spec's oracle step), solved on its own.
    pub fn point_of(&self, model: &PipelineModel, cap_ms: f64, plan: &Plan) -> Option<Vec<f64>> {
        let mut values = vec![0.0; self.problem.var_count()];
        for h in &self.hosts {
            let hosting = plan.hosting(h.0, h.1);
            let here = hosting.is_some_and(|p| model.batches[h.2] == p.batch);
            values[h.3] = if here { hosting.expect("hosted").replicas as f64 } else { 0.0 };
            values[h.4] = here as u8 as f64;
        }
        for p in &self.paths {
            let tasks_on = &model.branches[p.branch];
            let mut latency = 0.0;
            let mut hosted = true;
            for (&t, &k) in tasks_on.iter().zip(&p.path) {
                match plan.hosting(t, k) {
                    Some(h) => latency += model.tasks[t].variants[k].latency_ms[model.batches.iter().position(|&b| b == h.batch)?],
                    None => hosted = false,
                }
            }
            values[p.used] = (hosted && latency <= cap_ms + 1e-9) as u8 as f64;
        }
        // The flows (and the demand, for the capacity goal) stay free.
        let mut free: Vec<Option<usize>> = vec![None; self.problem.var_count()];
        let mut flows = Problem::new(Sense::Maximize);
        for v in self.paths.iter().map(|p| p.flow).chain(self.demand_var) {
            let (lower, upper) = self.problem.bounds(v);
            free[v] = Some(flows.add_var(lower, upper, false, self.problem.objective_coefficient(v)));
        }
        for c in self.problem.constraints() {
            let mut rhs = c.rhs;
            let mut terms = Vec::new();
            for &(v, a) in &c.terms {
                match free[v] {
                    Some(f) => terms.push((f, a)),
                    None => rhs -= a * values[v],
                }
            }
            if terms.is_empty() {
                let ok = match c.relation {
                    Relation::Le => rhs >= -1e-9,
                    Relation::Ge => rhs <= 1e-9,
                    Relation::Eq => rhs.abs() <= 1e-9,
                };
                if !ok {
                    return None;
                }
                continue;
            }
            flows.add_constraint(terms, c.relation, rhs);
        }
        let relaxed = milp::solve_relaxation(&flows, 100_000);
        if relaxed.status != Status::Optimal {
            return None;
        }
        for (v, slot) in free.iter().enumerate() {
            if let Some(f) = slot {
                values[v] = relaxed.values[*f];
            }
        }
        Some(values)
    }

    /// A resumable search, starting from the best of `warm` that is feasible.
    pub fn search(&self, warm: &[Vec<f64>]) -> Search {
        let best = warm
            .iter()
            .filter(|w| self.problem.is_feasible(w, 1e-6))
            .max_by(|a, b| self.problem.objective_value(a).total_cmp(&self.problem.objective_value(b)));
        Search::new(self.problem.clone(), best.map(Vec::as_slice))
    }

    /// The plan a solution describes.
    pub fn plan(&self, model: &PipelineModel, factors: &Factors, values: &[f64]) -> Plan {
        let mut hosts: Vec<Hosting> = Vec::new();
        for &(t, k, b, n, _) in &self.hosts {
            let replicas = values[n].round() as u32;
            if replicas == 0 {
                continue;
            }
            match hosts.iter_mut().find(|h| h.task == t && h.variant == k) {
                Some(h) => h.replicas += replicas,
                None => hosts.push(Hosting { task: t, variant: k, batch: model.batches[b], replicas, load: 0.0 }),
            }
        }
        let demand = match (self.goal, self.demand_var) {
            (Goal::Accuracy { demand }, _) => demand,
            (Goal::Capacity, Some(d)) => values[d],
            _ => 0.0,
        };
        let scale = match self.goal {
            Goal::Accuracy { demand } => demand,
            Goal::Capacity => 1.0,
        };
        let mut accuracy = 0.0;
        for p in &self.paths {
            let flow = values[p.flow].max(0.0);
            let fraction = if demand > 0.0 { flow * scale / demand } else { 0.0 };
            accuracy += fraction * p.accuracy / self.branches as f64;
            for (pos, (&t, &k)) in model.branches[p.branch].iter().zip(&p.path).enumerate() {
                if model.counting_branch(t) != p.branch {
                    continue;
                }
                if let Some(h) = hosts.iter_mut().find(|h| h.task == t && h.variant == k) {
                    h.load += flow * scale * multiplier(model, factors, p.branch, &p.path, pos);
                }
            }
        }
        Plan { hosts, accuracy, demand, regime: Regime::Accuracy }
    }

    /// Number of variables and constraints.
    pub fn size(&self) -> (usize, usize) {
        (self.problem.var_count(), self.problem.constraints().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{offline_factors, toy};
    use crate::plan::Hosting;
    use yardmaster_sdk::helpers::milp::Budget;
    use yardmaster_sdk::{Config, LatencyTable};

    /// The exact oracle (spec §4): every batch choice per variant (or unused), every
    /// replica vector with `Σx ≤ S`, each with its LP over the path flows.
    fn oracle(model: &PipelineModel, step: &Step2, cluster: u32, cap_ms: f64) -> Option<f64> {
        let variants: Vec<(usize, usize)> =
            (0..model.tasks.len()).flat_map(|t| (0..model.tasks[t].variants.len()).map(move |k| (t, k))).collect();
        let options = model.batches.len() + 1;
        let mut best: Option<f64> = None;
        let mut choice = vec![0usize; variants.len()];
        loop {
            // Replica vectors for the hosted variants.
            let hosted: Vec<usize> = (0..variants.len()).filter(|&i| choice[i] > 0).collect();
            let mut x = vec![1u32; hosted.len()];
            if hosted.len() as u32 <= cluster {
                loop {
                    let hosts = hosted
                        .iter()
                        .zip(&x)
                        .map(|(&i, &n)| Hosting {
                            task: variants[i].0,
                            variant: variants[i].1,
                            batch: model.batches[choice[i] - 1],
                            replicas: n,
                            load: 0.0,
                        })
                        .collect();
                    let plan = Plan { hosts, accuracy: 0.0, demand: 0.0, regime: Regime::Accuracy };
                    if let Some(point) = step.point_of(model, cap_ms, &plan) {
                        if step.problem.is_feasible(&point, 1e-6) {
                            let value = step.problem.objective_value(&point);
                            best = Some(best.map_or(value, |b: f64| b.max(value)));
                        }
                    }
                    // Next replica vector with Σx ≤ S.
                    let mut slot = 0;
                    loop {
                        if slot == x.len() {
                            break;
                        }
                        x[slot] += 1;
                        if x.iter().sum::<u32>() <= cluster {
                            break;
                        }
                        x[slot] = 1;
                        slot += 1;
                    }
                    if slot == x.len() {
                        break;
                    }
                }
            }
            let mut slot = 0;
            loop {
                if slot == choice.len() {
                    return best;
                }
                choice[slot] += 1;
                if choice[slot] < options {
                    break;
                }
                choice[slot] = 0;
                slot += 1;
            }
        }
    }

    fn random_chain(seed: u64) -> (Config, f64) {
        let mut state = seed;
        let mut next = |lo: f64, hi: f64| {
            let (s, v) = yardmaster_sdk::splitmix64(state);
            state = s;
            lo + (hi - lo) * ((v >> 11) as f64 / (1u64 << 53) as f64)
        };
        let b = [1, 2, 4];
        let mut config = toy::chain();
        config.stages[0].variants = vec![
            toy::variant(0, "a", 1.0, toy::linear(next(5.0, 15.0), next(2.0, 6.0), &b), next(1.0, 4.0)),
            toy::variant(1, "b", next(0.5, 0.95), toy::linear(next(2.0, 6.0), next(1.0, 3.0), &b), next(0.5, 3.0)),
        ];
        config.stages[1].variants = vec![
            toy::variant(0, "c", 1.0, toy::linear(next(4.0, 10.0), next(1.0, 4.0), &b), 0.0),
            toy::variant(1, "d", next(0.5, 0.95), toy::linear(next(1.0, 4.0), next(0.5, 2.0), &b), 0.0),
        ];
        config.stages[0].max_batch = 4;
        config.stages[1].max_batch = 4;
        config.max_workers = next(3.0, 6.99) as u32;
        let demand = next(20.0, 400.0);
        (config, demand)
    }

    #[test]
    fn the_milp_agrees_with_exact_enumeration_on_tiny_instances() {
        let mut compared = 0;
        for seed in 0..24u64 {
            let (config, demand) = random_chain(seed);
            let model = PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4]).unwrap();
            let factors = offline_factors(&model, &[]);
            let cluster = config.max_workers;
            let cap_ms = 30.0;
            let Some(step) = Step2::build(&model, &factors, cluster, cap_ms, Goal::Accuracy { demand }) else { continue };
            let exact = oracle(&model, &step, cluster, cap_ms);
            let solved = milp::solve(&step.problem, &Budget::default(), None);
            match exact {
                None => assert_eq!(solved.status, Status::Infeasible, "seed {seed}"),
                Some(value) => {
                    compared += 1;
                    assert_eq!(solved.status, Status::Optimal, "seed {seed}");
                    assert!((solved.objective - value).abs() < 1e-6, "seed {seed}: MILP {} vs oracle {value}", solved.objective);
                }
            }
        }
        assert!(compared >= 8, "enough feasible instances ({compared})");
    }
}
