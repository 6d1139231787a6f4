//! Batch vectors (one batch size per task) over Loki's tree of tasks, searched by
//! dynamic programming over the tree instead of one vector at a time.
//!
//! A single-path plan's cost is a sum over the tasks (the workers each needs at its
//! batch size) and its one constraint is per root-to-leaf branch (the batch
//! latencies along it within the cap). On a tree that separates: the cheapest way to
//! keep every path below task `t` within a latency `L` is `t`'s own batch plus, for
//! each child, the cheapest way to keep its paths within `L` less `t`'s latency. So
//! each task keeps a *frontier* — every (longest path below it, cost) pair that no
//! other choice beats on both — built from its children's, bottom up. A frontier
//! holds at most one point per cost, so the whole search is polynomial in the tasks
//! and batch sizes, where the vectors number `batch sizes ^ tasks` (823,543 on seven
//! tasks of seven sizes: out of an event call's fuel on the random applications of
//! `sim sweep --random-apps`).

use crate::model::PipelineModel;

/// Pareto points `(latency of the longest path, cost)`, latency ascending, cost
/// strictly descending.
pub(crate) type Frontier = Vec<(f64, u64)>;

/// Cost of a batch index a task may not take.
pub(crate) const NOT_ALLOWED: u64 = u64::MAX;

/// The batch vectors of one variant choice.
pub(crate) struct Vectors<'a> {
    model: &'a PipelineModel,
    /// Batch latency (ms) per task and batch index, of the choice's variant.
    latency: Vec<Vec<f64>>,
    cap_ms: f64,
}

impl<'a> Vectors<'a> {
    /// The vectors of `choice` (one variant per task) under the per-path cap.
    pub(crate) fn new(model: &'a PipelineModel, choice: &[usize], cap_ms: f64) -> Self {
        let latency = (0..model.tasks.len()).map(|t| model.tasks[t].variants[choice[t]].latency_ms.clone()).collect();
        Self { model, latency, cap_ms }
    }

    /// The root's frontier for per-task costs `cost[t][b]` ([`NOT_ALLOWED`] where
    /// task `t` may not take batch index `b`), with the batch index of task `t`
    /// fixed where `fixed[t]` is set, and points costing more than `limit` left out.
    pub(crate) fn frontier(&self, cost: &[Vec<u64>], fixed: &[Option<usize>], limit: u64) -> Frontier {
        let tasks = self.model.tasks.len();
        if tasks == 0 {
            return Vec::new();
        }
        // Tasks are numbered parents first, so children are done before their parent.
        let mut frontiers: Vec<Frontier> = vec![Vec::new(); tasks];
        for t in (0..tasks).rev() {
            let below = self.children(t, &frontiers, limit);
            let mut points: Vec<(f64, u64)> = Vec::new();
            let batches: Vec<usize> = match fixed[t] {
                Some(b) => vec![b],
                None => (0..self.model.batches.len()).collect(),
            };
            for b in batches {
                let (latency, own) = (self.latency[t][b], cost[t][b]);
                if own == NOT_ALLOWED || latency.is_nan() || latency > self.cap_ms {
                    continue;
                }
                for &(l, c) in &below {
                    let total = latency + l;
                    if total > self.cap_ms {
                        break;
                    }
                    let sum = own.saturating_add(c);
                    if sum <= limit {
                        points.push((total, sum));
                    }
                }
            }
            frontiers[t] = pareto(points);
        }
        std::mem::take(&mut frontiers[0])
    }

    /// The frontier of `t`'s children together: for each latency `L`, the sum over
    /// the children of the cheapest point within `L` (one point `(0, 0)` for a leaf).
    fn children(&self, t: usize, frontiers: &[Frontier], limit: u64) -> Frontier {
        let children = &self.model.tasks[t].children;
        if children.is_empty() {
            return vec![(0.0, 0)];
        }
        if children.iter().any(|&c| frontiers[c].is_empty()) {
            return Vec::new();
        }
        let mut levels: Vec<f64> = children.iter().flat_map(|&c| frontiers[c].iter().map(|p| p.0)).collect();
        levels.sort_by(f64::total_cmp);
        levels.dedup();
        let mut at = vec![0usize; children.len()];
        let mut points = Vec::new();
        for level in levels {
            let mut sum = 0u64;
            let mut every = true;
            for (i, &c) in children.iter().enumerate() {
                let f = &frontiers[c];
                while at[i] + 1 < f.len() && f[at[i] + 1].0 <= level {
                    at[i] += 1;
                }
                if f[at[i]].0 > level {
                    every = false;
                    break;
                }
                sum = sum.saturating_add(f[at[i]].1);
            }
            if every && sum <= limit {
                points.push((level, sum));
            }
        }
        pareto(points)
    }

    /// The first vector in odometer order (task 0's index turning fastest) among
    /// those whose root frontier gives the same `key` as the unrestricted search;
    /// `None` when the unrestricted search gives none. Task by task from the last,
    /// the lowest batch index that keeps the key is fixed.
    pub(crate) fn first_with<K: PartialEq>(
        &self,
        cost: &[Vec<u64>],
        limit: u64,
        key: impl Fn(&Frontier) -> Option<K>,
    ) -> Option<Vec<usize>> {
        let tasks = self.model.tasks.len();
        let mut fixed: Vec<Option<usize>> = vec![None; tasks];
        let target = key(&self.frontier(cost, &fixed, limit))?;
        for t in (0..tasks).rev() {
            let found = (0..self.model.batches.len()).find(|&b| {
                fixed[t] = Some(b);
                key(&self.frontier(cost, &fixed, limit)).as_ref() == Some(&target)
            });
            fixed[t] = Some(found.expect("the optimum has some batch at every task"));
        }
        Some(fixed.into_iter().map(|b| b.expect("fixed")).collect())
    }

    /// The longest branch latency of `vector`, summed along each branch from the root.
    pub(crate) fn longest(&self, vector: &[usize]) -> f64 {
        self.model.branches.iter().map(|branch| branch.iter().map(|&t| self.latency[t][vector[t]]).sum::<f64>()).fold(0.0, f64::max)
    }
}

/// The points no other point beats on both latency and cost, latency ascending.
fn pareto(mut points: Vec<(f64, u64)>) -> Frontier {
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut kept: Frontier = Vec::with_capacity(points.len());
    for p in points {
        if kept.last().is_none_or(|last| p.1 < last.1) {
            kept.push(p);
        }
    }
    kept
}

/// The cheapest point of a frontier, at its lowest latency.
pub(crate) fn cheapest(frontier: &Frontier) -> Option<(u64, u64)> {
    frontier.last().map(|&(l, c)| (c, l.to_bits()))
}

/// The lowest latency of a frontier.
pub(crate) fn quickest(frontier: &Frontier) -> Option<u64> {
    frontier.first().map(|p| p.0.to_bits())
}

#[cfg(test)]
mod tests {
    use yardmaster_sdk::{splitmix64, Config, LatencyTable, Stream};

    use crate::model::toy::{linear, stage, variant};
    use crate::model::{offline_factors, Factors, PipelineModel};
    use crate::plan::{Hosting, Plan};
    use crate::single_path::{
        best_single_path, cheapest_sizing, choice_accuracy, fewest_workers, fitting_choices, hardware_scaling, max_served_fraction,
        per_query_load,
    };
    use yardmaster_sdk::helpers::bottleneck_fill;

    /// Every batch vector in odometer order whose branches meet the cap, with its
    /// longest branch latency: the search these frontiers replace.
    fn every_vector(model: &PipelineModel, choice: &[usize], cap_ms: f64, f: &mut dyn FnMut(&[usize], f64)) {
        let tasks = model.tasks.len();
        let mut vector = vec![0usize; tasks];
        loop {
            let latency = |t: usize| model.tasks[t].variants[choice[t]].latency_ms[vector[t]];
            let worst = model.branches.iter().map(|b| b.iter().map(|&t| latency(t)).sum::<f64>()).fold(0.0, f64::max);
            if worst <= cap_ms {
                f(&vector, worst);
            }
            let mut slot = 0;
            while slot < tasks {
                vector[slot] += 1;
                if vector[slot] < model.batches.len() {
                    break;
                }
                vector[slot] = 0;
                slot += 1;
            }
            if slot == tasks {
                return;
            }
        }
    }

    /// The fewest workers and their lowest latency, by trying every vector.
    fn cheapest_by_scan(
        model: &PipelineModel,
        factors: &Factors,
        choice: &[usize],
        demand: f64,
        cap_ms: f64,
    ) -> Option<(u32, f64, Vec<usize>)> {
        let per_query = per_query_load(model, factors, choice);
        let mut best: Option<(u32, f64, Vec<usize>)> = None;
        every_vector(model, choice, cap_ms, &mut |vector, latency| {
            let mut workers = 0u32;
            for (t, &b) in vector.iter().enumerate() {
                let v = &model.tasks[t].variants[choice[t]];
                let r = ((demand * per_query[t] / v.throughput(b, &model.batches) - 1e-9).ceil().max(1.0)) as u32;
                if r > model.tasks[t].max_replicas {
                    return;
                }
                workers += r;
            }
            if best.as_ref().is_none_or(|(w, l, _)| workers < *w || workers == *w && latency < *l) {
                best = Some((workers, latency, vector.to_vec()));
            }
        });
        best
    }

    /// The largest served fraction, by trying every vector (workers spread one at a
    /// time to the bottleneck task), with its vector and replicas; ties go to the
    /// lower longest-branch latency, then to the first vector in odometer order.
    fn fraction_by_scan(
        model: &PipelineModel,
        factors: &Factors,
        choice: &[usize],
        demand: f64,
        cap_ms: f64,
        cluster: u32,
    ) -> Option<(f64, Vec<usize>, Vec<u32>)> {
        let per_query = per_query_load(model, factors, choice);
        let tasks = model.tasks.len();
        let caps: Vec<u32> = model.tasks.iter().map(|t| t.max_replicas).collect();
        let mut best: Option<(f64, f64, Vec<usize>, Vec<u32>)> = None;
        every_vector(model, choice, cap_ms, &mut |vector, latency| {
            let unit: Vec<f64> = (0..tasks)
                .map(|t| {
                    let q = model.tasks[t].variants[choice[t]].throughput(vector[t], &model.batches);
                    if per_query[t] > 0.0 {
                        q / per_query[t]
                    } else {
                        f64::INFINITY
                    }
                })
                .collect();
            let mut replicas = vec![1u32; tasks];
            bottleneck_fill(&unit, &vec![1; tasks], &caps, cluster, &mut replicas);
            let capacity = (0..tasks).map(|t| replicas[t] as f64 * unit[t]).fold(f64::INFINITY, f64::min);
            let fraction = if demand > 0.0 { (capacity / demand).min(1.0) } else { 1.0 };
            if best.as_ref().is_none_or(|(f, l, ..)| fraction > *f + 1e-12 || (fraction >= *f - 1e-12 && latency < *l)) {
                best = Some((fraction, latency, vector.to_vec(), replicas));
            }
        });
        best.filter(|_| cluster >= tasks as u32).map(|(f, _, vector, replicas)| (f, vector, replicas))
    }

    /// A single-path plan found by trying every choice and vector.
    #[derive(Debug)]
    struct Scanned {
        accuracy: f64,
        workers: u32,
        /// Variant, batch size and replicas per task.
        hosts: (Vec<u32>, Vec<u32>, Vec<u32>),
    }

    /// The greedy single-path plan by trying every variant choice and every batch
    /// vector: the most accurate choice whose cheapest sizing fits `cluster`, ties to
    /// fewer workers, then to the first choice in odometer order.
    fn greedy_by_scan(model: &PipelineModel, factors: &Factors, demand: f64, cap_ms: f64, cluster: u32) -> Option<Scanned> {
        let mut best: Option<Scanned> = None;
        let mut choice = vec![0usize; model.tasks.len()];
        loop {
            if let Some((workers, _, vector)) = cheapest_by_scan(model, factors, &choice, demand, cap_ms) {
                let accuracy = choice_accuracy(model, &choice);
                let better =
                    best.as_ref().is_none_or(|b| accuracy > b.accuracy + 1e-12 || (accuracy >= b.accuracy - 1e-12 && workers < b.workers));
                if workers <= cluster && better {
                    let per_query = per_query_load(model, factors, &choice);
                    let replicas = (0..model.tasks.len())
                        .map(|t| {
                            let v = &model.tasks[t].variants[choice[t]];
                            ((demand * per_query[t] / v.throughput(vector[t], &model.batches) - 1e-9).ceil().max(1.0)) as u32
                        })
                        .collect();
                    let variants = choice.iter().map(|&v| v as u32).collect();
                    let batches = vector.iter().map(|&b| model.batches[b]).collect();
                    best = Some(Scanned { accuracy, workers, hosts: (variants, batches, replicas) });
                }
            }
            let Some(slot) = (0..choice.len()).find(|&t| choice[t] + 1 < model.tasks[t].variants.len()) else {
                break;
            };
            choice[slot] += 1;
            choice[..slot].fill(0);
        }
        best
    }

    /// A random tree of up to `most` tasks (parents numbered first), 1–3 variants
    /// each, batch sizes up to 16 (some stages up to 4 or 8), 2–12 workers a task.
    fn random_tree(state: &mut u64, most: u64) -> (PipelineModel, Factors) {
        let mut draw = |n: u64| {
            let (s, v) = splitmix64(*state);
            *state = s;
            v % n
        };
        let tasks = 1 + draw(most) as usize;
        let batches = [1, 2, 4, 8, 16];
        let parents: Vec<Option<usize>> = (0..tasks).map(|t| if t == 0 { None } else { Some(draw(t as u64) as usize) }).collect();
        let mut stages = Vec::new();
        for t in 0..tasks {
            let successors = (0..tasks).filter(|&c| parents[c] == Some(t)).map(|c| c as u32).collect();
            let variants = (0..1 + draw(3))
                .map(|k| {
                    let alpha = 1.0 + draw(300) as f64 / 10.0;
                    let beta = 0.5 + draw(100) as f64 / 10.0;
                    let fan_out = draw(30) as f64 / 10.0;
                    variant(k as u32, "v", 0.5 + draw(50) as f64 / 100.0, linear(alpha, beta, &batches), fan_out)
                })
                .collect();
            let max_batch = [4, 8, 16][draw(3) as usize];
            let mut s = stage(t as u32, "t", successors, parents[t].map(|p| vec![p as u32]).unwrap_or_default(), variants, max_batch);
            s.max_replicas = 2 + draw(11) as u32;
            stages.push(s);
        }
        let config = Config {
            arm: "random".into(),
            stages,
            workers: Vec::new(),
            streams: vec![Stream { id: 0, name: "random".into(), entry: 0, slo: (40 + draw(400)) * 1_000_000 }],
            params: Vec::new(),
            tick_interval: 1_000_000_000,
            max_workers: 64,
            seed: 1,
            now: 0,
            hosts: Vec::new(),
        };
        let model = PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &batches).unwrap();
        let factors = offline_factors(&model, &[]);
        (model, factors)
    }

    #[test]
    fn frontiers_find_what_trying_every_batch_vector_finds() {
        let mut state = 43u64;
        let (mut sized, mut served) = (0, 0);
        for case in 0..600 {
            let (model, factors) = random_tree(&mut state, 6);
            let (s, pick) = splitmix64(state);
            state = s;
            let choice: Vec<usize> =
                model.tasks.iter().enumerate().map(|(t, task)| (pick as usize >> (2 * t)) % task.variants.len()).collect();
            let cap_ms = model.slo_ms / 2.0;
            let demand = [20.0, 150.0, 900.0, 4000.0][case % 4];
            let cluster = [3, 10, 40][case % 3];
            let scan = cheapest_by_scan(&model, &factors, &choice, demand, cap_ms);
            let found = cheapest_sizing(&model, &factors, &choice, demand, cap_ms);
            match (&scan, &found) {
                (None, None) => {}
                (Some((workers, latency, vector)), Some(sizing)) => {
                    sized += 1;
                    assert_eq!(sizing.workers(), *workers, "case {case}: {model:?}");
                    assert!((sizing.max_latency - latency).abs() < 1e-9, "case {case}: {} vs {latency}", sizing.max_latency);
                    assert_eq!(&sizing.batch, vector, "case {case}: the first vector in odometer order");
                }
                _ => panic!("case {case}: scan {scan:?}, frontier {found:?}"),
            }
            let scan = fraction_by_scan(&model, &factors, &choice, demand, cap_ms, cluster);
            let found = max_served_fraction(&model, &factors, &choice, demand, cap_ms, cluster);
            match (&scan, &found) {
                (None, None) => {}
                (Some((fraction, vector, replicas)), Some((f, plan))) => {
                    served += 1;
                    assert!((fraction - f).abs() < 1e-9, "case {case}: scan {fraction}, frontier {f}");
                    let batches: Vec<u32> = vector.iter().map(|&b| model.batches[b]).collect();
                    assert_eq!(plan.hosts.iter().map(|h| h.batch).collect::<Vec<_>>(), batches, "case {case}");
                    assert_eq!(&plan.hosts.iter().map(|h| h.replicas).collect::<Vec<_>>(), replicas, "case {case}");
                    assert!(plan.workers() <= cluster);
                }
                _ => panic!("case {case}: scan {scan:?}, frontier {:?}", found.map(|f| f.0)),
            }
        }
        eprintln!("{sized} sized, {served} served");
        // Enough of the cases are sizable, and enough serve some of the demand.
        assert!(sized > 200 && served > 200, "{sized} sized, {served} served");
    }

    #[test]
    fn the_greedy_and_hardware_plans_are_those_of_trying_every_choice_and_batch_vector() {
        let mut state = 7u64;
        let (mut greedy, mut hardware, mut neither) = (0, 0, 0);
        for case in 0..160 {
            let (model, factors) = random_tree(&mut state, 5);
            let cap_ms = model.slo_ms / 2.0;
            let demand = [20.0, 150.0, 900.0, 4000.0][case % 4];
            let cluster = [4, 12, 40][case % 3];
            let scan = greedy_by_scan(&model, &factors, demand, cap_ms, cluster);
            let plan = best_single_path(&model, &factors, demand, cap_ms, cluster);
            let of = |plan: &Plan| {
                let pick = |f: fn(&Hosting) -> u32| plan.hosts.iter().map(f).collect::<Vec<u32>>();
                (pick(|h| h.variant as u32), pick(|h| h.batch), pick(|h| h.replicas))
            };
            match (&scan, &plan) {
                (None, None) => neither += 1,
                (Some(scanned), Some(plan)) => {
                    greedy += 1;
                    assert!((plan.accuracy - scanned.accuracy).abs() < 1e-12, "case {case}: {} vs {}", plan.accuracy, scanned.accuracy);
                    assert_eq!(plan.workers(), scanned.workers, "case {case}");
                    assert_eq!(of(plan), scanned.hosts, "case {case}: {model:?}");
                }
                _ => panic!("case {case}: scan {scan:?}, frontiers {plan:?}"),
            }
            // STEP1: the most accurate choice alone.
            let most: Vec<usize> = model.tasks.iter().map(|t| t.most_accurate).collect();
            let scan = cheapest_by_scan(&model, &factors, &most, demand, cap_ms).filter(|(w, ..)| *w <= cluster);
            let plan = hardware_scaling(&model, &factors, demand, cap_ms, cluster);
            match (&scan, &plan) {
                (None, None) => {}
                (Some((workers, _, vector)), Some(plan)) => {
                    hardware += 1;
                    assert_eq!(plan.workers(), *workers, "case {case}");
                    let batches: Vec<u32> = vector.iter().map(|&b| model.batches[b]).collect();
                    assert_eq!(plan.hosts.iter().map(|h| h.batch).collect::<Vec<_>>(), batches, "case {case}");
                }
                _ => panic!("case {case}: scan {scan:?}, frontiers {plan:?}"),
            }
        }
        eprintln!("{greedy} greedy plans, {neither} none, {hardware} hardware plans");
        // Both outcomes, and the choices that fit, come up often enough to mean something.
        assert!(greedy > 60 && neither > 5 && hardware > 30, "{greedy} greedy, {neither} neither, {hardware} hardware");
    }

    #[test]
    fn the_fitting_choices_are_every_choice_whose_fewest_workers_fit_in_odometer_rank() {
        let mut state = 11u64;
        let (mut some, mut pruned) = (0, 0);
        for case in 0..300 {
            let (model, factors) = random_tree(&mut state, 7);
            let demand = [20.0, 150.0, 900.0, 4000.0, 20000.0][case % 5];
            let cluster = [4, 12, 40][case % 3];
            // Every choice in odometer order, kept where its bound fits.
            let mut expected = Vec::new();
            let mut choice = vec![0usize; model.tasks.len()];
            let mut rank = 0u64;
            loop {
                if fewest_workers(&model, &factors, &choice, demand) <= cluster as u64 {
                    expected.push((choice.clone(), rank));
                }
                rank += 1;
                let Some(slot) = (0..choice.len()).find(|&t| choice[t] + 1 < model.tasks[t].variants.len()) else {
                    break;
                };
                choice[slot] += 1;
                choice[..slot].fill(0);
            }
            let mut found = Vec::new();
            assert!(fitting_choices(&model, &factors, demand, cluster, &mut |choice, rank| {
                found.push((choice.to_vec(), rank));
                true
            }));
            found.sort_by_key(|f| f.1);
            assert_eq!(found, expected, "case {case}: {model:?}");
            some += !expected.is_empty() as u32;
            pruned += (expected.len() < rank as usize) as u32;
            // Asked to stop, it stops.
            if expected.len() > 1 {
                let mut handed = 0;
                assert!(!fitting_choices(&model, &factors, demand, cluster, &mut |_, _| {
                    handed += 1;
                    false
                }));
                assert_eq!(handed, 1);
            }
        }
        eprintln!("{some} with fitting choices, {pruned} with some passed over");
        assert!(some > 100 && pruned > 100, "{some} with fitting choices, {pruned} with some passed over");
    }
}
