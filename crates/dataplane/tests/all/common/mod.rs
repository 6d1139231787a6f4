//! Shared test helpers: the runtime and cache (with a clear message when the set-up
//! script has not installed the library and models), and text rendering for OCR tests.
#![allow(dead_code)]

use std::sync::Arc;

use yardmaster_dataplane::ocr::RgbImage;
use yardmaster_dataplane::{assets, ModelCache, ModelKey, ModelSpec, Runtime};

/// The process's ONNX Runtime; panics with the set-up hint when it is not installed.
pub fn runtime() -> Arc<Runtime> {
    Runtime::global().unwrap_or_else(|e| panic!("{e}"))
}

/// A PP-OCR model by file name; panics with the set-up hint when missing.
pub fn model(file: &str, name: &str) -> ModelSpec {
    let path = assets::model_path(file).unwrap_or_else(|e| panic!("{e}"));
    ModelSpec::new(ModelKey::new(name, "default"), path)
}

/// A fresh cache.
pub fn cache() -> Arc<ModelCache> {
    Arc::new(ModelCache::default())
}

/// `lines` rendered in black on white (see [`yardmaster_dataplane::ocr::sample::render_text`]).
pub fn render(lines: &[&str], px: f32, width: usize, height: usize, left: f32, top: f32) -> RgbImage {
    yardmaster_dataplane::ocr::sample::render_text(lines, px, width, height, left, top).unwrap_or_else(|e| panic!("{e}"))
}
