//! The repository scan: every model folder of every repository directory, with its
//! configuration, the versions its `version_policy` serves, and its Yardmaster settings.
//!
//! As Triton does: a folder per model; numeric subfolders are versions (other
//! subfolders and files are ignored); `version_policy` picks the served ones (the
//! latest one by default); each served version of an ONNX model must hold its model
//! file (`model.onnx`, or the config's `default_model_filename`), while an ensemble's
//! version folders hold nothing. Folders whose names start with `.` are skipped.
//!
//! A model that cannot be served (a malformed `config.pbtxt`, a served version without
//! its model file, a `name` that differs from the folder, a model name found in two
//! repository directories, an ensemble step naming a model that is not served) is
//! returned as a [`ModelError`] with the reason; the other models are returned as they
//! are. Only a repository directory that cannot be read fails the whole scan.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::config::{Backend, ModelConfig, VersionPolicy};

/// The SLO of a model that gives none, in milliseconds.
pub const DEFAULT_SLO_MS: f64 = 1000.0;

/// The parameter in `config.pbtxt` that gives a model's SLO in milliseconds.
pub const SLO_PARAMETER: &str = "yardmaster.slo_ms";

/// The parameter in `config.pbtxt` that gives the per-request input shapes a model is
/// profiled with: `3x320x320,2048`, one shape per input in the graph's order.
pub const PROFILE_SHAPES_PARAMETER: &str = "yardmaster.profile_shapes";

/// The parameter in `config.pbtxt` that runs one of Yardmaster's built-in stage
/// programs around the model (see [`BuiltinProgram`]): `ocr-det`, `ocr-cls`, `ocr-rec`.
pub const PROGRAM_PARAMETER: &str = "yardmaster.program";

/// The parameter in `config.pbtxt` that caps the replicas the policy may scale the
/// model's stage to (by default four times `instance_group`'s count).
pub const MAX_REPLICAS_PARAMETER: &str = "yardmaster.max_replicas";

/// The parameter in `config.pbtxt` that says how many batch elements one request gives
/// the model on average (e.g. the text lines of an image); the model is profiled at
/// that many elements per request.
pub const ITEMS_PER_REQUEST_PARAMETER: &str = "yardmaster.items_per_request";

/// Every `yardmaster.*` parameter a `config.pbtxt` may give.
pub const KNOWN_PARAMETERS: [&str; 5] =
    [SLO_PARAMETER, PROFILE_SHAPES_PARAMETER, PROGRAM_PARAMETER, MAX_REPLICAS_PARAMETER, ITEMS_PER_REQUEST_PARAMETER];

/// Yardmaster's settings file beside `config.pbtxt`.
pub const SETTINGS_FILE: &str = "yardmaster.toml";

/// Every model found, by name: ready to serve, or why not.
#[derive(Debug)]
pub struct Repository {
    /// Each model folder's name and what came of it, sorted by name.
    pub models: BTreeMap<String, Result<ModelEntry, ModelError>>,
}

impl Repository {
    /// The models that can be served.
    pub fn ready(&self) -> impl Iterator<Item = &ModelEntry> {
        self.models.values().filter_map(|m| m.as_ref().ok())
    }

    /// The models that cannot, with the reasons.
    pub fn errors(&self) -> impl Iterator<Item = &ModelError> {
        self.models.values().filter_map(|m| m.as_ref().err())
    }
}

/// A model that can be served.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    /// Its name (its folder's name).
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
    /// Its `config.pbtxt`, when it has one.
    pub config_file: Option<PathBuf>,
    /// The effective configuration (see [`ModelConfig::from_graph`] for what the ONNX
    /// graph still has to fill in, and [`ModelEntry::complete_from_graph`]).
    pub config: ModelConfig,
    /// The served versions, lowest first.
    pub versions: Vec<ModelVersion>,
    /// Yardmaster's settings for it.
    pub settings: ModelSettings,
}

impl ModelEntry {
    /// The one warning to log at load naming the `config.pbtxt` fields Yardmaster does
    /// not act on (kept and served in the configuration as written), if there are any.
    pub fn ignored_fields_warning(&self) -> Option<String> {
        let fields = &self.config.ignored_fields;
        (!fields.is_empty()).then(|| {
            format!("model {:?}: config.pbtxt fields Yardmaster does not act on (served as written): {}", self.name, fields.join(", "))
        })
    }
}

/// One served version.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelVersion {
    /// The version number (its folder's name).
    pub version: u64,
    /// Its folder.
    pub dir: PathBuf,
    /// The ONNX file; `None` for an ensemble.
    pub model_file: Option<PathBuf>,
}

/// Yardmaster's own settings for a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    /// The model's SLO, end to end, in milliseconds.
    pub slo_ms: f64,
    /// Where it came from.
    pub slo_source: SloSource,
    /// Per-request input shapes to profile the model with (the `yardmaster.profile_shapes`
    /// parameter); `None`: the declared shapes, with a size chosen for dimensions of any size.
    pub profile_shapes: Option<Vec<Vec<usize>>>,
    /// The built-in stage program run around the model (`yardmaster.program`); such a
    /// model is served only as a step of an ensemble.
    pub program: Option<BuiltinProgram>,
    /// The most replicas of its stage (`yardmaster.max_replicas`); `None`: four times
    /// `instance_group`'s count.
    pub max_replicas: Option<u32>,
    /// Batch elements one request gives the model (`yardmaster.items_per_request`, 1
    /// by default): what it is profiled at.
    pub items_per_request: u32,
}

impl ModelSettings {
    /// The settings of a model that gives none: the default SLO, nothing else.
    pub fn defaults() -> ModelSettings {
        ModelSettings {
            slo_ms: DEFAULT_SLO_MS,
            slo_source: SloSource::Default,
            profile_shapes: None,
            program: None,
            max_replicas: None,
            items_per_request: 1,
        }
    }
}

/// A built-in stage program: Yardmaster's own pre- and post-processing around a
/// model, named by the `yardmaster.program` parameter. A model that runs one is
/// served only as a step of an ensemble (its requests are images and text lines, not
/// the model's tensors), and a step of one ensemble only; the step's stage keeps the
/// model's name. In the ensemble's step, `input_map` and `output_map` map the
/// program's own tensors ([`BuiltinProgram::inputs`], [`BuiltinProgram::outputs`]) to
/// the ensemble's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinProgram {
    /// PP-OCR text detection: an image in, the text boxes and their crops out.
    OcrDet,
    /// PP-OCR direction classification: crops in, crops turned upright out.
    OcrCls,
    /// PP-OCR recognition: crops in, lines of text with scores and boxes out.
    OcrRec,
}

impl BuiltinProgram {
    /// Every built-in program.
    pub const ALL: [BuiltinProgram; 3] = [BuiltinProgram::OcrDet, BuiltinProgram::OcrCls, BuiltinProgram::OcrRec];

    /// Its name in `yardmaster.program`.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinProgram::OcrDet => "ocr-det",
            BuiltinProgram::OcrCls => "ocr-cls",
            BuiltinProgram::OcrRec => "ocr-rec",
        }
    }

    /// The program named `name`.
    pub fn from_name(name: &str) -> Option<BuiltinProgram> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The tensors it reads (the keys of its step's `input_map`).
    pub fn inputs(self) -> &'static [&'static str] {
        match self {
            BuiltinProgram::OcrDet => &["image"],
            BuiltinProgram::OcrCls | BuiltinProgram::OcrRec => &["crops"],
        }
    }

    /// The tensors it writes (the keys of its step's `output_map`).
    pub fn outputs(self) -> &'static [&'static str] {
        match self {
            BuiltinProgram::OcrDet | BuiltinProgram::OcrCls => &["crops"],
            BuiltinProgram::OcrRec => &["texts", "scores", "boxes"],
        }
    }
}

/// Where a model's SLO came from.
#[derive(Debug, Clone, PartialEq)]
pub enum SloSource {
    /// Nothing gave one: [`DEFAULT_SLO_MS`].
    Default,
    /// The `yardmaster.slo_ms` parameter in `config.pbtxt`.
    Parameter,
    /// `slo_ms` in this `yardmaster.toml`.
    SettingsFile(PathBuf),
}

/// Why a model cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("model {model:?}: {message}")]
pub struct ModelError {
    /// The model (its folder's name).
    pub model: String,
    /// What is wrong, naming the file (and line and column) where there is one.
    pub message: String,
}

/// Why a repository directory could not be scanned at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("model repository {}: {message}", path.display())]
pub struct RepositoryError {
    /// The directory.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// Scan the repository directories `dirs`. A model name found in two of them is an
/// error for that model naming both; the other models are still returned.
pub fn scan<P: AsRef<Path>>(dirs: &[P]) -> Result<Repository, RepositoryError> {
    let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut seen_dirs: Vec<(PathBuf, PathBuf)> = Vec::new();
    for dir in dirs {
        let dir = dir.as_ref();
        let fail = |message: String| RepositoryError { path: dir.to_path_buf(), message };
        let canonical = fs::canonicalize(dir).map_err(|e| fail(format!("cannot be read: {e}")))?;
        if let Some((first, _)) = seen_dirs.iter().find(|(_, c)| *c == canonical) {
            return Err(fail(format!("is given twice (also as {})", first.display())));
        }
        seen_dirs.push((dir.to_path_buf(), canonical));
        let entries = fs::read_dir(dir).map_err(|e| fail(format!("cannot be read: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| fail(format!("cannot be listed: {e}")))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !entry.path().is_dir() {
                continue;
            }
            found.entry(name).or_default().push(entry.path());
        }
    }
    let mut models = BTreeMap::new();
    for (name, folders) in found {
        let result = match folders.as_slice() {
            [dir] => scan_model(dir, &name),
            _ => {
                let places: Vec<String> = folders.iter().map(|f| f.display().to_string()).collect();
                Err(ModelError { model: name.clone(), message: format!("found in more than one repository: {}", places.join(" and ")) })
            }
        };
        models.insert(name, result);
    }
    check_ensembles(&mut models);
    Ok(Repository { models })
}

/// Read one model folder `dir`, whose model is named `name`.
pub fn scan_model(dir: &Path, name: &str) -> Result<ModelEntry, ModelError> {
    let fail = |message: String| ModelError { model: name.into(), message };
    let config_path = dir.join("config.pbtxt");
    let (config, config_file) = if config_path.is_file() {
        let text = fs::read_to_string(&config_path).map_err(|e| fail(format!("{}: cannot be read: {e}", config_path.display())))?;
        let config = ModelConfig::from_pbtxt(&text, &config_path.display().to_string(), name).map_err(|e| fail(e.to_string()))?;
        (config, Some(config_path))
    } else {
        (ModelConfig::without_file(name), None)
    };
    entry_with(dir, name, config, config_file)
}

/// Read one model folder `dir`, whose model is named `name`, with `config` instead of
/// its `config.pbtxt` (a configuration given in the load request).
pub fn scan_model_with(dir: &Path, name: &str, config: ModelConfig) -> Result<ModelEntry, ModelError> {
    entry_with(dir, name, config, None)
}

/// The entry of the model `name` in `dir` configured by `config` (read from `config_file`).
fn entry_with(dir: &Path, name: &str, config: ModelConfig, config_file: Option<PathBuf>) -> Result<ModelEntry, ModelError> {
    let fail = |message: String| ModelError { model: name.into(), message };
    let versions = served_versions(dir, &config).map_err(fail)?;
    let settings = settings(dir, &config).map_err(fail)?;
    Ok(ModelEntry { name: name.into(), dir: dir.to_path_buf(), config_file, config, versions, settings })
}

/// The version folders `config.version_policy` serves, each checked for its model file.
fn served_versions(dir: &Path, config: &ModelConfig) -> Result<Vec<ModelVersion>, String> {
    let mut all: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: cannot be read: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: cannot be listed: {e}", dir.display()))?;
        let folder = entry.file_name().to_string_lossy().into_owned();
        if folder.is_empty() || !folder.bytes().all(|b| b.is_ascii_digit()) || !entry.path().is_dir() {
            continue;
        }
        let version: u64 = folder.parse().map_err(|_| format!("version folder {folder} is too large a number"))?;
        if let Some(other) = all.insert(version, entry.path()) {
            return Err(format!("version folders {} and {} are both version {version}", other.display(), entry.path().display()));
        }
    }
    if all.is_empty() {
        return Err(format!("{} has no version folders (numbered folders such as 1/ holding the model)", dir.display()));
    }
    let chosen: Vec<u64> = match &config.version_policy {
        VersionPolicy::Latest { num_versions } => all.keys().rev().take(*num_versions as usize).rev().copied().collect(),
        VersionPolicy::All => all.keys().copied().collect(),
        VersionPolicy::Specific { versions } => {
            let missing: Vec<String> = versions.iter().filter(|v| !all.contains_key(v)).map(u64::to_string).collect();
            if !missing.is_empty() {
                let present: Vec<String> = all.keys().map(u64::to_string).collect();
                return Err(format!(
                    "version_policy names version {} with no folder in {} (versions there: {})",
                    missing.join(", "),
                    dir.display(),
                    present.join(", ")
                ));
            }
            let mut versions = versions.clone();
            versions.sort_unstable();
            versions.dedup();
            versions
        }
    };
    chosen
        .into_iter()
        .map(|version| {
            let dir = all[&version].clone();
            let model_file = match config.backend {
                Backend::Ensemble => None,
                Backend::OnnxRuntime => {
                    let file = dir.join(&config.default_model_filename);
                    if !file.is_file() {
                        return Err(format!("version {version} has no model: {} is missing", file.display()));
                    }
                    Some(file)
                }
            };
            Ok(ModelVersion { version, dir, model_file })
        })
        .collect()
}

/// The shape of `yardmaster.toml`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    slo_ms: Option<f64>,
}

/// The model's Yardmaster settings from its parameters and `yardmaster.toml`.
fn settings(dir: &Path, config: &ModelConfig) -> Result<ModelSettings, String> {
    let check = |slo: f64, place: &str| {
        if slo.is_finite() && slo > 0.0 {
            Ok(slo)
        } else {
            Err(format!("{place}: the SLO must be a positive number of milliseconds, not {slo}"))
        }
    };
    if let Some(key) = config.parameters.keys().find(|k| k.starts_with("yardmaster.") && !KNOWN_PARAMETERS.contains(&k.as_str())) {
        return Err(format!("config.pbtxt: unknown Yardmaster parameter {key:?} (known: {})", KNOWN_PARAMETERS.join(", ")));
    }
    let program = match config.parameters.get(PROGRAM_PARAMETER) {
        Some(name) => Some(BuiltinProgram::from_name(name.trim()).ok_or_else(|| {
            let known: Vec<&str> = BuiltinProgram::ALL.iter().map(|p| p.name()).collect();
            format!("config.pbtxt parameter {PROGRAM_PARAMETER} = {name:?}: no such built-in program (known: {})", known.join(", "))
        })?),
        None => None,
    };
    if program.is_some() && config.backend == Backend::Ensemble {
        return Err(format!("config.pbtxt: an ensemble cannot run a built-in program ({PROGRAM_PARAMETER} belongs on its step models)"));
    }
    let count_parameter = |key: &str| -> Result<Option<u32>, String> {
        match config.parameters.get(key) {
            Some(text) => match text.trim().parse::<u32>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(format!("config.pbtxt parameter {key} = {text:?}: expected a whole number of at least 1")),
            },
            None => Ok(None),
        }
    };
    let max_replicas = count_parameter(MAX_REPLICAS_PARAMETER)?;
    let items_per_request = count_parameter(ITEMS_PER_REQUEST_PARAMETER)?.unwrap_or(1);
    let profile_shapes = match config.parameters.get(PROFILE_SHAPES_PARAMETER) {
        Some(text) => Some(parse_shapes(text).map_err(|e| format!("config.pbtxt parameter {PROFILE_SHAPES_PARAMETER} = {text:?}: {e}"))?),
        None => None,
    };
    let from_parameter = match config.parameters.get(SLO_PARAMETER) {
        Some(text) => {
            let place = format!("config.pbtxt parameter {SLO_PARAMETER}");
            let slo = text.trim().parse::<f64>().map_err(|_| format!("{place}: {text:?} is not a number of milliseconds"))?;
            Some(check(slo, &place)?)
        }
        None => None,
    };
    let file = dir.join(SETTINGS_FILE);
    let from_file = if file.is_file() {
        let text = fs::read_to_string(&file).map_err(|e| format!("{}: cannot be read: {e}", file.display()))?;
        let parsed: SettingsFile = toml::from_str(&text).map_err(|e| format!("{}: {}", file.display(), e.message()))?;
        parsed.slo_ms.map(|slo| check(slo, &file.display().to_string())).transpose()?
    } else {
        None
    };
    let (slo_ms, slo_source) = match (from_parameter, from_file) {
        (Some(_), Some(_)) => {
            return Err(format!("the SLO is given both by the {SLO_PARAMETER} parameter and in {}; keep one", file.display()));
        }
        (Some(slo_ms), None) => (slo_ms, SloSource::Parameter),
        (None, Some(slo_ms)) => (slo_ms, SloSource::SettingsFile(file)),
        (None, None) => (DEFAULT_SLO_MS, SloSource::Default),
    };
    Ok(ModelSettings { slo_ms, slo_source, profile_shapes, program, max_replicas, items_per_request })
}

/// Shapes written `3x320x320,2048`: one per input, dimensions joined by `x`, each at least 1.
fn parse_shapes(text: &str) -> Result<Vec<Vec<usize>>, String> {
    text.split(',')
        .map(|shape| {
            shape
                .trim()
                .split('x')
                .map(|d| match d.trim().parse::<usize>() {
                    Ok(size) if size > 0 => Ok(size),
                    _ => Err(format!("{d:?} is not a size (write shapes like 3x320x320, one per input, separated by commas)")),
                })
                .collect()
        })
        .collect()
}

/// Turn into errors the ensembles whose steps name a model that is not served, or a
/// version of it that is not, until none is left (an ensemble may step into another).
pub(super) fn check_ensembles(models: &mut BTreeMap<String, Result<ModelEntry, ModelError>>) {
    loop {
        let mut failed = None;
        for (name, entry) in models.iter() {
            let Ok(entry) = entry else { continue };
            for (i, step) in entry.config.ensemble_steps.iter().enumerate() {
                let problem = match models.get(&step.model_name) {
                    None => Some("which is not in the repository".to_string()),
                    Some(Err(e)) => Some(format!("which cannot be served ({})", e.message)),
                    Some(Ok(target))
                        if step.model_version >= 0 && !target.versions.iter().any(|v| v.version == step.model_version as u64) =>
                    {
                        let served: Vec<String> = target.versions.iter().map(|v| v.version.to_string()).collect();
                        Some(format!("version {}, which is not served (served: {})", step.model_version, served.join(", ")))
                    }
                    Some(Ok(target)) if target.settings.program.is_some() && first_user(models, &step.model_name) != Some(name) => {
                        Some(format!(
                            "which runs the built-in program {} and is already a step of ensemble {:?} (such a model serves one ensemble)",
                            target.settings.program.map_or("", |p| p.name()),
                            first_user(models, &step.model_name).unwrap_or_default()
                        ))
                    }
                    Some(Ok(_)) if reaches(models, &step.model_name, name, 0) => {
                        Some("which leads back to this ensemble (a cycle)".to_string())
                    }
                    Some(Ok(_)) => None,
                };
                if let Some(problem) = problem {
                    failed = Some((name.clone(), format!("ensemble step {} runs model {:?}, {problem}", i + 1, step.model_name)));
                    break;
                }
            }
            if failed.is_some() {
                break;
            }
        }
        match failed {
            Some((name, message)) => {
                models.insert(name.clone(), Err(ModelError { model: name, message }));
            }
            None => return,
        }
    }
}

/// The first ensemble (by name) that can be served and has a step running `model`.
fn first_user<'a>(models: &'a BTreeMap<String, Result<ModelEntry, ModelError>>, model: &str) -> Option<&'a str> {
    models.iter().find_map(|(name, entry)| match entry {
        Ok(entry) if entry.config.ensemble_steps.iter().any(|s| s.model_name == model) => Some(name.as_str()),
        _ => None,
    })
}

/// Whether the steps of ensemble `from`, followed through nested ensembles, reach `to`.
fn reaches(models: &BTreeMap<String, Result<ModelEntry, ModelError>>, from: &str, to: &str, depth: usize) -> bool {
    if from == to {
        return true;
    }
    let Some(Ok(entry)) = models.get(from) else { return false };
    depth < models.len() && entry.config.ensemble_steps.iter().any(|s| reaches(models, &s.model_name, to, depth + 1))
}

impl fmt::Display for SloSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SloSource::Default => write!(f, "the default"),
            SloSource::Parameter => write!(f, "the {SLO_PARAMETER} parameter"),
            SloSource::SettingsFile(path) => write!(f, "{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_repository::config::FromGraph;
    use crate::model_repository::test_dir::TempDir;

    fn ok<'r>(repo: &'r Repository, name: &str) -> &'r ModelEntry {
        match repo.models.get(name) {
            Some(Ok(entry)) => entry,
            other => panic!("{name}: {other:?}"),
        }
    }

    fn err<'r>(repo: &'r Repository, name: &str) -> &'r str {
        match repo.models.get(name) {
            Some(Err(e)) => {
                assert_eq!(e.model, name);
                &e.message
            }
            other => panic!("{name} should be refused: {other:?}"),
        }
    }

    fn versions(entry: &ModelEntry) -> Vec<u64> {
        entry.versions.iter().map(|v| v.version).collect()
    }

    #[test]
    fn scans_models_and_applies_version_policies() {
        let dir = TempDir::new("policies");
        dir.onnx("plain", &[1, 2]).folder("plain/notes").file("plain/README", "x").file("README.md", "top-level files are skipped");
        dir.onnx("latest2", &[1, 3, 10]).file(
            "latest2/config.pbtxt",
            "version_policy { latest { num_versions: 2 } }\nparameters { key: \"yardmaster.slo_ms\" value: { string_value: \"250\" } }",
        );
        dir.onnx("every", &[1, 2]).file("every/config.pbtxt", "name: \"every\"\nversion_policy: { all: {} }");
        dir.onnx("pick", &[1, 3]).folder("pick/2").file("pick/config.pbtxt", "version_policy { specific { versions: [3, 1] } }");
        dir.onnx("few", &[4]).file("few/config.pbtxt", "version_policy { latest { num_versions: 5 } }");
        dir.onnx(".hidden", &[1]);
        dir.file("custom/1/net.onnx", "x").file("custom/config.pbtxt", "default_model_filename: \"net.onnx\"\n");
        dir.onnx("tuned", &[1]).file("tuned/yardmaster.toml", "slo_ms = 75\n").file(
            "tuned/config.pbtxt",
            "platform: \"onnxruntime_onnx\"\nmax_batch_size: 8\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n\
             output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\ndynamic_batching { preferred_batch_size: [ 4, 8 ] }\n\
             instance_group [ { count: 2 kind: KIND_CPU } ]\nresponse_cache { enable: true }\n",
        );

        let repo = scan(&[&dir.0]).unwrap();
        let names: Vec<&str> = repo.models.keys().map(String::as_str).collect();
        assert_eq!(names, ["custom", "every", "few", "latest2", "pick", "plain", "tuned"], "hidden folders and files are skipped");
        assert_eq!(repo.errors().count(), 0, "{:?}", repo.errors().collect::<Vec<_>>());

        let plain = ok(&repo, "plain");
        assert_eq!(versions(plain), [2], "latest 1 by default");
        assert_eq!(plain.versions[0].model_file.as_deref(), Some(dir.0.join("plain/2/model.onnx").as_path()));
        assert_eq!(plain.config_file, None);
        assert_eq!(plain.config.from_graph, Some(FromGraph::Everything));
        assert_eq!(plain.config.name, "plain");
        assert_eq!(plain.settings, ModelSettings::defaults());

        let latest2 = ok(&repo, "latest2");
        assert_eq!(versions(latest2), [3, 10], "versions are ordered as numbers");
        assert_eq!(latest2.config.name, "latest2", "a config without name takes the folder's");
        assert_eq!(latest2.settings, ModelSettings { slo_ms: 250.0, slo_source: SloSource::Parameter, ..ModelSettings::defaults() });
        assert_eq!(versions(ok(&repo, "every")), [1, 2]);
        assert_eq!(versions(ok(&repo, "pick")), [1, 3], "version 2 has no model, but it is not served");
        assert_eq!(versions(ok(&repo, "few")), [4], "latest 5 serves what there is");
        assert_eq!(ok(&repo, "custom").versions[0].model_file.as_deref(), Some(dir.0.join("custom/1/net.onnx").as_path()));

        let tuned = ok(&repo, "tuned");
        assert_eq!(
            tuned.settings,
            ModelSettings {
                slo_ms: 75.0,
                slo_source: SloSource::SettingsFile(dir.0.join("tuned/yardmaster.toml")),
                ..ModelSettings::defaults()
            }
        );
        assert_eq!(tuned.config.max_batch_size, 8);
        assert_eq!(tuned.config.instance_count(), 2);
        assert_eq!(tuned.config_file.as_deref(), Some(dir.0.join("tuned/config.pbtxt").as_path()));
        assert_eq!(
            tuned.ignored_fields_warning().unwrap(),
            "model \"tuned\": config.pbtxt fields Yardmaster does not act on (served as written): response_cache"
        );
        assert_eq!(plain.ignored_fields_warning(), None);
        assert_eq!(repo.ready().count(), 7);
    }

    #[test]
    fn broken_models_are_reported_and_the_others_returned() {
        let dir = TempDir::new("broken");
        dir.onnx("good", &[1]);
        dir.onnx("badtext", &[1])
            .file("badtext/config.pbtxt", "name: \"badtext\"\nmax_batch_size: 4\ninput { name: \"x\" dims: [1,, 2] }\n");
        dir.folder("nomodel/1");
        dir.onnx("newest_empty", &[1]).folder("newest_empty/2");
        dir.onnx("renamed", &[1]).file("renamed/config.pbtxt", "name: \"other\"");
        dir.onnx("missing_specific", &[1, 2]).file("missing_specific/config.pbtxt", "version_policy { specific { versions: [2, 4] } }");
        dir.file("noversions/config.pbtxt", "max_batch_size: 1");
        dir.onnx("bad_slo", &[1])
            .file("bad_slo/config.pbtxt", "parameters { key: \"yardmaster.slo_ms\" value { string_value: \"fast\" } }");
        dir.onnx("zero_slo", &[1]).file("zero_slo/yardmaster.toml", "slo_ms = 0");
        dir.onnx("both_slo", &[1])
            .file("both_slo/config.pbtxt", "parameters { key: \"yardmaster.slo_ms\" value { string_value: \"5\" } }")
            .file("both_slo/yardmaster.toml", "slo_ms = 5");
        dir.onnx("typo_param", &[1])
            .file("typo_param/config.pbtxt", "parameters { key: \"yardmaster.slo\" value { string_value: \"5\" } }");
        dir.onnx("typo_toml", &[1]).file("typo_toml/yardmaster.toml", "slo = 5");
        dir.onnx("tensorrt", &[1]).file("tensorrt/config.pbtxt", "platform: \"tensorrt_plan\"");
        dir.onnx("bad_shapes", &[1])
            .file("bad_shapes/config.pbtxt", "parameters { key: \"yardmaster.profile_shapes\" value { string_value: \"3x0x320\" } }");
        dir.onnx("shapes", &[1])
            .file("shapes/config.pbtxt", "parameters { key: \"yardmaster.profile_shapes\" value { string_value: \"3x320x320, 2048\" } }");

        let repo = scan(&[&dir.0]).unwrap();
        let ready: Vec<&str> = repo.ready().map(|m| m.name.as_str()).collect();
        assert_eq!(ready, ["good", "shapes"]);
        assert_eq!(repo.errors().count(), 13);
        assert_eq!(ok(&repo, "shapes").settings.profile_shapes, Some(vec![vec![3, 320, 320], vec![2048]]));
        assert!(
            err(&repo, "bad_shapes").contains("yardmaster.profile_shapes = \"3x0x320\": \"0\" is not a size"),
            "{}",
            err(&repo, "bad_shapes")
        );

        let config = dir.0.join("badtext/config.pbtxt").display().to_string();
        assert_eq!(err(&repo, "badtext"), format!("{config}:3:28: expected a value for `dims`, found `,`"));
        assert!(
            err(&repo, "nomodel").contains("version 1 has no model:") && err(&repo, "nomodel").contains("nomodel/1/model.onnx is missing")
        );
        assert!(err(&repo, "newest_empty").contains("version 2 has no model"), "the served (latest) version is checked");
        assert!(
            err(&repo, "renamed").contains(":1:7: name \"other\" differs from the model's folder \"renamed\""),
            "{}",
            err(&repo, "renamed")
        );
        assert!(
            err(&repo, "missing_specific").contains("version_policy names version 4 with no folder"),
            "{}",
            err(&repo, "missing_specific")
        );
        assert!(err(&repo, "missing_specific").contains("(versions there: 1, 2)"));
        assert!(err(&repo, "noversions").contains("has no version folders"));
        assert!(err(&repo, "bad_slo").contains("\"fast\" is not a number of milliseconds"));
        assert!(err(&repo, "zero_slo").contains("the SLO must be a positive number of milliseconds, not 0"), "{}", err(&repo, "zero_slo"));
        assert!(err(&repo, "both_slo").contains("given both by the yardmaster.slo_ms parameter and in"));
        assert!(err(&repo, "typo_param").contains("unknown Yardmaster parameter \"yardmaster.slo\""));
        assert!(err(&repo, "typo_toml").contains("typo_toml/yardmaster.toml: unknown field `slo`"), "{}", err(&repo, "typo_toml"));
        assert!(err(&repo, "tensorrt").contains("platform \"tensorrt_plan\" is not served"));
        let shown = repo.models["renamed"].as_ref().unwrap_err().to_string();
        assert!(shown.starts_with("model \"renamed\": "), "{shown}");
    }

    #[test]
    fn a_name_in_two_repositories_is_an_error_naming_both() {
        let (a, b) = (TempDir::new("a"), TempDir::new("b"));
        a.onnx("shared", &[1]).onnx("only_a", &[1]);
        b.onnx("shared", &[2]).onnx("only_b", &[1]);
        let repo = scan(&[&a.0, &b.0]).unwrap();
        let message = err(&repo, "shared");
        assert!(message.contains("found in more than one repository"), "{message}");
        assert!(
            message.contains(&a.0.join("shared").display().to_string()) && message.contains(&b.0.join("shared").display().to_string()),
            "{message}"
        );
        let ready: Vec<&str> = repo.ready().map(|m| m.name.as_str()).collect();
        assert_eq!(ready, ["only_a", "only_b"]);

        let e = scan(&[&a.0, &a.0]).unwrap_err();
        assert!(e.message.contains("is given twice"), "{e}");
        let missing = a.0.join("no-such-dir");
        let e = scan(&[&missing]).unwrap_err();
        assert_eq!(e.path, missing);
        assert!(e.to_string().contains("cannot be read"), "{e}");
    }

    #[test]
    fn ensembles_are_checked_against_the_repository() {
        let dir = TempDir::new("ensembles");
        dir.onnx("det", &[1, 2]).onnx("rec", &[1]).folder("broken/1");
        let ensemble = |steps: &[(&str, i64)]| {
            let steps: Vec<String> = steps.iter().map(|(m, v)| format!("step {{ model_name: \"{m}\" model_version: {v} }}")).collect();
            format!("platform: \"ensemble\"\nensemble_scheduling {{ {} }}", steps.join(" "))
        };
        dir.folder("pipe/1").file("pipe/config.pbtxt", ensemble(&[("det", -1), ("rec", 1)]));
        dir.folder("ghost_step/1").file("ghost_step/config.pbtxt", ensemble(&[("det", -1), ("ghost", -1)]));
        dir.folder("to_broken/1").file("to_broken/config.pbtxt", ensemble(&[("broken", -1)]));
        dir.folder("old_version/1").file("old_version/config.pbtxt", ensemble(&[("det", 1)]));
        dir.folder("outer/1").file("outer/config.pbtxt", ensemble(&[("pipe", -1)]));
        dir.folder("outer_bad/1").file("outer_bad/config.pbtxt", ensemble(&[("to_broken", -1)]));
        dir.folder("loop_a/1").file("loop_a/config.pbtxt", ensemble(&[("loop_b", -1)]));
        dir.folder("loop_b/1").file("loop_b/config.pbtxt", ensemble(&[("loop_a", -1)]));
        dir.file("no_version/config.pbtxt", ensemble(&[("det", -1)]));

        let repo = scan(&[&dir.0]).unwrap();
        let pipe = ok(&repo, "pipe");
        assert_eq!(
            pipe.versions,
            [ModelVersion { version: 1, dir: dir.0.join("pipe/1"), model_file: None }],
            "an ensemble's folder holds no model"
        );
        assert_eq!(pipe.config.ensemble_steps.len(), 2);
        ok(&repo, "outer");
        assert_eq!(err(&repo, "ghost_step"), "ensemble step 2 runs model \"ghost\", which is not in the repository");
        assert!(
            err(&repo, "to_broken").starts_with("ensemble step 1 runs model \"broken\", which cannot be served (version 1 has no model")
        );
        assert_eq!(err(&repo, "old_version"), "ensemble step 1 runs model \"det\", version 1, which is not served (served: 2)");
        assert!(
            err(&repo, "outer_bad").contains("runs model \"to_broken\", which cannot be served"),
            "a failure passes up through nested ensembles"
        );
        assert!(err(&repo, "loop_a").contains("a cycle"), "{}", err(&repo, "loop_a"));
        assert!(err(&repo, "loop_b").contains("loop_a"), "{}", err(&repo, "loop_b"));
        assert!(err(&repo, "no_version").contains("has no version folders"));
    }

    #[test]
    fn yardmaster_parameters_are_read_and_a_builtin_step_serves_one_ensemble() {
        let dir = TempDir::new("builtin");
        let param = |key: &str, value: &str| format!("parameters {{ key: \"{key}\" value {{ string_value: \"{value}\" }} }}\n");
        let step = format!(
            "{}{}{}",
            param(PROGRAM_PARAMETER, "ocr-rec"),
            param(MAX_REPLICAS_PARAMETER, "3"),
            param(ITEMS_PER_REQUEST_PARAMETER, "5")
        );
        dir.onnx("rec", &[1]).file("rec/config.pbtxt", &step);
        dir.onnx("bad_program", &[1]).file("bad_program/config.pbtxt", param(PROGRAM_PARAMETER, "ocr-all"));
        dir.onnx("zero_replicas", &[1]).file("zero_replicas/config.pbtxt", param(MAX_REPLICAS_PARAMETER, "0"));
        dir.onnx("half_item", &[1]).file("half_item/config.pbtxt", param(ITEMS_PER_REQUEST_PARAMETER, "0.5"));
        let ensemble = |program: Option<&str>| {
            let extra = program.map(|p| param(PROGRAM_PARAMETER, p)).unwrap_or_default();
            format!("platform: \"ensemble\"\nensemble_scheduling {{ step {{ model_name: \"rec\" }} }}\n{extra}")
        };
        dir.folder("a_first/1").file("a_first/config.pbtxt", ensemble(None));
        dir.folder("b_second/1").file("b_second/config.pbtxt", ensemble(None));
        dir.folder("c_programmed/1").file("c_programmed/config.pbtxt", ensemble(Some("ocr-det")));

        let repo = scan(&[&dir.0]).unwrap();
        let settings = &ok(&repo, "rec").settings;
        assert_eq!((settings.program, settings.max_replicas, settings.items_per_request), (Some(BuiltinProgram::OcrRec), Some(3), 5));
        assert!(err(&repo, "bad_program").contains("no such built-in program (known: ocr-det, ocr-cls, ocr-rec)"));
        assert!(err(&repo, "zero_replicas").contains("yardmaster.max_replicas = \"0\": expected a whole number of at least 1"));
        assert!(err(&repo, "half_item").contains("yardmaster.items_per_request"));
        ok(&repo, "a_first");
        assert!(
            err(&repo, "b_second").contains("runs the built-in program ocr-rec and is already a step of ensemble \"a_first\""),
            "{}",
            err(&repo, "b_second")
        );
        assert!(err(&repo, "c_programmed").contains("an ensemble cannot run a built-in program"));
    }
}
