//! QUART (ICDCS'24), Fig. 7: an 8-stage pipeline (BERT-21B split in 8, `quart-bert8`)
//! under synthetic load whose inter-arrival times are gamma-distributed with
//! coefficient of variation 0.1, 1, 2, 4 and 8, at a mean rate of twice one replica's
//! stage capacity, starting from one replica per stage. QUART runs beside three
//! baselines: fixed replicas (`quart-fixed`, provisioned for the mean load), uniform
//! scaling of all stages (`quart-uniform`) and a reactive queue-length autoscaler
//! (`quart-reactive`), plus QUART without the host-memory parameter cache
//! (`quart-cold`, an ablation). The cluster is the paper's: 12 GPU servers of 4 GPUs,
//! each caching parameters in its own host memory (1 TB). As in the paper, the
//! baselines have no parameter cache: every replica they start loads from disk
//! (8.65 s), while QUART's start warm from host memory (0.8 s) on a server that caches
//! the stage's parameters — which QUART's cache-aware placement (contract 0.2) seeks.
//!
//! Reported per CV and policy: mean, P75 and P99 end-to-end latency, SLO satisfaction
//! at 1×–3× the model's execution time, goodput (responses within 1.5× per second)
//! and replica-seconds; then QUART's mean-latency reduction and goodput ratio against
//! each baseline, averaged over the CVs and at CV 8.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::{shipped, simulation_loader, ReproduceOptions};
use crate::executor::SimExecutorOptions;
use crate::report::{write_csv, write_json, write_plots, RunReport};
use crate::{per_core, run, PolicySpec, RunOutcome, SimSpec};
use yardmaster_engine::EngineOptions;
use yardmaster_formats::presets;
use yardmaster_formats::rng::SimRng;
use yardmaster_formats::workload::Arrival;

/// Whole-model execution time of BERT-21B (paper Table 1), nanoseconds.
pub const EXEC_NS: u64 = 137_000_000;
/// Profiled service time of one stage at the base cores, seconds.
const STAGE_S: f64 = 0.0206;
/// SLO multiples of the execution time reported as SLO satisfaction.
pub const SLO_MULTIPLES: [f64; 4] = [1.0, 1.5, 2.0, 3.0];
/// The SLO multiple that defines goodput (the paper's headline 1.5×).
const GOODPUT_MULTIPLE: f64 = 1.5;
/// Replicas per stage of the fixed baseline: enough for the mean load (ρ = 0.67).
const FIXED_REPLICAS: u32 = 3;
/// Service-time noise: CV √0.05 (§3.9).
const SERVICE_CV: f64 = 0.2236;

/// A policy of the comparison and whether its host caches parameters.
struct Contender {
    policy: PolicySpec,
    cached: bool,
}

fn contenders() -> Result<Vec<Contender>> {
    Ok(vec![
        Contender { policy: shipped("quart", "quart")?, cached: true },
        Contender { policy: shipped("quart", "quart-cold")?, cached: false },
        Contender { policy: shipped("quart-fixed", "quart-fixed")?, cached: false },
        Contender { policy: shipped("quart-uniform", "quart-uniform")?, cached: false },
        Contender { policy: shipped("quart-reactive", "quart-reactive")?, cached: false },
    ])
}

/// A gamma renewal process: gaps with mean `1/rate` and CV `cv` (shape `1/cv²`).
pub struct GammaArrivals {
    rng: SimRng,
    shape: f64,
    scale: f64,
    t: f64,
    end: f64,
}

impl GammaArrivals {
    /// Arrivals at `rate` per second with gap CV `cv`, for `duration_s` seconds.
    pub fn new(rate: f64, cv: f64, duration_s: f64, seed: u64) -> Self {
        let shape = 1.0 / (cv * cv);
        Self { rng: SimRng::new(seed), shape, scale: 1.0 / (rate * shape), t: 0.0, end: duration_s }
    }
}

impl Iterator for GammaArrivals {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        self.t += self.rng.gamma(self.shape, self.scale);
        (self.t < self.end).then(|| Arrival { at: (self.t * 1e9) as u64, ..Arrival::default() })
    }
}

/// The measured quantities of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct QuartRow {
    /// Input CV.
    pub cv: f64,
    /// Policy (report name).
    pub policy: String,
    /// Mean end-to-end latency, ms.
    pub mean_ms: f64,
    /// 75th percentile, ms.
    pub p75_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Fraction of requests within each of [`SLO_MULTIPLES`] × the execution time.
    pub slo: Vec<f64>,
    /// Responses within 1.5× the execution time, per second.
    pub goodput: f64,
    /// Replica-seconds (serving replicas over the run).
    pub replica_s: f64,
    /// Requests that arrived.
    pub arrivals: u64,
    /// Requests not completed (dropped, failed or still in flight at the end).
    pub incomplete: u64,
    /// Replicas started warm (from a server's parameter cache) and cold.
    pub starts: (u64, u64),
}

/// Fraction of the latency histogram at or below `limit_ns`.
fn fraction_within(report: &RunReport, limit_ns: u64) -> f64 {
    report.latency.cdf().take_while(|&(value, _)| value <= limit_ns).last().map_or(0.0, |(_, f)| f)
}

/// The row of one run; requests that never completed count as missing every SLO.
pub fn row(cv: f64, outcome: &RunOutcome, duration_s: f64) -> QuartRow {
    let report = &outcome.report;
    let overall = &report.summary.overall;
    let completed = overall.completed as f64;
    let arrivals = overall.arrivals.max(1) as f64;
    let within = |k: f64| fraction_within(report, (k * EXEC_NS as f64) as u64) * completed / arrivals;
    QuartRow {
        cv,
        policy: report.policy.clone(),
        mean_ms: report.latency.mean() / 1e6,
        p75_ms: report.latency.quantile(0.75) as f64 / 1e6,
        p99_ms: report.latency.quantile(0.99) as f64 / 1e6,
        slo: SLO_MULTIPLES.iter().map(|&k| within(k)).collect(),
        goodput: within(GOODPUT_MULTIPLE) * arrivals / duration_s,
        replica_s: report.summary.gpu_seconds,
        arrivals: overall.arrivals,
        incomplete: overall.arrivals.saturating_sub(overall.completed) + outcome.unfinished as u64,
        starts: outcome.starts,
    }
}

/// The simulation settings of one CV level.
pub fn spec(seed: u64, duration_s: f64, cached: bool) -> Result<SimSpec> {
    let mut pipeline = presets::pipeline("quart-bert8").map_err(anyhow::Error::msg)?;
    if !cached {
        for host in &mut pipeline.hosts {
            host.cache_bytes = 0;
        }
    }
    let engine = EngineOptions {
        tick_interval: 2_000_000_000,
        // Requests are never dropped (§2): the host's expiry guard stays out of the way.
        expiry_grace: 3_600_000_000_000,
        // The paper's QUART never drops either (`drop_unreachable=false`; by default it
        // drops what can no longer finish in time, docs/quart.md "Past capacity"), and
        // its controller runs on the period only (`first_control_ms=0`; by default the
        // first control comes 100 ms after the first arrival).
        params: vec![
            yardmaster_policy::contract::Param { key: "replicas".into(), value: FIXED_REPLICAS.to_string() },
            yardmaster_policy::contract::Param { key: "drop_unreachable".into(), value: "false".into() },
            yardmaster_policy::contract::Param { key: "first_control_ms".into(), value: "0".into() },
        ],
        metrics_window: 5_000_000_000,
        ..EngineOptions::default()
    };
    let executor = SimExecutorOptions { noise_cv: SERVICE_CV, ..SimExecutorOptions::default() };
    Ok(SimSpec { pipeline, seed, duration: (duration_s * 1e9) as u64, executor, engine, decision_interval: 0, capture_dir: None })
}

/// Run every contender at one CV level; outcomes in the order of [`contenders`].
fn run_level(cv: f64, rate: f64, duration_s: f64, seed: u64) -> Result<Vec<RunOutcome>> {
    let loader = simulation_loader()?;
    let contenders = contenders()?;
    per_core(&contenders, |c| {
        let spec = spec(seed, duration_s, c.cached)?;
        let arrivals = GammaArrivals::new(rate, cv, duration_s, seed);
        run::run(&spec, &c.policy, &loader, arrivals, &mut |_| {})
    })
}

/// Render the per-CV table.
pub fn render_rows(rows: &[QuartRow]) -> String {
    let mut out = String::new();
    let slo_heads: Vec<String> = SLO_MULTIPLES.iter().map(|k| format!("SLO{k}x")).collect();
    let _ = writeln!(
        out,
        "{:>5} {:<15} {:>9} {:>9} {:>9} {} {:>9} {:>10} {:>8} {:>11}",
        "CV",
        "policy",
        "mean ms",
        "P75 ms",
        "P99 ms",
        slo_heads.iter().map(|h| format!("{h:>8}")).collect::<Vec<_>>().join(" "),
        "goodput",
        "replica-s",
        "incompl.",
        "warm/cold"
    );
    for r in rows {
        let slo: Vec<String> = r.slo.iter().map(|s| format!("{:>7.1}%", 100.0 * s)).collect();
        let _ = writeln!(
            out,
            "{:>5} {:<15} {:>9.1} {:>9.1} {:>9.1} {} {:>9.1} {:>10.0} {:>8} {:>11}",
            r.cv,
            r.policy,
            r.mean_ms,
            r.p75_ms,
            r.p99_ms,
            slo.join(" "),
            r.goodput,
            r.replica_s,
            r.incomplete,
            format!("{}/{}", r.starts.0, r.starts.1)
        );
    }
    out
}

/// QUART against each other policy: mean-latency reduction and goodput ratio, averaged
/// over the CV levels and at the highest one.
pub fn render_headline(rows: &[QuartRow]) -> String {
    let mut out = String::new();
    let cvs: Vec<f64> = {
        let mut v: Vec<f64> = rows.iter().map(|r| r.cv).collect();
        v.dedup();
        v
    };
    let top = cvs.iter().copied().fold(f64::MIN, f64::max);
    let find = |cv: f64, p: &str| rows.iter().find(|r| r.cv == cv && r.policy == p);
    let mut others: Vec<&str> = rows.iter().map(|r| r.policy.as_str()).filter(|p| *p != "quart").collect();
    others.sort_unstable();
    others.dedup();
    let _ = writeln!(
        out,
        "{:<15} {:>22} {:>20} {:>22} {:>20}",
        "vs",
        "mean-latency cut (avg)",
        "goodput ratio (avg)",
        format!("latency cut (CV {top})"),
        format!("goodput ratio (CV {top})")
    );
    for other in others {
        let (mut cut, mut ratio, mut n) = (0.0, 0.0, 0.0);
        for &cv in &cvs {
            if let (Some(q), Some(o)) = (find(cv, "quart"), find(cv, other)) {
                cut += 1.0 - q.mean_ms / o.mean_ms;
                ratio += q.goodput / o.goodput.max(1e-9);
                n += 1.0;
            }
        }
        let (Some(q), Some(o)) = (find(top, "quart"), find(top, other)) else { continue };
        let _ = writeln!(
            out,
            "{:<15} {:>21.1}% {:>19.2}x {:>21.1}% {:>19.2}x",
            other,
            100.0 * cut / n,
            ratio / n,
            100.0 * (1.0 - q.mean_ms / o.mean_ms),
            q.goodput / o.goodput.max(1e-9)
        );
    }
    let low = cvs.iter().copied().fold(f64::MAX, f64::min);
    let mut policies: Vec<&str> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let _ = writeln!(out, "\nburst robustness: mean latency at CV {top} / at CV {low} (smaller is flatter)");
    for p in policies {
        if let (Some(hi), Some(lo)) = (find(top, p), find(low, p)) {
            let _ = writeln!(out, "  {p:<15} {:>6.2}x", hi.mean_ms / lo.mean_ms);
        }
    }
    out
}

/// Coefficient of variation of the gaps between sorted times (0 with fewer than 3).
pub fn gap_cv(times: &mut [u64]) -> f64 {
    times.sort_unstable();
    let gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
    if gaps.len() < 2 {
        return 0.0;
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    if mean > 0.0 {
        variance.sqrt() / mean
    } else {
        0.0
    }
}

/// Per-stage arrival CV (paper Fig. 2a): the pipeline at a fixed 3 replicas per stage
/// (ρ ≈ 0.67) under input CV `cv`; a stage's arrivals are the completions of the
/// stage before it, read from the run's trace.
pub fn stage_cvs(cv: f64, duration_s: f64, seed: u64, dir: &Path) -> Result<Vec<f64>> {
    use yardmaster_formats::trace::{TraceReader, TraceRecord};
    let mut spec = spec(seed, duration_s, false)?;
    spec.capture_dir = Some(dir.to_path_buf());
    let loader = simulation_loader()?;
    let policy = shipped("quart-fixed", &format!("quart-fixed-cv{cv}"))?;
    run::run(&spec, &policy, &loader, GammaArrivals::new(2.0 / STAGE_S, cv, duration_s, seed), &mut |_| {})?;
    let path = dir.join(format!("trace-{}.jsonl", policy.name));
    let file = std::fs::File::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let stages = spec.pipeline.stages.len();
    let mut arrivals: Vec<Vec<u64>> = vec![Vec::new(); stages];
    for record in TraceReader::new(std::io::BufReader::new(file))? {
        match record? {
            TraceRecord::Arrival(a) => arrivals[0].push(a.at),
            TraceRecord::Batch(b) if (b.stage as usize) + 1 < stages => arrivals[b.stage as usize + 1].push(b.at + b.duration),
            _ => {}
        }
    }
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(arrivals.iter_mut().map(|times| gap_cv(times)).collect())
}

/// One chart of the sweep: file name, title, y-axis label, plotted quantity.
type SweepChart = (&'static str, &'static str, &'static str, fn(&QuartRow) -> f64);

/// Line colours of the sweep charts, one per policy in order.
const SWEEP_COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// A line chart of one quantity against the input CV (CV levels evenly spaced), one
/// line per policy, as a self-contained SVG (its text is rendered by the viewer, so
/// no font is needed).
pub fn sweep_svg(rows: &[QuartRow], title: &str, y_label: &str, value: fn(&QuartRow) -> f64) -> String {
    let (width, height, left, right, top, bottom) = (760.0, 460.0, 70.0, 170.0, 40.0, 50.0);
    let mut cvs: Vec<f64> = rows.iter().map(|r| r.cv).collect();
    cvs.dedup();
    let mut policies: Vec<&str> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let y_max = rows.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.1;
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let x = |i: usize| left + if cvs.len() > 1 { plot_w * i as f64 / (cvs.len() - 1) as f64 } else { plot_w / 2.0 };
    let y = |v: f64| top + plot_h * (1.0 - v / y_max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">input CV of inter-arrival times</text>\n\
         <text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{y_label}</text>\n",
        left + plot_w / 2.0,
        top + plot_h,
        left + plot_w,
        top + plot_h,
        top + plot_h,
        left + plot_w / 2.0,
        height - 12.0,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
    );
    for k in 0..=4 {
        let v = y_max * k as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"end\">{v:.0}</text>",
            y(v),
            left + plot_w,
            left - 6.0,
            y(v) + 4.0
        );
    }
    for (i, cv) in cvs.iter().enumerate() {
        let _ = writeln!(svg, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{cv}</text>", x(i), top + plot_h + 18.0);
    }
    for (p, policy) in policies.iter().enumerate() {
        let colour = SWEEP_COLOURS[p % SWEEP_COLOURS.len()];
        let points: Vec<String> = cvs
            .iter()
            .enumerate()
            .filter_map(|(i, cv)| {
                rows.iter().find(|r| r.cv == *cv && r.policy == *policy).map(|r| format!("{:.1},{:.1}", x(i), y(value(r))))
            })
            .collect();
        let _ = writeln!(svg, "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>", points.join(" "));
        let ly = top + 10.0 + 20.0 * p as f64;
        let lx = left + plot_w + 15.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{policy}</text>",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn write_rows_csv(path: &Path, rows: &[QuartRow]) -> Result<()> {
    let mut text = String::from("cv,policy,mean_ms,p75_ms,p99_ms");
    for k in SLO_MULTIPLES {
        let _ = write!(text, ",slo_{k}x");
    }
    text.push_str(",goodput_per_s,replica_s,arrivals,incomplete,warm_starts,cold_starts\n");
    for r in rows {
        let _ = write!(text, "{},{},{:.3},{:.3},{:.3}", r.cv, r.policy, r.mean_ms, r.p75_ms, r.p99_ms);
        for s in &r.slo {
            let _ = write!(text, ",{s:.5}");
        }
        let _ = writeln!(text, ",{:.3},{:.1},{},{},{},{}", r.goodput, r.replica_s, r.arrivals, r.incomplete, r.starts.0, r.starts.1);
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The reproduction (`yardmaster sim reproduce quart`).
pub fn reproduce(opts: &ReproduceOptions) -> Result<String> {
    let (cvs, duration_s): (&[f64], f64) = if opts.quick { (&[1.0, 8.0], 60.0) } else { (&[0.1, 1.0, 2.0, 4.0, 8.0], 600.0) };
    let rate = 2.0 / STAGE_S;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut rows = Vec::new();
    let mut files = Vec::new();
    for &cv in cvs {
        eprintln!("  CV {cv}: simulating quart, quart-cold, quart-fixed, quart-uniform, quart-reactive …");
        let started = std::time::Instant::now();
        let outcomes = run_level(cv, rate, duration_s, opts.seed)?;
        eprintln!("  CV {cv}: done in {:.1} s", started.elapsed().as_secs_f64());
        rows.extend(outcomes.iter().map(|o| row(cv, o, duration_s)));
        let reports: Vec<RunReport> = outcomes.into_iter().map(|o| o.report).collect();
        let dir = opts.out.join(format!("cv-{cv}"));
        std::fs::create_dir_all(&dir)?;
        files.extend(write_csv(&dir, &reports)?);
        files.push(write_json(&dir, &reports)?);
        match write_plots(&dir, &reports) {
            Ok(plots) => files.extend(plots.files),
            Err(e) => eprintln!("  plots for CV {cv} skipped: {e}"),
        }
    }
    eprintln!("  per-stage CV at a fixed 3 replicas per stage …");
    let mut stage_table = String::from("input CV  per-stage arrival CV (stage 1 .. 8)\n");
    let mut stage_csv = String::from("input_cv,stage,arrival_cv\n");
    for &cv in cvs {
        let per_stage = stage_cvs(cv, duration_s.min(120.0), opts.seed, &opts.out)?;
        let cells: Vec<String> = per_stage.iter().map(|c| format!("{c:>6.3}")).collect();
        let _ = writeln!(stage_table, "{cv:>8}  {}", cells.join(" "));
        for (i, c) in per_stage.iter().enumerate() {
            let _ = writeln!(stage_csv, "{cv},{},{c:.4}", i + 1);
        }
    }
    let stage_path = opts.out.join("quart-stage-cv.csv");
    std::fs::write(&stage_path, stage_csv).with_context(|| format!("writing {}", stage_path.display()))?;
    files.push(stage_path);
    let charts: [SweepChart; 3] = [
        ("quart-mean-latency.svg", "Mean end-to-end latency vs input CV", "mean latency (ms)", |r| r.mean_ms),
        ("quart-p99-latency.svg", "P99 end-to-end latency vs input CV", "P99 latency (ms)", |r| r.p99_ms),
        ("quart-goodput.svg", "Goodput (responses within 1.5 x Exec) vs input CV", "goodput (req/s)", |r| r.goodput),
    ];
    for (name, title, y_label, value) in charts {
        let path = opts.out.join(name);
        std::fs::write(&path, sweep_svg(&rows, title, y_label, value)).with_context(|| format!("writing {}", path.display()))?;
        files.push(path);
    }
    let csv = opts.out.join("quart-cv-sweep.csv");
    write_rows_csv(&csv, &rows)?;
    files.push(csv);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "QUART reproduction: quart-bert8 (8 stages x 20.6 ms, 12 servers x 4 GPUs, a parameter cache per server), gamma arrivals at {rate:.1} req/s, {duration_s} s per run, seed {}",
        opts.seed
    );
    let _ =
        writeln!(out, "SLO satisfaction: share of arrivals completed within k x Exec (137 ms); goodput: within 1.5 x Exec, per second\n");
    out.push_str(&render_rows(&rows));
    out.push('\n');
    out.push_str(&render_headline(&rows));
    out.push('\n');
    out.push_str(&stage_table);
    let _ = writeln!(out, "\npaper (Fig. 7, CV sweep vs INFless / InferLine / Cocktail): mean latency -69.8% / -77.2% / -47.8%, goodput 13.5x / 14.4x / 2.3x (17.9x / 32.4x / 3.9x at CV 8); MAF: -87.1% latency, 2.37x SLO satisfaction");
    let _ = writeln!(out, "\nfiles:");
    for f in files {
        let _ = writeln!(out, "  {}", f.display());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
