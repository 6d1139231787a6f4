//! The engine as an actor: one thread owns all scheduling state, and everything else
//! (ingress handlers, workers, the admin API) talks to it by message. There is no lock
//! around a queue, and the order in which messages arrive is the order the policy sees.
//!
//! Each turn of the loop takes every message already waiting, so whatever happened up
//! to a decision point reaches the policy in one call; between messages the actor
//! sleeps until the engine's next wake-up (tick, timer, deferral, expiry).
//!
//! A client's request is submitted with two callbacks: `admitted` runs on the actor
//! thread as soon as the request has its id and before any policy decision, so the
//! caller can park the request's tensors where the executor will look for them; `ended`
//! runs exactly once, when the request completes, is dropped or fails.
//!
//! A policy swap ([`Message::Swap`]) is handled in turn with the other messages: what
//! arrived before it is delivered to the old policy, what arrives after it to the new
//! one, and the retired instance travels back with the answer to be dropped on the
//! caller's thread.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::capture::Recorder;
use crate::engine::{Clock, Ended, Engine, Executor, JobResult, Submission, SwapOutcome};
use crate::policy::{Candidate, ShadowReport};
use crate::metrics::Outcome;

/// Called on the actor thread with the new request's id, before any decision.
pub type Admitted = Box<dyn FnOnce(u64) + Send>;
/// Called exactly once with how the request ended.
pub type OnEnd = Box<dyn FnOnce(Ended) + Send>;
/// A question about the engine, answered on the actor thread.
pub type Inspect<C, X> = Box<dyn FnOnce(&Engine<C, X>) + Send>;
/// Called on the actor thread with what a swap did.
pub type OnSwap = Box<dyn FnOnce(SwapOutcome) + Send>;
/// Called on the actor thread with the report of the shadow a command replaced or stopped.
pub type OnShadow = Box<dyn FnOnce(Option<ShadowReport>) + Send>;

/// What the actor handles.
pub enum Message<C: Clock, X: Executor> {
    /// A client request.
    Submit {
        /// The request.
        submission: Submission,
        /// Runs with its id before any decision.
        admitted: Admitted,
        /// Runs when it ends.
        ended: OnEnd,
    },
    /// The client gave up on a request.
    Cancel(u64),
    /// A worker finished a job.
    JobFinished(JobResult),
    /// A worker finished starting.
    WorkerReady(u32),
    /// A worker was lost (failed to start, or its host went away), and why.
    WorkerLost(u32, String),
    /// Read the engine (metrics, state) on the actor thread.
    Inspect(Inspect<C, X>),
    /// Start capturing a trace (replacing any capture running), or stop with `None`.
    Capture(Option<Recorder>),
    /// Hand the policy arm over to a new instance (see [`Engine::swap`]).
    Swap {
        /// The new policy, already instantiated.
        candidate: Candidate,
        /// Runs with the outcome.
        done: OnSwap,
    },
    /// Start a shadow policy (`Some`, replacing one running) or stop it (`None`); see
    /// [`Engine::start_shadow`].
    Shadow {
        /// The shadow to start, already instantiated; `None` stops the running one.
        candidate: Option<Candidate>,
        /// Runs with the report of the shadow replaced or stopped.
        done: OnShadow,
    },
    /// Stop: every request still in flight ends as failed with this reason.
    Shutdown(String),
}

/// A cheap, clonable way to reach the actor.
pub struct ActorHandle<C: Clock, X: Executor> {
    sender: Sender<Message<C, X>>,
}

impl<C: Clock, X: Executor> Clone for ActorHandle<C, X> {
    fn clone(&self) -> Self {
        Self { sender: self.sender.clone() }
    }
}

/// The actor has stopped; the message was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActorStopped;

impl std::fmt::Display for ActorStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the scheduling engine has stopped")
    }
}

impl std::error::Error for ActorStopped {}

impl<C: Clock, X: Executor> ActorHandle<C, X> {
    /// Send any message.
    pub fn send(&self, message: Message<C, X>) -> Result<(), ActorStopped> {
        self.sender.send(message).map_err(|_| ActorStopped)
    }

    /// Submit a request (see the module docs for the callbacks). When the actor has
    /// stopped, `ended` is not called and the error says so.
    pub fn submit(&self, submission: Submission, admitted: Admitted, ended: OnEnd) -> Result<(), ActorStopped> {
        self.send(Message::Submit { submission, admitted, ended })
    }

    /// Report a finished job.
    pub fn job_finished(&self, result: JobResult) -> Result<(), ActorStopped> {
        self.send(Message::JobFinished(result))
    }

    /// Report a worker ready.
    pub fn worker_ready(&self, worker: u32) -> Result<(), ActorStopped> {
        self.send(Message::WorkerReady(worker))
    }

    /// Report a worker lost, and why.
    pub fn worker_lost(&self, worker: u32, reason: String) -> Result<(), ActorStopped> {
        self.send(Message::WorkerLost(worker, reason))
    }

    /// Cancel a request.
    pub fn cancel(&self, id: u64) -> Result<(), ActorStopped> {
        self.send(Message::Cancel(id))
    }

    /// Start a trace capture (replacing one already running), or stop it with `None`.
    pub fn capture(&self, recorder: Option<Recorder>) -> Result<(), ActorStopped> {
        self.send(Message::Capture(recorder))
    }

    /// Swap the policy (see [`Engine::swap`]) and wait for the outcome; the retired
    /// instance comes back in it, to be dropped on this thread.
    pub fn swap(&self, candidate: Candidate) -> Result<SwapOutcome, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Swap {
            candidate,
            done: Box::new(move |outcome| {
                let _ = reply.send(outcome);
            }),
        })?;
        answer.recv().map_err(|_| ActorStopped)
    }

    /// Start `candidate` as a shadow (`Some`) or stop the shadow (`None`); the report
    /// of the shadow replaced or stopped, if one ran.
    pub fn shadow(&self, candidate: Option<Candidate>) -> Result<Option<ShadowReport>, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Shadow {
            candidate,
            done: Box::new(move |report| {
                let _ = reply.send(report);
            }),
        })?;
        answer.recv().map_err(|_| ActorStopped)
    }

    /// Run `question` on the actor thread and return its answer.
    pub fn inspect<T: Send + 'static>(
        &self,
        question: impl FnOnce(&Engine<C, X>) -> T + Send + 'static,
    ) -> Result<T, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Inspect(Box::new(move |engine| {
            let _ = reply.send(question(engine));
        })))?;
        answer.recv().map_err(|_| ActorStopped)
    }
}

/// The running actor.
pub struct Actor<C: Clock, X: Executor> {
    handle: ActorHandle<C, X>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Clock + Send + 'static, X: Executor + 'static> Actor<C, X> {
    /// Start the actor thread; `build` makes the engine on that thread (so the engine
    /// and its policy instance never cross threads) and gets a handle for the
    /// executor to report back with.
    pub fn spawn(
        name: &str,
        clock: C,
        build: impl FnOnce(ActorHandle<C, X>) -> Engine<C, X> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel();
        let handle = ActorHandle { sender };
        let for_engine = handle.clone();
        let thread = std::thread::Builder::new().name(name.to_string()).spawn(move || {
            let engine = build(for_engine);
            run(engine, clock, receiver);
        })?;
        Ok(Self { handle, thread: Some(thread) })
    }

    /// A handle to send messages with.
    pub fn handle(&self) -> ActorHandle<C, X> {
        self.handle.clone()
    }

    /// Stop the actor (requests in flight fail with `reason`) and wait for it.
    pub fn shutdown(mut self, reason: &str) {
        let _ = self.handle.send(Message::Shutdown(reason.to_string()));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<C: Clock, X: Executor> Drop for Actor<C, X> {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.handle.send(Message::Shutdown("the server is shutting down".into()));
            let _ = thread.join();
        }
    }
}

/// The actor loop.
fn run<C: Clock, X: Executor>(mut engine: Engine<C, X>, clock: C, receiver: Receiver<Message<C, X>>) {
    let mut waiting: HashMap<u64, OnEnd> = HashMap::new();
    let mut capture: Option<Recorder> = None;
    loop {
        let first = match engine.next_wakeup() {
            Some(at) => match receiver.recv_timeout(Duration::from_nanos(at.saturating_sub(clock.now()))) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    return shut_down(&mut engine, waiting, &mut capture, "every handle was dropped")
                }
            },
            None => match receiver.recv() {
                Ok(message) => Some(message),
                Err(_) => return shut_down(&mut engine, waiting, &mut capture, "every handle was dropped"),
            },
        };
        let mut stop = None;
        for message in first.into_iter().chain(std::iter::from_fn(|| receiver.try_recv().ok())) {
            match message {
                Message::Submit { submission, admitted, ended } => {
                    let (input_size, expected_tokens) = (submission.input_size, submission.expected_tokens);
                    let id = engine.submit(submission);
                    if let Some(recorder) = &mut capture {
                        recorder.arrival(&engine, id, input_size, expected_tokens);
                    }
                    admitted(id);
                    waiting.insert(id, ended);
                }
                Message::Cancel(id) => engine.cancel(id),
                Message::JobFinished(result) => {
                    if let Some(recorder) = &mut capture {
                        recorder.batch(&engine, &result);
                    }
                    engine.job_finished(result)
                }
                Message::Capture(recorder) => {
                    if let Some(mut old) = std::mem::replace(&mut capture, recorder) {
                        old.flush();
                    }
                }
                Message::WorkerReady(worker) => engine.worker_ready(worker),
                Message::WorkerLost(worker, reason) => engine.worker_lost(worker, &reason),
                Message::Inspect(question) => question(&engine),
                Message::Swap { candidate, done } => done(engine.swap(candidate)),
                Message::Shadow { candidate: Some(candidate), done } => done(engine.start_shadow(candidate)),
                Message::Shadow { candidate: None, done } => done(engine.stop_shadow()),
                Message::Shutdown(reason) => {
                    stop = Some(reason);
                    break;
                }
            }
        }
        if engine.next_wakeup().is_some_and(|at| at <= clock.now()) {
            engine.advance();
        }
        engine.flush();
        answer(&mut engine, &mut waiting, &mut capture);
        if let Some(reason) = stop {
            return shut_down(&mut engine, waiting, &mut capture, &reason);
        }
        if let Some(recorder) = &mut capture {
            recorder.flush();
        }
    }
}

fn answer<C: Clock, X: Executor>(
    engine: &mut Engine<C, X>,
    waiting: &mut HashMap<u64, OnEnd>,
    capture: &mut Option<Recorder>,
) {
    for end in engine.take_ended() {
        if let Some(recorder) = capture {
            recorder.ended(&end);
        }
        if let Some(callback) = waiting.remove(&end.id) {
            callback(end);
        }
    }
}

/// Every request still waiting ends once, as failed with the reason.
fn shut_down<C: Clock, X: Executor>(
    engine: &mut Engine<C, X>,
    mut waiting: HashMap<u64, OnEnd>,
    capture: &mut Option<Recorder>,
    reason: &str,
) {
    answer(engine, &mut waiting, capture);
    let at = clock_now(engine);
    for (id, callback) in waiting {
        let end = Ended { id, outcome: Outcome::Failed { error: reason.to_string() }, at };
        if let Some(recorder) = capture {
            recorder.ended(&end);
        }
        callback(end);
    }
    if let Some(recorder) = capture {
        recorder.flush();
    }
}

fn clock_now<C: Clock, X: Executor>(engine: &Engine<C, X>) -> u64 {
    engine.state().now
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::engine::{BatchJob, EngineOptions, ItemResult, MonotonicClock};
    use crate::policy::contract::EvictMode;
    use crate::policy::{Arm, FailureMode, Limits, Mode, PolicyLoader, Sandbox};

    /// Runs each job on a thread of its own for the profiled time of the batch
    /// (the real worker is ONNX Runtime; this one only sleeps) and reports back.
    struct SleepingExecutor {
        handle: ActorHandle<MonotonicClock, SleepingExecutor>,
        per_item: Duration,
        started: Arc<Mutex<Vec<usize>>>,
    }

    impl Executor for SleepingExecutor {
        fn start(&mut self, job: BatchJob) {
            self.started.lock().unwrap().push(job.items.len());
            let handle = self.handle.clone();
            let duration = self.per_item * job.items.len() as u32;
            std::thread::spawn(move || {
                std::thread::sleep(duration);
                let items = job
                    .items
                    .iter()
                    .map(|i| ItemResult { id: i.id, error: None, tokens: 0, finished: false, fan_out: Vec::new() })
                    .collect();
                let _ = handle.job_finished(JobResult { worker: job.worker, duration: duration.as_nanos() as u64, items });
            });
        }
        fn abort(&mut self, _: u32) {}
        fn provision(&mut self, worker: u32, _: u32, _: u32) {
            let _ = self.handle.worker_ready(worker);
        }
        fn retire(&mut self, _: u32) {}
        fn set_threads(&mut self, _: u32, _: u32) {}
        fn set_variant(&mut self, _: u32, _: u32) {}
        fn evict(&mut self, _: u32, _: u64, _: EvictMode) {}
    }

    fn start(policy: &str, started: Arc<Mutex<Vec<usize>>>) -> Actor<MonotonicClock, SleepingExecutor> {
        let pipeline = crate::sim::presets::pipeline("vision-chain").unwrap();
        let sandbox = Sandbox::new(Mode::Serve, Limits::default()).unwrap();
        let loader = PolicyLoader::new(sandbox.clone(), None);
        let bytes = yardmaster_policy_artifacts::shipped(policy).unwrap().bytes;
        let module = loader.load(policy, bytes).unwrap();
        let clock = MonotonicClock::default();
        let name = policy.to_string();
        Actor::spawn("engine", clock.clone(), move |handle| {
            let executor = SleepingExecutor { handle, per_item: Duration::from_micros(200), started };
            Engine::new(clock, executor, pipeline, EngineOptions::default(), |config, view| {
                Arm::start_wasm(&name, config, &sandbox, module, FailureMode::FailOpen, None, view)
            })
        })
        .unwrap()
    }

    #[test]
    fn every_request_ends_exactly_once_through_real_threads() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let actor = start("edf", started.clone());
        let handle = actor.handle();
        let (done, results) = mpsc::channel();
        let admitted_ids = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..200 {
            let done = done.clone();
            let ids = admitted_ids.clone();
            handle
                .submit(
                    Submission::default(),
                    Box::new(move |id| ids.lock().unwrap().push(id)),
                    Box::new(move |end| done.send(end).unwrap()),
                )
                .unwrap();
        }
        let mut ended: Vec<Ended> = (0..200).map(|_| results.recv_timeout(Duration::from_secs(20)).unwrap()).collect();
        assert!(results.recv_timeout(Duration::from_millis(100)).is_err(), "no request ends twice");
        ended.sort_by_key(|e| e.id);
        ended.dedup_by_key(|e| e.id);
        assert_eq!(ended.len(), 200);
        let mut ids = admitted_ids.lock().unwrap().clone();
        ids.sort();
        assert_eq!(ids, ended.iter().map(|e| e.id).collect::<Vec<_>>(), "each admitted id ended");
        assert!(ended.iter().all(|e| e.outcome == Outcome::Completed), "200 requests fit well within 400 ms");
        let batches = started.lock().unwrap().clone();
        assert!(batches.iter().any(|&n| n > 1), "requests arriving together are batched: {batches:?}");
        let completed = handle.inspect(|engine| engine.accounting().summary(engine.state().now).overall.completed).unwrap();
        assert_eq!(completed, 200);
        actor.shutdown("test over");
    }

    /// A capture sink the test can read afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_capture_records_every_arrival_batch_and_end_and_reads_back_as_a_trace() {
        use crate::sim::trace::{TraceReader, TraceRecord};
        let actor = start("edf", Arc::new(Mutex::new(Vec::new())));
        let handle = actor.handle();
        let sink = Shared::default();
        handle.capture(Some(Recorder::start(Box::new(sink.clone()), "test").unwrap())).unwrap();
        let (done, results) = mpsc::channel();
        for _ in 0..40 {
            let done = done.clone();
            handle.submit(Submission::default(), Box::new(|_| {}), Box::new(move |end| done.send(end).unwrap())).unwrap();
        }
        for _ in 0..40 {
            results.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        handle.capture(None).unwrap();
        actor.shutdown("test over");
        let bytes = sink.0.lock().unwrap().clone();
        let reader = TraceReader::new(std::io::BufReader::new(&bytes[..])).unwrap();
        let records: Vec<TraceRecord> = reader.map(|r| r.unwrap()).collect();
        let count = |f: fn(&TraceRecord) -> bool| records.iter().filter(|r| f(r)).count();
        assert_eq!(count(|r| matches!(r, TraceRecord::Arrival(_))), 40);
        assert_eq!(count(|r| matches!(r, TraceRecord::Completion(_))), 40);
        let batched: usize =
            records.iter().map(|r| if let TraceRecord::Batch(b) = r { b.requests.len() } else { 0 }).sum();
        assert!(batched >= 40, "every request ran in a recorded batch at least once ({batched})");
    }

    #[test]
    fn shutdown_fails_what_is_in_flight_once() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let actor = start("fifo", started);
        let handle = actor.handle();
        let (done, results) = mpsc::channel();
        for _ in 0..50 {
            let done = done.clone();
            handle.submit(Submission::default(), Box::new(|_| {}), Box::new(move |end| done.send(end).unwrap())).unwrap();
        }
        actor.shutdown("maintenance");
        let ended: Vec<Ended> = results.try_iter().collect();
        assert_eq!(ended.len(), 50, "every request got exactly one answer");
        assert!(ended.iter().all(|e| matches!(&e.outcome, Outcome::Completed)
            || matches!(&e.outcome, Outcome::Failed { error } if error == "maintenance")));
        assert!(handle.cancel(1).is_err(), "a stopped actor says so");
    }
}
