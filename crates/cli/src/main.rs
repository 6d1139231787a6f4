//! The `yardmaster` command line.

mod admin_cli;
mod bench_floors;
mod cluster_cli;
mod dataplane_cli;
mod policy_new;
mod repository_cli;
mod serve_cli;
mod sweep_cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use yardmaster::conformance::{self, CheckOptions};
use yardmaster::policy::contract::Param;
use yardmaster::policy::{Limits, PolicyLoader};

/// Yardmaster: inference serving whose scheduling decisions are made by sandboxed
/// WebAssembly policies.
///
/// Without a subcommand (the main job), runs the conformance check on every shipped
/// policy and on the built-in fallback, then serves the default PP-OCR pipeline with
/// the edf policy on 127.0.0.1:8000, reads a rendered image through it, sends a short
/// load over HTTP/3 and HTTP/1.1, prints the reports and stops. `yardmaster serve`
/// keeps serving.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Work with policy components.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Simulate policies on a pipeline and workload (virtual time, deterministic).
    #[command(subcommand)]
    Sim(SimCommand),
    /// Measure a model's latency per batch size with ONNX Runtime and write the profile
    /// the simulator reads.
    Profile(dataplane_cli::ProfileArgs),
    /// The ONNX Runtime data plane.
    #[command(subcommand)]
    Dataplane(dataplane_cli::DataplaneCommand),
    /// Serve models over HTTP/1.1 and HTTP/3 (KServe v2 protocol) with a scheduling
    /// policy deciding every drop, batch and scaling step; Prometheus text at /metrics.
    Serve(serve_cli::ServeArgs),
    /// Send open-loop load to a running server over HTTP/3 or HTTP/1.1 (a workload
    /// preset at a rate, or a trace) and print goodput, drop rate and latency
    /// percentiles.
    Load(serve_cli::LoadArgs),
    /// The serving overhead benchmark: a trivial model served by the whole stack,
    /// driven on loopback over HTTP/1.1 and HTTP/3; prints latency and overhead
    /// percentiles and requests per second.
    ServeBench(serve_cli::ServeBenchArgs),
    /// Host workers for a controller on another machine: a host of its cluster
    /// (inter-node QUIC; see docs/internode.md and docs/kubernetes.md).
    Node(yardmaster::cluster::node::NodeArgs),
    /// The cluster: its certificates (a CA and the node certificate it signs), and a
    /// running controller's hosts as the simulator's host list.
    #[command(subcommand)]
    Cluster(cluster_cli::ClusterCommand),
    /// A running server's admin API: list the policy, swap it for a file or a shipped one.
    Admin(admin_cli::AdminArgs),
    /// Model repositories in Triton's layout: check one before serving it.
    #[command(subcommand)]
    Repository(repository_cli::RepositoryCommand),
    /// A/B runs on a running server: start one (a candidate policy takes a share of
    /// the traffic and the workers), compare the arms with confidence intervals,
    /// promote the candidate or roll back.
    Ab(admin_cli::AbArgs),
}

#[derive(Subcommand)]
enum SimCommand {
    /// Run several policies on the same pipeline, workload and seed, side by side:
    /// prints a summary table and writes CSV, JSON and plots to --out.
    Compare {
        /// Policies: shipped names or `.wasm` files, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = ["fifo".to_string(), "edf".to_string()])]
        policies: Vec<String>,
        #[command(flatten)]
        sim: Box<SimArgs>,
    },
    /// Re-run a reference policy's paper: the policy against every baseline the paper
    /// compares it with, on the paper's pipelines and workloads, on one seed; prints
    /// the comparison tables and writes CSV, JSON and the plots matching the paper's
    /// figures to --out.
    Reproduce {
        /// Which paper (see the list printed by `sim reproduce --list`).
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the reproductions and exit.
        #[arg(long)]
        list: bool,
        /// Seed of every random choice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Directory for tables and plots (default: reproduce-NAME).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A short smoke run: fewer simulated seconds and sweep points.
        #[arg(long)]
        quick: bool,
    },
    /// Every policy on every pipeline at load multiples of its capacity bound, under
    /// several workload shapes and seeds, in parallel: a table with the cliffs and
    /// low-load misses flagged, sweep.csv, sweep.json and a heatmap per policy
    /// (goodput ÷ the optimal bound) in --out.
    Sweep(Box<sweep_cli::SweepArgs>),
    /// Simulator throughput: events per second with edf, and the wall time of one
    /// simulated hour of the 64-GPU five-stage pipeline at 1,000 requests/s.
    Bench {
        /// Simulated seconds of the cluster-scale run (3600 for the full hour).
        #[arg(long, default_value_t = 3600)]
        seconds: u64,
        /// Compare the cluster hour's policy events per second ÷ a native loop's
        /// operations per second with the floor in crates/cli/bench-floors.toml and exit
        /// non-zero below it (by hand before landing a simulator change; not in CI).
        #[arg(long)]
        check: bool,
    },
}

#[derive(clap::Args, Clone)]
struct SimArgs {
    /// Pipeline: a preset (vision-chain, traffic-dag, five-stage, llm), a `.toml` file,
    /// or a Loki application `.json` (profiles read from its directory).
    #[arg(long, default_value = "vision-chain")]
    pipeline: String,
    /// Simulate the models of this Triton model repository instead of --pipeline
    /// (repeatable): one stage and stream per model, with the profiles the server
    /// measured (or `profile.toml` beside a model); arrivals of a preset workload are
    /// dealt round-robin over the models.
    #[arg(long = "model-repository", value_name = "DIR")]
    model_repository: Vec<PathBuf>,
    /// The device whose measured profiles a model repository is simulated with
    /// (`cpu`, `cuda:0`).
    #[arg(long = "profile-device", default_value = "cpu")]
    profile_device: String,
    /// Simulate on these hosts: a TOML file of `[[host]]` tables (name, slots,
    /// cache_gib, speed, threads), as `yardmaster cluster hosts` writes a live
    /// controller's.
    /// A model repository's instance counts are then per host, as the controller runs
    /// them; a pipeline keeps its replicas and takes the hosts.
    #[arg(long, value_name = "FILE")]
    hosts: Option<PathBuf>,
    /// Workload: a preset (poisson, wikipedia, twitter, azure-functions, or the
    /// per-second rate replays wikipedia-per-second, twitter-per-second,
    /// azure-functions-per-second) at --rate, `rates:FILE` (per-second rates),
    /// `azure-llm:FILE` or `trace:FILE` (JSON lines).
    #[arg(long, default_value = "twitter")]
    workload: String,
    /// Mean arrival rate of a preset workload, requests per second (the default
    /// pipeline's capacity is about 1,460).
    #[arg(long, default_value_t = 1_500.0)]
    rate: f64,
    /// Speed-up of a replayed trace (azure-llm).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Simulated seconds of arrivals.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Coefficient of variation of job latency around its profile.
    #[arg(long, default_value_t = 0.05)]
    noise: f64,
    /// Speed of one worker relative to its stage's profile, `WORKER=SPEED` (repeatable;
    /// workers are numbered stage by stage from 0): `--worker-speed 1=2` makes worker
    /// 1 twice as fast, to simulate a heterogeneous cluster.
    #[arg(long = "worker-speed", value_parser = yardmaster::sim::executor::parse_worker_speed)]
    worker_speeds: Vec<(u32, f64)>,
    /// Policy parameter `key=value` (repeatable).
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<Param>,
    /// LLM pipelines: the time between tokens promised to latency-sensitive streams, in
    /// milliseconds — the token timeline LLM goodput is measured against (default: the
    /// `tbt_ms` policy parameter if given, else 100). Also given to the policies as
    /// their `tbt_ms` parameter unless `--param tbt_ms=…` says otherwise.
    #[arg(long = "tbt-ms")]
    tbt_ms: Option<f64>,
    /// Decision granularity in microseconds: 0 (default) makes every distinct instant a
    /// decision point; larger values batch what happens within an interval into one
    /// policy call (faster, decisions up to one interval late).
    #[arg(long, default_value_t = 0)]
    decision_interval_us: u64,
    /// Directory for CSV, JSON and plots (none written when absent).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write each run as a JSON-lines trace (`trace-POLICY.jsonl`) into this
    /// directory; replay one with `--workload trace:FILE`.
    #[arg(long)]
    capture: Option<PathBuf>,
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Drive policies through the conformance script: every event kind, action
    /// validity, no lost request, determinism, and the decision cost per event.
    Check {
        /// Policy `.wasm` files, or names of shipped policies (see `policy list`).
        #[arg(required = true)]
        policies: Vec<String>,
        #[command(flatten)]
        check: CheckArgs,
    },
    /// List the shipped policies with their size and SHA-256.
    List,
    /// Start a policy project in Rust, Python, JavaScript or Zig that builds on its own.
    ///
    /// Writes into DIR (created; an existing DIR must be empty): the contract's WIT
    /// (wit/VERSION/policy.wit), a starter policy (earliest deadline first, dropping what
    /// cannot finish), build.sh (builds DIR/policy.wasm with the language's toolchain),
    /// test.sh (builds it, then runs `yardmaster policy check` on it) and a README on
    /// building, checking, simulating and serving it. A Rust project also gets the SDK's
    /// sources (DIR/sdk/), so it needs nothing from Yardmaster's repository; Rust, Python
    /// and JavaScript projects target the latest contract, Zig ones 0.1.0 (the host
    /// accepts both).
    ///
    /// Example: yardmaster policy new --lang python my-policy && bash my-policy/test.sh
    New(policy_new::NewArgs),
    /// Write the shipped policies' `.wasm` files into a directory.
    Export {
        /// Where to write them (created if missing).
        #[arg(long, default_value = "policies-wasm")]
        dir: PathBuf,
    },
    /// Decision cost of `edf` as a component against the same code native, on the
    /// same event stream (build with --release for meaningful numbers).
    Bench {
        /// Events per call to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64])]
        batches: Vec<usize>,
        /// Events per measured run.
        #[arg(long, default_value_t = 200_000)]
        events: usize,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 5)]
        repetitions: usize,
    },
    /// Time of one CALM frame plan over N waiting requests, as a component against the
    /// same code native (CALM spec property 15: at most 20 ms natively for 4,096
    /// requests, the component at most 3× that; build with --release).
    BenchFrame {
        /// Waiting requests, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [256usize, 1024, 4096])]
        requests: Vec<usize>,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 5)]
        repetitions: usize,
    },
}

#[derive(clap::Args, Clone)]
struct CheckArgs {
    /// Seed of the arrival script and the policy's random source.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Requests in the script.
    #[arg(long, default_value_t = 240)]
    requests: u32,
    /// Policy parameter `key=value` (repeatable).
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<Param>,
    /// Serve-mode deadline of an event batch, in milliseconds.
    #[arg(long, default_value_t = 5)]
    deadline_ms: u64,
    /// Simulate-mode fuel of an event batch.
    #[arg(long, default_value_t = Limits::default().event_fuel)]
    fuel: u64,
    /// Memory cap of a policy, in MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: usize,
}

fn parse_param(raw: &str) -> Result<Param, String> {
    let (key, value) = raw.split_once('=').ok_or_else(|| format!("expected key=value, got {raw:?}"))?;
    Ok(Param { key: key.trim().into(), value: value.trim().into() })
}

impl CheckArgs {
    fn options(&self) -> CheckOptions {
        let limits = Limits {
            event_deadline: std::time::Duration::from_millis(self.deadline_ms),
            event_fuel: self.fuel,
            memory_bytes: self.memory_mib << 20,
            ..Limits::default()
        };
        CheckOptions {
            limits,
            seed: self.seed,
            requests: self.requests,
            params: self.params.clone(),
            cache_dir: PolicyLoader::default_cache_dir(),
        }
    }
}

impl Default for CheckArgs {
    fn default() -> Self {
        Self { seed: 7, requests: 240, params: Vec::new(), deadline_ms: 5, fuel: Limits::default().event_fuel, memory_mib: 64 }
    }
}

fn main() -> ExitCode {
    // Commands that print and exit end quietly on a closed stdout (`… | head`), as Unix
    // tools do; the servers (`serve`, `node`, the main job) keep ignoring SIGPIPE, so a
    // closed log pipe never stops them.
    if !matches!(std::env::args().nth(1).as_deref(), None | Some("serve" | "node")) {
        // SAFETY: the signal's default disposition is set before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    install_logging();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout, which may already be closed: print what fits.
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            let _ = std::io::Write::write_all(&mut std::io::stdout(), e.render().to_string().as_bytes());
            return ExitCode::SUCCESS;
        }
        Err(e) => e.exit(),
    };
    match cli.command {
        None => main_job(),
        Some(Command::Sim(SimCommand::Compare { policies, sim })) => sim_compare(&policies, &sim),
        Some(Command::Sim(SimCommand::Bench { seconds, check })) => sim_bench(seconds, check),
        Some(Command::Sim(SimCommand::Sweep(args))) => sweep_cli::sim_sweep(&args),
        Some(Command::Sim(SimCommand::Reproduce { name, list, seed, out, quick })) => reproduce(name, list, seed, out, quick),
        Some(Command::Policy(PolicyCommand::Check { policies, check: args })) => check(&policies, &args),
        Some(Command::Policy(PolicyCommand::List)) => {
            for artifact in yardmaster_policy_artifacts::SHIPPED {
                use sha2::Digest;
                let sha = hex::encode(sha2::Sha256::digest(artifact.bytes));
                println!("{:<12} {:>8} bytes  sha256 {sha}", artifact.name, artifact.bytes.len());
            }
            ExitCode::SUCCESS
        }
        Some(Command::Policy(PolicyCommand::New(args))) => policy_new::run(&args),
        Some(Command::Policy(PolicyCommand::Export { dir })) => export(&dir),
        Some(Command::Policy(PolicyCommand::Bench { batches, events, repetitions })) => bench(&batches, events, repetitions),
        Some(Command::Policy(PolicyCommand::BenchFrame { requests, repetitions })) => bench_frame(&requests, repetitions),
        Some(Command::Profile(args)) => dataplane_cli::profile(&args),
        Some(Command::Dataplane(command)) => dataplane_cli::run(command),
        Some(Command::Serve(args)) => serve_cli::serve(&args),
        Some(Command::Load(args)) => serve_cli::load(&args),
        Some(Command::ServeBench(args)) => serve_cli::serve_bench(&args),
        Some(Command::Node(args)) => yardmaster::cluster::node::main(&args),
        Some(Command::Cluster(command)) => cluster_cli::run(command),
        Some(Command::Admin(args)) => admin_cli::run(&args),
        Some(Command::Ab(args)) => admin_cli::run_ab(&args),
        Some(Command::Repository(command)) => repository_cli::run(command),
    }
}

/// Log to stderr at `YARDMASTER_LOG`'s filter (warnings by default), changeable while
/// serving through Triton's logging extension (`yardmaster::serve::logging`).
fn install_logging() {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::EnvFilter;
    let configured = std::env::var("YARDMASTER_LOG").ok().filter(|f| EnvFilter::try_new(f).is_ok());
    let initial = configured.unwrap_or_else(|| "warn".to_string());
    let (filter, handle) = tracing_subscriber::reload::Layer::new(EnvFilter::new(&initial));
    tracing_subscriber::registry().with(filter).with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).init();
    yardmaster::serve::logging::install(&initial, move |threshold| handle.reload(EnvFilter::new(threshold)).map_err(|e| e.to_string()));
}

/// The default job: check every shipped policy, then serve PP-OCR under a short load.
fn main_job() -> ExitCode {
    let checked = check_all_shipped();
    println!();
    let served = serve_cli::main_job();
    if checked == ExitCode::SUCCESS && served == ExitCode::SUCCESS {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn check_all_shipped() -> ExitCode {
    println!("yardmaster {}: conformance check of the shipped policies", env!("CARGO_PKG_VERSION"));
    let names: Vec<String> = yardmaster_policy_artifacts::SHIPPED.iter().map(|a| a.name.to_string()).collect();
    let options = CheckArgs::default().options();
    let mut ok = matches!(check(&names, &CheckArgs::default()), c if c == ExitCode::SUCCESS);
    let fallback = conformance::check_native::<policy_fifo::Fifo>("fifo", &options);
    print!("{}", fallback.render());
    ok &= fallback.passed();
    println!("{}", if ok { "all policies conform" } else { "some policies do NOT conform" });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn check(policies: &[String], args: &CheckArgs) -> ExitCode {
    let options = args.options();
    let mut all_passed = true;
    for policy in policies {
        let (name, bytes) = match load_bytes(policy) {
            Ok(found) => found,
            Err(message) => {
                eprintln!("error: {message}");
                all_passed = false;
                continue;
            }
        };
        eprintln!("checking {name} …");
        match conformance::check_component(&name, &bytes, &options) {
            Ok(report) => {
                print!("{}", report.render());
                all_passed &= report.passed();
            }
            Err(error) => {
                println!("REFUSED  {name}: {error}");
                all_passed = false;
            }
        }
    }
    if all_passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A path to a `.wasm`, or the name of a shipped policy.
fn load_bytes(policy: &str) -> Result<(String, Vec<u8>), String> {
    let path = PathBuf::from(policy);
    if path.exists() {
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {policy}: {e}"))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| policy.into());
        return Ok((name, bytes));
    }
    match yardmaster_policy_artifacts::shipped(policy) {
        Some(artifact) => Ok((artifact.name.to_string(), artifact.bytes.to_vec())),
        None => {
            let shipped: Vec<&str> = yardmaster_policy_artifacts::SHIPPED.iter().map(|a| a.name).collect();
            Err(format!("{policy:?} is neither a file nor a shipped policy (shipped: {})", shipped.join(", ")))
        }
    }
}

fn export(dir: &PathBuf) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for artifact in yardmaster_policy_artifacts::SHIPPED {
        let file = dir.join(format!("{}.wasm", artifact.name));
        if let Err(e) = std::fs::write(&file, artifact.bytes) {
            eprintln!("error: cannot write {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", file.display());
    }
    ExitCode::SUCCESS
}

fn bench_frame(requests: &[usize], repetitions: usize) -> ExitCode {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; run `cargo run --release -p yardmaster -- policy bench-frame` for meaningful numbers");
    }
    println!("one CALM frame plan (B = 64): component vs native, median of {repetitions}");
    println!("{:>9} {:>11} {:>10} {:>10} {:>7}", "requests", "dispatched", "wasm ms", "native ms", "ratio");
    match yardmaster::conformance::bench::bench_calm_frame(requests, repetitions.max(1)) {
        Ok(rows) => {
            for row in rows {
                println!("{:>9} {:>11} {:>10.2} {:>10.2} {:>7.2}", row.requests, row.dispatched, row.wasm_ms, row.native_ms, row.ratio());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(batches: &[usize], events: usize, repetitions: usize) -> ExitCode {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; run `cargo run --release -p yardmaster -- policy bench` for meaningful numbers");
    }
    println!("decision cost of edf: component vs native, same event stream, median of {repetitions}");
    println!("{:>8} {:>8} {:>14} {:>14} {:>8}", "batch", "calls", "wasm ns/event", "native ns/event", "ratio");
    match yardmaster::conformance::bench::bench_edf(batches, events, repetitions.max(1)) {
        Ok(rows) => {
            for row in rows {
                println!("{:>8} {:>8} {:>14.1} {:>14.1} {:>8.2}", row.batch, row.calls, row.wasm_ns, row.native_ns, row.ratio());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn sim_compare(policies: &[String], args: &SimArgs) -> ExitCode {
    match try_sim_compare(policies, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_sim_compare(policies: &[String], args: &SimArgs) -> anyhow::Result<()> {
    use yardmaster::formats::WorkloadSpec;
    use yardmaster::sim::{self, PolicySpec, SimSpec};
    anyhow::ensure!(args.duration > 0.0, "--duration must be positive");
    let mut workload = WorkloadSpec::parse(&args.workload, args.rate, args.speedup)?;
    let mut params = llm_params(&args.params, args.tbt_ms);
    let pipeline = if args.model_repository.is_empty() {
        yardmaster::formats::presets::pipeline(&args.pipeline).map_err(|e| anyhow::anyhow!(e))?
    } else {
        use yardmaster::formats::model_repository::stages::{simulated_repository, ProfileStore};
        let store = ProfileStore {
            dir: yardmaster::serve::repository::default_profile_cache(),
            device: args.profile_device.clone(),
            threads: yardmaster::serve::repository::RepositoryOptions::default().threads,
        };
        let repository = simulated_repository(&args.model_repository, &store).map_err(|e| anyhow::anyhow!(e))?;
        for reason in &repository.left_out {
            eprintln!("left out: {reason}");
        }
        let pipeline = repository.pipeline;
        for param in repository.params {
            if !params.iter().any(|p| p.key == param.key) {
                params.push(param);
            }
        }
        if !matches!(workload, WorkloadSpec::Trace(_)) {
            workload = WorkloadSpec::Spread { inner: Box::new(workload), streams: pipeline.streams.len() as u32 };
        }
        pipeline
    };
    let pipeline = match &args.hosts {
        Some(path) => on_hosts(pipeline, path, !args.model_repository.is_empty())?,
        None => pipeline,
    };
    let mut specs = Vec::new();
    for policy in policies {
        let (name, bytes) = load_bytes(policy).map_err(|e| anyhow::anyhow!(e))?;
        specs.push(PolicySpec { name, bytes: std::sync::Arc::new(bytes) });
    }
    let spec = SimSpec {
        pipeline,
        seed: args.seed,
        duration: (args.duration * 1e9) as u64,
        executor: sim::executor::SimExecutorOptions { noise_cv: args.noise, worker_speed: args.worker_speeds.iter().copied().collect() },
        engine: yardmaster::engine::EngineOptions {
            params,
            ls_time_between_tokens: yardmaster::engine::EngineOptions::ls_time_between_tokens_from(args.tbt_ms, &args.params),
            ..Default::default()
        },
        decision_interval: args.decision_interval_us * 1_000,
        capture_dir: args.capture.clone(),
    };
    let sandbox = yardmaster::policy::Sandbox::new(yardmaster::policy::Mode::Simulate, Limits::default())?;
    let loader = PolicyLoader::new(sandbox, PolicyLoader::default_cache_dir());
    // A progress line on a terminal; one line per policy otherwise (logs, CI).
    // Runs go in parallel: a terminal gets one progress line for all of them, a log
    // one line per run started.
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let shown = std::sync::Mutex::new(std::collections::BTreeMap::<String, i64>::new());
    let outcomes = sim::compare(&spec, &workload, &specs, &loader, |policy, done| {
        let percent = (done * 100.0) as i64;
        let mut shown = shown.lock().unwrap();
        let previous = shown.insert(policy.to_string(), percent);
        if terminal && previous.is_none_or(|p| p / 5 != percent / 5) {
            let line: Vec<String> = shown.iter().map(|(name, p)| format!("{name} {p:>3}%")).collect();
            eprint!("\r  simulating: {} ", line.join("  "));
        } else if !terminal && previous.is_none() {
            eprintln!("  simulating {policy} …");
        }
    })?;
    if terminal {
        eprintln!();
    }
    for o in &outcomes {
        // The policy's linear memory after a tenth of the run (the warm-up) and at its
        // end: flat when the two agree.
        let memory_at = |fraction: f64| o.memory_at((o.simulated as f64 * fraction) as u64) >> 10;
        eprintln!(
            "  {}: {} events in {:.2} s wall ({:.0} events/s), {} policy calls, {} faults, policy memory {} KiB at a tenth of the run, {} KiB at its end",
            o.report.policy,
            o.events,
            o.wall.as_secs_f64(),
            o.events as f64 / o.wall.as_secs_f64().max(1e-9),
            o.engine.flushes,
            o.arm.faults.values().sum::<u64>(),
            memory_at(0.1),
            memory_at(1.0)
        );
        // Where the policy dropped: a drop at a later stage wasted the earlier stages' work.
        if o.engine.drops_by_stage.iter().any(|&d| d > 0) {
            let stages: Vec<String> =
                o.engine.drops_by_stage.iter().enumerate().filter(|(_, &d)| d > 0).map(|(s, d)| format!("stage {s}: {d}")).collect();
            eprintln!("  {}: policy drops by stage: {}", o.report.policy, stages.join(", "));
        }
    }
    let reports: Vec<_> = outcomes.into_iter().map(|o| o.report).collect();
    print!("{}", yardmaster::sim::report::render_table(&reports));
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        let mut files = yardmaster::sim::report::write_csv(dir, &reports)?;
        files.push(yardmaster::sim::report::write_json(dir, &reports)?);
        let plots = yardmaster::sim::report::write_plots(dir, &reports).map_err(|e| anyhow::anyhow!(e))?;
        files.extend(plots.files);
        if let Some(note) = plots.note {
            eprintln!("note: {note}");
        }
        println!("wrote {} files to {} (summary.json, CSV time series, plots)", files.len(), dir.display());
    }
    Ok(())
}

/// `pipeline` on the hosts of the file at `path`; a model repository's (`per_host`)
/// instance counts become per host, as the cluster controller runs them.
fn on_hosts(
    mut pipeline: yardmaster::engine::Pipeline,
    path: &std::path::Path,
    per_host: bool,
) -> anyhow::Result<yardmaster::engine::Pipeline> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    let hosts = yardmaster::formats::pipeline::hosts_from_toml(&text, &source)?;
    if per_host {
        let counts: Vec<u32> = pipeline.stages.iter().map(|s| s.replicas).collect();
        yardmaster::serve::membership::spread(&mut pipeline, &counts, hosts);
    } else {
        pipeline.hosts = hosts;
    }
    pipeline.validate(&source)?;
    let slots: u32 = pipeline.hosts.iter().map(|h| h.slots).sum();
    eprintln!("  on {} hosts from {source} ({slots} slots, {} workers at start)", pipeline.hosts.len(), pipeline.initial_workers().len());
    Ok(pipeline)
}

fn sim_bench(seconds: u64, check: bool) -> ExitCode {
    match yardmaster::sim::bench::measure(seconds) {
        Ok(outcome) => {
            print!("{}", outcome.text);
            if check {
                let (line, passes) = bench_floors::check("sim_policy_events_per_native_op", outcome.ratio());
                println!("{line}");
                if !passes {
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn reproduce(name: Option<String>, list: bool, seed: u64, out: Option<PathBuf>, quick: bool) -> ExitCode {
    use yardmaster::sim::reproduce::{self, ReproduceOptions, REPRODUCTIONS};
    if list {
        for r in REPRODUCTIONS {
            println!("{:<8} {}", r.name, r.about);
        }
        return ExitCode::SUCCESS;
    }
    let name = name.expect("clap requires a name unless --list");
    let result = reproduce::find(&name).and_then(|r| {
        let out = out.unwrap_or_else(|| PathBuf::from(format!("reproduce-{name}")));
        std::fs::create_dir_all(&out)?;
        eprintln!("reproducing {name}: {} (seed {seed}{})", r.about, if quick { ", quick" } else { "" });
        (r.run)(&ReproduceOptions { seed, out, quick })
    });
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The policy parameters of a simulated run, with `tbt_ms` added from `--tbt-ms` when
/// that is given and the operator set no `tbt_ms` parameter.
fn llm_params(params: &[Param], tbt_ms: Option<f64>) -> Vec<Param> {
    let mut params = params.to_vec();
    if let Some(tbt_ms) = tbt_ms.filter(|_| !params.iter().any(|p| p.key == "tbt_ms")) {
        params.push(Param { key: "tbt_ms".into(), value: tbt_ms.to_string() });
    }
    params
}
