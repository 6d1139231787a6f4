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
//! - **Fig. 11b**: 400 emulated workers, the same 13 models, 1300 MAF-bursty streams
//!   of equal mean rate, 250 to 1000 req/s per worker, SLO 250 ms, HERD with
//!   Ḡ ∈ {1, 12, ∞} under the scheduler cost model ([`SCHED_COST`]): one serial
//!   scheduler per serving group, every event costing CPU time that grows with the
//!   group's size.
//!
//! Latencies are the profiles exactly (no noise), as in the paper's emulation. Tables
//! go to standard output; CSV files and SVG/PNG charts to the output directory.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::{simulation_loader, Arm, ReproduceOptions};
use crate::executor::SimExecutorOptions;
use crate::{per_core, run, RunOutcome, SimSpec};
use yardmaster_engine::pipeline::{Pipeline, StreamDef};
use yardmaster_engine::EngineOptions;
use yardmaster_formats::presets;
use yardmaster_formats::rng::SimRng;
use yardmaster_formats::workload::Arrival;
use yardmaster_policy::PolicyLoader;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// FLEX as shipped (adaptive selection, preemption deferred while another worker can
/// take the batch), FLEX as the paper writes it, and every baseline.
const ARMS: &[Arm] = &[
    Arm { name: "flex", policy: "flex", params: &[] },
    Arm { name: "flex-paper", policy: "flex", params: &[("select", "largest"), ("defer_preemption", "false"), ("busy_order", "id")] },
    Arm { name: "flex-np", policy: "flex", params: &[("lambda", "inf")] },
    Arm { name: "flex-edf", policy: "flex", params: &[("select", "earliest"), ("lambda", "inf")] },
    Arm { name: "clockwork", policy: "flex-clockwork", params: &[] },
    Arm { name: "nexus", policy: "flex-nexus", params: &[] },
];

/// The scheduler cost model of Fig. 11b, as FLEX parameters: an event costs
/// `c·(#models + #workers of its group)` with c = 94 ns, the spec's Clockwork cost
/// (§6) calibrated so that one scheduler over 200 workers and 13 models (213 units,
/// 20 µs per event) saturates at 50 k events/s, where the paper's Clockwork saturates
/// (about 50 k req/s near N = 200). The 13 models give the fixed part (1.22 µs).
pub const SCHED_COST: &[(&str, &str)] = &[("sched_cost_us", "1.22"), ("sched_cost_per_worker_ns", "94")];

/// Fig. 11b's arms: FLEX under the scheduler cost model with Ḡ = 1, 12 and ∞, and
/// Ḡ = ∞ with free decisions (what a single group would give if scheduling cost
/// nothing; run at the lowest load only).
const FIG11B_ARMS: &[Arm] = &[
    Arm { name: "G=1", policy: "flex", params: &[("group_limit", "1"), SCHED_COST[0], SCHED_COST[1]] },
    Arm { name: "G=12", policy: "flex", params: &[("group_limit", "12"), SCHED_COST[0], SCHED_COST[1]] },
    Arm { name: "G=inf", policy: "flex", params: &[("group_limit", "inf"), SCHED_COST[0], SCHED_COST[1]] },
    Arm { name: "G=inf-free", policy: "flex", params: &[("group_limit", "inf")] },
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
    run_arms_on(label, ARMS, &pipeline, duration, arrivals, seed, loader)
}

/// Run `arms` on `arrivals` with `pipeline`, one arm per core.
fn run_arms_on(
    label: &str,
    arms: &'static [Arm],
    pipeline: &Pipeline,
    duration: u64,
    arrivals: &[Arrival],
    seed: u64,
    loader: &PolicyLoader,
) -> Result<Vec<(&'static str, RunOutcome)>> {
    eprintln!("  {label}: simulating {} arms …", arms.len());
    let started = std::time::Instant::now();
    let out = per_core(arms, |arm| {
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
        let outcome =
            run::run(&spec, &policy, loader, arrivals.iter().cloned(), &mut |_| {}).with_context(|| format!("{label}: {}", arm.name))?;
        // A policy that faulted ran the built-in fallback: its numbers are not the arm's.
        if outcome.arm.fallbacks > 0 {
            anyhow::bail!("{label}: {}: the policy faulted ({:?}) and fell back", arm.name, outcome.arm.faults);
        }
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
    mmpp_arrivals(&weights, rate, duration, &mut rng)
}

/// Two-state MMPP arrivals (1.8× and 0.2× the mean, exponential sojourns of mean 1 s)
/// for streams whose mean rates are `weights` scaled to total `rate` req/s.
fn mmpp_arrivals(weights: &[f64], rate: f64, duration: u64, rng: &mut SimRng) -> Vec<Arrival> {
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

/// Fig. 11b's cluster: the `flex-cluster` models on `workers` GPUs, with `per_model`
/// streams per model (`rn18/0`, `rn34/0`, …, interleaved), SLO 250 ms.
fn figure_11b_pipeline(workers: u32, per_model: u32) -> Result<Pipeline> {
    let mut pipeline = presets::pipeline("flex-cluster").map_err(anyhow::Error::msg)?;
    pipeline.name = "flex-fig11b".into();
    pipeline.max_workers = workers;
    let stage = &mut pipeline.stages[0];
    stage.replicas = workers;
    stage.max_replicas = workers;
    stage.min_replicas = stage.min_replicas.min(workers);
    let models: Vec<String> = stage.variants.iter().map(|v| v.name.clone()).collect();
    pipeline.streams = (0..per_model)
        .flat_map(|i| models.iter().map(move |m| StreamDef { name: format!("{m}/{i}"), entry: 0, slo_ns: 250 * MS }))
        .collect();
    Ok(pipeline)
}

/// Fig. 11b's workload on `workers` GPUs for `duration`: one stream per model per 4
/// workers (100 per model on 400 workers, so that with Ḡ = 1 a GPU serves about 3
/// streams), equal mean rates (so HERD's first plan, made before it has measured any
/// rate, is the right one), MAF-bursty, `per_worker` req/s per worker in all.
fn figure_11b(workers: u32, per_worker: f64, duration: u64, seed: u64) -> Result<(Pipeline, Vec<Arrival>)> {
    let pipeline = figure_11b_pipeline(workers, (workers / 4).max(1))?;
    let weights = vec![1.0; pipeline.streams.len()];
    let arrivals = mmpp_arrivals(&weights, per_worker * workers as f64, duration, &mut SimRng::new(seed));
    Ok((pipeline, arrivals))
}

fn find<'a>(points: &'a [Point], experiment: &str, x: f64, arm: &str) -> Option<&'a Point> {
    points.iter().find(|p| p.experiment == experiment && p.x == x && p.arm == arm)
}

fn ratio(points: &[Point], experiment: &str, x: f64, a: &str, b: &str) -> f64 {
    let value = |arm| find(points, experiment, x, arm).map_or(f64::NAN, |p| p.on_time as f64);
    value(a) / value(b)
}

/// A ratio with two decimals, or a dash when an arm did not run.
fn shown(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{ratio:.2}")
    } else {
        "—".into()
    }
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
            p.x,
            p.arm,
            p.arrivals,
            p.on_time,
            p.goodput,
            100.0 * p.utilisation,
            p.preemptions,
            p.dropped,
            p.late
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

/// The arms FLEX is measured against (the paper's literal FLEX is a variant, not a
/// baseline).
const BASELINES: &[&str] = &["flex-np", "flex-edf", "clockwork", "nexus"];

/// For every point of Figs. 11a, 7 and 9: FLEX's on-time requests over the best
/// baseline's, and how many points FLEX leads or ties.
fn against_best_baseline(points: &[Point]) -> String {
    let mut out = String::from("\nFLEX against the best baseline at each point (on-time requests)\n");
    let (mut ahead, mut total) = (0, 0);
    for experiment in ["fig11a", "fig7", "fig9"] {
        for flex in points.iter().filter(|p| p.experiment == experiment && p.arm == "flex") {
            let best = BASELINES.iter().filter_map(|arm| find(points, experiment, flex.x, arm)).max_by_key(|p| p.on_time);
            let Some(best) = best else { continue };
            total += 1;
            if flex.on_time >= best.on_time {
                ahead += 1;
            }
            let ratio = flex.on_time as f64 / best.on_time.max(1) as f64;
            let _ = writeln!(
                out,
                "  {experiment:<7} {:>8}  FLEX {:>7}  best baseline {:<9} {:>7}  ratio {ratio:.4}",
                flex.x, flex.on_time, best.arm, best.on_time
            );
        }
    }
    let _ = writeln!(out, "  FLEX leads or ties at {ahead} of {total} points");
    out
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
    let _ = writeln!(
        out,
        "  SLO 250: FLEX / FLEX-NP          {:>5.2}    ≈1.0   1.01 (48.7 k / 48.4 k)",
        ratio(&points, "fig11a", 250.0, "flex", "flex-np")
    );
    let _ = writeln!(
        out,
        "  SLO 250: FLEX / Clockwork        {:>5.2}    3.7    ≥ 3 (starved)",
        ratio(&points, "fig11a", 250.0, "flex", "clockwork")
    );
    let _ = writeln!(
        out,
        "  SLO  90: FLEX / FLEX-NP          {:>5.2}    6.2    2.5 (34.1 k / 13.6 k)",
        ratio(&points, "fig11a", 90.0, "flex", "flex-np")
    );
    let _ = writeln!(
        out,
        "  SLO  90: FLEX / Clockwork        {:>5.2}    6.2    ≥ 3 (starved)",
        ratio(&points, "fig11a", 90.0, "flex", "clockwork")
    );

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

    out.push_str(&against_best_baseline(&points));

    // Fig. 11b: Ḡ ∈ {1, 12, ∞} on 400 workers under the scheduler cost model, load swept.
    let workers = 400;
    let duration = if opts.quick { S / 2 } else { S };
    let per_worker: &[f64] = if opts.quick { &[250.0] } else { &[250.0, 500.0, 1_000.0] };
    let mut streams = 0;
    for &load in per_worker {
        let (pipeline, arrivals) = figure_11b(workers, load, duration, opts.seed ^ 11 ^ load as u64)?;
        streams = pipeline.streams.len();
        let label = format!("fig11b {workers} workers, {load} req/s each");
        // Ḡ = ∞ with free decisions only at the lowest load: above it, one decision over
        // 400 workers and their long queues takes more than a policy call's fuel (the
        // very cost the model charges), and the arm would run the fallback.
        let arms = if load == per_worker[0] { FIG11B_ARMS } else { &FIG11B_ARMS[..3] };
        for (arm, outcome) in run_arms_on(&label, arms, &pipeline, duration, &arrivals, opts.seed, &loader)? {
            points.push(point("fig11b", load * workers as f64, arm, &outcome));
        }
    }
    let _ = writeln!(
        out,
        "\nFig. 11b — {workers} workers, 13 models, {streams} MAF-bursty streams of equal rate, SLO 250 ms, {:.1} s per point;\n\
         scheduler cost per event 94 ns × (13 models + workers of the group); G=inf-free: Ḡ = ∞ with free decisions",
        duration as f64 / S as f64
    );
    out.push_str(&table(&points, "fig11b", "req/s"));
    let _ = writeln!(out, "\n  ratio (on-time requests)      Ḡ=12/Ḡ=∞   Ḡ=12/Ḡ=1   Ḡ=12/free Ḡ=∞");
    for &load in per_worker {
        let x = load * workers as f64;
        let _ = writeln!(
            out,
            "  {x:>9} req/s                  {:>5}      {:>5}      {:>5}",
            shown(ratio(&points, "fig11b", x, "G=12", "G=inf")),
            shown(ratio(&points, "fig11b", x, "G=12", "G=1")),
            shown(ratio(&points, "fig11b", x, "G=12", "G=inf-free"))
        );
    }
    let _ = writeln!(out, "  paper (400 workers)                2.5        1.7        —");

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

    use super::{Point, ARMS, FIG11B_ARMS};

    /// Write `flex-EXPERIMENT.svg` (and `.png` when a system font is installed) for each
    /// experiment; errors name the file.
    pub fn write(dir: &Path, points: &[Point]) -> Result<Vec<PathBuf>, String> {
        // Registers the charts' font (a system one, or a metrics-only one for SVG).
        let png = matches!(crate::report::plot_font()?, crate::report::PlotFont::System(_));
        let mut files = Vec::new();
        // One line per policy (per Ḡ in Fig. 11b).
        let per_arm: Vec<(&str, Vec<&str>)> = ARMS.iter().map(|a| (a.name, vec![a.name])).collect();
        let fig11b: Vec<(&str, Vec<&str>)> = FIG11B_ARMS.iter().map(|a| (a.name, vec![a.name])).collect();
        for (experiment, x_label, log_x, series) in [
            ("fig11a", "SLO (ms)", false, &per_arm),
            ("fig7", "offered load (req/s)", true, &per_arm),
            ("fig9", "SLO (ms)", false, &per_arm),
            ("fig11b", "offered load (req/s), 400 workers", false, &fig11b),
        ] {
            let mine: Vec<&Point> = points.iter().filter(|p| p.experiment == experiment).collect();
            if mine.is_empty() {
                continue;
            }
            let svg = dir.join(format!("flex-{experiment}.svg"));
            draw(SVGBackend::new(&svg, SIZE), experiment, x_label, log_x, &mine, series).map_err(|e| format!("{}: {e}", svg.display()))?;
            files.push(svg);
            if png {
                let path = dir.join(format!("flex-{experiment}.png"));
                draw(BitMapBackend::new(&path, SIZE), experiment, x_label, log_x, &mine, series)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                files.push(path);
            }
        }
        Ok(files)
    }

    const SIZE: (u32, u32) = (800, 500);

    /// One chart; `series` are (label, the arms whose points form the line).
    fn draw<DB: DrawingBackend>(
        backend: DB,
        title: &str,
        x_label: &str,
        log_x: bool,
        points: &[&Point],
        series: &[(&str, Vec<&str>)],
    ) -> Result<(), String>
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
        for (i, (label, arms)) in series.iter().enumerate() {
            let mut series: Vec<(f64, f64)> =
                points.iter().filter(|p| arms.contains(&p.arm)).map(|p| (if log_x { p.x.log10() } else { p.x }, p.goodput)).collect();
            series.sort_by(|a, b| a.0.total_cmp(&b.0));
            let colour = crate::report::colour(i);
            chart
                .draw_series(LineSeries::new(series.clone(), colour.stroke_width(2)))
                .map_err(fail)?
                .label(*label)
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

    /// Fig. 11b at a size a debug build runs quickly: 48 workers at 250 req/s each,
    /// with the per-worker scheduler cost raised (6.7 µs) so that one group of 48 is as
    /// overloaded as one of 400 is with 94 ns (its events cost 3.9× the time between
    /// arrivals). Under the cost model Ḡ = 12 beats Ḡ = ∞ by at least 1.5× and is at
    /// least as good as Ḡ = 1 (within 2 %: at this load Ḡ = 1 loses nothing either, see
    /// docs/flex.md); with free decisions Ḡ = ∞ is as good as Ḡ = 12, so the cost model
    /// is what makes it lose.
    #[test]
    fn figure_11b_group_limit_12_is_best_under_the_scheduler_cost_model() {
        const COST: [(&str, &str); 2] = [("sched_cost_us", "1.22"), ("sched_cost_per_worker_ns", "6700")];
        const SMALL: &[Arm] = &[
            Arm { name: "G=1", policy: "flex", params: &[("group_limit", "1"), COST[0], COST[1]] },
            Arm { name: "G=12", policy: "flex", params: &[("group_limit", "12"), COST[0], COST[1]] },
            Arm { name: "G=inf", policy: "flex", params: &[("group_limit", "inf"), COST[0], COST[1]] },
            Arm { name: "G=inf-free", policy: "flex", params: &[("group_limit", "inf")] },
        ];
        let loader = simulation_loader().unwrap();
        let duration = S;
        let (pipeline, arrivals) = figure_11b(48, 250.0, duration, 11).unwrap();
        let outcomes = run_arms_on("test", SMALL, &pipeline, duration, &arrivals, 1, &loader).unwrap();
        let on_time = |name: &str| outcomes.iter().find(|(n, _)| *n == name).unwrap().1.report.summary.overall.outcomes.on_time;
        let line =
            format!("Ḡ=1 {}, Ḡ=12 {}, Ḡ=∞ {}, free Ḡ=∞ {}", on_time("G=1"), on_time("G=12"), on_time("G=inf"), on_time("G=inf-free"));
        println!("48 workers: {line}");
        let (g1, g12, inf, free) = (on_time("G=1") as f64, on_time("G=12") as f64, on_time("G=inf") as f64, on_time("G=inf-free") as f64);
        assert!(g12 >= 1.5 * inf, "{line}");
        assert!(g12 >= 0.98 * g1, "{line}");
        assert!(free >= 0.98 * g12, "{line}");
        for (name, outcome) in &outcomes {
            let overall = &outcome.report.summary.overall;
            assert_eq!(overall.arrivals, arrivals.len() as u64, "{name}: every request counted");
        }
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
