//! Fuzz target: `yardmaster::fuzzing::kserve_request` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| yardmaster::fuzzing::kserve_request(data));
