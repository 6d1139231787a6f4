//! What QUART knows about one stage at a control instant: its measured load and
//! latency, its replicas and cores, its service model and its latency target, and
//! the M/M/c estimates derived from them (§3.1–3.2).

use yardmaster_sdk::helpers::{mmc_min_servers, mmc_sojourn, StageGraph};
use yardmaster_sdk::StageId;

use crate::service::ServiceModel;

/// One stage's inputs to the Corrector and the Smoother.
#[derive(Debug, Clone, PartialEq)]
pub struct StageView {
    /// Arrival rate over the short window `W_λ`, requests per second.
    pub lambda: f64,
    /// The cautious rate `max(λ over W_λ, λ over W_long)` the Smoother plans with.
    pub lambda_smooth: f64,
    /// Measured CV of inter-arrival times over `W_cv` (`None`: too few samples).
    pub cv_measured: Option<f64>,
    /// Replicas serving.
    pub ready: u32,
    /// Replicas starting.
    pub pending: u32,
    /// Requests waiting (not in service), time-averaged over the last period.
    pub queue: f64,
    /// Mean sojourn time (wait + service) at the stage over `W_λ`, seconds.
    pub observed: Option<f64>,
    /// Cores per replica now, `C_i`.
    pub cores: u32,
    /// Service time as a function of cores.
    pub service: ServiceModel,
    /// Latency target of the stage, seconds.
    pub target: f64,
}

impl StageView {
    /// Replicas serving or starting.
    pub fn replicas(&self) -> u32 {
        self.ready + self.pending
    }

    /// Service rate of one replica with the current cores.
    pub fn mu(&self) -> f64 {
        self.service.rate(self.cores)
    }

    /// Offered load in replica units, `d_i = λ_i^s / μ_i(C_i)`.
    pub fn demand(&self) -> f64 {
        self.lambda_smooth / self.mu()
    }

    /// Utilisation of the replicas serving or starting, capped at 1.
    pub fn utilisation(&self) -> f64 {
        let capacity = self.replicas() as f64 * self.mu();
        if capacity > 0.0 {
            (self.lambda / capacity).min(1.0)
        } else {
            1.0
        }
    }

    /// The latency estimate the Corrector acts on (§3.3 lines 3–5): the M/M/c model
    /// with pending replicas counted; when none is pending, the worst of the model,
    /// the observed sojourn time and the time to drain the backlog.
    pub fn latency_estimate(&self) -> f64 {
        let mu = self.mu();
        let model = mmc_sojourn(self.lambda, mu, self.replicas());
        if self.pending > 0 {
            return model;
        }
        let backlog = if self.ready == 0 { f64::INFINITY } else { self.queue / (self.ready as f64 * mu) + 1.0 / mu };
        model.max(self.observed.unwrap_or(0.0)).max(backlog)
    }

    /// Relative latency error `min(T/T_target − 1, e_max)`; positive means too slow.
    pub fn error(&self, e_max: f64) -> f64 {
        let estimate = self.latency_estimate();
        if !estimate.is_finite() || self.target <= 0.0 {
            return e_max;
        }
        (estimate / self.target - 1.0).min(e_max)
    }

    /// Fewest replicas that meet the target at `cores` cores with the cautious rate,
    /// between `r_min` and `r_max`.
    pub fn floor_at(&self, cores: u32, r_min: u32, r_max: u32) -> Option<u32> {
        mmc_min_servers(self.lambda_smooth, self.service.rate(cores), self.target, r_min, r_max)
    }
}

/// Per-stage latency targets: the end-to-end budget split in proportion to each
/// stage's service time at the base cores (§3.1).
pub fn split_budget(budget_s: f64, base_times_s: &[f64]) -> Vec<f64> {
    let total: f64 = base_times_s.iter().sum();
    if total <= 0.0 {
        let n = base_times_s.len().max(1) as f64;
        return base_times_s.iter().map(|_| budget_s / n).collect();
    }
    base_times_s.iter().map(|t| budget_s * t / total).collect()
}

/// Per stage, the time a batch may take: the larger of its target (the budget split
/// over every stage as one chain, [`split_budget`]) and `path_fraction` of its share
/// along the longest path through it ([`StageGraph::proportional_shares`]). On a
/// chain the two shares agree and the target stands. Stages that run side by side (a
/// fan-out's branches) are not one after another: split as one chain, a classifier
/// feeding three branches got targets for a six-stage chain on a three-stage path,
/// and QUART batched small and fell short of capacity at half the bound. The fraction
/// leaves the rest of the path's share for queueing.
pub fn batch_budgets(budget_s: f64, graph: &StageGraph, base_times_s: &[f64], path_fraction: f64) -> Vec<f64> {
    let time = |s: StageId| base_times_s.get(s as usize).copied().unwrap_or(0.0).max(0.0);
    let shares = graph.proportional_shares(time);
    split_budget(budget_s, base_times_s)
        .into_iter()
        .enumerate()
        .map(|(s, target)| target.max(path_fraction * budget_s * shares.get(s).copied().unwrap_or(0.0)))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stage with service time `t` at 2 cores, target `target`, load `lambda`.
    pub(crate) fn view(t: f64, target: f64, lambda: f64, ready: u32) -> StageView {
        StageView {
            lambda,
            lambda_smooth: lambda,
            cv_measured: None,
            ready,
            pending: 0,
            queue: 0.0,
            observed: None,
            cores: 2,
            service: ServiceModel::anchored(t, 2, 0.34),
            target,
        }
    }

    #[test]
    fn an_unstable_stage_has_the_largest_error() {
        // λ = 10, μ = 3, c = 3: ρ = 1.1.
        let v = view(1.0 / 3.0, 0.5, 10.0, 3);
        assert_eq!(v.error(4.0), 4.0);
        let stable = view(1.0 / 3.0, 0.5, 10.0, 5);
        assert!((stable.latency_estimate() - 0.3987).abs() < 1e-4);
        assert!(stable.error(4.0) < 0.0);
    }

    #[test]
    fn pending_replicas_count_and_then_only_the_model_is_trusted() {
        let mut v = view(1.0 / 3.0, 0.5, 10.0, 3);
        v.observed = Some(5.0);
        v.queue = 100.0;
        assert!(v.latency_estimate() > 5.0, "the backlog dominates");
        v.pending = 2;
        assert!((v.latency_estimate() - 0.3987).abs() < 1e-4, "model with 5 replicas only");
    }

    #[test]
    fn side_by_side_stages_may_batch_within_their_path_s_share() {
        // 0 → {1, 2} → 3 with times 1, 2, 1, 1: as one chain each stage gets a fifth of
        // its time; along its longest path stage 1 gets 2/4, stage 2 1/3, 0 and 3 1/4.
        let stage = |id: StageId, successors: &[StageId]| yardmaster_sdk::Stage {
            id,
            name: format!("s{id}"),
            kind: yardmaster_sdk::StageKind::Batch,
            successors: successors.to_vec(),
            predecessors: vec![],
            variants: vec![],
            max_batch: 8,
            min_replicas: 1,
            max_replicas: 8,
        };
        let graph = StageGraph::new(&[stage(0, &[1, 2]), stage(1, &[3]), stage(2, &[3]), stage(3, &[])]);
        let times = [1.0, 2.0, 1.0, 1.0];
        assert_eq!(split_budget(1.0, &times), vec![0.2, 0.4, 0.2, 0.2]);
        let budgets = batch_budgets(1.0, &graph, &times, 0.8);
        let expected = [0.2, 0.4, 0.8 / 3.0, 0.2];
        assert!(budgets.iter().zip(expected).all(|(b, e)| (b - e).abs() < 1e-12), "{budgets:?}");
        // Fraction 0, or a chain: the targets.
        assert_eq!(batch_budgets(1.0, &graph, &times, 0.0), split_budget(1.0, &times));
        assert_eq!(batch_budgets(1.0, &StageGraph::chain(2), &[1.0, 3.0], 1.0), vec![0.25, 0.75]);
    }

    #[test]
    fn budget_is_split_by_service_time() {
        let targets = split_budget(1.0, &[1.0, 3.0]);
        assert_eq!(targets, vec![0.25, 0.75]);
    }
}
