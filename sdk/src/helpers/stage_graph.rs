//! The pipeline graph as pipeline-aware policies read it: successors and
//! predecessors, sinks, a topological order, every downstream path of a stage, the
//! longest path through a stage, and the stages grouped into sequential levels.
//!
//! Built once from the stages of the policy's configuration (the host validates the
//! graph as acyclic).

use crate::{Ctx, Stage, StageId, StageKind};

/// The stage graph of a pipeline (chain or DAG).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageGraph {
    successors: Vec<Vec<StageId>>,
    predecessors: Vec<Vec<StageId>>,
    order: Vec<StageId>,
}

impl StageGraph {
    /// The graph of `stages` (indexed by stage id; ids need not be dense).
    pub fn new(stages: &[Stage]) -> Self {
        let count = stages.iter().map(|s| s.id as usize + 1).max().unwrap_or(0);
        let mut successors = vec![Vec::new(); count];
        let mut predecessors = vec![Vec::new(); count];
        for stage in stages {
            successors[stage.id as usize] = stage.successors.clone();
            predecessors[stage.id as usize] = stage.predecessors.clone();
        }
        // Predecessor lists may be left empty by a caller: rebuild them from the edges.
        for stage in stages {
            for &next in &stage.successors {
                let list = &mut predecessors[next as usize];
                if !list.contains(&stage.id) {
                    list.push(stage.id);
                }
            }
        }
        let order = topological_order(&successors, &predecessors);
        Self { successors, predecessors, order }
    }

    /// A chain of `len` stages `0 → 1 → … → len−1` (for tests and examples).
    pub fn chain(len: usize) -> Self {
        let successors = (0..len).map(|k| if k + 1 < len { vec![k as StageId + 1] } else { vec![] }).collect();
        let predecessors = (0..len).map(|k| if k > 0 { vec![k as StageId - 1] } else { vec![] }).collect();
        Self { order: (0..len as StageId).collect(), successors, predecessors }
    }

    /// Number of stage slots (the largest stage id plus one).
    pub fn len(&self) -> usize {
        self.successors.len()
    }

    /// Whether the graph has no stage.
    pub fn is_empty(&self) -> bool {
        self.successors.is_empty()
    }

    /// Stages fed by `stage`.
    pub fn successors(&self, stage: StageId) -> &[StageId] {
        self.successors.get(stage as usize).map_or(&[], Vec::as_slice)
    }

    /// Stages feeding `stage`.
    pub fn predecessors(&self, stage: StageId) -> &[StageId] {
        self.predecessors.get(stage as usize).map_or(&[], Vec::as_slice)
    }

    /// Whether `stage` has no successor.
    pub fn is_sink(&self, stage: StageId) -> bool {
        self.successors(stage).is_empty()
    }

    /// Every stage, each after all of its predecessors.
    pub fn topological_order(&self) -> &[StageId] {
        &self.order
    }

    /// Every path from a successor of `stage` to a sink (`stage` itself excluded);
    /// empty for a sink. A chain has exactly one path per non-sink stage.
    pub fn downstream_paths(&self, stage: StageId) -> Vec<Vec<StageId>> {
        let mut paths = Vec::new();
        for &next in self.successors(stage) {
            let mut prefix = vec![next];
            self.extend_paths(&mut prefix, &mut paths);
        }
        paths
    }

    fn extend_paths(&self, prefix: &mut Vec<StageId>, out: &mut Vec<Vec<StageId>>) {
        let last = *prefix.last().expect("non-empty prefix");
        let successors = self.successors(last);
        if successors.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for &next in successors {
            prefix.push(next);
            self.extend_paths(prefix, out);
            prefix.pop();
        }
    }

    /// Every ancestor of `stage` (stages from which it can be reached), unordered.
    pub fn ancestors(&self, stage: StageId) -> Vec<StageId> {
        let mut seen = vec![false; self.len()];
        let mut stack = self.predecessors(stage).to_vec();
        let mut out = Vec::new();
        while let Some(s) = stack.pop() {
            if std::mem::replace(&mut seen[s as usize], true) {
                continue;
            }
            out.push(s);
            stack.extend_from_slice(self.predecessors(s));
        }
        out
    }

    /// The largest total `cost` of an entry-to-sink path through `stage`, counting
    /// `stage` itself once.
    pub fn longest_path_through(&self, stage: StageId, cost: impl Fn(StageId) -> f64) -> f64 {
        let n = self.len();
        // Longest path ending at each stage (inclusive), then starting at each (inclusive).
        let mut to = vec![0.0f64; n];
        for &s in &self.order {
            let best = self.predecessors(s).iter().map(|&p| to[p as usize]).fold(0.0, f64::max);
            to[s as usize] = best + cost(s);
        }
        let mut from = vec![0.0f64; n];
        for &s in self.order.iter().rev() {
            let best = self.successors(s).iter().map(|&c| from[c as usize]).fold(0.0, f64::max);
            from[s as usize] = best + cost(s);
        }
        to[stage as usize] + from[stage as usize] - cost(stage)
    }

    /// Each stage's share of an end-to-end budget in proportion to its `cost` along
    /// the longest path through it (Clipper-style split): `cost(k) / longest(k)`,
    /// 0 for a stage whose longest path costs nothing.
    pub fn proportional_shares(&self, cost: impl Fn(StageId) -> f64) -> Vec<f64> {
        (0..self.len() as StageId)
            .map(|k| {
                let longest = self.longest_path_through(k, &cost);
                if longest > 0.0 {
                    cost(k) / longest
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Per stage, the time to keep for the stages after it: the largest total `cost`
    /// over its downstream paths (the stage itself excluded; 0 at a sink). When the
    /// longest entry-to-sink path costs more than `budget`, every reserve is scaled by
    /// `budget / longest`, so that no stage's reserve leaves its own stage nothing.
    ///
    /// A scheduler that checks a request's deadline at one stage only uses it to
    /// hold back what the later stages need (`deadline − reserve[stage]`): otherwise an
    /// early stage under overload spends the whole end-to-end budget and the later
    /// stages receive requests that can no longer finish.
    pub fn downstream_reserve(&self, cost: impl Fn(StageId) -> f64, budget: f64) -> Vec<f64> {
        let n = self.len();
        // Longest path starting after each stage, and the longest path overall.
        let mut after = vec![0.0f64; n];
        let mut from = vec![0.0f64; n];
        for &s in self.order.iter().rev() {
            after[s as usize] = self.successors(s).iter().map(|&c| from[c as usize]).fold(0.0, f64::max);
            from[s as usize] = after[s as usize] + cost(s).max(0.0);
        }
        let longest = from.iter().copied().fold(0.0, f64::max);
        let scale = if longest > budget && longest > 0.0 { (budget / longest).max(0.0) } else { 1.0 };
        after.into_iter().map(|r| r * scale).collect()
    }

    /// Per stage, the time the stages before it take: the largest total `cost` over
    /// its upstream paths (the stage itself excluded; 0 at an entry), scaled as
    /// [`Self::downstream_reserve`] scales (by `budget / longest` when the longest
    /// entry-to-sink path costs more than `budget`). A stage's own budget along the
    /// longest path through it is `budget` less both: what a request that used its
    /// upstream stages' share has left there, after keeping the downstream stages'.
    pub fn upstream_reserve(&self, cost: impl Fn(StageId) -> f64, budget: f64) -> Vec<f64> {
        let n = self.len();
        let mut before = vec![0.0f64; n];
        let mut to = vec![0.0f64; n];
        for &s in &self.order {
            before[s as usize] = self.predecessors(s).iter().map(|&p| to[p as usize]).fold(0.0, f64::max);
            to[s as usize] = before[s as usize] + cost(s).max(0.0);
        }
        let longest = to.iter().copied().fold(0.0, f64::max);
        let scale = if longest > budget && longest > 0.0 { (budget / longest).max(0.0) } else { 1.0 };
        before.into_iter().map(|r| r * scale).collect()
    }

    /// The stages grouped into levels by their longest distance (in stages) from an
    /// entry: a chain gives one stage per level, a diamond puts its parallel branches
    /// in one level. Levels are run one after another; the stages of a level run side
    /// by side.
    pub fn levels(&self) -> Vec<Vec<StageId>> {
        let mut depth = vec![0usize; self.len()];
        for &s in &self.order {
            depth[s as usize] = self.predecessors(s).iter().map(|&p| depth[p as usize] + 1).max().unwrap_or(0);
        }
        let mut levels: Vec<Vec<StageId>> = Vec::new();
        for &s in &self.order {
            let d = depth[s as usize];
            if levels.len() <= d {
                levels.resize(d + 1, Vec::new());
            }
            levels[d].push(s);
        }
        for level in &mut levels {
            level.sort_unstable();
        }
        levels
    }
}

/// Per stage, the time a scheduler that checks deadlines stage by stage holds back for
/// the stages after it, and the time the stages before it take, by one measure:
/// `factor` batch durations per stage (wait for one batch, run one), each at the
/// stage's largest batch (at most `max_batch`) that fits the tightest SLO — a batch of
/// one if none does — and slowest variant, along the longest downstream (upstream)
/// path, scaled down to fit the tightest SLO ([`StageGraph::downstream_reserve`],
/// [`StageGraph::upstream_reserve`]). A stage that is not a batch stage costs nothing.
/// All zeros with a `factor` of 0.
///
/// A request's deadline at a stage less its downstream reserve is what it has there:
/// without it an early stage under overload spends the whole end-to-end budget and the
/// later stages receive requests that can no longer finish. A batch longer than the
/// SLO carries no request on time, so it never counts (counting one let a later
/// stage's reserve take an earlier stage's whole budget).
pub fn batch_reserves(ctx: &Ctx, factor: f64, max_batch: u32) -> (Vec<u64>, Vec<u64>) {
    let config = ctx.config();
    let graph = StageGraph::new(&config.stages);
    if factor <= 0.0 {
        return (vec![0; graph.len()], vec![0; graph.len()]);
    }
    let budget = config.streams.iter().map(|s| s.slo).filter(|&slo| slo > 0).min().map_or(f64::INFINITY, |slo| slo as f64);
    let cost = |s: StageId| -> f64 {
        let Some(stage) = config.stages.iter().find(|st| st.id == s) else { return 0.0 };
        if stage.kind != StageKind::Batch {
            return 0.0;
        }
        let limit = stage.max_batch.min(max_batch).max(1);
        let slowest = stage
            .variants
            .iter()
            .filter_map(|v| {
                let fits = (1..=limit).rev().find(|&b| ctx.latency().mean(s, v.id, b).is_some_and(|d| d as f64 <= budget)).unwrap_or(1);
                ctx.latency().mean(s, v.id, fits)
            })
            .max()
            .unwrap_or(0);
        factor * slowest as f64
    };
    let after = graph.downstream_reserve(cost, budget).into_iter().map(|r| r as u64).collect();
    let before = graph.upstream_reserve(cost, budget).into_iter().map(|r| r as u64).collect();
    (after, before)
}

/// Kahn's algorithm, smallest ready id first (deterministic).
fn topological_order(successors: &[Vec<StageId>], predecessors: &[Vec<StageId>]) -> Vec<StageId> {
    let mut indegree: Vec<usize> = predecessors.iter().map(Vec::len).collect();
    let mut ready: std::collections::BTreeSet<StageId> = (0..successors.len() as StageId).filter(|&s| indegree[s as usize] == 0).collect();
    let mut order = Vec::with_capacity(successors.len());
    while let Some(s) = ready.pop_first() {
        order.push(s);
        for &next in &successors[s as usize] {
            indegree[next as usize] -= 1;
            if indegree[next as usize] == 0 {
                ready.insert(next);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageKind;

    fn stage(id: StageId, successors: &[StageId]) -> Stage {
        Stage {
            id,
            name: format!("s{id}"),
            kind: StageKind::Batch,
            successors: successors.to_vec(),
            predecessors: vec![],
            variants: vec![],
            max_batch: 8,
            min_replicas: 1,
            max_replicas: 8,
        }
    }

    /// person → {pose ∥ face} → expression → eye: the `da` pipeline's shape.
    fn diamond() -> StageGraph {
        StageGraph::new(&[stage(0, &[1, 2]), stage(1, &[3]), stage(2, &[3]), stage(3, &[4]), stage(4, &[])])
    }

    #[test]
    fn chain_has_one_path_per_stage() {
        let g = StageGraph::chain(4);
        assert_eq!(g.downstream_paths(0), vec![vec![1, 2, 3]]);
        assert_eq!(g.downstream_paths(2), vec![vec![3]]);
        assert!(g.downstream_paths(3).is_empty());
        assert_eq!(g.levels(), vec![vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(g, StageGraph::new(&[stage(0, &[1]), stage(1, &[2]), stage(2, &[3]), stage(3, &[])]));
    }

    #[test]
    fn diamond_paths_levels_and_ancestors() {
        let g = diamond();
        assert_eq!(g.downstream_paths(0), vec![vec![1, 3, 4], vec![2, 3, 4]]);
        assert_eq!(g.downstream_paths(1), vec![vec![3, 4]]);
        assert_eq!(g.levels(), vec![vec![0], vec![1, 2], vec![3], vec![4]]);
        let mut ancestors = g.ancestors(3);
        ancestors.sort_unstable();
        assert_eq!(ancestors, vec![0, 1, 2]);
        assert_eq!(g.predecessors(3), &[1, 2]);
        assert!(g.is_sink(4) && !g.is_sink(3));
        assert_eq!(g.topological_order(), &[0, 1, 2, 3, 4]);
    }

    #[test]
    fn downstream_reserve_takes_the_heavier_branch_and_fits_the_budget() {
        let g = diamond();
        let cost = |s: StageId| [10.0, 5.0, 1.0, 2.0, 3.0][s as usize];
        // Paths after 0: 5+2+3 and 1+2+3.
        assert_eq!(g.downstream_reserve(cost, 100.0), vec![10.0, 5.0, 5.0, 3.0, 0.0]);
        // The longest path costs 20: a budget of 10 halves every reserve.
        assert_eq!(g.downstream_reserve(cost, 10.0), vec![5.0, 2.5, 2.5, 1.5, 0.0]);
        assert_eq!(StageGraph::chain(1).downstream_reserve(|_| 7.0, 1.0), vec![0.0]);
    }

    #[test]
    fn upstream_reserve_takes_the_heavier_branch_and_scales_as_the_downstream_one() {
        let g = diamond();
        let cost = |s: StageId| [10.0, 5.0, 1.0, 2.0, 3.0][s as usize];
        // Before 3: 10+5 and 10+1; before 4: 10+5+2.
        assert_eq!(g.upstream_reserve(cost, 100.0), vec![0.0, 10.0, 10.0, 15.0, 17.0]);
        assert_eq!(g.upstream_reserve(cost, 10.0), vec![0.0, 5.0, 5.0, 7.5, 8.5]);
        // Along the longest path, before + own + after is the (scaled) path.
        let (up, down) = (g.upstream_reserve(cost, 10.0), g.downstream_reserve(cost, 10.0));
        assert_eq!(up[3] + 0.5 * cost(3) + down[3], 10.0);
    }

    #[test]
    fn longest_path_through_picks_the_heavier_branch() {
        let g = diamond();
        let cost = |s: StageId| [10.0, 5.0, 1.0, 2.0, 3.0][s as usize];
        assert_eq!(g.longest_path_through(0, cost), 20.0);
        assert_eq!(g.longest_path_through(2, cost), 16.0);
        assert_eq!(g.longest_path_through(4, cost), 20.0);
        let shares = g.proportional_shares(cost);
        assert_eq!(shares[0], 0.5);
        assert_eq!(shares[2], 1.0 / 16.0);
        let chain: f64 = [0, 1, 3, 4].iter().map(|&s| shares[s]).sum();
        assert!((chain - 1.0).abs() < 1e-12);
    }
}
