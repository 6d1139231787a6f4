//! The model repositories Yardmaster ships: `ocr` (PP-OCR as an ensemble of three
//! built-in steps, what `yardmaster serve` serves by default) and `tiny` (the trivial
//! model of the overhead benchmark). They are ordinary Triton repositories, served by
//! the same code as a user's (`super::repository`); their configurations are the files
//! under `crates/serve/repositories/`, embedded in the binary.
//!
//! [`BuiltinRepository::lay_out`] writes one into the assets folder
//! (`<assets>/repositories/<name>`, which the set-up script lays out and
//! `yardmaster serve` refreshes on start): each `config.pbtxt`, each model's `1/model.onnx`
//! (a link to the PP-OCR model the set-up script installed, or the trivial model
//! written there), and the shipped latency profiles — measured on the project's 2-core
//! CPU machine (`crates/formats/presets/ocr.toml` and `tiny.toml`) — in the profile
//! cache for the CPU with one intra-op thread. On any other device (a GPU) or thread
//! count, the models are profiled on first load like any repository's.

use std::path::{Path, PathBuf};

use yardmaster_dataplane::assets;
use yardmaster_dataplane::WorkerContext;
use yardmaster_formats::model_repository::stages::{cached_profile_path, sha256_of};
use yardmaster_formats::pipeline::{from_toml, stage_to_toml};
use yardmaster_formats::presets::{OCR_PRESET, TINY_PRESET};

use super::repository::RepositoryOptions;
use super::stack::ServedPipeline;
use super::tiny_model;

/// A repository Yardmaster ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinRepository {
    /// PP-OCR: the ensemble `ocr` of the built-in steps `det`, `cls`, `rec`.
    Ocr,
    /// The trivial model `tiny` (`y = x + 1` on 4 floats).
    Tiny,
}

/// One file of a shipped repository: its path inside the repository and its text.
type ConfigFile = (&'static str, &'static str);

const OCR_FILES: &[ConfigFile] = &[
    ("ocr/config.pbtxt", include_str!("../repositories/ocr/ocr/config.pbtxt")),
    ("det/config.pbtxt", include_str!("../repositories/ocr/det/config.pbtxt")),
    ("cls/config.pbtxt", include_str!("../repositories/ocr/cls/config.pbtxt")),
    ("rec/config.pbtxt", include_str!("../repositories/ocr/rec/config.pbtxt")),
];

const TINY_FILES: &[ConfigFile] = &[("tiny/config.pbtxt", include_str!("../repositories/tiny/tiny/config.pbtxt"))];

/// The device and thread count the shipped profiles were measured with.
const SHIPPED_PROFILE_DEVICE: &str = "cpu";
const SHIPPED_PROFILE_THREADS: usize = 1;

impl BuiltinRepository {
    /// Every shipped repository.
    pub const ALL: [BuiltinRepository; 2] = [BuiltinRepository::Ocr, BuiltinRepository::Tiny];

    /// Its name (`ocr`, `tiny`): also `--pipeline`'s.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinRepository::Ocr => "ocr",
            BuiltinRepository::Tiny => "tiny",
        }
    }

    /// The shipped repository named `name`.
    pub fn from_name(name: &str) -> Option<BuiltinRepository> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Where it is laid out under the assets folder `assets`.
    pub fn dir_in(self, assets: &Path) -> PathBuf {
        assets.join("repositories").join(self.name())
    }

    /// Lay it out in the assets folder, its profiles in `profile_cache`; see
    /// [`BuiltinRepository::lay_out_in`].
    pub fn lay_out(self, profile_cache: &Path) -> Result<PathBuf, String> {
        self.lay_out_in(&assets::assets_dir(), profile_cache)
    }

    /// Lay it out under `assets` (files already right are left alone, so a server
    /// polling the folder sees no change), and put its shipped profiles in
    /// `profile_cache` unless a profile is cached there already. Returns the
    /// repository's folder. PP-OCR needs the models the set-up script installs.
    pub fn lay_out_in(self, assets_folder: &Path, profile_cache: &Path) -> Result<PathBuf, String> {
        let dir = self.dir_in(assets_folder);
        let failed = |what: &Path, e: std::io::Error| format!("laying out the {} repository: {}: {e}", self.name(), what.display());
        let (files, preset, models): (&[ConfigFile], &str, Vec<(&str, PathBuf)>) = match self {
            BuiltinRepository::Ocr => {
                let models = [("det", assets::DET_MODEL), ("cls", assets::CLS_MODEL), ("rec", assets::REC_MODEL)];
                let models = models
                    .into_iter()
                    .map(|(name, file)| {
                        assets::model_path(file)
                            .map(|path| (name, path))
                            .map_err(|e| format!("{e} (run `bash scripts/setup.sh --deps` to install the PP-OCR models)"))
                    })
                    .collect::<Result<_, String>>()?;
                (OCR_FILES, OCR_PRESET, models)
            }
            BuiltinRepository::Tiny => {
                let path = tiny_model::ensure(assets_folder).map_err(|e| failed(assets_folder, e))?;
                (TINY_FILES, TINY_PRESET, vec![("tiny", path)])
            }
        };
        for (file, text) in files {
            write_if_changed(&dir.join(file), text.as_bytes()).map_err(|e| failed(&dir.join(file), e))?;
        }
        for (model, source) in &models {
            let link = dir.join(model).join("1").join("model.onnx");
            link_to(&link, source).map_err(|e| failed(&link, e))?;
        }
        if self == BuiltinRepository::Ocr {
            // An ensemble's version folder holds nothing, but must be there.
            let version = dir.join("ocr").join("1");
            std::fs::create_dir_all(&version).map_err(|e| failed(&version, e))?;
        }
        let pipeline = from_toml(preset, self.name()).map_err(|e| e.to_string())?;
        let slo_ms = pipeline.streams[0].slo_ns as f64 / 1e6;
        for (model, source) in &models {
            let stage = pipeline.stages.iter().find(|s| s.name == *model).expect("a preset stage per shipped model");
            let cached = cached_profile_path(profile_cache, &sha256_of(source)?, SHIPPED_PROFILE_DEVICE, SHIPPED_PROFILE_THREADS);
            if !cached.is_file() {
                write_if_changed(&cached, stage_to_toml(stage, slo_ms).as_bytes()).map_err(|e| failed(&cached, e))?;
            }
        }
        Ok(dir)
    }

    /// Lay it out under `assets_folder` ([`BuiltinRepository::lay_out_in`]) and load it
    /// as `yardmaster serve --pipeline NAME` does, on `context`'s device.
    pub fn serve(self, assets_folder: &Path, profile_cache: &Path, context: &WorkerContext) -> Result<ServedPipeline, String> {
        let dir = self.lay_out_in(assets_folder, profile_cache)?;
        let options = RepositoryOptions { profile_cache: profile_cache.to_path_buf(), ..RepositoryOptions::default() };
        let loaded = super::repository::load(&[dir], context, &options, &mut |line| tracing::info!("{line}"))?;
        if let Some(refused) = loaded.refused.first() {
            return Err(format!("the shipped {} repository: {refused}", self.name()));
        }
        Ok(loaded.served)
    }
}

/// Write `bytes` to `path` (making its folder) unless it holds them already; written
/// beside and renamed, so a reader never sees half a file.
fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    let folder = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(folder)?;
    let partial = folder.join(format!(".{}.{}.partial", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

/// Make `link` a symbolic link to `target`, unless it is one already.
fn link_to(link: &Path, target: &Path) -> std::io::Result<()> {
    if std::fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    std::fs::create_dir_all(link.parent().expect("a file in a folder"))?;
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(target, link)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_formats::model_repository::scan;

    #[test]
    fn the_tiny_repository_is_laid_out_once_with_its_shipped_profile() {
        let root = std::env::temp_dir().join(format!("yardmaster-builtin-{}", std::process::id()));
        let cache = root.join("profiles");
        let dir = BuiltinRepository::Tiny.lay_out_in(&root, &cache).unwrap();
        assert_eq!(dir, root.join("repositories/tiny"));
        let mut repository = scan(&[&dir]).unwrap();
        repository.complete_from_graphs();
        let tiny = repository.models["tiny"].as_ref().unwrap();
        assert_eq!((tiny.config.max_batch_size, tiny.settings.slo_ms), (64, 1000.0));
        let model = tiny.versions[0].model_file.clone().unwrap();
        let cached = cached_profile_path(&cache, &sha256_of(&model).unwrap(), "cpu", 1);
        let profile = from_toml(&std::fs::read_to_string(&cached).unwrap(), "cached").unwrap();
        assert_eq!(profile.stages[0].variants[0].name, "add");
        // Laid out again, nothing is rewritten (a polling server sees no change).
        let config = dir.join("tiny/config.pbtxt");
        let before = std::fs::metadata(&config).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        BuiltinRepository::Tiny.lay_out_in(&root, &cache).unwrap();
        assert_eq!(std::fs::metadata(&config).unwrap().modified().unwrap(), before);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn every_shipped_configuration_parses_and_names_its_programs() {
        use yardmaster_formats::model_repository::{BuiltinProgram, ModelConfig};
        for (file, text) in OCR_FILES.iter().chain(TINY_FILES) {
            let model = file.split('/').next().unwrap();
            let config = ModelConfig::from_pbtxt(text, file, model).unwrap_or_else(|e| panic!("{e}"));
            assert!(config.ignored_fields.is_empty(), "{file}: {:?}", config.ignored_fields);
            let program = config.parameters.get("yardmaster.program").map(|p| BuiltinProgram::from_name(p).unwrap());
            let expected = match model {
                "det" => Some(BuiltinProgram::OcrDet),
                "cls" => Some(BuiltinProgram::OcrCls),
                "rec" => Some(BuiltinProgram::OcrRec),
                _ => None,
            };
            assert_eq!(program, expected, "{file}");
        }
    }
}
