//! The fuzz smoke run of CI: every seed of `fuzz/corpus/TARGET/` and a few thousand
//! deterministic mutations of them go through the same entry points the libFuzzer
//! targets call (`yardmaster::fuzzing`). None may panic. The real fuzzing runs are by
//! hand with `cargo +nightly fuzz run TARGET` (docs/fuzzing.md).
//!
//! `YARDMASTER_FUZZ_MUTATIONS=N` changes the number of mutations per target (default
//! 1000, the action target half of that).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use yardmaster::fuzzing;

/// A target's entry point.
type Entry = fn(&[u8]);

/// The targets, by corpus directory, with their entry point.
const TARGETS: &[(&str, Entry)] = &[
    ("kserve_request", fuzzing::kserve_request),
    ("remote_frame", fuzzing::remote_frame),
    ("pipeline_toml", fuzzing::pipeline_toml),
    ("serve_config", fuzzing::serve_config),
    ("trace_file", fuzzing::trace_file),
    ("policy_actions", policy_actions),
];

fn policy_actions(data: &[u8]) {
    fuzzing::policy_actions(data);
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("a readable seed"))
        })
        .collect()
}

/// SplitMix64: a small, seeded source for the mutations (the same run every time).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that tend to matter to the decoders: delimiters, signs, digits, extremes.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xff{}[]\",:=-.0129e\n ";

/// One to four random edits of `input`, sometimes splicing in part of `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => out.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            3 if !out.is_empty() => {
                let start = rng.below(out.len());
                let end = (start + 1 + rng.below(8)).min(out.len());
                out.drain(start..end);
            }
            4 => out.truncate(at),
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let len = 1 + rng.below(other.len() - from);
                out.splice(at..at, other[from..from + len].iter().copied());
            }
            _ if !out.is_empty() => {
                // Repeat a chunk (deep nesting, long lists, many lines).
                let from = rng.below(out.len());
                let len = 1 + rng.below((out.len() - from).min(16));
                let chunk = out[from..from + len].to_vec();
                for _ in 0..1 + rng.below(8) {
                    out.splice(at..at, chunk.iter().copied());
                }
            }
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

/// Run `input` through `entry`; on a panic, fail naming the input so that it can be
/// added to the corpus and fixed.
fn run_one(target: &str, what: &str, entry: Entry, input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| entry(input))).is_err() {
        panic!("{target}: {what} panicked; input ({} bytes): {:?}", input.len(), String::from_utf8_lossy(input));
    }
}

fn mutations() -> usize {
    std::env::var("YARDMASTER_FUZZ_MUTATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(1000)
}

fn smoke(target: &str, entry: Entry, mutations: usize) {
    let seeds = seeds(target);
    assert!(seeds.len() >= 3, "{target}: the corpus has {} seeds, expected a handful", seeds.len());
    for (name, bytes) in &seeds {
        run_one(target, &format!("seed {name}"), entry, bytes);
    }
    let mut rng = Rng(target.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)));
    for i in 0..mutations {
        let (name, input) = &seeds[rng.below(seeds.len())];
        let (_, other) = &seeds[rng.below(seeds.len())];
        let mutated = mutate(&mut rng, input, other);
        run_one(target, &format!("mutation {i} of seed {name}"), entry, &mutated);
    }
}

#[test]
fn kserve_request_corpus() {
    smoke("kserve_request", fuzzing::kserve_request, mutations());
}

#[test]
fn remote_frame_corpus() {
    smoke("remote_frame", fuzzing::remote_frame, mutations());
}

#[test]
fn pipeline_toml_corpus() {
    smoke("pipeline_toml", fuzzing::pipeline_toml, mutations());
}

#[test]
fn serve_config_corpus() {
    smoke("serve_config", fuzzing::serve_config, mutations());
}

#[test]
fn trace_file_corpus() {
    smoke("trace_file", fuzzing::trace_file, mutations());
}

#[test]
fn policy_actions_corpus() {
    smoke("policy_actions", policy_actions, mutations() / 2);
}

#[test]
fn the_action_target_submits_requests_and_the_validator_sees_good_and_bad_actions() {
    let runs: Vec<_> = seeds("policy_actions").iter().map(|(_, bytes)| fuzzing::policy_actions(bytes)).collect();
    let submitted: usize = runs.iter().map(|r| r.submitted).sum();
    let accepted: u64 = runs.iter().map(|r| r.accepted).sum();
    let rejected: u64 = runs.iter().map(|r| r.rejected).sum();
    assert!(submitted >= 10, "the seeds submit {submitted} requests");
    assert!(accepted > 0 && rejected > 0, "accepted {accepted}, rejected {rejected}");
}

#[test]
fn every_target_has_a_corpus_and_every_corpus_a_target() {
    let dirs: Vec<String> = std::fs::read_dir(corpus_dir(""))
        .expect("fuzz/corpus exists")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    for (target, _) in TARGETS {
        assert!(dirs.iter().any(|d| d == target), "no corpus for {target}");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../fuzz/fuzz_targets/{target}.rs"));
        assert!(source.is_file(), "no fuzz target {}", source.display());
    }
    for dir in &dirs {
        assert!(TARGETS.iter().any(|(t, _)| t == dir), "corpus {dir} has no target");
    }
}
