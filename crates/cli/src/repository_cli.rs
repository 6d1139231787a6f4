//! `yardmaster repository check DIR…`: read Triton model repositories as the server
//! will (`yardmaster_formats::model_repository`), complete each configuration from its
//! ONNX graph where `config.pbtxt` leaves it out, and print what each model would be —
//! or why it cannot be served. Exits 1 if any model is refused.
//!
//! `yardmaster repository lay-out [ocr|tiny]`: write a shipped repository into the
//! assets folder (what `yardmaster serve --pipeline NAME` serves) and print its folder.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use yardmaster::formats::model_repository::config::{Backend, TensorConfig};
use yardmaster::formats::model_repository::{scan, ModelEntry, ModelError};
use yardmaster::serve::builtin_repository::BuiltinRepository;
use yardmaster::serve::repository::default_profile_cache;

/// Model repositories (Triton's layout: `DIR/<model>/config.pbtxt`,
/// `DIR/<model>/<version>/model.onnx`).
#[derive(Subcommand)]
pub enum RepositoryCommand {
    /// Read repositories and print every model's effective configuration (completed
    /// from its ONNX graph where config.pbtxt is absent or partial), or why it cannot be
    /// served; exits 1 if any model is refused.
    Check(CheckArgs),
    /// Write a shipped repository (`ocr`: PP-OCR as an ensemble of built-in steps;
    /// `tiny`: the trivial model) into the assets folder, with its shipped CPU
    /// profiles in the profile cache, and print its folder. `yardmaster serve
    /// --pipeline NAME` does this itself; the set-up script does it for both.
    LayOut(LayOutArgs),
}

/// Arguments of `repository lay-out`.
#[derive(Args)]
pub struct LayOutArgs {
    /// Which shipped repositories (all when none is named): ocr, tiny.
    names: Vec<String>,
}

/// Arguments of `repository check`.
#[derive(Args)]
pub struct CheckArgs {
    /// Repository directories (a model name in two of them is refused).
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Print each model's configuration as Triton's `GET /v2/models/{m}/config` JSON
    /// (refused models as `{"error": …}`) instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Run a `repository` subcommand.
pub fn run(command: RepositoryCommand) -> ExitCode {
    match command {
        RepositoryCommand::Check(args) => check(args),
        RepositoryCommand::LayOut(args) => lay_out(args),
    }
}

/// `repository lay-out`.
fn lay_out(args: LayOutArgs) -> ExitCode {
    let mut chosen = Vec::new();
    for name in &args.names {
        match BuiltinRepository::from_name(name) {
            Some(repository) => chosen.push(repository),
            None => {
                eprintln!("error: no shipped repository {name:?} (shipped: ocr, tiny)");
                return ExitCode::FAILURE;
            }
        }
    }
    if chosen.is_empty() {
        chosen = BuiltinRepository::ALL.to_vec();
    }
    for repository in chosen {
        match repository.lay_out(&default_profile_cache()) {
            Ok(dir) => println!("{}: {}", repository.name(), dir.display()),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// `repository check`.
fn check(args: CheckArgs) -> ExitCode {
    let mut repository = match scan(&args.dirs) {
        Ok(repository) => repository,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    repository.complete_from_graphs();
    // The server's own check of each model's tensors: what `serve` would refuse is
    // refused here, in its words.
    for model in repository.models.values_mut() {
        if let Ok(entry) = model {
            if let Err(message) = yardmaster::serve::repository::servable(entry) {
                *model = Err(ModelError { model: entry.name.clone(), message: format!("serve refuses it: {message}") });
            }
        }
    }
    let refused = repository.errors().count();
    if args.json {
        let models: serde_json::Map<String, serde_json::Value> = repository
            .models
            .iter()
            .map(|(name, model)| {
                let value = match model {
                    Ok(entry) => yardmaster::serve::served_config::served(&entry.config),
                    Err(e) => serde_json::json!({ "error": e.message }),
                };
                (name.clone(), value)
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(models)).expect("JSON values serialise"));
    } else {
        println!("{} models: {} ready, {refused} refused", repository.models.len(), repository.models.len() - refused);
        for model in repository.models.values() {
            match model {
                Ok(entry) => print_entry(entry),
                Err(e) => println!("REFUSED {}: {}", e.model, e.message),
            }
        }
    }
    if refused > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The summary of one servable model.
fn print_entry(entry: &ModelEntry) {
    let config = &entry.config;
    let versions: Vec<String> = entry.versions.iter().map(|v| v.version.to_string()).collect();
    let kind = match config.backend {
        Backend::OnnxRuntime => "onnxruntime",
        Backend::Ensemble => "ensemble",
    };
    println!(
        "READY   {}: {kind}, versions [{}], max_batch_size {}, {} instance(s), SLO {} ms ({})",
        entry.name,
        versions.join(", "),
        config.max_batch_size,
        config.instance_count(),
        entry.settings.slo_ms,
        entry.settings.slo_source
    );
    let tensor = |direction: &str, t: &TensorConfig| {
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        println!("          {direction} {} {} [{}]", t.name, t.data_type.triton_name(), dims.join(", "));
    };
    config.input.iter().for_each(|t| tensor("input ", t));
    config.output.iter().for_each(|t| tensor("output", t));
    for step in &config.ensemble_steps {
        println!("          step   {}", step.model_name);
    }
    if let Some(program) = entry.settings.program {
        println!("          runs the built-in program {} (served as an ensemble step only)", program.name());
    }
    if let Some(warning) = entry.ignored_fields_warning() {
        println!("          warning: {warning}");
    }
}
