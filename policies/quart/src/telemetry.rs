//! Per-stage telemetry QUART measures itself from the events it sees: arrival rates
//! over a short and a long window, inter-arrival times (for the measured CV) and the
//! sojourn times of requests finishing the stage.

use yardmaster_sdk::helpers::SlidingWindow;
use yardmaster_sdk::{Duration, Instant};

use crate::params::Params;

/// One stage's measurement windows.
#[derive(Debug, Clone)]
pub struct StageTelemetry {
    short: SlidingWindow,
    long: SlidingWindow,
    gaps: SlidingWindow,
    sojourn: SlidingWindow,
    last_arrival: Option<Instant>,
    /// When measurement started (rates over a window not yet full use the elapsed time).
    started: Instant,
}

impl StageTelemetry {
    /// Empty windows of the lengths in `params`, starting at `now`.
    pub fn new(params: &Params, now: Instant) -> Self {
        Self {
            short: SlidingWindow::new(params.rate_window),
            long: SlidingWindow::new(params.long_window),
            gaps: SlidingWindow::new(params.cv_window),
            sojourn: SlidingWindow::new(params.rate_window),
            last_arrival: None,
            started: now,
        }
    }

    /// A request reached the stage at `at`.
    pub fn arrival(&mut self, at: Instant) {
        self.short.push(at, 1.0);
        self.long.push(at, 1.0);
        if let Some(previous) = self.last_arrival {
            self.gaps.push(at, at.saturating_sub(previous) as f64 / 1e9);
        }
        self.last_arrival = Some(self.last_arrival.map_or(at, |p| p.max(at)));
    }

    /// A request finished the stage at `at` after `sojourn` there.
    pub fn finished(&mut self, at: Instant, sojourn: Duration) {
        self.sojourn.push(at, sojourn as f64 / 1e9);
    }

    fn rate(window: &mut SlidingWindow, started: Instant, now: Instant) -> f64 {
        window.expire(now);
        let span = window.span_ns().min(now.saturating_sub(started).max(1));
        window.len() as f64 * 1e9 / span as f64
    }

    /// Arrivals per second over the short window.
    pub fn rate_short(&mut self, now: Instant) -> f64 {
        Self::rate(&mut self.short, self.started, now)
    }

    /// Arrivals per second over the long window.
    pub fn rate_long(&mut self, now: Instant) -> f64 {
        Self::rate(&mut self.long, self.started, now)
    }

    /// CV of the inter-arrival times in the CV window, with at least `min_samples`.
    pub fn cv(&mut self, now: Instant, min_samples: usize) -> Option<f64> {
        self.gaps.expire(now);
        if self.gaps.len() < min_samples.max(2) {
            return None;
        }
        let mean = self.gaps.mean()?;
        if mean <= 0.0 {
            return None;
        }
        let n = self.gaps.len() as f64;
        let variance = self.gaps.iter().map(|(_, g)| (g - mean).powi(2)).sum::<f64>() / n;
        Some(variance.sqrt() / mean)
    }

    /// Mean sojourn time of the requests that finished in the short window, seconds.
    pub fn sojourn(&mut self, now: Instant) -> Option<f64> {
        self.sojourn.expire(now);
        self.sojourn.mean()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_cv_and_sojourn() {
        let params = Params::defaults();
        let mut t = StageTelemetry::new(&params, 0);
        // Regular arrivals every 100 ms for 10 s: 10/s, CV 0.
        for k in 0..100u64 {
            t.arrival(k * 100_000_000);
        }
        let now = 10_000_000_000;
        assert!((t.rate_short(now) - 10.0).abs() < 0.3);
        assert!((t.rate_long(now) - 10.0).abs() < 0.3, "over the elapsed 10 s, not 60");
        assert!(t.cv(now, 20).unwrap() < 1e-6);
        t.finished(now, 30_000_000);
        t.finished(now, 10_000_000);
        assert!((t.sojourn(now).unwrap() - 0.02).abs() < 1e-12);
        assert_eq!(t.sojourn(now + 6_000_000_000), None, "outside the 5 s window");
    }
}
