//! Workloads for the simulator: streams of request arrivals in time order.
//!
//! Every source here is an iterator of [`Arrival`]s with non-decreasing `at` (u64
//! nanoseconds from the start of the run), and every random choice comes from a
//! [`SimRng`] seeded by the caller, so a workload is a pure function of its inputs.
//! Synthetic sources are generated lazily: an hour at 1000 req/s costs no memory.
//!
//! - [`SyntheticSpec`] → [`Generator`]: Poisson, bursty (a target coefficient of
//!   variation of the inter-arrival times) and an optional diurnal rate shape.
//! - [`preset`]: synthetic shapes like the traces papers use (see [`PRESETS`]), and
//!   the per-second rate replays of [`super::rate_series`] (its `PRESETS`).
//! - [`RateSchedule`]: per-second rates from a file, Poisson within each second.
//! - [`azure_llm_trace`]: the Azure LLM inference trace 2023 (CSV).
//! - [`merge`]: several sources, each tagged with its stream, as one ordered stream.
//!
//! # Burstiness
//!
//! The target CV `c` of the gaps between arrivals picks the process:
//! - `c == 1`: Poisson (exponential gaps).
//! - `c < 1`: a gamma renewal process with shape `k = 1/c²` (Erlang-k when `k` is an
//!   integer): gaps with mean `1/rate` and CV exactly `c`. MMPPs cannot go below 1.
//! - `c > 1`: a two-state Markov-modulated Poisson process (MMPP-2). The process spends
//!   a fraction [`BURST_SHARE`] of the time in a burst state whose rate is `m` times
//!   the quiet state's; a burst lasts on average [`BURST_GAPS`] mean gaps (at the
//!   long-run rate). The quiet rate is `rate / (1 − s + s·m)` (with `s` the burst
//!   share), so the long-run mean rate is exactly `rate`; the switching rates are
//!   `rate / BURST_GAPS` out of a burst and `s/(1 − s)` times that into one. The
//!   multiplier `m` is solved by bisection so that the CV of the stationary
//!   inter-arrival time (from the MMPP's matrix-exponential moments) equals `c`; it
//!   grows from 1 (`c = 1`) through ≈ 2 (`c ≈ 1.05`), ≈ 10 (`c ≈ 1.55`) to ≈ 50
//!   (`c ≈ 3`, nearly on/off).
//!
//! # Diurnal shape
//!
//! A rate multiplier `1 + a·sin(2πt / period)` is applied by thinning: the base
//! process runs at the peak rate `rate·(1 + a)` and keeps an arrival at `t` with
//! probability `(1 + a·sin(2πt/period)) / (1 + a)`, so the mean rate over whole periods
//! is `rate`. The slow swing of the rate adds variance to the gaps (by the factor
//! `w = 1/√(1 − a²)` on their mean square), and thinning changes the base process, so
//! the base is chosen to make the overall gap CV `c` come out right (for a period much
//! longer than a gap):
//! - If `1 + c² ≤ 2w`, a renewal base with gap CV `c₀`, where
//!   `c₀² = 1 − (1 + a)·(2w − 1 − c²)` (thinning a renewal process with probability
//!   `p` gives local gap CV² `1 − p·(1 − c₀²)`; averaged over the swing this gives `c`).
//! - Otherwise an MMPP solved at the mean rate for the local CV `√((1 + c²)/w − 1)`,
//!   with its arrival rates (not its switching rates) scaled by `1 + a`: thinning it
//!   with probability `p` scales the arrival rates by `p`, which leaves the gap CV
//!   almost unchanged.
//!
//! Very regular arrivals are then out of reach: with `a = 0.1` the CV cannot go below
//! ≈ 0.32, and such a request is refused.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::f64::consts::TAU;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::iter::FusedIterator;
use std::path::Path;

use super::rate_series;
use super::rng::SimRng;

const NS_PER_SEC: f64 = 1e9;

/// Smallest supported target CV of inter-arrival times.
pub const MIN_CV: f64 = 0.3;
/// Largest supported target CV of inter-arrival times.
pub const MAX_CV: f64 = 3.0;
/// Fraction of the time a bursty (MMPP-2) process spends in its burst state.
pub const BURST_SHARE: f64 = 0.1;
/// Mean length of a burst of a bursty process, in mean gaps at its long-run rate.
pub const BURST_GAPS: f64 = 50.0;
/// Names accepted by [`preset`].
pub const PRESETS: [&str; 3] = ["wikipedia", "twitter", "azure-functions"];
/// Largest second a rate file may name (about 116 days), to refuse absurd files early.
const MAX_RATE_SECOND: u64 = 10_000_000;

/// One request arriving at the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Arrival {
    /// When it arrives, in nanoseconds from the start of the run.
    pub at: u64,
    /// The stream (application) it belongs to.
    pub stream: u32,
    /// Size of its input (prompt tokens for an LLM; 0 if unknown).
    pub input_size: u32,
    /// Tokens it is expected to generate (0 if unknown: the executor's default).
    pub expected_tokens: u32,
}

/// The sizes given to synthetic arrivals: log-normal with these means and CVs,
/// rounded to at least 1. A mean of 0 gives 0 ("unknown"); a CV of 0 gives the mean.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sizes {
    /// Mean of `input_size`.
    pub input_mean: f64,
    /// Coefficient of variation of `input_size`.
    pub input_cv: f64,
    /// Mean of `expected_tokens`.
    pub tokens_mean: f64,
    /// Coefficient of variation of `expected_tokens`.
    pub tokens_cv: f64,
}

impl Sizes {
    /// Every arrival gets exactly these sizes.
    pub fn fixed(input_size: u32, expected_tokens: u32) -> Self {
        Self { input_mean: input_size.into(), input_cv: 0.0, tokens_mean: expected_tokens.into(), tokens_cv: 0.0 }
    }

    /// Sizes like the Azure LLM 2023 code trace (`code.csv`): prompts of mean 2048
    /// tokens (CV 0.96), outputs of mean 28 tokens (CV 2.1).
    pub fn azure_code() -> Self {
        Self { input_mean: 2048.0, input_cv: 0.96, tokens_mean: 28.0, tokens_cv: 2.1 }
    }

    /// Draw `(input_size, expected_tokens)`.
    fn sample(&self, rng: &mut SimRng) -> (u32, u32) {
        (draw_size(rng, self.input_mean, self.input_cv), draw_size(rng, self.tokens_mean, self.tokens_cv))
    }
}

/// One log-normal size, or 0 for a mean of 0 (without drawing).
fn draw_size(rng: &mut SimRng, mean: f64, cv: f64) -> u32 {
    if mean <= 0.0 {
        return 0;
    }
    // `as` saturates, so huge draws become u32::MAX.
    rng.lognormal_with_mean_cv(mean, cv).round().max(1.0) as u32
}

// ---------------------------------------------------------------------------------
// Point processes (times in seconds)
// ---------------------------------------------------------------------------------

/// A point process: successive arrival times in seconds from the start, or `None`
/// once it has ended.
trait PointProcess: fmt::Debug + Send {
    /// The next arrival time, not before the previous one.
    fn next_time(&mut self, rng: &mut SimRng) -> Option<f64>;
}

/// The distribution of the gaps of a renewal process.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gap {
    /// Exponential gaps (Poisson process).
    Exponential { mean: f64 },
    /// Gamma gaps with this shape and scale.
    Gamma { shape: f64, scale: f64 },
}

impl Gap {
    /// Gaps with mean `1/rate` and coefficient of variation `cv` (at most 1).
    fn with_rate_cv(rate: f64, cv: f64) -> Self {
        if (cv - 1.0).abs() < 1e-9 {
            Gap::Exponential { mean: 1.0 / rate }
        } else {
            let shape = 1.0 / (cv * cv);
            Gap::Gamma { shape, scale: 1.0 / (rate * shape) }
        }
    }

    fn sample(self, rng: &mut SimRng) -> f64 {
        match self {
            Gap::Exponential { mean } => rng.exponential(mean),
            Gap::Gamma { shape, scale } => rng.gamma(shape, scale),
        }
    }
}

/// A renewal process: independent, identically distributed gaps.
#[derive(Debug)]
struct Renewal {
    t: f64,
    gap: Gap,
}

impl PointProcess for Renewal {
    fn next_time(&mut self, rng: &mut SimRng) -> Option<f64> {
        self.t += self.gap.sample(rng);
        Some(self.t)
    }
}

/// The parameters of a two-state Markov-modulated Poisson process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct MmppParams {
    /// Arrival rate in the quiet (0) and burst (1) state, per second.
    rates: [f64; 2],
    /// Rate of leaving the quiet (0) and burst (1) state, per second.
    leave: [f64; 2],
}

impl MmppParams {
    /// The documented structure with mean rate `rate` and burst multiplier `m`.
    fn with_multiplier(rate: f64, m: f64) -> Self {
        let quiet = rate / (1.0 - BURST_SHARE + BURST_SHARE * m);
        let leave_burst = rate / BURST_GAPS;
        let leave_quiet = leave_burst * BURST_SHARE / (1.0 - BURST_SHARE);
        Self { rates: [quiet, quiet * m], leave: [leave_quiet, leave_burst] }
    }

    /// Solve the burst multiplier so the stationary inter-arrival CV is `cv` (≥ 1).
    fn solve(rate: f64, cv: f64) -> Result<Self, String> {
        let gap_cv = |log_m: f64| Self::with_multiplier(rate, log_m.exp()).gap_moments().1;
        let (mut lo, mut hi) = (0.0f64, 1e6f64.ln());
        if gap_cv(hi) < cv {
            return Err(format!("a CV of {cv} is beyond what the bursty process can reach"));
        }
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if gap_cv(mid) < cv {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Self::with_multiplier(rate, (0.5 * (lo + hi)).exp()))
    }

    /// The same switching with every arrival rate multiplied by `factor` (thinning
    /// with probability `1/factor` gives these parameters back).
    fn with_rates_scaled(self, factor: f64) -> Self {
        Self { rates: self.rates.map(|r| r * factor), ..self }
    }

    /// Mean and CV of the stationary inter-arrival time.
    ///
    /// With `D0 = Q − Λ` the gap after an arrival is phase-type with initial vector
    /// `φ = πΛ / πλ`; `E[X] = φ(−D0)⁻¹1` and `E[X²] = 2φ(−D0)⁻²1`.
    fn gap_moments(&self) -> (f64, f64) {
        let [l0, l1] = self.rates;
        let [r0, r1] = self.leave;
        // M = (−D0)⁻¹ for −D0 = [[l0 + r0, −r0], [−r1, l1 + r1]].
        let det = (l0 + r0) * (l1 + r1) - r0 * r1;
        let m = [[(l1 + r1) / det, r0 / det], [r1 / det, (l0 + r0) / det]];
        // Stationary state probabilities are proportional to (r1, r0).
        let weights = [r1 * l0, r0 * l1];
        let total = weights[0] + weights[1];
        let phi = [weights[0] / total, weights[1] / total];
        let m1 = [m[0][0] + m[0][1], m[1][0] + m[1][1]];
        let m2 = [m[0][0] * m1[0] + m[0][1] * m1[1], m[1][0] * m1[0] + m[1][1] * m1[1]];
        let mean = phi[0] * m1[0] + phi[1] * m1[1];
        let second = 2.0 * (phi[0] * m2[0] + phi[1] * m2[1]);
        (mean, (second / (mean * mean) - 1.0).max(0.0).sqrt())
    }
}

/// A running MMPP-2.
#[derive(Debug)]
struct Mmpp {
    t: f64,
    state: usize,
    params: MmppParams,
}

impl Mmpp {
    /// Starts in a state drawn from the stationary distribution.
    fn new(params: MmppParams, rng: &mut SimRng) -> Self {
        let [r0, r1] = params.leave;
        let state = usize::from(rng.uniform() < r0 / (r0 + r1));
        Self { t: 0.0, state, params }
    }
}

impl PointProcess for Mmpp {
    fn next_time(&mut self, rng: &mut SimRng) -> Option<f64> {
        loop {
            let rate = self.params.rates[self.state];
            let leave = self.params.leave[self.state];
            self.t += rng.exponential(1.0 / (rate + leave));
            if rng.uniform() * (rate + leave) < rate {
                return Some(self.t);
            }
            self.state = 1 - self.state;
        }
    }
}

/// Poisson arrivals at a piecewise-constant rate, one rate per second.
#[derive(Debug)]
struct PiecewisePoisson {
    rates: Vec<f64>,
    second: usize,
    t: f64,
}

impl PointProcess for PiecewisePoisson {
    fn next_time(&mut self, rng: &mut SimRng) -> Option<f64> {
        while let Some(&rate) = self.rates.get(self.second) {
            if rate > 0.0 {
                self.t += rng.exponential(1.0 / rate);
                if self.t < (self.second + 1) as f64 {
                    return Some(self.t);
                }
            }
            // Memorylessness: restart cleanly at the next second's boundary.
            self.second += 1;
            self.t = self.second as f64;
        }
        None
    }
}

/// A process thinned by the diurnal multiplier `1 + a·sin(2πt / period)`.
#[derive(Debug)]
struct Thinned {
    inner: Box<dyn PointProcess>,
    amplitude: f64,
    period_s: f64,
}

impl PointProcess for Thinned {
    fn next_time(&mut self, rng: &mut SimRng) -> Option<f64> {
        loop {
            let t = self.inner.next_time(rng)?;
            let multiplier = 1.0 + self.amplitude * (TAU * t / self.period_s).sin();
            if rng.uniform() * (1.0 + self.amplitude) < multiplier {
                return Some(t);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Generator
// ---------------------------------------------------------------------------------

/// A lazily generated stream of arrivals (synthetic or from a [`RateSchedule`]).
///
/// Arrival times and sizes come from separate child streams of the seed, so changing
/// [`Sizes`] does not move any arrival.
#[derive(Debug)]
pub struct Generator {
    process: Box<dyn PointProcess>,
    times: SimRng,
    size_rng: SimRng,
    sizes: Sizes,
    stream: u32,
    /// Arrivals at or after this instant (ns) are not produced.
    end: u64,
    finished: bool,
}

impl Generator {
    fn new(seed: u64, end: u64, make: impl FnOnce(&mut SimRng) -> Box<dyn PointProcess>) -> Self {
        let mut root = SimRng::new(seed);
        let mut times = root.fork(0);
        let size_rng = root.fork(1);
        let process = make(&mut times);
        Self { process, times, size_rng, sizes: Sizes::default(), stream: 0, end, finished: false }
    }

    /// The same arrivals, with sizes drawn from `sizes` (default: all 0).
    #[must_use]
    pub fn with_sizes(mut self, sizes: Sizes) -> Self {
        self.sizes = sizes;
        self
    }

    /// The same arrivals, tagged with `stream` (default 0).
    #[must_use]
    pub fn with_stream(mut self, stream: u32) -> Self {
        self.stream = stream;
        self
    }
}

impl Iterator for Generator {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        if self.finished {
            return None;
        }
        let at = self.process.next_time(&mut self.times).map(seconds_to_ns).filter(|&at| at < self.end);
        let Some(at) = at else {
            self.finished = true;
            return None;
        };
        let (input_size, expected_tokens) = self.sizes.sample(&mut self.size_rng);
        Some(Arrival { at, stream: self.stream, input_size, expected_tokens })
    }
}

impl FusedIterator for Generator {}

/// Seconds to whole nanoseconds (rounding down; monotone, so order is kept).
fn seconds_to_ns(t: f64) -> u64 {
    (t * NS_PER_SEC) as u64
}

// ---------------------------------------------------------------------------------
// Synthetic workloads
// ---------------------------------------------------------------------------------

/// A diurnal rate shape: the rate is multiplied by `1 + amplitude·sin(2πt / period)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diurnal {
    /// Relative swing of the rate, in `[0, 1)`.
    pub amplitude: f64,
    /// Length of one cycle, in nanoseconds.
    pub period: u64,
}

/// A synthetic arrival process: mean rate, burstiness, length and optional diurnal
/// shape (see the module documentation for how each is realised).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticSpec {
    /// Long-run mean rate, requests per second.
    pub rate: f64,
    /// Target coefficient of variation of the inter-arrival times, in
    /// [[`MIN_CV`], [`MAX_CV`]]; 1 is Poisson.
    pub cv: f64,
    /// Arrivals are produced in `[0, duration)` nanoseconds.
    pub duration: u64,
    /// Optional diurnal rate shape.
    pub diurnal: Option<Diurnal>,
}

impl SyntheticSpec {
    /// Poisson arrivals at `rate` per second for `duration` nanoseconds.
    pub fn poisson(rate: f64, duration: u64) -> Self {
        Self::bursty(rate, 1.0, duration)
    }

    /// Arrivals at `rate` per second whose gaps have coefficient of variation `cv`.
    pub fn bursty(rate: f64, cv: f64, duration: u64) -> Self {
        Self { rate, cv, duration, diurnal: None }
    }

    /// The same process with the diurnal multiplier `1 + amplitude·sin(2πt / period)`.
    #[must_use]
    pub fn with_diurnal(mut self, amplitude: f64, period: u64) -> Self {
        self.diurnal = Some(Diurnal { amplitude, period });
        self
    }

    /// Check the parameters and start generating with `seed`.
    pub fn build(&self, seed: u64) -> Result<Generator, String> {
        self.validate()?;
        let amplitude = self.diurnal.map_or(0.0, |d| d.amplitude);
        let base = BaseProcess::for_target(self.rate, self.cv, amplitude)?;
        let diurnal = self.diurnal;
        Ok(Generator::new(seed, self.duration, |rng| {
            let process = base.start(rng);
            match diurnal {
                Some(d) => Box::new(Thinned { inner: process, amplitude, period_s: d.period as f64 / NS_PER_SEC }),
                None => process,
            }
        }))
    }

    fn validate(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(format!("rate must be a positive number of requests per second, got {}", self.rate));
        }
        if !(MIN_CV..=MAX_CV).contains(&self.cv) {
            return Err(format!("inter-arrival CV must be in [{MIN_CV}, {MAX_CV}], got {}", self.cv));
        }
        if let Some(d) = self.diurnal {
            if !(0.0..1.0).contains(&d.amplitude) {
                return Err(format!("diurnal amplitude must be in [0, 1), got {}", d.amplitude));
            }
            if d.period == 0 {
                return Err("diurnal period must be positive".to_string());
            }
        }
        Ok(())
    }
}

/// The process that runs before diurnal thinning.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BaseProcess {
    /// A renewal process (gamma or exponential gaps).
    Renewal(Gap),
    /// A bursty MMPP-2.
    Mmpp(MmppParams),
}

impl BaseProcess {
    /// The base process for mean rate `rate`, gap CV `cv` and diurnal amplitude `a`
    /// (0: none); it runs at the peak rate `rate·(1 + a)` (the formulas are in the
    /// module documentation).
    fn for_target(rate: f64, cv: f64, a: f64) -> Result<Self, String> {
        let swing = 1.0 / (1.0 - a * a).sqrt();
        let target_sq = cv * cv;
        if 1.0 + target_sq > 2.0 * swing + 1e-12 {
            let local_cv = ((1.0 + target_sq) / swing - 1.0).sqrt();
            return Ok(Self::Mmpp(MmppParams::solve(rate, local_cv)?.with_rates_scaled(1.0 + a)));
        }
        let base_sq = 1.0 - (1.0 + a) * (2.0 * swing - 1.0 - target_sq);
        if base_sq < 1e-4 {
            let floor = (2.0 * swing - 1.0 / (1.0 + a) - 1.0).sqrt();
            return Err(format!(
                "an inter-arrival CV of {cv} is out of reach with diurnal amplitude {a} (its swing alone gives CV ≥ {floor:.2})"
            ));
        }
        Ok(Self::Renewal(Gap::with_rate_cv(rate * (1.0 + a), base_sq.sqrt())))
    }

    /// A running instance, starting at time 0.
    fn start(self, rng: &mut SimRng) -> Box<dyn PointProcess> {
        match self {
            Self::Renewal(gap) => Box::new(Renewal { t: 0.0, gap }),
            Self::Mmpp(params) => Box::new(Mmpp::new(params, rng)),
        }
    }
}

/// The shape of a preset: target CV and diurnal amplitude.
struct PresetShape {
    name: &'static str,
    cv: f64,
    amplitude: f64,
}

/// The presets, in the order of [`PRESETS`].
const PRESET_SHAPES: [PresetShape; 3] = [
    // Wikipedia page views: smooth, more regular than Poisson, mild daily swing.
    PresetShape { name: "wikipedia", cv: 0.47, amplitude: 0.1 },
    // Twitter: nearly Poisson gaps, with rate bursts (≈ 2× the quiet rate, 10% of the
    // time) and a marked daily swing.
    PresetShape { name: "twitter", cv: 1.08, amplitude: 0.2 },
    // Azure Functions invocations: bursty, no daily swing within a run.
    PresetShape { name: "azure-functions", cv: 1.3, amplitude: 0.0 },
];

/// The synthetic spec of preset `name` at mean `rate` req/s for `duration` ns.
///
/// | preset            | gap CV | process                          | diurnal amplitude |
/// |-------------------|--------|----------------------------------|-------------------|
/// | `wikipedia`       | 0.47   | gamma renewal                    | 0.1               |
/// | `twitter`         | 1.08   | MMPP, bursts ≈ 2× the quiet rate | 0.2               |
/// | `azure-functions` | 1.3    | MMPP, bursts ≈ 6× the quiet rate | none              |
///
/// A run is treated as one compressed day: the diurnal period is `duration`, so the
/// mean rate over the run is `rate` and its shape shows in runs of any length.
pub fn preset_spec(name: &str, rate: f64, duration: u64) -> Result<SyntheticSpec, String> {
    let shape = PRESET_SHAPES.iter().find(|p| p.name == name).ok_or_else(|| {
        format!("unknown workload preset {name:?}; the presets are: {}, {}", PRESETS.join(", "), rate_series::PRESETS.join(", "))
    })?;
    if duration == 0 {
        return Err(format!("workload preset {name:?} needs a positive duration"));
    }
    let spec = SyntheticSpec::bursty(rate, shape.cv, duration);
    Ok(if shape.amplitude > 0.0 { spec.with_diurnal(shape.amplitude, duration) } else { spec })
}

/// Arrivals of preset `name` (one of [`PRESETS`], or of [`rate_series::PRESETS`]) at
/// mean `rate` req/s for `duration` ns, seeded by `seed`.
pub fn preset(name: &str, rate: f64, duration: u64, seed: u64) -> Result<Generator, String> {
    if rate_series::is_preset(name) {
        return rate_series::preset(name, rate, duration, seed);
    }
    preset_spec(name, rate, duration)?.build(seed)
}

// ---------------------------------------------------------------------------------
// Rate files
// ---------------------------------------------------------------------------------

/// Request rates per second, read from a file; arrivals are Poisson within each
/// second at that second's rate.
///
/// The text has one rate per line (line `i` is second `i`), or CSV lines
/// `second,rate` with strictly increasing seconds (seconds not listed have rate 0).
/// Blank lines and `#` comments (whole-line or trailing) are ignored, and the first
/// line may be a header (a line with no number in it, e.g. `second,rate`).
#[derive(Debug, Clone, PartialEq)]
pub struct RateSchedule {
    rates: Vec<f64>,
}

/// Which of the two rate-file layouts a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RateLayout {
    RateOnly,
    SecondRate,
}

impl RateSchedule {
    /// Parse a rate file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut rates = Vec::new();
        let mut layout = None;
        let mut header_line = None;
        let mut seen_data = false;
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let first_data_line = !std::mem::replace(&mut seen_data, true);
            if first_data_line && fields.iter().all(|f| f.parse::<f64>().is_err()) {
                header_line = Some(line_no);
                continue;
            }
            let this_layout = match fields.len() {
                1 => RateLayout::RateOnly,
                2 => RateLayout::SecondRate,
                _ => return Err(format!("line {line_no}: expected `rate` or `second,rate`, got {line:?}")),
            };
            if *layout.get_or_insert(this_layout) != this_layout {
                return Err(format!("line {line_no}: mixes `rate` and `second,rate` lines"));
            }
            let rate = parse_rate(fields[fields.len() - 1], line_no)?;
            let second = match this_layout {
                RateLayout::RateOnly => rates.len() as u64,
                RateLayout::SecondRate => parse_second(fields[0], rates.len(), line_no)?,
            };
            rates.resize(second as usize, 0.0);
            rates.push(rate);
        }
        match (rates.is_empty(), header_line) {
            (true, Some(line_no)) => Err(format!("rate file has no rates (line {line_no} was read as a header)")),
            (true, None) => Err("rate file has no rates".to_string()),
            (false, _) => Ok(Self { rates }),
        }
    }

    /// A schedule of these per-second rates (from second 0); each must be finite
    /// and ≥ 0, and there must be at least one.
    pub fn from_rates(rates: Vec<f64>) -> Result<Self, String> {
        if rates.is_empty() {
            return Err("a rate schedule needs at least one second".to_string());
        }
        if let Some((second, rate)) = rates.iter().enumerate().find(|(_, r)| !(r.is_finite() && **r >= 0.0)) {
            return Err(format!("second {second}: rate {rate} must be a finite number ≥ 0"));
        }
        Ok(Self { rates })
    }

    /// Read and parse a rate file.
    pub fn from_path(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The rate of every second, from second 0.
    pub fn rates(&self) -> &[f64] {
        &self.rates
    }

    /// Length of the schedule in nanoseconds.
    pub fn duration(&self) -> u64 {
        self.rates.len() as u64 * NS_PER_SEC as u64
    }

    /// Poisson arrivals following the schedule, seeded by `seed`.
    pub fn arrivals(&self, seed: u64) -> Generator {
        self.arrivals_until(seed, self.duration())
    }

    /// Poisson arrivals following the schedule before `end` ns (or its end, if
    /// sooner), seeded by `seed`: the same arrivals as [`RateSchedule::arrivals`]
    /// up to `end`.
    pub fn arrivals_until(&self, seed: u64, end: u64) -> Generator {
        let rates = self.rates.clone();
        Generator::new(seed, end.min(self.duration()), |_| Box::new(PiecewisePoisson { rates, second: 0, t: 0.0 }))
    }
}

fn parse_rate(field: &str, line_no: usize) -> Result<f64, String> {
    let rate: f64 = field.parse().map_err(|_| format!("line {line_no}: rate {field:?} is not a number"))?;
    if !rate.is_finite() || rate < 0.0 {
        return Err(format!("line {line_no}: rate {field:?} must be a finite number ≥ 0"));
    }
    Ok(rate)
}

/// Parse the `second` field; it must come after the seconds already read (`next` is
/// the first second not yet filled).
fn parse_second(field: &str, next: usize, line_no: usize) -> Result<u64, String> {
    let second: u64 = field.parse().map_err(|_| format!("line {line_no}: second {field:?} is not a whole number"))?;
    if second < next as u64 {
        return Err(format!("line {line_no}: second {second} is not after the previous line's second"));
    }
    if second > MAX_RATE_SECOND {
        return Err(format!("line {line_no}: second {second} is beyond the limit of {MAX_RATE_SECOND}"));
    }
    Ok(second)
}

// ---------------------------------------------------------------------------------
// Azure LLM inference trace 2023
// ---------------------------------------------------------------------------------

/// How to read the Azure LLM trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AzureOptions {
    /// Divide every offset by this (2 replays the trace twice as fast); must be > 0.
    pub speed_up: f64,
    /// Read at most this many requests.
    pub limit: Option<usize>,
    /// The stream the arrivals are tagged with.
    pub stream: u32,
}

impl Default for AzureOptions {
    fn default() -> Self {
        Self { speed_up: 1.0, limit: None, stream: 0 }
    }
}

/// Column positions of the Azure trace's fields.
struct AzureColumns {
    timestamp: usize,
    context: usize,
    generated: usize,
    count: usize,
}

impl AzureColumns {
    fn from_header(header: &str) -> Result<Self, String> {
        let names: Vec<&str> = header.trim_start_matches('\u{feff}').split(',').map(str::trim).collect();
        let find = |wanted: &str| {
            names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(wanted))
                .ok_or_else(|| format!("line 1: the header lacks column {wanted} (expected TIMESTAMP,ContextTokens,GeneratedTokens)"))
        };
        Ok(Self { timestamp: find("TIMESTAMP")?, context: find("ContextTokens")?, generated: find("GeneratedTokens")?, count: names.len() })
    }
}

/// Parse the Azure LLM inference trace 2023 CSV (`TIMESTAMP,ContextTokens,
/// GeneratedTokens`): one arrival per row at its offset from the first row's
/// timestamp (divided by `speed_up`), with `input_size` = ContextTokens and
/// `expected_tokens` = GeneratedTokens. Timestamps must not decrease.
pub fn azure_llm_trace(reader: impl BufRead, options: &AzureOptions) -> Result<Vec<Arrival>, String> {
    if !(options.speed_up.is_finite() && options.speed_up > 0.0) {
        return Err(format!("speed-up must be a positive number, got {}", options.speed_up));
    }
    let mut lines = reader.lines().enumerate();
    let header = match lines.next() {
        Some((_, line)) => line.map_err(|e| format!("line 1: {e}"))?,
        None => return Err("the Azure trace is empty (expected a TIMESTAMP,ContextTokens,GeneratedTokens header)".into()),
    };
    let columns = AzureColumns::from_header(&header)?;
    let mut arrivals = Vec::new();
    let (mut first, mut previous) = (None, 0);
    for (index, line) in lines {
        if options.limit.is_some_and(|limit| arrivals.len() >= limit) {
            break;
        }
        let line_no = index + 1;
        let line = line.map_err(|e| format!("line {line_no}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let (time, input_size, expected_tokens) = parse_azure_row(&line, &columns).map_err(|e| format!("line {line_no}: {e}"))?;
        if time < previous {
            return Err(format!("line {line_no}: timestamp goes back in time"));
        }
        previous = time;
        let offset = time - *first.get_or_insert(time);
        let at = (offset as f64 / options.speed_up).round() as u64;
        arrivals.push(Arrival { at, stream: options.stream, input_size, expected_tokens });
    }
    Ok(arrivals)
}

/// [`azure_llm_trace`] on the file at `path`.
pub fn read_azure_llm_trace(path: &Path, options: &AzureOptions) -> Result<Vec<Arrival>, String> {
    let file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    azure_llm_trace(BufReader::new(file), options).map_err(|e| format!("{}: {e}", path.display()))
}

/// One row: (timestamp in ns since 1970-01-01, context tokens, generated tokens).
fn parse_azure_row(line: &str, columns: &AzureColumns) -> Result<(u64, u32, u32), String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() != columns.count {
        return Err(format!("expected {} fields, got {}: {line:?}", columns.count, fields.len()));
    }
    let time = parse_timestamp(fields[columns.timestamp])?;
    let count = |i: usize, name: &str| fields[i].parse::<u32>().map_err(|_| format!("{name} {:?} is not a whole number", fields[i]));
    Ok((time, count(columns.context, "ContextTokens")?, count(columns.generated, "GeneratedTokens")?))
}

/// Parse `YYYY-MM-DD HH:MM:SS[.fraction]` (or with a `T`; up to 9 fractional digits)
/// into nanoseconds since 1970-01-01 00:00:00, with no time zone.
pub fn parse_timestamp(text: &str) -> Result<u64, String> {
    let bad = || format!("timestamp {text:?} is not `YYYY-MM-DD HH:MM:SS[.fraction]`");
    let (date, time) = text.split_once([' ', 'T']).ok_or_else(bad)?;
    let [year, month, day] = split_numbers(date, '-').ok_or_else(bad)?;
    let (clock, fraction) = time.split_once('.').map_or((time, None), |(clock, fraction)| (clock, Some(fraction)));
    let [hour, minute, second] = split_numbers(clock, ':').ok_or_else(bad)?;
    let nanos = fraction.map_or(Some(0), parse_fraction).ok_or_else(bad)?;
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=days_in_month(year, month)).contains(&day) {
        return Err(format!("timestamp {text:?} has an invalid date"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!("timestamp {text:?} has an invalid time of day"));
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second;
    Ok(seconds * 1_000_000_000 + nanos)
}

/// Three unsigned numbers separated by `separator`.
fn split_numbers(text: &str, separator: char) -> Option<[u64; 3]> {
    let mut parts = text.split(separator);
    let mut next = || parts.next().filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?.parse().ok();
    let numbers = [next()?, next()?, next()?];
    parts.next().is_none().then_some(numbers)
}

/// Fractional seconds (1–9 digits) as nanoseconds.
fn parse_fraction(digits: &str) -> Option<u64> {
    if !(1..=9).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    format!("{digits:0<9}").parse().ok()
}

fn is_leap_year(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date (year ≥ 1970), after Howard Hinnant's
/// `days_from_civil`.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

// ---------------------------------------------------------------------------------
// Merging streams
// ---------------------------------------------------------------------------------

/// Several arrival sources merged into one time-ordered stream (a k-way merge on a
/// small heap). Ties in time go to the lower stream id, then the earlier source.
#[derive(Debug)]
pub struct Merge<I> {
    sources: Vec<(u32, I)>,
    /// (time, stream, source index) of each source's next arrival.
    heap: BinaryHeap<Reverse<(u64, u32, usize)>>,
    /// The next arrival of each source, already tagged.
    heads: Vec<Option<Arrival>>,
}

/// Merge `(stream, source)` pairs: every arrival of a source is tagged with its
/// stream. Each source must be in non-decreasing time order.
pub fn merge<I: Iterator<Item = Arrival>>(sources: impl IntoIterator<Item = (u32, I)>) -> Merge<I> {
    let sources: Vec<(u32, I)> = sources.into_iter().collect();
    let mut merged = Merge { heap: BinaryHeap::with_capacity(sources.len()), heads: vec![None; sources.len()], sources };
    for index in 0..merged.sources.len() {
        merged.refill(index);
    }
    merged
}

impl<I: Iterator<Item = Arrival>> Merge<I> {
    /// Pull the next arrival of source `index` into the heap, if it has one.
    fn refill(&mut self, index: usize) {
        let (stream, source) = &mut self.sources[index];
        if let Some(arrival) = source.next() {
            debug_assert!(
                self.heads[index].is_none_or(|previous| previous.at <= arrival.at),
                "merge: source {index} (stream {stream}) went back in time"
            );
            let arrival = Arrival { stream: *stream, ..arrival };
            self.heap.push(Reverse((arrival.at, arrival.stream, index)));
            self.heads[index] = Some(arrival);
        }
    }
}

impl<I: Iterator<Item = Arrival>> Iterator for Merge<I> {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        let Reverse((_, _, index)) = self.heap.pop()?;
        let arrival = self.heads[index].expect("a source in the heap has a head");
        self.refill(index);
        Some(arrival)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    /// The real Azure LLM 2023 code trace.
    const AZURE_CODE_CSV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/azure-llm-2023/code.csv");

    fn gaps_cv(arrivals: &[Arrival]) -> f64 {
        let gaps: Vec<f64> = arrivals.windows(2).map(|w| (w[1].at - w[0].at) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        var.sqrt() / mean
    }

    fn measured_rate(arrivals: &[Arrival], duration: u64) -> f64 {
        arrivals.len() as f64 / (duration as f64 / NS_PER_SEC)
    }

    fn assert_ordered(arrivals: &[Arrival]) {
        assert!(arrivals.windows(2).all(|w| w[0].at <= w[1].at), "arrivals out of order");
    }

    fn assert_close(measured: f64, target: f64, tolerance: f64, what: &str) {
        assert!(
            (measured / target - 1.0).abs() <= tolerance,
            "{what}: measured {measured:.4}, target {target:.4} (±{:.0}%)",
            tolerance * 100.0
        );
    }

    /// Relative tolerance on the mean rate of a 300 s run: an MMPP (CV > 1) converges
    /// slowly, as such a run holds only about 600 burst cycles (3 standard deviations
    /// at CV 3 are ≈ 10%); renewal processes are within 2%.
    fn rate_tolerance(cv: f64) -> f64 {
        if cv > 1.0 {
            0.1
        } else {
            0.02
        }
    }

    fn generate(spec: SyntheticSpec, seed: u64) -> Vec<Arrival> {
        spec.build(seed).unwrap().collect()
    }

    // --- synthetic processes -------------------------------------------------

    #[test]
    fn poisson_has_rate_and_cv_one() {
        let duration = 200 * SEC;
        let arrivals = generate(SyntheticSpec::poisson(500.0, duration), 1);
        assert_ordered(&arrivals);
        assert!(arrivals.iter().all(|a| a.at < duration));
        assert_close(measured_rate(&arrivals, duration), 500.0, 0.02, "rate");
        assert_close(gaps_cv(&arrivals), 1.0, 0.03, "cv");
    }

    #[test]
    fn bursty_hits_rate_and_cv() {
        for (cv, seed) in [(0.3, 1), (0.5, 2), (1.0, 3), (1.5, 4), (2.0, 5), (3.0, 6)] {
            let duration = 300 * SEC;
            let arrivals = generate(SyntheticSpec::bursty(1000.0, cv, duration), seed);
            assert_ordered(&arrivals);
            assert_close(measured_rate(&arrivals, duration), 1000.0, rate_tolerance(cv), &format!("rate at cv {cv}"));
            assert_close(gaps_cv(&arrivals), cv, 0.1, "cv");
        }
    }

    #[test]
    fn mmpp_solution_has_requested_mean_and_cv() {
        for cv in [1.01, 1.05, 1.3, 2.0, 3.0, 4.0] {
            let params = MmppParams::solve(250.0, cv).unwrap();
            let (mean, solved) = params.gap_moments();
            assert_close(mean, 1.0 / 250.0, 1e-9, "mean gap");
            assert_close(solved, cv, 1e-6, "solved cv");
            let [quiet, burst] = params.rates;
            let share = params.leave[0] / (params.leave[0] + params.leave[1]);
            assert_close(share, BURST_SHARE, 1e-9, "burst share");
            assert_close(quiet * (1.0 - share) + burst * share, 250.0, 1e-9, "mean rate");
        }
    }

    #[test]
    fn mmpp_cv_grows_with_the_burst_multiplier() {
        let cvs: Vec<f64> =
            [1.0, 1.5, 2.0, 5.0, 20.0, 100.0].iter().map(|&m| MmppParams::with_multiplier(10.0, m).gap_moments().1).collect();
        assert!((cvs[0] - 1.0).abs() < 1e-9, "multiplier 1 is Poisson: {cvs:?}");
        assert!(cvs.windows(2).all(|w| w[0] < w[1]), "{cvs:?}");
    }

    #[test]
    fn unreachable_mmpp_cv_is_an_error() {
        assert!(MmppParams::solve(1.0, 50.0).unwrap_err().contains("beyond"));
    }

    #[test]
    fn diurnal_follows_the_sine() {
        let duration = 400 * SEC;
        let spec = SyntheticSpec::poisson(400.0, duration).with_diurnal(0.5, 100 * SEC);
        let arrivals = generate(spec, 7);
        assert_ordered(&arrivals);
        assert_close(measured_rate(&arrivals, duration), 400.0, 0.02, "mean rate");
        // Count arrivals per quarter of each period.
        let mut per_quarter = [0usize; 4];
        for a in &arrivals {
            per_quarter[((a.at % (100 * SEC)) / (25 * SEC)) as usize] += 1;
        }
        // Mean of 1 + 0.5·sin over each quarter: 1 ± 0.5·(2/π) (positive in the first
        // half, negative in the second).
        let quarter_expected = |sign: f64| 400.0 * 100.0 * (1.0 + sign * 0.5 * 2.0 / std::f64::consts::PI);
        for (quarter, &count) in per_quarter.iter().enumerate() {
            let sign = if quarter < 2 { 1.0 } else { -1.0 };
            assert_close(count as f64, quarter_expected(sign), 0.03, &format!("quarter {quarter}"));
        }
    }

    #[test]
    fn diurnal_keeps_the_target_cv() {
        for (cv, amplitude) in [(0.5, 0.1), (1.0, 0.3), (2.0, 0.3)] {
            let duration = 300 * SEC;
            let spec = SyntheticSpec::bursty(1000.0, cv, duration).with_diurnal(amplitude, duration / 3);
            let arrivals = generate(spec, 8);
            assert_close(measured_rate(&arrivals, duration), 1000.0, rate_tolerance(cv), "rate");
            assert_close(gaps_cv(&arrivals), cv, 0.1, &format!("cv {cv} with amplitude {amplitude}"));
        }
    }

    #[test]
    fn base_process_without_diurnal_is_the_target() {
        assert_eq!(BaseProcess::for_target(4.0, 1.0, 0.0), Ok(BaseProcess::Renewal(Gap::Exponential { mean: 0.25 })));
        let Ok(BaseProcess::Renewal(Gap::Gamma { shape, scale })) = BaseProcess::for_target(4.0, 0.5, 0.0) else {
            panic!("CV < 1 is a gamma renewal process");
        };
        assert!((shape - 4.0).abs() < 1e-9 && (shape * scale - 0.25).abs() < 1e-9, "{shape} {scale}");
        let Ok(BaseProcess::Mmpp(params)) = BaseProcess::for_target(4.0, 2.0, 0.0) else {
            panic!("CV > 1 is an MMPP");
        };
        assert_eq!(params, MmppParams::solve(4.0, 2.0).unwrap());
    }

    #[test]
    fn base_process_compensates_for_diurnal_thinning() {
        // Renewal: inverting the documented formula gives back the target.
        for (target, a) in [(0.47, 0.1), (1.0, 0.25), (1.05, 0.5)] {
            let Ok(BaseProcess::Renewal(Gap::Gamma { shape, scale })) = BaseProcess::for_target(10.0, target, a) else {
                panic!("{target} with amplitude {a} should be a gamma renewal process");
            };
            assert!((shape * scale - 1.0 / (10.0 * (1.0 + a))).abs() < 1e-12, "runs at the peak rate");
            let c0_sq = 1.0 / shape;
            let back = (2.0 / (1.0 - a * a).sqrt() - (1.0 - c0_sq) / (1.0 + a) - 1.0).sqrt();
            assert!((back - target).abs() < 1e-9, "{back} vs {target}");
        }
        // MMPP: thinned back to the mean rate, its local CV makes up the target.
        let a = 0.3;
        let Ok(BaseProcess::Mmpp(peak)) = BaseProcess::for_target(10.0, 2.0, a) else { panic!("an MMPP") };
        let (mean, local_cv) = peak.with_rates_scaled(1.0 / (1.0 + a)).gap_moments();
        assert!((mean - 0.1).abs() < 1e-12, "{mean}");
        let total_sq = (1.0 + local_cv * local_cv) / (1.0 - a * a).sqrt() - 1.0;
        assert!((total_sq.sqrt() - 2.0).abs() < 1e-6, "{total_sq}");
        let error = BaseProcess::for_target(10.0, 0.3, 0.5).unwrap_err();
        assert!(error.contains("out of reach"), "{error}");
    }

    #[test]
    fn invalid_specs_are_refused() {
        let cases = [
            (SyntheticSpec::poisson(0.0, SEC), "rate"),
            (SyntheticSpec::poisson(f64::NAN, SEC), "rate"),
            (SyntheticSpec::bursty(10.0, 0.2, SEC), "CV"),
            (SyntheticSpec::bursty(10.0, 3.5, SEC), "CV"),
            (SyntheticSpec::poisson(10.0, SEC).with_diurnal(1.0, SEC), "amplitude"),
            (SyntheticSpec::poisson(10.0, SEC).with_diurnal(0.5, 0), "period"),
        ];
        for (spec, needle) in cases {
            let error = spec.build(1).unwrap_err();
            assert!(error.contains(needle), "{spec:?}: {error}");
        }
    }

    #[test]
    fn same_seed_same_sequence_different_seed_different() {
        for spec in [
            SyntheticSpec::poisson(100.0, 10 * SEC),
            SyntheticSpec::bursty(100.0, 0.5, 10 * SEC),
            SyntheticSpec::bursty(100.0, 2.0, 10 * SEC).with_diurnal(0.3, 5 * SEC),
        ] {
            let with_sizes = |seed| spec.build(seed).unwrap().with_sizes(Sizes::azure_code()).collect::<Vec<_>>();
            let a = with_sizes(42);
            assert!(a.len() > 500);
            assert_eq!(a, with_sizes(42));
            let b = with_sizes(43);
            assert_ne!(a.iter().map(|x| x.at).collect::<Vec<_>>(), b.iter().map(|x| x.at).collect::<Vec<_>>());
        }
    }

    #[test]
    fn sizes_do_not_move_arrivals() {
        let spec = SyntheticSpec::bursty(200.0, 1.5, 20 * SEC);
        let plain: Vec<Arrival> = spec.build(5).unwrap().collect();
        let sized: Vec<Arrival> = spec.build(5).unwrap().with_sizes(Sizes::azure_code()).with_stream(3).collect();
        assert_eq!(plain.len(), sized.len());
        assert!(plain.iter().zip(&sized).all(|(p, s)| p.at == s.at && s.stream == 3));
        assert!(plain.iter().all(|a| a.input_size == 0 && a.expected_tokens == 0 && a.stream == 0));
    }

    #[test]
    fn sizes_have_requested_means() {
        let sized: Vec<Arrival> = SyntheticSpec::poisson(1000.0, 100 * SEC).build(9).unwrap().with_sizes(Sizes::azure_code()).collect();
        let mean = |f: fn(&Arrival) -> u32| sized.iter().map(|a| f(a) as f64).sum::<f64>() / sized.len() as f64;
        assert_close(mean(|a| a.input_size), 2048.0, 0.03, "input mean");
        assert_close(mean(|a| a.expected_tokens), 28.0, 0.1, "tokens mean");
        assert!(sized.iter().all(|a| a.input_size >= 1 && a.expected_tokens >= 1));
        let fixed: Vec<Arrival> = SyntheticSpec::poisson(100.0, SEC).build(1).unwrap().with_sizes(Sizes::fixed(64, 16)).collect();
        assert!(fixed.iter().all(|a| a.input_size == 64 && a.expected_tokens == 16));
    }

    #[test]
    fn generator_is_fused_and_respects_duration() {
        let mut generator = SyntheticSpec::poisson(1000.0, SEC / 10).build(3).unwrap();
        let count = generator.by_ref().count();
        assert!((60..=140).contains(&count), "{count}");
        assert_eq!(generator.next(), None);
        assert_eq!(SyntheticSpec::poisson(1000.0, 0).build(3).unwrap().count(), 0);
    }

    #[test]
    fn sources_can_move_between_threads() {
        fn assert_send<T: Send>() {}
        assert_send::<Generator>();
        assert_send::<Merge<Generator>>();
    }

    #[test]
    fn an_hour_at_a_thousand_per_second_streams() {
        // Only the first arrivals are drawn; nothing proportional to the hour is built.
        let first: Vec<Arrival> = SyntheticSpec::poisson(1000.0, 3600 * SEC).build(1).unwrap().take(10).collect();
        assert_eq!(first.len(), 10);
        assert!(first[9].at < SEC);
    }

    // --- presets ---------------------------------------------------------------

    #[test]
    fn presets_hit_their_rate_and_cv() {
        // The CVs the papers report for these traces.
        let nominal = [("wikipedia", 0.47), ("twitter", 1.0), ("azure-functions", 1.3)];
        for ((name, cv), shape) in nominal.into_iter().zip(&PRESET_SHAPES) {
            let duration = 300 * SEC;
            let arrivals: Vec<Arrival> = preset(name, 800.0, duration, 11).unwrap().collect();
            assert_ordered(&arrivals);
            let rate = measured_rate(&arrivals, duration);
            assert_close(rate, 800.0, rate_tolerance(shape.cv), &format!("{name} rate"));
            assert_close(gaps_cv(&arrivals), cv, 0.15, &format!("{name} cv"));
            assert_close(gaps_cv(&arrivals), shape.cv, 0.05, &format!("{name} cv against its own target"));
        }
    }

    #[test]
    fn presets_are_all_listed_and_shaped() {
        let names: Vec<&str> = PRESET_SHAPES.iter().map(|p| p.name).collect();
        assert_eq!(names, PRESETS);
        let wikipedia = preset_spec("wikipedia", 10.0, 60 * SEC).unwrap();
        assert_eq!(wikipedia.diurnal, Some(Diurnal { amplitude: 0.1, period: 60 * SEC }));
        assert_eq!(preset_spec("azure-functions", 10.0, 60 * SEC).unwrap().diurnal, None);
    }

    #[test]
    fn unknown_preset_lists_the_names() {
        let error = preset("wikipedai", 10.0, SEC, 1).unwrap_err();
        assert!(error.contains("wikipedai"), "{error}");
        for name in PRESETS {
            assert!(error.contains(name), "{error}");
        }
        assert!(preset("twitter", 10.0, 0, 1).unwrap_err().contains("duration"));
    }

    // --- rate files -------------------------------------------------------------

    #[test]
    fn rate_file_one_rate_per_line() {
        let schedule = RateSchedule::parse("# per-second rates\n10\n\n20.5  # busy\n0\n").unwrap();
        assert_eq!(schedule.rates(), [10.0, 20.5, 0.0]);
        assert_eq!(schedule.duration(), 3 * SEC);
    }

    #[test]
    fn rate_file_csv_with_header_and_gaps() {
        let schedule = RateSchedule::parse("second,rate\n0,5\n1, 6\n# skip\n4,7\n").unwrap();
        assert_eq!(schedule.rates(), [5.0, 6.0, 0.0, 0.0, 7.0]);
        let header_only_rates = RateSchedule::parse("rate\n1\n2\n").unwrap();
        assert_eq!(header_only_rates.rates(), [1.0, 2.0]);
    }

    #[test]
    fn rate_file_errors_name_the_line() {
        let cases = [
            ("10\nabc\n", "line 2: rate \"abc\" is not a number"),
            ("10\n-1\n", "line 2: rate \"-1\""),
            ("10\ninf\n", "line 2: rate \"inf\""),
            ("0,1\n1,2,3\n", "line 2: expected `rate` or `second,rate`"),
            ("0,1\n5\n", "line 2: mixes"),
            ("# c\n0,1\n0,2\n", "line 3: second 0 is not after"),
            ("0,1\n1.5,2\n", "line 2: second \"1.5\" is not a whole number"),
            ("x,1\n", "line 1: second \"x\""),
            ("second,rate\nsecond,rate\n", "line 2: rate \"rate\" is not a number"),
            ("99999999999,1\n", "line 1: second 99999999999 is beyond"),
            ("# nothing\n\n", "no rates"),
            ("abc\n", "no rates (line 1 was read as a header)"),
        ];
        for (text, expected) in cases {
            let error = RateSchedule::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: got {error:?}, expected {expected:?}");
        }
    }

    #[test]
    fn rate_file_arrivals_follow_each_second() {
        let schedule = RateSchedule::parse("0,2000\n1,0\n2,500\n3,4000\n").unwrap();
        let arrivals: Vec<Arrival> = schedule.arrivals(4).collect();
        assert_ordered(&arrivals);
        let mut per_second = [0usize; 4];
        for a in &arrivals {
            per_second[(a.at / SEC) as usize] += 1;
        }
        assert_eq!(per_second[1], 0);
        for (second, &rate) in schedule.rates().iter().enumerate().filter(|(_, &r)| r > 0.0) {
            // Poisson counts: 5 standard deviations.
            let tolerance = 5.0 * rate.sqrt() / rate;
            assert_close(per_second[second] as f64, rate, tolerance, &format!("second {second}"));
        }
        assert_eq!(arrivals, schedule.arrivals(4).collect::<Vec<_>>());
        assert_ne!(arrivals, schedule.arrivals(5).collect::<Vec<_>>());
    }

    #[test]
    fn rate_schedule_from_rates_checks_and_cuts_at_the_end() {
        let schedule = RateSchedule::from_rates(vec![1000.0, 0.0, 3000.0]).unwrap();
        assert_eq!(schedule.duration(), 3 * SEC);
        let all: Vec<Arrival> = schedule.arrivals(2).collect();
        let cut: Vec<Arrival> = schedule.arrivals_until(2, 2 * SEC + SEC / 2).collect();
        let expected: Vec<Arrival> = all.iter().copied().filter(|a| a.at < 2 * SEC + SEC / 2).collect();
        assert_eq!(cut, expected);
        assert!(cut.len() < all.len() && cut.iter().any(|a| a.at >= 2 * SEC));
        assert_eq!(schedule.arrivals_until(2, 10 * SEC).count(), all.len(), "no arrivals past the schedule");
        assert!(RateSchedule::from_rates(vec![]).unwrap_err().contains("at least one"));
        assert!(RateSchedule::from_rates(vec![1.0, f64::NAN]).unwrap_err().contains("second 1"));
        assert!(RateSchedule::from_rates(vec![-1.0]).unwrap_err().contains("second 0"));
    }

    #[test]
    fn rate_file_from_path_reports_the_path() {
        let error = RateSchedule::from_path(Path::new("/no/such/rates.txt")).unwrap_err();
        assert!(error.contains("/no/such/rates.txt"), "{error}");
    }

    // --- Azure trace -----------------------------------------------------------

    #[test]
    fn timestamps_parse_to_epoch_nanoseconds() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(parse_timestamp("1970-01-01T00:00:01.5"), Ok(1_500_000_000));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2023, 11, 16), 19_677);
        let t = parse_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        assert_eq!(t, (19_677 * 86_400 + 18 * 3_600 + 17 * 60 + 3) * SEC + 979_960_000);
        assert_eq!(parse_timestamp("2023-11-16 18:17:03.123456789").unwrap() % SEC, 123_456_789);
    }

    #[test]
    fn timestamps_roll_over_midnight_month_and_leap_day() {
        let gap = |a: &str, b: &str| parse_timestamp(b).unwrap() - parse_timestamp(a).unwrap();
        assert_eq!(gap("2023-11-16 23:59:59.9", "2023-11-17 00:00:00.1"), 200_000_000);
        assert_eq!(gap("2023-12-31 23:00:00", "2024-01-01 01:00:00"), 2 * 3_600 * SEC);
        assert_eq!(gap("2024-02-28 12:00:00", "2024-03-01 12:00:00"), 2 * 86_400 * SEC);
        assert_eq!(gap("2023-02-28 12:00:00", "2023-03-01 12:00:00"), 86_400 * SEC);
    }

    #[test]
    fn bad_timestamps_are_refused() {
        for text in [
            "2023-11-16",
            "2023-11-16 18:17",
            "2023/11/16 18:17:03",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:17:03.1234567890",
            "2023-11-16 18:17:03.12a",
            "2023-13-01 00:00:00",
            "2023-02-29 00:00:00",
            "2023-11-16 24:00:00",
            "2023-11-16 18:60:00",
            "2023-11-16 18:17:-3",
            "1969-12-31 23:59:59",
        ] {
            assert!(parse_timestamp(text).is_err(), "{text:?} parsed");
        }
    }

    const SMALL_AZURE: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
        2023-11-16 23:59:59.5000000,100,10\n\
        2023-11-16 23:59:59.7500000,200,20\n\
        2023-11-17 00:00:01.5000000,300,30\n";

    #[test]
    fn azure_small_trace_with_midnight() {
        let arrivals = azure_llm_trace(SMALL_AZURE.as_bytes(), &AzureOptions::default()).unwrap();
        let expected = [(0, 100, 10), (250_000_000, 200, 20), (2 * SEC, 300, 30)];
        let got: Vec<(u64, u32, u32)> = arrivals.iter().map(|a| (a.at, a.input_size, a.expected_tokens)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn azure_speed_up_limit_and_stream() {
        let options = AzureOptions { speed_up: 4.0, limit: Some(2), stream: 7 };
        let arrivals = azure_llm_trace(SMALL_AZURE.as_bytes(), &options).unwrap();
        assert_eq!(arrivals.len(), 2);
        assert_eq!(arrivals[1], Arrival { at: 62_500_000, stream: 7, input_size: 200, expected_tokens: 20 });
    }

    #[test]
    fn azure_columns_found_by_name() {
        let text = "GeneratedTokens,TIMESTAMP,ContextTokens\n5,2023-11-16 00:00:00,9\n";
        let arrivals = azure_llm_trace(text.as_bytes(), &AzureOptions::default()).unwrap();
        assert_eq!((arrivals[0].input_size, arrivals[0].expected_tokens), (9, 5));
    }

    #[test]
    fn azure_accepts_a_byte_order_mark_and_crlf() {
        let text = "\u{feff}TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 00:00:00.5,7,8\r\n";
        let arrivals = azure_llm_trace(text.as_bytes(), &AzureOptions::default()).unwrap();
        assert_eq!(arrivals, [Arrival { at: 0, stream: 0, input_size: 7, expected_tokens: 8 }]);
    }

    #[test]
    fn azure_errors_name_the_line() {
        let header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
        let cases = [
            (String::new(), "empty"),
            ("TIMESTAMP,Context,GeneratedTokens\n".to_string(), "line 1: the header lacks column ContextTokens"),
            (format!("{header}2023-11-16 00:00:00,1\n"), "line 2: expected 3 fields, got 2"),
            (format!("{header}2023-11-16 00:00:00,1,2\n2023-11-16 00:00:01,x,2\n"), "line 3: ContextTokens \"x\""),
            (format!("{header}2023-11-16 00:00:00,1,-2\n"), "line 2: GeneratedTokens \"-2\""),
            (format!("{header}2023-11-16 00:00:00,1,2\nyesterday,1,2\n"), "line 3: timestamp \"yesterday\""),
            (format!("{header}2023-11-16 00:00:01,1,2\n2023-11-16 00:00:00,1,2\n"), "line 3: timestamp goes back"),
        ];
        for (text, expected) in cases {
            let error = azure_llm_trace(text.as_bytes(), &AzureOptions::default()).unwrap_err();
            assert!(error.contains(expected), "{text:?}: got {error:?}, expected {expected:?}");
        }
        let bad_speed = AzureOptions { speed_up: 0.0, ..AzureOptions::default() };
        assert!(azure_llm_trace(SMALL_AZURE.as_bytes(), &bad_speed).unwrap_err().contains("speed-up"));
    }

    #[test]
    fn azure_real_code_trace() {
        let arrivals = read_azure_llm_trace(Path::new(AZURE_CODE_CSV), &AzureOptions::default()).unwrap();
        assert_eq!(arrivals.len(), 8819);
        assert_ordered(&arrivals);
        let head: Vec<(u64, u32, u32)> = arrivals[..4].iter().map(|a| (a.at, a.input_size, a.expected_tokens)).collect();
        assert_eq!(head, [(0, 4808, 10), (52_000_000, 3180, 8), (98_189_000, 110, 27), (140_684_000, 7433, 14)]);
        let last = arrivals.last().unwrap();
        assert_eq!((last.at, last.input_size, last.expected_tokens), (3_435_948_056_000, 549, 173));
        let fast = read_azure_llm_trace(Path::new(AZURE_CODE_CSV), &AzureOptions { speed_up: 2.0, limit: Some(100), stream: 0 }).unwrap();
        assert_eq!(fast.len(), 100);
        assert!(fast.iter().zip(&arrivals).all(|(f, a)| f.at == a.at / 2));
    }

    #[test]
    fn azure_missing_file_names_the_path() {
        let error = read_azure_llm_trace(Path::new("/no/such/code.csv"), &AzureOptions::default()).unwrap_err();
        assert!(error.contains("/no/such/code.csv"), "{error}");
    }

    // --- merging ---------------------------------------------------------------

    fn at(times: &[u64]) -> Vec<Arrival> {
        times.iter().map(|&at| Arrival { at, ..Arrival::default() }).collect()
    }

    #[test]
    fn merge_orders_and_tags_with_stream_ties_by_stream() {
        let merged: Vec<(u64, u32)> =
            merge([(2, at(&[1, 5, 5, 9]).into_iter()), (0, at(&[5, 6]).into_iter()), (1, at(&[0, 5]).into_iter())])
                .map(|a| (a.at, a.stream))
                .collect();
        assert_eq!(merged, [(0, 1), (1, 2), (5, 0), (5, 1), (5, 2), (5, 2), (6, 0), (9, 2)]);
    }

    #[test]
    fn merge_handles_empty_and_no_sources() {
        assert_eq!(merge(Vec::<(u32, std::vec::IntoIter<Arrival>)>::new()).count(), 0);
        let merged: Vec<Arrival> = merge([(0, at(&[]).into_iter()), (1, at(&[3]).into_iter())]).collect();
        assert_eq!(merged, [Arrival { at: 3, stream: 1, ..Arrival::default() }]);
    }

    #[test]
    fn merge_of_generators_is_ordered_complete_and_deterministic() {
        let sources = |seed: u64| -> Vec<(u32, Box<dyn Iterator<Item = Arrival> + Send>)> {
            vec![
                (0, Box::new(SyntheticSpec::poisson(300.0, 10 * SEC).build(seed).unwrap())),
                (1, Box::new(preset("azure-functions", 100.0, 10 * SEC, seed + 1).unwrap())),
                (2, Box::new(RateSchedule::parse("50\n150\n").unwrap().arrivals(seed + 2))),
            ]
        };
        let merged: Vec<Arrival> = merge(sources(1)).collect();
        assert_ordered(&merged);
        let per_stream = |s: u32| merged.iter().filter(|a| a.stream == s).count();
        let expected: Vec<usize> = sources(1).into_iter().map(|(_, source)| source.count()).collect();
        assert_eq!([per_stream(0), per_stream(1), per_stream(2)].to_vec(), expected);
        assert_eq!(merged, merge(sources(1)).collect::<Vec<_>>());
    }
}
