//! Fuzz target: `yardmaster::fuzzing::pipeline_toml` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| yardmaster::fuzzing::pipeline_toml(data));
