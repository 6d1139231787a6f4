//! The messages of a decoder connection: a controller serving an LLM pipeline runs its
//! iteration workers on a node. The controller keeps every sequence's text and plans
//! each frame; the node keeps the KV caches and runs the decoder. So a frame carries
//! each sequence's text (prompt and the tokens generated so far, as the engine counts
//! them), and its result carries the tokens generated, what was prefilled, recomputed
//! or trimmed, the step timings and the bytes the worker's resident caches hold.
//!
//! Bodies (after the version and kind bytes; integers little-endian, strings as in
//! [`super`], tokens as `i64`):
//!
//! | kind | message | body |
//! |---|---|---|
//! | `0x08` | decoder hello | `u32` threads, path, the [`DecoderConfig`] (`u32` vocab, hidden, heads, layers, ffn, max positions; `u64` seed) |
//! | `0x09` | decoder provision | `u32` worker, `u32` threads |
//! | `0x0A` | frame | `u32` worker, `u64` generation, `u32` n, n × (`u64` id, `u8` flags: 1 reuse, 2 last; `u32` steps, `u32` m, m × `i64` token) |
//! | `0x0B` | evict | `u32` worker, `u64` sequence, `u8` 0 recompute / 1 swap |
//! | `0x0C` | forget | `u32` worker, `u64` sequence |
//! | `0x0D` | holdings | `u32` worker |
//! | `0x47` | decoder ready | `u32` worker, `u64` ns to load |
//! | `0x48` | frame done | `u32` worker, `u64` generation, `u64` ns, `u8` tag: 0 done (`u32` n results: `u64` id, `u32` m, m × `i64`, `u32` prefilled, `u8` recomputed, `u32` trimmed, `u8` stale; `u32` k steps: `u32` batch, `u32` new, `u32` total positions, `u64` ns; `u64` resident bytes), 1 failed (string), 2 aborted |
//! | `0x49` | holdings report | `u32` worker, `u32` n × (`u64`, `u32`) resident, `u32` n × (`u64`, `u32`) swapped, `u64` resident bytes |
//!
//! Aborts, retirements and thread changes use the batch kinds (`0x04`–`0x06`); a
//! worker that cannot load ends with `start failed` (`0x41`) and a retirement is
//! answered with `retired` (`0x46`).

use std::path::PathBuf;
use std::time::Duration;

use yardmaster_dataplane::llm::{DecoderConfig, Eviction, FrameRequest, FrameResult, StepTiming, WorkerFrame};

use super::{invalid, kind, nanos, FrameError, Reader, Sizer, Writer, MAX_REQUESTS};
use crate::decoder_thread::Holdings;

/// The most tokens of one sequence's text or output in a frame.
pub const MAX_SEQUENCE_TOKENS: usize = 1 << 20;
/// The most steps of one frame's timing list, and the most sequences a holdings
/// report lists.
pub const MAX_STEPS: usize = 1 << 20;

/// How a frame ended on the node.
#[derive(Debug, Clone, PartialEq)]
pub enum FrameOutcome {
    /// It ran: per-sequence results, step timings, and the resident caches' bytes
    /// after it.
    Done {
        /// The results and step timings.
        frame: WorkerFrame,
        /// Bytes of the worker's resident caches after the frame.
        resident_bytes: u64,
    },
    /// It failed (the decoder's error).
    Failed(String),
    /// An abort stopped it.
    Aborted,
}

/// A message of a decoder connection (see the module docs for each body).
#[derive(Debug, Clone, PartialEq)]
pub enum DecoderMessage {
    /// First frame of a decoder connection: the decoder file (the node's path) and its
    /// dimensions, and the intra-op threads of new workers.
    Hello {
        /// Intra-op threads of new workers (0: ONNX Runtime's default).
        threads: u32,
        /// The `.onnx` file, as the node sees it.
        model: PathBuf,
        /// Its dimensions, checked against the file's metadata at load.
        config: DecoderConfig,
    },
    /// Start decoder worker `worker`.
    Provision {
        /// Worker id.
        worker: u32,
        /// Intra-op threads.
        threads: u32,
    },
    /// Run a frame on a worker.
    Frame {
        /// Worker id.
        worker: u32,
        /// The frame's generation: an abort stops it, and its result names it.
        generation: u64,
        /// The sequences, with their texts.
        requests: Vec<FrameRequest>,
    },
    /// Take a sequence out of a worker's KV budget.
    Evict {
        /// Worker id.
        worker: u32,
        /// The sequence.
        sequence: u64,
        /// Recompute or swap.
        eviction: Eviction,
    },
    /// Drop what a worker holds for a sequence (it ended).
    Forget {
        /// Worker id.
        worker: u32,
        /// The sequence.
        sequence: u64,
    },
    /// Ask what a worker holds.
    Holdings {
        /// Worker id.
        worker: u32,
    },
    /// A worker loaded the decoder.
    Ready {
        /// Worker id.
        worker: u32,
        /// How long the load took.
        took: Duration,
    },
    /// A frame ended.
    FrameDone {
        /// Worker id.
        worker: u32,
        /// The frame's generation.
        generation: u64,
        /// Its wall time on the node.
        duration: Duration,
        /// What came of it.
        outcome: FrameOutcome,
    },
    /// What a worker holds.
    HoldingsReport {
        /// Worker id.
        worker: u32,
        /// Its sequences and caches.
        holdings: Holdings,
    },
}

impl DecoderMessage {
    /// The message's name, for logs and protocol errors.
    pub fn name(&self) -> &'static str {
        match self {
            DecoderMessage::Hello { .. } => "decoder hello",
            DecoderMessage::Provision { .. } => "decoder provision",
            DecoderMessage::Frame { .. } => "frame",
            DecoderMessage::Evict { .. } => "evict",
            DecoderMessage::Forget { .. } => "forget",
            DecoderMessage::Holdings { .. } => "holdings",
            DecoderMessage::Ready { .. } => "decoder ready event",
            DecoderMessage::FrameDone { .. } => "frame done event",
            DecoderMessage::HoldingsReport { .. } => "holdings report",
        }
    }

    /// The worker a command is for (`None` for the hello and the node's events).
    pub fn command_worker(&self) -> Option<u32> {
        match self {
            DecoderMessage::Provision { worker, .. }
            | DecoderMessage::Frame { worker, .. }
            | DecoderMessage::Evict { worker, .. }
            | DecoderMessage::Forget { worker, .. }
            | DecoderMessage::Holdings { worker } => Some(*worker),
            _ => None,
        }
    }

    /// The worker an event is about (`None` for commands).
    pub fn event_worker(&self) -> Option<u32> {
        match self {
            DecoderMessage::Ready { worker, .. }
            | DecoderMessage::FrameDone { worker, .. }
            | DecoderMessage::HoldingsReport { worker, .. } => Some(*worker),
            _ => None,
        }
    }
}

fn limit(what: &'static str, value: usize, most: usize) -> Result<(), FrameError> {
    if value > most {
        return Err(FrameError::Limit { what, value: value as u64, limit: most as u64 });
    }
    Ok(())
}

fn checked_u32(what: &'static str, value: usize) -> Result<(), FrameError> {
    limit(what, value, u32::MAX as usize)
}

/// Add the encoded size of `message`'s body (after the kind byte) to `s`, checking
/// the limits [`read`] checks.
pub(super) fn size(s: &mut Sizer, message: &DecoderMessage) -> Result<(), FrameError> {
    match message {
        DecoderMessage::Hello { model, config, .. } => {
            s.add(4);
            s.path(model)?;
            for value in config_fields(config) {
                checked_u32("decoder dimension", value)?;
            }
            s.add(6 * 4 + 8);
        }
        DecoderMessage::Provision { .. } => s.add(8),
        DecoderMessage::Frame { requests, .. } => {
            limit("sequences of a frame", requests.len(), MAX_REQUESTS)?;
            s.add(4 + 8 + 4);
            for request in requests {
                limit("tokens of a sequence", request.text.len(), MAX_SEQUENCE_TOKENS)?;
                checked_u32("steps of a sequence", request.steps)?;
                s.add(8 + 1 + 4 + 4 + 8 * request.text.len());
            }
        }
        DecoderMessage::Evict { .. } => s.add(4 + 8 + 1),
        DecoderMessage::Forget { .. } => s.add(4 + 8),
        DecoderMessage::Holdings { .. } => s.add(4),
        DecoderMessage::Ready { .. } => s.add(4 + 8),
        DecoderMessage::FrameDone { outcome, .. } => {
            s.add(4 + 8 + 8 + 1);
            match outcome {
                FrameOutcome::Done { frame, .. } => {
                    limit("results of a frame", frame.results.len(), MAX_REQUESTS)?;
                    s.add(4);
                    for result in &frame.results {
                        limit("tokens of a sequence", result.tokens.len(), MAX_SEQUENCE_TOKENS)?;
                        checked_u32("positions prefilled", result.prefilled)?;
                        checked_u32("positions trimmed", result.trimmed)?;
                        s.add(8 + 4 + 8 * result.tokens.len() + 4 + 1 + 4 + 1);
                    }
                    limit("steps of a frame", frame.steps.len(), MAX_STEPS)?;
                    s.add(4);
                    for step in &frame.steps {
                        for value in [step.batch, step.new_positions, step.total_positions] {
                            checked_u32("step size", value)?;
                        }
                        s.add(3 * 4 + 8);
                    }
                    s.add(8);
                }
                FrameOutcome::Failed(error) => s.string(error),
                FrameOutcome::Aborted => {}
            }
        }
        DecoderMessage::HoldingsReport { holdings, .. } => {
            s.add(4);
            for list in [&holdings.resident, &holdings.swapped] {
                limit("sequences held", list.len(), MAX_STEPS)?;
                for &(_, positions) in list {
                    checked_u32("cached positions", positions)?;
                }
                s.add(4 + list.len() * 12);
            }
            s.add(8);
        }
    }
    Ok(())
}

fn config_fields(config: &DecoderConfig) -> [usize; 6] {
    [config.vocab, config.hidden, config.heads, config.layers, config.ffn, config.max_positions]
}

/// The kind byte of `message`.
pub(super) fn kind_of(message: &DecoderMessage) -> u8 {
    match message {
        DecoderMessage::Hello { .. } => kind::DECODER_HELLO,
        DecoderMessage::Provision { .. } => kind::DECODER_PROVISION,
        DecoderMessage::Frame { .. } => kind::FRAME,
        DecoderMessage::Evict { .. } => kind::EVICT,
        DecoderMessage::Forget { .. } => kind::FORGET,
        DecoderMessage::Holdings { .. } => kind::HOLDINGS,
        DecoderMessage::Ready { .. } => kind::DECODER_READY,
        DecoderMessage::FrameDone { .. } => kind::FRAME_DONE,
        DecoderMessage::HoldingsReport { .. } => kind::HOLDINGS_REPORT,
    }
}

/// Write `message`'s kind byte and body (its sizes were checked by [`size`]).
pub(super) fn write(w: &mut Writer, message: &DecoderMessage) {
    w.u8(kind_of(message));
    match message {
        DecoderMessage::Hello { threads, model, config } => {
            w.u32(*threads);
            // Checked to be UTF-8 by the sizer.
            w.string(model.to_str().unwrap_or_default());
            for value in config_fields(config) {
                w.u32(value as u32);
            }
            w.u64(config.seed);
        }
        DecoderMessage::Provision { worker, threads } => {
            w.u32(*worker);
            w.u32(*threads);
        }
        DecoderMessage::Frame { worker, generation, requests } => {
            w.u32(*worker);
            w.u64(*generation);
            w.u32(requests.len() as u32);
            for request in requests {
                w.u64(request.id);
                w.u8(u8::from(request.reuse) | (u8::from(request.last) << 1));
                w.u32(request.steps as u32);
                tokens(w, &request.text);
            }
        }
        DecoderMessage::Evict { worker, sequence, eviction } => {
            w.u32(*worker);
            w.u64(*sequence);
            w.u8(match eviction {
                Eviction::Recompute => 0,
                Eviction::Swap => 1,
            });
        }
        DecoderMessage::Forget { worker, sequence } => {
            w.u32(*worker);
            w.u64(*sequence);
        }
        DecoderMessage::Holdings { worker } => w.u32(*worker),
        DecoderMessage::Ready { worker, took } => {
            w.u32(*worker);
            w.u64(nanos(*took));
        }
        DecoderMessage::FrameDone { worker, generation, duration, outcome } => {
            w.u32(*worker);
            w.u64(*generation);
            w.u64(nanos(*duration));
            match outcome {
                FrameOutcome::Done { frame, resident_bytes } => {
                    w.u8(0);
                    w.u32(frame.results.len() as u32);
                    for result in &frame.results {
                        w.u64(result.id);
                        tokens(w, &result.tokens);
                        w.u32(result.prefilled as u32);
                        w.u8(u8::from(result.recomputed));
                        w.u32(result.trimmed as u32);
                        w.u8(u8::from(result.stale));
                    }
                    w.u32(frame.steps.len() as u32);
                    for step in &frame.steps {
                        w.u32(step.batch as u32);
                        w.u32(step.new_positions as u32);
                        w.u32(step.total_positions as u32);
                        w.u64(nanos(step.duration));
                    }
                    w.u64(*resident_bytes);
                }
                FrameOutcome::Failed(error) => {
                    w.u8(1);
                    w.string(error);
                }
                FrameOutcome::Aborted => w.u8(2),
            }
        }
        DecoderMessage::HoldingsReport { worker, holdings } => {
            w.u32(*worker);
            for list in [&holdings.resident, &holdings.swapped] {
                w.u32(list.len() as u32);
                for &(sequence, positions) in list {
                    w.u64(sequence);
                    w.u32(positions as u32);
                }
            }
            w.u64(holdings.resident_bytes);
        }
    }
}

fn tokens(w: &mut Writer, tokens: &[i64]) {
    w.u32(tokens.len() as u32);
    for token in tokens {
        w.u64(*token as u64);
    }
}

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, FrameError> {
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(invalid(field, format!("{other} (expected 0 or 1)"))),
    }
}

fn read_tokens(r: &mut Reader<'_>) -> Result<Vec<i64>, FrameError> {
    let n = r.count32("tokens of a sequence", MAX_SEQUENCE_TOKENS, 8)?;
    (0..n).map(|_| r.u64("token").map(|t| t as i64)).collect()
}

fn read_held(r: &mut Reader<'_>) -> Result<Vec<(u64, usize)>, FrameError> {
    let n = r.count32("sequences held", MAX_STEPS, 12)?;
    (0..n).map(|_| Ok((r.u64("sequence")?, r.u32("cached positions")? as usize))).collect()
}

/// Read the body of a decoder message of kind `kind`; `None` when `kind` is not one.
pub(super) fn read(r: &mut Reader<'_>, kind: u8) -> Result<Option<DecoderMessage>, FrameError> {
    Ok(Some(match kind {
        kind::DECODER_HELLO => {
            let threads = r.u32("threads")?;
            let model = PathBuf::from(r.string("decoder path")?);
            let mut dims = [0usize; 6];
            for dim in &mut dims {
                *dim = r.u32("decoder dimension")? as usize;
            }
            let [vocab, hidden, heads, layers, ffn, max_positions] = dims;
            let config = DecoderConfig { vocab, hidden, heads, layers, ffn, max_positions, seed: r.u64("decoder seed")? };
            DecoderMessage::Hello { threads, model, config }
        }
        kind::DECODER_PROVISION => DecoderMessage::Provision { worker: r.u32("worker")?, threads: r.u32("threads")? },
        kind::FRAME => {
            let worker = r.u32("worker")?;
            let generation = r.u64("generation")?;
            let n = r.count32("sequences of a frame", MAX_REQUESTS, 17)?;
            let mut requests = Vec::with_capacity(n);
            for _ in 0..n {
                let id = r.u64("sequence")?;
                let flags = r.u8("sequence flags")?;
                if flags > 3 {
                    return Err(invalid("sequence flags", format!("{flags} (expected bits 1 and 2 only)")));
                }
                let steps = r.u32("steps")? as usize;
                let text = read_tokens(r)?;
                requests.push(FrameRequest { id, text, reuse: flags & 1 != 0, steps, last: flags & 2 != 0 });
            }
            DecoderMessage::Frame { worker, generation, requests }
        }
        kind::EVICT => DecoderMessage::Evict {
            worker: r.u32("worker")?,
            sequence: r.u64("sequence")?,
            eviction: match r.u8("eviction")? {
                0 => Eviction::Recompute,
                1 => Eviction::Swap,
                other => return Err(invalid("eviction", format!("{other} (expected 0 or 1)"))),
            },
        },
        kind::FORGET => DecoderMessage::Forget { worker: r.u32("worker")?, sequence: r.u64("sequence")? },
        kind::HOLDINGS => DecoderMessage::Holdings { worker: r.u32("worker")? },
        kind::DECODER_READY => DecoderMessage::Ready { worker: r.u32("worker")?, took: r.duration("took")? },
        kind::FRAME_DONE => {
            let worker = r.u32("worker")?;
            let generation = r.u64("generation")?;
            let duration = r.duration("duration")?;
            let outcome = match r.u8("outcome tag")? {
                0 => {
                    let n = r.count32("results of a frame", MAX_REQUESTS, 30)?;
                    let mut results = Vec::with_capacity(n);
                    for _ in 0..n {
                        results.push(FrameResult {
                            id: r.u64("sequence")?,
                            tokens: read_tokens(r)?,
                            prefilled: r.u32("positions prefilled")? as usize,
                            recomputed: flag(r, "recomputed")?,
                            trimmed: r.u32("positions trimmed")? as usize,
                            stale: flag(r, "stale")?,
                        });
                    }
                    let k = r.count32("steps of a frame", MAX_STEPS, 20)?;
                    let mut steps = Vec::with_capacity(k);
                    for _ in 0..k {
                        steps.push(StepTiming {
                            batch: r.u32("step batch")? as usize,
                            new_positions: r.u32("step new positions")? as usize,
                            total_positions: r.u32("step positions")? as usize,
                            duration: r.duration("step duration")?,
                        });
                    }
                    FrameOutcome::Done { frame: WorkerFrame { results, steps }, resident_bytes: r.u64("resident bytes")? }
                }
                1 => FrameOutcome::Failed(r.string("frame error")?),
                2 => FrameOutcome::Aborted,
                other => return Err(invalid("outcome tag", format!("{other} (expected 0 to 2)"))),
            };
            DecoderMessage::FrameDone { worker, generation, duration, outcome }
        }
        kind::HOLDINGS_REPORT => {
            let worker = r.u32("worker")?;
            let resident = read_held(r)?;
            let swapped = read_held(r)?;
            DecoderMessage::HoldingsReport { worker, holdings: Holdings { resident, swapped, resident_bytes: r.u64("resident bytes")? } }
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::{decode, encode, Message, PREFIX_LEN, VERSION};
    use super::*;

    fn round_trip(message: DecoderMessage) {
        let frame = encode(&Message::Decoder(message.clone())).unwrap();
        assert_eq!(frame[PREFIX_LEN], VERSION);
        assert_eq!(frame[PREFIX_LEN + 1], kind_of(&message));
        match decode(&frame).unwrap() {
            Message::Decoder(back) => assert_eq!(back, message),
            other => panic!("{other:?}"),
        }
        for cut in 0..frame.len() {
            assert!(decode(&frame[..cut]).is_err(), "{cut} of {} bytes decoded", frame.len());
        }
    }

    fn sample_frame() -> WorkerFrame {
        WorkerFrame {
            results: vec![
                FrameResult { id: 7, tokens: vec![1, 511, -3], prefilled: 12, recomputed: true, trimmed: 0, stale: false },
                FrameResult { id: u64::MAX, tokens: vec![], prefilled: 0, recomputed: false, trimmed: 2, stale: true },
            ],
            steps: vec![StepTiming { batch: 2, new_positions: 12, total_positions: 12, duration: Duration::from_micros(350) }],
        }
    }

    #[test]
    fn every_decoder_message_round_trips_and_every_truncation_is_an_error() {
        let config = DecoderConfig::tiny();
        let requests = vec![
            FrameRequest { id: 1, text: vec![5, 6, 7], reuse: true, steps: 4, last: false },
            FrameRequest { id: 2, text: vec![i64::MIN, 0, i64::MAX], reuse: false, steps: 1, last: true },
        ];
        let holdings = Holdings { resident: vec![(1, 40), (9, 3)], swapped: vec![(4, 17)], resident_bytes: 2048 * 43 };
        for message in [
            DecoderMessage::Hello { threads: 2, model: PathBuf::from("/models/tiny-decoder.onnx"), config },
            DecoderMessage::Provision { worker: 3, threads: 1 },
            DecoderMessage::Frame { worker: 3, generation: 9, requests },
            DecoderMessage::Frame { worker: 3, generation: 10, requests: Vec::new() },
            DecoderMessage::Evict { worker: 3, sequence: 1, eviction: Eviction::Swap },
            DecoderMessage::Evict { worker: 3, sequence: 1, eviction: Eviction::Recompute },
            DecoderMessage::Forget { worker: 0, sequence: 77 },
            DecoderMessage::Holdings { worker: 5 },
            DecoderMessage::Ready { worker: 3, took: Duration::from_millis(41) },
            DecoderMessage::FrameDone {
                worker: 3,
                generation: 9,
                duration: Duration::from_millis(2),
                outcome: FrameOutcome::Done { frame: sample_frame(), resident_bytes: 4096 },
            },
            DecoderMessage::FrameDone {
                worker: 3,
                generation: 9,
                duration: Duration::ZERO,
                outcome: FrameOutcome::Failed("decoder worker 3: ONNX Runtime said no".into()),
            },
            DecoderMessage::FrameDone { worker: 3, generation: 9, duration: Duration::ZERO, outcome: FrameOutcome::Aborted },
            DecoderMessage::HoldingsReport { worker: 5, holdings },
        ] {
            round_trip(message);
        }
    }

    #[test]
    fn bad_flags_and_tags_are_refused_with_their_field() {
        let frame = encode(&Message::Decoder(DecoderMessage::Evict { worker: 1, sequence: 2, eviction: Eviction::Swap })).unwrap();
        let mut bad = frame.clone();
        *bad.last_mut().unwrap() = 9;
        assert!(matches!(decode(&bad), Err(FrameError::Invalid { what: "eviction", .. })));
        let frame = encode(&Message::Decoder(DecoderMessage::Frame {
            worker: 1,
            generation: 1,
            requests: vec![FrameRequest { id: 1, text: vec![1], reuse: false, steps: 1, last: false }],
        }))
        .unwrap();
        let mut bad = frame.clone();
        // prefix, version, kind, worker, generation, count, id: then the flags byte.
        bad[PREFIX_LEN + 2 + 4 + 8 + 4 + 8] = 4;
        assert!(matches!(decode(&bad), Err(FrameError::Invalid { what: "sequence flags", .. })));
    }

    #[test]
    fn a_frame_over_the_token_limit_is_refused_before_sending() {
        let text = vec![0; MAX_SEQUENCE_TOKENS + 1];
        let message = Message::Decoder(DecoderMessage::Frame {
            worker: 1,
            generation: 1,
            requests: vec![FrameRequest { id: 1, text, reuse: false, steps: 1, last: false }],
        });
        assert!(matches!(encode(&message), Err(FrameError::Limit { what: "tokens of a sequence", .. })));
    }
}
