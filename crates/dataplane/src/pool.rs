//! A pool of workers addressed the way the engine addresses them: worker ids, and models
//! by (stage, variant) through a catalogue. Each method matches one operation of the
//! engine's executor (start, abort, provision, retire, set threads, set variant), so
//! the server's executor is a thin adapter over this pool and its event channel.

use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{DataplaneError, Result};
use crate::events::EventSink;
use crate::session::ModelSpec;
use crate::worker::{Job, Worker, WorkerContext, WorkerEvent};

/// The models of a pipeline: `stages[stage][variant]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelCatalog {
    /// Per stage, its variants' models.
    pub stages: Vec<Vec<ModelSpec>>,
}

impl ModelCatalog {
    /// The model of (stage, variant).
    pub fn get(&self, stage: u32, variant: u32) -> Result<&ModelSpec> {
        self.stages
            .get(stage as usize)
            .and_then(|variants| variants.get(variant as usize))
            .ok_or_else(|| DataplaneError::Invalid(format!("no model for stage {stage}, variant {variant}")))
    }
}

struct PoolWorker {
    worker: Worker,
    stage: u32,
}

/// How long dropping a pool waits for its workers' threads to end (a model load in
/// progress cannot be interrupted; a running job is aborted).
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Workers by id, with one event channel for all of them.
///
/// Dropping the pool retires every worker and waits (up to [`SHUTDOWN_WAIT`]) until
/// each worker thread, retired earlier ones included, has released its model: ONNX
/// Runtime must not be torn down at process exit under a session still being
/// destroyed.
pub struct WorkerPool {
    context: WorkerContext,
    catalog: ModelCatalog,
    threads: usize,
    workers: HashMap<u32, PoolWorker>,
    /// Threads of retired workers that may still be running.
    retiring: Vec<JoinHandle<()>>,
    events: EventSink,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool").field("workers", &self.workers.len()).field("threads", &self.threads).finish()
    }
}

impl WorkerPool {
    /// An empty pool whose workers start with `threads` intra-op threads; events of
    /// every worker arrive on the returned receiver.
    pub fn new(context: WorkerContext, catalog: ModelCatalog, threads: usize) -> (Self, Receiver<WorkerEvent>) {
        let (events, receiver) = EventSink::channel();
        (Self::with_events(context, catalog, threads, events), receiver)
    }

    /// An empty pool whose workers send their events to `events` (a handler there runs
    /// on each worker's thread).
    pub fn with_events(context: WorkerContext, catalog: ModelCatalog, threads: usize, events: EventSink) -> Self {
        WorkerPool { context, catalog, threads, workers: HashMap::new(), retiring: Vec::new(), events }
    }

    /// Start worker `worker` with the model of (stage, variant): warm when the cache
    /// holds it, cold otherwise. `Ready` (or `StartFailed`) follows.
    pub fn provision(&mut self, worker: u32, stage: u32, variant: u32) -> Result<()> {
        let spec = self.catalog.get(stage, variant)?.clone();
        self.retire(worker);
        let handle = Worker::provision(worker, spec, self.threads, self.context.clone(), self.events.clone());
        self.workers.insert(worker, PoolWorker { worker: handle, stage });
        Ok(())
    }

    /// Hand a job to a worker.
    pub fn start(&self, worker: u32, job: Job) -> Result<()> {
        self.get(worker)?.worker.start(job)
    }

    /// Abort the job running on a worker; its id, if there was one.
    pub fn abort(&self, worker: u32) -> Option<u64> {
        self.workers.get(&worker).and_then(|w| w.worker.abort())
    }

    /// Cancel a starting worker or remove an idle one; `Retired` follows.
    pub fn retire(&mut self, worker: u32) {
        if let Some(w) = self.workers.remove(&worker) {
            self.retiring.retain(|thread| !thread.is_finished());
            self.retiring.extend(w.worker.retire());
        }
    }

    /// Retire every worker (aborting the jobs they run) and wait up to `within` for
    /// every worker thread to end, those retired earlier included. Returns how many
    /// were still running when the time was up (0: all have released their models).
    pub fn shutdown(&mut self, within: Duration) -> usize {
        let ids: Vec<u32> = self.workers.keys().copied().collect();
        for id in ids {
            self.abort(id);
            self.retire(id);
        }
        let deadline = Instant::now() + within;
        loop {
            self.retiring.retain(|thread| !thread.is_finished());
            if self.retiring.is_empty() || Instant::now() >= deadline {
                return self.retiring.len();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Drop the state a worker holds for stateful sequence `sequence`.
    pub fn release_sequence(&self, worker: u32, sequence: u64) -> Result<()> {
        self.get(worker)?.worker.release_sequence(sequence)
    }

    /// Change a worker's intra-op threads; `Reconfigured` follows.
    pub fn set_threads(&self, worker: u32, threads: u32) -> Result<()> {
        self.get(worker)?.worker.set_threads(threads as usize)
    }

    /// Change a worker's variant (same stage); `Reconfigured` follows.
    pub fn set_variant(&self, worker: u32, variant: u32) -> Result<()> {
        let w = self.get(worker)?;
        w.worker.set_model(self.catalog.get(w.stage, variant)?.clone())
    }

    /// Give `stage` the models of `variants` (a model loaded again while serving, from
    /// a new file): workers provisioned from now on load them; running ones keep the
    /// session they have until they retire.
    pub fn set_models(&mut self, stage: u32, variants: Vec<ModelSpec>) {
        let index = stage as usize;
        if self.catalog.stages.len() <= index {
            self.catalog.stages.resize(index + 1, Vec::new());
        }
        self.catalog.stages[index] = variants;
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether the pool has no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    fn get(&self, worker: u32) -> Result<&PoolWorker> {
        self.workers.get(&worker).ok_or(DataplaneError::WorkerGone(worker))
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        let still_running = self.shutdown(SHUTDOWN_WAIT);
        if still_running > 0 {
            tracing::warn!(still_running, "worker threads still busy {SHUTDOWN_WAIT:?} after their pool was dropped");
        }
    }
}
