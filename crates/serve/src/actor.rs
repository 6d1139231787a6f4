//! The engine as an actor: one owner of all scheduling state at a time, and everything
//! else (ingress handlers, workers, the admin API) talks to it by message. There is no
//! lock around a queue, and the order in which messages arrive is the order the policy
//! sees.
//!
//! A turn takes every message already waiting, so whatever happened up to a decision
//! point reaches the policy in one call, then answers the requests that ended. Turns
//! run on the engine's own thread, woken by a message, and on the serving path's
//! senders ([`ActorHandle::send_here`]): when the engine is free, a client's request is
//! decided on its own task's thread and a finished job is taken in on its worker's
//! thread, so neither waits for another thread to wake up (each hand-over cost a
//! wake-up of tens of microseconds). A sender that finds the engine busy leaves its
//! message to the turn in progress (which looks for waiting messages again after
//! letting go), and one that has run two turns with messages still arriving leaves the
//! backlog to the engine's thread, so no client's task is held by others' requests. A
//! sender holding a lock that a turn may take (an executor reporting from under its own
//! lock) must use [`ActorHandle::send`], which only wakes the engine's thread. The
//! engine's thread also runs the engine's timed wake-ups (tick, timer, deferral,
//! expiry), sleeping in between, and drops the engine when it stops.
//!
//! A client's request is submitted with two callbacks: `admitted` runs in the turn that
//! takes the request in, as soon as it has its id and before any policy decision, so the
//! caller can park the request's tensors where the executor will look for them; `ended`
//! runs exactly once, when the request completes, is dropped or fails.
//!
//! A policy swap ([`Message::Swap`]) is handled in turn with the other messages: what
//! arrived before it is delivered to the old policy, what arrives after it to the new
//! one, and the retired instance travels back with the answer to be dropped on the
//! caller's thread.
//!
//! The actor owns the server's [`Arms`]: one engine, or two while an A/B run splits
//! the traffic ([`Message::Ab`]); messages about a worker or a request go to the engine
//! that owns it.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use super::ab::{AbStatus, ArmEngine, Arms, Split};
use super::capture::Recorder;
use yardmaster_engine::metrics::Outcome;
use yardmaster_engine::{Clock, Ended, Executor, JobResult, Submission, SwapOutcome};
use yardmaster_policy::{Candidate, ShadowReport};

/// Called in the engine's turn with the new request's id, before any decision.
pub type Admitted = Box<dyn FnOnce(u64) + Send>;
/// Called exactly once with how the request ended.
pub type OnEnd = Box<dyn FnOnce(Ended) + Send>;
/// A question about the (control arm's) engine, answered in the engine's turn.
pub type Inspect<C, X> = Box<dyn FnOnce(&ArmEngine<C, X>) + Send>;
/// A question about every arm, answered in the engine's turn.
pub type InspectArms<C, X> = Box<dyn FnOnce(&Arms<C, X>) + Send>;
/// A change to the arms, made in the engine's turn between two event batches.
pub type UpdateArms<C, X> = Box<dyn FnOnce(&mut Arms<C, X>) + Send>;
/// Called in the engine's turn with what a swap did, or why there was none.
pub type OnSwap = Box<dyn FnOnce(Result<SwapOutcome, String>) + Send>;
/// Called in the engine's turn with where an A/B run stands, or why a command was refused.
pub type OnAb = Box<dyn FnOnce(Result<AbStatus, String>) + Send>;

/// What to do with A/B runs.
pub enum AbCommand {
    /// Start a run with this candidate policy as the arm `label`.
    Start {
        /// The candidate, already instantiated (boxed: it is large beside `End`).
        candidate: Box<Candidate>,
        /// The candidate arm's name.
        label: String,
        /// How requests and workers are divided.
        split: Split,
        /// Whether the split waits for the candidate's workers to be ready (else it
        /// routes to the candidate at once).
        warm: bool,
    },
    /// End the run with the arm of this label as the whole (promote or roll back).
    End(String),
}
/// Called in the engine's turn with the report of the shadow a command replaced or stopped.
pub type OnShadow = Box<dyn FnOnce(Option<ShadowReport>) + Send>;

/// What the actor handles.
pub enum Message<C: Clock, X: Executor> {
    /// A client request.
    Submit {
        /// The request.
        submission: Submission,
        /// The hash of the client's A/B split key, if it sent one.
        key: Option<u64>,
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
    /// Read the control arm's engine (metrics, state) in the engine's turn.
    Inspect(Inspect<C, X>),
    /// Read every arm in the engine's turn.
    InspectArms(InspectArms<C, X>),
    /// Change the arms in the engine's turn (models loaded or unloaded while serving).
    Update(UpdateArms<C, X>),
    /// Start or end an A/B run.
    Ab {
        /// What to do.
        command: AbCommand,
        /// Runs with the outcome.
        done: OnAb,
    },
    /// Start capturing a trace (replacing any capture running), or stop with `None`.
    Capture(Option<Recorder>),
    /// Hand a policy arm over to a new instance (see [`yardmaster_engine::Engine::swap`]).
    Swap {
        /// The arm (by label; `None`: the control arm).
        arm: Option<String>,
        /// The new policy, already instantiated.
        candidate: Candidate,
        /// Runs with the outcome.
        done: OnSwap,
    },
    /// Start a shadow policy (`Some`, replacing one running) or stop it (`None`); see
    /// [`yardmaster_engine::Engine::start_shadow`]; shadows run beside the control arm.
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
    inner: Arc<dyn Turns>,
}

impl<C: Clock, X: Executor> Clone for ActorHandle<C, X> {
    fn clone(&self) -> Self {
        Self { sender: self.sender.clone(), inner: Arc::clone(&self.inner) }
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
    /// Send any message; the engine's thread takes it in (woken for it).
    pub fn send(&self, message: Message<C, X>) -> Result<(), ActorStopped> {
        self.post(message)?;
        self.inner.wake_engine_thread();
        Ok(())
    }

    /// Send a message and, when the engine is free, run its turn at once on this thread
    /// (see the module docs); otherwise whoever holds the engine takes the message in.
    /// Only for a caller that holds no lock a turn might take (the executor's, a
    /// worker's, the payload store's): the turn would wait for it forever.
    pub fn send_here(&self, message: Message<C, X>) -> Result<(), ActorStopped> {
        self.post(message)?;
        self.inner.run_turns(TURNS_ON_A_SENDER);
        Ok(())
    }

    fn post(&self, message: Message<C, X>) -> Result<(), ActorStopped> {
        if self.inner.stopped() {
            return Err(ActorStopped);
        }
        self.sender.send(message).map_err(|_| ActorStopped)?;
        // Counted after the send: a turn may take the message in first, so the count
        // dips below zero for a moment, but it is above zero whenever a message waits
        // that no turn has started to drain.
        self.inner.pending().fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Submit a request (see the module docs for the callbacks), running the engine's
    /// turn on this thread when it is free (see [`ActorHandle::send_here`]: hold no
    /// lock). When the actor has stopped, `ended` is not called and the error says so.
    pub fn submit(&self, submission: Submission, admitted: Admitted, ended: OnEnd) -> Result<(), ActorStopped> {
        self.send_here(Message::Submit { submission, key: None, admitted, ended })
    }

    /// Submit a request with the hash of its A/B split key ([`super::ab::key_hash`]), as
    /// [`ActorHandle::submit`] does.
    pub fn submit_keyed(&self, submission: Submission, key: Option<u64>, admitted: Admitted, ended: OnEnd) -> Result<(), ActorStopped> {
        self.send_here(Message::Submit { submission, key, admitted, ended })
    }

    /// Report a finished job.
    pub fn job_finished(&self, result: JobResult) -> Result<(), ActorStopped> {
        self.send(Message::JobFinished(result))
    }

    /// Report a finished job and take it in on this thread when the engine is free (see
    /// [`ActorHandle::send_here`]: hold no lock).
    pub fn job_finished_here(&self, result: JobResult) -> Result<(), ActorStopped> {
        self.send_here(Message::JobFinished(result))
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

    /// Swap the control arm's policy (see [`yardmaster_engine::Engine::swap`]) and wait
    /// for the outcome; the retired instance comes back in it, to be dropped on this
    /// thread.
    pub fn swap(&self, candidate: Candidate) -> Result<SwapOutcome, ActorStopped> {
        match self.swap_arm(None, candidate)? {
            Ok(outcome) => Ok(outcome),
            Err(_) => unreachable!("the control arm always exists"),
        }
    }

    /// Swap the policy of the arm labelled `arm` (`None`: the control arm); the
    /// inner error says no such arm runs.
    pub fn swap_arm(&self, arm: Option<String>, candidate: Candidate) -> Result<Result<SwapOutcome, String>, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Swap {
            arm,
            candidate,
            done: Box::new(move |outcome| {
                let _ = reply.send(outcome);
            }),
        })?;
        answer.recv().map_err(|_| ActorStopped)
    }

    /// Start or end an A/B run and wait for the outcome.
    pub fn ab(&self, command: AbCommand) -> Result<Result<AbStatus, String>, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Ab {
            command,
            done: Box::new(move |outcome| {
                let _ = reply.send(outcome);
            }),
        })?;
        answer.recv().map_err(|_| ActorStopped)
    }

    /// Run `question` on every arm, in the engine's turn, and return its answer.
    pub fn inspect_arms<T: Send + 'static>(&self, question: impl FnOnce(&Arms<C, X>) -> T + Send + 'static) -> Result<T, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::InspectArms(Box::new(move |arms| {
            let _ = reply.send(question(arms));
        })))?;
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

    /// Run `change` on every arm, in the engine's turn between two event batches, and
    /// return its answer; what it ends goes out with the batch's other ends.
    pub fn update<T: Send + 'static>(&self, change: impl FnOnce(&mut Arms<C, X>) -> T + Send + 'static) -> Result<T, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Update(Box::new(move |arms| {
            let _ = reply.send(change(arms));
        })))?;
        answer.recv().map_err(|_| ActorStopped)
    }

    /// Run `question` on the control arm's engine, in the engine's turn, and return
    /// its answer.
    pub fn inspect<T: Send + 'static>(&self, question: impl FnOnce(&ArmEngine<C, X>) -> T + Send + 'static) -> Result<T, ActorStopped> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(Message::Inspect(Box::new(move |engine| {
            let _ = reply.send(question(engine));
        })))?;
        answer.recv().map_err(|_| ActorStopped)
    }
}

/// How many turns a thread that sends a message runs before it leaves a backlog to the
/// engine's own thread: a client's task must not be kept from its connection by a
/// steady stream of other clients' requests.
const TURNS_ON_A_SENDER: usize = 2;

/// What the handles and the engine's thread share.
struct Inner<C: Clock, X: Executor> {
    /// The engine, taken by whichever thread runs a turn (`None` until the engine's
    /// thread has built it, and again once it has stopped).
    core: Mutex<Option<Core<C, X>>>,
    /// Messages sent that no turn has taken in yet (briefly below zero, see `send`).
    pending: AtomicIsize,
    /// The engine's next wake-up, in its clock's nanoseconds (`u64::MAX`: none).
    next_wakeup: AtomicU64,
    /// Set once the engine has stopped: messages are refused.
    stopped: AtomicBool,
    /// The engine's own thread, woken for a wake-up earlier than it sleeps for, a
    /// backlog, or the stop.
    thread: OnceLock<Thread>,
}

/// The state a turn works on.
struct Core<C: Clock, X: Executor> {
    arms: Arms<C, X>,
    clock: C,
    receiver: Receiver<Message<C, X>>,
    /// Requests taken in, by id, with how to tell their end.
    waiting: HashMap<u64, OnEnd>,
    capture: Option<Recorder>,
}

/// How a turn left the engine.
#[derive(Debug, PartialEq, Eq)]
enum TurnEnd {
    /// Serving on.
    Running,
    /// Stopped: every request has ended.
    Stopped,
}

/// What a handle asks of the engine it reaches, whatever its clock and executor.
trait Turns: Send + Sync {
    /// Messages sent that no turn has taken in yet.
    fn pending(&self) -> &AtomicIsize;
    /// Whether the engine has stopped.
    fn stopped(&self) -> bool;
    /// Run up to `turns` turns on this thread while messages wait and the engine is free.
    fn run_turns(&self, turns: usize);
    /// Wake the engine's own thread.
    fn wake_engine_thread(&self);
}

impl<C: Clock + Send, X: Executor + Send> Turns for Inner<C, X> {
    fn pending(&self) -> &AtomicIsize {
        &self.pending
    }
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
    /// A backlog left after `turns` turns is the engine thread's to take.
    fn run_turns(&self, turns: usize) {
        for _ in 0..turns {
            if self.pending.load(Ordering::SeqCst) <= 0 {
                return;
            }
            let Ok(mut core) = self.core.try_lock() else {
                // Whoever holds it looks at `pending` again after letting go.
                return;
            };
            let Some(state) = core.as_mut() else { return };
            let end = self.turn(state);
            drop(core);
            if end == TurnEnd::Stopped {
                return;
            }
        }
        if self.pending.load(Ordering::SeqCst) > 0 {
            self.wake_engine_thread();
        }
    }
    fn wake_engine_thread(&self) {
        Inner::wake_engine_thread(self)
    }
}

impl<C: Clock, X: Executor> Inner<C, X> {
    /// One turn: take in every message waiting, let the engine handle what is due,
    /// deliver the events to the policy, answer the requests that ended. A panic in
    /// the turn stops the engine (as it stopped the actor's thread before).
    fn turn(&self, core: &mut Core<C, X>) -> TurnEnd {
        let outcome = catch_unwind(AssertUnwindSafe(|| core.turn(&self.pending)));
        let end = match outcome {
            Ok(end) => end,
            Err(panic) => {
                let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                tracing::error!("the scheduling engine panicked: {}; it stops", message.unwrap_or_else(|| "no message".into()));
                TurnEnd::Stopped
            }
        };
        if end == TurnEnd::Stopped {
            self.stopped.store(true, Ordering::SeqCst);
            self.wake_engine_thread();
            return end;
        }
        let at = core.arms.next_wakeup().unwrap_or(u64::MAX);
        if at < self.next_wakeup.swap(at, Ordering::SeqCst) {
            self.wake_engine_thread();
        }
        end
    }

    fn wake_engine_thread(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

impl<C: Clock, X: Executor> Core<C, X> {
    fn turn(&mut self, pending: &AtomicIsize) -> TurnEnd {
        let mut stop = None;
        loop {
            let message = match self.receiver.try_recv() {
                Ok(message) => message,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    stop = Some("every handle was dropped".to_string());
                    break;
                }
            };
            pending.fetch_sub(1, Ordering::SeqCst);
            if let Message::Shutdown(reason) = message {
                stop = Some(reason);
                break;
            }
            self.handle(message);
        }
        self.arms.advance_and_flush(self.clock.now());
        answer(&mut self.arms, &mut self.waiting, &mut self.capture);
        if let Some(reason) = stop {
            shut_down(&mut self.arms, std::mem::take(&mut self.waiting), &mut self.capture, &reason);
            return TurnEnd::Stopped;
        }
        if let Some(recorder) = &mut self.capture {
            recorder.flush();
        }
        TurnEnd::Running
    }

    fn handle(&mut self, message: Message<C, X>) {
        let arms = &mut self.arms;
        match message {
            Message::Submit { submission, key, admitted, ended } => {
                let (input_size, expected_tokens) = (submission.input_size, submission.expected_tokens);
                let (slot, id) = arms.submit(submission, key);
                if let Some(recorder) = &mut self.capture {
                    recorder.arrival(arms.engine(slot), id, input_size, expected_tokens);
                }
                admitted(id);
                self.waiting.insert(id, ended);
            }
            Message::Cancel(id) => arms.cancel(id),
            Message::JobFinished(result) => {
                if let Some(recorder) = &mut self.capture {
                    recorder.batch(arms.engine_of_worker(result.worker), &result);
                }
                arms.job_finished(result)
            }
            Message::Capture(recorder) => {
                if let Some(mut old) = std::mem::replace(&mut self.capture, recorder) {
                    old.flush();
                }
            }
            Message::WorkerReady(worker) => arms.worker_ready(worker),
            Message::WorkerLost(worker, reason) => arms.worker_lost(worker, &reason),
            Message::Inspect(question) => question(arms.main()),
            Message::InspectArms(question) => question(arms),
            Message::Update(change) => change(arms),
            Message::Swap { arm: None, candidate, done } => done(Ok(arms.main_mut().swap(candidate))),
            Message::Swap { arm: Some(label), candidate, done } => match arms.engine_mut(&label) {
                Some(engine) => done(Ok(engine.swap(candidate))),
                None => done(Err(format!("no arm named {label:?} (arms: {})", arms.labels().join(", ")))),
            },
            Message::Shadow { candidate: Some(candidate), done } => done(arms.main_mut().start_shadow(candidate)),
            Message::Shadow { candidate: None, done } => done(arms.main_mut().stop_shadow()),
            Message::Ab { command: AbCommand::Start { candidate, label, split, warm }, done } => {
                done(arms.start_with(*candidate, &label, split, warm))
            }
            Message::Ab { command: AbCommand::End(winner), done } => done(arms.end(&winner)),
            Message::Shutdown(_) => unreachable!("a turn stops at Shutdown before handling it"),
        }
    }
}

/// The running actor.
pub struct Actor<C: Clock, X: Executor> {
    handle: ActorHandle<C, X>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Clock + Send + 'static, X: Executor + Send + 'static> Actor<C, X> {
    /// Start the engine's thread; `build` makes the engine on that thread and gets a
    /// handle for the executor to report back with. `label` names the engine's arm in
    /// metrics. Messages sent before the engine is built wait for it.
    pub fn spawn(
        name: &str,
        clock: C,
        label: &str,
        build: impl FnOnce(ActorHandle<C, X>) -> ArmEngine<C, X> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel();
        let inner = Arc::new(Inner {
            core: Mutex::new(None),
            pending: AtomicIsize::new(0),
            next_wakeup: AtomicU64::new(u64::MAX),
            stopped: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let handle = ActorHandle { sender, inner: Arc::clone(&inner) as Arc<dyn Turns> };
        let for_engine = handle.clone();
        let label = label.to_string();
        let engine_side = Arc::clone(&inner);
        let thread = std::thread::Builder::new().name(name.to_string()).spawn(move || {
            let inner = engine_side;
            let engine = match catch_unwind(AssertUnwindSafe(|| build(for_engine))) {
                Ok(engine) => engine,
                Err(_) => {
                    // No engine: refuse messages (the receiver goes with this thread).
                    inner.stopped.store(true, Ordering::SeqCst);
                    tracing::error!("building the scheduling engine panicked; it does not run");
                    return;
                }
            };
            let arms = Arms::new(clock.clone(), &label, engine);
            *lock(&inner.core) = Some(Core { arms, clock: clock.clone(), receiver, waiting: HashMap::new(), capture: None });
            engine_thread(&inner, &clock);
        })?;
        let _ = inner.thread.set(thread.thread().clone());
        // Messages sent before the thread was known: wake it for them.
        thread.thread().unpark();
        Ok(Self { handle, thread: Some(thread) })
    }

    /// A handle to send messages with.
    pub fn handle(&self) -> ActorHandle<C, X> {
        self.handle.clone()
    }

    /// Stop the actor (requests in flight fail with `reason`) and wait for it.
    pub fn shutdown(mut self, reason: &str) {
        self.stop(reason);
    }
}

impl<C: Clock, X: Executor> Actor<C, X> {
    fn stop(&mut self, reason: &str) {
        if let Some(thread) = self.thread.take() {
            let _ = self.handle.send(Message::Shutdown(reason.to_string()));
            self.handle.inner.wake_engine_thread();
            let _ = thread.join();
        }
    }
}

/// The engine's own thread: it runs the turns no sender ran (a backlog, a message sent
/// while another thread held the engine and was letting go) and the engine's timed
/// wake-ups (ticks, timers, deferrals, expiries), and drops the engine once it stops.
fn engine_thread<C: Clock, X: Executor>(inner: &Inner<C, X>, clock: &C) {
    loop {
        if inner.stopped.load(Ordering::SeqCst) {
            break;
        }
        let at = inner.next_wakeup.load(Ordering::SeqCst);
        let now = clock.now();
        let due = at <= now;
        if inner.pending.load(Ordering::SeqCst) <= 0 && !due {
            match at {
                u64::MAX => std::thread::park(),
                at => std::thread::park_timeout(Duration::from_nanos(at - now)),
            }
            continue;
        }
        let mut core = lock(&inner.core);
        let Some(state) = core.as_mut() else { break };
        if inner.turn(state) == TurnEnd::Stopped {
            break;
        }
    }
    // Dropped here, not on a client's thread: the executor waits for its workers.
    let core = lock(&inner.core).take();
    drop(core);
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock, X: Executor> Drop for Actor<C, X> {
    fn drop(&mut self) {
        self.stop("the server is shutting down");
    }
}

fn answer<C: Clock, X: Executor>(arms: &mut Arms<C, X>, waiting: &mut HashMap<u64, OnEnd>, capture: &mut Option<Recorder>) {
    for end in arms.take_ended() {
        if let Some(recorder) = capture {
            recorder.ended(&end);
        }
        if let Some(callback) = waiting.remove(&end.id) {
            callback(end);
        }
    }
}

/// Every request still waiting ends once, as failed with the reason.
fn shut_down<C: Clock, X: Executor>(arms: &mut Arms<C, X>, mut waiting: HashMap<u64, OnEnd>, capture: &mut Option<Recorder>, reason: &str) {
    answer(arms, &mut waiting, capture);
    let at = arms.main().state().now();
    for (id, callback) in waiting {
        let end = Ended {
            id,
            outcome: Outcome::Failed { error: reason.to_string() },
            at,
            sent_at: at,
            deadline: at,
            arrived_at: at,
            first_job_at: None,
        };
        if let Some(recorder) = capture {
            recorder.ended(&end);
        }
        callback(end);
    }
    if let Some(recorder) = capture {
        recorder.flush();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::super::ab::Split;
    use super::*;
    use yardmaster_engine::{BatchJob, Engine, EngineOptions, ItemResult, MonotonicClock, SharedExecutor};
    use yardmaster_policy::contract::EvictMode;
    use yardmaster_policy::{Arm, FailureMode, Limits, Mode, PolicyLoader, Sandbox};

    /// Runs each job on a thread of its own for the profiled time of the batch
    /// (the real worker is ONNX Runtime; this one only sleeps) and reports back.
    struct SleepingExecutor {
        handle: ActorHandle<MonotonicClock, SleepingExecutor>,
        per_item: Duration,
        started: Arc<Mutex<Vec<usize>>>,
    }

    thread_local! {
        /// Jobs started by a turn on this thread.
        static STARTED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    impl Executor for SleepingExecutor {
        fn start(&mut self, job: BatchJob) {
            STARTED_HERE.with(|count| count.set(count.get() + 1));
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
        fn provision(&mut self, worker: u32, _: u32, _: u32, _: yardmaster_engine::WorkerStart) {
            let _ = self.handle.worker_ready(worker);
        }
        fn retire(&mut self, _: u32) {}
        fn set_threads(&mut self, _: u32, _: u32) {}
        fn set_variant(&mut self, _: u32, _: u32) {}
        fn evict(&mut self, _: u32, _: u64, _: EvictMode) {}
    }

    fn start(policy: &str, started: Arc<Mutex<Vec<usize>>>) -> Actor<MonotonicClock, SleepingExecutor> {
        start_with(policy, started, Duration::from_micros(200))
    }

    /// An actor on `vision-chain` whose jobs take `per_item` per request.
    fn start_with(policy: &str, started: Arc<Mutex<Vec<usize>>>, per_item: Duration) -> Actor<MonotonicClock, SleepingExecutor> {
        let pipeline = yardmaster_formats::presets::pipeline("vision-chain").unwrap();
        let sandbox = Sandbox::new(Mode::Serve, Limits::default()).unwrap();
        let loader = PolicyLoader::new(sandbox.clone(), None);
        let bytes = yardmaster_policy_artifacts::shipped(policy).unwrap().bytes;
        let module = loader.load(policy, bytes).unwrap();
        let clock = MonotonicClock::default();
        let name = policy.to_string();
        Actor::spawn("engine", clock.clone(), policy, move |handle| {
            let executor = SleepingExecutor { handle, per_item, started };
            Engine::new(clock, SharedExecutor::new(executor), pipeline, EngineOptions::default(), |config, view| {
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
        let completed = handle.inspect(|engine| engine.accounting().summary(engine.state().now()).overall.completed).unwrap();
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
        use yardmaster_formats::trace::{TraceReader, TraceRecord};
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
        let batched: usize = records.iter().map(|r| if let TraceRecord::Batch(b) = r { b.requests.len() } else { 0 }).sum();
        assert!(batched >= 40, "every request ran in a recorded batch at least once ({batched})");
    }

    #[test]
    fn a_request_sent_while_the_engine_is_free_is_decided_on_the_senders_thread() {
        let actor = start("edf", Arc::new(Mutex::new(Vec::new())));
        let handle = actor.handle();
        let (done, results) = mpsc::channel();
        for _ in 0..20 {
            let done = done.clone();
            handle.submit(Submission::default(), Box::new(|_| {}), Box::new(move |end| done.send(end).unwrap())).unwrap();
            let end = results.recv_timeout(Duration::from_secs(20)).unwrap();
            assert!(matches!(end.outcome, Outcome::Completed), "{end:?}");
        }
        // Sent one at a time to an idle engine, most are dispatched in the turn the
        // submit ran here; some may not be, when the engine's thread still holds the
        // engine (finishing the turn that answered the previous request, or a timer)
        // — more often on a loaded machine. Before, every turn ran on the engine's
        // thread: none started here.
        let here = STARTED_HERE.with(|count| count.get());
        assert!(here >= 3, "{here} of 20 jobs started on the submitting thread");
        actor.shutdown("test over");
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
        assert!(
            ended
                .iter()
                .all(|e| matches!(&e.outcome, Outcome::Completed)
                    || matches!(&e.outcome, Outcome::Failed { error } if error == "maintenance"))
        );
        assert!(handle.cancel(1).is_err(), "a stopped actor says so");
    }

    /// A shipped policy, instantiated as a swap or an A/B run would.
    fn candidate(policy: &str) -> Candidate {
        let sandbox = Sandbox::new(Mode::Serve, Limits::default()).unwrap();
        let bytes = yardmaster_policy_artifacts::shipped(policy).unwrap().bytes;
        let module = PolicyLoader::new(sandbox.clone(), None).load(policy, bytes).unwrap();
        Candidate::wasm(&sandbox, module, 1, None).unwrap()
    }

    /// Offer `n` requests at `rate` per second; returns the receiver of their ends.
    fn offer(handle: &ActorHandle<MonotonicClock, SleepingExecutor>, n: usize, rate: f64) -> mpsc::Receiver<Ended> {
        let (done, results) = mpsc::channel();
        let start = std::time::Instant::now();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                std::thread::sleep(wait);
            }
            let done = done.clone();
            handle.submit(Submission::default(), Box::new(|_| {}), Box::new(move |end| done.send(end).unwrap())).unwrap();
        }
        results
    }

    fn collect(results: &mpsc::Receiver<Ended>, n: usize) -> Vec<Ended> {
        let ended: Vec<Ended> = (0..n).map(|_| results.recv_timeout(Duration::from_secs(30)).expect("every request ends")).collect();
        assert!(results.recv_timeout(Duration::from_millis(50)).is_err(), "no request ends twice");
        let mut ids: Vec<u64> = ended.iter().map(|e| e.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "ids are unique across the arms");
        ended
    }

    /// Wait until the run's candidate is warm; its status.
    fn warm(handle: &ActorHandle<MonotonicClock, SleepingExecutor>) -> AbStatus {
        for _ in 0..500 {
            let status = handle.inspect_arms(|arms| arms.status()).unwrap();
            if status.state != "warming" {
                return status;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the candidate never warmed up");
    }

    fn split(share: f64) -> Split {
        Split::new(share, super::super::ab::SplitBy::Request).unwrap()
    }

    #[test]
    fn an_ab_run_splits_requests_and_workers_and_a_promotion_loses_nothing() {
        let actor = start("edf", Arc::new(Mutex::new(Vec::new())));
        let handle = actor.handle();
        let status = handle
            .ab(AbCommand::Start { candidate: Box::new(candidate("fifo")), label: "fifo".into(), split: split(0.3), warm: true })
            .unwrap()
            .unwrap();
        assert_eq!(status.state, "warming", "the candidate's workers start before any request goes to it");
        let status = warm(&handle);
        assert_eq!(status.state, "running");
        assert_eq!(status.starting_at_first_request, None);
        // vision-chain has 4, 2 and 3 workers: 30 % is 1, 1 and 1 of them.
        assert_eq!(status.arms.iter().map(|a| a.workers.clone()).collect::<Vec<_>>(), [vec![3, 1, 2], vec![1, 1, 1]]);
        let refused = handle
            .ab(AbCommand::Start { candidate: Box::new(candidate("fifo")), label: "x".into(), split: split(0.5), warm: true })
            .unwrap();
        assert!(refused.unwrap_err().contains("already in progress"));

        let results = offer(&handle, 2000, 2000.0);
        collect(&results, 2000);
        let report = handle.inspect_arms(|arms| arms.report()).unwrap().unwrap();
        let share = report.candidate.requests as f64 / 2000.0;
        assert!((share - 0.3).abs() < 0.04, "the candidate got {share} of the requests");
        assert_eq!(report.control.requests + report.candidate.requests, 2000);
        let metrics = handle.inspect_arms(crate::prometheus::render_arms).unwrap();
        assert!(metrics.contains("arm=\"primary\"") && metrics.contains("arm=\"candidate\""), "every metric is labelled by arm");
        assert!(metrics.contains("name=\"fifo\"") && metrics.contains("name=\"edf\""), "the info series names the arms");

        // Promote while requests are in flight: every one still ends exactly once.
        let results = offer(&handle, 500, 4000.0);
        let status = handle.ab(AbCommand::End("fifo".into())).unwrap().unwrap();
        assert!(matches!(status.state, "ending" | "none"), "{status:?}");
        let more = offer(&handle, 200, 4000.0);
        collect(&results, 500);
        let after = collect(&more, 200);
        assert!(after.iter().all(|e| e.outcome == Outcome::Completed), "the winner serves what arrives after the promotion");
        let mut status = handle.inspect_arms(|arms| arms.status()).unwrap();
        for _ in 0..100 {
            if status.state == "none" {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            status = handle.inspect_arms(|arms| arms.status()).unwrap();
        }
        assert_eq!(status.state, "none", "the run ends once the loser drained: {status:?}");
        assert_eq!(status.arms.len(), 1);
        assert_eq!(status.arms[0].arm, "fifo");
        assert_eq!(status.arms[0].workers, vec![4, 2, 3], "the winner has every worker back");
        let last = handle.inspect_arms(|arms| arms.report()).unwrap().expect("the last run's report stays");
        assert!(last.candidate.requests > 600);
        assert!(handle.ab(AbCommand::End("edf".into())).unwrap().unwrap_err().contains("no A/B run"));
        actor.shutdown("test over");
    }

    #[test]
    fn the_report_finds_a_planted_difference_and_none_between_identical_arms() {
        // Overloaded (2,000 requests/s per arm against 1,000/s at its one classify
        // worker, for 2 s): fifo serves late what PARD drops early.
        let actor = start_with("fifo", Arc::new(Mutex::new(Vec::new())), Duration::from_millis(1));
        let handle = actor.handle();
        handle
            .ab(AbCommand::Start { candidate: Box::new(candidate("pard")), label: "pard".into(), split: split(0.5), warm: true })
            .unwrap()
            .unwrap();
        warm(&handle);
        let results = offer(&handle, 8000, 4000.0);
        collect(&results, 8000);
        let report = handle.inspect_arms(|arms| arms.report()).unwrap().unwrap();
        let text = super::super::ab::stats::render(&report);
        eprintln!("{text}");
        let goodput = &report.differences[0];
        assert!(goodput.significant && goodput.difference > 0.0, "pard's goodput is higher:\n{text}");
        assert!(report.verdict.contains("goodput share is higher on pard"), "{text}");
        actor.shutdown("test over");

        // Identical arms, under capacity: every request on time in both.
        let actor = start("edf", Arc::new(Mutex::new(Vec::new())));
        let handle = actor.handle();
        handle
            .ab(AbCommand::Start { candidate: Box::new(candidate("edf")), label: "edf-b".into(), split: split(0.5), warm: true })
            .unwrap()
            .unwrap();
        warm(&handle);
        let results = offer(&handle, 600, 600.0);
        collect(&results, 600);
        let report = handle.inspect_arms(|arms| arms.report()).unwrap().unwrap();
        let text = super::super::ab::stats::render(&report);
        assert!(report.differences[..2].iter().all(|d| !d.significant), "{text}");
        assert!(report.control.requests >= 30 && report.candidate.requests >= 30, "{text}");
        // Rolling back leaves the control arm whole.
        handle.ab(AbCommand::End("edf".into())).unwrap().unwrap();
        actor.shutdown("test over");
    }
}
