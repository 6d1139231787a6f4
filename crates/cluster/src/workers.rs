//! Where the server's workers live. [`Workers`] is the set of operations the engine's
//! executor needs from a group of workers — the same whether they run in this process
//! ([`WorkerPool`]) or on another host reached over QUIC ([`crate::pool::RemotePool`]) — so a stage placed
//! on a remote host looks to the engine exactly like a local one. Events of every
//! worker, local or remote, arrive as [`yardmaster_dataplane::WorkerEvent`]s.

use yardmaster_dataplane::{DataplaneError, Job, ModelSpec, Result, WorkerPool};

/// A group of workers addressed by engine worker id.
pub trait Workers: Send {
    /// Start worker `worker` with the model of (stage, variant); `Ready` or
    /// `StartFailed` follows on the event channel.
    fn provision(&mut self, worker: u32, stage: u32, variant: u32) -> Result<()>;
    /// Hand a job to a worker; `Finished` (or `Aborted`) follows.
    fn start(&mut self, worker: u32, job: Job) -> Result<()>;
    /// Abort the job running on a worker; its id, if one was running.
    fn abort(&mut self, worker: u32) -> Option<u64>;
    /// Cancel a starting worker or remove an idle one; `Retired` follows.
    fn retire(&mut self, worker: u32);
    /// Change a worker's intra-op threads; `Reconfigured` follows.
    fn set_threads(&mut self, worker: u32, threads: u32) -> Result<()>;
    /// Change a worker's variant (same stage); `Reconfigured` follows.
    fn set_variant(&mut self, worker: u32, variant: u32) -> Result<()>;
    /// Whether this group can run workers of `stage` (a node serves the stages of
    /// the catalogue it was sent).
    fn serves(&self, stage: u32) -> bool {
        let _ = stage;
        true
    }
    /// Drop the state a worker holds for stateful sequence `sequence` (the engine
    /// released it). Groups that hold no sequence state do nothing.
    fn release_sequence(&mut self, worker: u32, sequence: u64) {
        let _ = (worker, sequence);
    }
    /// Give `stage` new models (a model loaded again while serving): workers
    /// provisioned from now on load them. Groups whose models are fixed refuse.
    fn set_models(&mut self, stage: u32, variants: Vec<ModelSpec>) -> Result<()> {
        let _ = variants;
        Err(DataplaneError::Invalid(format!("this worker group cannot change the models of stage {stage}")))
    }
}

impl Workers for WorkerPool {
    fn provision(&mut self, worker: u32, stage: u32, variant: u32) -> Result<()> {
        WorkerPool::provision(self, worker, stage, variant)
    }
    fn start(&mut self, worker: u32, job: Job) -> Result<()> {
        WorkerPool::start(self, worker, job)
    }
    fn abort(&mut self, worker: u32) -> Option<u64> {
        WorkerPool::abort(self, worker)
    }
    fn retire(&mut self, worker: u32) {
        WorkerPool::retire(self, worker)
    }
    fn set_threads(&mut self, worker: u32, threads: u32) -> Result<()> {
        WorkerPool::set_threads(self, worker, threads)
    }
    fn set_variant(&mut self, worker: u32, variant: u32) -> Result<()> {
        WorkerPool::set_variant(self, worker, variant)
    }
    fn set_models(&mut self, stage: u32, variants: Vec<ModelSpec>) -> Result<()> {
        WorkerPool::set_models(self, stage, variants);
        Ok(())
    }
    fn release_sequence(&mut self, worker: u32, sequence: u64) {
        // A worker that is gone holds nothing.
        let _ = WorkerPool::release_sequence(self, worker, sequence);
    }
}
