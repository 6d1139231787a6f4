//! Compound (multi-call) LLM jobs (CALM spec §2 and §4.2): the tags that link a
//! call to its job, pattern graphs of finished jobs, the matching of a live job's
//! partial graph against them, and the stage sub-deadlines that follow.
//!
//! A compound job is a chain (or graph) of LLM calls under one end-to-end deadline
//! d_R. Its structure is revealed at run time: the client submits the calls of a
//! stage (one DAG depth level: calls that may run concurrently) once the previous
//! stage has finished. Every call carries the tags [`TAG_JOB`], [`TAG_STAGE`]
//! (1-based) and optionally [`TAG_APP`] and [`TAG_LAST`] (on the calls of the
//! job's final stage); its deadline is the job's, d_R.
//!
//! A [`PatternStore`] keeps finished jobs of each application as
//! [`PatternGraph`]s (lengths only, no text). [`PatternStore::share`] matches a
//! live job: it prunes graphs whose structure differs up to the current stage,
//! scores the rest with Gaussian kernels on the calls' output lengths (nodes) and
//! prompt lengths (edges), and returns the best match's cumulative share
//! φ(s) = t_{≤s} / t_total of execution time, from which [`sub_deadline`] gives
//! d_s = a_R + φ(s)·D. Without a surviving match, φ(s) = min(1, s / S_max).

use std::collections::BTreeMap;

/// Tag key: the job a call belongs to (an integer unique per client).
pub const TAG_JOB: &str = "job";
/// Tag key: the call's stage in its job, from 1.
pub const TAG_STAGE: &str = "stage";
/// Tag key: the call belongs to the job's final stage (any value).
pub const TAG_LAST: &str = "last";
/// Tag key: the job's application (pattern graphs are kept per application).
pub const TAG_APP: &str = "app";

/// Stage count assumed for an application with no finished job (spec §4.2).
pub const DEFAULT_MAX_STAGES: u32 = 5;
/// Graphs kept by default (spec §4.2: 500 already saturate matching accuracy).
pub const DEFAULT_CAPACITY: usize = 500;

/// How a call is linked to its compound job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLink {
    /// The job.
    pub job: u64,
    /// The call's stage, from 1.
    pub stage: u32,
    /// Whether the call belongs to the job's final stage.
    pub last: bool,
    /// The job's application ("" when untagged).
    pub app: String,
}

impl CallLink {
    /// The link of a call from its tags as (key, value) pairs; `None` unless both
    /// [`TAG_JOB`] and [`TAG_STAGE`] are present and numeric (stage ≥ 1).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let (mut job, mut stage, mut last, mut app) = (None, None, false, String::new());
        for (key, value) in pairs {
            match key {
                TAG_JOB => job = value.trim().parse::<u64>().ok(),
                TAG_STAGE => stage = value.trim().parse::<u32>().ok().filter(|s| *s >= 1),
                TAG_LAST => last = true,
                TAG_APP => app = value.to_string(),
                _ => {}
            }
        }
        Some(Self { job: job?, stage: stage?, last, app })
    }

    /// The link of a request from its tags.
    pub fn from_tags(tags: Option<&[crate::Tag]>) -> Option<Self> {
        Self::from_pairs(tags?.iter().map(|t| (t.key.as_str(), t.value.as_str())))
    }

    /// The link as (key, value) pairs, the inverse of [`CallLink::from_pairs`].
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut pairs = vec![(TAG_JOB.to_string(), self.job.to_string()), (TAG_STAGE.to_string(), self.stage.to_string())];
        if self.last {
            pairs.push((TAG_LAST.to_string(), "1".to_string()));
        }
        if !self.app.is_empty() {
            pairs.push((TAG_APP.to_string(), self.app.clone()));
        }
        pairs
    }

    /// The link as request tags.
    pub fn tags(&self) -> Vec<crate::Tag> {
        self.pairs().into_iter().map(|(key, value)| crate::Tag { key, value }).collect()
    }
}

/// One LLM call of a pattern graph (or of a live job: `output` unknown until it finishes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallNode {
    /// Prompt tokens (the edge attribute).
    pub prompt: u32,
    /// Output tokens (the node attribute), when known.
    pub output: Option<u32>,
}

/// The cost model of a stage's execution time: a call costs its prefill plus its
/// decode steps, and a stage lasts as long as its longest call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallCost {
    /// Seconds per prompt token.
    pub prefill_s: f64,
    /// Seconds per output token (a decode step).
    pub step_s: f64,
}

impl CallCost {
    /// Execution time of a call, seconds (an unknown output counts as none).
    pub fn call(&self, node: &CallNode) -> f64 {
        node.prompt as f64 * self.prefill_s + node.output.unwrap_or(0) as f64 * self.step_s
    }

    /// Execution time of a stage: its longest call.
    pub fn stage(&self, nodes: &[CallNode]) -> f64 {
        nodes.iter().map(|n| self.call(n)).fold(0.0, f64::max)
    }
}

/// A finished compound job: its calls by stage (every output known).
#[derive(Debug, Clone, PartialEq)]
pub struct PatternGraph {
    /// The calls of each stage, sorted by prompt length.
    pub stages: Vec<Vec<CallNode>>,
}

impl PatternGraph {
    /// A graph of `stages` (each stage's calls are sorted by prompt, then output).
    pub fn new(mut stages: Vec<Vec<CallNode>>) -> Self {
        for stage in &mut stages {
            sort_stage(stage);
        }
        Self { stages }
    }

    /// φ(s) = t_{≤s} / t_total under `cost` for `stage` (1-based), clamped to [0, 1];
    /// 1 when the graph has no cost at all.
    pub fn share(&self, stage: u32, cost: CallCost) -> f64 {
        let times: Vec<f64> = self.stages.iter().map(|s| cost.stage(s)).collect();
        let total: f64 = times.iter().sum();
        if total <= 0.0 {
            return if stage as usize >= self.stages.len() { 1.0 } else { stage as f64 / self.stages.len() as f64 };
        }
        let upto: f64 = times.iter().take(stage as usize).sum();
        (upto / total).clamp(0.0, 1.0)
    }

    /// Tokens (prompt + output) of the stages after `stage` (1-based).
    pub fn tokens_after(&self, stage: u32) -> u64 {
        self.stages.iter().skip(stage as usize).flatten().map(|n| n.prompt as u64 + n.output.unwrap_or(0) as u64).sum()
    }
}

fn sort_stage(stage: &mut [CallNode]) {
    stage.sort_by(|a, b| a.prompt.cmp(&b.prompt).then(a.output.cmp(&b.output)));
}

/// What matching says about a live job's current stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageShare {
    /// φ(s): the share of the job's execution time up to and including stage s.
    pub phi: f64,
    /// φ(s−1) (0 for the first stage).
    pub phi_before: f64,
    /// Tokens (prompt + output) of the matched graph's stages after s (0 without a match).
    pub future_tokens: u64,
    /// The matched graph's similarity, when a graph survived the pruning.
    pub similarity: Option<f64>,
}

#[derive(Debug, Clone)]
struct Stored {
    graph: PatternGraph,
    /// Reuse frequency: +1 per match, decayed over time.
    reuse: f64,
    /// Insertion order (ties when evicting).
    seq: u64,
}

/// Finished jobs per application, for matching live ones (spec §4.2).
#[derive(Debug, Clone)]
pub struct PatternStore {
    apps: BTreeMap<String, Vec<Stored>>,
    capacity: usize,
    seq: u64,
}

impl Default for PatternStore {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl PatternStore {
    /// A store keeping at most `capacity` graphs per application (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { apps: BTreeMap::new(), capacity: capacity.max(1), seq: 0 }
    }

    /// Graphs kept for `app`.
    pub fn len(&self, app: &str) -> usize {
        self.apps.get(app).map_or(0, Vec::len)
    }

    /// Record a finished job of `app`; beyond capacity the least reused graph (the
    /// oldest among equals) is evicted.
    pub fn record(&mut self, app: &str, graph: PatternGraph) {
        if graph.stages.is_empty() {
            return;
        }
        self.seq += 1;
        let graphs = self.apps.entry(app.to_string()).or_default();
        graphs.push(Stored { graph, reuse: 1.0, seq: self.seq });
        while graphs.len() > self.capacity {
            let victim = graphs
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| a.reuse.total_cmp(&b.reuse).then(a.seq.cmp(&b.seq)))
                .map(|(i, _)| i)
                .expect("non-empty");
            graphs.remove(victim);
        }
    }

    /// Multiply every reuse frequency by `factor` (the hourly ×0.9 decay).
    pub fn decay(&mut self, factor: f64) {
        for stored in self.apps.values_mut().flatten() {
            stored.reuse *= factor;
        }
    }

    /// S_max: the largest stage count among `app`'s graphs ([`DEFAULT_MAX_STAGES`] if none).
    pub fn max_stages(&self, app: &str) -> u32 {
        self.apps.get(app).and_then(|g| g.iter().map(|s| s.graph.stages.len() as u32).max()).unwrap_or(DEFAULT_MAX_STAGES)
    }

    /// The best match for a live job of `app` whose revealed stages are `partial`
    /// (the last one is the current stage): its index and similarity. Graphs with
    /// fewer stages, or a different call count in any revealed stage, are pruned.
    fn best(&self, app: &str, partial: &[Vec<CallNode>]) -> Option<(usize, f64)> {
        let graphs = self.apps.get(app)?;
        let current = partial.len();
        let survivors: Vec<usize> = (0..graphs.len())
            .filter(|&i| {
                let g = &graphs[i].graph;
                g.stages.len() >= current && partial.iter().zip(&g.stages).all(|(p, h)| p.len() == h.len())
            })
            .collect();
        if survivors.is_empty() {
            return None;
        }
        // σ of each attribute over the application's history.
        let outputs: Vec<f64> =
            graphs.iter().flat_map(|s| s.graph.stages.iter().flatten()).filter_map(|n| n.output.map(f64::from)).collect();
        let prompts: Vec<f64> = graphs.iter().flat_map(|s| s.graph.stages.iter().flatten()).map(|n| n.prompt as f64).collect();
        let (sigma_out, sigma_in) = (std_dev(&outputs), std_dev(&prompts));
        let mut sorted: Vec<Vec<CallNode>> = partial.to_vec();
        for stage in &mut sorted {
            sort_stage(stage);
        }
        let mut best: Option<(usize, f64)> = None;
        for i in survivors {
            let g = &graphs[i].graph;
            let (mut sum, mut terms) = (0.0, 0u32);
            for (live, past) in sorted.iter().zip(&g.stages) {
                for (x, y) in live.iter().zip(past) {
                    sum += kernel(x.prompt as f64, y.prompt as f64, sigma_in);
                    terms += 1;
                    if let (Some(a), Some(b)) = (x.output, y.output) {
                        sum += kernel(a as f64, b as f64, sigma_out);
                        terms += 1;
                    }
                }
            }
            let similarity = if terms == 0 { 1.0 } else { sum / terms as f64 };
            // Ties: the more reused graph, then the one with more stages (the earlier,
            // more cautious sub-deadline), then the newer one.
            let rank = |k: usize| (graphs[k].reuse, graphs[k].graph.stages.len(), graphs[k].seq);
            let better = match best {
                None => true,
                Some((j, s)) => similarity > s || (similarity == s && rank(i) > rank(j)),
            };
            if better {
                best = Some((i, similarity));
            }
        }
        best
    }

    /// φ(s) and the matched future tokens for a live job of `app` whose revealed
    /// stages are `partial` (stage s = `partial.len()`); `last` says the current stage
    /// is known to be the final one (φ = 1). A match counts as a reuse of its graph.
    /// Among equally similar graphs the more reused, then the longer, then the newer wins.
    pub fn share(&mut self, app: &str, partial: &[Vec<CallNode>], last: bool, cost: CallCost) -> StageShare {
        let stage = partial.len() as u32;
        let matched = self.best(app, partial);
        let (mut phi, mut phi_before, future_tokens) = match matched {
            Some((i, _)) => {
                let stored = &mut self.apps.get_mut(app).expect("matched")[i];
                stored.reuse += 1.0;
                let g = &stored.graph;
                (g.share(stage, cost), g.share(stage.saturating_sub(1), cost), g.tokens_after(stage))
            }
            None => {
                let s_max = self.max_stages(app).max(1) as f64;
                ((stage as f64 / s_max).min(1.0), (stage.saturating_sub(1) as f64 / s_max).min(1.0), 0)
            }
        };
        if last {
            phi = 1.0;
        }
        phi_before = phi_before.min(phi);
        StageShare { phi, phi_before, future_tokens: if last { 0 } else { future_tokens }, similarity: matched.map(|(_, s)| s) }
    }
}

/// The Gaussian kernel exp(−(x−y)²/2σ²); with σ = 0, 1 for equal values and 0 otherwise.
pub fn kernel(x: f64, y: f64, sigma: f64) -> f64 {
    if sigma <= 0.0 {
        return if x == y { 1.0 } else { 0.0 };
    }
    (-(x - y).powi(2) / (2.0 * sigma * sigma)).exp()
}

fn std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
}

/// d_s = a_R + φ(s)·(d_R − a_R), never before `previous` (d_{s−1}) nor after d_R.
pub fn sub_deadline(arrival: u64, deadline: u64, phi: f64, previous: u64) -> u64 {
    let span = deadline.saturating_sub(arrival) as f64;
    let d = arrival.saturating_add((phi.clamp(0.0, 1.0) * span) as u64);
    d.max(previous).min(deadline.max(previous))
}

/// Re-amortise a missed stage deadline (spec §3.7): d_s ← now + ((φ(s) − φ(s−1)) /
/// (1 − φ(s−1)))·(d_R − now), or d_R when nothing is left to share.
pub fn reamortise(now: u64, deadline: u64, share: &StageShare) -> u64 {
    if now >= deadline || share.phi_before >= 1.0 {
        return deadline;
    }
    let fraction = ((share.phi - share.phi_before) / (1.0 - share.phi_before)).clamp(0.0, 1.0);
    now + (fraction * (deadline - now) as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const COST: CallCost = CallCost { prefill_s: 0.0001, step_s: 0.01 };

    fn node(prompt: u32, output: u32) -> CallNode {
        CallNode { prompt, output: Some(output) }
    }

    fn open(prompt: u32) -> CallNode {
        CallNode { prompt, output: None }
    }

    #[test]
    fn links_round_trip_through_tags_and_need_job_and_stage() {
        let link = CallLink { job: 42, stage: 3, last: true, app: "code".into() };
        let pairs = link.pairs();
        assert_eq!(CallLink::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))), Some(link.clone()));
        assert_eq!(CallLink::from_tags(Some(&link.tags())), Some(link));
        assert_eq!(CallLink::from_pairs([("job", "1")]), None);
        assert_eq!(CallLink::from_pairs([("job", "1"), ("stage", "0")]), None, "stages count from 1");
        assert_eq!(CallLink::from_tags(None), None);
    }

    #[test]
    fn an_exact_match_gives_that_graphs_cumulative_share() {
        // Spec §9 property 11 (second half).
        let mut store = PatternStore::default();
        let exact = PatternGraph::new(vec![vec![node(100, 50)], vec![node(2000, 300)], vec![node(400, 100)]]);
        store.record("a", PatternGraph::new(vec![vec![node(5000, 900)], vec![node(10, 5)], vec![node(10, 5)]]));
        store.record("a", exact.clone());
        store.record("a", PatternGraph::new(vec![vec![node(100, 50)], vec![node(2000, 300)]]));
        let partial = vec![vec![node(100, 50)], vec![open(2000)]];
        let share = store.share("a", &partial, false, COST);
        assert!((share.phi - exact.share(2, COST)).abs() < 1e-12, "{share:?}");
        assert!((share.phi_before - exact.share(1, COST)).abs() < 1e-12);
        assert_eq!(share.future_tokens, 500);
        assert!(share.similarity.unwrap() > 0.99);
        // The two-stage graph also matches, but its φ(2) would be 1.
        assert!(share.phi < 1.0);
    }

    #[test]
    fn pruning_and_fallbacks() {
        let mut store = PatternStore::default();
        store.record("a", PatternGraph::new(vec![vec![node(100, 50), node(100, 60)], vec![node(10, 10)]]));
        // One call in stage 1 where the history has two: pruned, so φ = s / S_max.
        let share = store.share("a", &[vec![open(100)]], false, COST);
        assert_eq!((share.phi, share.similarity), (0.5, None));
        // An unknown application: S_max = 5.
        let share = store.share("b", &[vec![node(1, 1)], vec![open(1)]], false, COST);
        assert_eq!((share.phi, share.phi_before), (0.4, 0.2));
        // A known last stage is due at the job's deadline.
        assert_eq!(store.share("b", &[vec![open(1)]], true, COST).phi, 1.0);
    }

    #[test]
    fn sub_deadlines_are_non_decreasing_and_the_last_is_the_jobs() {
        // Spec §9 property 11 (first half), over matches that change from stage to stage.
        let mut store = PatternStore::default();
        store.record("a", PatternGraph::new(vec![vec![node(100, 900)], vec![node(100, 10)], vec![node(100, 10)]]));
        store.record("a", PatternGraph::new(vec![vec![node(3000, 10)], vec![node(100, 10)], vec![node(100, 900)], vec![node(1, 1)]]));
        let (arrival, deadline) = (1_000, 81_000);
        let mut partial: Vec<Vec<CallNode>> = Vec::new();
        let mut previous = arrival;
        let calls = [(100, 900), (3000, 10), (100, 900), (1, 1)];
        for (s, &(prompt, output)) in calls.iter().enumerate() {
            if let Some(stage) = partial.last_mut() {
                stage[0].output = Some(calls[s - 1].1);
            }
            partial.push(vec![open(prompt)]);
            let last = s + 1 == calls.len();
            let share = store.share("a", &partial, last, COST);
            let d = sub_deadline(arrival, deadline, share.phi, previous);
            assert!(d >= previous && d <= deadline, "stage {}: {d} after {previous}", s + 1);
            previous = d;
            let _ = output;
        }
        assert_eq!(previous, deadline);
    }

    #[test]
    fn reamortising_shares_what_is_left() {
        let share = StageShare { phi: 0.5, phi_before: 0.25, future_tokens: 0, similarity: None };
        // A third of the remaining share: (0.5 − 0.25) / 0.75.
        assert_eq!(reamortise(40, 100, &share), 60);
        assert_eq!(reamortise(120, 100, &share), 100);
        assert_eq!(reamortise(40, 100, &StageShare { phi_before: 1.0, phi: 1.0, ..share }), 100);
    }

    #[test]
    fn the_store_evicts_the_least_reused_beyond_capacity_and_decays() {
        let mut store = PatternStore::new(2);
        store.record("a", PatternGraph::new(vec![vec![node(1, 1)]]));
        store.record("a", PatternGraph::new(vec![vec![node(500, 1)]]));
        // A match reuses the first graph, so the second is the one evicted.
        store.share("a", &[vec![open(1)]], false, COST);
        store.record("a", PatternGraph::new(vec![vec![node(900, 1)]]));
        assert_eq!(store.len("a"), 2);
        let prompts: Vec<u32> = store.apps["a"].iter().map(|s| s.graph.stages[0][0].prompt).collect();
        assert_eq!(prompts, vec![1, 900]);
        store.decay(0.9);
        assert!((store.apps["a"][0].reuse - 1.8).abs() < 1e-12);
        assert_eq!(store.max_stages("a"), 1);
    }
}
