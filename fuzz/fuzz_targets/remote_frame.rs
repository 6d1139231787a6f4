//! Fuzz target: `yardmaster::fuzzing::remote_frame` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| yardmaster::fuzzing::remote_frame(data));
