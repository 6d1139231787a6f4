//! Built-in pipelines for the simulator and the server (the TOML files under
//! `crates/formats/presets/`, embedded in the binary).

use yardmaster_engine::Pipeline;

use crate::pipeline;

/// The PP-OCR pipeline preset (stages `det` → `cls` → `rec`), the server's default.
pub const OCR_PRESET: &str = include_str!("../presets/ocr.toml");
/// The trivial one-stage pipeline preset (the serving overhead benchmark's).
pub const TINY_PRESET: &str = include_str!("../presets/tiny.toml");
/// The tiny decoder's iteration-level pipeline preset.
pub const LLM_TINY_PRESET: &str = include_str!("../presets/llm-tiny.toml");

/// Preset pipelines: name, TOML text.
pub const PIPELINES: &[(&str, &str)] = &[
    ("vision-chain", include_str!("../presets/vision-chain.toml")),
    ("traffic-dag", include_str!("../presets/traffic-dag.toml")),
    ("five-stage", include_str!("../presets/five-stage.toml")),
    ("llm", include_str!("../presets/llm.toml")),
    ("pard-tm", include_str!("../presets/pard-tm.toml")),
    ("pard-lv", include_str!("../presets/pard-lv.toml")),
    ("pard-ga", include_str!("../presets/pard-ga.toml")),
    ("pard-da", include_str!("../presets/pard-da.toml")),
    ("flex-fig11a", include_str!("../presets/flex-fig11a.toml")),
    ("flex-cluster", include_str!("../presets/flex-cluster.toml")),
    ("quart-bert8", include_str!("../presets/quart-bert8.toml")),
    ("llm-classes", include_str!("../presets/llm-classes.toml")),
    ("llm-compound", include_str!("../presets/llm-compound.toml")),
    ("ocr", OCR_PRESET),
    ("tiny", TINY_PRESET),
];

/// A pipeline by preset name, or from a file: `.toml` (our format) or `.json` (Loki's
/// application JSON, with profiles read from the file's directory).
pub fn pipeline(name_or_path: &str) -> Result<Pipeline, String> {
    if let Some((_, text)) = PIPELINES.iter().find(|(name, _)| *name == name_or_path) {
        return pipeline::from_toml(text, name_or_path).map_err(|e| e.to_string());
    }
    let path = std::path::Path::new(name_or_path);
    if !path.exists() {
        let names: Vec<&str> = PIPELINES.iter().map(|(n, _)| *n).collect();
        return Err(format!("{name_or_path:?} is neither a preset pipeline ({}) nor a file", names.join(", ")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("pipeline {}: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "json") {
        // A bare file name has an empty parent: its profiles are in the current folder.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        // No fallback profile: a variant Loki did not profile is left out, with a
        // warning that names it, rather than given latencies nobody measured.
        let profiles = pipeline::LokiProfiles::load(dir, "onnxruntime_gpu_ampere")
            .map_err(|e| format!("pipeline {name_or_path}: Loki's profiles beside it: {e}"))?;
        pipeline::from_loki_app(&text, &profiles, name_or_path).map_err(|e| e.to_string())
    } else {
        pipeline::from_toml(&text, name_or_path).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_preset_parses_and_validates() {
        for (name, _) in super::PIPELINES {
            let pipeline = super::pipeline(name).unwrap_or_else(|e| panic!("{e}"));
            assert!(!pipeline.stages.is_empty());
        }
        let error = super::pipeline("no-such-preset").unwrap_err();
        assert!(error.contains("vision-chain"), "{error}");
    }
}
