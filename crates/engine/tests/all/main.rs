//! Integration tests of the engine: lifecycle invariants under random policies, DAG
//! split and merge, preemption, scaling delays, swaps, LLM frames, metrics on
//! hand-computed cases — through the engine's public surface, with pipelines read by
//! `yardmaster_formats`.

mod engine;
mod reconfigure;
mod sequences;
