//! Reports of one or several runs side by side: an aligned text table, CSV files,
//! a JSON file and three comparison charts (SVG, and PNG when a system font exists).
//!
//! Every number comes from the run's [`Summary`], [`Window`]s and latency
//! [`Histogram`], and from what its policy arm counted ([`PolicyHealth`]: faults,
//! switches to the built-in fallback, plans the policy reported infeasible, its peak
//! linear memory); nothing is recomputed here except unit conversions.
//!
//! Charts are drawn with `plotters`. Its bitmap backend needs a real font to draw
//! text: the first call looks for `DejaVuSans.ttf` (else any `.ttf`) under
//! `/usr/share/fonts` and `/usr/local/share/fonts` and registers it as `sans-serif`.
//! Without one, the SVGs are laid out with a built-in metrics-only font (the viewer
//! draws their text with its own sans-serif font), the PNGs are skipped, and
//! [`Plots::note`] says so.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use serde::Serialize;

use yardmaster_engine::metrics::{Accounting, Histogram, LlmGoodputSummary, Summary, Window};

const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;

/// One run to report: the policy's name and what its [`Accounting`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Name of the policy (or of the run).
    pub policy: String,
    /// Every metric over the whole run.
    pub summary: Summary,
    /// The time series, the last window possibly partial.
    pub windows: Vec<Window>,
    /// End-to-end latency of every completed request (ns).
    pub latency: Histogram,
    /// What the policy arm counted about the policy itself.
    pub health: PolicyHealth,
    /// LLM goodput by service class (CALM's metric: LS token timelines, DS deadlines,
    /// compound jobs); empty for pipelines without LLM stages.
    pub llm: LlmGoodputSummary,
}

/// What a run's policy arm counted about the policy: whether it fell back, in any
/// way, and the memory it used. All of it is a pure function of the run's inputs (the
/// simulator meters policies by fuel), so reports stay byte-identical across machines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicyHealth {
    /// Faults (traps, overruns, memory), by kind.
    pub faults: std::collections::BTreeMap<String, u64>,
    /// Switches to the built-in fallback after a fault.
    pub fallbacks: u64,
    /// Plans the policy reported infeasible (it served its own infeasible-plan
    /// fallback; the metric [`yardmaster_policy::PLAN_INFEASIBLE_METRIC`]).
    pub infeasible_plans: u64,
    /// Plans it reported at all (values of that metric, feasible or not).
    pub plans: u64,
    /// The most linear memory the policy's instances held, bytes.
    pub peak_memory_bytes: u64,
}

impl PolicyHealth {
    /// The health an arm's counters show.
    pub fn from_arm(stats: &yardmaster_policy::ArmStats) -> Self {
        let plans =
            stats.metrics.iter().filter(|(name, _)| yardmaster_policy::arm::is_plan_infeasible_metric(name)).map(|(_, m)| m.count).sum();
        Self {
            faults: stats.faults.iter().map(|(kind, n)| ((*kind).to_owned(), *n)).collect(),
            fallbacks: stats.fallbacks,
            infeasible_plans: stats.infeasible_plans(),
            plans,
            peak_memory_bytes: stats.peak_memory_bytes,
        }
    }

    /// Faults of every kind.
    pub fn fault_count(&self) -> u64 {
        self.faults.values().sum()
    }

    /// Whether the policy fell back: a fault, a switch to the built-in fallback, or an
    /// infeasible plan of its own.
    pub fn fell_back(&self) -> bool {
        self.fault_count() > 0 || self.fallbacks > 0 || self.infeasible_plans > 0
    }
}

impl RunReport {
    /// The report of a run whose accounting is `accounting`, as of `now` (the end of
    /// the run): summary, every window up to `now` (see
    /// [`Accounting::windows_until`]), and the latency histogram.
    pub fn from_accounting(policy: impl Into<String>, accounting: &Accounting, now: u64) -> Self {
        Self {
            policy: policy.into(),
            summary: accounting.summary(now),
            windows: accounting.windows_until(now),
            latency: accounting.latency().clone(),
            health: PolicyHealth::default(),
            llm: accounting.llm_goodput(now),
        }
    }
}

// ---------------------------------------------------------------------------------
// Table and summary CSV: one list of metrics drives both.

/// How a metric's value is shown in the table.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// A whole number.
    Count,
    /// A rate or a plain number, two decimals.
    Number,
    /// A fraction shown as a percentage.
    Percent,
    /// Three decimals (accuracy).
    Fine,
    /// A flag: "yes" when non-zero, else "no".
    Flag,
    /// Bytes shown in MiB, one decimal.
    Mebibytes,
}

impl Unit {
    fn format(self, value: f64) -> String {
        match self {
            Unit::Count => format!("{value:.0}"),
            Unit::Number => format!("{value:.2}"),
            Unit::Percent => format!("{:.1}%", value * 100.0),
            Unit::Fine => format!("{value:.3}"),
            Unit::Flag => (if value != 0.0 { "yes" } else { "no" }).to_owned(),
            Unit::Mebibytes => format!("{:.1}", value / (1u64 << 20) as f64),
        }
    }
}

/// Where a metric appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// In the table and the CSV.
    Always,
    /// In the CSV; in the table only when some run has a non-zero value.
    WhenNonZero,
    /// In the CSV only.
    CsvOnly,
    /// In the CSV; in the table only when some run has requests of this LLM service
    /// class (`ls`, `ds`, `cp`, `be`).
    WhenLlmClass(&'static str),
}

/// A metric of a run: of its summary, or of its policy's health.
struct Metric {
    /// Column header in the table.
    label: &'static str,
    /// Column header in `summary.csv` (with its unit).
    key: &'static str,
    unit: Unit,
    shown: Shown,
    value: fn(&RunReport) -> f64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / NS_PER_MS
}

/// The share of a run's LLM requests of `class` that met their SLO (0 when it has none).
fn class_met(run: &RunReport, class: &str) -> f64 {
    run.llm.classes.get(class).filter(|c| c.requests > 0).map_or(0.0, |c| c.met as f64 / c.requests as f64)
}

/// Every metric of the summary table and `summary.csv`, in column order.
const METRICS: &[Metric] = &[
    Metric { label: "requests", key: "requests_ended", unit: Unit::Count, shown: Shown::Always, value: |r| r.summary.overall.ended as f64 },
    Metric { label: "arrivals", key: "arrivals", unit: Unit::Count, shown: Shown::CsvOnly, value: |r| r.summary.overall.arrivals as f64 },
    Metric { label: "goodput/s", key: "goodput_per_s", unit: Unit::Number, shown: Shown::Always, value: |r| r.summary.overall.goodput },
    Metric { label: "optimal/s", key: "optimal_per_s", unit: Unit::Number, shown: Shown::Always, value: |r| r.summary.optimal_goodput },
    Metric {
        label: "of optimal",
        key: "goodput_of_optimal",
        unit: Unit::Percent,
        shown: Shown::Always,
        value: |r| r.summary.goodput_of_optimal,
    },
    Metric { label: "drop rate", key: "drop_rate", unit: Unit::Percent, shown: Shown::Always, value: |r| r.summary.overall.drop_rate },
    Metric { label: "invalid", key: "invalid_rate", unit: Unit::Percent, shown: Shown::Always, value: |r| r.summary.overall.invalid_rate },
    Metric {
        label: "SLO att.",
        key: "slo_attainment",
        unit: Unit::Percent,
        shown: Shown::Always,
        value: |r| r.summary.overall.slo_attainment,
    },
    Metric {
        label: "failed",
        key: "failed",
        unit: Unit::Count,
        shown: Shown::WhenNonZero,
        value: |r| r.summary.overall.outcomes.failed as f64,
    },
    Metric { label: "p50 ms", key: "p50_ms", unit: Unit::Number, shown: Shown::Always, value: |r| ms(r.summary.overall.latency.p50) },
    Metric { label: "p90 ms", key: "p90_ms", unit: Unit::Number, shown: Shown::CsvOnly, value: |r| ms(r.summary.overall.latency.p90) },
    Metric { label: "p95 ms", key: "p95_ms", unit: Unit::Number, shown: Shown::CsvOnly, value: |r| ms(r.summary.overall.latency.p95) },
    Metric { label: "p99 ms", key: "p99_ms", unit: Unit::Number, shown: Shown::Always, value: |r| ms(r.summary.overall.latency.p99) },
    Metric { label: "max ms", key: "max_ms", unit: Unit::Number, shown: Shown::CsvOnly, value: |r| ms(r.summary.overall.latency.max) },
    Metric {
        label: "queue ms",
        key: "queue_delay_mean_ms",
        unit: Unit::Number,
        shown: Shown::CsvOnly,
        value: |r| r.summary.overall.queue_delay.mean / NS_PER_MS,
    },
    Metric {
        label: "queue p99",
        key: "queue_delay_p99_ms",
        unit: Unit::Number,
        shown: Shown::CsvOnly,
        value: |r| ms(r.summary.overall.queue_delay.p99),
    },
    Metric { label: "util", key: "utilisation", unit: Unit::Percent, shown: Shown::Always, value: |r| r.summary.utilisation },
    Metric { label: "GPU-s", key: "gpu_seconds", unit: Unit::Number, shown: Shown::Always, value: |r| r.summary.gpu_seconds },
    Metric { label: "accuracy", key: "accuracy", unit: Unit::Fine, shown: Shown::Always, value: |r| r.summary.overall.accuracy },
    Metric {
        label: "tok goodput/s",
        key: "token_goodput_per_s",
        unit: Unit::Number,
        shown: Shown::WhenNonZero,
        value: |r| r.summary.overall.token_goodput,
    },
    Metric {
        label: "LLM tok/s",
        key: "llm_token_goodput_per_s",
        unit: Unit::Number,
        shown: Shown::WhenNonZero,
        value: |r| r.llm.token_goodput,
    },
    Metric { label: "LS met", key: "ls_met", unit: Unit::Percent, shown: Shown::WhenLlmClass("ls"), value: |r| class_met(r, "ls") },
    Metric { label: "DS met", key: "ds_met", unit: Unit::Percent, shown: Shown::WhenLlmClass("ds"), value: |r| class_met(r, "ds") },
    Metric { label: "CP met", key: "cp_met", unit: Unit::Percent, shown: Shown::WhenLlmClass("cp"), value: |r| class_met(r, "cp") },
    Metric { label: "BE met", key: "be_met", unit: Unit::Percent, shown: Shown::WhenLlmClass("be"), value: |r| class_met(r, "be") },
    Metric {
        label: "fell back",
        key: "fell_back",
        unit: Unit::Flag,
        shown: Shown::Always,
        value: |r| f64::from(u8::from(r.health.fell_back())),
    },
    Metric {
        label: "infeasible",
        key: "infeasible_plans",
        unit: Unit::Count,
        shown: Shown::WhenNonZero,
        value: |r| r.health.infeasible_plans as f64,
    },
    Metric { label: "plans", key: "plans", unit: Unit::Count, shown: Shown::CsvOnly, value: |r| r.health.plans as f64 },
    Metric { label: "faults", key: "faults", unit: Unit::Count, shown: Shown::WhenNonZero, value: |r| r.health.fault_count() as f64 },
    Metric { label: "fallbacks", key: "fallbacks", unit: Unit::Count, shown: Shown::CsvOnly, value: |r| r.health.fallbacks as f64 },
    Metric {
        label: "memory MiB",
        key: "peak_memory_bytes",
        unit: Unit::Mebibytes,
        shown: Shown::CsvOnly,
        value: |r| r.health.peak_memory_bytes as f64,
    },
    Metric { label: "elapsed s", key: "elapsed_s", unit: Unit::Number, shown: Shown::CsvOnly, value: |r| r.summary.elapsed_s },
];

impl Metric {
    fn in_table(&self, runs: &[RunReport]) -> bool {
        match self.shown {
            Shown::Always => true,
            Shown::WhenNonZero => runs.iter().any(|r| (self.value)(r) != 0.0),
            Shown::CsvOnly => false,
            Shown::WhenLlmClass(class) => runs.iter().any(|r| r.llm.classes.get(class).is_some_and(|c| c.requests > 0)),
        }
    }
}

/// An aligned text table of the runs, one row each: policy, requests (ended),
/// goodput/s, optimal/s, goodput as % of optimal, drop rate, invalid rate, SLO
/// attainment, p50 and p99 latency (ms), utilisation, GPU-seconds, accuracy, whether
/// the policy fell back (a fault, the built-in fallback, or an infeasible plan of its
/// own), and — when some run has any — failed requests, token goodput/s, LLM goodput
/// (tokens/s by CALM's rules) and the share of each LLM service class's requests that
/// met their SLO, infeasible plans and faults.
pub fn render_table(runs: &[RunReport]) -> String {
    let metrics: Vec<&Metric> = METRICS.iter().filter(|m| m.in_table(runs)).collect();
    let header: Vec<String> = std::iter::once("policy").chain(metrics.iter().map(|m| m.label)).map(String::from).collect();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let values = metrics.iter().map(|m| m.unit.format((m.value)(run)));
            std::iter::once(run.policy.clone()).chain(values).collect()
        })
        .collect();
    align(&header, &rows)
}

/// Columns separated by two spaces, the first left-aligned, the others right-aligned,
/// with a rule under the header.
fn align(header: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, &width)) in cells.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(width - cell.chars().count());
            let (left, right) = if i == 0 { (cell.as_str(), pad.as_str()) } else { (pad.as_str(), cell.as_str()) };
            let _ = write!(text, "{}{left}{right}", if i == 0 { "" } else { "  " });
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header);
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    line(&rule);
    for row in rows {
        line(row);
    }
    out
}

// ---------------------------------------------------------------------------------
// CSV and JSON.

/// A CSV field, quoted when it needs to be.
fn csv_field(text: &str) -> Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        Cow::Owned(format!("\"{}\"", text.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(text)
    }
}

/// A file-name-safe form of each policy name, unique among the runs.
fn file_stems(runs: &[RunReport]) -> Vec<String> {
    let mut seen = HashSet::new();
    runs.iter()
        .map(|run| {
            let safe: String =
                run.policy.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect();
            let base = if safe.trim_matches('.').is_empty() { "run".to_owned() } else { safe };
            let mut stem = base.clone();
            let mut n = 2;
            while !seen.insert(stem.clone()) {
                stem = format!("{base}-{n}");
                n += 1;
            }
            stem
        })
        .collect()
}

/// A column of `windows-<policy>.csv`: header and value (`None`: empty cell).
type WindowColumn = (&'static str, fn(&Window) -> Option<f64>);

/// The columns of `windows-<policy>.csv`.
const WINDOW_COLUMNS: &[WindowColumn] = &[
    ("start_s", |w| Some(w.start as f64 / NS_PER_S)),
    ("duration_s", |w| Some(w.duration_s())),
    ("offered", |w| Some(w.offered as f64)),
    ("on_time", |w| Some(w.outcomes.on_time as f64)),
    ("late", |w| Some(w.outcomes.late as f64)),
    ("dropped", |w| Some(w.outcomes.dropped as f64)),
    ("failed", |w| Some(w.outcomes.failed as f64)),
    ("offered_per_s", |w| Some(w.offered_rate())),
    ("goodput_per_s", |w| Some(w.goodput())),
    ("optimal_per_s", |w| Some(w.optimal)),
    ("capacity_per_s", |w| w.capacity),
    ("serving_capacity_per_s", |w| w.serving_capacity),
    ("drop_rate", |w| Some(w.drop_rate())),
    ("p99_ms", |w| Some(ms(w.p99_latency))),
    ("active_workers", |w| Some(w.active_workers)),
];

fn csv_line(cells: impl IntoIterator<Item = String>) -> String {
    let mut line = cells.into_iter().collect::<Vec<_>>().join(",");
    line.push('\n');
    line
}

fn windows_csv(windows: &[Window]) -> String {
    let mut out = csv_line(WINDOW_COLUMNS.iter().map(|(name, _)| (*name).to_owned()));
    for w in windows {
        out += &csv_line(WINDOW_COLUMNS.iter().map(|(_, value)| value(w).map(|v| v.to_string()).unwrap_or_default()));
    }
    out
}

fn summary_csv(runs: &[RunReport]) -> String {
    let mut out = csv_line(std::iter::once("policy").chain(METRICS.iter().map(|m| m.key)).map(String::from));
    for run in runs {
        let values = METRICS.iter().map(|m| (m.value)(run).to_string());
        out += &csv_line(std::iter::once(csv_field(&run.policy).into_owned()).chain(values));
    }
    out
}

/// Write `windows-<policy>.csv` for each run (its time series) and `summary.csv`
/// (one row per run, every metric of the table and more) into `dir`, creating it.
/// Returns the paths written.
///
/// # Errors
/// Any I/O error creating the directory or writing a file.
pub fn write_csv(dir: &Path, runs: &[RunReport]) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut written = Vec::with_capacity(runs.len() + 1);
    for (run, stem) in runs.iter().zip(file_stems(runs)) {
        let path = dir.join(format!("windows-{stem}.csv"));
        fs::write(&path, windows_csv(&run.windows))?;
        written.push(path);
    }
    let path = dir.join("summary.csv");
    fs::write(&path, summary_csv(runs))?;
    written.push(path);
    Ok(written)
}

/// One run in `summary.json`.
#[derive(Serialize)]
struct JsonRun<'a> {
    policy: &'a str,
    summary: &'a Summary,
    health: &'a PolicyHealth,
    windows: &'a [Window],
    /// LLM goodput by service class (empty without LLM stages).
    #[serde(skip_serializing_if = "is_empty_llm")]
    llm: &'a LlmGoodputSummary,
    /// The latency distribution: `[latency_ms, fraction at or below]` per bucket.
    latency_cdf: Vec<[f64; 2]>,
}

fn is_empty_llm(llm: &&LlmGoodputSummary) -> bool {
    llm.classes.is_empty()
}

/// Write `summary.json` into `dir` (creating it): for each run its policy, summary,
/// windows, LLM goodput by class (LLM pipelines) and latency CDF. Returns its path.
///
/// # Errors
/// Any I/O error creating the directory or writing the file.
pub fn write_json(dir: &Path, runs: &[RunReport]) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let runs: Vec<JsonRun<'_>> = runs
        .iter()
        .map(|run| JsonRun {
            policy: &run.policy,
            summary: &run.summary,
            health: &run.health,
            windows: &run.windows,
            llm: &run.llm,
            latency_cdf: run.latency.cdf().map(|(ns, f)| [ms(ns), f]).collect(),
        })
        .collect();
    let path = dir.join("summary.json");
    let json = serde_json::to_string_pretty(&serde_json::json!({ "runs": runs }))?;
    fs::write(&path, json + "\n")?;
    Ok(path)
}

// ---------------------------------------------------------------------------------
// Fonts.

/// The font family name the charts use.
const FAMILY: &str = "sans-serif";

/// Directories searched for a TrueType font.
const FONT_DIRS: &[&str] = &["/usr/share/fonts", "/usr/local/share/fonts"];

/// The preferred font file.
const PREFERRED_FONT: &str = "DejaVuSans.ttf";

/// Which font the charts got.
#[derive(Debug)]
pub(crate) enum PlotFont {
    /// A system font: text can be rasterised (PNG).
    System(PathBuf),
    /// The metrics-only font: SVG only; the string says why.
    MetricsOnly(String),
}

/// `PREFERRED_FONT` if found under `dirs` (recursively), else the first `.ttf` in
/// path order.
fn find_font(dirs: &[&Path]) -> Option<PathBuf> {
    let mut fonts = Vec::new();
    for dir in dirs {
        collect_ttf(dir, &mut fonts);
    }
    fonts.sort();
    let preferred = fonts.iter().position(|p| p.file_name().is_some_and(|n| n == PREFERRED_FONT));
    let index = preferred.unwrap_or(0);
    (index < fonts.len()).then(|| fonts.swap_remove(index))
}

fn collect_ttf(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            collect_ttf(&path, out);
        } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            out.push(path);
        }
    }
}

/// Register `bytes` under [`FAMILY`]; plotters keeps the font for the process's
/// lifetime, so the bytes are leaked once.
fn register(bytes: Vec<u8>) -> Result<(), String> {
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| "not a usable TrueType font".to_owned())
}

fn register_system_font() -> Result<PathBuf, String> {
    let dirs: Vec<&Path> = FONT_DIRS.iter().map(Path::new).collect();
    let path = find_font(&dirs).ok_or_else(|| format!("no .ttf font under {}", FONT_DIRS.join(" or ")))?;
    let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    register(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The charts' font, registered on first use.
pub(crate) fn plot_font() -> Result<&'static PlotFont, String> {
    static FONT: OnceLock<Result<PlotFont, String>> = OnceLock::new();
    FONT.get_or_init(|| match register_system_font() {
        Ok(path) => Ok(PlotFont::System(path)),
        Err(why) => register(metrics_only_font()).map(|()| PlotFont::MetricsOnly(why)),
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A minimal TrueType font with metrics and no outlines: one empty glyph 0.55 em
/// wide (every character maps to it), ascent 0.8 em, descent 0.2 em. It lets
/// plotters lay out text for SVG, where the viewer draws the text itself.
fn metrics_only_font() -> Vec<u8> {
    fn be16(table: &mut [u8], at: usize, value: u16) {
        table[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }
    let mut head = vec![0u8; 54];
    head[0..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    head[12..16].copy_from_slice(&0x5F0F_3CF5u32.to_be_bytes());
    be16(&mut head, 18, 1000); // units per em
    let mut hhea = vec![0u8; 36];
    hhea[0..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    be16(&mut hhea, 4, 800); // ascender
    be16(&mut hhea, 6, (-200i16) as u16); // descender
    be16(&mut hhea, 10, 550); // advance width max
    be16(&mut hhea, 34, 1); // number of h-metrics
    let hmtx = [550u16.to_be_bytes(), [0, 0]].concat();
    let maxp = [0x0000_5000u32.to_be_bytes().as_slice(), &1u16.to_be_bytes()].concat();
    sfnt(&[(*b"head", &head), (*b"hhea", &hhea), (*b"hmtx", &hmtx), (*b"maxp", &maxp)])
}

/// An sfnt container of `tables` (sorted by tag), each 4-byte aligned.
fn sfnt(tables: &[([u8; 4], &[u8])]) -> Vec<u8> {
    let count = tables.len() as u16;
    let selector = count.ilog2() as u16;
    let range = 16u16 << selector;
    let mut out = Vec::new();
    for v in [0x0001u16, 0, count, range, selector, count * 16 - range] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    let mut offset = 12 + 16 * tables.len();
    let mut body = Vec::new();
    for (tag, data) in tables {
        let checksum = data.chunks(4).fold(0u32, |sum, c| {
            let mut word = [0u8; 4];
            word[..c.len()].copy_from_slice(c);
            sum.wrapping_add(u32::from_be_bytes(word))
        });
        out.extend_from_slice(tag);
        for v in [checksum, offset as u32, data.len() as u32] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        body.extend_from_slice(data);
        body.resize(body.len().next_multiple_of(4), 0);
        offset = 12 + 16 * tables.len() + body.len();
    }
    out.extend_from_slice(&body);
    out
}

// ---------------------------------------------------------------------------------
// Charts.

/// What [`write_plots`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plots {
    /// The files written: SVG always, PNG when a system font was found.
    pub files: Vec<PathBuf>,
    /// The system font used for the charts' text, if one was found.
    pub font: Option<PathBuf>,
    /// Why some output was skipped (no system font: no PNGs), if it was.
    pub note: Option<String>,
}

/// Size of every chart, pixels.
const CHART_SIZE: (u32, u32) = (1100, 650);

/// Line colours, one per run in order (cycling).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The colour of the `index`-th run or series of a chart (eight colours, cycling),
/// so that every chart of the project colours its series alike.
pub fn colour(index: usize) -> RGBColor {
    COLOURS[index % COLOURS.len()]
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    label: String,
    colour: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// The three charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chart {
    /// Goodput per window against the optimal bound.
    Goodput,
    /// Drop rate per window.
    DropRate,
    /// Latency CDF, log-x.
    LatencyCdf,
}

impl Chart {
    const ALL: [Chart; 3] = [Chart::Goodput, Chart::DropRate, Chart::LatencyCdf];

    /// File name without extension.
    fn stem(self) -> &'static str {
        match self {
            Chart::Goodput => "goodput",
            Chart::DropRate => "drop-rate",
            Chart::LatencyCdf => "latency-cdf",
        }
    }

    fn draw<DB: DrawingBackend>(self, root: &DrawingArea<DB, Shift>, runs: &[RunReport]) -> Result<(), String> {
        match self {
            Chart::Goodput => {
                let lines = goodput_lines(runs);
                let axes = Axes {
                    title: "Goodput over time vs optimal bound",
                    x: "time (s)",
                    y: "goodput (req/s)",
                    legend: SeriesLabelPosition::UpperRight,
                };
                // Headroom for the legend.
                let y = 0.0..1.3 * max_or_one(lines.iter().flat_map(|l| &l.points).map(|p| p.1));
                draw_lines(root, axes, time_range(runs), y, &lines)
            }
            Chart::DropRate => {
                let lines = drop_rate_lines(runs);
                let axes = Axes {
                    title: "Drop rate over time (dropped + late, of ended)",
                    x: "time (s)",
                    y: "drop rate (%)",
                    legend: SeriesLabelPosition::UpperRight,
                };
                draw_lines(root, axes, time_range(runs), 0.0..105.0, &lines)
            }
            Chart::LatencyCdf => {
                let lines = cdf_lines(runs);
                let axes = Axes {
                    title: "End-to-end latency CDF (completed requests)",
                    x: "latency (ms, log scale)",
                    y: "fraction of requests",
                    legend: SeriesLabelPosition::LowerRight,
                };
                draw_lines(root, axes, latency_range(&lines).log_scale(), 0.0..1.0, &lines)
            }
        }
    }

    /// Draw onto a fresh backend and save it.
    fn render<DB: DrawingBackend>(self, backend: DB, runs: &[RunReport]) -> Result<(), String> {
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        self.draw(&root, runs)?;
        root.present().map_err(|e| e.to_string())
    }
}

/// Time of a window's midpoint from its run's start, seconds.
fn window_time(run: &RunReport, w: &Window) -> f64 {
    (w.start.saturating_sub(run.summary.start) as f64 + w.duration as f64 / 2.0) / NS_PER_S
}

fn window_points(run: &RunReport, value: impl Fn(&Window) -> Option<f64>) -> Vec<(f64, f64)> {
    run.windows.iter().filter_map(|w| value(w).map(|v| (window_time(run, w), v))).collect()
}

/// One goodput line per run, and the optimal bound dashed: a single black line when
/// every run has the same bound, else one per run in its colour.
fn goodput_lines(runs: &[RunReport]) -> Vec<Line> {
    let bounds: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| window_points(r, |w| Some(w.optimal))).collect();
    let mut lines: Vec<Line> = runs
        .iter()
        .enumerate()
        .map(|(i, run)| Line {
            label: run.policy.clone(),
            colour: colour(i),
            dashed: false,
            points: window_points(run, |w| Some(w.goodput())),
        })
        .collect();
    if bounds.windows(2).all(|pair| pair[0] == pair[1]) {
        if let Some(points) = bounds.into_iter().next() {
            lines.push(Line { label: "optimal bound".into(), colour: BLACK, dashed: true, points });
        }
    } else {
        lines.extend(runs.iter().zip(bounds).enumerate().map(|(i, (run, points))| Line {
            label: format!("optimal bound ({})", run.policy),
            colour: colour(i),
            dashed: true,
            points,
        }));
    }
    lines
}

/// One line per run: drop rate (%) of each window in which some request ended.
fn drop_rate_lines(runs: &[RunReport]) -> Vec<Line> {
    runs.iter()
        .enumerate()
        .map(|(i, run)| Line {
            label: run.policy.clone(),
            colour: colour(i),
            dashed: false,
            points: window_points(run, |w| (w.outcomes.ended() > 0).then(|| 100.0 * w.drop_rate())),
        })
        .collect()
}

/// One line per run: the latency CDF (ms, fraction).
fn cdf_lines(runs: &[RunReport]) -> Vec<Line> {
    runs.iter()
        .enumerate()
        .map(|(i, run)| {
            let mut points: Vec<(f64, f64)> = run.latency.cdf().map(|(ns, f)| (ms(ns), f)).collect();
            if let Some(&(x, _)) = points.first() {
                points.insert(0, (x, 0.0));
            }
            Line { label: run.policy.clone(), colour: colour(i), dashed: false, points }
        })
        .collect()
}

/// 0 to the end of the longest run, seconds.
fn time_range(runs: &[RunReport]) -> Range<f64> {
    0.0..max_or_one(runs.iter().map(|r| r.summary.elapsed_s))
}

/// The largest value, or 1 when there is no positive one.
fn max_or_one(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.fold(0.0, f64::max);
    if max > 0.0 {
        max
    } else {
        1.0
    }
}

/// Powers of ten around every positive x of `lines`, with room for the legend right
/// of the largest (0.1 … 1000 ms when there is none).
fn latency_range(lines: &[Line]) -> Range<f64> {
    let xs = || lines.iter().flat_map(|l| &l.points).map(|p| p.0).filter(|&x| x > 0.0);
    let (Some(lo), Some(hi)) = (xs().reduce(f64::min), xs().reduce(f64::max)) else {
        return 0.1..1000.0;
    };
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf((2.0 * hi).log10().ceil());
    lo..if hi > lo { hi } else { lo * 10.0 }
}

/// An axis label: `value` to three significant digits, without trailing zeros.
fn tick(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return "0".to_owned();
    }
    let decimals = (2 - value.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// A chart's texts and where its legend goes.
struct Axes<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
    legend: SeriesLabelPosition,
}

/// A line chart with a title, axis descriptions, a grid and a legend.
fn draw_lines<DB, X>(root: &DrawingArea<DB, Shift>, axes: Axes<'_>, x: X, y: Range<f64>, lines: &[Line]) -> Result<(), String>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(root)
        .caption(axes.title, (FAMILY, 26))
        .margin(16)
        .margin_right(36)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for line in lines {
        let style = line.colour.stroke_width(2);
        let legend = if line.dashed {
            chart.draw_series(DashedLineSeries::new(line.points.iter().copied(), 8, 5, style)).map_err(err)?
        } else {
            chart.draw_series(LineSeries::new(line.points.iter().copied(), style)).map_err(err)?
        };
        let dashed = line.dashed;
        legend.label(line.label.as_str()).legend(move |(x, y)| {
            let gap = if dashed { 4 } else { 0 };
            DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, gap, style)
        });
    }
    chart
        .configure_series_labels()
        .position(axes.legend)
        .label_font((FAMILY, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .draw()
        .map_err(err)
}

/// Draw the three comparison charts of `runs` into `dir` (creating it):
/// `goodput` (goodput per window, one line per policy, the optimal bound dashed),
/// `drop-rate` (per window) and `latency-cdf` (log-x, ms), each as SVG, and as PNG
/// when a system font was found — otherwise [`Plots::note`] says why there are none.
///
/// # Errors
/// A message naming the file that could not be created or drawn.
pub fn write_plots(dir: &Path, runs: &[RunReport]) -> Result<Plots, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let font = plot_font()?;
    let mut files = Vec::new();
    for chart in Chart::ALL {
        let svg = dir.join(format!("{}.svg", chart.stem()));
        chart.render(SVGBackend::new(&svg, CHART_SIZE), runs).map_err(|e| format!("{}: {e}", svg.display()))?;
        files.push(svg);
        if matches!(font, PlotFont::System(_)) {
            let png = dir.join(format!("{}.png", chart.stem()));
            chart.render(BitMapBackend::new(&png, CHART_SIZE), runs).map_err(|e| format!("{}: {e}", png.display()))?;
            files.push(png);
        }
    }
    let (font, note) = match font {
        PlotFont::System(path) => (Some(path.clone()), None),
        PlotFont::MetricsOnly(why) => (None, Some(format!("PNG charts skipped: {why} (install fonts-dejavu-core)"))),
    };
    Ok(Plots { files, font, note })
}

/// One named series of a [`write_line_chart`].
pub type Series = (String, Vec<(f64, f64)>);

/// A line chart of arbitrary series (for the figures of a reproduction beyond the
/// three comparison charts): `stem.svg` in `dir`, and `stem.png` when a system font
/// was found. The y axis spans 0 to `y_max` (the data's maximum with headroom when
/// `None`). Returns the files written.
///
/// # Errors
/// A message naming the file that could not be created or drawn.
pub fn write_line_chart(dir: &Path, stem: &str, labels: [&str; 3], series: &[Series], y_max: Option<f64>) -> Result<Vec<PathBuf>, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let font = plot_font()?;
    let lines: Vec<Line> = series
        .iter()
        .enumerate()
        .map(|(i, (label, points))| Line { label: label.clone(), colour: colour(i), dashed: false, points: points.clone() })
        .collect();
    let xs = || lines.iter().flat_map(|l| &l.points).map(|p| p.0);
    let x_min = xs().fold(f64::INFINITY, f64::min);
    let x_max = xs().fold(f64::NEG_INFINITY, f64::max);
    let x = if x_min.is_finite() && x_max > x_min { x_min..x_max } else { 0.0..1.0 };
    let y = 0.0..y_max.unwrap_or_else(|| 1.3 * max_or_one(lines.iter().flat_map(|l| &l.points).map(|p| p.1)));
    let axes = || Axes { title: labels[0], x: labels[1], y: labels[2], legend: SeriesLabelPosition::UpperRight };
    let mut files = Vec::new();
    let svg = dir.join(format!("{stem}.svg"));
    let draw = |root: DrawingArea<SVGBackend, Shift>| -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw_lines(&root, axes(), x.clone(), y.clone(), &lines)?;
        root.present().map_err(|e| e.to_string())
    };
    draw(SVGBackend::new(&svg, CHART_SIZE).into_drawing_area()).map_err(|e| format!("{}: {e}", svg.display()))?;
    files.push(svg);
    if matches!(font, PlotFont::System(_)) {
        let png = dir.join(format!("{stem}.png"));
        {
            let root = BitMapBackend::new(&png, CHART_SIZE).into_drawing_area();
            let drawn = root
                .fill(&WHITE)
                .map_err(|e| e.to_string())
                .and_then(|()| draw_lines(&root, axes(), x.clone(), y.clone(), &lines))
                .and_then(|()| root.present().map_err(|e| e.to_string()));
            drawn.map_err(|e| format!("{}: {e}", png.display()))?;
        }
        files.push(png);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::metrics::{BatchRecord, Outcome, Outcomes, RequestEnd, Stats};

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// A scratch directory for one test, emptied first.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("yardmaster-report-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A simulated run: 20 requests/s for `seconds` s on 2 workers, reported one
    /// second later; every request takes about `latency_ms` and a batch of its own;
    /// every `drop_every`-th is dropped and every `late_every`-th is late; capacity
    /// 15 req/s.
    fn simulated(policy: &str, seconds: u64, latency_ms: u64, drop_every: u64, late_every: u64, tokens: u32) -> RunReport {
        let mut a = Accounting::new(S);
        a.workers_changed(0, 2);
        a.set_capacity(0, 15.0);
        let mut id = 0;
        for t in (0..seconds * S).step_by(50 * MS as usize) {
            id += 1;
            a.arrival(t, 0);
            let ended_at = t + latency_ms * MS + id % 7 * MS;
            a.batch_finished(BatchRecord { at: ended_at, worker: (id % 2) as u32, duration: 30 * MS, requests: &[id] });
            let outcome = if id % drop_every == 0 { Outcome::Dropped { reason: "shed".into() } } else { Outcome::Completed };
            let deadline = if id % late_every == 0 { t } else { ended_at };
            a.request_ended(RequestEnd { id, stream: 0, sent_at: t, ended_at, deadline, outcome, tokens, accuracy: 0.9, queue_delay: MS });
        }
        RunReport::from_accounting(policy, &a, (seconds + 1) * S)
    }

    #[test]
    fn report_bundles_summary_windows_and_latency() {
        let report = simulated("edf", 2, 100, 5, 7, 0);
        assert_eq!(report.policy, "edf");
        assert_eq!(report.windows.len(), 3, "two seconds of traffic and the second after, one window each");
        assert_eq!(report.latency.count(), report.summary.overall.outcomes.on_time + report.summary.overall.outcomes.late);
        assert!(report.latency.max() >= 100 * MS);
    }

    /// A summary with hand-chosen values for the table test.
    fn chosen_summary() -> Summary {
        let mut overall = Stats {
            ended: 5,
            outcomes: Outcomes { on_time: 2, late: 1, dropped: 1, failed: 1 },
            goodput: 1.0,
            drop_rate: 0.4,
            invalid_rate: 0.4,
            slo_attainment: 0.4,
            accuracy: 0.8,
            token_goodput: 20.0,
            ..Stats::default()
        };
        overall.latency.p50 = 400 * MS;
        overall.latency.p99 = 1_500 * MS;
        Summary {
            overall,
            optimal_goodput: 2.25,
            goodput_of_optimal: 1.0 / 2.25,
            utilisation: 1.0 / 6.0,
            gpu_seconds: 3.0,
            ..Summary::default()
        }
    }

    fn chosen_run(policy: &str) -> RunReport {
        RunReport {
            policy: policy.into(),
            summary: chosen_summary(),
            windows: Vec::new(),
            latency: Histogram::new(),
            health: PolicyHealth::default(),
            llm: LlmGoodputSummary::default(),
        }
    }

    #[test]
    fn table_shows_hand_chosen_values() {
        let table = render_table(&[chosen_run("edf")]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "edf", "5", "1.00", "2.25", "44.4%", "40.0%", "40.0%", "40.0%", "1", "400.00", "1500.00", "16.7%", "3.00", "0.800",
                "20.00", "no"
            ]
        );
        let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|h| !h.is_empty()).collect();
        assert_eq!(
            header,
            [
                "policy",
                "requests",
                "goodput/s",
                "optimal/s",
                "of optimal",
                "drop rate",
                "invalid",
                "SLO att.",
                "failed",
                "p50 ms",
                "p99 ms",
                "util",
                "GPU-s",
                "accuracy",
                "tok goodput/s",
                "fell back"
            ]
        );
        assert!(lines[1].chars().all(|c| c == '-' || c == ' '));
    }

    #[test]
    fn a_policy_that_fell_back_says_so_and_why() {
        let feasible = chosen_run("planned");
        let mut infeasible = chosen_run("infeasible");
        infeasible.health.infeasible_plans = 3;
        infeasible.health.plans = 5;
        let mut faulty = chosen_run("faulty");
        faulty.health.faults.insert("out-of-memory".into(), 1);
        faulty.health.fallbacks = 1;
        let table = render_table(&[feasible.clone(), infeasible.clone(), faulty.clone()]);
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|h| !h.is_empty()).collect();
        let column = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name} column:\n{table}"));
        let (fell_back, plans, faults) = (column("fell back"), column("infeasible"), column("faults"));
        let cells: Vec<Vec<&str>> = lines[2..].iter().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!([cells[0][fell_back], cells[0][plans], cells[0][faults]], ["no", "0", "0"], "{table}");
        assert_eq!([cells[1][fell_back], cells[1][plans], cells[1][faults]], ["yes", "3", "0"], "{table}");
        assert_eq!([cells[2][fell_back], cells[2][plans], cells[2][faults]], ["yes", "0", "1"], "{table}");
        // Without any, the optional columns stay out of the table.
        let table = render_table(std::slice::from_ref(&feasible));
        assert!(!table.contains("infeasible") && !table.contains("faults"), "{table}");
        // The CSV and the JSON carry them always.
        let dir = scratch("health");
        let summary = fs::read_to_string(write_csv(&dir, &[feasible, infeasible.clone()]).unwrap().pop().unwrap()).unwrap();
        let rows: Vec<Vec<&str>> = summary.lines().map(|l| l.split(',').collect()).collect();
        let at = |name: &str| rows[0].iter().position(|h| *h == name).unwrap();
        assert_eq!([rows[1][at("fell_back")], rows[1][at("infeasible_plans")]], ["0", "0"]);
        assert_eq!([rows[2][at("fell_back")], rows[2][at("infeasible_plans")], rows[2][at("plans")]], ["1", "3", "5"]);
        let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(write_json(&dir, &[infeasible]).unwrap()).unwrap()).unwrap();
        assert_eq!(json["runs"][0]["health"]["infeasible_plans"], 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn llm_runs_show_goodput_and_each_class_met_share() {
        use yardmaster_engine::metrics::ClassGoodput;
        let batch = chosen_run("batch");
        let mut llm = chosen_run("calm");
        llm.llm.token_goodput = 1234.5;
        llm.llm.classes.insert("ls".into(), ClassGoodput { requests: 4, met: 3, tokens: 100 });
        llm.llm.classes.insert("ds".into(), ClassGoodput { requests: 10, met: 0, tokens: 0 });
        let table = render_table(&[batch.clone(), llm.clone()]);
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|h| !h.is_empty()).collect();
        let column = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name} column:\n{table}"));
        let cells: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!([cells[column("LLM tok/s")], cells[column("LS met")], cells[column("DS met")]], ["1234.50", "75.0%", "0.0%"], "{table}");
        assert!(!table.contains("CP met") && !table.contains("BE met"), "classes without requests stay out:\n{table}");
        let table = render_table(std::slice::from_ref(&batch));
        assert!(!table.contains("LLM tok/s") && !table.contains("LS met"), "{table}");
        let dir = scratch("llm-classes");
        let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(write_json(&dir, &[batch, llm]).unwrap()).unwrap()).unwrap();
        assert!(json["runs"][0].get("llm").is_none());
        assert_eq!(json["runs"][1]["llm"]["classes"]["ls"]["met"], 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn table_is_aligned_and_hides_zero_optional_columns() {
        let runs = [simulated("fifo", 2, 40, 5, 1_000, 0), simulated("a-much-longer-policy-name", 2, 40, 4, 3, 0)];
        let table = render_table(&runs);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "right-aligned columns end together:\n{table}");
        assert!(lines[2].starts_with("fifo "));
        assert!(!table.contains("tok goodput/s") && !table.contains("failed"), "{table}");
        assert!(render_table(&[]).lines().count() == 2);
    }

    #[test]
    fn simulated_run_metrics_are_consistent() {
        // 40 requests over 2 s; ids 5, 10, ... dropped (8), ids 3, 6, ... late unless dropped.
        let run = simulated("p", 2, 40, 5, 3, 0);
        let o = &run.summary.overall;
        assert_eq!((o.arrivals, o.ended), (40, 40));
        assert_eq!(o.outcomes.dropped, 8);
        assert_eq!(o.outcomes.late, 13 - 2); // multiples of 3 up to 39, minus 15 and 30
        assert_eq!(run.windows.len(), 3);
        // 20 arrivals per second for 2 s at a capacity of 15/s: the 10 left over are
        // served in the third second, so all 40 could complete in 3 s.
        assert!((run.summary.optimal_goodput - 40.0 / 3.0).abs() < 1e-9, "{}", run.summary.optimal_goodput);
        assert!((o.invalid_rate - o.drop_rate).abs() < 1e-9, "one equal batch per request");
    }

    #[test]
    fn csv_files_have_one_row_per_window_and_per_run() {
        let dir = scratch("csv");
        let runs = [simulated("fifo", 3, 40, 5, 7, 0), simulated("edf, tuned", 3, 60, 9, 7, 3)];
        let written = write_csv(&dir, &runs).expect("writes");
        let names: Vec<String> = written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["windows-fifo.csv", "windows-edf__tuned.csv", "summary.csv"]);
        let windows = fs::read_to_string(&written[0]).unwrap();
        let rows: Vec<&str> = windows.lines().collect();
        assert_eq!(rows.len(), 1 + 4);
        assert!(rows[0].starts_with("start_s,duration_s,offered,on_time"));
        assert!(rows.iter().all(|r| r.split(',').count() == WINDOW_COLUMNS.len()));
        assert!(rows[1].starts_with("0,1,20,"), "{}", rows[1]);
        let summary = fs::read_to_string(&written[2]).unwrap();
        let rows: Vec<&str> = summary.lines().collect();
        assert_eq!(rows.len(), 3);
        assert!(rows[0].starts_with("policy,requests_ended,arrivals,goodput_per_s"));
        assert!(rows[2].starts_with("\"edf, tuned\",60,60,"), "{}", rows[2]);
        assert_eq!(rows[1].split(',').count(), METRICS.len() + 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_holds_every_run() {
        let dir = scratch("json");
        let runs = [simulated("fifo", 2, 40, 5, 7, 100), simulated("edf", 2, 30, 5, 7, 100)];
        let path = write_json(&dir, &runs).expect("writes");
        let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let runs_json = json["runs"].as_array().expect("runs");
        assert_eq!(runs_json.len(), 2);
        assert_eq!(runs_json[1]["policy"], "edf");
        assert_eq!(runs_json[0]["summary"]["overall"]["ended"], 40);
        assert_eq!(runs_json[0]["summary"]["overall"]["token_goodput"], runs[0].summary.overall.token_goodput);
        assert_eq!(runs_json[0]["windows"].as_array().unwrap().len(), 3);
        assert_eq!(runs_json[0]["windows"][0]["on_time"], runs[0].windows[0].outcomes.on_time);
        let cdf = runs_json[0]["latency_cdf"].as_array().unwrap();
        assert_eq!(cdf.last().unwrap()[1], 1.0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn plots_are_written_as_svg_and_png() {
        let dir = std::env::var_os("YARDMASTER_PLOT_DIR").map_or_else(|| scratch("plots"), PathBuf::from);
        let runs = [simulated("fifo", 20, 40, 4, 9, 0), simulated("edf", 20, 90, 11, 5, 0), simulated("slo-aware", 20, 25, 25, 30, 0)];
        let plots = write_plots(&dir, &runs).expect("draws");
        let svgs: Vec<&PathBuf> = plots.files.iter().filter(|p| p.extension().unwrap() == "svg").collect();
        assert_eq!(svgs.len(), 3);
        let goodput = fs::read_to_string(dir.join("goodput.svg")).unwrap();
        for text in ["Goodput over time vs optimal bound", "time (s)", "goodput (req/s)", "fifo", "slo-aware", "optimal bound"] {
            assert!(goodput.contains(text), "goodput.svg lacks {text:?}");
        }
        assert!(fs::read_to_string(dir.join("latency-cdf.svg")).unwrap().contains("latency (ms, log scale)"));
        match &plots.note {
            None => {
                assert!(plots.font.is_some());
                assert_eq!(plots.files.len(), 6);
                let png = fs::read(dir.join("goodput.png")).unwrap();
                assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
            }
            Some(note) => assert!(plots.font.is_none() && note.contains("PNG"), "{note}"),
        }
        if std::env::var_os("YARDMASTER_PLOT_DIR").is_none() {
            fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn plots_of_empty_runs_still_draw() {
        let dir = scratch("empty-plots");
        let plots = write_plots(&dir, &[chosen_run("nothing")]).expect("draws");
        assert!(plots.files.len() >= 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn metrics_only_font_lays_out_text() {
        register_font("metrics-only-test", FontStyle::Normal, Box::leak(metrics_only_font().into_boxed_slice()))
            .map_err(|_| "rejected")
            .unwrap();
        let font = ("metrics-only-test", 20).into_font();
        let (short, _) = font.box_size("abcd").unwrap();
        let (long, height) = font.box_size("abcdefgh").unwrap();
        assert!(short > 0 && height > 0);
        assert!(long.abs_diff(2 * short) <= 1, "{long} vs 2 × {short}");
    }

    #[test]
    fn font_search_prefers_dejavu_sans() {
        let dir = scratch("fonts");
        for file in ["b/Other.ttf", "a/x.TTF", "c/d/DejaVuSans.ttf", "a/readme.txt"] {
            let path = dir.join(file);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"").unwrap();
        }
        assert_eq!(find_font(&[&dir]), Some(dir.join("c/d/DejaVuSans.ttf")));
        fs::remove_file(dir.join("c/d/DejaVuSans.ttf")).unwrap();
        assert_eq!(find_font(&[&dir, Path::new("/nonexistent")]), Some(dir.join("a/x.TTF")));
        assert_eq!(find_font(&[&dir.join("c")]), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shared_bound_is_one_black_dashed_line() {
        let same = [simulated("a", 2, 40, 5, 7, 0), simulated("b", 2, 50, 5, 7, 0)];
        let lines = goodput_lines(&same);
        assert_eq!(lines.len(), 3);
        assert_eq!((lines[2].label.as_str(), lines[2].colour, lines[2].dashed), ("optimal bound", BLACK, true));
        let mut differ = same.clone();
        differ[1].windows[0].optimal = 1.0;
        let lines = goodput_lines(&differ);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[3].label, "optimal bound (b)");
        assert_eq!(lines[3].colour, colour(1));
    }

    #[test]
    fn drop_rate_points_skip_windows_where_nothing_ended() {
        let mut run = simulated("a", 3, 40, 5, 1_000, 0);
        run.windows[1].outcomes = Outcomes::default();
        let points = &drop_rate_lines(&[run])[0].points;
        assert_eq!(points.len(), 2);
        assert_eq!(points[0], (0.5, 20.0));
    }

    #[test]
    fn latency_axis_spans_powers_of_ten() {
        let line = |xs: &[f64]| Line { label: String::new(), colour: BLACK, dashed: false, points: xs.iter().map(|&x| (x, 0.5)).collect() };
        assert_eq!(latency_range(&[line(&[3.0, 250.0])]), 1.0..1000.0);
        assert_eq!(latency_range(&[line(&[10.0])]), 10.0..100.0);
        assert_eq!(latency_range(&[line(&[20.0, 96.0])]), 10.0..1000.0);
        assert_eq!(latency_range(&[]), 0.1..1000.0);
    }

    #[test]
    fn tick_labels_are_short() {
        let ticks: Vec<String> = [0.0, 2.0, 0.2, 29.999999, 100.0, 0.001234, 12345.6, -1.5].into_iter().map(tick).collect();
        assert_eq!(ticks, ["0", "2", "0.2", "30", "100", "0.00123", "12346", "-1.5"]);
    }

    #[test]
    fn csv_fields_and_file_names_are_safe() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        let runs: Vec<RunReport> = ["x/y", "x_y", "..", ""].iter().map(|p| chosen_run(p)).collect();
        assert_eq!(file_stems(&runs), ["x_y", "x_y-2", "run", "run-2"]);
    }
}
