//! Fuzz target: `yardmaster::fuzzing::trace_file` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| yardmaster::fuzzing::trace_file(data));
