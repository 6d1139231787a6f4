//! ONNX Runtime workers for Yardmaster: sessions per (model, variant), batch
//! execution, devices (CUDA when present, CPU otherwise), the host-memory model cache
//! and the latency profiler.
//!
//! This crate is the data plane's home in the workspace layout; its implementation
//! arrives with the data-plane issue and exposes nothing yet.
