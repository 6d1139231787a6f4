//! `yardmaster sim sweep`: every policy on every pipeline, at load multiples of each
//! pipeline's capacity, under several workload shapes and seeds — the map of where a
//! policy holds and where it breaks off.
//!
//! A pipeline's capacity is the engine's capacity bound
//! ([`yardmaster_engine::bound::capacity_bound`]: every stage scaled within its bounds
//! and the cluster's `max_workers`, the fastest variant at its best batch), so a load
//! multiple means the same thing on every pipeline. Each cell is one simulated run
//! ([`crate::run::run`]); cells run in parallel on the cores ([`crate::per_core`]).
//!
//! What a cell reports: goodput against the true optimal bound (the run's own
//! `goodput_of_optimal`: goodput over `min(offered, capacity)` window by window),
//! drop, invalid and on-time rates, SLO attainment per stream, accuracy, whether the
//! policy fell back (a fault, a fallback to FIFO, or a plan it reported infeasible —
//! [`yardmaster_policy::PLAN_INFEASIBLE_METRIC`] — so that it served its own
//! infeasible-plan fallback), and its cost (ns per event, the
//! longest call). Aggregated over seeds, the sweep flags two things the issue of
//! "policies off their papers' setups" asks never to see:
//!
//! - a **cliff**: goodput at a load below [`CLIFF_FRACTION`] of the best goodput the
//!   policy reached at any lower load of the same pipeline and shape;
//! - a **low-load miss**: under Poisson load at most half the capacity, fewer than
//!   [`LOW_LOAD_ON_TIME`] of the requests on time.
//!
//! It writes a table, `sweep.csv` (one line per cell and seed), `sweep.json` (cells,
//! rows, flags) and a heatmap per policy (`heatmap-POLICY.svg`, and `.png` when a
//! system font is found): rows are pipeline × shape, columns load multiples, colour and
//! number goodput ÷ bound, and a cliff's cell framed in black.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::documented_breaks::{documented_break, BreakKind};
use crate::report::{plot_font, PlotFont};
use crate::run::{PolicySpec, SimSpec};
use yardmaster_engine::{bound, Pipeline};
use yardmaster_formats::WorkloadSpec;
use yardmaster_policy::PolicyLoader;

/// Goodput under this fraction of the best at a lower load is a cliff.
pub const CLIFF_FRACTION: f64 = 0.9;

/// Under Poisson load at most [`LOW_LOAD_MAX`] × capacity, at least this fraction of
/// the requests should be on time.
pub const LOW_LOAD_ON_TIME: f64 = 0.99;

/// The highest load multiple that counts as low load.
pub const LOW_LOAD_MAX: f64 = 0.5;

/// The full sweep's load multiples of capacity.
pub const DEFAULT_LOADS: [f64; 10] = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0];

/// The quick sweep's load multiples.
pub const QUICK_LOADS: [f64; 4] = [0.5, 1.0, 2.0, 5.0];

/// A workload shape: the name shown, and the workload preset it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Name in reports (`poisson`, `bursty`, `diurnal`, `replay`, or a preset's name).
    pub name: String,
    /// The workload preset (`poisson`, `twitter`, `wikipedia`, `azure-functions-per-second`…).
    pub workload: String,
}

impl Shape {
    /// A shape by name: `poisson`; `bursty` (Twitter's MMPP, bursts about twice the
    /// quiet rate); `diurnal` (Wikipedia's gamma renewal with a daily swing); `replay`
    /// (Azure Functions' per-second rates replayed); or any workload preset's name.
    pub fn parse(name: &str) -> Result<Shape> {
        let workload = match name {
            "bursty" => "twitter",
            "diurnal" => "wikipedia",
            "replay" => "azure-functions-per-second",
            other => other,
        };
        // Opening it at a nominal rate checks the name.
        let spec = WorkloadSpec::parse(workload, 1.0, 1.0).map_err(|e| anyhow!("shape {name:?}: {e}"))?;
        if let WorkloadSpec::Preset { .. } = spec {
            drop(spec.arrivals(1_000_000_000, 1).map_err(|e| anyhow!("shape {name:?}: {e}"))?);
        } else {
            return Err(anyhow!("shape {name:?}: a shape is a workload preset (poisson, bursty, diurnal, replay, or a preset's name)"));
        }
        Ok(Shape { name: name.to_string(), workload: workload.to_string() })
    }
}

/// A pipeline to sweep, by the name shown.
#[derive(Debug, Clone)]
pub struct SweptPipeline {
    /// Name in reports.
    pub name: String,
    /// The pipeline.
    pub pipeline: Pipeline,
}

/// What to sweep.
#[derive(Clone)]
pub struct SweepPlan {
    /// Policies.
    pub policies: Vec<PolicySpec>,
    /// Pipelines.
    pub pipelines: Vec<SweptPipeline>,
    /// Load multiples of each pipeline's capacity.
    pub loads: Vec<f64>,
    /// Workload shapes.
    pub shapes: Vec<Shape>,
    /// Seeds: each cell runs once per seed.
    pub seeds: Vec<u64>,
    /// Simulated seconds of arrivals per run.
    pub duration_s: f64,
    /// The rest of every run's settings (pipeline, seed and duration are set per cell).
    pub base: SimSpec,
}

/// One cell and seed: where it ran and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// Policy.
    pub policy: String,
    /// Pipeline.
    pub pipeline: String,
    /// Shape.
    pub shape: String,
    /// Load multiple of capacity.
    pub load: f64,
    /// Seed.
    pub seed: u64,
    /// The pipeline's capacity bound, requests per second.
    pub capacity: f64,
    /// Requests per second offered (arrivals over the run).
    pub offered: f64,
    /// On-time requests per second.
    pub goodput: f64,
    /// Goodput ÷ the true optimal bound.
    pub goodput_of_bound: f64,
    /// Dropped or late, of ended.
    pub drop_rate: f64,
    /// Invalid accelerator time, of all.
    pub invalid_rate: f64,
    /// On time, of arrivals.
    pub on_time: f64,
    /// SLO attainment per stream, by stream name.
    pub attainment: BTreeMap<String, f64>,
    /// Mean accuracy of completed requests (1 without variants).
    pub accuracy: f64,
    /// Whether the policy fell back: a fault, a switch to the built-in fallback, or a
    /// plan it reported infeasible.
    pub fell_back: bool,
    /// Policy faults.
    pub faults: u64,
    /// Plans the policy reported infeasible (served by its own fallback plan).
    pub infeasible_plans: u64,
    /// Why the policy refused to start on this pipeline, when it did: the pipeline is
    /// not one it supports, and the built-in fallback served the run.
    pub refused: Option<String>,
    /// Policy time per event, ns.
    pub ns_per_event: f64,
    /// Policy fuel per event: the same cost counted in WebAssembly instructions, so it
    /// does not move with the machine's load.
    pub fuel_per_event: f64,
    /// The longest policy call, µs.
    pub longest_call_us: f64,
    /// Wall time of the run, s.
    pub wall_s: f64,
}

/// One cell averaged over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// Policy.
    pub policy: String,
    /// Pipeline.
    pub pipeline: String,
    /// Shape.
    pub shape: String,
    /// Load multiple of capacity.
    pub load: f64,
    /// Seeds averaged.
    pub seeds: usize,
    /// Mean offered rate.
    pub offered: f64,
    /// Mean goodput.
    pub goodput: f64,
    /// Mean goodput ÷ bound.
    pub goodput_of_bound: f64,
    /// Mean drop rate.
    pub drop_rate: f64,
    /// Mean invalid rate.
    pub invalid_rate: f64,
    /// Mean on-time fraction.
    pub on_time: f64,
    /// The lowest SLO attainment of any stream (mean over seeds).
    pub worst_attainment: f64,
    /// Mean accuracy.
    pub accuracy: f64,
    /// Whether any seed fell back.
    pub fell_back: bool,
    /// Mean policy time per event, ns.
    pub ns_per_event: f64,
    /// Mean policy fuel per event.
    pub fuel_per_event: f64,
    /// The longest call of any seed, µs.
    pub longest_call_us: f64,
    /// Goodput ÷ the best goodput at a lower load of the same pipeline and shape
    /// (`None` at the lowest load).
    pub of_best_lower: Option<f64>,
    /// A cliff: `of_best_lower` under [`CLIFF_FRACTION`].
    pub cliff: bool,
    /// A low-load miss (Poisson, load ≤ [`LOW_LOAD_MAX`], on time under [`LOW_LOAD_ON_TIME`]).
    pub low_load_miss: bool,
    /// Why the policy refused the pipeline, when it did in some seed: the cell is not
    /// the policy's (it neither counts as a cliff nor as a miss).
    pub refused: Option<String>,
    /// When the row is a cliff or a low-load miss that the policy's doc gives as where
    /// it breaks ([`crate::documented_breaks`]): why, and where to read it.
    #[serde(default)]
    pub documented: Option<String>,
}

impl SweepRow {
    /// A cliff or a low-load miss that no doc explains: what `--strict` fails on.
    pub fn undocumented_flag(&self) -> bool {
        (self.cliff || self.low_load_miss) && self.documented.is_none()
    }
}

/// The whole sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepOutcome {
    /// Every cell and seed.
    pub cells: Vec<CellResult>,
    /// The cells averaged over seeds, with the flags.
    pub rows: Vec<SweepRow>,
    /// Per policy, pipeline and shape: time per event at the highest load ÷ at 1×
    /// capacity (present when both loads were swept).
    pub cost_growth: Vec<CostGrowth>,
}

/// How a policy's decision cost grows from 1× capacity to the highest load swept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostGrowth {
    /// Policy.
    pub policy: String,
    /// Pipeline.
    pub pipeline: String,
    /// Shape.
    pub shape: String,
    /// The highest load swept.
    pub load: f64,
    /// ns per event there ÷ ns per event at 1×.
    pub ratio: f64,
    /// Fuel per event there ÷ fuel per event at 1× (the machine-independent ratio).
    pub fuel_ratio: f64,
}

/// One cell to run.
struct Cell<'a> {
    policy: &'a PolicySpec,
    pipeline: &'a SweptPipeline,
    capacity: f64,
    shape: &'a Shape,
    load: f64,
    seed: u64,
}

/// The capacity bound of `pipeline`, requests per second; an error when it has none
/// (no stage a stream reaches) or when it is an LLM pipeline.
///
/// An iteration (LLM) stage serves a request over as many decode steps as it has
/// output tokens, so the request-rate bound (one step a piece) holds but is loose by
/// the output length, and load multiples of it mean nothing. CALM's sweep over load
/// (0.5× to 10× of a token-based capacity, no cliff, on time at half capacity) is in
/// its reproduction's tests (`reproduce::calm`, docs/calm.md).
pub fn capacity(pipeline: &Pipeline) -> Result<f64> {
    if let Some(stage) = pipeline.stages.iter().find(|s| s.kind == yardmaster_policy::contract::StageKind::Iteration) {
        return Err(anyhow!(
            "pipeline {:?} has an LLM (iteration) stage, {:?}: the sweep's capacity is in requests per second at one step a piece, \
             which an LLM's decode steps do not fit; CALM's load sweep is in `cargo test -p yardmaster-sim reproduce::calm` \
             (see docs/calm.md), its goodput by class in `yardmaster sim compare`",
            pipeline.name,
            stage.name
        ));
    }
    let capacity = bound::capacity_bound(pipeline, pipeline.max_workers);
    if capacity.is_finite() && capacity > 0.0 {
        Ok(capacity)
    } else {
        Err(anyhow!("pipeline {:?} has no capacity bound (no stage a stream reaches)", pipeline.name))
    }
}

/// Run every cell of `plan`, in parallel on the cores; `progress` gets one line per
/// finished run (`[k/N] …`).
pub fn run_sweep(plan: &SweepPlan, loader: &PolicyLoader, progress: impl Fn(&str) + Sync) -> Result<SweepOutcome> {
    let mut cells = Vec::new();
    for pipeline in &plan.pipelines {
        let capacity = capacity(&pipeline.pipeline)?;
        for policy in &plan.policies {
            for shape in &plan.shapes {
                for &load in &plan.loads {
                    for &seed in &plan.seeds {
                        cells.push(Cell { policy, pipeline, capacity, shape, load, seed });
                    }
                }
            }
        }
    }
    let total = cells.len();
    let done = AtomicUsize::new(0);
    let results = crate::per_core(&cells, |cell| {
        let result = run_cell(plan, loader, cell)?;
        let k = done.fetch_add(1, Ordering::Relaxed) + 1;
        progress(&format!(
            "[{k}/{total}] {} on {} {} {}× seed {}: goodput {:.1}/s, {:.2} of bound, {:.1} % on time ({:.1} s)",
            result.policy,
            result.pipeline,
            result.shape,
            result.load,
            result.seed,
            result.goodput,
            result.goodput_of_bound,
            100.0 * result.on_time,
            result.wall_s
        ));
        Ok(result)
    })?;
    Ok(summarise(results))
}

fn run_cell(plan: &SweepPlan, loader: &PolicyLoader, cell: &Cell) -> Result<CellResult> {
    let rate = cell.load * cell.capacity;
    let duration = (plan.duration_s * 1e9) as u64;
    let workload = WorkloadSpec::parse(&cell.shape.workload, rate, 1.0)?;
    let spec = SimSpec { pipeline: cell.pipeline.pipeline.clone(), seed: cell.seed, duration, ..plan.base.clone() };
    let arrivals = workload.arrivals(duration, cell.seed)?;
    let outcome = crate::run::run(&spec, cell.policy, loader, arrivals, &mut |_| {})?;
    let summary = &outcome.report.summary;
    let overall = &summary.overall;
    let attainment = summary
        .streams
        .iter()
        .map(|(&id, stats)| {
            let name = spec.pipeline.streams.get(id as usize).map_or_else(|| format!("stream {id}"), |s| s.name.clone());
            (name, stats.slo_attainment)
        })
        .collect();
    let faults: u64 = outcome.arm.faults.values().sum();
    Ok(CellResult {
        policy: cell.policy.name.clone(),
        pipeline: cell.pipeline.name.clone(),
        shape: cell.shape.name.clone(),
        load: cell.load,
        seed: cell.seed,
        capacity: cell.capacity,
        offered: overall.arrivals as f64 / plan.duration_s,
        goodput: overall.goodput,
        goodput_of_bound: summary.goodput_of_optimal,
        drop_rate: overall.drop_rate,
        invalid_rate: overall.invalid_rate,
        on_time: if overall.arrivals == 0 { 1.0 } else { overall.outcomes.on_time as f64 / overall.arrivals as f64 },
        attainment,
        accuracy: overall.accuracy,
        fell_back: outcome.report.health.fell_back(),
        faults,
        infeasible_plans: outcome.report.health.infeasible_plans,
        refused: outcome.arm.init_refusal.clone(),
        ns_per_event: outcome.arm.call_time.as_nanos() as f64 / outcome.arm.events.max(1) as f64,
        fuel_per_event: outcome.arm.fuel as f64 / outcome.arm.events.max(1) as f64,
        longest_call_us: outcome.arm.max_call_time.as_secs_f64() * 1e6,
        wall_s: outcome.wall.as_secs_f64(),
    })
}

/// Average the cells over their seeds and flag cliffs, low-load misses and the cost's
/// growth.
pub fn summarise(cells: Vec<CellResult>) -> SweepOutcome {
    type Key = (String, String, String);
    let mut groups: BTreeMap<Key, BTreeMap<u64, Vec<&CellResult>>> = BTreeMap::new();
    let mut order: Vec<Key> = Vec::new();
    for cell in &cells {
        let key = (cell.policy.clone(), cell.pipeline.clone(), cell.shape.clone());
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().entry(cell.load.to_bits()).or_default().push(cell);
    }
    let mut rows = Vec::new();
    let mut cost_growth = Vec::new();
    for key in order {
        let mut by_load: Vec<(f64, &Vec<&CellResult>)> = groups[&key].iter().map(|(bits, runs)| (f64::from_bits(*bits), runs)).collect();
        by_load.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut best_lower: Option<f64> = None;
        let mut cost_at_one = None;
        for (load, runs) in &by_load {
            let mean = |f: &dyn Fn(&CellResult) -> f64| runs.iter().map(|r| f(r)).sum::<f64>() / runs.len() as f64;
            let goodput = mean(&|r| r.goodput);
            let on_time = mean(&|r| r.on_time);
            let of_best_lower = best_lower.filter(|b| *b > 0.0).map(|b| goodput / b);
            let ns_per_event = mean(&|r| r.ns_per_event);
            let fuel_per_event = mean(&|r| r.fuel_per_event);
            let refused = runs.iter().find_map(|r| r.refused.clone());
            if (*load - 1.0).abs() < 1e-9 && refused.is_none() {
                cost_at_one = Some((ns_per_event, fuel_per_event));
            }
            let cliff = refused.is_none() && of_best_lower.is_some_and(|f| f < CLIFF_FRACTION);
            let low_load_miss = refused.is_none() && key.2 == "poisson" && *load <= LOW_LOAD_MAX + 1e-9 && on_time < LOW_LOAD_ON_TIME;
            // Documented only when every flag the row raises is. A cliff below the
            // capacity is not a break past it: the policy's doc must give it as a
            // low-load break (the cause it shares with the misses there).
            let cliff_kind = if *load >= 1.0 - 1e-9 { BreakKind::PastCapacity } else { BreakKind::LowLoad };
            let flagged: Vec<BreakKind> = [(cliff, cliff_kind), (low_load_miss, BreakKind::LowLoad)]
                .into_iter()
                .filter_map(|(raised, kind)| raised.then_some(kind))
                .collect();
            let explained: Option<Vec<String>> = flagged.iter().map(|kind| documented_break(&key.0, *kind).map(|b| b.label())).collect();
            let documented = explained.filter(|labels| !labels.is_empty()).map(|mut labels| {
                labels.dedup();
                labels.join("; ")
            });
            rows.push(SweepRow {
                policy: key.0.clone(),
                pipeline: key.1.clone(),
                shape: key.2.clone(),
                load: *load,
                seeds: runs.len(),
                offered: mean(&|r| r.offered),
                goodput,
                goodput_of_bound: mean(&|r| r.goodput_of_bound),
                drop_rate: mean(&|r| r.drop_rate),
                invalid_rate: mean(&|r| r.invalid_rate),
                on_time,
                worst_attainment: mean(&|r| r.attainment.values().copied().fold(1.0, f64::min)),
                accuracy: mean(&|r| r.accuracy),
                fell_back: runs.iter().any(|r| r.fell_back),
                ns_per_event,
                fuel_per_event,
                longest_call_us: runs.iter().map(|r| r.longest_call_us).fold(0.0, f64::max),
                of_best_lower,
                cliff,
                low_load_miss,
                refused: refused.clone(),
                documented,
            });
            if refused.is_none() {
                best_lower = Some(best_lower.map_or(goodput, |b: f64| b.max(goodput)));
            }
        }
        // The row just pushed is this key's highest load, its costs already averaged.
        if let (Some((ns_at_one, fuel_at_one)), Some(top)) = (cost_at_one, rows.last()) {
            if top.load > 1.0 && ns_at_one > 0.0 && top.refused.is_none() {
                cost_growth.push(CostGrowth {
                    policy: key.0.clone(),
                    pipeline: key.1.clone(),
                    shape: key.2.clone(),
                    load: top.load,
                    ratio: top.ns_per_event / ns_at_one,
                    fuel_ratio: if fuel_at_one > 0.0 { top.fuel_per_event / fuel_at_one } else { 0.0 },
                });
            }
        }
    }
    SweepOutcome { cells, rows, cost_growth }
}

/// The rows as a text table, then the flags and the cost growth.
pub fn render_table(outcome: &SweepOutcome) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<14} {:<8} {:>5} {:>9} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>9} {:>4}",
        "policy",
        "pipeline",
        "shape",
        "load",
        "offered/s",
        "goodput/s",
        "÷bound",
        "drop%",
        "inval%",
        "ontime",
        "acc",
        "ns/event",
        "fuel/ev",
        "longest µs",
        "flag"
    );
    for r in &outcome.rows {
        let flag = match (r.cliff, r.low_load_miss, r.fell_back) {
            _ if r.refused.is_some() => "n/a",
            (true, _, _) if r.documented.is_some() => "cliff (doc)",
            (_, true, _) if r.documented.is_some() => "late (doc)",
            (true, _, _) => "CLIFF",
            (_, true, _) => "LATE",
            (_, _, true) => "fb",
            _ => "",
        };
        let _ = writeln!(
            out,
            "{:<16} {:<14} {:<8} {:>4}× {:>9.1} {:>9.1} {:>6.3} {:>6.1} {:>6.1} {:>6.3} {:>6.3} {:>8.0} {:>8.0} {:>9.0} {flag}",
            r.policy,
            r.pipeline,
            r.shape,
            r.load,
            r.offered,
            r.goodput,
            r.goodput_of_bound,
            100.0 * r.drop_rate,
            100.0 * r.invalid_rate,
            r.on_time,
            r.accuracy,
            r.ns_per_event,
            r.fuel_per_event,
            r.longest_call_us
        );
    }
    let mut refusals: Vec<(&str, &str, &str)> = Vec::new();
    for r in &outcome.rows {
        let refusal = r.refused.as_deref().map(|why| (r.policy.as_str(), r.pipeline.as_str(), why));
        if let Some(refusal) = refusal.filter(|x| !refusals.contains(x)) {
            refusals.push(refusal);
        }
    }
    if !refusals.is_empty() {
        let _ = writeln!(out, "\nnot supported (the policy refused the pipeline; the built-in fallback served, flagged n/a):");
        for (policy, pipeline, why) in refusals {
            let _ = writeln!(out, "  {policy} on {pipeline}: {why}");
        }
    }
    let cliffs: Vec<&SweepRow> = outcome.rows.iter().filter(|r| r.cliff && r.documented.is_none()).collect();
    let misses: Vec<&SweepRow> = outcome.rows.iter().filter(|r| r.low_load_miss && r.documented.is_none()).collect();
    let _ = writeln!(out, "\ncliffs (goodput under {CLIFF_FRACTION} of the best at a lower load): {}", cliffs.len());
    for r in cliffs {
        let _ = writeln!(
            out,
            "  {} on {} {} at {}×: {:.2} of the best below",
            r.policy,
            r.pipeline,
            r.shape,
            r.load,
            r.of_best_lower.unwrap_or(0.0)
        );
    }
    let _ = writeln!(out, "low-load misses (Poisson ≤ {LOW_LOAD_MAX}×, under {} on time): {}", LOW_LOAD_ON_TIME, misses.len());
    for r in misses {
        let _ = writeln!(out, "  {} on {} at {}×: {:.3} on time", r.policy, r.pipeline, r.load, r.on_time);
    }
    let mut documented: Vec<(&str, &str, usize)> = Vec::new();
    for r in outcome.rows.iter().filter(|r| r.documented.is_some()) {
        let why = r.documented.as_deref().unwrap_or_default();
        match documented.iter_mut().find(|(policy, label, _)| *policy == r.policy && *label == why) {
            Some(entry) => entry.2 += 1,
            None => documented.push((&r.policy, why, 1)),
        }
    }
    if !documented.is_empty() {
        let _ = writeln!(out, "flags where the policy's doc says it breaks (not counted above):");
        for (policy, why, rows) in documented {
            let _ = writeln!(out, "  {policy}, {rows} rows: {why}");
        }
    }
    let summaries = policy_summaries(outcome);
    if !summaries.is_empty() {
        let _ = writeln!(out, "per policy: apps served, cliffs rows (apps), low-load misses rows (apps), documented rows, fell back rows:");
        for s in &summaries {
            let _ = writeln!(
                out,
                "  {:<16} {:>3}  cliffs {:>3} ({:>2})  misses {:>3} ({:>2})  documented {:>3}  fell back {:>3}",
                s.policy,
                s.pipelines_served,
                s.cliff_rows,
                s.cliff_pipelines,
                s.miss_rows,
                s.miss_pipelines,
                s.documented_rows,
                s.fell_back_rows
            );
        }
    }
    let spread = load_spread(outcome);
    if !spread.is_empty() {
        let _ = writeln!(out, "goodput ÷ bound per policy and load over the pipelines and shapes it serves: mean, worst (where):");
        for s in &spread {
            let _ = writeln!(
                out,
                "  {:<16} {:>5}×  mean {:.3}  worst {:.3} ({} {})  over {}",
                s.policy, s.load, s.mean, s.worst, s.worst_pipeline, s.worst_shape, s.rows
            );
        }
    }
    if !outcome.cost_growth.is_empty() {
        let _ = writeln!(out, "decision cost per event at the highest load ÷ at 1×, in ns (in fuel):");
        for g in &outcome.cost_growth {
            let _ = writeln!(out, "  {} on {} {} ({}×): {:.2} ({:.2})", g.policy, g.pipeline, g.shape, g.load, g.ratio, g.fuel_ratio);
        }
    }
    out
}

/// One policy's flags over the whole sweep: what the docs' tables of cliffs and misses
/// per policy are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySummary {
    /// Policy.
    pub policy: String,
    /// Pipelines it served (did not refuse) in some row.
    pub pipelines_served: usize,
    /// Rows with an undocumented cliff.
    pub cliff_rows: usize,
    /// Pipelines with an undocumented cliff.
    pub cliff_pipelines: usize,
    /// Rows with an undocumented low-load miss.
    pub miss_rows: usize,
    /// Pipelines with an undocumented low-load miss.
    pub miss_pipelines: usize,
    /// Rows whose flags the policy's doc gives as where it breaks.
    pub documented_rows: usize,
    /// Rows where some seed fell back.
    pub fell_back_rows: usize,
}

/// Per policy, in the order the rows list them: its flags over the sweep.
pub fn policy_summaries(outcome: &SweepOutcome) -> Vec<PolicySummary> {
    let mut summaries: Vec<PolicySummary> = Vec::new();
    let mut pipelines: Vec<[std::collections::BTreeSet<&str>; 3]> = Vec::new();
    for r in &outcome.rows {
        let index = match summaries.iter().position(|s| s.policy == r.policy) {
            Some(index) => index,
            None => {
                summaries.push(PolicySummary {
                    policy: r.policy.clone(),
                    pipelines_served: 0,
                    cliff_rows: 0,
                    cliff_pipelines: 0,
                    miss_rows: 0,
                    miss_pipelines: 0,
                    documented_rows: 0,
                    fell_back_rows: 0,
                });
                pipelines.push(Default::default());
                summaries.len() - 1
            }
        };
        let (summary, [served, cliffs, misses]) = (&mut summaries[index], &mut pipelines[index]);
        if r.refused.is_some() {
            continue;
        }
        served.insert(&r.pipeline);
        let undocumented = r.documented.is_none();
        if r.cliff && undocumented {
            summary.cliff_rows += 1;
            cliffs.insert(&r.pipeline);
        }
        if r.low_load_miss && undocumented {
            summary.miss_rows += 1;
            misses.insert(&r.pipeline);
        }
        summary.documented_rows += usize::from(!undocumented);
        summary.fell_back_rows += usize::from(r.fell_back);
    }
    for (summary, [served, cliffs, misses]) in summaries.iter_mut().zip(&pipelines) {
        summary.pipelines_served = served.len();
        summary.cliff_pipelines = cliffs.len();
        summary.miss_pipelines = misses.len();
    }
    summaries
}

/// One policy at one load, over every pipeline and shape it did not refuse.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSpread {
    /// Policy.
    pub policy: String,
    /// Load multiple of capacity.
    pub load: f64,
    /// Rows (pipeline × shape) averaged.
    pub rows: usize,
    /// Mean goodput ÷ bound.
    pub mean: f64,
    /// The lowest goodput ÷ bound.
    pub worst: f64,
    /// Where the lowest was.
    pub worst_pipeline: String,
    /// Its shape.
    pub worst_shape: String,
}

/// Goodput ÷ bound per policy and load: the mean and the worst over the pipelines and
/// shapes (refused ones left out), in the rows' order of policies and loads.
pub fn load_spread(outcome: &SweepOutcome) -> Vec<LoadSpread> {
    let mut spread: Vec<LoadSpread> = Vec::new();
    for r in outcome.rows.iter().filter(|r| r.refused.is_none()) {
        let at = spread.iter().position(|s| s.policy == r.policy && (s.load - r.load).abs() < 1e-9);
        match at {
            Some(i) => {
                let s = &mut spread[i];
                s.mean += r.goodput_of_bound;
                s.rows += 1;
                if r.goodput_of_bound < s.worst {
                    (s.worst, s.worst_pipeline, s.worst_shape) = (r.goodput_of_bound, r.pipeline.clone(), r.shape.clone());
                }
            }
            None => spread.push(LoadSpread {
                policy: r.policy.clone(),
                load: r.load,
                rows: 1,
                mean: r.goodput_of_bound,
                worst: r.goodput_of_bound,
                worst_pipeline: r.pipeline.clone(),
                worst_shape: r.shape.clone(),
            }),
        }
    }
    for s in &mut spread {
        s.mean /= s.rows as f64;
    }
    let mut order: Vec<&str> = Vec::new();
    for r in &outcome.rows {
        if !order.contains(&r.policy.as_str()) {
            order.push(&r.policy);
        }
    }
    let rank = |policy: &str| order.iter().position(|p| *p == policy);
    spread.sort_by(|a, b| rank(&a.policy).cmp(&rank(&b.policy)).then(a.load.total_cmp(&b.load)));
    spread
}

/// Write `sweep.csv` (one line per cell and seed) and `sweep.json` (cells, rows,
/// flags) into `dir`; returns their paths.
pub fn write_files(dir: &Path, outcome: &SweepOutcome) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut csv = String::from(
        "policy,pipeline,shape,load,seed,capacity,offered,goodput,goodput_of_bound,drop_rate,invalid_rate,on_time,accuracy,fell_back,faults,infeasible_plans,ns_per_event,fuel_per_event,longest_call_us,attainment,refused\n",
    );
    for c in &outcome.cells {
        let attainment: Vec<String> = c.attainment.iter().map(|(s, a)| format!("{s}={a:.4}")).collect();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{:.0},{:.0},{:.1},{},{}",
            c.policy,
            c.pipeline,
            c.shape,
            c.load,
            c.seed,
            c.capacity,
            c.offered,
            c.goodput,
            c.goodput_of_bound,
            c.drop_rate,
            c.invalid_rate,
            c.on_time,
            c.accuracy,
            c.fell_back,
            c.faults,
            c.infeasible_plans,
            c.ns_per_event,
            c.fuel_per_event,
            c.longest_call_us,
            attainment.join(";"),
            c.refused.as_deref().map(|why| format!("\"{}\"", why.replace('"', "\"\""))).unwrap_or_default()
        );
    }
    let csv_path = dir.join("sweep.csv");
    std::fs::write(&csv_path, csv)?;
    let json_path = dir.join("sweep.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(outcome)?)?;
    Ok(vec![csv_path, json_path])
}

/// Size of a heatmap cell, pixels.
const CELL: (i32, i32) = (84, 40);
/// Room for the row labels and the title.
const MARGIN: (i32, i32) = (260, 70);

/// One heatmap per policy: `heatmap-POLICY.svg`, and `.png` when a system font is
/// found. Returns the files written.
pub fn write_heatmaps(dir: &Path, outcome: &SweepOutcome) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let font = plot_font().map_err(|e| anyhow!(e))?;
    let mut policies: Vec<&str> = Vec::new();
    for r in &outcome.rows {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let mut files = Vec::new();
    for policy in policies {
        let rows: Vec<&SweepRow> = outcome.rows.iter().filter(|r| r.policy == policy).collect();
        let grid = Grid::of(&rows);
        let size = ((MARGIN.0 + CELL.0 * grid.loads.len() as i32 + 20) as u32, (MARGIN.1 + CELL.1 * grid.lines.len() as i32 + 50) as u32);
        let stem = format!("heatmap-{}", policy.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_"));
        let svg = dir.join(format!("{stem}.svg"));
        draw_heatmap(&SVGBackend::new(&svg, size).into_drawing_area(), policy, &grid).map_err(|e| anyhow!("{}: {e}", svg.display()))?;
        files.push(svg);
        if matches!(font, PlotFont::System(_)) {
            let png = dir.join(format!("{stem}.png"));
            draw_heatmap(&BitMapBackend::new(&png, size).into_drawing_area(), policy, &grid)
                .map_err(|e| anyhow!("{}: {e}", png.display()))?;
            files.push(png);
        }
    }
    Ok(files)
}

/// A policy's rows laid out: lines (pipeline · shape) × load columns.
struct Grid<'a> {
    loads: Vec<f64>,
    lines: Vec<(String, String)>,
    cells: BTreeMap<(usize, usize), &'a SweepRow>,
}

impl<'a> Grid<'a> {
    fn of(rows: &[&'a SweepRow]) -> Self {
        let mut loads: Vec<f64> = Vec::new();
        let mut lines: Vec<(String, String)> = Vec::new();
        for r in rows {
            if !loads.iter().any(|l| (l - r.load).abs() < 1e-9) {
                loads.push(r.load);
            }
            let line = (r.pipeline.clone(), r.shape.clone());
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        loads.sort_by(f64::total_cmp);
        let mut cells = BTreeMap::new();
        for r in rows {
            let column = loads.iter().position(|l| (l - r.load).abs() < 1e-9).expect("listed");
            let line = lines.iter().position(|(p, s)| *p == r.pipeline && *s == r.shape).expect("listed");
            cells.insert((line, column), *r);
        }
        Grid { loads, lines, cells }
    }
}

/// The characters of a pipeline's name that fit a heatmap's row label beside its shape.
const LABEL_CHARS: usize = 22;

/// A pipeline's name as a heatmap row shows it: a file's stem rather than its path
/// (`../data/app.json` → `app`), cut to [`LABEL_CHARS`] with an ellipsis.
fn row_label(pipeline: &str) -> String {
    let path = Path::new(pipeline);
    let is_file = pipeline.contains(std::path::MAIN_SEPARATOR) || path.extension().is_some_and(|e| e == "json" || e == "toml");
    let name = if is_file { path.file_stem().map_or(pipeline.into(), |s| s.to_string_lossy().into_owned()) } else { pipeline.to_owned() };
    if name.chars().count() <= LABEL_CHARS {
        return name;
    }
    let kept: String = name.chars().take(LABEL_CHARS - 1).collect();
    format!("{kept}…")
}

/// The colour of a goodput ÷ bound: red at 0.5 and under, through yellow at 0.75, to
/// green at 1.
fn heat(value: f64) -> RGBColor {
    let t = ((value - 0.5) / 0.5).clamp(0.0, 1.0);
    let (r, g) = if t < 0.5 { (230.0, 70.0 + 2.0 * t * 150.0) } else { (230.0 - 2.0 * (t - 0.5) * 170.0, 220.0) };
    RGBColor(r as u8, g as u8, 80)
}

fn draw_heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, policy: &str, grid: &Grid) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let text = |size: i32| ("sans-serif", size).into_font().color(&BLACK);
    root.draw(&Text::new(
        format!("{policy}: goodput ÷ optimal bound by load (× capacity); framed: a cliff (grey: where its doc says); n/a: refused"),
        (10, 10),
        text(18),
    ))
    .map_err(err)?;
    for (column, load) in grid.loads.iter().enumerate() {
        let x = MARGIN.0 + CELL.0 * column as i32;
        root.draw(&Text::new(format!("{load}×"), (x + CELL.0 / 3, MARGIN.1 - 24), text(15))).map_err(err)?;
    }
    for (line, (pipeline, shape)) in grid.lines.iter().enumerate() {
        let y = MARGIN.1 + CELL.1 * line as i32;
        root.draw(&Text::new(format!("{} · {shape}", row_label(pipeline)), (10, y + CELL.1 / 3), text(15))).map_err(err)?;
        for column in 0..grid.loads.len() {
            let x = MARGIN.0 + CELL.0 * column as i32;
            let corners = [(x, y), (x + CELL.0 - 2, y + CELL.1 - 2)];
            match grid.cells.get(&(line, column)) {
                Some(row) if row.refused.is_some() => {
                    root.draw(&Rectangle::new(corners, RGBColor(235, 235, 235).filled())).map_err(err)?;
                    root.draw(&Text::new("n/a", (x + 24, y + CELL.1 / 3), text(15))).map_err(err)?;
                }
                Some(row) => {
                    root.draw(&Rectangle::new(corners, heat(row.goodput_of_bound).filled())).map_err(err)?;
                    if row.cliff {
                        let frame = if row.documented.is_some() { RGBColor(150, 150, 150) } else { BLACK };
                        root.draw(&Rectangle::new(corners, frame.stroke_width(3))).map_err(err)?;
                    }
                    let label =
                        if row.fell_back { format!("{:.2} fb", row.goodput_of_bound) } else { format!("{:.2}", row.goodput_of_bound) };
                    root.draw(&Text::new(label, (x + 14, y + CELL.1 / 3), text(15))).map_err(err)?;
                }
                None => root.draw(&Rectangle::new(corners, RGBColor(235, 235, 235).filled())).map_err(err)?,
            }
        }
    }
    let legend_y = MARGIN.1 + CELL.1 * grid.lines.len() as i32 + 12;
    for (i, value) in [0.5, 0.6, 0.7, 0.8, 0.9, 1.0].into_iter().enumerate() {
        let x = MARGIN.0 + 50 * i as i32;
        root.draw(&Rectangle::new([(x, legend_y), (x + 48, legend_y + 18)], heat(value).filled())).map_err(err)?;
        root.draw(&Text::new(format!("{value:.1}"), (x + 12, legend_y + 2), text(13))).map_err(err)?;
    }
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(policy: &str, shape: &str, load: f64, seed: u64, goodput: f64, on_time: f64, ns: f64) -> CellResult {
        CellResult {
            policy: policy.into(),
            pipeline: "p".into(),
            shape: shape.into(),
            load,
            seed,
            capacity: 100.0,
            offered: load * 100.0,
            goodput,
            goodput_of_bound: goodput / (load * 100.0).min(100.0),
            drop_rate: 0.0,
            invalid_rate: 0.0,
            on_time,
            attainment: BTreeMap::from([("s".to_string(), on_time)]),
            accuracy: 1.0,
            fell_back: false,
            faults: 0,
            infeasible_plans: 0,
            refused: None,
            ns_per_event: ns,
            fuel_per_event: ns * 10.0,
            longest_call_us: 1.0,
            wall_s: 0.1,
        }
    }

    #[test]
    fn a_drop_past_the_peak_is_a_cliff_and_a_plateau_is_not() {
        let cells = vec![
            // Holds its peak past capacity (seeds averaged: 95 and 97 at 2×).
            cell("steady", "poisson", 0.5, 1, 50.0, 1.0, 100.0),
            cell("steady", "poisson", 1.0, 1, 98.0, 0.98, 100.0),
            cell("steady", "poisson", 2.0, 1, 95.0, 0.47, 120.0),
            cell("steady", "poisson", 2.0, 2, 97.0, 0.48, 120.0),
            // Collapses at 5× (40 of a best of 90), and misses its low load.
            cell("cliff", "poisson", 0.5, 1, 45.0, 0.9, 100.0),
            cell("cliff", "poisson", 1.0, 1, 90.0, 0.9, 100.0),
            cell("cliff", "poisson", 5.0, 1, 40.0, 0.08, 500.0),
        ];
        let outcome = summarise(cells);
        let row = |policy: &str, load: f64| outcome.rows.iter().find(|r| r.policy == policy && r.load == load).unwrap();
        assert_eq!(row("steady", 2.0).seeds, 2);
        assert!((row("steady", 2.0).goodput - 96.0).abs() < 1e-9);
        assert!(!row("steady", 2.0).cliff, "96 of a best of 98 holds");
        assert_eq!(row("steady", 0.5).of_best_lower, None, "nothing below the lowest load");
        assert!(row("cliff", 5.0).cliff);
        assert!((row("cliff", 5.0).of_best_lower.unwrap() - 40.0 / 90.0).abs() < 1e-9);
        assert!(row("cliff", 0.5).low_load_miss && !row("steady", 0.5).low_load_miss);
        let growth: Vec<(&str, f64)> = outcome.cost_growth.iter().map(|g| (g.policy.as_str(), g.ratio)).collect();
        assert_eq!(growth, [("steady", 1.2), ("cliff", 5.0)]);
        let fuel_growth: Vec<f64> = outcome.cost_growth.iter().map(|g| g.fuel_ratio).collect();
        assert_eq!(fuel_growth, [1.2, 5.0]);
        let table = render_table(&outcome);
        assert!(table.contains("cliffs (goodput under 0.9 of the best at a lower load): 1"), "{table}");
        assert!(table.contains("cliff on p poisson at 5×"), "{table}");
        // The spread over pipelines: one pipeline here, so mean and worst agree.
        let spread = load_spread(&outcome);
        let at = |policy: &str, load: f64| spread.iter().find(|s| s.policy == policy && s.load == load).unwrap();
        assert_eq!(at("steady", 2.0).rows, 1);
        assert!((at("cliff", 5.0).worst - 40.0 / 100.0).abs() < 1e-9 && at("cliff", 5.0).worst == at("cliff", 5.0).mean);
        assert_eq!(spread.iter().map(|s| s.policy.as_str()).collect::<Vec<_>>(), ["steady", "steady", "steady", "cliff", "cliff", "cliff"]);
    }

    #[test]
    fn a_cliff_the_policy_s_doc_gives_is_labelled_and_not_counted_and_a_miss_it_does_not_give_is() {
        // FIFO's doc gives its cliff past capacity (it never drops); nobody's doc gives
        // `mine`'s, though its cells are FIFO's.
        let cells = vec![
            cell("mine", "poisson", 0.5, 1, 45.0, 0.9, 100.0),
            cell("fifo", "poisson", 1.0, 1, 90.0, 0.99, 100.0),
            cell("fifo", "poisson", 5.0, 1, 2.0, 0.01, 100.0),
            cell("policy_fifo", "poisson", 1.0, 1, 90.0, 0.99, 100.0),
            cell("policy_fifo", "poisson", 5.0, 1, 2.0, 0.01, 100.0),
        ];
        let outcome = summarise(cells);
        let row = |policy: &str, load: f64| outcome.rows.iter().find(|r| r.policy == policy && r.load == load).unwrap();
        assert!(row("fifo", 5.0).cliff && row("fifo", 5.0).documented.as_deref().is_some_and(|why| why.contains("never drops")));
        assert!(!row("fifo", 5.0).undocumented_flag());
        assert!(!row("policy_fifo", 5.0).undocumented_flag(), "a built file's stem names the same policy");
        assert!(row("mine", 0.5).low_load_miss && row("mine", 0.5).undocumented_flag(), "no doc gives it");
        // A cliff below the capacity is documented only by a low-load break.
        let below = summarise(vec![
            cell("quart-fixed", "poisson", 0.25, 1, 25.0, 1.0, 100.0),
            cell("quart-fixed", "poisson", 0.5, 1, 5.0, 1.0, 100.0),
            cell("quart-uniform", "poisson", 0.25, 1, 25.0, 1.0, 100.0),
            cell("quart-uniform", "poisson", 0.5, 1, 5.0, 1.0, 100.0),
        ]);
        let at_half = |policy: &str| below.rows.iter().find(|r| r.policy == policy && r.load == 0.5).unwrap().clone();
        assert!(at_half("quart-fixed").cliff && at_half("quart-fixed").undocumented_flag(), "its doc gives only its break past capacity");
        assert!(at_half("quart-uniform").cliff && !at_half("quart-uniform").undocumented_flag(), "its doc gives a low-load break");
        let table = render_table(&outcome);
        assert!(table.contains("cliffs (goodput under 0.9 of the best at a lower load): 0"), "{table}");
        assert!(table.contains("low-load misses (Poisson ≤ 0.5×, under 0.99 on time): 1"), "{table}");
        assert!(table.contains("cliff (doc)") && table.contains("fifo, 1 rows: never drops"), "{table}");
        let summary = policy_summaries(&outcome);
        let of = |policy: &str| summary.iter().find(|s| s.policy == policy).unwrap();
        assert_eq!((of("fifo").cliff_rows, of("fifo").documented_rows), (0, 1), "{summary:?}");
        assert_eq!((of("mine").miss_rows, of("mine").miss_pipelines, of("mine").documented_rows), (1, 1, 0), "{summary:?}");
        // A saved sweep from before the label reads back, unlabelled.
        let mut json = serde_json::to_value(&outcome).unwrap();
        json["rows"][0].as_object_mut().unwrap().remove("documented");
        let back: SweepOutcome = serde_json::from_value(json).unwrap();
        assert_eq!(back.rows[0].documented, None);
    }

    #[test]
    fn a_pipeline_the_policy_refuses_is_not_applicable_rather_than_a_cliff() {
        let refused = |load: f64, goodput: f64, on_time: f64| CellResult {
            refused: Some("stage 3 has two parents: Loki needs a tree of tasks".into()),
            ..cell("tree-only", "poisson", load, 1, goodput, on_time, 100.0)
        };
        let outcome = summarise(vec![refused(0.5, 50.0, 0.9), refused(1.0, 10.0, 0.1), refused(2.0, 5.0, 0.02)]);
        assert!(outcome.rows.iter().all(|r| !r.cliff && !r.low_load_miss && r.refused.is_some()), "{:?}", outcome.rows);
        assert!(outcome.cost_growth.is_empty(), "the fallback's cost is not the policy's");
        let table = render_table(&outcome);
        assert!(table.contains("tree-only on p: stage 3 has two parents") && table.contains(" n/a"), "{table}");
        assert!(table.contains("cliffs (goodput under 0.9 of the best at a lower load): 0"), "{table}");
        let dir = std::env::temp_dir().join(format!("yardmaster-sweep-refused-{}", std::process::id()));
        let files = write_files(&dir, &outcome).unwrap();
        let csv = std::fs::read_to_string(&files[0]).unwrap();
        assert!(csv.lines().nth(1).unwrap().ends_with(",\"stage 3 has two parents: Loki needs a tree of tasks\""), "{csv}");
        write_heatmaps(&dir, &outcome).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_llm_pipeline_is_refused_with_where_its_load_sweep_is() {
        let llm = yardmaster_formats::presets::pipeline("llm").unwrap();
        let error = capacity(&llm).unwrap_err().to_string();
        assert!(error.contains("LLM (iteration) stage") && error.contains("reproduce::calm"), "{error}");
        assert!(capacity(&yardmaster_formats::presets::pipeline("vision-chain").unwrap()).unwrap() > 0.0);
    }

    #[test]
    fn shapes_name_their_workloads_and_unknown_ones_are_refused() {
        assert_eq!(Shape::parse("bursty").unwrap().workload, "twitter");
        assert_eq!(Shape::parse("diurnal").unwrap().workload, "wikipedia");
        assert_eq!(Shape::parse("poisson").unwrap().workload, "poisson");
        assert!(Shape::parse("sideways").is_err());
    }

    #[test]
    fn heat_runs_from_red_to_green() {
        assert_eq!(heat(0.2), heat(0.5));
        assert!(heat(1.0).1 > heat(0.5).1 && heat(1.0).0 < heat(0.5).0);
    }

    #[test]
    fn heatmap_rows_name_a_file_pipeline_by_its_stem_and_cut_long_names() {
        assert_eq!(row_label("vision-chain"), "vision-chain");
        assert_eq!(row_label("../shared/data/loki/sim__traffic_analysis.json"), "sim__traffic_analysis");
        assert_eq!(row_label("my-app.toml"), "my-app");
        assert_eq!(row_label("a-pipeline-with-a-very-long-name"), "a-pipeline-with-a-ver…");
        assert_eq!(row_label("a-pipeline-with-a-very-long-name").chars().count(), LABEL_CHARS);
    }

    #[test]
    fn a_saved_sweep_reads_back_the_same_for_replotting() {
        let outcome = summarise(vec![cell("a", "poisson", 0.5, 1, 50.0, 1.0, 100.0), cell("a", "poisson", 2.0, 1, 20.0, 0.1, 300.0)]);
        let dir = std::env::temp_dir().join(format!("ym-sweep-replot-{}", std::process::id()));
        let files = write_files(&dir, &outcome).unwrap();
        let json = files.iter().find(|f| f.extension().is_some_and(|e| e == "json")).unwrap();
        let back: SweepOutcome = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        assert_eq!(back, outcome);
        assert!(back.rows.iter().any(|r| r.cliff), "the flags travel with the rows");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
