//! The binary framing spoken between a controller and a worker node: commands one way
//! (hello, provision, start a job with its tensors, abort, retire, set threads, set
//! variant), the node's answers and every [`WorkerEvent`] the other way.
//!
//! A decoder connection (an LLM pipeline's iteration workers on a node) speaks the
//! messages of [`decoder`] in the same frames.
//!
//! A frame is self-delimiting and versioned:
//!
//! ```text
//! u32 length (LE) | u8 version | u8 kind | body
//! ```
//!
//! `length` counts the bytes after itself (so it is at least 2). Integers are
//! little-endian; strings are a `u32` byte count and UTF-8; durations are `u64`
//! nanoseconds; a tensor is a `u8` element type ([`element_code`]), a `u8` rank, one
//! `u32` per dimension and then the elements as raw little-endian bytes (no
//! per-element framing; BYTES elements as a `u32` byte count and Triton's binary
//! layout, each string after its 4-byte length). `docs/internode.md` has
//! the table of every kind and body.
//!
//! [`decode`] is pure and total: any input, truncated, garbled or hostile, gives a
//! [`Message`] or a [`FrameError`], never a panic, and it allocates only after checking
//! the bytes are there and within the limits below. [`encode`] refuses messages that
//! break the same limits, so what one side sends the other side accepts.

use std::path::PathBuf;
use std::time::Duration;

pub mod decoder;

pub use decoder::{DecoderMessage, FrameOutcome};
use yardmaster_dataplane::{
    DataplaneError, ElementType, Job, JobTiming, ModelCatalog, ModelKey, ModelSpec, Request, RequestOutput, StartKind, Tensor, TensorData,
    WarmUp, WarmUpData, WarmUpInput, WorkerEvent,
};

/// The framing version this build speaks.
pub const VERSION: u8 = 4;
/// Bytes of the length prefix.
pub const PREFIX_LEN: usize = 4;
/// The largest frame, prefix included (256 MiB: a batch of 8 detector inputs of
/// 3 × 960 × 960 is 88 MiB).
pub const MAX_FRAME: usize = 256 << 20;
/// The most tensors one frame may carry, over all its requests.
pub const MAX_TENSORS: usize = 65_536;
/// The highest tensor rank.
pub const MAX_RANK: usize = 8;
/// The most requests (or request outputs) of one job.
pub const MAX_REQUESTS: usize = 16_384;
/// The longest string, in bytes; longer error messages are cut when encoded.
pub const MAX_STRING: usize = 64 << 10;
/// The most stages of a catalogue.
pub const MAX_STAGES: usize = 1024;
/// The most variants of one stage.
pub const MAX_VARIANTS: usize = 1024;

/// Message kinds (the byte after the version).
pub mod kind {
    /// Controller → node: catalogue and threads, first frame of a connection.
    pub const HELLO: u8 = 0x01;
    /// Controller → node: start a worker.
    pub const PROVISION: u8 = 0x02;
    /// Controller → node: a job and its input tensors.
    pub const START: u8 = 0x03;
    /// Controller → node: abort a worker's job.
    pub const ABORT: u8 = 0x04;
    /// Controller → node: retire a worker.
    pub const RETIRE: u8 = 0x05;
    /// Controller → node: change a worker's intra-op threads.
    pub const SET_THREADS: u8 = 0x06;
    /// Controller → node: change a worker's variant.
    pub const SET_VARIANT: u8 = 0x07;
    /// Controller → node: the decoder and threads, first frame of a decoder connection.
    pub const DECODER_HELLO: u8 = 0x08;
    /// Controller → node: start a decoder worker.
    pub const DECODER_PROVISION: u8 = 0x09;
    /// Controller → node: a frame of sequences with their texts.
    pub const FRAME: u8 = 0x0A;
    /// Controller → node: take a sequence out of a decoder worker's KV budget.
    pub const EVICT: u8 = 0x0B;
    /// Controller → node: drop what a decoder worker holds for a sequence.
    pub const FORGET: u8 = 0x0C;
    /// Controller → node: ask what a decoder worker holds.
    pub const HOLDINGS: u8 = 0x0D;
    /// Node → controller: the hello was accepted.
    pub const WELCOME: u8 = 0x20;
    /// Node → controller: the hello was refused.
    pub const REFUSED: u8 = 0x21;
    /// Node → controller: `WorkerEvent::Ready`.
    pub const READY: u8 = 0x40;
    /// Node → controller: `WorkerEvent::StartFailed`.
    pub const START_FAILED: u8 = 0x41;
    /// Node → controller: `WorkerEvent::Finished` with the outputs' tensors.
    pub const FINISHED: u8 = 0x42;
    /// Node → controller: `WorkerEvent::Aborted`.
    pub const ABORTED: u8 = 0x43;
    /// Node → controller: `WorkerEvent::Reconfigured`.
    pub const RECONFIGURED: u8 = 0x44;
    /// Node → controller: `WorkerEvent::ReconfigureFailed`.
    pub const RECONFIGURE_FAILED: u8 = 0x45;
    /// Node → controller: `WorkerEvent::Retired`.
    pub const RETIRED: u8 = 0x46;
    /// Node → controller: a decoder worker loaded its model.
    pub const DECODER_READY: u8 = 0x47;
    /// Node → controller: a frame ended (done, failed or aborted).
    pub const FRAME_DONE: u8 = 0x48;
    /// Node → controller: what a decoder worker holds.
    pub const HOLDINGS_REPORT: u8 = 0x49;
}

/// One message between a controller and a node.
#[derive(Debug)]
pub enum Message {
    /// First frame of a connection: the catalogue the node's pool serves (paths are
    /// the node's) and the intra-op threads new workers start with.
    Hello {
        /// Intra-op threads of new workers (0: ONNX Runtime's default).
        threads: u32,
        /// `stages[stage][variant]`.
        catalog: ModelCatalog,
    },
    /// Start worker `worker` with the model of (stage, variant).
    Provision {
        /// Worker id.
        worker: u32,
        /// Stage.
        stage: u32,
        /// Variant.
        variant: u32,
    },
    /// Hand a job to a worker.
    Start {
        /// Worker id.
        worker: u32,
        /// The job with its input tensors.
        job: Job,
    },
    /// Abort the job running on a worker.
    Abort {
        /// Worker id.
        worker: u32,
    },
    /// Cancel a starting worker or remove an idle one.
    Retire {
        /// Worker id.
        worker: u32,
    },
    /// Change a worker's intra-op threads.
    SetThreads {
        /// Worker id.
        worker: u32,
        /// New thread count.
        threads: u32,
    },
    /// Change a worker's variant (same stage).
    SetVariant {
        /// Worker id.
        worker: u32,
        /// New variant.
        variant: u32,
    },
    /// The node accepted the hello: it is a host of the controller's cluster.
    Welcome {
        /// The node's device, in words.
        device: String,
        /// The node's name (its host name in the cluster).
        name: String,
        /// Its device slots: GPUs, or the CPU worker slots it was given.
        slots: u32,
        /// Host memory it keeps for cached model parameters, in bytes.
        cache_bytes: u64,
        /// Intra-op threads each of its workers may use (its cores per slot).
        threads: u32,
    },
    /// The node refused the hello.
    Refused {
        /// Why (e.g. a model file missing on the node).
        reason: String,
    },
    /// A worker event.
    Event(WorkerEvent),
    /// A message of a decoder connection.
    Decoder(DecoderMessage),
}

impl Message {
    /// The message's name, for logs and protocol errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Provision { .. } => "provision",
            Message::Start { .. } => "start",
            Message::Abort { .. } => "abort",
            Message::Retire { .. } => "retire",
            Message::SetThreads { .. } => "set-threads",
            Message::SetVariant { .. } => "set-variant",
            Message::Welcome { .. } => "welcome",
            Message::Refused { .. } => "refused",
            Message::Event(WorkerEvent::Ready { .. }) => "ready event",
            Message::Event(WorkerEvent::StartFailed { .. }) => "start-failed event",
            Message::Event(WorkerEvent::Finished { .. }) => "finished event",
            Message::Event(WorkerEvent::Aborted { .. }) => "aborted event",
            Message::Event(WorkerEvent::Reconfigured { .. }) => "reconfigured event",
            Message::Event(WorkerEvent::ReconfigureFailed { .. }) => "reconfigure-failed event",
            Message::Event(WorkerEvent::Retired { .. }) => "retired event",
            Message::Decoder(message) => message.name(),
        }
    }

    /// Whether this is the first command of a worker's stream (a batch or a decoder
    /// provision).
    pub fn is_provision(&self) -> bool {
        matches!(self, Message::Provision { .. } | Message::Decoder(DecoderMessage::Provision { .. }))
    }

    /// The worker a command is for (`None` for hello, welcome, refused and events).
    pub fn command_worker(&self) -> Option<u32> {
        match self {
            Message::Provision { worker, .. }
            | Message::Start { worker, .. }
            | Message::Abort { worker }
            | Message::Retire { worker }
            | Message::SetThreads { worker, .. }
            | Message::SetVariant { worker, .. } => Some(*worker),
            Message::Decoder(message) => message.command_worker(),
            _ => None,
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The input ends before a field does.
    #[error("truncated frame: {field} needs {needed} bytes, {available} left")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// The length prefix disagrees with the bytes given.
    #[error("frame length prefix says {declared} bytes follow, but {actual} do")]
    LengthMismatch {
        /// What the prefix says.
        declared: usize,
        /// What follows it.
        actual: usize,
    },
    /// The length prefix is below the header's two bytes.
    #[error("frame length {0} is shorter than the 2-byte header")]
    TooShort(usize),
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME} bytes")]
    TooLarge(u64),
    /// A version this build does not speak.
    #[error("unsupported framing version {0} (this build speaks version {VERSION})")]
    Version(u8),
    /// An unknown message kind.
    #[error("unknown message kind 0x{0:02x}")]
    UnknownKind(u8),
    /// A count or size over its limit.
    #[error("{what} is {value}, over the limit of {limit}")]
    Limit {
        /// What was counted.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A field with a value that means nothing (bad UTF-8, an unknown tag).
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Bytes left over after the message.
    #[error("{0} bytes left over after the message")]
    Trailing(usize),
}

/// The total length (prefix included) of the frame whose first four bytes are
/// `prefix`, checked against the limits: what a stream reader needs before reading
/// the rest.
pub fn frame_len(prefix: [u8; PREFIX_LEN]) -> Result<usize, FrameError> {
    let declared = u32::from_le_bytes(prefix) as usize;
    if declared < 2 {
        return Err(FrameError::TooShort(declared));
    }
    let total = declared as u64 + PREFIX_LEN as u64;
    if total > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(total));
    }
    Ok(total as usize)
}

/// Decode one whole frame (length prefix included).
pub fn decode(frame: &[u8]) -> Result<Message, FrameError> {
    let mut r = Reader { buf: frame, pos: 0, tensors: 0 };
    let prefix = r.array::<4>("length prefix")?;
    let total = frame_len(prefix)?;
    if total != frame.len() {
        return Err(FrameError::LengthMismatch { declared: total - PREFIX_LEN, actual: frame.len() - PREFIX_LEN });
    }
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = r.u8("kind")?;
    let message = match kind {
        kind::HELLO => Message::Hello { threads: r.u32("threads")?, catalog: r.catalog()? },
        kind::PROVISION => Message::Provision { worker: r.u32("worker")?, stage: r.u32("stage")?, variant: r.u32("variant")? },
        kind::START => {
            let worker = r.u32("worker")?;
            let id = r.u64("job id")?;
            let n = r.count32("requests", MAX_REQUESTS, 10)?;
            let mut requests = Vec::with_capacity(n);
            for _ in 0..n {
                requests.push(Request::new(r.u64("request id")?, r.tensors()?));
            }
            Message::Start { worker, job: Job { id, requests } }
        }
        kind::ABORT => Message::Abort { worker: r.u32("worker")? },
        kind::RETIRE => Message::Retire { worker: r.u32("worker")? },
        kind::SET_THREADS => Message::SetThreads { worker: r.u32("worker")?, threads: r.u32("threads")? },
        kind::SET_VARIANT => Message::SetVariant { worker: r.u32("worker")?, variant: r.u32("variant")? },
        kind::WELCOME => Message::Welcome {
            device: r.string("device")?,
            name: r.string("name")?,
            slots: r.u32("slots")?,
            cache_bytes: r.u64("cache bytes")?,
            threads: r.u32("threads")?,
        },
        kind::REFUSED => Message::Refused { reason: r.string("reason")? },
        kind::READY => Message::Event(WorkerEvent::Ready {
            worker: r.u32("worker")?,
            model: r.model_key()?,
            kind: match r.u8("start kind")? {
                0 => StartKind::Cold,
                1 => StartKind::Warm,
                other => return Err(invalid("start kind", format!("{other} (expected 0 or 1)"))),
            },
            took: r.duration("took")?,
        }),
        kind::START_FAILED => Message::Event(WorkerEvent::StartFailed { worker: r.u32("worker")?, error: r.error()? }),
        kind::FINISHED => {
            let worker = r.u32("worker")?;
            let job = r.u64("job id")?;
            let duration = r.duration("duration")?;
            let result = match r.u8("result tag")? {
                0 => {
                    let n = r.count32("request outputs", MAX_REQUESTS, 10)?;
                    let mut outputs = Vec::with_capacity(n);
                    for _ in 0..n {
                        outputs.push(RequestOutput { id: r.u64("request id")?, outputs: r.tensors()? });
                    }
                    Ok(outputs)
                }
                1 => Err(r.error()?),
                other => return Err(invalid("result tag", format!("{other} (expected 0 or 1)"))),
            };
            Message::Event(WorkerEvent::Finished { worker, job, duration, timing: JobTiming::default(), result })
        }
        kind::ABORTED => Message::Event(WorkerEvent::Aborted { worker: r.u32("worker")?, job: r.u64("job id")? }),
        kind::RECONFIGURED => Message::Event(WorkerEvent::Reconfigured {
            worker: r.u32("worker")?,
            model: r.model_key()?,
            threads: r.u32("threads")? as usize,
            took: r.duration("took")?,
        }),
        kind::RECONFIGURE_FAILED => Message::Event(WorkerEvent::ReconfigureFailed { worker: r.u32("worker")?, error: r.error()? }),
        kind::RETIRED => Message::Event(WorkerEvent::Retired { worker: r.u32("worker")? }),
        other => match decoder::read(&mut r, other)? {
            Some(message) => Message::Decoder(message),
            None => return Err(FrameError::UnknownKind(other)),
        },
    };
    match frame.len() - r.pos {
        0 => Ok(message),
        left => Err(FrameError::Trailing(left)),
    }
}

/// Encode one message as a whole frame (length prefix included). Fails only when the
/// message breaks a limit (too many tensors, rank, frame size) or holds a tensor
/// whose data does not match its shape, or a model path that is not UTF-8.
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    let total = encoded_len(message)?;
    let mut w = Writer { out: Vec::with_capacity(total) };
    w.u32((total - PREFIX_LEN) as u32);
    w.u8(VERSION);
    write_body(&mut w, message);
    debug_assert_eq!(w.out.len(), total);
    Ok(w.out)
}

/// The length [`encode`] would produce, after the same checks, without encoding: a
/// cheap way to refuse a message before handing it to another thread.
pub fn encoded_len(message: &Message) -> Result<usize, FrameError> {
    let mut s = Sizer { len: PREFIX_LEN + 2, tensors: 0 };
    s.message(message)?;
    if s.len > MAX_FRAME {
        return Err(FrameError::TooLarge(s.len as u64));
    }
    Ok(s.len)
}

fn invalid(what: &'static str, detail: String) -> FrameError {
    FrameError::Invalid { what, detail }
}

/// The prefix of `s` of at most [`MAX_STRING`] bytes, cut at a character boundary.
fn clip(s: &str) -> &str {
    if s.len() <= MAX_STRING {
        return s;
    }
    let mut end = MAX_STRING;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `DataplaneError::Missing` names what was missing with a static string; the
/// decoder maps the names it knows back and uses a generic one otherwise.
const MISSING_WHATS: [&str; 3] = ["the ONNX Runtime library", "the PP-OCR models", "a model file"];

// ---------------------------------------------------------------------------------
// Encoding.

struct Sizer {
    len: usize,
    tensors: usize,
}

impl Sizer {
    fn add(&mut self, n: usize) {
        self.len = self.len.saturating_add(n);
    }

    fn string(&mut self, s: &str) {
        self.add(4 + clip(s).len());
    }

    fn path(&mut self, path: &std::path::Path) -> Result<(), FrameError> {
        let text = path.to_str().ok_or_else(|| invalid("model path", format!("{} is not UTF-8", path.display())))?;
        if text.len() > MAX_STRING {
            return Err(FrameError::Limit { what: "model path bytes", value: text.len() as u64, limit: MAX_STRING as u64 });
        }
        self.add(4 + text.len());
        Ok(())
    }

    fn limit(what: &'static str, value: usize, limit: usize) -> Result<(), FrameError> {
        if value > limit {
            return Err(FrameError::Limit { what, value: value as u64, limit: limit as u64 });
        }
        Ok(())
    }

    fn warm_up(&mut self, samples: &[WarmUp]) -> Result<(), FrameError> {
        Self::limit("warm-up samples", samples.len(), u16::MAX as usize)?;
        self.add(2);
        for sample in samples {
            self.string(&sample.name);
            Self::limit("warm-up inputs", sample.inputs.len(), u16::MAX as usize)?;
            self.add(4 + 4 + 2);
            for input in &sample.inputs {
                Self::limit("tensor rank", input.shape.len(), MAX_RANK)?;
                self.add(1 + 4 * input.shape.len() + 1);
                if let WarmUpData::Given(bytes) = &input.data {
                    Self::limit("warm-up bytes", bytes.len(), u32::MAX as usize)?;
                    self.add(4 + bytes.len());
                }
            }
        }
        Ok(())
    }

    fn tensors(&mut self, tensors: &[Tensor]) -> Result<(), FrameError> {
        Self::limit("tensors of one request", tensors.len(), u16::MAX as usize)?;
        self.add(2);
        for tensor in tensors {
            self.tensors += 1;
            Self::limit("tensors in the frame", self.tensors, MAX_TENSORS)?;
            Self::limit("tensor rank", tensor.shape.len(), MAX_RANK)?;
            let mut elements: u64 = 1;
            for &dim in &tensor.shape {
                Self::limit("tensor dimension", dim, u32::MAX as usize)?;
                elements = elements.saturating_mul(dim as u64);
            }
            if elements != tensor.data.len() as u64 {
                return Err(invalid(
                    "tensor",
                    format!("shape {:?} needs {elements} elements, the data has {}", tensor.shape, tensor.data.len()),
                ));
            }
            let strings = if tensor.data.element().width().is_none() { 4 } else { 0 };
            self.add(2 + 4 * tensor.shape.len() + strings + tensor.data.bytes().len());
            if self.len > MAX_FRAME {
                return Err(FrameError::TooLarge(self.len as u64));
            }
        }
        Ok(())
    }

    fn error(&mut self, error: &DataplaneError) {
        self.add(1);
        match error {
            DataplaneError::Missing { what, path, hint } => {
                self.string(what);
                self.string(&path.to_string_lossy());
                self.string(hint);
            }
            DataplaneError::Ort(m) | DataplaneError::Batch(m) | DataplaneError::Invalid(m) => self.string(m),
            DataplaneError::Aborted => {}
            DataplaneError::Io { path, message } => {
                self.string(&path.to_string_lossy());
                self.string(message);
            }
            DataplaneError::WorkerGone(_) => self.add(4),
        }
    }

    fn message(&mut self, message: &Message) -> Result<(), FrameError> {
        match message {
            Message::Hello { catalog, .. } => {
                self.add(4 + 2);
                Self::limit("stages", catalog.stages.len(), MAX_STAGES)?;
                for variants in &catalog.stages {
                    Self::limit("variants of a stage", variants.len(), MAX_VARIANTS)?;
                    self.add(2);
                    for spec in variants {
                        self.string(&spec.key.model);
                        self.string(&spec.key.variant);
                        self.path(&spec.path)?;
                        self.warm_up(&spec.warm_up)?;
                    }
                }
            }
            Message::Provision { .. } => self.add(12),
            Message::Start { job, .. } => {
                Self::limit("requests of a job", job.requests.len(), MAX_REQUESTS)?;
                self.add(4 + 8 + 4);
                for request in &job.requests {
                    self.add(8);
                    self.tensors(&request.inputs)?;
                }
            }
            Message::Abort { .. } | Message::Retire { .. } => self.add(4),
            Message::SetThreads { .. } | Message::SetVariant { .. } => self.add(8),
            Message::Welcome { device, name, .. } => {
                self.string(device);
                self.string(name);
                self.add(4 + 8 + 4);
            }
            Message::Refused { reason } => self.string(reason),
            Message::Event(event) => match event {
                WorkerEvent::Ready { model, .. } => {
                    self.add(4);
                    self.string(&model.model);
                    self.string(&model.variant);
                    self.add(1 + 8);
                }
                WorkerEvent::StartFailed { error, .. } | WorkerEvent::ReconfigureFailed { error, .. } => {
                    self.add(4);
                    self.error(error);
                }
                WorkerEvent::Finished { result, .. } => {
                    self.add(4 + 8 + 8 + 1);
                    match result {
                        Ok(outputs) => {
                            Self::limit("request outputs of a job", outputs.len(), MAX_REQUESTS)?;
                            self.add(4);
                            for output in outputs {
                                self.add(8);
                                self.tensors(&output.outputs)?;
                            }
                        }
                        Err(error) => self.error(error),
                    }
                }
                WorkerEvent::Aborted { .. } => self.add(12),
                WorkerEvent::Reconfigured { model, threads, .. } => {
                    Self::limit("threads", *threads, u32::MAX as usize)?;
                    self.add(4);
                    self.string(&model.model);
                    self.string(&model.variant);
                    self.add(4 + 8);
                }
                WorkerEvent::Retired { .. } => self.add(4),
            },
            Message::Decoder(message) => decoder::size(self, message)?,
        }
        Ok(())
    }
}

struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        let s = clip(s);
        self.u32(s.len() as u32);
        self.out.extend_from_slice(s.as_bytes());
    }
    fn model_key(&mut self, key: &ModelKey) {
        self.string(&key.model);
        self.string(&key.variant);
    }
    fn tensors(&mut self, tensors: &[Tensor]) {
        self.u16(tensors.len() as u16);
        for tensor in tensors {
            let element = tensor.data.element();
            self.u8(element_code(element));
            self.u8(tensor.shape.len() as u8);
            for &dim in &tensor.shape {
                self.u32(dim as u32);
            }
            if element == ElementType::Bytes {
                self.u32(tensor.data.bytes().len() as u32);
            }
            self.out.extend_from_slice(tensor.data.bytes());
        }
    }
    fn error(&mut self, error: &DataplaneError) {
        match error {
            DataplaneError::Missing { what, path, hint } => {
                self.u8(0);
                self.string(what);
                self.string(&path.to_string_lossy());
                self.string(hint);
            }
            DataplaneError::Ort(m) => {
                self.u8(1);
                self.string(m);
            }
            DataplaneError::Batch(m) => {
                self.u8(2);
                self.string(m);
            }
            DataplaneError::Aborted => self.u8(3),
            DataplaneError::Io { path, message } => {
                self.u8(4);
                self.string(&path.to_string_lossy());
                self.string(message);
            }
            DataplaneError::WorkerGone(worker) => {
                self.u8(5);
                self.u32(*worker);
            }
            DataplaneError::Invalid(m) => {
                self.u8(6);
                self.string(m);
            }
        }
    }
}

fn write_body(w: &mut Writer, message: &Message) {
    match message {
        Message::Hello { threads, catalog } => {
            w.u8(kind::HELLO);
            w.u32(*threads);
            w.u16(catalog.stages.len() as u16);
            for variants in &catalog.stages {
                w.u16(variants.len() as u16);
                for spec in variants {
                    w.model_key(&spec.key);
                    // Checked to be UTF-8 by the sizer.
                    w.string(spec.path.to_str().unwrap_or_default());
                    w.u16(spec.warm_up.len() as u16);
                    for sample in &spec.warm_up {
                        w.string(&sample.name);
                        w.u32(sample.batch);
                        w.u32(sample.count);
                        w.u16(sample.inputs.len() as u16);
                        for input in &sample.inputs {
                            w.u8(input.shape.len() as u8);
                            for &dim in &input.shape {
                                w.u32(dim as u32);
                            }
                            match &input.data {
                                WarmUpData::Zero => w.u8(0),
                                WarmUpData::Random => w.u8(1),
                                WarmUpData::Given(bytes) => {
                                    w.u8(2);
                                    w.u32(bytes.len() as u32);
                                    w.out.extend_from_slice(bytes);
                                }
                            }
                        }
                    }
                }
            }
        }
        Message::Provision { worker, stage, variant } => {
            w.u8(kind::PROVISION);
            w.u32(*worker);
            w.u32(*stage);
            w.u32(*variant);
        }
        Message::Start { worker, job } => {
            w.u8(kind::START);
            w.u32(*worker);
            w.u64(job.id);
            w.u32(job.requests.len() as u32);
            for request in &job.requests {
                w.u64(request.id);
                w.tensors(&request.inputs);
            }
        }
        Message::Abort { worker } => {
            w.u8(kind::ABORT);
            w.u32(*worker);
        }
        Message::Retire { worker } => {
            w.u8(kind::RETIRE);
            w.u32(*worker);
        }
        Message::SetThreads { worker, threads } => {
            w.u8(kind::SET_THREADS);
            w.u32(*worker);
            w.u32(*threads);
        }
        Message::SetVariant { worker, variant } => {
            w.u8(kind::SET_VARIANT);
            w.u32(*worker);
            w.u32(*variant);
        }
        Message::Welcome { device, name, slots, cache_bytes, threads } => {
            w.u8(kind::WELCOME);
            w.string(device);
            w.string(name);
            w.u32(*slots);
            w.u64(*cache_bytes);
            w.u32(*threads);
        }
        Message::Refused { reason } => {
            w.u8(kind::REFUSED);
            w.string(reason);
        }
        Message::Event(event) => write_event(w, event),
        Message::Decoder(message) => decoder::write(w, message),
    }
}

fn write_event(w: &mut Writer, event: &WorkerEvent) {
    match event {
        WorkerEvent::Ready { worker, model, kind: start, took } => {
            w.u8(kind::READY);
            w.u32(*worker);
            w.model_key(model);
            w.u8(match start {
                StartKind::Cold => 0,
                StartKind::Warm => 1,
            });
            w.u64(nanos(*took));
        }
        WorkerEvent::StartFailed { worker, error } => {
            w.u8(kind::START_FAILED);
            w.u32(*worker);
            w.error(error);
        }
        WorkerEvent::Finished { worker, job, duration, result, .. } => {
            w.u8(kind::FINISHED);
            w.u32(*worker);
            w.u64(*job);
            w.u64(nanos(*duration));
            match result {
                Ok(outputs) => {
                    w.u8(0);
                    w.u32(outputs.len() as u32);
                    for output in outputs {
                        w.u64(output.id);
                        w.tensors(&output.outputs);
                    }
                }
                Err(error) => {
                    w.u8(1);
                    w.error(error);
                }
            }
        }
        WorkerEvent::Aborted { worker, job } => {
            w.u8(kind::ABORTED);
            w.u32(*worker);
            w.u64(*job);
        }
        WorkerEvent::Reconfigured { worker, model, threads, took } => {
            w.u8(kind::RECONFIGURED);
            w.u32(*worker);
            w.model_key(model);
            w.u32(*threads as u32);
            w.u64(nanos(*took));
        }
        WorkerEvent::ReconfigureFailed { worker, error } => {
            w.u8(kind::RECONFIGURE_FAILED);
            w.u32(*worker);
            w.error(error);
        }
        WorkerEvent::Retired { worker } => {
            w.u8(kind::RETIRED);
            w.u32(*worker);
        }
    }
}

/// Every element type in the order of its code on the wire.
const ELEMENT_TYPES: [ElementType; 14] = [
    ElementType::F32,
    ElementType::F64,
    ElementType::F16,
    ElementType::Bf16,
    ElementType::I8,
    ElementType::I16,
    ElementType::I32,
    ElementType::I64,
    ElementType::U8,
    ElementType::U16,
    ElementType::U32,
    ElementType::U64,
    ElementType::Bool,
    ElementType::Bytes,
];

/// An element type's code on the wire: `f32` 0, `f64` 1, `f16` 2, `bf16` 3, `i8`–`i64`
/// 4–7, `u8`–`u64` 8–11, `bool` 12, BYTES 13.
pub fn element_code(element: ElementType) -> u8 {
    ELEMENT_TYPES.iter().position(|&e| e == element).expect("every element type has a code") as u8
}

// ---------------------------------------------------------------------------------
// Decoding.

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    tensors: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FrameError> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(FrameError::Truncated { field, needed: n, available });
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], FrameError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    fn duration(&mut self, field: &'static str) -> Result<Duration, FrameError> {
        Ok(Duration::from_nanos(self.u64(field)?))
    }

    /// A `u32` count of items at least `min_item` bytes each, within `limit` and
    /// within the bytes left (so that allocating for it is safe).
    fn count32(&mut self, what: &'static str, limit: usize, min_item: usize) -> Result<usize, FrameError> {
        let n = self.u32(what)? as usize;
        self.check_count(what, n, limit, min_item)
    }

    fn count16(&mut self, what: &'static str, limit: usize, min_item: usize) -> Result<usize, FrameError> {
        let n = self.u16(what)? as usize;
        self.check_count(what, n, limit, min_item)
    }

    fn check_count(&self, what: &'static str, n: usize, limit: usize, min_item: usize) -> Result<usize, FrameError> {
        if n > limit {
            return Err(FrameError::Limit { what, value: n as u64, limit: limit as u64 });
        }
        let available = self.buf.len() - self.pos;
        if n.saturating_mul(min_item) > available {
            return Err(FrameError::Truncated { field: what, needed: n.saturating_mul(min_item), available });
        }
        Ok(n)
    }

    fn string(&mut self, field: &'static str) -> Result<String, FrameError> {
        let n = self.u32(field)? as usize;
        if n > MAX_STRING {
            return Err(FrameError::Limit { what: field, value: n as u64, limit: MAX_STRING as u64 });
        }
        let bytes = self.take(n, field)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| invalid(field, format!("not UTF-8: {e}")))
    }

    fn model_key(&mut self) -> Result<ModelKey, FrameError> {
        Ok(ModelKey { model: self.string("model name")?, variant: self.string("variant name")? })
    }

    fn tensors(&mut self) -> Result<Vec<Tensor>, FrameError> {
        let n = self.count16("tensor count", u16::MAX as usize, 1)?;
        let mut tensors = Vec::with_capacity(n);
        for _ in 0..n {
            self.tensors += 1;
            if self.tensors > MAX_TENSORS {
                return Err(FrameError::Limit { what: "tensors in the frame", value: self.tensors as u64, limit: MAX_TENSORS as u64 });
            }
            tensors.push(self.tensor()?);
        }
        Ok(tensors)
    }

    fn tensor(&mut self) -> Result<Tensor, FrameError> {
        let code = self.u8("tensor element type")?;
        let element = *ELEMENT_TYPES.get(code as usize).ok_or_else(|| invalid("tensor element type", format!("unknown code {code}")))?;
        let rank = self.u8("tensor rank")? as usize;
        if rank > MAX_RANK {
            return Err(FrameError::Limit { what: "tensor rank", value: rank as u64, limit: MAX_RANK as u64 });
        }
        let mut shape = Vec::with_capacity(rank);
        let mut elements: u64 = 1;
        for _ in 0..rank {
            let dim = self.u32("tensor dimension")?;
            elements = elements.saturating_mul(dim as u64);
            shape.push(dim as usize);
        }
        let bytes = match element.width() {
            Some(width) => elements.saturating_mul(width as u64),
            None => self.u32("string bytes")? as u64,
        };
        let available = self.buf.len() - self.pos;
        if bytes > available as u64 {
            return Err(FrameError::Truncated { field: "tensor data", needed: usize::try_from(bytes).unwrap_or(usize::MAX), available });
        }
        let raw = self.take(bytes as usize, "tensor data")?;
        let data = TensorData::from_bytes(element, raw, elements as usize).map_err(|e| invalid("tensor data", e.to_string()))?;
        Ok(Tensor { shape, data })
    }

    fn error(&mut self) -> Result<DataplaneError, FrameError> {
        Ok(match self.u8("error tag")? {
            0 => {
                let what = self.string("missing what")?;
                DataplaneError::Missing {
                    what: MISSING_WHATS.iter().find(|w| **w == what).copied().unwrap_or("a file the node needs"),
                    path: PathBuf::from(self.string("missing path")?),
                    hint: self.string("missing hint")?,
                }
            }
            1 => DataplaneError::Ort(self.string("error message")?),
            2 => DataplaneError::Batch(self.string("error message")?),
            3 => DataplaneError::Aborted,
            4 => DataplaneError::Io { path: PathBuf::from(self.string("error path")?), message: self.string("error message")? },
            5 => DataplaneError::WorkerGone(self.u32("worker")?),
            6 => DataplaneError::Invalid(self.string("error message")?),
            other => return Err(invalid("error tag", format!("{other} (expected 0 to 6)"))),
        })
    }

    fn warm_up(&mut self) -> Result<Vec<WarmUp>, FrameError> {
        let samples = self.count16("warm-up samples", u16::MAX as usize, 12)?;
        let mut warm_up = Vec::with_capacity(samples);
        for _ in 0..samples {
            let name = self.string("warm-up name")?;
            let (batch, count) = (self.u32("warm-up batch")?, self.u32("warm-up count")?);
            let inputs = self.count16("warm-up inputs", u16::MAX as usize, 2)?;
            let mut sample = WarmUp { name, batch, count, inputs: Vec::with_capacity(inputs) };
            for _ in 0..inputs {
                let rank = self.u8("warm-up rank")? as usize;
                if rank > MAX_RANK {
                    return Err(FrameError::Limit { what: "tensor rank", value: rank as u64, limit: MAX_RANK as u64 });
                }
                let mut shape = Vec::with_capacity(rank);
                for _ in 0..rank {
                    shape.push(self.u32("warm-up dimension")? as usize);
                }
                let data = match self.u8("warm-up data")? {
                    0 => WarmUpData::Zero,
                    1 => WarmUpData::Random,
                    2 => {
                        let len = self.u32("warm-up bytes")? as usize;
                        WarmUpData::Given(self.take(len, "warm-up bytes")?.to_vec())
                    }
                    other => return Err(invalid("warm-up data", format!("unknown kind {other}"))),
                };
                sample.inputs.push(WarmUpInput { shape, data });
            }
            warm_up.push(sample);
        }
        Ok(warm_up)
    }

    fn catalog(&mut self) -> Result<ModelCatalog, FrameError> {
        let stages = self.count16("stages", MAX_STAGES, 2)?;
        let mut catalog = ModelCatalog { stages: Vec::with_capacity(stages) };
        for _ in 0..stages {
            let variants = self.count16("variants of a stage", MAX_VARIANTS, 12)?;
            let mut specs = Vec::with_capacity(variants);
            for _ in 0..variants {
                let key = self.model_key()?;
                let path = PathBuf::from(self.string("model path")?);
                specs.push(ModelSpec { key, path, warm_up: self.warm_up()?, sequence: None });
            }
            catalog.stages.push(specs);
        }
        Ok(catalog)
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_frame_has_the_documented_layout() {
        let frame = encode(&Message::Abort { worker: 0x0102_0304 }).unwrap();
        assert_eq!(frame, [6, 0, 0, 0, VERSION, kind::ABORT, 4, 3, 2, 1]);
        let tensor = Tensor::new(vec![2], vec![1.0, -2.5]).unwrap();
        let frame = encode(&Message::Start { worker: 1, job: Job { id: 2, requests: vec![Request::new(3, vec![tensor])] } }).unwrap();
        // prefix, version, kind, worker, job, 1 request, its id, 1 tensor, element type, rank 1, dim 2, 2 floats.
        assert_eq!(frame.len(), 4 + 2 + 4 + 8 + 4 + 8 + 2 + 1 + 1 + 4 + 8);
        assert_eq!(&frame[frame.len() - 8..], [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat().as_slice());
    }

    #[test]
    fn the_length_prefix_is_checked_against_the_limits() {
        assert_eq!(frame_len(2u32.to_le_bytes()), Ok(6));
        assert_eq!(frame_len(1u32.to_le_bytes()), Err(FrameError::TooShort(1)));
        assert!(matches!(frame_len(u32::MAX.to_le_bytes()), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn encode_refuses_what_decode_would_refuse() {
        let deep = Tensor { shape: vec![1; MAX_RANK + 1], data: vec![0.0].into() };
        let job = Job { id: 1, requests: vec![Request::new(1, vec![deep])] };
        assert!(matches!(encode(&Message::Start { worker: 0, job }), Err(FrameError::Limit { what: "tensor rank", .. })));
        let wrong = Tensor { shape: vec![3], data: vec![0.0].into() };
        let job = Job { id: 1, requests: vec![Request::new(1, vec![wrong])] };
        assert!(matches!(encode(&Message::Start { worker: 0, job }), Err(FrameError::Invalid { what: "tensor", .. })));
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let reason = "é".repeat(MAX_STRING); // 2 bytes each
        let frame = encode(&Message::Refused { reason }).unwrap();
        match decode(&frame).unwrap() {
            Message::Refused { reason } => {
                assert!(reason.len() <= MAX_STRING && reason.len() >= MAX_STRING - 1);
                assert!(reason.chars().all(|c| c == 'é'));
            }
            other => panic!("{other:?}"),
        }
    }
}
