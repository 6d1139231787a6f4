//! The latency profiler: runs a model at each batch size (stack, run, split — what a
//! worker pays), measures replica start cold and warm, and writes the result as a
//! one-stage pipeline file in the simulator's TOML format (`profile_ms` points, start
//! times, memory), so a simulated cluster uses the numbers the real worker measured.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::InputSpec;
use crate::cache::ModelCache;
use crate::device::{self, Device};
use crate::error::{DataplaneError, Result};
use crate::runtime::Runtime;
use crate::session::{ModelSession, ModelSpec};
use crate::tensor::Tensor;

/// What to profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileOptions {
    /// Batch sizes to measure.
    pub batches: Vec<usize>,
    /// Per-request shape of each input (without batch dimension); `None` takes the
    /// model's own, which must then be fully fixed.
    pub shapes: Option<Vec<Vec<usize>>>,
    /// Unmeasured runs before each batch size.
    pub warmup: usize,
    /// Measured runs per batch size.
    pub iterations: usize,
    /// Intra-op threads (0: ONNX Runtime's default).
    pub threads: usize,
    /// Start measurements (cold and warm) to take the median of.
    pub start_repeats: usize,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions { batches: vec![1, 2, 4, 8], shapes: None, warmup: 3, iterations: 20, threads: 1, start_repeats: 3 }
    }
}

/// Latency of one batch size, milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilePoint {
    /// Batch size.
    pub batch: usize,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Runs measured.
    pub samples: usize,
}

/// A model's measured profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileReport {
    /// The model measured.
    pub spec: ModelSpec,
    /// Device it ran on.
    pub device: String,
    /// Intra-op threads.
    pub threads: usize,
    /// Per-request input shapes used.
    pub shapes: Vec<Vec<usize>>,
    /// One point per batch size, ascending.
    pub points: Vec<ProfilePoint>,
    /// Median replica start from disk, ms.
    pub cold_start_ms: f64,
    /// Median replica start from the host-memory cache, ms.
    pub warm_start_ms: f64,
    /// Size of the model in the host-memory cache (optimised graph and weights), MiB,
    /// rounded up.
    pub cached_mib: u64,
    /// GPU memory one replica holds once it has run the largest batch (weights, its
    /// arena, cuDNN/cuBLAS workspaces), MiB, rounded up, as the CUDA driver's free-memory
    /// figure fell; `None` on the CPU.
    pub gpu_mib: Option<u64>,
    /// The memory a replica needs, as the profile tells a policy (`memory_mib`): GPU
    /// memory on a GPU, the cached model on the CPU.
    pub memory_mib: u64,
}

/// Deterministic pseudo-random values in [-1, 1] (xorshift), for synthetic inputs.
pub fn synthetic(shape: &[usize], seed: u64) -> Tensor {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 2001) as f32 / 1000.0 - 1.0
        })
        .collect();
    Tensor { shape: shape.to_vec(), data }
}

/// [`synthetic`] for an input of `element`s: `f32` values (cast by the session to a
/// numeric type, so integers come out as -1, 0 or 1), or for strings the digits of
/// each value.
pub fn synthetic_of(element: crate::tensor::ElementType, shape: &[usize], seed: u64) -> Tensor {
    let values = synthetic(shape, seed);
    if element != crate::tensor::ElementType::Bytes {
        return values;
    }
    let mut layout = Vec::new();
    for value in values.data.floats() {
        let text = format!("{value}");
        layout.extend_from_slice(&(text.len() as u32).to_le_bytes());
        layout.extend_from_slice(text.as_bytes());
    }
    let data = crate::tensor::Elements::Bytes { data: layout, count: values.len() };
    Tensor { shape: shape.to_vec(), data: data.into() }
}

/// The per-request shapes to feed: the given ones, checked against the model, or the
/// model's own where it fixes every dimension.
pub fn request_shapes(inputs: &[InputSpec], given: Option<&[Vec<usize>]>) -> Result<Vec<Vec<usize>>> {
    match given {
        Some(shapes) => {
            if shapes.len() != inputs.len() {
                return Err(DataplaneError::Invalid(format!("{} shapes given, the model has {} inputs", shapes.len(), inputs.len())));
            }
            for (spec, shape) in inputs.iter().zip(shapes) {
                // An item of a batch, or a whole input of a model without a batch dimension.
                let fits_dims =
                    |dims: &[Option<usize>]| dims.len() == shape.len() && dims.iter().zip(shape).all(|(d, s)| d.is_none_or(|d| d == *s));
                let fits = fits_dims(&spec.dims[1.min(spec.dims.len())..]) || fits_dims(&spec.dims);
                if !fits {
                    return Err(DataplaneError::Invalid(format!("shape {shape:?} does not fit input {:?} of {:?}", spec.name, spec.dims)));
                }
            }
            Ok(shapes.to_vec())
        }
        None => inputs
            .iter()
            .map(|spec| {
                spec.dims[1.min(spec.dims.len())..].iter().map(|d| d.ok_or(())).collect::<Result<Vec<usize>, ()>>().map_err(|_| {
                    DataplaneError::Invalid(format!(
                        "input {:?} has dynamic dimensions {:?}: give its per-request shape (e.g. --shape 3x48x320)",
                        spec.name, spec.dims
                    ))
                })
            })
            .collect(),
    }
}

fn percentile(sorted_ms: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted_ms.len() as f64).ceil() as usize).clamp(1, sorted_ms.len());
    sorted_ms[rank - 1]
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Profile `spec` on `runtime`'s device.
pub fn profile(runtime: &Arc<Runtime>, spec: &ModelSpec, options: &ProfileOptions) -> Result<ProfileReport> {
    if options.batches.is_empty() || options.iterations == 0 {
        return Err(DataplaneError::Invalid("give at least one batch size and one iteration".into()));
    }
    // Replica starts: cold from a fresh cache, then warm from it.
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut memory_bytes = 0;
    for _ in 0..options.start_repeats.max(1) {
        let cache = ModelCache::default();
        cold.push(ModelSession::start(runtime, &cache, spec, options.threads)?.took);
        warm.push(ModelSession::start(runtime, &cache, spec, options.threads)?.took);
        memory_bytes = cache.bytes();
    }
    let gpu_free = |device: Device| match device {
        Device::Cuda(ordinal) => device::gpu_memory(ordinal).ok().map(|(free, _)| free),
        Device::Cpu => None,
    };
    let free_before = gpu_free(runtime.device());
    let mut session = ModelSession::start(runtime, &ModelCache::default(), spec, options.threads)?.session;
    let shapes = request_shapes(session.inputs(), options.shapes.as_deref())?;
    let mut batches = options.batches.clone();
    batches.sort_unstable();
    batches.dedup();
    let mut points = Vec::new();
    let types = session.input_types().to_vec();
    let mut integer_ones = false;
    for &batch in &batches {
        let mut requests = profile_requests(&types, &shapes, batch, integer_ones);
        // Synthetic integers are zeros, which a model that divides by an input (an
        // integer `Div` or `Mod`) cannot run: such a model is measured on ones.
        if let Err(on_zeros) = session.run_batch(&requests.iter().map(Vec::as_slice).collect::<Vec<_>>(), None) {
            if integer_ones || !types.iter().any(|t| t.is_integer()) {
                return Err(on_zeros);
            }
            integer_ones = true;
            requests = profile_requests(&types, &shapes, batch, true);
            session
                .run_batch(&requests.iter().map(Vec::as_slice).collect::<Vec<_>>(), None)
                .map_err(|on_ones| DataplaneError::Invalid(format!("{on_zeros}; and with every integer input 1: {on_ones}")))?;
        }
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        for _ in 0..options.warmup {
            session.run_batch(&refs, None)?;
        }
        let mut samples = Vec::with_capacity(options.iterations);
        for _ in 0..options.iterations {
            let begin = Instant::now();
            session.run_batch(&refs, None)?;
            samples.push(begin.elapsed().as_secs_f64() * 1e3);
        }
        let mean_ms = samples.iter().sum::<f64>() / samples.len() as f64;
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        points.push(ProfilePoint {
            batch,
            mean_ms,
            p50_ms: percentile(&samples, 0.5),
            p90_ms: percentile(&samples, 0.9),
            p99_ms: percentile(&samples, 0.99),
            samples: samples.len(),
        });
    }
    // The model is still loaded and has run every batch size (on a GPU, each on a
    // session of its own, as a serving replica does): what the GPU lost since just
    // before it started is what one replica holds.
    let gpu_mib = free_before.zip(gpu_free(runtime.device())).map(|(before, after)| before.saturating_sub(after).div_ceil(1 << 20));
    drop(session);
    let cached_mib = memory_bytes.div_ceil(1 << 20);
    Ok(ProfileReport {
        spec: spec.clone(),
        device: runtime.device().to_string(),
        threads: options.threads,
        shapes,
        points,
        cold_start_ms: median(cold).as_secs_f64() * 1e3,
        warm_start_ms: median(warm).as_secs_f64() * 1e3,
        cached_mib,
        gpu_mib,
        memory_mib: gpu_mib.unwrap_or(cached_mib),
    })
}

/// `batch` requests of synthetic inputs ([`synthetic_of`]) of `shapes`; with
/// `integer_ones`, every element of an integer input is 1 instead.
fn profile_requests(types: &[crate::tensor::ElementType], shapes: &[Vec<usize>], batch: usize, integer_ones: bool) -> Vec<Vec<Tensor>> {
    (0..batch)
        .map(|i| {
            shapes
                .iter()
                .enumerate()
                .map(|(k, s)| match integer_ones && types[k].is_integer() {
                    true => Tensor { shape: s.clone(), data: vec![1.0f32; s.iter().product()].into() },
                    false => synthetic_of(types[k], s, (i * 31 + k) as u64 + 1),
                })
                .collect()
        })
        .collect()
}

fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl ProfileReport {
    /// A human-readable table.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "model {} ({}), device {}, {} intra-op threads, inputs {:?}",
            self.spec.key,
            self.spec.path.display(),
            self.device,
            self.threads,
            self.shapes
        );
        let _ = writeln!(
            out,
            "{:>6} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}",
            "batch", "mean ms", "p50 ms", "p90 ms", "p99 ms", "items/s", "runs"
        );
        for p in &self.points {
            let _ = writeln!(
                out,
                "{:>6} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>12.1} {:>8}",
                p.batch,
                p.mean_ms,
                p.p50_ms,
                p.p90_ms,
                p.p99_ms,
                p.batch as f64 * 1e3 / p.mean_ms,
                p.samples
            );
        }
        let _ = writeln!(
            out,
            "replica start: cold {:.1} ms, warm {:.1} ms; cached model {} MiB{}",
            self.cold_start_ms,
            self.warm_start_ms,
            self.cached_mib,
            self.gpu_mib.map(|mib| format!("; GPU memory per replica {mib} MiB")).unwrap_or_default()
        );
        out
    }

    /// The profile as a one-stage pipeline file the simulator reads
    /// (`yardmaster sim compare --pipeline FILE`): the stage's variant carries
    /// `profile_ms = [[batch, mean, p99], …]`, the measured start times and memory.
    /// `slo_ms` is a placeholder (ten times the tail of the largest batch); copy the
    /// `[[stage.variant]]` block into a larger pipeline as it stands.
    pub fn to_pipeline_toml(&self) -> String {
        let mut out = String::new();
        let largest = self.points.last().expect("at least one point");
        let _ = writeln!(out, "# Measured by `yardmaster profile` on {} with {} intra-op threads;", self.device, self.threads);
        let _ = writeln!(out, "# model {}, per-request inputs {:?}.", self.spec.path.display(), self.shapes);
        let _ = writeln!(out, "name = {}", quoted(&self.spec.key.model));
        let _ = writeln!(out, "slo_ms = {:.3}", (largest.p99_ms * 10.0).max(1.0));
        let _ = writeln!(out);
        let _ = writeln!(out, "[[stage]]");
        let _ = writeln!(out, "name = {}", quoted(&self.spec.key.model));
        let _ = writeln!(out, "max_batch = {}", largest.batch);
        let _ = writeln!(out, "replicas = 1");
        let _ = writeln!(out, "device = {}", if self.device == "cpu" { "\"cpu\"" } else { "\"gpu\"" });
        let _ = writeln!(out, "threads = {}", self.threads.max(1));
        let _ = writeln!(out);
        let _ = writeln!(out, "[[stage.variant]]");
        let _ = writeln!(out, "name = {}", quoted(&self.spec.key.variant));
        let points: Vec<String> = self.points.iter().map(|p| format!("[{}, {:.4}, {:.4}]", p.batch, p.mean_ms, p.p99_ms)).collect();
        let _ = writeln!(out, "# [batch, mean_ms, p99_ms]");
        let _ = writeln!(out, "profile_ms = [{}]", points.join(", "));
        let _ = writeln!(
            out,
            "memory_mib = {}  # {}",
            self.memory_mib,
            if self.gpu_mib.is_some() { "GPU memory one replica holds" } else { "the model as cached in host memory" }
        );
        let _ = writeln!(out, "cold_start_ms = {:.3}", self.cold_start_ms);
        let _ = writeln!(out, "warm_start_ms = {:.3}", self.warm_start_ms);
        out
    }
}
