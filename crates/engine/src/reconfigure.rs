//! A changed cluster under a running engine: models loaded or unloaded while serving
//! (`yardmaster serve --model-repository` with model control).
//!
//! Stage and stream ids are the policy's names for them and the keys of every table
//! here, in the executor and in the policy's own state, so they never move: a new
//! pipeline keeps every stage and stream of the one served, in the same places, and
//! may add stages and streams after them. A model taken out of service keeps its
//! places as an *offline* stage — no replica allowed (`max_replicas` 0) — whose
//! stream receives no request; loading a model of the same name again brings the
//! same stage back online. Offline stages are left out of the optimal bound.
//!
//! [`Engine::reconfigure`] applies the new pipeline between two event batches: it
//! takes workers off stages whose replica bound fell (starting and idle ones at once,
//! busy ones after their job), drops (with the reason) what is still queued at a
//! stage going offline and fails later arrivals there,
//! provisions the initial workers of a stage coming online (the policy sees them as
//! `worker-added` when they are ready), and hands the policy arm over to an instance
//! initialised with the new configuration ([`yardmaster_policy::Arm::reconfigure`]),
//! replayed every request it holds. [`Engine::fail_stream`] ends every request of a
//! stream, for a model whose drain ran out of time.

use yardmaster_policy::contract::{Config, EndReason};
use yardmaster_policy::PolicyInstance;

use super::metrics::Outcome;
use super::pipeline::Pipeline;
use super::state::{PieceState, StageEntry, StageWindow};
use super::{bound, Clock, Engine, Executor};

/// What [`Engine::reconfigure`] did.
pub struct ReconfigureOutcome {
    /// Wall time the hand-over held the engine.
    pub pause: std::time::Duration,
    /// Requests the policy held at the hand-over, replayed into the new instance.
    pub replayed: usize,
    /// Requests dropped because their stage went offline.
    pub failed: usize,
    /// The instance that answered before, for the caller to drop off the hot path.
    pub retired: Option<Box<dyn PolicyInstance>>,
}

impl std::fmt::Debug for ReconfigureOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconfigureOutcome")
            .field("pause", &self.pause)
            .field("replayed", &self.replayed)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Whether `next` keeps every stage and stream of `served` in its place: `Err` names
/// the first one that moved or changed kind.
pub fn keeps_places(served: &Pipeline, next: &Pipeline) -> Result<(), String> {
    if next.stages.len() < served.stages.len() || next.streams.len() < served.streams.len() {
        return Err(format!(
            "the new pipeline has {} stages and {} streams; the served one has {} and {}: stages and streams are only added",
            next.stages.len(),
            next.streams.len(),
            served.stages.len(),
            served.streams.len()
        ));
    }
    for (i, (old, new)) in served.stages.iter().zip(&next.stages).enumerate() {
        if old.name != new.name || old.kind != new.kind {
            return Err(format!("stage {i} was {:?} and would be {:?}: a stage keeps its place", old.name, new.name));
        }
    }
    for (i, (old, new)) in served.streams.iter().zip(&next.streams).enumerate() {
        if old.name != new.name || old.entry != new.entry {
            return Err(format!("stream {i} was {:?} and would be {:?}: a stream keeps its place", old.name, new.name));
        }
    }
    Ok(())
}

impl<C: Clock, X: Executor> Engine<C, X> {
    /// Serve `pipeline` from now on (see the module docs): it must keep every stage
    /// and stream of the pipeline served ([`keeps_places`]), else nothing changes and
    /// the error says why. Events gathered so far go to the old policy first.
    pub fn reconfigure(&mut self, mut pipeline: Pipeline, why: &str) -> Result<ReconfigureOutcome, String> {
        if pipeline.hosts.is_empty() && !self.state.pipeline.hosts.is_empty() {
            // A model loaded on a live cluster: the hosts stay as they are.
            pipeline.hosts = self.state.pipeline.hosts.clone();
            pipeline.max_workers = pipeline.max_workers.max(self.state.pipeline.max_workers);
        }
        keeps_places(&self.state.pipeline, &pipeline)?;
        pipeline.validate("the reconfigured pipeline").map_err(|e| e.to_string())?;
        let mut hosts = self.state.hosts.clone();
        hosts.set_defs(&pipeline.hosts)?;
        self.flush();
        let started = std::time::Instant::now();
        self.now();
        let old_stages = self.state.stages.len();
        for def in &pipeline.stages[old_stages..] {
            self.state.stages.push(StageEntry {
                batch_limit: def.max_batch,
                replicas: 0,
                window: StageWindow::default(),
                routes: Vec::new(),
            });
            self.state.queued_order.push(Default::default());
            self.unserved.push(None);
        }
        self.state.hosts = hosts;
        self.state.hosts.set_max_workers(pipeline.max_workers);
        self.state.pipeline = pipeline;
        // Workers seated on a host that has no slot now (a node that left) leave it:
        // starting and idle ones at once, busy ones after their batch.
        let departed: Vec<u32> = (0..self.state.pipeline.hosts.len() as u32)
            .filter(|&host| self.state.pipeline.hosts[host as usize].slots == 0)
            .flat_map(|host| self.state.hosts.workers_on(host))
            .collect();
        for worker in departed {
            self.retire_worker(worker);
        }

        let mut failed = 0;
        for stage in 0..self.state.stages.len() {
            let def = &self.state.pipeline.stages[stage];
            let (replicas, max, initial) = (self.state.stages[stage].replicas, def.max_replicas, def.replicas);
            self.state.stages[stage].batch_limit = self.state.stages[stage].batch_limit.clamp(1, def.max_batch);
            if max == 0 {
                let error = format!("model stage {} was taken out of service ({why})", def.name);
                self.unserved[stage] = Some(error.clone());
                let waiting: Vec<u64> = self
                    .state
                    .pieces
                    .iter()
                    .filter(|(_, p)| p.request.stage as usize == stage && matches!(p.state, PieceState::Queued | PieceState::Deferred))
                    .map(|(id, _)| *id)
                    .collect();
                for id in waiting {
                    if let Some(origin) = self.state.pieces.get(&id).map(|p| p.request.origin) {
                        failed += 1;
                        let now = self.state.now;
                        self.end_origin(origin, Outcome::Dropped { reason: error.clone() }, now, EndReason::Failed);
                    }
                }
            }
            if replicas > max {
                self.scale(stage as u32, max, 0, &[]);
            } else if replicas == 0 && initial > 0 {
                self.scale(stage as u32, initial, 0, &[]);
            }
        }
        // What the old policy must still hear (workers removed, requests ended) goes to it.
        self.flush();

        self.capacity_bound = bound::capacity_bound(&self.state.pipeline, self.state.pipeline.max_workers);
        self.update_capacity();
        let replayed = self.arm.ledger().len();
        let config = self.reconfigured_policy_config();
        let (output, retired) = self.arm.reconfigure(config, &self.state);
        self.apply_handover(output);
        let pause = started.elapsed();
        Ok(ReconfigureOutcome { pause, replayed, failed, retired })
    }

    /// The cluster's membership changed (a node joined, left or was lost): serve
    /// `pipeline`, whose hosts keep their places by name (a host that left stays,
    /// with no slot), and hand the policy the new cluster as [`Engine::reconfigure`]
    /// does. Then every stage with fewer replicas than `pipeline` gives it (its
    /// replicas across the cluster as it is now) is brought up to that many, seated
    /// by the default placement: a joining host's free slots take them first, and a
    /// lost host's replicas are started again elsewhere. Replicas a policy added
    /// beyond it stay.
    pub fn reconfigure_cluster(&mut self, pipeline: Pipeline, why: &str) -> Result<ReconfigureOutcome, String> {
        let outcome = self.reconfigure(pipeline, why)?;
        for stage in 0..self.state.stages.len() {
            let def = &self.state.pipeline.stages[stage];
            let (target, replicas) = (def.replicas.min(def.max_replicas), self.state.stages[stage].replicas);
            if replicas < target {
                self.scale(stage as u32, target, 0, &[]);
            }
        }
        self.flush();
        Ok(outcome)
    }

    /// Every host of the cluster with what it caches and runs and how fast its batch
    /// jobs ran against their profiles (`yardmaster cluster hosts` writes these as the
    /// simulator's host list).
    pub fn host_reports(&self) -> Vec<crate::hosts::HostReport> {
        self.state.hosts.reports()
    }

    /// Replace the policy parameters (the models' own settings change as models are
    /// loaded and unloaded); policy instances started from now on get them.
    pub fn set_params(&mut self, params: Vec<yardmaster_policy::contract::Param>) {
        self.options.params = params;
    }

    /// End every request of `stream` still in flight as failed with `error` (a model
    /// unloaded whose requests did not drain in time). Returns how many ended.
    pub fn fail_stream(&mut self, stream: u32, error: &str) -> usize {
        let now = self.now();
        let origins: Vec<u64> = self.state.origins.iter().filter(|(_, o)| o.stream == stream).map(|(id, _)| *id).collect();
        for &origin in &origins {
            self.end_origin(origin, Outcome::Failed { error: error.to_string() }, now, EndReason::Failed);
        }
        origins.len()
    }

    /// Requests of `stream` in flight (queued, running or deferred at any stage).
    pub fn in_flight_of(&self, stream: u32) -> usize {
        self.state.origins.values().filter(|o| o.stream == stream).count()
    }

    /// The configuration a policy instance starts from after a reconfiguration (the
    /// arm fills in the serving workers and keeps its name and seed).
    fn reconfigured_policy_config(&self) -> Config {
        let pipeline = &self.state.pipeline;
        Config {
            arm: self.arm.name().to_string(),
            stages: pipeline.contract_stages(),
            workers: Vec::new(),
            streams: pipeline.contract_streams(),
            hosts: self.state.host_info(),
            params: self.options.params.clone(),
            tick_interval: self.options.tick_interval,
            max_workers: pipeline.max_workers,
            seed: self.options.seed,
            now: self.state.now,
        }
    }
}
