//! Fuzz target: `yardmaster::fuzzing::serve_config` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| yardmaster::fuzzing::serve_config(data));
