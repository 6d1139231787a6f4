//! What the PARD reproduction measures on each run: goodput during overload windows
//! (normalised by the input), drop and invalid rates, where drops happen, queueing
//! delay, and the worst average drop rate over sliding windows (Fig. 9).

use crate::RunOutcome;
use yardmaster_engine::metrics::Window;
use yardmaster_engine::Pipeline;

/// Window sizes (seconds) of the maximum-average-drop-rate curve (Fig. 9).
pub const SLIDING_WINDOWS_S: [usize; 7] = [1, 2, 5, 10, 20, 30, 60];

/// The PARD metrics of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct PardMetrics {
    /// Report name of the run.
    pub name: String,
    /// Requests offered.
    pub offered: u64,
    /// Goodput over the whole run, req/s.
    pub goodput: f64,
    /// Requests on time / requests offered, over the overload windows.
    pub overload_goodput: f64,
    /// Overload windows (seconds) of the workload.
    pub overload_seconds: usize,
    /// (dropped + late) / ended.
    pub drop_rate: f64,
    /// Accelerator time of dropped or late requests / all accelerator time.
    pub invalid_rate: f64,
    /// Drops per module: the policy's drops at each stage, and late completions at the
    /// sink (the last stage in topological order).
    pub drops_by_module: Vec<u64>,
    /// Requests the host expired while the policy held them.
    pub expired: u64,
    /// Mean total queueing delay of completed requests, ms.
    pub queue_delay_ms: f64,
    /// Worst average drop rate over sliding windows of [`SLIDING_WINDOWS_S`] seconds.
    pub worst_drop_rate: Vec<f64>,
}

impl PardMetrics {
    /// Share of the drops at each module (0 when nothing was dropped).
    pub fn drop_shares(&self) -> Vec<f64> {
        let total: u64 = self.drops_by_module.iter().sum();
        self.drops_by_module.iter().map(|&d| if total > 0 { d as f64 / total as f64 } else { 0.0 }).collect()
    }

    /// Share of the drops in the modules before index `upto` (exclusive).
    pub fn share_before(&self, upto: usize) -> f64 {
        self.drop_shares().iter().take(upto).sum()
    }

    /// Share of the drops at the last module.
    pub fn share_last(&self) -> f64 {
        self.drop_shares().last().copied().unwrap_or(0.0)
    }
}

/// Seconds whose offered rate exceeds the cluster's planned capacity in that window
/// ("periods requiring dropping").
pub fn overload_windows(windows: &[Window]) -> Vec<bool> {
    windows.iter().map(|w| w.serving_capacity.is_some_and(|c| w.offered_rate() > c)).collect()
}

/// The metrics of `outcome` on `pipeline`, with the workload's overload windows.
pub fn measure(outcome: &RunOutcome, pipeline: &Pipeline, overload: &[bool]) -> PardMetrics {
    let report = &outcome.report;
    let overall = &report.summary.overall;
    let (mut on_time, mut offered) = (0u64, 0u64);
    for (w, _) in report.windows.iter().zip(overload).filter(|(_, o)| **o) {
        on_time += w.outcomes.on_time;
        offered += w.offered;
    }
    let stages = pipeline.stages.len();
    let mut drops_by_module = vec![0u64; stages];
    for (k, &d) in outcome.engine.drops_by_stage.iter().enumerate().take(stages) {
        drops_by_module[k] += d;
    }
    let sink = (0..stages).rev().find(|&k| pipeline.stages[k].successors.is_empty()).unwrap_or(stages.saturating_sub(1));
    if stages > 0 {
        drops_by_module[sink] += overall.outcomes.late;
    }
    PardMetrics {
        name: report.policy.clone(),
        offered: overall.arrivals,
        goodput: overall.goodput,
        overload_goodput: if offered > 0 { on_time as f64 / offered as f64 } else { f64::NAN },
        overload_seconds: overload.iter().filter(|o| **o).count(),
        drop_rate: overall.drop_rate,
        invalid_rate: overall.invalid_rate,
        drops_by_module,
        expired: outcome.engine.expired,
        queue_delay_ms: overall.queue_delay.mean / 1e6,
        worst_drop_rate: SLIDING_WINDOWS_S.iter().map(|&s| worst_average_drop_rate(&report.windows, s)).collect(),
    }
}

/// The largest (dropped + late) / ended over any `size` consecutive windows.
pub fn worst_average_drop_rate(windows: &[Window], size: usize) -> f64 {
    let size = size.max(1);
    if windows.len() < size {
        let (bad, ended) = windows.iter().fold((0, 0), |(b, e), w| (b + w.outcomes.dropped + w.outcomes.late, e + w.outcomes.ended()));
        return if ended > 0 { bad as f64 / ended as f64 } else { 0.0 };
    }
    let (mut bad, mut ended) = (0u64, 0u64);
    let mut worst: f64 = 0.0;
    for (i, w) in windows.iter().enumerate() {
        bad += w.outcomes.dropped + w.outcomes.late;
        ended += w.outcomes.ended();
        if i >= size {
            let old = &windows[i - size];
            bad -= old.outcomes.dropped + old.outcomes.late;
            ended -= old.outcomes.ended();
        }
        if i + 1 >= size && ended > 0 {
            worst = worst.max(bad as f64 / ended as f64);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::metrics::Outcomes;

    fn window(offered: u64, capacity: Option<f64>, on_time: u64, dropped: u64) -> Window {
        Window {
            start: 0,
            duration: 1_000_000_000,
            offered,
            outcomes: Outcomes { on_time, late: 0, dropped, failed: 0 },
            active_workers: 1.0,
            serving_capacity: capacity,
            optimal: 0.0,
            ..Window::default()
        }
    }

    #[test]
    fn overload_windows_and_sliding_worst_drop_rate() {
        let windows =
            vec![window(10, Some(20.0), 10, 0), window(30, Some(20.0), 10, 10), window(30, None, 0, 30), window(10, Some(20.0), 10, 0)];
        assert_eq!(overload_windows(&windows), vec![false, true, false, false]);
        assert_eq!(worst_average_drop_rate(&windows, 1), 1.0);
        assert_eq!(worst_average_drop_rate(&windows, 2), 40.0 / 50.0);
        assert_eq!(worst_average_drop_rate(&windows, 10), 40.0 / 70.0);
    }
}
