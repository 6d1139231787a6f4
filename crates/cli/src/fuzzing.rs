//! Entry points of the fuzz targets (`fuzz/`), one function per decoder that takes
//! outside input. They live in the library so that the libFuzzer targets and the
//! stable corpus test (`tests/tests/all/fuzz_corpus.rs`, the CI smoke run) call exactly
//! the same code.
//!
//! Every function accepts any bytes and must return normally: an error from the
//! decoder is the expected answer to bad input, a panic is a bug. Where a decoder
//! has a cheap consistency property (a decoded frame encodes to bytes that decode and
//! encode to the same bytes), the function asserts it too.

use std::collections::HashSet;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use yardmaster_engine::{Engine, EngineOptions, ItemResult, JobResult, ManualClock, Pipeline, RecordingExecutor, Submission};
use yardmaster_policy::contract::{self, Action, Config, Event};
use yardmaster_policy::{Arm, CallCost, CallKind, Candidate, FailureMode, NativePolicy, PolicyFault, PolicyInstance};

/// The KServe v2 request decoder. The first byte chooses the framing: odd → the body
/// is JSON only; even → the next two bytes (little-endian) are the
/// `Inference-Header-Content-Length` and the rest is JSON followed by binary tensor
/// data.
#[doc(hidden)]
pub fn kserve_request(data: &[u8]) {
    use yardmaster_serve::kserve;
    let Some((&mode, rest)) = data.split_first() else { return };
    let (json_length, body) =
        if mode % 2 == 1 || rest.len() < 2 { (None, rest) } else { (Some(u16::from_le_bytes([rest[0], rest[1]]) as usize), &rest[2..]) };
    if let Ok(request) = kserve::decode_request(body, json_length) {
        for tensor in &request.inputs {
            // What the server does with a decoded tensor: its size and layout agree.
            assert!(tensor.element_count() <= kserve::MAX_ELEMENTS);
            let _ = tensor.as_f32();
            assert_eq!(tensor.binary().len(), tensor.byte_size());
        }
    }
}

/// The inter-node framing decoder, on the bytes as given and on the same bytes with
/// their length prefix corrected (so that mutations of the body get past the length
/// check). A frame that decodes must encode to a frame that decodes and encodes
/// to the same bytes.
#[doc(hidden)]
pub fn remote_frame(data: &[u8]) {
    use yardmaster_cluster::framing::PREFIX_LEN;
    decode_frame(data);
    if data.len() >= PREFIX_LEN && data.len() - PREFIX_LEN <= u32::MAX as usize {
        let mut fixed = data.to_vec();
        fixed[..PREFIX_LEN].copy_from_slice(&((data.len() - PREFIX_LEN) as u32).to_le_bytes());
        decode_frame(&fixed);
    }
}

fn decode_frame(data: &[u8]) {
    use yardmaster_cluster::framing;
    if data.len() >= framing::PREFIX_LEN {
        let _ = framing::frame_len(data[..framing::PREFIX_LEN].try_into().expect("prefix"));
    }
    if let Ok(message) = framing::decode(data) {
        let encoded = framing::encode(&message).expect("a decoded message encodes");
        assert_eq!(framing::encoded_len(&message).expect("a decoded message has a length"), encoded.len());
        // Decoding normalises a few fields (an unknown "missing" description becomes
        // a generic one), so the property is that encoding is a fixed point: what was
        // encoded decodes and encodes to the same bytes again.
        let again = framing::decode(&encoded).expect("an encoded frame decodes");
        assert_eq!(framing::encode(&again).expect("it encodes"), encoded, "a re-encoded frame is stable");
    }
}

/// Pipeline files (`yardmaster_formats::pipeline::from_toml`); a pipeline that parses is also described to
/// the policy and used for a capacity estimate, as the engine does at start.
#[doc(hidden)]
pub fn pipeline_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(pipeline) = yardmaster_formats::pipeline::from_toml(text, "fuzz") {
        let _ = Engine::<ManualClock, RecordingExecutor>::policy_config(&pipeline, "fuzz", &EngineOptions::default());
        let _ = yardmaster_engine::pieces_per_request(&pipeline);
        for stage in &pipeline.stages {
            for variant in &stage.variants {
                let _ = variant.profile.mean(stage.max_batch);
                let _ = variant.profile.tail(1);
            }
        }
    }
}

/// The serve configuration (`ServeConfig::parse`) and what the server derives from it.
#[doc(hidden)]
pub fn serve_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = yardmaster_serve::config::ServeConfig::parse(text, Path::new("/fuzz")) {
        let _ = config.policy_params();
        let _ = config.state_dir();
        let _ = config.listen_options();
        let _ = config.device_preference();
        let _ = config.admin.effective_token();
    }
}

/// Trace files: the reader over every line, and the workload read back from them.
#[doc(hidden)]
pub fn trace_file(data: &[u8]) {
    use yardmaster_formats::trace::{arrivals_from_trace, TraceReader};
    if let Ok(reader) = TraceReader::new(Cursor::new(data)) {
        let _ = reader.header();
        for record in reader.flatten() {
            let _ = record.at();
        }
    }
    if let Ok(reader) = TraceReader::new(Cursor::new(data)) {
        for _ in arrivals_from_trace(reader) {}
    }
}

const MS: u64 = 1_000_000;

/// The pipeline the action target runs: a two-stage chain (the second with two
/// variants) and an iteration-level stage on a stream of its own.
const ACTION_PIPELINE: &str = r#"
name = "fuzz"
slo_ms = 100
[[stream]]
name = "vision"
entry = "detect"
[[stream]]
name = "chat"
entry = "llm"
[[stage]]
name = "detect"
successors = ["classify"]
max_batch = 4
replicas = 1
max_replicas = 3
[[stage.variant]]
name = "d"
alpha_ms = 1.0
beta_ms = 1.0
[[stage]]
name = "classify"
max_batch = 4
replicas = 1
max_replicas = 3
[[stage.variant]]
name = "small"
alpha_ms = 0.5
beta_ms = 1.0
[[stage.variant]]
name = "large"
alpha_ms = 2.0
beta_ms = 1.0
accuracy = 0.9
[[stage]]
name = "llm"
kind = "iteration"
max_batch = 4
replicas = 1
max_replicas = 2
[[stage.variant]]
name = "l"
alpha_ms = 0.2
beta_ms = 2.0
"#;

/// The fuzz input, shared by the driver and the scripted policy: both read their next
/// decision from it; an exhausted input reads as zeros.
struct Script {
    data: Vec<u8>,
    pos: usize,
    /// Requests the policy was given and has not seen end (its own bookkeeping, which
    /// may be wrong on purpose: ids are also made up).
    held: Vec<u64>,
}

impl Script {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn below(&mut self, n: u32) -> u32 {
        self.byte() as u32 % n
    }

    /// A request id: mostly one the policy holds, sometimes any small number.
    fn request(&mut self) -> u64 {
        let b = self.byte();
        if !self.held.is_empty() && b < 224 {
            self.held[b as usize % self.held.len()]
        } else {
            b as u64 % 64
        }
    }

    fn option(&mut self, n: u32) -> Option<u32> {
        match self.byte() {
            b if b % 2 == 0 => None,
            b => Some((b as u32 / 2) % n),
        }
    }

    fn weight(&mut self) -> f64 {
        match self.byte() % 8 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -1.0,
            3 => 0.0,
            4 => f64::MAX,
            k => k as f64,
        }
    }

    fn action(&mut self, now: u64) -> Action {
        match self.byte() % 11 {
            0 => Action::Drop(contract::DropRequest { request: self.request(), reason: contract::DropReason::Policy }),
            1 | 2 => {
                let worker = self.below(8);
                let n = self.below(6);
                let requests = (0..n).map(|_| self.request()).collect();
                Action::Dispatch(contract::Dispatch { worker, requests, variant: self.option(3) })
            }
            3 => Action::Preempt(self.below(8)),
            4 => Action::Evict(contract::Evict {
                sequence: self.request(),
                mode: if self.byte().is_multiple_of(2) { contract::EvictMode::Recompute } else { contract::EvictMode::Swap },
            }),
            5 => Action::Scale(contract::Scale {
                stage: self.below(4),
                replicas: self.below(6),
                variant: self.option(3),
                placement: Vec::new(),
            }),
            6 => Action::SetVariant(contract::SetVariant {
                target: if self.byte().is_multiple_of(2) {
                    contract::VariantTarget::Worker(self.below(8))
                } else {
                    contract::VariantTarget::Stage(self.below(4))
                },
                variant: self.below(3),
            }),
            7 => {
                let stage = self.below(4);
                let source = self.option(8);
                let n = self.below(4);
                let targets = (0..n).map(|_| contract::Route { worker: self.below(8), weight: self.weight() }).collect();
                Action::SetRoutes(contract::SetRoutes { stage, source, targets })
            }
            8 => Action::SetBatchLimit(contract::SetBatchLimit { stage: self.below(4), limit: self.below(8) }),
            9 => Action::SetThreads(contract::SetThreads { worker: self.below(8), threads: self.below(20) }),
            _ => match self.byte() % 3 {
                0 => Action::Defer(contract::Defer { request: self.request(), until: now + self.byte() as u64 * MS }),
                1 => Action::Defer(contract::Defer { request: self.request(), until: now.saturating_sub(MS) }),
                _ => Action::SetTimer(contract::SetTimer { at: now + self.byte() as u64 * MS, token: self.byte() as u64 }),
            },
        }
    }
}

/// A policy whose every answer is read from the fuzz input: up to seven actions,
/// valid or not.
struct ScriptedPolicy(Arc<Mutex<Script>>);

impl ScriptedPolicy {
    fn answer(&self, now: u64) -> Vec<Action> {
        let mut script = self.0.lock().expect("script lock");
        if script.exhausted() {
            return Vec::new();
        }
        let n = script.below(8);
        (0..n).map(|_| script.action(now)).collect()
    }
}

impl PolicyInstance for ScriptedPolicy {
    fn label(&self) -> String {
        "scripted".into()
    }

    fn init(&mut self, _config: &Config, now: u64) -> Result<Vec<Action>, PolicyFault> {
        Ok(self.answer(now))
    }

    fn handle(&mut self, events: &[Event], now: u64, _kind: CallKind) -> Result<Vec<Action>, PolicyFault> {
        {
            let mut script = self.0.lock().expect("script lock");
            for event in events {
                match event {
                    Event::Arrival(request) => script.held.push(request.id),
                    Event::RequestEnded((id, _)) => script.held.retain(|h| h != id),
                    _ => {}
                }
            }
            if script.held.len() > 64 {
                script.held.drain(..32);
            }
        }
        Ok(self.answer(now))
    }

    fn last_cost(&self) -> CallCost {
        CallCost::default()
    }

    fn take_emitted(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// Finish every started job; `fail` marks items (bit k of the mask: item k fails),
/// `finished` says whether iteration items end (else they ran a frame and go on).
fn finish_jobs(engine: &mut Engine<ManualClock, RecordingExecutor>, fail: u8, finished: bool) {
    let jobs = engine.executor_mut().take_started();
    for job in jobs {
        let items = job
            .items
            .iter()
            .enumerate()
            .map(|(k, item)| ItemResult {
                id: item.id,
                error: (k < 8 && fail & (1 << k) != 0).then(|| "fuzz".to_string()),
                tokens: if job.stage == 2 { 1 } else { 0 },
                finished: finished || job.stage != 2,
                fan_out: vec![],
            })
            .collect();
        engine.job_finished(JobResult { worker: job.worker, duration: MS, items });
    }
}

/// Take the requests the engine ended; each must be known and end only once.
fn collect_ended(engine: &mut Engine<ManualClock, RecordingExecutor>, submitted: &HashSet<u64>, ended: &mut HashSet<u64>) {
    for e in engine.take_ended() {
        assert!(submitted.contains(&e.id), "request {} ended but was never submitted", e.id);
        assert!(ended.insert(e.id), "request {} ended twice", e.id);
    }
}

/// What one run of [`policy_actions`] did, so that a test can tell that the target
/// exercises the engine rather than stopping early.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActionRun {
    /// Requests submitted (each ended exactly once).
    pub submitted: usize,
    /// Policy actions the validator accepted.
    pub accepted: u64,
    /// Policy actions the validator rejected.
    pub rejected: u64,
}

/// Random action streams against the engine: the input drives a client (submissions),
/// the workers (jobs finishing or failing, workers becoming ready), the clock, and a
/// policy whose answers are arbitrary actions. Every action goes through the host's
/// validator before the engine applies it; afterwards the fuzz policy is swapped for
/// the built-in FIFO and the engine drained. Every request must end exactly once.
#[doc(hidden)]
pub fn policy_actions(data: &[u8]) -> ActionRun {
    static PIPELINE: OnceLock<Pipeline> = OnceLock::new();
    let pipeline = PIPELINE
        .get_or_init(|| yardmaster_formats::pipeline::from_toml(ACTION_PIPELINE, "fuzz").expect("the fuzz pipeline is valid"))
        .clone();
    let script = Arc::new(Mutex::new(Script { data: data.to_vec(), pos: 0, held: Vec::new() }));
    let clock = ManualClock::default();
    let policy = ScriptedPolicy(script.clone());
    let mut engine = Engine::new(clock.clone(), RecordingExecutor::default(), pipeline, EngineOptions::default(), |config, view| {
        Arm::start("fuzz", config, Box::new(policy), FailureMode::FailOpen, view)
    });
    let mut submitted = HashSet::new();
    let mut order = Vec::new();
    let mut ended = HashSet::new();
    let mut now = 0u64;
    for _ in 0..512 {
        let (op, arg) = {
            let mut s = script.lock().expect("script lock");
            if s.exhausted() {
                break;
            }
            (s.byte(), s.byte())
        };
        match op % 6 {
            0 | 1 => {
                let id = engine.submit(Submission { stream: (arg % 2) as u32, priority: (arg / 2) as u32 % 4, ..Default::default() });
                assert!(submitted.insert(id), "request id {id} given twice");
                order.push(id);
            }
            2 => finish_jobs(&mut engine, arg, arg % 3 != 0),
            3 => {
                for worker in engine.executor_mut().take_provisioned() {
                    engine.worker_ready(worker);
                }
            }
            4 => {
                now += arg as u64 * MS / 4;
                clock.set(now);
            }
            _ => {
                if !order.is_empty() {
                    engine.cancel(order[arg as usize % order.len()]);
                }
            }
        }
        engine.advance();
        engine.flush();
        collect_ended(&mut engine, &submitted, &mut ended);
    }
    let fifo = NativePolicy::<policy_fifo::Fifo>::new("fifo", 1, 100_000);
    let _ = engine.swap(Candidate::native(Box::new(fifo)));
    // Steps of 250 ms: the engine expires what is still held 5 s after its deadline.
    for _ in 0..100 {
        if ended.len() == submitted.len() && engine.in_flight() == 0 {
            break;
        }
        now += 250 * MS;
        clock.set(now);
        for worker in engine.executor_mut().take_provisioned() {
            engine.worker_ready(worker);
        }
        finish_jobs(&mut engine, 0, true);
        engine.advance();
        engine.flush();
        collect_ended(&mut engine, &submitted, &mut ended);
    }
    assert_eq!(ended.len(), submitted.len(), "every request ends exactly once");
    assert_eq!(engine.in_flight(), 0, "nothing left in flight");
    let stats = engine.arm().stats();
    ActionRun { submitted: submitted.len(), accepted: stats.accepted.values().sum(), rejected: stats.rejected_total() }
}
