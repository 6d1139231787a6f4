//! `yardmaster sim sweep`: the command line of [`yardmaster::sim::sweep`] — which
//! policies, pipelines, loads, shapes and seeds, with `--quick` for a CI-size run, and
//! where the table, CSV, JSON and heatmaps go.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use yardmaster::policy::contract::Param;
use yardmaster::policy::{Limits, PolicyLoader};
use yardmaster::sim::sweep::{self, Shape, SweepPlan, SweptPipeline, DEFAULT_LOADS, QUICK_LOADS};
use yardmaster::sim::{PolicySpec, SimSpec};

/// Arguments of `yardmaster sim sweep`.
#[derive(clap::Args, Clone)]
pub struct SweepArgs {
    /// Policies: shipped names or `.wasm` files, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["fifo", "edf", "pard", "flex", "quart", "loki"].map(String::from))]
    pub policies: Vec<String>,
    /// Pipelines: presets, `.toml` files or Loki application `.json` files,
    /// comma-separated (default: vision-chain, traffic-dag; none with --random-apps).
    #[arg(long, value_delimiter = ',')]
    pub pipelines: Vec<String>,
    /// Load multiples of each pipeline's capacity bound (default: 0.25, 0.5, 0.75, 1,
    /// 1.25, 1.5, 2, 3, 5, 10; with --quick: 0.5, 1, 2, 5).
    #[arg(long, value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// Workload shapes: poisson, bursty (Twitter's bursts), diurnal (Wikipedia's daily
    /// swing), replay (Azure Functions' per-second rates), or any workload preset
    /// (default: all four; with --quick: poisson).
    #[arg(long, value_delimiter = ',')]
    pub shapes: Vec<String>,
    /// Seeds: every cell runs once per seed (default: 1,2; with --quick: 1).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Simulated seconds of arrivals per run (default: 60; with --quick: 5).
    #[arg(long)]
    pub duration: Option<f64>,
    /// A CI-size run: the quick defaults for loads, shapes, seeds and duration.
    #[arg(long)]
    pub quick: bool,
    /// Policy parameter `key=value` for every run (repeatable).
    #[arg(long = "param", value_parser = super::parse_param)]
    pub params: Vec<Param>,
    /// Directory for sweep.csv, sweep.json and the heatmaps (default: sweep).
    #[arg(long, default_value = "sweep")]
    pub out: PathBuf,
    /// Add N random applications in Loki's format to the pipelines (chains, fan-outs
    /// at the root or in the middle with or without a join, diamonds, a pseudo-task
    /// root; docs/sweep.md), written to --out/apps/; with no --pipelines given, only
    /// them.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub random_apps: usize,
    /// The seed the random applications are drawn from.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub app_seed: u64,
    /// Loki's published profiles, which the random applications' models, latencies
    /// and accuracies come from.
    #[arg(long, value_name = "DIR", default_value = "../shared/data/loki")]
    pub loki_data: PathBuf,
    /// Exit with status 1 when a cliff or a low-load miss is found that the policy's doc
    /// does not give as where it breaks (a baseline breaking where its paper says it
    /// does is labelled, not failed).
    #[arg(long)]
    pub strict: bool,
    /// Run nothing: read a `sweep.json` an earlier sweep wrote, judge its cells again
    /// (flags and documented labels as this build has them), print its table and write
    /// its files and heatmaps into --out (after a change to the drawing or the labels).
    #[arg(long, value_name = "SWEEP_JSON")]
    pub replot: Option<PathBuf>,
}

/// Run `yardmaster sim sweep`.
pub fn sim_sweep(args: &SweepArgs) -> ExitCode {
    match try_sim_sweep(args) {
        Ok(clean) if clean || !args.strict => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the sweep found neither a cliff nor a low-load miss that no doc explains.
fn try_sim_sweep(args: &SweepArgs) -> anyhow::Result<bool> {
    if let Some(saved) = &args.replot {
        return replot(saved, args);
    }
    let pick = |given: &[f64], full: &[f64], quick: &[f64]| -> Vec<f64> {
        if !given.is_empty() {
            given.to_vec()
        } else if args.quick {
            quick.to_vec()
        } else {
            full.to_vec()
        }
    };
    let loads = pick(&args.loads, &DEFAULT_LOADS, &QUICK_LOADS);
    anyhow::ensure!(loads.iter().all(|l| *l > 0.0 && l.is_finite()), "--loads must be positive");
    let shape_names: Vec<String> = match (args.shapes.is_empty(), args.quick) {
        (false, _) => args.shapes.clone(),
        (true, true) => vec!["poisson".into()],
        (true, false) => ["poisson", "bursty", "diurnal", "replay"].map(String::from).to_vec(),
    };
    let shapes = shape_names.iter().map(|s| Shape::parse(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let seeds = match (args.seeds.is_empty(), args.quick) {
        (false, _) => args.seeds.clone(),
        (true, true) => vec![1],
        (true, false) => vec![1, 2],
    };
    let duration_s = args.duration.unwrap_or(if args.quick { 5.0 } else { 60.0 });
    anyhow::ensure!(duration_s > 0.0, "--duration must be positive");
    let mut pipelines = Vec::new();
    let named: Vec<String> = match (args.pipelines.is_empty(), args.random_apps) {
        (false, _) => args.pipelines.clone(),
        (true, 0) => ["vision-chain", "traffic-dag"].map(String::from).to_vec(),
        (true, _) => Vec::new(),
    };
    for name in &named {
        let pipeline = yardmaster::formats::presets::pipeline(name).map_err(|e| anyhow::anyhow!(e))?;
        pipelines.push(SweptPipeline { name: name.clone(), pipeline });
    }
    if args.random_apps > 0 {
        pipelines.extend(random_apps(args)?);
    }
    let mut policies = Vec::new();
    for policy in &args.policies {
        let (name, bytes) = super::load_bytes(policy).map_err(|e| anyhow::anyhow!(e))?;
        policies.push(PolicySpec { name, bytes: Arc::new(bytes) });
    }
    let base = SimSpec {
        pipeline: pipelines.first().map(|p| p.pipeline.clone()).ok_or_else(|| anyhow::anyhow!("--pipelines is empty"))?,
        seed: 1,
        duration: 0,
        executor: Default::default(),
        engine: yardmaster::engine::EngineOptions { params: args.params.clone(), ..Default::default() },
        decision_interval: 0,
        capture_dir: None,
    };
    let cells = policies.len() * pipelines.len() * loads.len() * shapes.len() * seeds.len();
    for p in &pipelines {
        eprintln!("{}: capacity bound {:.1} req/s", p.name, sweep::capacity(&p.pipeline)?);
    }
    eprintln!(
        "sweeping {cells} runs ({} policies × {} pipelines × {} loads × {} shapes × {} seeds, {duration_s} s each) on {} cores",
        policies.len(),
        pipelines.len(),
        loads.len(),
        shapes.len(),
        seeds.len(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let plan = SweepPlan { policies, pipelines, loads, shapes, seeds, duration_s, base };
    let sandbox = yardmaster::policy::Sandbox::new(yardmaster::policy::Mode::Simulate, Limits::default())?;
    let loader = PolicyLoader::new(sandbox, PolicyLoader::default_cache_dir());
    let outcome = sweep::run_sweep(&plan, &loader, |line| eprintln!("  {line}"))?;
    print!("{}", sweep::render_table(&outcome));
    let mut files = sweep::write_files(&args.out, &outcome)?;
    files.extend(sweep::write_heatmaps(&args.out, &outcome)?);
    println!("wrote {} files to {} (sweep.csv, sweep.json, a heatmap per policy)", files.len(), args.out.display());
    Ok(!outcome.rows.iter().any(sweep::SweepRow::undocumented_flag))
}

/// `--random-apps`: the generated applications, imported, each written to
/// `--out/apps/NAME.json` beside the profiles it was drawn from, so that `sim compare
/// --pipeline OUT/apps/NAME.json` reruns one of them as it is.
fn random_apps(args: &SweepArgs) -> anyhow::Result<Vec<SweptPipeline>> {
    use yardmaster::formats::pipeline::{from_loki_app, LokiProfiles};
    let profiles = LokiProfiles::load(&args.loki_data, "onnxruntime_gpu_ampere")
        .map_err(|e| anyhow::anyhow!("--loki-data {}: {e}", args.loki_data.display()))?;
    let apps = yardmaster::formats::random_app::generate(args.random_apps, args.app_seed, &profiles).map_err(|e| anyhow::anyhow!(e))?;
    let dir = args.out.join("apps");
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    copy_profiles(&args.loki_data, &dir)?;
    let mut pipelines = Vec::new();
    for app in apps {
        let path = dir.join(format!("{}.json", app.name));
        std::fs::write(&path, &app.json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let pipeline = from_loki_app(&app.json, &profiles, &path.display().to_string())?;
        eprintln!(
            "{}: {} tasks, critical path {:.1} ms, SLO {:.0} ms",
            app.name,
            app.tasks,
            app.critical_path_ms,
            pipeline.streams[0].slo_ns as f64 / 1e6
        );
        pipelines.push(SweptPipeline { name: app.name, pipeline });
    }
    Ok(pipelines)
}

/// The files of Loki's data folder that an application's import reads (the runtimes,
/// the variants' accuracies, the branching) and the licence they come under, copied
/// from `from` into `to`.
fn copy_profiles(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    const READ_BY_THE_IMPORT: [&str; 4] =
        ["profiling__simulator_runtimes.csv", "traces__model_variants__", "profiled__branching", "LICENSE"];
    let entries = std::fs::read_dir(from).map_err(|e| anyhow::anyhow!("--loki-data {}: {e}", from.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if READ_BY_THE_IMPORT.iter().any(|prefix| name.starts_with(prefix)) {
            let target = to.join(&name);
            std::fs::copy(entry.path(), &target).map_err(|e| anyhow::anyhow!("{} → {}: {e}", entry.path().display(), target.display()))?;
        }
    }
    Ok(())
}

/// `--replot`: the table and heatmaps of a saved sweep, nothing run.
fn replot(saved: &std::path::Path, args: &SweepArgs) -> anyhow::Result<bool> {
    let text = std::fs::read(saved).map_err(|e| anyhow::anyhow!("{}: {e}", saved.display()))?;
    let outcome: sweep::SweepOutcome =
        serde_json::from_slice(&text).map_err(|e| anyhow::anyhow!("{}: not a sweep.json written by `sim sweep`: {e}", saved.display()))?;
    // The flags and labels again from the cells, as this build judges them.
    let outcome = sweep::summarise(outcome.cells);
    print!("{}", sweep::render_table(&outcome));
    let mut files = sweep::write_files(&args.out, &outcome)?;
    files.extend(sweep::write_heatmaps(&args.out, &outcome)?);
    println!("wrote {} files to {} (sweep.csv, sweep.json, a heatmap per policy)", files.len(), args.out.display());
    Ok(!outcome.rows.iter().any(sweep::SweepRow::undocumented_flag))
}
