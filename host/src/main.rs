//! The `yardmaster` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use yardmaster::conformance::{self, CheckOptions};
use yardmaster::policy::contract::Param;
use yardmaster::policy::{Limits, PolicyLoader};

/// Yardmaster: inference serving whose scheduling decisions are made by sandboxed
/// WebAssembly policies.
///
/// Without a subcommand, runs the conformance check on every shipped policy and on
/// the built-in fallback.
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("YARDMASTER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        None => check_all_shipped(),
        Some(Command::Policy(PolicyCommand::Check { policies, check: args })) => check(&policies, &args),
        Some(Command::Policy(PolicyCommand::List)) => {
            for artifact in yardmaster_policy_artifacts::SHIPPED {
                use sha2::Digest;
                let sha = hex::encode(sha2::Sha256::digest(artifact.bytes));
                println!("{:<12} {:>8} bytes  sha256 {sha}", artifact.name, artifact.bytes.len());
            }
            ExitCode::SUCCESS
        }
        Some(Command::Policy(PolicyCommand::Export { dir })) => export(&dir),
        Some(Command::Policy(PolicyCommand::Bench { batches, events, repetitions })) => bench(&batches, events, repetitions),
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
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
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
    if all_passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
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

fn bench(batches: &[usize], events: usize, repetitions: usize) -> ExitCode {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; run `cargo run --release -p yardmaster -- policy bench` for meaningful numbers");
    }
    println!("decision cost of edf: component vs native, same event stream, median of {repetitions}");
    println!("{:>8} {:>8} {:>14} {:>14} {:>8}", "batch", "calls", "wasm ns/event", "native ns/event", "ratio");
    match yardmaster::bench::bench_edf(batches, events, repetitions.max(1)) {
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

