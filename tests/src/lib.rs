//! Shared pieces of the end-to-end tests: a driver that runs an [`Arm`] on the real
//! engine over the conformance harness's scripted cluster, and request builders.

use std::sync::Arc;

use yardmaster::conformance::scripted::{Fate, Harness, MS};
use yardmaster::engine::Submission;
use yardmaster::policy::contract::{Config, Param};
use yardmaster::policy::{Arm, ArmOutput, FailureMode, Limits, Mode, PolicyLoader, PolicyModule, Sandbox};

/// A sandbox and loader for one mode, with no disk cache.
pub fn loader(mode: Mode, limits: Limits) -> PolicyLoader {
    PolicyLoader::new(Sandbox::new(mode, limits).expect("engine"), None)
}

/// Limits for tests whose subject is what a policy decides, not how fast: the default
/// bounds with serve-mode deadlines of one second, so a call slowed by a loaded test
/// machine (tests run in parallel in one binary) is not cut off as an overrun.
pub fn unhurried() -> Limits {
    let second = std::time::Duration::from_secs(1);
    Limits { event_deadline: second, tick_deadline: second, ..Limits::default() }
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

/// A vision request (stream 0, entering at stage 0) sent at `now`, due `slo_ms` later.
pub fn vision(now: u64, slo_ms: u64) -> Submission {
    Submission { stream: 0, sent_at: now, deadline: now + slo_ms * MS, input_size: 1, ..Submission::default() }
}

/// A chat request (stream 1, entering at the LLM stage) sent at `now` for `tokens`
/// tokens, due 3 s later.
pub fn chat(now: u64, tokens: u32) -> Submission {
    Submission { stream: 1, sent_at: now, deadline: now + 3_000 * MS, input_size: 1, expected_tokens: tokens, ..Submission::default() }
}

/// An arm running on the engine over the scripted cluster.
pub struct Driver {
    /// The engine, its scripted workers, and what the check observes.
    pub harness: Harness,
    /// The configuration the arm was started with.
    pub config: Config,
}

impl Driver {
    /// Start `module` with `params` under `failure`.
    pub fn start(loader: &PolicyLoader, module: Arc<PolicyModule>, params: Vec<Param>, failure: FailureMode) -> Self {
        let mut started = None;
        let harness = Harness::start(params, 11, |config, view| {
            started = Some(config.clone());
            Arm::start_wasm("test", config, loader.sandbox(), module, failure, None, view)
        });
        Self { harness, config: started.expect("the arm started") }
    }

    /// The arm under test.
    pub fn arm(&self) -> &Arm {
        self.harness.arm()
    }

    /// Every answer the arm gave, in order (its start first).
    pub fn outputs(&self) -> Vec<&ArmOutput> {
        self.harness.calls().iter().map(|c| &c.output).collect()
    }

    /// The arm's last answer.
    pub fn last(&self) -> &ArmOutput {
        &self.harness.calls().last().expect("the arm started").output
    }

    /// Submit `requests` now and deliver them (with whatever else is pending) in one
    /// call; returns the arm's answer.
    pub fn submit(&mut self, requests: Vec<Submission>) -> &ArmOutput {
        for request in requests {
            self.harness.submit(request);
        }
        self.harness.flush();
        self.last()
    }

    /// Send `n` vision requests due in 10 s in one call; the engine numbers them from
    /// `first` (asserted, so a test can name them).
    pub fn send(&mut self, first: u64, n: u64) -> &ArmOutput {
        let now = self.harness.now();
        for expected in first..first + n {
            let id = self.harness.submit(vision(now, 10_000));
            assert_eq!(id, expected, "the engine numbers requests in order");
        }
        self.harness.flush();
        self.last()
    }

    /// Run the engine until `t` (jobs finish, workers start, ticks and timers fire).
    pub fn advance_to(&mut self, t: u64) {
        self.harness.advance_to(t);
    }

    /// Run every instant before `t` and move the clock to `t`: what the test submits
    /// next comes before the engine's tick or timers due at `t`.
    pub fn run_up_to(&mut self, t: u64) {
        self.harness.run_up_to(t);
    }

    /// Run until nothing is in flight (or panic after `limit` steps).
    pub fn settle(&mut self, limit: usize) {
        assert!(self.harness.settle(limit), "the cluster did not settle within {limit} steps: {:?}", self.unfinished());
    }

    /// Requests that have not ended, with where they are.
    pub fn unfinished(&self) -> Vec<(u64, String)> {
        self.harness.unfinished()
    }

    /// How many requests ended with `fate`.
    pub fn count(&self, fate: Fate) -> usize {
        self.harness.count(fate)
    }

    /// Problems seen (a request ending twice).
    pub fn violations(&self) -> &[String] {
        self.harness.violations()
    }
}
