//! Shared pieces of the end-to-end tests: a driver that runs an [`Arm`] against the
//! conformance harness's scripted cluster, and request builders.

use std::sync::Arc;

use yardmaster::conformance::cluster::{Fate, ScriptedCluster, MS};
use yardmaster::policy::contract::{Config, Event, Param, Request};
use yardmaster::policy::{Arm, ArmOutput, FailureMode, Limits, Mode, PolicyLoader, PolicyModule, Sandbox};

/// A sandbox and loader for one mode, with no disk cache.
pub fn loader(mode: Mode, limits: Limits) -> PolicyLoader {
    PolicyLoader::new(Sandbox::new(mode, limits).expect("engine"), None)
}

/// Load a test fixture by its path.
pub fn fixture(loader: &PolicyLoader, path: &str) -> Arc<PolicyModule> {
    loader.load_file(std::path::Path::new(path)).expect("fixture loads")
}

/// Load a shipped policy.
pub fn shipped(loader: &PolicyLoader, name: &str) -> Arc<PolicyModule> {
    let artifact = yardmaster_policy_artifacts::shipped(name).expect("shipped policy");
    loader.load(name, artifact.bytes).expect("shipped policy loads")
}

/// Parameters from `key=value` pairs.
pub fn params(pairs: &[(&str, &str)]) -> Vec<Param> {
    pairs.iter().map(|(k, v)| Param { key: k.to_string(), value: v.to_string() }).collect()
}

/// A vision request (stage 0) sent now with a generous deadline.
pub fn request(id: u64, now: u64) -> Request {
    Request {
        id,
        origin: id,
        stage: 0,
        stream: 0,
        sent_at: now,
        arrived_at: now,
        deadline: now + 10_000 * MS,
        priority: 0,
        input_size: 1,
        expected_tokens: 0,
        requeues: 0,
        tags: None,
    }
}

/// An arm running against the scripted cluster.
pub struct Driver {
    /// The cluster (the arm's view of the world).
    pub cluster: ScriptedCluster,
    /// The arm under test.
    pub arm: Arm,
    /// Every output the arm produced, in order.
    pub outputs: Vec<ArmOutput>,
    /// The configuration the arm was started with.
    pub config: Config,
}

impl Driver {
    /// Start `module` with `params` under `mode`.
    pub fn start(loader: &PolicyLoader, module: Arc<PolicyModule>, params: Vec<Param>, failure: FailureMode) -> Self {
        let config = ScriptedCluster::config("test", params, 11);
        let cluster = ScriptedCluster::new(&config);
        let (arm, output) = Arm::start_wasm("test", config.clone(), loader.sandbox(), module, failure, None, &cluster);
        let mut driver = Self { cluster, arm, outputs: Vec::new(), config };
        driver.cluster.apply(&output);
        driver.outputs.push(output);
        driver
    }

    /// Deliver the cluster's pending events plus `extra` in one call.
    pub fn deliver(&mut self, extra: Vec<Event>) -> &ArmOutput {
        for event in extra {
            if let Event::Arrival(request) = event {
                self.cluster.arrive(request);
            } else {
                self.cluster.push_event(event);
            }
        }
        let events = self.cluster.take_events();
        let output = self.arm.handle(&events, &self.cluster);
        self.cluster.apply(&output);
        self.outputs.push(output);
        self.outputs.last().expect("just pushed")
    }

    /// Send `n` new requests (ids from `first`) in one call.
    pub fn send(&mut self, first: u64, n: u64) -> &ArmOutput {
        let now = self.cluster.now;
        let arrivals = (first..first + n).map(|id| Event::Arrival(request(id, now))).collect();
        self.deliver(arrivals)
    }

    /// Run the cluster until nothing more happens (or `limit` calls).
    pub fn settle(&mut self, limit: usize) {
        for _ in 0..limit {
            if !self.cluster.has_pending() {
                match self.cluster.next_internal_time() {
                    Some(t) => self.cluster.advance_to(t),
                    None => return,
                }
            }
            if self.cluster.has_pending() {
                self.deliver(Vec::new());
            }
        }
        panic!("the cluster did not settle within {limit} calls");
    }

    /// Requests that have not ended.
    pub fn unfinished(&self) -> Vec<(u64, Fate)> {
        let mut open: Vec<_> = self.cluster.fates().filter(|(_, f)| !f.is_final()).map(|(r, f)| (r.id, f)).collect();
        open.sort_by_key(|(id, _)| *id);
        open
    }

    /// How many requests ended with `fate`.
    pub fn count(&self, fate: Fate) -> usize {
        self.cluster.fates().filter(|(_, f)| *f == fate).count()
    }
}
