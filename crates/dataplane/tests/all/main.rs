//! Integration tests of the data plane: real ONNX Runtime, real models.
//!
//! One test binary for the crate (each module was a test binary of its own): a test
//! run links the crate's dependencies once.

mod bench;
mod common;
mod gpu;
mod llm;
mod ocr;
mod sessions;
mod worker;
