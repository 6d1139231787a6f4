//! The Prometheus text exposition of a serving engine: requests by outcome, latency
//! and queueing summaries, goodput, accelerator time, and the policy arm's counters
//! (calls, decision time, fuel, faults, fallbacks, rejected actions), every series
//! labelled by the arm. Rendered on scrape from the engine's own accounting, so the
//! numbers are the ones the simulator reports (one definition of every metric).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::ab::Arms;
use yardmaster_engine::metrics::{Percentiles, Stats, Summary};
use yardmaster_engine::{Clock, Engine, EngineStats, Executor};
use yardmaster_policy::arm::SWAP_PAUSE_BUCKETS_US;
use yardmaster_policy::contract::Action;
use yardmaster_policy::{ArmStats, PolicyFault, Rejection};

/// What one arm's metrics are rendered from.
pub struct ArmMetrics<'a> {
    /// The arm's name (the `arm` label).
    pub arm: &'a str,
    /// Stream names, by stream index.
    pub streams: &'a [String],
    /// The accounting's summary.
    pub summary: &'a Summary,
    /// The policy arm's counters.
    pub policy: &'a ArmStats,
    /// The engine's counters.
    pub engine: &'a EngineStats,
}

/// Writes metric families, each with its HELP and TYPE lines once and all its samples
/// together (the text format requires a family's lines to be one group), in the order
/// the families were first used.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

struct Family {
    name: &'static str,
    text: String,
}

impl Exposition {
    /// A new, empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text of family `name`, declared with `kind` and `help` the first time.
    fn family(&mut self, name: &'static str, kind: &str, help: &str) -> &mut String {
        let index = match self.families.iter().position(|f| f.name == name) {
            Some(index) => index,
            None => {
                self.families.push(Family { name, text: format!("# HELP {name} {help}\n# TYPE {name} {kind}\n") });
                self.families.len() - 1
            }
        };
        &mut self.families[index].text
    }

    /// One sample of `name` (declared with `kind` and `help` the first time).
    pub fn sample(&mut self, name: &'static str, kind: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        write_sample(self.family(name, kind, help), name, "", labels, value);
    }

    /// A summary in seconds from nanosecond percentiles and a count.
    pub fn summary(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], p: &Percentiles, count: u64) {
        let text = self.family(name, "summary", help);
        for (q, v) in [("0.5", p.p50), ("0.9", p.p90), ("0.95", p.p95), ("0.99", p.p99)] {
            let mut with_quantile = labels.to_vec();
            with_quantile.push(("quantile", q));
            write_sample(text, name, "", &with_quantile, v as f64 / 1e9);
        }
        write_sample(text, name, "_sum", labels, p.mean * count as f64 / 1e9);
        write_sample(text, name, "_count", labels, count as f64);
    }

    /// A histogram from per-bucket counts (not cumulative) with their upper bounds;
    /// `sum` is the sum of the observed values.
    pub fn histogram(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], buckets: &[(f64, u64)], sum: f64) {
        let text = self.family(name, "histogram", help);
        let mut cumulative = 0;
        for (bound, count) in buckets {
            cumulative += count;
            let le = number(*bound);
            let mut with_le = labels.to_vec();
            with_le.push(("le", le.as_str()));
            write_sample(text, name, "_bucket", &with_le, cumulative as f64);
        }
        write_sample(text, name, "_sum", labels, sum);
        write_sample(text, name, "_count", labels, cumulative as f64);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.families.into_iter().map(|f| f.text).collect()
    }
}

fn write_sample(text: &mut String, name: &str, suffix: &str, labels: &[(&str, &str)], value: f64) {
    text.push_str(name);
    text.push_str(suffix);
    if !labels.is_empty() {
        text.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            let _ = write!(text, "{key}=\"{}\"", escape(value));
        }
        text.push('}');
    }
    let _ = writeln!(text, " {}", number(value));
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{value}")
    }
}

/// Add one arm's metrics to `out`.
pub fn render_arm(out: &mut Exposition, metrics: &ArmMetrics<'_>) {
    let arm = metrics.arm;
    let mut groups: Vec<(String, &Stats)> = vec![("all".into(), &metrics.summary.overall)];
    for (index, stats) in &metrics.summary.streams {
        let name = metrics.streams.get(*index as usize).cloned().unwrap_or_else(|| index.to_string());
        groups.push((name, stats));
    }
    for (stream, stats) in &groups {
        let labels = [("arm", arm), ("stream", stream.as_str())];
        out.sample("yardmaster_requests_arrived_total", "counter", "Requests received.", &labels, stats.arrivals as f64);
        for (outcome, count) in [
            ("on_time", stats.outcomes.on_time),
            ("late", stats.outcomes.late),
            ("dropped", stats.outcomes.dropped),
            ("failed", stats.outcomes.failed),
        ] {
            let labels = [("arm", arm), ("stream", stream.as_str()), ("outcome", outcome)];
            out.sample("yardmaster_requests_ended_total", "counter", "Requests ended, by outcome.", &labels, count as f64);
        }
        out.summary(
            "yardmaster_request_latency_seconds",
            "End-to-end latency of completed requests.",
            &labels,
            &stats.latency,
            stats.completed,
        );
        out.summary(
            "yardmaster_queue_delay_seconds",
            "Time completed requests spent queued, over every stage.",
            &labels,
            &stats.queue_delay,
            stats.completed,
        );
        out.sample(
            "yardmaster_goodput_requests_per_second",
            "gauge",
            "Requests completed within their SLO per second since start.",
            &labels,
            stats.goodput,
        );
        out.sample(
            "yardmaster_token_goodput_per_second",
            "gauge",
            "Tokens of on-time requests per second since start.",
            &labels,
            stats.token_goodput,
        );
        out.sample("yardmaster_slo_attainment_ratio", "gauge", "On-time requests over ended requests.", &labels, stats.slo_attainment);
        out.sample("yardmaster_accelerator_seconds_total", "counter", "Worker time spent on batches.", &labels, stats.accelerator_s);
        out.sample(
            "yardmaster_invalid_accelerator_seconds_total",
            "counter",
            "Worker time spent on requests that were dropped or finished late.",
            &labels,
            stats.invalid_s,
        );
    }
    let labels = [("arm", arm)];
    let policy = metrics.policy;
    out.sample("yardmaster_policy_calls_total", "counter", "Calls into the policy.", &labels, policy.calls as f64);
    out.sample("yardmaster_policy_events_total", "counter", "Events delivered to the policy.", &labels, policy.events as f64);
    out.sample(
        "yardmaster_policy_decision_seconds_total",
        "counter",
        "Time spent inside policy calls.",
        &labels,
        policy.call_time.as_secs_f64(),
    );
    out.sample(
        "yardmaster_policy_decision_max_seconds",
        "gauge",
        "Longest policy call so far.",
        &labels,
        policy.max_call_time.as_secs_f64(),
    );
    out.sample("yardmaster_policy_fuel_total", "counter", "Fuel the policy consumed (simulation mode).", &labels, policy.fuel as f64);
    out.sample("yardmaster_policy_fallbacks_total", "counter", "Times the arm fell back after a fault.", &labels, policy.fallbacks as f64);
    out.sample("yardmaster_policy_reloads_total", "counter", "Times the arm reloaded its policy.", &labels, policy.reloads as f64);
    let swaps = &policy.swaps;
    out.sample("yardmaster_policy_swaps_total", "counter", "Hot swaps to another policy.", &labels, swaps.count as f64);
    let mut buckets: Vec<(f64, u64)> =
        SWAP_PAUSE_BUCKETS_US.iter().zip(&swaps.buckets).map(|(us, count)| (*us as f64 / 1e6, *count)).collect();
    buckets.push((f64::INFINITY, swaps.buckets[SWAP_PAUSE_BUCKETS_US.len()]));
    out.histogram(
        "yardmaster_policy_swap_pause_seconds",
        "Time each swap held the engine (the new policy's init and the replay of held requests).",
        &labels,
        &buckets,
        swaps.total.as_secs_f64(),
    );
    out.sample("yardmaster_policy_swap_pause_max_seconds", "gauge", "Longest swap pause so far.", &labels, swaps.max.as_secs_f64());
    // Every kind from the start, at zero, so `rate()` and alerts see the series before
    // the first event (and a kind missing from a list still shows once it occurs).
    for (kind, count) in every_kind(PolicyFault::KINDS, &policy.faults) {
        out.sample(
            "yardmaster_policy_faults_total",
            "counter",
            "Policy faults (traps, timeouts, memory), by kind.",
            &[("arm", arm), ("kind", kind)],
            count as f64,
        );
    }
    for (kind, count) in every_kind(Action::KINDS, &policy.accepted) {
        out.sample(
            "yardmaster_policy_actions_accepted_total",
            "counter",
            "Policy actions applied, by kind.",
            &[("arm", arm), ("kind", kind)],
            count as f64,
        );
    }
    for (reason, count) in every_kind(Rejection::KINDS, &policy.rejected) {
        out.sample(
            "yardmaster_policy_actions_rejected_total",
            "counter",
            "Policy actions refused by validation, by reason.",
            &[("arm", arm), ("reason", reason)],
            count as f64,
        );
    }
    let engine = metrics.engine;
    out.sample("yardmaster_batches_total", "counter", "Batches started on workers.", &labels, engine.jobs as f64);
    let last = engine.batch_sizes.len() - 1;
    let buckets: Vec<(f64, u64)> = engine
        .batch_sizes
        .iter()
        .enumerate()
        .map(|(k, count)| (if k == last { f64::INFINITY } else { (1u64 << k) as f64 }, *count))
        .collect();
    out.histogram("yardmaster_batch_size", "Requests per batch started on a worker.", &labels, &buckets, engine.batch_items as f64);
    out.sample("yardmaster_preemptions_total", "counter", "Running batches preempted.", &labels, engine.preemptions as f64);
    out.sample("yardmaster_expired_total", "counter", "Requests the host expired past their deadline.", &labels, engine.expired as f64);
}

/// Each of `known` with its count in `counts` (0 when absent), then any other kind
/// `counts` holds.
fn every_kind<'a>(known: &'a [&'static str], counts: &'a BTreeMap<&'static str, u64>) -> impl Iterator<Item = (&'static str, u64)> + 'a {
    let listed = known.iter().map(|kind| (*kind, counts.get(kind).copied().unwrap_or(0)));
    let others = counts.iter().filter(|(kind, _)| !known.contains(kind)).map(|(kind, count)| (*kind, *count));
    listed.chain(others)
}

/// The whole exposition of one engine, whose policy arm is named `arm`; call it on
/// the actor thread (through `ActorHandle::inspect`).
pub fn render_engine<C: Clock, X: Executor>(engine: &Engine<C, X>, arm: &str) -> String {
    let mut out = Exposition::new();
    render_one(&mut out, engine, arm);
    out.finish()
}

/// The exposition of every arm of a server (two during an A/B run), each series
/// labelled with its arm.
pub fn render_arms<C: Clock, X: Executor>(arms: &Arms<C, X>) -> String {
    let mut out = Exposition::new();
    for slot in arms.slots() {
        render_one(&mut out, &slot.engine, &slot.label);
    }
    out.sample(
        "yardmaster_ab_running",
        "gauge",
        "1 while an A/B run splits the traffic between two arms (or is ending), else 0.",
        &[],
        if arms.ab_running() { 1.0 } else { 0.0 },
    );
    out.finish()
}

/// The GPU's memory as the CUDA driver reports it (read through `cudarc` in this
/// process, so no second CUDA context is made): `yardmaster_gpu_memory_used_bytes` and
/// `yardmaster_gpu_memory_total_bytes`, labelled by GPU; nothing when the data plane
/// runs on the CPU.
pub fn render_gpu_memory(device: yardmaster_dataplane::Device) -> String {
    let yardmaster_dataplane::Device::Cuda(ordinal) = device else { return String::new() };
    let mut out = Exposition::new();
    let gpu = ordinal.to_string();
    match yardmaster_dataplane::device::gpu_memory(ordinal) {
        Ok((free, total)) => {
            let labels = [("gpu", gpu.as_str())];
            out.sample(
                "yardmaster_gpu_memory_used_bytes",
                "gauge",
                "GPU memory in use (every process on the GPU), bytes.",
                &labels,
                total.saturating_sub(free) as f64,
            );
            out.sample("yardmaster_gpu_memory_total_bytes", "gauge", "GPU memory in all, bytes.", &labels, total as f64);
            out.finish()
        }
        Err(why) => format!("# GPU {gpu} memory unavailable: {why}\n"),
    }
}

fn render_one<C: Clock, X: Executor>(out: &mut Exposition, engine: &Engine<C, X>, arm: &str) {
    let state = engine.state();
    let summary = engine.accounting().summary(state.now());
    let streams: Vec<String> = state.pipeline().streams.iter().map(|s| s.name.clone()).collect();
    let metrics = ArmMetrics { arm, streams: &streams, summary: &summary, policy: engine.arm().stats(), engine: engine.stats() };
    render_arm(out, &metrics);
    let policy = engine.arm().module().map_or_else(|| engine.arm().instance_label(), |m| m.name().to_string());
    let sha256 = engine.arm().module().map(|m| m.sha256_hex()).unwrap_or_default();
    let state = super::swap::state_name(engine.arm().state());
    out.sample(
        "yardmaster_policy_info",
        "gauge",
        "The policy the arm runs (its name and SHA-256) and its state; always 1.",
        &[("arm", arm), ("policy", &policy), ("sha256", &sha256), ("state", state)],
        1.0,
    );
    out.sample(
        "yardmaster_requests_in_flight",
        "gauge",
        "Requests admitted and not yet ended.",
        &[("arm", arm)],
        engine.in_flight() as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_and_action_series_is_there_from_the_start() {
        let mut policy = ArmStats::default();
        policy.faults.insert("trap", 2);
        policy.faults.insert("a-kind-not-listed", 1);
        let (summary, engine) = (Summary::default(), EngineStats::default());
        let mut out = Exposition::new();
        render_arm(&mut out, &ArmMetrics { arm: "a", streams: &[], summary: &summary, policy: &policy, engine: &engine });
        let text = out.finish();
        for line in [
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"trap\"} 2",
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"timeout\"} 0",
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"a-kind-not-listed\"} 1",
            "yardmaster_policy_actions_accepted_total{arm=\"a\",kind=\"dispatch\"} 0",
            "yardmaster_policy_actions_rejected_total{arm=\"a\",reason=\"over-capacity\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn families_are_declared_once_and_labels_escaped() {
        let mut out = Exposition::new();
        out.sample("m_total", "counter", "Help.", &[("a", "x\"y")], 1.0);
        out.sample("m_total", "counter", "Help.", &[("a", "z")], 2.5);
        let p = Percentiles { mean: 2e6, p50: 1_000_000, p90: 2_000_000, p95: 3_000_000, p99: 4_000_000, max: 5_000_000 };
        out.summary("lat_seconds", "Latency.", &[("arm", "main")], &p, 10);
        let text = out.finish();
        assert_eq!(text.matches("# TYPE m_total counter").count(), 1);
        assert!(text.contains("m_total{a=\"x\\\"y\"} 1\n"), "{text}");
        assert!(text.contains("m_total{a=\"z\"} 2.5\n"));
        assert!(text.contains("lat_seconds{arm=\"main\",quantile=\"0.99\"} 0.004\n"), "{text}");
        assert!(text.contains("lat_seconds_sum{arm=\"main\"} 0.02\n"), "{text}");
        assert!(text.contains("lat_seconds_count{arm=\"main\"} 10\n"));
    }

    #[test]
    fn a_family_s_samples_stay_together_and_histograms_are_cumulative() {
        let mut out = Exposition::new();
        out.sample("a_total", "counter", "A.", &[("s", "1")], 1.0);
        out.sample("b_total", "counter", "B.", &[], 1.0);
        out.sample("a_total", "counter", "A.", &[("s", "2")], 2.0);
        out.histogram("h", "H.", &[], &[(1.0, 3), (2.0, 1), (f64::INFINITY, 2)], 9.0);
        let text = out.finish();
        let a = text.find("a_total{s=\"2\"}").unwrap();
        assert!(a < text.find("# HELP b_total").unwrap(), "a's samples before b's header: {text}");
        assert!(text.contains("h_bucket{le=\"2\"} 4\n"), "{text}");
        assert!(text.contains("h_bucket{le=\"+Inf\"} 6\n"), "{text}");
        assert!(text.contains("h_count 6\n") && text.contains("h_sum 9\n"), "{text}");
    }
}
