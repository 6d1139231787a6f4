//! The tiny decoder on ONNX Runtime (CPU): batching rows of different lengths changes
//! no token, the KV cache gives the tokens a full recompute gives, evictions (recompute
//! and swap) and aborted frames resume to the same text, and the memory held is what
//! the cache sizes say. `decode_step_latency_by_batch_size` prints the step latency
//! table of docs/calm.md (run it with `--nocapture`).

use crate::common;

use std::time::Duration;

use yardmaster_dataplane::llm::{
    tiny_decoder, DecoderConfig, DecoderSession, DecoderWorker, Eviction, FrameRequest, FrameSequence, SequenceCache,
};
use yardmaster_dataplane::DataplaneError;

fn session() -> DecoderSession {
    let (path, config) = tiny_decoder().unwrap_or_else(|e| panic!("{e}"));
    DecoderSession::load(&common::runtime(), &path, config, 1).unwrap_or_else(|e| panic!("{e}"))
}

/// A prompt of `len` token ids drawn from `seed`.
fn prompt(len: usize, seed: u64) -> Vec<i64> {
    let vocab = DecoderConfig::tiny().vocab as u64;
    (0..len as u64).map(|i| ((i * 2_654_435_761 + seed * 97 + 13) % vocab) as i64).collect()
}

#[test]
fn a_wrong_model_file_is_refused() {
    let (path, config) = tiny_decoder().unwrap();
    let other = DecoderConfig { seed: config.seed + 1, ..config };
    let error = DecoderSession::load(&common::runtime(), &path, other, 1).unwrap_err();
    assert!(error.to_string().contains("not the decoder expected"), "{error}");
}

#[test]
fn the_kv_cache_gives_the_tokens_a_full_recompute_gives() {
    let mut s = session();
    let p = prompt(37, 1);
    let stepwise = s.generate(&p, 24, 1).unwrap();
    assert_eq!(stepwise.len(), 24);
    assert_eq!(s.generate(&p, 24, 24).unwrap(), stepwise, "one frame of 24 steps = 24 frames of one");
    assert_eq!(s.generate(&p, 24, 5).unwrap(), stepwise);
    // No cache at all: prefill the prompt and the first k tokens, the next one follows.
    for k in [1, 9, 23] {
        let mut text = p.clone();
        text.extend(&stepwise[..k]);
        let feed = FrameSequence { cache: SequenceCache::empty(s.config()), feed: text, steps: 1 };
        let run = s.run_frame(vec![feed], &|| false).unwrap();
        assert_eq!(run.outputs[0].tokens, vec![stepwise[k]], "after {k} tokens");
        assert_eq!(run.outputs[0].cache.len(), p.len() + k);
    }
    assert!(stepwise.iter().any(|&t| t != stepwise[0]), "the model does not emit one token forever: {stepwise:?}");
}

#[test]
fn batching_rows_of_different_lengths_changes_no_token() {
    let mut s = session();
    let prompts = [prompt(3, 2), prompt(120, 3), prompt(41, 4), prompt(1, 5)];
    let steps = [6, 9, 1, 12];
    let alone: Vec<Vec<i64>> = prompts.iter().zip(steps).map(|(p, n)| s.generate(p, n, n).unwrap()).collect();
    let frame: Vec<FrameSequence> = prompts
        .iter()
        .zip(steps)
        .map(|(p, n)| FrameSequence { cache: SequenceCache::empty(s.config()), feed: p.clone(), steps: n })
        .collect();
    let run = s.run_frame(frame, &|| false).unwrap();
    for (i, output) in run.outputs.iter().enumerate() {
        assert_eq!(output.tokens, alone[i], "row {i}");
        assert_eq!(output.cache.len(), prompts[i].len() + steps[i] - 1, "row {i}: all but the last token cached");
    }
    // The batch shrinks as rows finish: 4 rows, then 3 after step 1, 2 after step 6, …
    let batches: Vec<usize> = run.steps.iter().map(|t| t.batch).collect();
    assert_eq!(batches, [4, 3, 3, 3, 3, 3, 2, 2, 2, 1, 1, 1]);
    // Mixed frames: resumed rows (one token fed) beside a prefill.
    let first = s
        .run_frame(vec![FrameSequence { cache: SequenceCache::empty(s.config()), feed: prompts[1].clone(), steps: 4 }], &|| false)
        .unwrap();
    let resumed = first.outputs.into_iter().next().unwrap();
    let mixed = vec![
        FrameSequence { cache: resumed.cache, feed: vec![*resumed.tokens.last().unwrap()], steps: 5 },
        FrameSequence { cache: SequenceCache::empty(s.config()), feed: prompts[2].clone(), steps: 1 },
    ];
    let run = s.run_frame(mixed, &|| false).unwrap();
    let longer = s.generate(&prompts[1], 9, 9).unwrap();
    assert_eq!([&resumed.tokens[..], &run.outputs[0].tokens[..]].concat(), longer);
    assert_eq!(run.outputs[1].tokens, alone[2]);
}

#[test]
fn evicted_and_aborted_sequences_resume_to_the_same_text() {
    let mut s = session();
    let p = prompt(50, 6);
    let reference = s.generate(&p, 30, 30).unwrap();
    let kv = DecoderConfig::tiny().kv_bytes_per_token();
    let mut worker = DecoderWorker::new(s);
    let text = |n: usize| [&p[..], &reference[..n]].concat();
    let request = |n: usize, reuse: bool, steps: usize| FrameRequest { id: 7, text: text(n), reuse, steps, last: false };

    let frame = worker.run(&[request(0, false, 8)], &|| false).unwrap();
    assert_eq!(frame.results[0].tokens, reference[..8]);
    assert_eq!(frame.results[0].prefilled, 50);
    assert_eq!(worker.resident(), [(7, 57)]);
    assert_eq!(worker.resident_bytes(), 57 * kv);

    // Resident: one token fed, nothing prefilled.
    let frame = worker.run(&[request(8, true, 4)], &|| false).unwrap();
    assert_eq!((frame.results[0].tokens.as_slice(), frame.results[0].prefilled), (&reference[8..12], 0));

    // Swapped: out of the budget, back with no prefill.
    worker.evict(7, Eviction::Swap);
    assert_eq!((worker.resident_bytes(), worker.swapped_bytes()), (0, 61 * kv));
    let frame = worker.run(&[request(12, true, 4)], &|| false).unwrap();
    assert_eq!((frame.results[0].tokens.as_slice(), frame.results[0].prefilled), (&reference[12..16], 0));
    assert_eq!(worker.swapped_bytes(), 0);

    // Evicted by recompute: the whole text is prefilled again, the tokens are the same.
    worker.evict(7, Eviction::Recompute);
    assert_eq!(worker.resident_bytes() + worker.swapped_bytes(), 0);
    let frame = worker.run(&[request(16, false, 4)], &|| false).unwrap();
    assert_eq!((frame.results[0].tokens.as_slice(), frame.results[0].prefilled), (&reference[16..20], 66));
    // A cache expected but missing (forgotten) is recomputed, and says so.
    worker.forget(7);
    let frame = worker.run(&[request(20, true, 2)], &|| false).unwrap();
    assert!(frame.results[0].recomputed);
    assert_eq!(frame.results[0].tokens, reference[20..22]);

    // An aborted frame returns nothing and keeps nothing.
    let calls = std::cell::Cell::new(0);
    let stop = || {
        calls.set(calls.get() + 1);
        calls.get() > 3
    };
    let aborted = worker.run(&[request(22, true, 6)], &stop);
    assert!(matches!(aborted, Err(DataplaneError::Aborted)), "{aborted:?}");
    assert!(worker.resident().is_empty());
    let frame = worker.run(&[request(22, false, 8)], &|| false).unwrap();
    assert_eq!(frame.results[0].tokens, reference[22..30]);

    // A cache longer than the text (a frame the caller never saw the end of) is cut.
    let mut longer = worker.run(&[FrameRequest { last: false, ..request(22, false, 8) }], &|| false).unwrap();
    assert_eq!(longer.results.remove(0).tokens, reference[22..30]);
    assert_eq!(worker.resident(), [(7, 79)]);
    let frame = worker.run(&[request(25, true, 3)], &|| false).unwrap();
    assert_eq!((frame.results[0].tokens.as_slice(), frame.results[0].prefilled), (&reference[25..28], 0));
    assert_eq!(frame.results[0].trimmed, 79 - 74);
    // A prefill asked for while a cache is held: the cache is dropped, and reported.
    let frame = worker.run(&[request(28, false, 1)], &|| false).unwrap();
    assert!(frame.results[0].stale && !frame.results[0].recomputed);
    assert_eq!(frame.results[0].tokens, reference[28..29]);

    // The last frame drops the cache.
    worker.run(&[FrameRequest { last: true, ..request(29, true, 1) }], &|| false).unwrap();
    assert!(worker.resident().is_empty());
}

#[test]
fn bad_frames_are_refused_with_the_reason() {
    let mut s = session();
    let empty = SequenceCache::empty(s.config());
    let out_of_vocab = FrameSequence { cache: empty.clone(), feed: vec![100_000], steps: 1 };
    assert!(s.run_frame(vec![out_of_vocab], &|| false).unwrap_err().to_string().contains("vocabulary"));
    let too_long = FrameSequence { cache: empty.clone(), feed: vec![1; 2_000], steps: 100 };
    assert!(s.run_frame(vec![too_long], &|| false).unwrap_err().to_string().contains("exceed"));
    let nothing = FrameSequence { cache: empty, feed: Vec::new(), steps: 1 };
    assert!(s.run_frame(vec![nothing], &|| false).is_err());
}

/// Mean decode-step latency at `batch` rows of `context` cached positions.
fn decode_step(s: &mut DecoderSession, batch: usize, context: usize, spread: bool) -> Duration {
    let rows: Vec<FrameSequence> = (0..batch)
        .map(|i| {
            // With `spread`, half the rows are short: the batch still pays for the longest.
            let len = if spread && i % 2 == 1 { 16 } else { context };
            FrameSequence { cache: SequenceCache::empty(s.config()), feed: prompt(len, i as u64), steps: 1 }
        })
        .collect();
    let warm = s.run_frame(rows, &|| false).unwrap();
    let rows: Vec<FrameSequence> =
        warm.outputs.into_iter().map(|o| FrameSequence { feed: vec![o.tokens[0]], cache: o.cache, steps: 17 }).collect();
    let run = s.run_frame(rows, &|| false).unwrap();
    // Skip the resume step (it places the caches); the median of the 16 pure decode
    // steps (robust to a busy machine).
    let decode = &run.steps[1..];
    assert!(decode.iter().all(|t| t.batch == batch && t.new_positions == 1));
    let mut times: Vec<Duration> = decode.iter().map(|t| t.duration).collect();
    times.sort();
    times[times.len() / 2]
}

/// A measurement, run by hand (`cargo test -p yardmaster-dataplane --test all
/// decode_step_latency -- --ignored --nocapture`): wall-clock ratios are not a unit
/// test's business on a shared machine, where other tests run beside it.
#[test]
#[ignore = "a timing measurement, run by hand"]
fn decode_step_latency_by_batch_size() {
    let mut s = session();
    println!("| batch | context 128 | context 512 | 512 with half the rows at 16 | tokens/s at 128 |");
    println!("|---|---|---|---|---|");
    let mut at_128 = Vec::new();
    for batch in [1, 4, 8, 16, 32] {
        let short = decode_step(&mut s, batch, 128, false);
        let long = decode_step(&mut s, batch, 512, false);
        let mixed = decode_step(&mut s, batch, 512, true);
        println!(
            "| {batch} | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} |",
            short.as_secs_f64() * 1e3,
            long.as_secs_f64() * 1e3,
            mixed.as_secs_f64() * 1e3,
            batch as f64 / short.as_secs_f64()
        );
        at_128.push((batch, short));
    }
    // Batching pays: a step of 8 rows costs well under 8 steps of one.
    let (one, eight) = (at_128[0].1, at_128[2].1);
    assert!(eight < one * 6, "batch 8 step {eight:?} vs batch 1 step {one:?}");
}
