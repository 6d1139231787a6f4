//! The serving executor's watchdog: the rule that says when a job has stalled, and
//! the thread that applies it.
//!
//! A job is expected to take about its profiled duration (the tail latency, p99, of
//! its batch size on its worker's variant, from the pipeline file). One that runs far
//! past it — [`WatchdogConfig::multiple`] times the profiled p99, and at least
//! [`WatchdogConfig::min_ms`] — is taken to be stalled: a hung ONNX Runtime call, a
//! worker thread stuck on a lock, a remote host that stopped answering without closing
//! its connection. The executor ([`super::executor`]) then fails the job's requests
//! with `worker N stalled: …` and restarts the worker, so no request waits on it for
//! ever and the stage keeps its replica.
//!
//! A job's clock starts when it is handed to a worker that is ready; while its worker
//! is still loading its model the job waits for the load and is not timed.
//!
//! In the server's configuration file:
//!
//! ```toml
//! [watchdog]
//! enabled = true     # false: jobs may run for ever
//! multiple = 20.0    # a job stalls past this many times its profiled p99 …
//! min_ms = 30000     # … and never before this many milliseconds
//! ```

use std::time::{Duration, Instant};

use serde::Deserialize;

/// When a job counts as stalled (`[watchdog]` in the serve configuration).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchdogConfig {
    /// Whether stalled jobs are failed and their workers restarted.
    pub enabled: bool,
    /// A job stalls once it has run this many times its profiled p99.
    pub multiple: f64,
    /// … but never before this many milliseconds (profiles of tiny models are in
    /// microseconds; scheduling noise is not a stall).
    pub min_ms: u64,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig { enabled: true, multiple: 20.0, min_ms: 30_000 }
    }
}

/// The watchdog never checks more often than this …
const MIN_TICK: Duration = Duration::from_millis(5);
/// … nor less often than this.
const MAX_TICK: Duration = Duration::from_millis(100);

impl WatchdogConfig {
    /// How long a job whose profiled p99 is `profiled_tail` may run; `None` when the
    /// watchdog is off.
    pub fn limit(&self, profiled_tail: Duration) -> Option<Duration> {
        if !self.enabled {
            return None;
        }
        let scaled = Duration::try_from_secs_f64(profiled_tail.as_secs_f64() * self.multiple).unwrap_or(Duration::MAX);
        Some(scaled.max(Duration::from_millis(self.min_ms)))
    }

    /// How often running jobs are checked: a quarter of the shortest limit, within
    /// 5 to 100 ms, so a stall is seen at most a quarter late.
    pub fn tick(&self) -> Duration {
        (Duration::from_millis(self.min_ms) / 4).clamp(MIN_TICK, MAX_TICK)
    }

    /// Refuse settings that would fail healthy jobs.
    pub fn validate(&self) -> Result<(), String> {
        if !self.multiple.is_finite() || self.multiple < 1.0 {
            return Err(format!("[watchdog] multiple must be a number of at least 1 (got {})", self.multiple));
        }
        if self.min_ms == 0 {
            return Err("[watchdog] min_ms must be at least 1".into());
        }
        Ok(())
    }

    /// Why a job was failed, for its requests: `worker N stalled: …`.
    pub fn stalled_message(&self, worker: u32, requests: usize, ran: Duration, limit: Duration, profiled_tail: Duration) -> String {
        format!(
            "worker {worker} stalled: a job of {requests} request{} ran {:.0} ms, past the watchdog's limit of {:.0} ms \
             ({} × the profiled p99 of {:.3} ms, at least {} ms); the worker is restarted",
            if requests == 1 { "" } else { "s" },
            ran.as_secs_f64() * 1e3,
            limit.as_secs_f64() * 1e3,
            self.multiple,
            profiled_tail.as_secs_f64() * 1e3,
            self.min_ms,
        )
    }
}

/// Start the watchdog thread: every tick (from `config()`, read each time) it calls
/// `check` with the time, until `check` returns false (what it watches is gone).
pub fn spawn(
    name: &str,
    config: impl Fn() -> Option<WatchdogConfig> + Send + 'static,
    mut check: impl FnMut(Instant) -> bool + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_string()).spawn(move || loop {
        let Some(config) = config() else { return };
        std::thread::sleep(config.tick());
        if !check(Instant::now()) {
            return;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_a_multiple_of_the_profile_with_a_floor() {
        let config = WatchdogConfig { enabled: true, multiple: 10.0, min_ms: 1000 };
        assert_eq!(config.limit(Duration::from_micros(90)), Some(Duration::from_secs(1)), "tiny profiles get the floor");
        assert_eq!(config.limit(Duration::from_millis(300)), Some(Duration::from_secs(3)));
        assert_eq!(WatchdogConfig { enabled: false, ..config }.limit(Duration::from_secs(1)), None);
        assert_eq!(config.tick(), Duration::from_millis(100));
        assert_eq!(WatchdogConfig { min_ms: 8, ..config }.tick(), Duration::from_millis(5));
    }

    #[test]
    fn impossible_settings_are_refused() {
        assert!(WatchdogConfig::default().validate().is_ok());
        let error = WatchdogConfig { multiple: 0.5, ..Default::default() }.validate().unwrap_err();
        assert!(error.contains("multiple"), "{error}");
        assert!(WatchdogConfig { min_ms: 0, ..Default::default() }.validate().is_err());
        assert!(WatchdogConfig { multiple: f64::NAN, ..Default::default() }.validate().is_err());
    }

    #[test]
    fn the_message_names_the_worker_and_the_limit() {
        let config = WatchdogConfig { enabled: true, multiple: 10.0, min_ms: 1000 };
        let text = config.stalled_message(3, 2, Duration::from_millis(1250), Duration::from_secs(1), Duration::from_micros(90));
        assert!(text.starts_with("worker 3 stalled: a job of 2 requests ran 1250 ms"), "{text}");
        assert!(text.contains("limit of 1000 ms") && text.contains("restarted"), "{text}");
    }
}
