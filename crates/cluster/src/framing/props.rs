//! Property tests of the framing: every message kind, with random contents (tensors
//! of random ranks and shapes whose floats include NaN, infinities, negative zero and
//! subnormals; strings with multi-byte characters; every error kind; decoder frames
//! with random texts and results), round-trips
//! exactly; every truncation, extension and garbling of a valid frame is an error or a
//! valid message, never a panic.

use std::path::PathBuf;
use std::time::Duration;

use yardmaster_dataplane::{
    DataplaneError, Job, JobTiming, ModelCatalog, ModelKey, ModelSpec, Request, RequestOutput, StartKind, Tensor, WorkerEvent,
};

use super::*;
use crate::decoder_thread::Holdings;
use yardmaster_dataplane::llm::{DecoderConfig, Eviction, FrameRequest, FrameResult, StepTiming, WorkerFrame};

/// A SplitMix64 stream: reproducible random choices.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        let (state, out) = yardmaster_sdk::splitmix64(self.0);
        self.0 = state;
        out
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn f32(&mut self) -> f32 {
        match self.below(8) {
            0 => f32::NAN,
            1 => f32::from_bits(0x7fc0_1234), // a NaN with a payload
            2 => f32::INFINITY,
            3 => -0.0,
            4 => f32::from_bits(1), // the smallest subnormal
            _ => f32::from_bits(self.u32()),
        }
    }
    fn string(&mut self) -> String {
        const PIECES: [&str; 6] = ["a", "Z", "é", "ß", "漢", "🦀"];
        (0..self.below(12)).map(|_| PIECES[self.below(PIECES.len() as u64) as usize]).collect()
    }
    /// A tensor of one of four element types: `f32`, `i64`, `bool` or strings.
    fn tensor(&mut self) -> Tensor {
        let shape: Vec<usize> = (0..self.below(5)).map(|_| self.below(5) as usize).collect();
        let n = shape.iter().product();
        let data: yardmaster_dataplane::TensorData = match self.below(4) {
            0 => (0..n).map(|_| self.f32()).collect(),
            1 => yardmaster_dataplane::TensorData::from_vec((0..n).map(|_| self.next() as i64).collect::<Vec<i64>>()),
            2 => yardmaster_dataplane::Elements::Bool((0..n).map(|_| self.below(2) as u8).collect()).into(),
            _ => {
                let mut layout = Vec::new();
                for _ in 0..n {
                    let text = self.string();
                    layout.extend_from_slice(&(text.len() as u32).to_le_bytes());
                    layout.extend_from_slice(text.as_bytes());
                }
                yardmaster_dataplane::Elements::Bytes { data: layout, count: n }.into()
            }
        };
        Tensor { shape, data }
    }
    /// A model spec, with warm-up samples of every kind now and then.
    fn spec(&mut self) -> ModelSpec {
        let mut spec = ModelSpec::new(self.key(), self.string());
        for _ in 0..self.below(3) {
            let inputs = (0..self.below(3))
                .map(|_| {
                    let shape = (0..self.below(4)).map(|_| self.below(9) as usize).collect();
                    let data = match self.below(3) {
                        0 => yardmaster_dataplane::WarmUpData::Zero,
                        1 => yardmaster_dataplane::WarmUpData::Random,
                        _ => yardmaster_dataplane::WarmUpData::Given(self.string().into_bytes()),
                    };
                    yardmaster_dataplane::WarmUpInput { shape, data }
                })
                .collect();
            spec.warm_up.push(yardmaster_dataplane::WarmUp { name: self.string(), batch: self.u32(), count: self.u32(), inputs });
        }
        spec
    }
    fn tensors(&mut self) -> Vec<Tensor> {
        (0..self.below(4)).map(|_| self.tensor()).collect()
    }
    fn tokens(&mut self) -> Vec<i64> {
        (0..self.below(6)).map(|_| self.next() as i64).collect()
    }
    fn duration(&mut self) -> Duration {
        Duration::from_nanos(self.next())
    }
    fn key(&mut self) -> ModelKey {
        ModelKey::new(self.string(), self.string())
    }
    fn error(&mut self) -> DataplaneError {
        match self.below(7) {
            0 => DataplaneError::Missing {
                what: ["the ONNX Runtime library", "the PP-OCR models", "a model file"][self.below(3) as usize],
                path: PathBuf::from(self.string()),
                hint: self.string(),
            },
            1 => DataplaneError::Ort(self.string()),
            2 => DataplaneError::Batch(self.string()),
            3 => DataplaneError::Aborted,
            4 => DataplaneError::Io { path: PathBuf::from(self.string()), message: self.string() },
            5 => DataplaneError::WorkerGone(self.u32()),
            _ => DataplaneError::Invalid(self.string()),
        }
    }
    fn message(&mut self, kind: u8) -> Message {
        let worker = self.u32();
        match kind {
            kind::HELLO => Message::Hello {
                threads: self.u32(),
                catalog: ModelCatalog { stages: (0..self.below(4)).map(|_| (0..self.below(3)).map(|_| self.spec()).collect()).collect() },
            },
            kind::PROVISION => Message::Provision { worker, stage: self.u32(), variant: self.u32() },
            kind::START => Message::Start {
                worker,
                job: Job { id: self.next(), requests: (0..self.below(4)).map(|_| Request::new(self.next(), self.tensors())).collect() },
            },
            kind::ABORT => Message::Abort { worker },
            kind::RETIRE => Message::Retire { worker },
            kind::SET_THREADS => Message::SetThreads { worker, threads: self.u32() },
            kind::SET_VARIANT => Message::SetVariant { worker, variant: self.u32() },
            kind::WELCOME => Message::Welcome {
                device: self.string(),
                name: self.string(),
                slots: self.u32(),
                cache_bytes: self.next(),
                threads: self.u32(),
            },
            kind::REFUSED => Message::Refused { reason: self.string() },
            kind::READY => Message::Event(WorkerEvent::Ready {
                worker,
                model: self.key(),
                kind: if self.below(2) == 0 { StartKind::Cold } else { StartKind::Warm },
                took: self.duration(),
            }),
            kind::START_FAILED => Message::Event(WorkerEvent::StartFailed { worker, error: self.error() }),
            kind::FINISHED => Message::Event(WorkerEvent::Finished {
                worker,
                job: self.next(),
                duration: self.duration(),
                timing: JobTiming::default(),
                result: if self.below(3) == 0 {
                    Err(self.error())
                } else {
                    Ok((0..self.below(4)).map(|_| RequestOutput { id: self.next(), outputs: self.tensors() }).collect())
                },
            }),
            kind::ABORTED => Message::Event(WorkerEvent::Aborted { worker, job: self.next() }),
            kind::RECONFIGURED => {
                Message::Event(WorkerEvent::Reconfigured { worker, model: self.key(), threads: self.u32() as usize, took: self.duration() })
            }
            kind::RECONFIGURE_FAILED => Message::Event(WorkerEvent::ReconfigureFailed { worker, error: self.error() }),
            kind::RETIRED => Message::Event(WorkerEvent::Retired { worker }),
            kind::DECODER_HELLO => Message::Decoder(DecoderMessage::Hello {
                threads: self.u32(),
                model: PathBuf::from(self.string()),
                config: DecoderConfig {
                    vocab: self.u32() as usize,
                    hidden: self.u32() as usize,
                    heads: self.u32() as usize,
                    layers: self.u32() as usize,
                    ffn: self.u32() as usize,
                    max_positions: self.u32() as usize,
                    seed: self.next(),
                },
            }),
            kind::DECODER_PROVISION => Message::Decoder(DecoderMessage::Provision { worker, threads: self.u32() }),
            kind::FRAME => Message::Decoder(DecoderMessage::Frame {
                worker,
                generation: self.next(),
                requests: (0..self.below(4))
                    .map(|_| FrameRequest {
                        id: self.next(),
                        text: self.tokens(),
                        reuse: self.below(2) == 0,
                        steps: self.u32() as usize,
                        last: self.below(2) == 0,
                    })
                    .collect(),
            }),
            kind::EVICT => Message::Decoder(DecoderMessage::Evict {
                worker,
                sequence: self.next(),
                eviction: if self.below(2) == 0 { Eviction::Swap } else { Eviction::Recompute },
            }),
            kind::FORGET => Message::Decoder(DecoderMessage::Forget { worker, sequence: self.next() }),
            kind::HOLDINGS => Message::Decoder(DecoderMessage::Holdings { worker }),
            kind::DECODER_READY => Message::Decoder(DecoderMessage::Ready { worker, took: self.duration() }),
            kind::FRAME_DONE => Message::Decoder(DecoderMessage::FrameDone {
                worker,
                generation: self.next(),
                duration: self.duration(),
                outcome: match self.below(3) {
                    0 => FrameOutcome::Failed(self.string()),
                    1 => FrameOutcome::Aborted,
                    _ => FrameOutcome::Done {
                        frame: WorkerFrame {
                            results: (0..self.below(4))
                                .map(|_| FrameResult {
                                    id: self.next(),
                                    tokens: self.tokens(),
                                    prefilled: self.u32() as usize,
                                    recomputed: self.below(2) == 0,
                                    trimmed: self.u32() as usize,
                                    stale: self.below(2) == 0,
                                })
                                .collect(),
                            steps: (0..self.below(4))
                                .map(|_| StepTiming {
                                    batch: self.u32() as usize,
                                    new_positions: self.u32() as usize,
                                    total_positions: self.u32() as usize,
                                    duration: self.duration(),
                                })
                                .collect(),
                        },
                        resident_bytes: self.next(),
                    },
                },
            }),
            kind::HOLDINGS_REPORT => Message::Decoder(DecoderMessage::HoldingsReport {
                worker,
                holdings: Holdings {
                    resident: (0..self.below(4)).map(|_| (self.next(), self.u32() as usize)).collect(),
                    swapped: (0..self.below(4)).map(|_| (self.next(), self.u32() as usize)).collect(),
                    resident_bytes: self.next(),
                },
            }),
            other => panic!("no generator for kind {other:#x}"),
        }
    }
}

const KINDS: [u8; 25] = [
    kind::HELLO,
    kind::PROVISION,
    kind::START,
    kind::ABORT,
    kind::RETIRE,
    kind::SET_THREADS,
    kind::SET_VARIANT,
    kind::WELCOME,
    kind::REFUSED,
    kind::READY,
    kind::START_FAILED,
    kind::FINISHED,
    kind::ABORTED,
    kind::RECONFIGURED,
    kind::RECONFIGURE_FAILED,
    kind::RETIRED,
    kind::DECODER_HELLO,
    kind::DECODER_PROVISION,
    kind::FRAME,
    kind::EVICT,
    kind::FORGET,
    kind::HOLDINGS,
    kind::DECODER_READY,
    kind::FRAME_DONE,
    kind::HOLDINGS_REPORT,
];

const CASES_PER_KIND: u64 = 200;

/// Every kind, many random instances.
fn samples() -> impl Iterator<Item = (u8, Message)> {
    KINDS.into_iter().flat_map(|kind| {
        let mut g = Gen(0x5eed ^ kind as u64);
        (0..CASES_PER_KIND).map(move |_| (kind, g.message(kind)))
    })
}

#[test]
fn every_kind_round_trips_exactly() {
    for (kind, message) in samples() {
        let frame = encode(&message).unwrap_or_else(|e| panic!("encoding {message:?}: {e}"));
        assert_eq!(frame[PREFIX_LEN + 1], kind, "the kind byte");
        assert_eq!(encoded_len(&message).unwrap(), frame.len());
        let decoded = decode(&frame).unwrap_or_else(|e| panic!("decoding {message:?}: {e}"));
        // Floats compare by bits (NaN payloads included) through the re-encoding, the
        // rest through the debug form.
        assert_eq!(encode(&decoded).unwrap(), frame, "re-encoding {message:?}");
        assert_eq!(format!("{decoded:?}"), format!("{message:?}"));
    }
}

#[test]
fn every_truncation_is_an_error() {
    for (_, message) in samples().step_by(7) {
        let frame = encode(&message).unwrap();
        for cut in 0..frame.len() {
            assert!(decode(&frame[..cut]).is_err(), "{cut} of {} bytes of {message:?} decoded", frame.len());
        }
        // The same truncation with the length prefix patched to match: the body
        // itself is short, and that is an error too (never a panic).
        for cut in PREFIX_LEN + 2..frame.len() {
            let mut short = frame[..cut].to_vec();
            short[..4].copy_from_slice(&((cut - PREFIX_LEN) as u32).to_le_bytes());
            assert!(decode(&short).is_err(), "a body cut to {cut} bytes decoded for {message:?}");
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for (_, message) in samples().step_by(11) {
        let mut frame = encode(&message).unwrap();
        frame.push(0);
        assert!(matches!(decode(&frame), Err(FrameError::LengthMismatch { .. })));
        let len = (frame.len() - PREFIX_LEN) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode(&frame).unwrap_err(), FrameError::Trailing(1));
    }
}

#[test]
fn garbled_frames_never_panic() {
    let mut g = Gen(42);
    for (_, message) in samples().step_by(3) {
        let frame = encode(&message).unwrap();
        for _ in 0..20 {
            let mut garbled = frame.clone();
            for _ in 0..1 + g.below(4) {
                let at = g.below(garbled.len() as u64) as usize;
                garbled[at] = g.next() as u8;
            }
            if let Ok(decoded) = decode(&garbled) {
                // Whatever decodes is a message in bounds: it encodes again.
                encode(&decoded).unwrap();
            }
        }
    }
}

#[test]
fn random_bytes_behind_a_valid_header_never_panic() {
    let mut g = Gen(7);
    for _ in 0..20_000 {
        let len = g.below(64) as usize;
        let mut frame = Vec::with_capacity(PREFIX_LEN + 2 + len);
        frame.extend_from_slice(&((len + 2) as u32).to_le_bytes());
        frame.push(VERSION);
        frame.push(KINDS[g.below(KINDS.len() as u64) as usize]);
        frame.extend((0..len).map(|_| g.next() as u8));
        let _ = decode(&frame);
    }
}

#[test]
fn hostile_counts_are_refused_before_allocating() {
    // A job claiming four billion requests in a few bytes.
    let mut frame = vec![0u8; 4];
    frame.extend_from_slice(&[VERSION, kind::START]);
    frame.extend_from_slice(&1u32.to_le_bytes());
    frame.extend_from_slice(&9u64.to_le_bytes());
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    let len = (frame.len() - PREFIX_LEN) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(decode(&frame), Err(FrameError::Limit { what: "requests", .. })));

    // A tensor of shape [2^32 - 1, 2^32 - 1] with no data.
    let mut frame = vec![0u8; 4];
    frame.extend_from_slice(&[VERSION, kind::START]);
    frame.extend_from_slice(&1u32.to_le_bytes());
    frame.extend_from_slice(&9u64.to_le_bytes());
    frame.extend_from_slice(&1u32.to_le_bytes());
    frame.extend_from_slice(&5u64.to_le_bytes());
    frame.extend_from_slice(&1u16.to_le_bytes());
    frame.push(0);
    frame.push(2);
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    let len = (frame.len() - PREFIX_LEN) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    match decode(&frame) {
        Err(FrameError::Truncated { field: "tensor data", .. }) => {}
        other => panic!("{other:?}"),
    }

    // Rank 200.
    let mut frame = encode(&Message::Event(WorkerEvent::Finished {
        worker: 1,
        job: 2,
        duration: Duration::ZERO,
        timing: JobTiming::default(),
        result: Ok(vec![RequestOutput { id: 3, outputs: vec![Tensor { shape: vec![], data: vec![1.0].into() }] }]),
    }))
    .unwrap();
    let rank_at = frame.len() - 4 - 1;
    frame[rank_at] = 200;
    assert!(matches!(decode(&frame), Err(FrameError::Limit { what: "tensor rank", .. })));
}

#[test]
fn unknown_versions_and_kinds_are_named() {
    let mut frame = encode(&Message::Retire { worker: 1 }).unwrap();
    frame[4] = 9;
    let error = decode(&frame).unwrap_err();
    assert_eq!(error, FrameError::Version(9));
    assert!(error.to_string().contains("version 9"), "{error}");
    frame[4] = VERSION;
    frame[5] = 0x7f;
    assert_eq!(decode(&frame).unwrap_err().to_string(), "unknown message kind 0x7f");
}
