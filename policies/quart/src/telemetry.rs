//! Per-stage telemetry QUART measures itself from the events it sees: arrival rates
//! over a short and a long window, inter-arrival times (for the measured CV) and the
//! sojourn times of requests finishing the stage.
//!
//! Arrivals are counted in 10-ms buckets ([`Buckets`]), not kept one by one: at tens of
//! thousands of arrivals per second, 60-s windows of single samples took QUART past its
//! 64 MiB memory cap (and its CV pass over them grew with the rate).

use std::collections::VecDeque;

use yardmaster_sdk::helpers::SlidingWindow;
use yardmaster_sdk::{Duration, Instant};

use crate::params::Params;

/// Width of a bucket of [`Buckets`], ns.
const BUCKET_NS: u64 = 10_000_000;

/// Samples over a sliding time window, kept as count, sum and sum of squares per
/// 10-ms bucket: memory and cost grow with the window's length, not with the rate.
/// A bucket leaves the window once its end is `span` or more before the latest time.
#[derive(Debug, Clone)]
pub struct Buckets {
    span: Duration,
    /// (bucket start, count, sum, sum of squares), oldest first.
    buckets: VecDeque<(Instant, u64, f64, f64)>,
}

impl Buckets {
    /// An empty window `span` ns long.
    pub fn new(span: Duration) -> Self {
        Self { span, buckets: VecDeque::new() }
    }

    /// The window's length, ns.
    pub fn span_ns(&self) -> Duration {
        self.span
    }

    /// Add `value` sampled at `at`.
    pub fn push(&mut self, at: Instant, value: f64) {
        let start = at - at % BUCKET_NS;
        match self.buckets.back_mut() {
            Some(last) if last.0 == start => {
                last.1 += 1;
                last.2 += value;
                last.3 += value * value;
            }
            Some(last) if last.0 > start => {
                // A late sample (out of order): into the newest bucket.
                last.1 += 1;
                last.2 += value;
                last.3 += value * value;
            }
            _ => self.buckets.push_back((start, 1, value, value * value)),
        }
        self.expire(at);
    }

    /// Drop the buckets that ended `span` or more before `now`.
    pub fn expire(&mut self, now: Instant) {
        while self.buckets.front().is_some_and(|b| b.0 + BUCKET_NS + self.span <= now) {
            self.buckets.pop_front();
        }
    }

    /// Samples in the window.
    pub fn len(&self) -> u64 {
        self.buckets.iter().map(|b| b.1).sum()
    }

    /// Whether the window holds no sample.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Mean and (population) variance of the samples, or `None` without any.
    pub fn mean_variance(&self) -> Option<(f64, f64)> {
        let (n, sum, squares) = self.buckets.iter().fold((0u64, 0.0, 0.0), |(n, s, q), b| (n + b.1, s + b.2, q + b.3));
        if n == 0 {
            return None;
        }
        let mean = sum / n as f64;
        Some((mean, (squares / n as f64 - mean * mean).max(0.0)))
    }
}

/// One stage's measurement windows.
#[derive(Debug, Clone)]
pub struct StageTelemetry {
    short: Buckets,
    long: Buckets,
    gaps: Buckets,
    sojourn: SlidingWindow,
    last_arrival: Option<Instant>,
    /// When measurement started (rates over a window not yet full use the elapsed time).
    started: Instant,
}

impl StageTelemetry {
    /// Empty windows of the lengths in `params`, starting at `now`.
    pub fn new(params: &Params, now: Instant) -> Self {
        Self {
            short: Buckets::new(params.rate_window),
            long: Buckets::new(params.long_window),
            gaps: Buckets::new(params.cv_window),
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

    fn rate(window: &mut Buckets, started: Instant, now: Instant) -> f64 {
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
        if self.gaps.len() < min_samples.max(2) as u64 {
            return None;
        }
        let (mean, variance) = self.gaps.mean_variance()?;
        if mean <= 0.0 {
            return None;
        }
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

    #[test]
    fn memory_does_not_grow_with_the_rate() {
        let params = Params::defaults();
        let mut t = StageTelemetry::new(&params, 0);
        // 100,000 arrivals per second for 70 s, gaps alternating 5 and 15 µs (CV 0.5).
        let mut at = 0;
        for k in 0..7_000_000u64 {
            at += if k % 2 == 0 { 5_000 } else { 15_000 };
            t.arrival(at);
        }
        assert!(t.long.buckets.len() <= 6_002 && t.gaps.buckets.len() <= 6_002, "{}", t.long.buckets.len());
        assert!((t.rate_long(at) / 100_000.0 - 1.0).abs() < 0.01, "{}", t.rate_long(at));
        assert!((t.cv(at, 20).unwrap() - 0.5).abs() < 1e-3);
    }
}
