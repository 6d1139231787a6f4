//! Per-second request-rate series shaped like public traces, replayed with Poisson
//! arrivals inside each second.
//!
//! Papers that replay the Wikipedia, Twitter and Azure Functions traces (PARD among
//! them) replay them as request *rates*: one rate per second, arrivals Poisson within
//! the second, over regions of the traces (PARD's Fig. 10 boxes them). The synthetic
//! presets of [`super::workload`] instead shape the gaps between arrivals (a gamma
//! renewal process or an MMPP whose bursts last tens of milliseconds). The presets
//! here shape the per-second rate, so their bursts span seconds.
//!
//! # Which CV
//!
//! The coefficient of variation a preset hits is that of the **per-second rates of the
//! whole trace**, a compressed day of [`DAY_RUNS`] run lengths; the run replays the
//! region of the day around its peak (the busy region a paper boxes). A trace's CV
//! is mostly its daily swing: the CV of the region replayed is lower (for 120 s runs
//! ≈ 0.08 Wikipedia, 0.1–0.3 Twitter, 0.3–0.6 Azure), so a run is steady periods with
//! bursts that need dropping, not a swing from night to day that a reactive planner
//! (10 s starts, 5 s epochs) could never follow within two minutes.
//!
//! Every day is `x(t) = base(t) · day(t)^q · (1 + k · bursts(t))`:
//! - `base(t)`: a slow log-normal AR(1) wander (mean 1, small spread, correlated over
//!   seconds), the trace's second-to-second noise;
//! - `day(t) = (1 − cos(2πt / day))/2`: one daily cycle, peaking mid-day;
//! - `bursts(t) ≥ 0`: bursts that ramp up, hold for seconds and decay (none for
//!   Wikipedia), scaled by the preset's `k`;
//! - `q ≥ 0`: solved by bisection so that the day's CV is the preset's target (a
//!   larger `q` gives a sharper day: longer nights, a narrower peak).
//!
//! The region's rates are then scaled so that their mean is the requested rate.
//!
//! | preset                       | day CV | bursts (on top of the local rate)                             |
//! |------------------------------|--------|---------------------------------------------------------------|
//! | `wikipedia-per-second`       | 0.47   | none: periodic and smooth                                     |
//! | `twitter-per-second`         | 1.0    | every ≈ 30 s, holding 5–15 s, 1.6–2.4× (the rate "doubles")   |
//! | `azure-functions-per-second` | 1.3    | every ≈ 20 s, holding 2–6 s, 2–5× (Pareto(2.5) heights, ≤ 4)   |
//!
//! The randomness of the series comes from its own child stream of the seed, and the
//! arrivals from [`RateSchedule::arrivals_until`]'s, so one seed fixes both.

use super::rng::SimRng;
use super::workload::{Generator, RateSchedule};

const NS_PER_SEC: u64 = 1_000_000_000;
/// Child stream of the seed that draws the rate series (the arrivals use 0 and 1).
const SERIES_STREAM: u64 = 2;
/// Length of the compressed day a run is a region of, in run lengths.
pub const DAY_RUNS: usize = 10;
/// Largest day sharpness `q` the CV solver tries.
const MAX_Q: f64 = 64.0;

/// Names of the per-second presets, accepted by [`super::workload::preset`] too.
pub const PRESETS: [&str; 3] = ["wikipedia-per-second", "twitter-per-second", "azure-functions-per-second"];

/// How the heights of bursts are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Height {
    /// Uniform in `[lo, hi)`.
    Uniform { lo: f64, hi: f64 },
    /// Pareto with minimum 1 and this tail index, capped.
    Pareto { alpha: f64, cap: f64 },
}

impl Height {
    fn sample(self, rng: &mut SimRng) -> f64 {
        match self {
            Height::Uniform { lo, hi } => rng.uniform_range(lo, hi),
            // Inverse CDF: (1 − u)^(−1/α) with 1 − u in (0, 1].
            Height::Pareto { alpha, cap } => (1.0 - rng.uniform()).max(f64::MIN_POSITIVE).powf(-1.0 / alpha).min(cap),
        }
    }
}

/// Bursts on top of the daily cycle, starting as a renewal process: the first
/// uniformly in the first mean gap, then each `hold + exponential(gap_s)` after the
/// previous start. A burst ramps up linearly over `rise_s`, holds until `hold`
/// (uniform in `hold_s`) and decays exponentially with time constant `decay_s`;
/// overlapping bursts add. The rate is multiplied by `1 + k · Σ height · level`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bursts {
    gap_s: f64,
    hold_s: (f64, f64),
    height: Height,
    rise_s: f64,
    decay_s: f64,
    k: f64,
}

/// A per-second preset: its name, target CV, base wander and bursts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SeriesShape {
    name: &'static str,
    /// Coefficient of variation of the per-second rates over the day.
    cv: f64,
    /// Standard deviation of the base wander's logarithm.
    base_sigma: f64,
    /// Correlation time of the base wander, seconds.
    base_tau_s: f64,
    bursts: Option<Bursts>,
}

/// The presets, in the order of [`PRESETS`].
const SHAPES: [SeriesShape; 3] = [
    // Wikipedia page views: periodic and smooth.
    SeriesShape { name: "wikipedia-per-second", cv: 0.47, base_sigma: 0.08, base_tau_s: 5.0, bursts: None },
    // Twitter: bursts that last seconds and about double the rate.
    SeriesShape {
        name: "twitter-per-second",
        cv: 1.0,
        base_sigma: 0.1,
        base_tau_s: 10.0,
        bursts: Some(Bursts {
            gap_s: 30.0,
            hold_s: (5.0, 15.0),
            height: Height::Uniform { lo: 0.6, hi: 1.4 },
            rise_s: 1.5,
            decay_s: 2.0,
            k: 1.0,
        }),
    },
    // Azure Functions: shorter, sharper, heavier-tailed spikes.
    SeriesShape {
        name: "azure-functions-per-second",
        cv: 1.3,
        base_sigma: 0.15,
        base_tau_s: 5.0,
        bursts: Some(Bursts {
            gap_s: 20.0,
            hold_s: (2.0, 6.0),
            height: Height::Pareto { alpha: 2.5, cap: 4.0 },
            rise_s: 0.5,
            decay_s: 1.0,
            k: 1.0,
        }),
    },
];

fn shape(name: &str) -> Option<&'static SeriesShape> {
    SHAPES.iter().find(|s| s.name == name)
}

/// Whether `name` is one of the per-second presets.
pub fn is_preset(name: &str) -> bool {
    shape(name).is_some()
}

/// The target CV of the per-second rates of preset `name`.
pub fn target_cv(name: &str) -> Option<f64> {
    shape(name).map(|s| s.cv)
}

/// Mean and coefficient of variation (population) of a series (0, 0 when empty).
pub fn mean_cv(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, if mean > 0.0 { var.sqrt() / mean } else { 0.0 })
}

/// The per-second rates of preset `name` at mean `rate` req/s for `duration` ns
/// (one rate per started second), seeded by `seed`: the region around the peak of
/// its day ([`day_rates`]), scaled to mean `rate`.
pub fn rates(name: &str, rate: f64, duration: u64, seed: u64) -> Result<Vec<f64>, String> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("rate must be a positive number of requests per second, got {rate}"));
    }
    let day = day_rates(name, duration, seed)?;
    let seconds = day.len() / DAY_RUNS;
    let start = day.len() / 2 - seconds / 2;
    let region = &day[start..start + seconds];
    let (mean, _) = mean_cv(region);
    Ok(region.iter().map(|x| rate * x / mean).collect())
}

/// The whole day of preset `name` behind a run of `duration` ns: [`DAY_RUNS`] times
/// the run's started seconds, in units of the day's mean rate, seeded by `seed`. Its
/// CV is the preset's target (for days of a few bursts or more; a shorter one gets
/// the CV nearest the target it can reach).
pub fn day_rates(name: &str, duration: u64, seed: u64) -> Result<Vec<f64>, String> {
    let shape = shape(name).ok_or_else(|| format!("unknown per-second rate preset {name:?}; they are: {}", PRESETS.join(", ")))?;
    if duration == 0 {
        return Err(format!("workload preset {name:?} needs a positive duration"));
    }
    let seconds = duration.div_ceil(NS_PER_SEC) as usize * DAY_RUNS;
    let mut rng = SimRng::new(seed).fork(SERIES_STREAM);
    let base = wander(&mut rng, seconds, shape.base_sigma, shape.base_tau_s);
    let bursty: Vec<f64> = match shape.bursts {
        Some(bursts) => burst_levels(&mut rng, seconds, bursts).iter().zip(&base).map(|(b, x)| x * (1.0 + bursts.k * b)).collect(),
        None => base,
    };
    let cycle: Vec<f64> = (0..seconds).map(|s| 0.5 * (1.0 - (std::f64::consts::TAU * (s as f64 + 0.5) / seconds as f64).cos())).collect();
    let q = solve_q(&bursty, &cycle, shape.cv);
    let day: Vec<f64> = bursty.iter().zip(&cycle).map(|(x, c)| x * c.powf(q)).collect();
    let (mean, _) = mean_cv(&day);
    Ok(day.iter().map(|x| x / mean).collect())
}

/// Arrivals of preset `name` (one of [`PRESETS`]) at mean `rate` req/s for
/// `duration` ns: Poisson within each second at that second's rate, seeded by `seed`.
pub fn preset(name: &str, rate: f64, duration: u64, seed: u64) -> Result<Generator, String> {
    let schedule = RateSchedule::from_rates(rates(name, rate, duration, seed)?)?;
    Ok(schedule.arrivals_until(seed, duration))
}

/// A log-normal AR(1) wander of `n` seconds with mean 1, log-spread `sigma` and
/// correlation time `tau_s`, starting from its stationary distribution.
fn wander(rng: &mut SimRng, n: usize, sigma: f64, tau_s: f64) -> Vec<f64> {
    let a = (-1.0 / tau_s).exp();
    let innovation = (1.0 - a * a).sqrt();
    let mut z = rng.normal(0.0, 1.0);
    (0..n)
        .map(|_| {
            let x = (sigma * z - 0.5 * sigma * sigma).exp();
            z = a * z + innovation * rng.normal(0.0, 1.0);
            x
        })
        .collect()
}

/// The summed burst levels (height × profile) of `n` seconds, each second taking
/// its value at its middle.
fn burst_levels(rng: &mut SimRng, n: usize, bursts: Bursts) -> Vec<f64> {
    let mut values = vec![0.0; n];
    let end = n as f64;
    let mut start = rng.uniform_range(0.0, bursts.gap_s.min(end));
    while start < end {
        let hold = rng.uniform_range(bursts.hold_s.0, bursts.hold_s.1);
        let height = bursts.height.sample(rng);
        add_burst(&mut values, start, hold, height, bursts.rise_s, bursts.decay_s);
        start += hold + rng.exponential(bursts.gap_s);
    }
    values
}

/// Add one burst starting at `start` s to `values` (per-second samples at mid-second).
fn add_burst(values: &mut [f64], start: f64, hold: f64, height: f64, rise: f64, decay: f64) {
    let first = start.floor() as usize;
    for (s, value) in values.iter_mut().enumerate().skip(first) {
        let x = s as f64 + 0.5 - start;
        let level = if x < 0.0 {
            0.0
        } else if x < rise {
            x / rise
        } else if x < hold {
            1.0
        } else {
            (-(x - hold) / decay).exp()
        };
        if x > hold && level < 1e-4 {
            break;
        }
        *value += height * level;
    }
}

/// The `q ≥ 0` for which `x · cycle^q` has coefficient of variation `target`:
/// the first crossing found by doubling, then bisection; the largest `q` tried when
/// the target is out of reach.
fn solve_q(x: &[f64], cycle: &[f64], target: f64) -> f64 {
    let cv = |q: f64| mean_cv(&x.iter().zip(cycle).map(|(x, c)| x * c.powf(q)).collect::<Vec<_>>()).1;
    if cv(0.0) >= target {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0, 0.25);
    while cv(hi) < target {
        if hi >= MAX_Q {
            return hi;
        }
        (lo, hi) = (hi, hi * 2.0);
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if cv(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{self, Arrival};

    const SEC: u64 = NS_PER_SEC;

    fn per_second_counts(arrivals: &[Arrival], seconds: usize) -> Vec<f64> {
        let mut counts = vec![0.0; seconds];
        for a in arrivals {
            counts[(a.at / SEC) as usize] += 1.0;
        }
        counts
    }

    /// Lengths of the runs of consecutive seconds above `level`.
    fn runs_above(values: &[f64], level: f64) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut current = 0;
        for &v in values {
            if v > level {
                current += 1;
            } else if current > 0 {
                runs.push(current);
                current = 0;
            }
        }
        if current > 0 {
            runs.push(current);
        }
        runs
    }

    #[test]
    fn days_hit_their_cv_and_runs_their_mean() {
        for name in PRESETS {
            let target = target_cv(name).unwrap();
            for (seconds, seed) in [(120, 1), (120, 2), (120, 3), (40, 4), (600, 5)] {
                let day = day_rates(name, seconds * SEC, seed).unwrap();
                assert_eq!(day.len(), seconds as usize * DAY_RUNS);
                let (day_mean, day_cv) = mean_cv(&day);
                assert!((day_mean - 1.0).abs() < 1e-9, "{name}: day mean {day_mean}");
                assert!((day_cv / target - 1.0).abs() < 1e-3, "{name} {seconds} s seed {seed}: day cv {day_cv} vs {target}");
                let series = rates(name, 1600.0, seconds * SEC, seed).unwrap();
                assert_eq!(series.len(), seconds as usize);
                let (mean, cv) = mean_cv(&series);
                assert!((mean / 1600.0 - 1.0).abs() < 1e-9, "{name} seed {seed}: mean {mean}");
                assert!(cv < day_cv, "{name}: the run is a region of the day, steadier than the day ({cv} vs {day_cv})");
                assert!(series.iter().all(|r| r.is_finite() && *r > 0.0), "{name}: rates must be positive");
            }
        }
    }

    #[test]
    fn arrivals_are_poisson_inside_each_second_and_follow_the_series() {
        for name in PRESETS {
            let duration = 120 * SEC;
            let series = rates(name, 1000.0, duration, 7).unwrap();
            let arrivals: Vec<Arrival> = preset(name, 1000.0, duration, 7).unwrap().collect();
            assert!(arrivals.windows(2).all(|w| w[0].at <= w[1].at), "{name}: out of order");
            let counts = per_second_counts(&arrivals, 120);
            for (second, (&count, &rate)) in counts.iter().zip(&series).enumerate() {
                // Poisson counts: within 5 standard deviations.
                assert!((count - rate).abs() <= 5.0 * rate.sqrt() + 1.0, "{name} second {second}: {count} vs {rate:.1}");
            }
            let (mean, cv) = mean_cv(&counts);
            assert!((mean / 1000.0 - 1.0).abs() < 0.01, "{name}: mean count {mean}");
            // Poisson counts add 1/rate to the squared CV of the rates.
            let expected = (mean_cv(&series).1.powi(2) + 1.0 / 1000.0).sqrt();
            assert!((cv / expected - 1.0).abs() < 0.1, "{name}: count cv {cv} vs {expected}");
            // Inside a second the gaps, scaled by that second's rate, are exponential
            // with mean 1: CV 1 (a renewal or MMPP gap process would not be).
            let mut scaled = Vec::new();
            for w in arrivals.windows(2).filter(|w| w[0].at / SEC == w[1].at / SEC) {
                scaled.push((w[1].at - w[0].at) as f64 / SEC as f64 * series[(w[0].at / SEC) as usize]);
            }
            let (gap_mean, gap_cv) = mean_cv(&scaled);
            assert!((gap_mean - 1.0).abs() < 0.02, "{name}: scaled gap mean {gap_mean}");
            assert!((gap_cv - 1.0).abs() < 0.02, "{name}: scaled gap cv {gap_cv}");
        }
    }

    #[test]
    fn deterministic_by_seed() {
        for name in PRESETS {
            let run = |seed| preset(name, 500.0, 30 * SEC, seed).unwrap().collect::<Vec<_>>();
            assert_eq!(run(3), run(3), "{name}");
            assert_ne!(run(3), run(4), "{name}");
            assert_eq!(rates(name, 500.0, 30 * SEC, 3).unwrap(), rates(name, 500.0, 30 * SEC, 3).unwrap());
            assert_ne!(rates(name, 500.0, 30 * SEC, 3).unwrap(), rates(name, 500.0, 30 * SEC, 4).unwrap());
        }
    }

    #[test]
    fn shapes_span_seconds_and_differ_by_trace() {
        let duration = 600 * SEC;
        let series: Vec<Vec<f64>> = PRESETS.iter().map(|n| rates(n, 1.0, duration, 11).unwrap()).collect();
        let stats: Vec<(f64, f64, f64, f64)> = series
            .iter()
            .map(|s| {
                // Rates move over seconds, not milliseconds: neighbouring seconds correlate.
                let (mean, cv) = mean_cv(s);
                let var: f64 = s.iter().map(|x| (x - mean).powi(2)).sum();
                let lag1 = s.windows(2).map(|w| (w[0] - mean) * (w[1] - mean)).sum::<f64>() / var;
                let mut sorted = s.clone();
                sorted.sort_by(f64::total_cmp);
                let median = sorted[sorted.len() / 2];
                (cv, lag1, sorted[sorted.len() - 1] / median, median)
            })
            .collect();
        let [(wiki_cv, wiki_lag, wiki_peak, _), (tweet_cv, tweet_lag, tweet_peak, tweet_median), (azure_cv, azure_lag, azure_peak, _)] =
            stats[..]
        else {
            unreachable!()
        };
        for (name, lag) in PRESETS.iter().zip([wiki_lag, tweet_lag, azure_lag]) {
            assert!(lag > 0.6, "{name}: lag-1 autocorrelation {lag}");
        }
        // Wikipedia is steady at its peak; Twitter's bursts about double the rate and
        // last seconds; Azure's spikes are taller.
        assert!(wiki_cv < 0.15 && wiki_peak < 1.4, "wikipedia: cv {wiki_cv}, peak {wiki_peak}× the median");
        assert!((0.2..0.7).contains(&tweet_cv) && (1.6..3.5).contains(&tweet_peak), "twitter: cv {tweet_cv}, peak {tweet_peak}");
        assert!(azure_cv > tweet_cv && azure_peak > tweet_peak, "azure: cv {azure_cv}, peak {azure_peak}");
        let runs = runs_above(&series[1], 1.4 * tweet_median);
        let mean_run = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
        assert!(runs.len() >= 5 && mean_run >= 4.0, "twitter bursts: {} of mean {mean_run} s", runs.len());
    }

    #[test]
    fn partial_last_second_and_errors() {
        let arrivals: Vec<Arrival> = preset("twitter-per-second", 2000.0, 2_500_000_000, 1).unwrap().collect();
        assert!(arrivals.last().unwrap().at < 2_500_000_000);
        assert!(arrivals.iter().any(|a| a.at >= 2 * SEC), "the half second is replayed");
        assert_eq!(rates("twitter-per-second", 10.0, 2_500_000_000, 1).unwrap().len(), 3);
        assert!(rates("twitter-per-second", 10.0, 0, 1).unwrap_err().contains("duration"));
        assert!(rates("twitter-per-second", 0.0, SEC, 1).unwrap_err().contains("rate"));
        let error = rates("twiter-per-second", 10.0, SEC, 1).unwrap_err();
        assert!(PRESETS.iter().all(|n| error.contains(n)), "{error}");
    }

    #[test]
    fn the_workload_presets_include_the_per_second_ones() {
        for name in PRESETS {
            let via_workload: Vec<Arrival> = workload::preset(name, 300.0, 20 * SEC, 9).unwrap().collect();
            assert_eq!(via_workload, preset(name, 300.0, 20 * SEC, 9).unwrap().collect::<Vec<_>>(), "{name}");
        }
        let error = workload::preset("nope", 10.0, SEC, 1).unwrap_err();
        assert!(PRESETS.iter().all(|n| error.contains(n)), "{error}");
    }

    #[test]
    fn solver_reaches_the_target_or_stops() {
        let x = vec![1.0; 100];
        let cycle: Vec<f64> = (0..100).map(|s| 0.5 * (1.0 - (std::f64::consts::TAU * (s as f64 + 0.5) / 100.0).cos())).collect();
        for target in [0.3, 1.0, 2.0] {
            let q = solve_q(&x, &cycle, target);
            let day: Vec<f64> = cycle.iter().map(|c| c.powf(q)).collect();
            assert!((mean_cv(&day).1 - target).abs() < 1e-9, "target {target}: q {q}");
        }
        // A flat cycle cannot vary: the solver stops at its limit.
        assert!(solve_q(&x, &[1.0; 100], 1.0) >= MAX_Q);
        assert_eq!(solve_q(&[1.0, 3.0], &[1.0, 1.0], 0.1), 0.0, "x alone is already above the target");
    }
}
