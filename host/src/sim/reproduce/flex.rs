//! SHEPHERD (NSDI'23) re-run: FLEX with preemption against non-preemptive FLEX, the
//! EDF-inside-FLEX ablation, and the Clockwork-like and Nexus-like baselines.
//!
//! - **Fig. 11a** (`flex-fig11a`): one GPU, ResNet-18 bursts of 1024 every 120 ms and
//!   ResNeSt-269 at one request per millisecond, SLO 250 ms and 90 ms, 12 s: the
//!   benefit of prioritising large batches (250 ms) and of preemption (90 ms).
//! - **Fig. 7** (`flex-cluster`): 12 GPUs, 13 models, 26 streams with exponentially
//!   distributed mean rates and MAF-bursty arrivals (a two-state MMPP at 1.8× and 0.2×
//!   the mean, sojourns of 1 s), SLO 250 ms, load swept from 3 k req/s up.
//! - **Fig. 9**: the same cluster at 3 k req/s, SLO swept from 50 to 500 ms.
//!
//! Latencies are the profiles exactly (no noise), as in the paper's emulation. Tables
//! go to standard output; CSV files and SVG/PNG charts to the output directory.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::{simulation_loader, Arm, ReproduceOptions};
use crate::engine::EngineOptions;
use crate::policy::PolicyLoader;
use crate::sim::executor::SimExecutorOptions;
use crate::sim::rng::SimRng;
use crate::sim::workload::Arrival;
use crate::sim::{per_core, presets, run, RunOutcome, SimSpec};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// FLEX and every baseline.
const ARMS: &[Arm] = &[
    Arm { name: "flex", policy: "flex", params: &[] },
    Arm { name: "flex-np", policy: "flex", params: &[("lambda", "inf")] },
    Arm { name: "flex-edf", policy: "flex", params: &[("select", "earliest"), ("lambda", "inf")] },
    Arm { name: "clockwork", policy: "flex-clockwork", params: &[] },
    Arm { name: "nexus", policy: "flex-nexus", params: &[] },
];

/// One measured point.
#[derive(Debug, Clone)]
struct Point {
    experiment: &'static str,
    /// The swept value (SLO in ms or load in req/s).
    x: f64,
    arm: &'static str,
    on_time: u64,
    arrivals: u64,
    goodput: f64,
    utilisation: f64,
    preemptions: u64,
    dropped: u64,
    late: u64,
}

/// Run every arm on `arrivals` with `pipeline` (by preset) and the stream SLO `slo`.
fn run_arms(
    label: &str,
    pipeline: &str,
    slo: u64,
    duration: u64,
    arrivals: &[Arrival],
    seed: u64,
    loader: &PolicyLoader,
) -> Result<Vec<(&'static str, RunOutcome)>> {
    let mut pipeline = presets::pipeline(pipeline).map_err(anyhow::Error::msg)?;
    for stream in &mut pipeline.streams {
        stream.slo_ns = slo;
    }
    eprintln!("  {label}: simulating {} arms …", ARMS.len());
    let started = std::time::Instant::now();
    let out = per_core(ARMS, |arm| {
        let policy = arm.policy_spec()?;
        let params = arm.engine_params();
        let spec = SimSpec {
            pipeline: pipeline.clone(),
            seed,
            duration,
            executor: SimExecutorOptions { noise_cv: 0.0, ..SimExecutorOptions::default() },
            engine: EngineOptions { params, ..EngineOptions::default() },
            decision_interval: 0,
            capture_dir: None,
        };
        let outcome = run::run(&spec, &policy, loader, arrivals.iter().cloned(), &mut |_| {})
            .with_context(|| format!("{label}: {}", arm.name))?;
        Ok((arm.name, outcome))
    })?;
    eprintln!("  {label}: done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(out)
}

fn point(experiment: &'static str, x: f64, arm: &'static str, outcome: &RunOutcome) -> Point {
    let overall = &outcome.report.summary.overall;
    Point {
        experiment,
        x,
        arm,
        on_time: overall.outcomes.on_time,
        arrivals: overall.arrivals,
        goodput: overall.goodput,
        utilisation: outcome.report.summary.utilisation,
        preemptions: outcome.engine.preemptions,
        dropped: overall.outcomes.dropped,
        late: overall.outcomes.late,
    }
}

/// Fig. 11a's arrivals: RN18 (stream 0) bursts of 1024 every 120 ms from 5 ms, RS269
/// (stream 1) one per millisecond from 0.
fn figure_11a_arrivals(duration: u64) -> Vec<Arrival> {
    let mut arrivals = Vec::new();
    let mut t = 5 * MS;
    while t < duration {
        arrivals.extend((0..1024).map(|_| Arrival { at: t, stream: 0, input_size: 0, expected_tokens: 0 }));
        t += 120 * MS;
    }
    arrivals.extend((0..duration / MS).map(|i| Arrival { at: i * MS, stream: 1, input_size: 0, expected_tokens: 0 }));
    arrivals.sort_by_key(|a| (a.at, a.stream));
    arrivals
}

/// MAF-bursty arrivals for `streams` streams totalling `rate` req/s: mean rates drawn
/// from an exponential distribution, each stream a two-state MMPP (1.8× and 0.2× its
/// mean, exponential sojourns of mean 1 s).
fn bursty_arrivals(streams: u32, rate: f64, duration: u64, seed: u64) -> Vec<Arrival> {
    let mut rng = SimRng::new(seed);
    let weights: Vec<f64> = (0..streams).map(|_| rng.exponential(1.0)).collect();
    let total: f64 = weights.iter().sum();
    let mut arrivals = Vec::new();
    for (stream, weight) in weights.iter().enumerate() {
        let mut r = rng.fork(stream as u64);
        let mean = rate * weight / total;
        let mut t = 0.0;
        let mut high = r.uniform() < 0.5;
        let mut switch = r.exponential(1.0);
        let end = duration as f64 / S as f64;
        while t < end {
            let current = mean * if high { 1.8 } else { 0.2 };
            let gap = if current > 0.0 { r.exponential(1.0 / current) } else { f64::INFINITY };
            if t + gap >= switch {
                t = switch;
                high = !high;
                switch = t + r.exponential(1.0);
                continue;
            }
            t += gap;
            if t < end {
                arrivals.push(Arrival { at: (t * S as f64) as u64, stream: stream as u32, input_size: 0, expected_tokens: 0 });
            }
        }
    }
    arrivals.sort_by_key(|a| (a.at, a.stream));
    arrivals
}

fn find<'a>(points: &'a [Point], experiment: &str, x: f64, arm: &str) -> Option<&'a Point> {
    points.iter().find(|p| p.experiment == experiment && p.x == x && p.arm == arm)
}

fn ratio(points: &[Point], experiment: &str, x: f64, a: &str, b: &str) -> f64 {
    let value = |arm| find(points, experiment, x, arm).map_or(f64::NAN, |p| p.on_time as f64);
    value(a) / value(b)
}

fn table(points: &[Point], experiment: &str, x_label: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{x_label:>10}  {:<10} {:>9} {:>9} {:>11} {:>7} {:>8} {:>8} {:>5}",
        "policy", "arrivals", "on time", "goodput/s", "util", "preempt", "dropped", "late"
    );
    for p in points.iter().filter(|p| p.experiment == experiment) {
        let _ = writeln!(
            out,
            "{:>10}  {:<10} {:>9} {:>9} {:>11.1} {:>6.1}% {:>8} {:>8} {:>5}",
            p.x, p.arm, p.arrivals, p.on_time, p.goodput, 100.0 * p.utilisation, p.preemptions, p.dropped, p.late
        );
    }
    out
}

fn write_csv(dir: &Path, points: &[Point]) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("flex-points.csv");
    let mut text = String::from("experiment,x,policy,arrivals,on_time,goodput,utilisation,preemptions,dropped,late\n");
    for p in points {
        let _ = writeln!(
            text,
            "{},{},{},{},{},{:.3},{:.4},{},{},{}",
            p.experiment, p.x, p.arm, p.arrivals, p.on_time, p.goodput, p.utilisation, p.preemptions, p.dropped, p.late
        );
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The whole reproduction.
pub fn run(opts: &ReproduceOptions) -> Result<String> {
    let loader = simulation_loader()?;
    let mut points = Vec::new();
    let mut out = String::new();

    // Fig. 11a.
    let duration = if opts.quick { 2 * S } else { 12 * S };
    let arrivals = figure_11a_arrivals(duration);
    for slo_ms in [250u64, 90] {
        let label = format!("fig11a SLO {slo_ms} ms");
        for (arm, outcome) in run_arms(&label, "flex-fig11a", slo_ms * MS, duration, &arrivals, opts.seed, &loader)? {
            points.push(point("fig11a", slo_ms as f64, arm, &outcome));
        }
    }
    let _ = writeln!(out, "Fig. 11a — one GPU, RN18 bursts of 1024 / 120 ms + RS269 1 req/ms, {} s", duration / S);
    out.push_str(&table(&points, "fig11a", "SLO ms"));
    let _ = writeln!(out, "\n  ratio (on-time requests)          ours    paper  reference DES (spec §8.12)");
    let _ = writeln!(out, "  SLO 250: FLEX / FLEX-NP          {:>5.2}    ≈1.0   1.01 (48.7 k / 48.4 k)", ratio(&points, "fig11a", 250.0, "flex", "flex-np"));
    let _ = writeln!(out, "  SLO 250: FLEX / Clockwork        {:>5.2}    3.7    ≥ 3 (starved)", ratio(&points, "fig11a", 250.0, "flex", "clockwork"));
    let _ = writeln!(out, "  SLO  90: FLEX / FLEX-NP          {:>5.2}    6.2    2.5 (34.1 k / 13.6 k)", ratio(&points, "fig11a", 90.0, "flex", "flex-np"));
    let _ = writeln!(out, "  SLO  90: FLEX / Clockwork        {:>5.2}    6.2    ≥ 3 (starved)", ratio(&points, "fig11a", 90.0, "flex", "clockwork"));

    // Fig. 7: load sweep on 12 GPUs at 250 ms.
    let duration = if opts.quick { S } else { 5 * S };
    let loads: &[f64] = if opts.quick { &[3_000.0, 24_000.0] } else { &[3_000.0, 12_000.0, 24_000.0, 48_000.0] };
    for &load in loads {
        let arrivals = bursty_arrivals(26, load, duration, opts.seed ^ load as u64);
        let label = format!("fig7 {load} req/s");
        for (arm, outcome) in run_arms(&label, "flex-cluster", 250 * MS, duration, &arrivals, opts.seed, &loader)? {
            points.push(point("fig7", load, arm, &outcome));
        }
    }
    let _ = writeln!(out, "\nFig. 7 — 12 GPUs, 13 models, 26 MAF-bursty streams, SLO 250 ms, {} s per point", duration / S);
    out.push_str(&table(&points, "fig7", "req/s"));
    let top = *loads.last().expect("loads");
    let _ = writeln!(out, "\n  at {top} req/s (on-time)           ours    paper (144 k req/s, bursty)");
    let _ = writeln!(out, "  FLEX / Clockwork                 {:>5.2}    5.2", ratio(&points, "fig7", top, "flex", "clockwork"));
    let _ = writeln!(out, "  FLEX / Nexus                     {:>5.2}    18.1", ratio(&points, "fig7", top, "flex", "nexus"));

    // Fig. 9: SLO sweep at 3 k req/s.
    let slos: &[u64] = if opts.quick { &[50, 250] } else { &[50, 100, 250, 500] };
    let arrivals = bursty_arrivals(26, 3_000.0, duration, opts.seed ^ 9);
    for &slo_ms in slos {
        let label = format!("fig9 SLO {slo_ms} ms");
        for (arm, outcome) in run_arms(&label, "flex-cluster", slo_ms * MS, duration, &arrivals, opts.seed, &loader)? {
            points.push(point("fig9", slo_ms as f64, arm, &outcome));
        }
    }
    let _ = writeln!(out, "\nFig. 9 — 12 GPUs at 3 k req/s (bursty), SLO swept");
    out.push_str(&table(&points, "fig9", "SLO ms"));
    let tight = slos[0] as f64;
    let _ = writeln!(out, "\n  at SLO {tight} ms (on-time)             ours    paper (tightest SLOs)");
    let _ = writeln!(out, "  FLEX / Clockwork                 {:>5.2}    up to 1.3", ratio(&points, "fig9", tight, "flex", "clockwork"));
    let _ = writeln!(out, "  FLEX / Nexus                     {:>5.2}    up to 38", ratio(&points, "fig9", tight, "flex", "nexus"));

    let csv = write_csv(&opts.out, &points)?;
    let _ = writeln!(out, "\nwrote {}", csv.display());
    match plot::write(&opts.out, &points) {
        Ok(files) => {
            for f in files {
                let _ = writeln!(out, "wrote {}", f.display());
            }
        }
        Err(e) => {
            let _ = writeln!(out, "plots skipped: {e}");
        }
    }
    Ok(out)
}

/// Line charts of on-time requests per swept value, one line per policy.
mod plot {
    use std::path::{Path, PathBuf};

    use plotters::prelude::*;

    use super::{Point, ARMS};

    const COLOURS: [RGBColor; 5] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189)];

    /// Write `flex-EXPERIMENT.svg` (and `.png` when a system font is installed) for each
    /// experiment; errors name the file.
    pub fn write(dir: &Path, points: &[Point]) -> Result<Vec<PathBuf>, String> {
        // Registers the charts' font (a system one, or a metrics-only one for SVG).
        let png = matches!(crate::metrics::report::plot_font()?, crate::metrics::report::PlotFont::System(_));
        let mut files = Vec::new();
        for (experiment, x_label, log_x) in [("fig11a", "SLO (ms)", false), ("fig7", "offered load (req/s)", true), ("fig9", "SLO (ms)", false)] {
            let mine: Vec<&Point> = points.iter().filter(|p| p.experiment == experiment).collect();
            if mine.is_empty() {
                continue;
            }
            let svg = dir.join(format!("flex-{experiment}.svg"));
            draw(SVGBackend::new(&svg, SIZE), experiment, x_label, log_x, &mine).map_err(|e| format!("{}: {e}", svg.display()))?;
            files.push(svg);
            if png {
                let path = dir.join(format!("flex-{experiment}.png"));
                draw(BitMapBackend::new(&path, SIZE), experiment, x_label, log_x, &mine)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                files.push(path);
            }
        }
        Ok(files)
    }

    const SIZE: (u32, u32) = (800, 500);

    fn draw<DB: DrawingBackend>(backend: DB, title: &str, x_label: &str, log_x: bool, points: &[&Point]) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        let xs: Vec<f64> = points.iter().map(|p| if log_x { p.x.log10() } else { p.x }).collect();
        let (x_min, x_max) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let pad = ((x_max - x_min) * 0.05).max(0.5);
        let y_max = points.iter().map(|p| p.goodput).fold(0.0, f64::max) * 1.1 + 1.0;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("SHEPHERD {title}: goodput"), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x_min - pad)..(x_max + pad), 0.0..y_max)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .x_desc(if log_x { format!("log10 {x_label}") } else { x_label.to_string() })
            .y_desc("goodput (req/s)")
            .draw()
            .map_err(fail)?;
        for (i, arm) in ARMS.iter().enumerate() {
            let mut series: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.arm == arm.name)
                .map(|p| (if log_x { p.x.log10() } else { p.x }, p.goodput))
                .collect();
            series.sort_by(|a, b| a.0.total_cmp(&b.0));
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(series.clone(), colour.stroke_width(2)))
                .map_err(fail)?
                .label(arm.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
            chart.draw_series(series.into_iter().map(|(x, y)| Circle::new((x, y), 3, colour.filled()))).map_err(fail)?;
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(fail)?;
        root.present().map_err(fail)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_11a_arrivals_follow_the_paper() {
        let arrivals = figure_11a_arrivals(250 * MS);
        let rn18: Vec<u64> = arrivals.iter().filter(|a| a.stream == 0).map(|a| a.at).collect();
        assert_eq!(rn18.len(), 3 * 1024, "bursts at 5, 125 and 245 ms");
        assert_eq!((rn18[0], rn18[1024], rn18[2048]), (5 * MS, 125 * MS, 245 * MS));
        assert_eq!(arrivals.iter().filter(|a| a.stream == 1).count(), 250);
        assert!(arrivals.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn bursty_arrivals_hit_the_mean_rate_and_are_burstier_than_poisson() {
        let arrivals = bursty_arrivals(4, 2_000.0, 20 * S, 7);
        let rate = arrivals.len() as f64 / 20.0;
        assert!((rate - 2_000.0).abs() < 300.0, "{rate}");
        // Per-100 ms counts of the busiest stream: an MMPP's dispersion index is well
        // above Poisson's 1.
        let busiest = (0..4).max_by_key(|&s| arrivals.iter().filter(|a| a.stream == s).count()).unwrap();
        let mut counts = vec![0f64; 200];
        for a in arrivals.iter().filter(|a| a.stream == busiest) {
            counts[(a.at / (100 * MS)) as usize] += 1.0;
        }
        let mean = counts.iter().sum::<f64>() / counts.len() as f64;
        let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / counts.len() as f64;
        assert!(var / mean > 3.0, "dispersion {}", var / mean);
    }

    /// FLEX against its baselines on a short Fig. 11a run at the tight SLO: preemption
    /// at least doubles goodput over FLEX-NP, and FLEX beats every baseline.
    #[test]
    fn flex_beats_its_baselines_on_a_short_figure_11a_run() {
        let loader = simulation_loader().unwrap();
        let duration = S / 2;
        let arrivals = figure_11a_arrivals(duration);
        let outcomes = run_arms("test", "flex-fig11a", 90 * MS, duration, &arrivals, 1, &loader).unwrap();
        let on_time = |name: &str| outcomes.iter().find(|(n, _)| *n == name).unwrap().1.report.summary.overall.outcomes.on_time;
        let preemptions = outcomes.iter().find(|(n, _)| *n == "flex").unwrap().1.engine.preemptions;
        assert!(preemptions > 0);
        assert!(on_time("flex") >= 2 * on_time("flex-np"), "{} vs {}", on_time("flex"), on_time("flex-np"));
        for other in ["flex-edf", "clockwork", "nexus"] {
            assert!(on_time("flex") > on_time(other), "flex {} vs {other} {}", on_time("flex"), on_time(other));
        }
        for (name, outcome) in &outcomes {
            assert_eq!(outcome.unfinished, 0, "{name}");
            let overall = &outcome.report.summary.overall;
            assert_eq!(overall.arrivals, arrivals.len() as u64, "{name}: every request counted");
            assert_eq!(overall.ended, overall.arrivals, "{name}: every request ends once");
        }
    }
}
