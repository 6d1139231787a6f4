//! The data plane's commands: `yardmaster profile MODEL.onnx` (latency per batch size,
//! written as a profile the simulator reads) and `yardmaster dataplane bench` (served
//! throughput against a plain ONNX Runtime loop, and replica start cold vs warm).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use yardmaster_dataplane::bench::{self, BenchOptions};
use yardmaster_dataplane::profile::{self, ProfileOptions};
use yardmaster_dataplane::{assets, DevicePreference, ModelKey, ModelSpec, Runtime, RuntimeConfig};

/// `yardmaster profile`.
#[derive(clap::Args)]
pub struct ProfileArgs {
    /// The `.onnx` model to measure.
    model: PathBuf,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
    batch: Vec<usize>,
    /// Per-request shape of an input without the batch dimension, e.g. `3x48x320`
    /// (repeat once per input; needed where the model leaves dimensions dynamic).
    #[arg(long = "shape", value_parser = parse_shape)]
    shapes: Vec<Vec<usize>>,
    /// Measured runs per batch size.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Unmeasured runs before each batch size.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Intra-op threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Stage name in the written profile (default: the file's stem).
    #[arg(long)]
    name: Option<String>,
    /// Variant name in the written profile.
    #[arg(long, default_value = "default")]
    variant: String,
    /// Device: auto, cpu, or cuda[:N].
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: DevicePreference,
    /// Where to write the profile (a one-stage pipeline TOML; default `STEM.profile.toml`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `yardmaster dataplane …`.
#[derive(clap::Subcommand)]
pub enum DataplaneCommand {
    /// Served throughput at a fixed batch size against a plain ONNX Runtime `Run` loop
    /// on the same model in the same run (target ratio ≥ 0.95), and replica start cold
    /// (from disk) vs warm (from the host-memory cache). Build with --release.
    Bench {
        /// The model (default: the PP-OCRv4 recogniser the set-up script installs).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Requests per batch.
        #[arg(long, default_value_t = 6)]
        batch: usize,
        /// Per-request input shape (default for the recogniser: 3x48x320).
        #[arg(long = "shape", value_parser = parse_shape)]
        shapes: Vec<Vec<usize>>,
        /// Batches per round and side.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Alternating rounds (plain, then served).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Intra-op threads on both sides.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Device for both sides: auto, cpu, or cuda[:N].
        #[arg(long, default_value = "auto", value_parser = parse_device)]
        device: DevicePreference,
    },
    /// The device the data plane would run on and why, and every GPU the CUDA driver
    /// sees with its free and total memory (read through the driver, so it counts what
    /// every process on the GPU holds).
    Devices {
        /// Device preference to decide for: auto, cpu, or cuda[:N].
        #[arg(long, default_value = "auto", value_parser = parse_device)]
        device: DevicePreference,
    },
}

fn parse_shape(raw: &str) -> Result<Vec<usize>, String> {
    raw.split(['x', ',']).map(|d| d.trim().parse::<usize>().map_err(|_| format!("bad shape {raw:?}: expected e.g. 3x48x320"))).collect()
}

fn parse_device(raw: &str) -> Result<DevicePreference, String> {
    raw.parse()
}

fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::FAILURE
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// The device line: which device and why.
pub(crate) fn print_device(runtime: &Runtime) {
    let choice = runtime.device_choice();
    println!("device: {} ({})", choice.device, choice.reason);
}

/// Run `yardmaster profile`.
pub fn profile(args: &ProfileArgs) -> ExitCode {
    let runtime = match Runtime::init(RuntimeConfig { library: None, device: args.device }) {
        Ok(runtime) => runtime,
        Err(error) => return fail(error),
    };
    print_device(&runtime);
    let name = args.name.clone().unwrap_or_else(|| stem(&args.model));
    let spec = ModelSpec::new(ModelKey::new(name, args.variant.clone()), &args.model);
    let options = ProfileOptions {
        batches: args.batch.clone(),
        shapes: (!args.shapes.is_empty()).then(|| args.shapes.clone()),
        warmup: args.warmup,
        iterations: args.iterations,
        threads: args.threads,
        ..ProfileOptions::default()
    };
    let report = match profile::profile(&runtime, &spec, &options) {
        Ok(report) => report,
        Err(error) => return fail(error),
    };
    print!("{}", report.render_table());
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("{}.profile.toml", stem(&args.model))));
    if let Err(error) = std::fs::write(&out, report.to_pipeline_toml()) {
        return fail(format!("writing {}: {error}", out.display()));
    }
    println!("profile written to {} (simulate it with `yardmaster sim compare --pipeline {}`)", out.display(), out.display());
    ExitCode::SUCCESS
}

/// Run `yardmaster dataplane …`.
pub fn run(command: DataplaneCommand) -> ExitCode {
    match command {
        DataplaneCommand::Devices { device } => devices(device),
        DataplaneCommand::Bench { model, batch, shapes, runs, rounds, threads, device } => {
            let runtime = match Runtime::init(RuntimeConfig { library: None, device }) {
                Ok(runtime) => runtime,
                Err(error) => return fail(error),
            };
            print_device(&runtime);
            let (path, shapes) = match model {
                Some(path) => (path, (!shapes.is_empty()).then_some(shapes)),
                None => match assets::model_path(assets::REC_MODEL) {
                    Ok(path) => (path, Some(if shapes.is_empty() { vec![vec![3, 48, 320]] } else { shapes })),
                    Err(error) => return fail(error),
                },
            };
            let spec = ModelSpec::new(ModelKey::new(stem(&path), "default"), &path);
            let options = BenchOptions { batch, shapes, runs, rounds, threads };
            println!(
                "benchmark: {} on {}, {threads} intra-op threads, {rounds} rounds of {runs} batches per side",
                path.display(),
                runtime.device()
            );
            match bench::served_vs_plain(&runtime, &spec, &options) {
                Ok(report) => {
                    print!("{}", report.render());
                    ExitCode::SUCCESS
                }
                Err(error) => fail(error),
            }
        }
    }
}

/// Run `yardmaster dataplane devices`.
fn devices(preference: DevicePreference) -> ExitCode {
    match yardmaster_dataplane::device::discover_gpus() {
        Ok(gpus) => {
            for gpu in gpus {
                println!(
                    "gpu {}: {}, {} MiB used of {} MiB ({} MiB free)",
                    gpu.ordinal,
                    gpu.name,
                    (gpu.total_bytes - gpu.free_bytes) >> 20,
                    gpu.total_bytes >> 20,
                    gpu.free_bytes >> 20
                );
            }
        }
        Err(why) => println!("no GPU: {why}"),
    }
    match Runtime::init(RuntimeConfig { library: None, device: preference }) {
        Ok(runtime) => {
            print_device(&runtime);
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}
