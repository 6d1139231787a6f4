//! What an A/B run measures per arm, and the comparison of two arms with confidence
//! intervals.
//!
//! Each arm keeps an [`ArmTally`] of the requests it was given since the run began:
//! how each ended (on time, late, dropped, failed) and the latency of the completed
//! ones (a running mean and variance, and a histogram for percentiles). [`compare`]
//! sets the candidate against the control on three measures, each as the candidate's
//! value minus the control's with a 95 % confidence interval:
//! - **goodput share**: the fraction of an arm's requests that completed within their
//!   SLO (goodput per offered request, so arms of different shares compare);
//! - **drop rate**: (dropped + completed late) / requests, the project's definition;
//! - **mean latency** of completed requests.
//!
//! Proportions use the normal approximation (the interval from the unpooled standard
//! error, the test from the pooled one); the latency difference uses Welch's standard
//! error with the normal quantile, fine for the hundreds of requests an A/B sees. A
//! difference is *significant* when the test rejects equality at the 5 % level; with
//! fewer than [`MIN_REQUESTS`] requests in an arm nothing is called significant.

use serde::{Deserialize, Serialize};

use yardmaster_engine::metrics::histogram::Histogram;
use yardmaster_engine::metrics::Outcome;

/// Fewer requests than this in either arm: no difference is called significant.
pub const MIN_REQUESTS: u64 = 30;

/// The two-sided 97.5 % normal quantile (95 % intervals, 5 % tests).
const Z_95: f64 = 1.959_963_984_540_054;

/// How the requests an arm was given ended, and how long the completed ones took.
#[derive(Debug, Clone, Default)]
pub struct ArmTally {
    /// Requests that ended.
    pub requests: u64,
    /// Completed within their deadline.
    pub on_time: u64,
    /// Completed after their deadline.
    pub late: u64,
    /// Dropped (by the policy, by expiry, cancelled).
    pub dropped: u64,
    /// Failed with an error.
    pub failed: u64,
    latency: Welford,
    histogram: Histogram,
}

impl ArmTally {
    /// Count one request that ended: sent at `sent_at`, ended at `ended_at`, with
    /// `deadline` (all in the engine's nanoseconds).
    pub fn record(&mut self, outcome: &Outcome, sent_at: u64, ended_at: u64, deadline: u64) {
        self.requests += 1;
        match outcome {
            Outcome::Completed => {
                if ended_at <= deadline {
                    self.on_time += 1;
                } else {
                    self.late += 1;
                }
                let latency = ended_at.saturating_sub(sent_at);
                self.latency.add(latency as f64);
                self.histogram.record(latency);
            }
            Outcome::Dropped { .. } => self.dropped += 1,
            Outcome::Failed { .. } => self.failed += 1,
        }
    }

    /// The arm's figures over `seconds` of the run.
    pub fn figures(&self, arm: &str, policy: &str, seconds: f64) -> ArmFigures {
        let share = |n: u64| if self.requests == 0 { 0.0 } else { n as f64 / self.requests as f64 };
        let ms = |ns: u64| ns as f64 / 1e6;
        ArmFigures {
            arm: arm.to_string(),
            policy: policy.to_string(),
            requests: self.requests,
            on_time: self.on_time,
            late: self.late,
            dropped: self.dropped,
            failed: self.failed,
            goodput_per_s: if seconds > 0.0 { self.on_time as f64 / seconds } else { 0.0 },
            goodput_share: share(self.on_time),
            drop_rate: share(self.dropped + self.late),
            mean_latency_ms: self.latency.mean / 1e6,
            p50_latency_ms: if self.histogram.is_empty() { 0.0 } else { ms(self.histogram.quantile(0.5)) },
            p99_latency_ms: if self.histogram.is_empty() { 0.0 } else { ms(self.histogram.quantile(0.99)) },
        }
    }
}

/// Running mean and variance (Welford's update).
#[derive(Debug, Clone, Copy, Default)]
struct Welford {
    count: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    fn add(&mut self, x: f64) {
        self.count += 1;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Sample variance (0 below two values).
    fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.m2 / (self.count - 1) as f64
        }
    }
}

/// One arm's figures in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmFigures {
    /// The arm (its metrics label).
    pub arm: String,
    /// The policy it runs.
    pub policy: String,
    /// Requests that ended since the run began.
    pub requests: u64,
    /// On time.
    pub on_time: u64,
    /// Completed late.
    pub late: u64,
    /// Dropped.
    pub dropped: u64,
    /// Failed.
    pub failed: u64,
    /// On-time requests per second of the run.
    pub goodput_per_s: f64,
    /// On-time requests / requests.
    pub goodput_share: f64,
    /// (Dropped + late) / requests.
    pub drop_rate: f64,
    /// Mean latency of completed requests, ms.
    pub mean_latency_ms: f64,
    /// Median latency of completed requests, ms.
    pub p50_latency_ms: f64,
    /// 99th percentile latency of completed requests, ms.
    pub p99_latency_ms: f64,
}

/// The candidate's value minus the control's, with its 95 % interval and verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// What is compared.
    pub measure: String,
    /// The control arm's value.
    pub control: f64,
    /// The candidate arm's value.
    pub candidate: f64,
    /// candidate − control.
    pub difference: f64,
    /// Lower end of the 95 % confidence interval of the difference.
    pub ci_low: f64,
    /// Upper end.
    pub ci_high: f64,
    /// The test statistic (difference over its standard error under equality).
    pub z: f64,
    /// Whether equality is rejected at the 5 % level.
    pub significant: bool,
}

/// An A/B report: both arms' figures and the differences.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbReport {
    /// Seconds since the run began (or its length, once it ended).
    pub seconds: f64,
    /// The split, in words.
    pub split: String,
    /// The control arm.
    pub control: ArmFigures,
    /// The candidate arm.
    pub candidate: ArmFigures,
    /// Goodput share, drop rate and mean latency, candidate − control.
    pub differences: Vec<Difference>,
    /// One line for an operator: which differences are significant, or why none can be.
    pub verdict: String,
}

/// Compare `candidate` with `control` over `seconds` of a run split as `split`.
pub fn compare(
    (control_name, control_policy, control): (&str, &str, &ArmTally),
    (candidate_name, candidate_policy, candidate): (&str, &str, &ArmTally),
    seconds: f64,
    split: String,
) -> AbReport {
    let enough = control.requests >= MIN_REQUESTS && candidate.requests >= MIN_REQUESTS;
    let mut differences = vec![
        proportion("goodput share", (control.on_time, control.requests), (candidate.on_time, candidate.requests)),
        proportion(
            "drop rate",
            (control.dropped + control.late, control.requests),
            (candidate.dropped + candidate.late, candidate.requests),
        ),
        means("mean latency (ms)", &control.latency, &candidate.latency),
    ];
    if !enough {
        for d in &mut differences {
            d.significant = false;
        }
    }
    let verdict = if !enough {
        format!(
            "not enough requests yet ({} and {}; at least {MIN_REQUESTS} per arm before anything is called significant)",
            control.requests, candidate.requests
        )
    } else {
        let significant: Vec<String> = differences
            .iter()
            .filter(|d| d.significant)
            .map(|d| {
                let direction = if d.difference > 0.0 { "higher" } else { "lower" };
                format!("{} is {direction} on {candidate_name}", d.measure)
            })
            .collect();
        if significant.is_empty() {
            "no significant difference at the 5 % level".to_string()
        } else {
            format!("significant at the 5 % level: {}", significant.join("; "))
        }
    };
    AbReport {
        seconds,
        split,
        control: control.figures(control_name, control_policy, seconds),
        candidate: candidate.figures(candidate_name, candidate_policy, seconds),
        differences,
        verdict,
    }
}

/// Difference of two proportions `(hits, n)`: Wald interval, pooled z-test.
fn proportion(measure: &'static str, (a_hits, a_n): (u64, u64), (b_hits, b_n): (u64, u64)) -> Difference {
    let rate = |hits: u64, n: u64| if n == 0 { 0.0 } else { hits as f64 / n as f64 };
    let (pa, pb) = (rate(a_hits, a_n), rate(b_hits, b_n));
    let difference = pb - pa;
    let (na, nb) = (a_n.max(1) as f64, b_n.max(1) as f64);
    let se = (pa * (1.0 - pa) / na + pb * (1.0 - pb) / nb).sqrt();
    let pooled = rate(a_hits + b_hits, a_n + b_n);
    let se0 = (pooled * (1.0 - pooled) * (1.0 / na + 1.0 / nb)).sqrt();
    let z = if se0 > 0.0 { difference / se0 } else { 0.0 };
    Difference {
        measure: measure.to_string(),
        control: pa,
        candidate: pb,
        difference,
        ci_low: difference - Z_95 * se,
        ci_high: difference + Z_95 * se,
        z,
        significant: a_n > 0 && b_n > 0 && z.abs() > Z_95,
    }
}

/// Difference of two means (nanoseconds in, milliseconds out), Welch's standard error.
fn means(measure: &'static str, a: &Welford, b: &Welford) -> Difference {
    let ms = 1e-6;
    let difference = (b.mean - a.mean) * ms;
    let (na, nb) = (a.count.max(1) as f64, b.count.max(1) as f64);
    let se = (a.variance() / na + b.variance() / nb).sqrt() * ms;
    let z = if se > 0.0 { difference / se } else { 0.0 };
    Difference {
        measure: measure.to_string(),
        control: a.mean * ms,
        candidate: b.mean * ms,
        difference,
        ci_low: difference - Z_95 * se,
        ci_high: difference + Z_95 * se,
        z,
        significant: a.count >= 2 && b.count >= 2 && z.abs() > Z_95,
    }
}

/// The report as text for a terminal.
pub fn render(report: &AbReport) -> String {
    let mut out = format!("A/B over {:.1} s, split {}\n", report.seconds, report.split);
    out.push_str(&format!(
        "{:<14} {:<24} {:>8} {:>8} {:>6} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9}\n",
        "arm", "policy", "requests", "on time", "late", "dropped", "failed", "goodput/s", "mean ms", "p50 ms", "p99 ms"
    ));
    for a in [&report.control, &report.candidate] {
        out.push_str(&format!(
            "{:<14} {:<24} {:>8} {:>8} {:>6} {:>8} {:>7} {:>10.2} {:>9.1} {:>9.1} {:>9.1}\n",
            a.arm,
            a.policy,
            a.requests,
            a.on_time,
            a.late,
            a.dropped,
            a.failed,
            a.goodput_per_s,
            a.mean_latency_ms,
            a.p50_latency_ms,
            a.p99_latency_ms
        ));
    }
    out.push_str(&format!(
        "\n{:<18} {:>10} {:>10} {:>10} {:>24} {:>7}  {}\n",
        "measure", "control", "candidate", "diff", "95 % interval", "z", ""
    ));
    for d in &report.differences {
        out.push_str(&format!(
            "{:<18} {:>10.4} {:>10.4} {:>+10.4} {:>24} {:>7.2}  {}\n",
            d.measure,
            d.control,
            d.candidate,
            d.difference,
            format!("[{:+.4}, {:+.4}]", d.ci_low, d.ci_high),
            d.z,
            if d.significant { "significant" } else { "" }
        ));
    }
    out.push_str(&format!("\n{}\n", report.verdict));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tally of `n` requests, `on_time` of them on time (latency `fast` ns) and the
    /// rest dropped, with latencies spread by a fixed pattern.
    fn tally(n: u64, on_time: u64, fast: u64) -> ArmTally {
        let mut t = ArmTally::default();
        for i in 0..n {
            if i < on_time {
                let latency = fast + (i * 7919 % 101) * 10_000;
                t.record(&Outcome::Completed, 0, latency, u64::MAX);
            } else {
                t.record(&Outcome::Dropped { reason: "test".into() }, 0, 5, 10);
            }
        }
        t
    }

    fn report(a: &ArmTally, b: &ArmTally) -> AbReport {
        compare(("a", "fifo", a), ("b", "pard", b), 10.0, "50 % by request".into())
    }

    #[test]
    fn a_planted_difference_is_significant_and_identical_arms_are_not() {
        let planted = report(&tally(500, 250, 50_000_000), &tally(500, 400, 20_000_000));
        assert!(planted.differences.iter().all(|d| d.significant), "{planted:#?}");
        let goodput = &planted.differences[0];
        assert!((goodput.difference - 0.3).abs() < 1e-9);
        assert!(goodput.ci_low > 0.2 && goodput.ci_high < 0.4, "{goodput:?}");
        assert!(planted.verdict.contains("goodput share is higher on b"), "{}", planted.verdict);

        let same = report(&tally(500, 450, 30_000_000), &tally(500, 450, 30_000_000));
        assert!(same.differences.iter().all(|d| !d.significant && d.ci_low <= 0.0 && d.ci_high >= 0.0), "{same:#?}");
        assert_eq!(same.verdict, "no significant difference at the 5 % level");
    }

    #[test]
    fn a_small_difference_on_few_requests_is_not_significant() {
        let r = report(&tally(40, 30, 1_000_000), &tally(40, 33, 1_000_000));
        assert!(!r.differences[0].significant, "{:?}", r.differences[0]);
        let r = report(&tally(10, 0, 1), &tally(10, 10, 1));
        assert!(r.differences.iter().all(|d| !d.significant), "below the minimum sample nothing is significant");
        assert!(r.verdict.starts_with("not enough requests"));
    }

    #[test]
    fn figures_follow_the_definitions() {
        let mut t = ArmTally::default();
        t.record(&Outcome::Completed, 0, 10_000_000, 20_000_000);
        t.record(&Outcome::Completed, 0, 30_000_000, 20_000_000);
        t.record(&Outcome::Dropped { reason: "x".into() }, 0, 1, 2);
        t.record(&Outcome::Failed { error: "x".into() }, 0, 1, 2);
        let f = t.figures("a", "edf", 2.0);
        assert_eq!((f.requests, f.on_time, f.late, f.dropped, f.failed), (4, 1, 1, 1, 1));
        assert_eq!(f.goodput_per_s, 0.5);
        assert_eq!(f.goodput_share, 0.25);
        assert_eq!(f.drop_rate, 0.5);
        assert!((f.mean_latency_ms - 20.0).abs() < 1e-9);
        let text = render(&report(&t, &t));
        assert!(text.contains("goodput share") && text.contains("not enough requests"), "{text}");
    }
}
