//! Fuzz target: `yardmaster::fuzzing::policy_actions` (see docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    yardmaster::fuzzing::policy_actions(data);
});
