//! HERD, SHEPHERD's periodic planner: split the GPUs into serving groups of at most Ḡ,
//! and map streams and models to groups so that every group's GPUs cover its load with
//! the most head-room (the spec's "HERD-balanced" objective: maximise
//! `min_j size_j / Σ_{i∈j} n_i`, §3.4 and §9.10).
//!
//! Two solvers, both pure Rust and compiled into the `.wasm`:
//! - [`Solver::Heuristic`] (default): the spec's small-scale heuristic — GPUs shared
//!   among affinity sets by load, near-equal groups, hot model-streams sharded by their
//!   member streams, LPT placement, then a hill-climb over stream and GPU moves;
//! - [`Solver::Exact`]: every partition of the model-streams into groups (with memory
//!   and affinity constraints), each with its optimal integer group sizes (water-filling
//!   GPUs onto the group with the least head-room, which maximises the minimum), under
//!   a search-node budget. Exact for the unsharded problem; meant for ≤ 10 model-streams.

use std::cmp::Reverse;

/// Which solver plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    /// §3.4 steps 1–5.
    Heuristic,
    /// Exhaustive search over partitions (small instances).
    Exact,
}

/// One stream's demand.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamLoad {
    /// Its model.
    pub model: usize,
    /// GPUs its mean load needs (`n_s = rate_s / T_s`).
    pub need: f64,
}

/// What HERD plans from.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput {
    /// N: GPUs in the cluster.
    pub gpus: u32,
    /// Ḡ: most GPUs per group.
    pub group_limit: u32,
    /// Memory of one GPU (0: unlimited).
    pub gpu_memory: u64,
    /// Memory of each model.
    pub model_memory: Vec<u64>,
    /// Affinity set of each model.
    pub affinity: Vec<usize>,
    /// Streams, by stream id.
    pub streams: Vec<StreamLoad>,
}

/// One serving group of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPlan {
    /// GPUs.
    pub size: u32,
    /// Models loaded on every GPU of the group (ascending).
    pub models: Vec<usize>,
    /// Its affinity set.
    pub affinity: usize,
}

/// A plan: groups and the stream → group map.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Groups (every one with at least one GPU).
    pub groups: Vec<GroupPlan>,
    /// The group of each stream (by stream id).
    pub stream_group: Vec<usize>,
}

impl Plan {
    /// `min_j size_j / load_j` over groups with load (infinite when none has any).
    pub fn objective(&self, input: &PlanInput) -> f64 {
        let mut load = vec![0.0; self.groups.len()];
        for (stream, &group) in self.stream_group.iter().enumerate() {
            load[group] += input.streams[stream].need;
        }
        self.groups.iter().zip(&load).filter(|(_, &l)| l > 0.0).map(|(g, l)| g.size as f64 / l).fold(f64::INFINITY, f64::min)
    }

    /// Every way the plan breaks the ILP's constraints (empty when valid).
    pub fn violations(&self, input: &PlanInput) -> Vec<String> {
        let mut out = Vec::new();
        let total: u32 = self.groups.iter().map(|g| g.size).sum();
        if total > input.gpus {
            out.push(format!("{total} GPUs planned, {} exist", input.gpus));
        }
        for (j, g) in self.groups.iter().enumerate() {
            if g.size == 0 || g.size > input.group_limit {
                out.push(format!("group {j} has {} GPUs (limit {})", g.size, input.group_limit));
            }
            let memory: u64 = g.models.iter().map(|&m| input.model_memory[m]).sum();
            if input.gpu_memory > 0 && memory > input.gpu_memory {
                out.push(format!("group {j} needs {memory} bytes per GPU, {} exist", input.gpu_memory));
            }
            if g.models.iter().any(|&m| input.affinity[m] != g.affinity) {
                out.push(format!("group {j} mixes affinity sets"));
            }
        }
        if self.stream_group.len() != input.streams.len() {
            out.push("not every stream has a group".into());
        }
        for (s, &j) in self.stream_group.iter().enumerate() {
            match self.groups.get(j) {
                None => out.push(format!("stream {s} maps to missing group {j}")),
                Some(g) if !g.models.contains(&input.streams[s].model) => out.push(format!("stream {s}'s group {j} lacks its model")),
                _ => {}
            }
        }
        out
    }
}

/// Plan with `solver`; `nodes` bounds the exact search (it falls back on the heuristic
/// when the budget runs out before any complete plan).
pub fn plan(input: &PlanInput, solver: Solver, nodes: u64) -> Plan {
    let heuristic = heuristic(input);
    match solver {
        Solver::Heuristic => heuristic,
        Solver::Exact => match exact(input, nodes) {
            Some(best) if best.objective(input) >= heuristic.objective(input) => best,
            _ => heuristic,
        },
    }
}

/// A unit HERD places: a model-stream (or a shard of one).
#[derive(Debug, Clone)]
struct Item {
    model: usize,
    streams: Vec<usize>,
    need: f64,
}

/// Model-streams: every stream of a model merged (§3.4 scale-down).
fn model_streams(input: &PlanInput) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    for (s, load) in input.streams.iter().enumerate() {
        match items.iter_mut().find(|i| i.model == load.model) {
            Some(item) => {
                item.streams.push(s);
                item.need += load.need;
            }
            None => items.push(Item { model: load.model, streams: vec![s], need: load.need }),
        }
    }
    items
}

/// Affinity sets in use, ascending.
fn sets_in_use(input: &PlanInput, items: &[Item]) -> Vec<usize> {
    let mut sets: Vec<usize> = items.iter().map(|i| input.affinity[i.model]).collect();
    sets.sort_unstable();
    sets.dedup();
    sets
}

/// Groups being built.
#[derive(Debug, Clone)]
struct Draft {
    affinity: usize,
    size: u32,
    items: Vec<usize>,
}

fn draft_memory(input: &PlanInput, items: &[Item], draft: &Draft, extra: Option<usize>) -> u64 {
    let mut models: Vec<usize> = draft.items.iter().map(|&i| items[i].model).chain(extra.map(|i| items[i].model)).collect();
    models.sort_unstable();
    models.dedup();
    models.iter().map(|&m| input.model_memory[m]).sum()
}

fn fits(input: &PlanInput, items: &[Item], draft: &Draft, extra: usize) -> bool {
    input.gpu_memory == 0 || draft_memory(input, items, draft, Some(extra)) <= input.gpu_memory
}

fn load(items: &[Item], draft: &Draft) -> f64 {
    draft.items.iter().map(|&i| items[i].need).sum()
}

/// `min_j size_j / load_j` of drafts, then how many groups reach that minimum (fewer
/// is better), for the hill-climb's comparisons.
fn score(items: &[Item], drafts: &[Draft]) -> (f64, usize) {
    let ratios: Vec<f64> = drafts.iter().filter(|d| load(items, d) > 0.0).map(|d| d.size as f64 / load(items, d)).collect();
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    (min, ratios.iter().filter(|&&r| r <= min * (1.0 + 1e-12)).count())
}

fn improves(new: (f64, usize), old: (f64, usize)) -> bool {
    new.0 > old.0 * (1.0 + 1e-9) || (new.0 >= old.0 * (1.0 - 1e-12) && new.1 < old.1)
}

/// The spec's small-scale heuristic (§3.4 steps 1–5).
/// Budget of the heuristic's hill-climb: candidate plans scored times groups (each
/// candidate copies and scores every group). Small instances never reach it.
const HILL_CLIMB_WORK: u64 = 400_000;

/// Plans with more groups skip the hill-climb: a single step visits every pair of
/// groups (160 000 pairs for 400), more than a policy call's fuel allows; LPT over
/// near-equal groups is what they get.
const HILL_CLIMB_MAX_GROUPS: usize = 64;

fn heuristic(input: &PlanInput) -> Plan {
    let base = model_streams(input);
    let sets = sets_in_use(input, &base);
    if sets.is_empty() || input.gpus == 0 {
        return Plan { groups: Vec::new(), stream_group: vec![0; input.streams.len()] };
    }
    let set_load: Vec<f64> = sets.iter().map(|&c| base.iter().filter(|i| input.affinity[i.model] == c).map(|i| i.need).sum()).collect();
    let gpus_per_set = share(input.gpus, &set_load);
    // Step 3: shard model-streams hotter than a full group's share.
    let mut items: Vec<Item> = Vec::new();
    for item in base {
        let c = sets.iter().position(|&s| s == input.affinity[item.model]).expect("set in use");
        let per_gpu = if gpus_per_set[c] > 0 { set_load[c] / gpus_per_set[c] as f64 } else { f64::INFINITY };
        let cap = input.group_limit as f64 * per_gpu;
        let parts = if cap > 0.0 && item.need > cap { ((item.need / cap).ceil() as usize).min(item.streams.len()) } else { 1 };
        if parts <= 1 {
            items.push(item);
            continue;
        }
        let mut shards: Vec<Item> = (0..parts).map(|_| Item { model: item.model, streams: Vec::new(), need: 0.0 }).collect();
        let mut members = item.streams.clone();
        members.sort_by(|a, b| input.streams[*b].need.total_cmp(&input.streams[*a].need).then(a.cmp(b)));
        for s in members {
            let lightest = (0..parts).min_by(|&a, &b| shards[a].need.total_cmp(&shards[b].need)).expect("parts");
            shards[lightest].streams.push(s);
            shards[lightest].need += input.streams[s].need;
        }
        items.extend(shards);
    }
    // Step 2: near-equal groups per set.
    let mut drafts: Vec<Draft> = Vec::new();
    for (c, &set) in sets.iter().enumerate() {
        let n = gpus_per_set[c];
        if n == 0 {
            continue;
        }
        let count = n.div_ceil(input.group_limit);
        for g in 0..count {
            let size = n / count + u32::from(g < n % count);
            drafts.push(Draft { affinity: set, size, items: Vec::new() });
        }
    }
    // Step 4: LPT placement.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| items[b].need.total_cmp(&items[a].need).then(a.cmp(&b)));
    for i in order {
        let set = input.affinity[items[i].model];
        let candidates: Vec<usize> = (0..drafts.len()).filter(|&j| drafts[j].affinity == set).collect();
        let key = |j: usize| (load(&items, &drafts[j]) + items[i].need) / drafts[j].size as f64;
        let fitting = candidates.iter().copied().filter(|&j| fits(input, &items, &drafts[j], i));
        let chosen = fitting.min_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
        // Nowhere fits in memory: open a group with a GPU of the set's largest group.
        let largest = candidates.iter().copied().filter(|&j| drafts[j].size > 1).max_by_key(|&j| (drafts[j].size, Reverse(j)));
        let chosen = match (chosen, largest) {
            (Some(j), _) => Some(j),
            (None, Some(donor)) => {
                drafts[donor].size -= 1;
                drafts.push(Draft { affinity: set, size: 1, items: Vec::new() });
                Some(drafts.len() - 1)
            }
            (None, None) => candidates.iter().copied().min_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b))),
        };
        if let Some(j) = chosen {
            drafts[j].items.push(i);
        }
    }
    // Step 5: hill-climb, within a budget of candidate evaluations (a step over
    // hundreds of groups has millions of candidates; it takes the best found so far).
    let mut current = score(&items, &drafts);
    let evaluations = std::cell::Cell::new(0u64);
    let max_evaluations = if drafts.len() > HILL_CLIMB_MAX_GROUPS { 0 } else { HILL_CLIMB_WORK / drafts.len().max(1) as u64 };
    for _ in 0..1000 {
        if evaluations.get() >= max_evaluations {
            break;
        }
        let mut best: Option<(Vec<Draft>, (f64, usize))> = None;
        let consider = |candidate: Vec<Draft>, best: &mut Option<(Vec<Draft>, (f64, usize))>| {
            evaluations.set(evaluations.get() + 1);
            let s = score(&items, &candidate);
            if improves(s, best.as_ref().map_or(current, |b| b.1)) {
                *best = Some((candidate, s));
            }
        };
        'pairs: for from in 0..drafts.len() {
            for to in 0..drafts.len() {
                if evaluations.get() >= max_evaluations {
                    break 'pairs;
                }
                if from == to || drafts[from].affinity != drafts[to].affinity {
                    continue;
                }
                // Move one GPU.
                if drafts[from].size > 1 && drafts[to].size < input.group_limit {
                    let mut candidate = drafts.clone();
                    candidate[from].size -= 1;
                    candidate[to].size += 1;
                    consider(candidate, &mut best);
                }
                // Move one item, or swap two.
                for (at, &i) in drafts[from].items.iter().enumerate() {
                    if fits(input, &items, &drafts[to], i) {
                        let mut candidate = drafts.clone();
                        candidate[from].items.remove(at);
                        candidate[to].items.push(i);
                        // The item may take a GPU with it.
                        if candidate[from].size > 1 && candidate[to].size < input.group_limit {
                            let mut with_gpu = candidate.clone();
                            with_gpu[from].size -= 1;
                            with_gpu[to].size += 1;
                            consider(with_gpu, &mut best);
                        }
                        consider(candidate, &mut best);
                    }
                    if from > to {
                        continue;
                    }
                    for (other_at, &other) in drafts[to].items.iter().enumerate() {
                        let mut candidate = drafts.clone();
                        candidate[from].items[at] = other;
                        candidate[to].items[other_at] = i;
                        let fine = |d: &Draft| input.gpu_memory == 0 || draft_memory(input, &items, d, None) <= input.gpu_memory;
                        if fine(&candidate[from]) && fine(&candidate[to]) {
                            consider(candidate, &mut best);
                        }
                    }
                }
            }
        }
        match best {
            Some((next, s)) => {
                drafts = next;
                current = s;
            }
            None => break,
        }
    }
    finish(input, &items, drafts)
}

/// Turn drafts into a plan (groups without GPUs are left out; their streams, if any,
/// go to the first group of their set).
fn finish(input: &PlanInput, items: &[Item], drafts: Vec<Draft>) -> Plan {
    let kept: Vec<Draft> = drafts.into_iter().filter(|d| d.size > 0).collect();
    let mut stream_group = vec![0usize; input.streams.len()];
    let mut groups: Vec<GroupPlan> = kept.iter().map(|d| GroupPlan { size: d.size, models: Vec::new(), affinity: d.affinity }).collect();
    for (j, d) in kept.iter().enumerate() {
        for &i in &d.items {
            for &s in &items[i].streams {
                stream_group[s] = j;
            }
            groups[j].models.push(items[i].model);
        }
    }
    for g in &mut groups {
        g.models.sort_unstable();
        g.models.dedup();
    }
    Plan { groups, stream_group }
}

/// Split `total` in proportion to `weights`, at least 1 each (largest remainder).
fn share(total: u32, weights: &[f64]) -> Vec<u32> {
    let n = weights.len();
    if n == 0 {
        return Vec::new();
    }
    if total as usize <= n {
        return (0..n).map(|i| u32::from((i as u32) < total)).collect();
    }
    let sum: f64 = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let spare = (total as usize - n) as f64;
    let exact: Vec<f64> = weights.iter().map(|w| spare * w / sum).collect();
    let mut out: Vec<u32> = exact.iter().map(|e| 1 + e.floor() as u32).collect();
    let mut left = total - out.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Optimal integer sizes for groups with these loads: one GPU each, then each further
/// GPU to the group with the least head-room (ties: lowest index). `None` when the
/// groups need more GPUs than exist.
fn water_fill(loads: &[f64], gpus: u32, limit: u32) -> Option<Vec<u32>> {
    if loads.len() as u32 > gpus {
        return None;
    }
    let mut sizes = vec![1u32; loads.len()];
    for _ in loads.len() as u32..gpus {
        let lowest = (0..loads.len())
            .filter(|&j| sizes[j] < limit)
            .min_by(|&a, &b| (sizes[a] as f64 / loads[a]).total_cmp(&(sizes[b] as f64 / loads[b])).then(a.cmp(&b)));
        match lowest {
            Some(j) => sizes[j] += 1,
            None => break,
        }
    }
    Some(sizes)
}

/// Exhaustive search over partitions of the model-streams.
fn exact(input: &PlanInput, nodes: u64) -> Option<Plan> {
    let items = model_streams(input);
    // Groups smaller than Ḡ are allowed, so memory may call for more than ⌈N/Ḡ⌉ of them.
    let slots = items.len().min(input.gpus as usize);
    let mut search = Search { input, items: &items, slots, nodes, best: None, groups: Vec::new() };
    search.assign(0);
    let (_, drafts) = search.best?;
    Some(finish(input, &items, drafts))
}

struct Search<'a> {
    input: &'a PlanInput,
    items: &'a [Item],
    slots: usize,
    nodes: u64,
    best: Option<(f64, Vec<Draft>)>,
    groups: Vec<Draft>,
}

impl Search<'_> {
    fn assign(&mut self, i: usize) {
        if self.nodes == 0 {
            return;
        }
        self.nodes -= 1;
        if i == self.items.len() {
            self.evaluate();
            return;
        }
        let set = self.input.affinity[self.items[i].model];
        for j in 0..self.groups.len() {
            if self.groups[j].affinity != set || !fits(self.input, self.items, &self.groups[j], i) {
                continue;
            }
            self.groups[j].items.push(i);
            self.assign(i + 1);
            self.groups[j].items.pop();
        }
        if self.groups.len() < self.slots {
            self.groups.push(Draft { affinity: set, size: 0, items: vec![i] });
            self.assign(i + 1);
            self.groups.pop();
        }
    }

    fn evaluate(&mut self) {
        let loads: Vec<f64> = self.groups.iter().map(|d| load(self.items, d).max(1e-12)).collect();
        let Some(sizes) = water_fill(&loads, self.input.gpus, self.input.group_limit) else { return };
        let value = sizes.iter().zip(&loads).map(|(&s, &l)| s as f64 / l).fold(f64::INFINITY, f64::min);
        if self.best.as_ref().is_none_or(|(b, _)| value > *b * (1.0 + 1e-12)) {
            let mut drafts = self.groups.clone();
            for (d, s) in drafts.iter_mut().zip(sizes) {
                d.size = s;
            }
            self.best = Some((value, drafts));
        }
    }
}

/// Analytic single-GPU goodput of a stream (§3.4 step 1, a choice): `b*/l(b*)` with
/// `b*` the largest batch with `2·l(b*) ≤ slo`, or `1/l(1)` when only a batch of one
/// fits; `latency(b)` in nanoseconds; requests per second (0 when nothing fits).
pub fn single_gpu_goodput(latency: impl Fn(u32) -> u64, max_batch: u32, slo: u64) -> f64 {
    let best = (1..=max_batch).rev().find(|&b| 2 * latency(b) <= slo);
    match best {
        Some(b) => b as f64 / (latency(b) as f64 / 1e9),
        None if latency(1) <= slo => 1e9 / latency(1) as f64,
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitmix(state: &mut u64) -> u64 {
        let (next, value) = yardmaster_sdk::splitmix64(*state);
        *state = next;
        value
    }

    fn random_input(seed: u64, models: usize, streams: usize, gpus: u32, limit: u32) -> PlanInput {
        let mut state = seed;
        PlanInput {
            gpus,
            group_limit: limit,
            gpu_memory: 16,
            model_memory: (0..models).map(|_| 1 + splitmix(&mut state) % 6).collect(),
            affinity: vec![0; models],
            streams: (0..streams)
                .map(|s| StreamLoad {
                    model: if s < models { s } else { (splitmix(&mut state) % models as u64) as usize },
                    need: 0.1 + (splitmix(&mut state) % 1000) as f64 / 100.0,
                })
                .collect(),
        }
    }

    #[test]
    fn plans_are_valid() {
        for seed in 0..40 {
            let input = random_input(seed, 2 + (seed % 9) as usize, 4 + (seed % 20) as usize, 4 + (seed as u32 * 7) % 60, 12);
            for solver in [Solver::Heuristic, Solver::Exact] {
                let plan = plan(&input, solver, 200_000);
                assert_eq!(plan.violations(&input), Vec::<String>::new(), "seed {seed} {solver:?}: {plan:?}");
                assert!(plan.objective(&input) > 0.0);
            }
        }
    }

    #[test]
    fn heuristic_is_within_ten_percent_of_the_exact_optimum() {
        let mut worst: f64 = 1.0;
        for seed in 100..130 {
            let models = 2 + (seed % 9) as usize; // ≤ 10 model-streams
            let input = random_input(seed, models, models, 6 + (seed as u32 * 5) % 30, 12);
            let exact = exact(&input, 5_000_000).expect("a plan").objective(&input);
            let heuristic = heuristic(&input).objective(&input);
            worst = worst.min(heuristic / exact);
            assert!(heuristic >= 0.9 * exact, "seed {seed}: heuristic {heuristic} vs exact {exact}");
        }
        eprintln!("worst heuristic / exact ratio: {worst:.3}");
    }

    #[test]
    fn groups_respect_the_limit_and_memory() {
        // 40 GPUs, limit 12: at least four groups; a model too big to share stays alone.
        let input = PlanInput {
            gpus: 40,
            group_limit: 12,
            gpu_memory: 10,
            model_memory: vec![9, 2, 2, 2],
            affinity: vec![0; 4],
            streams: (0..8).map(|s| StreamLoad { model: s % 4, need: 1.0 + s as f64 }).collect(),
        };
        let plan = plan(&input, Solver::Heuristic, 0);
        assert!(plan.violations(&input).is_empty(), "{:?}", plan.violations(&input));
        assert!(plan.groups.len() >= 4);
        for g in &plan.groups {
            assert!(g.size <= 12);
            if g.models.contains(&0) {
                assert_eq!(g.models, vec![0]);
            }
        }
    }

    #[test]
    fn affinity_sets_never_share_a_group() {
        let input = PlanInput {
            gpus: 6,
            group_limit: 12,
            gpu_memory: 0,
            model_memory: vec![1; 4],
            affinity: vec![0, 0, 1, 1],
            streams: (0..4).map(|s| StreamLoad { model: s, need: 1.0 }).collect(),
        };
        for solver in [Solver::Heuristic, Solver::Exact] {
            let plan = plan(&input, solver, 100_000);
            assert!(plan.violations(&input).is_empty());
            assert_eq!(plan.groups.len(), 2, "{plan:?}");
            assert_eq!(plan.groups.iter().map(|g| g.size).sum::<u32>(), 6);
        }
    }

    #[test]
    fn water_filling_maximises_the_minimum_head_room() {
        assert_eq!(water_fill(&[1.0, 3.0], 8, 12), Some(vec![2, 6]));
        assert_eq!(water_fill(&[1.0, 1.0, 1.0], 2, 12), None);
        assert_eq!(water_fill(&[1.0, 100.0], 30, 12), Some(vec![12, 12]));
    }

    #[test]
    fn single_gpu_goodput_follows_the_half_slo_rule() {
        // l(b) = 1 ms · b + 10 ms; SLO 100 ms: 2·l(b) ≤ 100 → b* = 40, l = 50 ms.
        let l = |b: u32| (b as u64 + 10) * 1_000_000;
        assert!((single_gpu_goodput(l, 128, 100_000_000) - 800.0).abs() < 1e-6);
        // SLO 15 ms: no b with 2·l(b) ≤ 15, but l(1) = 11 ≤ 15 → 1/l(1).
        assert!((single_gpu_goodput(l, 128, 15_000_000) - 1e9 / 11e6).abs() < 1e-6);
        assert_eq!(single_gpu_goodput(l, 128, 5_000_000), 0.0);
    }
}
