//! The data plane's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the data plane.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DataplaneError {
    /// A file the data plane needs (library, model) is not where it was looked for.
    #[error("{what} not found at {path}: {hint}")]
    Missing {
        /// What was looked for.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// ONNX Runtime reported an error.
    #[error("ONNX Runtime: {0}")]
    Ort(String),
    /// A batch could not be formed or split (shapes, batch limits).
    #[error("batch: {0}")]
    Batch(String),
    /// A run was stopped by an abort.
    #[error("the run was aborted")]
    Aborted,
    /// Reading a file failed.
    #[error("reading {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// A worker is gone (retired or its thread ended).
    #[error("worker {0} is not running")]
    WorkerGone(u32),
    /// Input that the model or a pipeline stage cannot use.
    #[error("invalid input: {0}")]
    Invalid(String),
}

impl DataplaneError {
    /// Wraps an `ort` error (of any recovery payload).
    pub fn ort<R>(error: ort::Error<R>) -> Self {
        DataplaneError::Ort(error.to_string())
    }
}

/// The data plane's result type.
pub type Result<T, E = DataplaneError> = std::result::Result<T, E>;
