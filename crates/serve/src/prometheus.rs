//! The Prometheus text exposition of a serving engine: requests by outcome, latency
//! and queueing summaries, goodput, accelerator time, and the policy arm's counters
//! (calls, decision time, fuel, faults, fallbacks, rejected actions), every series
//! labelled by the arm; the policy's linear memory, its infeasible plans and the
//! metrics it emits. Rendered on scrape from the engine's own accounting, so the
//! numbers are the ones the simulator reports (one definition of every metric).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::ab::Arms;
use yardmaster_engine::hosts::HostReport;
use yardmaster_engine::metrics::{Histogram, Stats};
use yardmaster_engine::{Clock, Engine, EngineStats, Executor};
use yardmaster_policy::arm::SWAP_PAUSE_BUCKETS_US;
use yardmaster_policy::contract::Action;
use yardmaster_policy::{ArmStats, PolicyFault, Rejection};

/// What one arm's metrics are rendered from.
pub struct ArmMetrics<'a> {
    /// The arm's name (the `arm` label).
    pub arm: &'a str,
    /// Every stream of the pipeline, whether or not a request came yet.
    pub streams: Vec<StreamMetrics<'a>>,
    /// The policy arm's counters.
    pub policy: &'a ArmStats,
    /// The engine's counters.
    pub engine: &'a EngineStats,
}

/// One stream's metrics.
pub struct StreamMetrics<'a> {
    /// Its name (the `stream` label).
    pub name: &'a str,
    /// Its SLO (ns): the latency histograms' buckets are fractions and multiples of it.
    pub slo_ns: u64,
    /// The accounting's totals; `None` before its first request (every series at 0).
    pub stats: Option<&'a Stats>,
    /// The latency and queueing delay of its completed requests (ns).
    pub distributions: Option<(&'a Histogram, &'a Histogram)>,
}

/// The latency histograms' bucket bounds, as fractions and multiples of the stream's
/// SLO: fine below it (where "how close to the SLO" is read), coarse above.
pub const SLO_BUCKETS: [f64; 9] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0, 4.0];

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

/// One model version's counters under Triton's metric names.
#[derive(Debug, Clone, PartialEq)]
pub struct TritonModelMetrics {
    /// The model's name.
    pub model: String,
    /// Its version.
    pub version: String,
    /// Requests answered (`nv_inference_request_success`).
    pub success: u64,
    /// Requests dropped or failed (`nv_inference_request_failure`).
    pub failure: u64,
    /// Inferences run, items counted (`nv_inference_count`).
    pub inference_count: u64,
    /// Model executions, batches counted (`nv_inference_exec_count`).
    pub exec_count: u64,
    /// Cumulative end-to-end time of answered requests, µs.
    pub request_us: f64,
    /// Cumulative time they waited in queues, µs.
    pub queue_us: f64,
    /// Cumulative time its inputs took to reach the model (hand-over and stacking), µs.
    pub compute_input_us: f64,
    /// Cumulative time the model computed, µs.
    pub compute_infer_us: f64,
    /// Cumulative time its outputs took to be split per request, µs.
    pub compute_output_us: f64,
    /// Requests arrived and not yet ended (`nv_inference_pending_request_count`).
    pub pending: u64,
}

/// Triton's per-model metric families (`nv_inference_request_success`, `…_failure`,
/// `nv_inference_count`, `nv_inference_exec_count`, `nv_inference_request_duration_us`,
/// `nv_inference_queue_duration_us`, `nv_inference_compute_input_duration_us`,
/// `nv_inference_compute_infer_duration_us`, `nv_inference_compute_output_duration_us`,
/// `nv_inference_pending_request_count`), labelled `model` and `version` as Triton
/// labels them, so its Grafana dashboards and autoscaling rules work unchanged.
pub fn render_triton(models: &[TritonModelMetrics]) -> String {
    let mut out = Exposition::default();
    for m in models {
        let labels = [("model", m.model.as_str()), ("version", m.version.as_str())];
        out.sample(
            "nv_inference_request_success",
            "counter",
            "Number of successful inference requests, all batch sizes",
            &labels,
            m.success as f64,
        );
        out.sample(
            "nv_inference_request_failure",
            "counter",
            "Number of failed inference requests, all batch sizes",
            &labels,
            m.failure as f64,
        );
        out.sample(
            "nv_inference_count",
            "counter",
            "Number of inferences performed (items, not batches)",
            &labels,
            m.inference_count as f64,
        );
        out.sample("nv_inference_exec_count", "counter", "Number of model executions performed (batches)", &labels, m.exec_count as f64);
        out.sample(
            "nv_inference_request_duration_us",
            "counter",
            "Cumulative inference request duration in microseconds",
            &labels,
            m.request_us,
        );
        out.sample(
            "nv_inference_queue_duration_us",
            "counter",
            "Cumulative inference queuing duration in microseconds",
            &labels,
            m.queue_us,
        );
        out.sample(
            "nv_inference_compute_input_duration_us",
            "counter",
            "Cumulative compute input duration in microseconds",
            &labels,
            m.compute_input_us,
        );
        out.sample(
            "nv_inference_compute_infer_duration_us",
            "counter",
            "Cumulative compute inference duration in microseconds",
            &labels,
            m.compute_infer_us,
        );
        out.sample(
            "nv_inference_compute_output_duration_us",
            "counter",
            "Cumulative compute output duration in microseconds",
            &labels,
            m.compute_output_us,
        );
        out.sample(
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution",
            &labels,
            m.pending as f64,
        );
    }
    out.finish()
}

/// Add one arm's metrics to `out`: per stream, counters of requests by outcome (so
/// `rate()` of the on-time counter is goodput) and histograms of latency and queueing
/// delay with buckets fitted to the stream's SLO, every series present from the start;
/// no aggregate series beside the per-stream ones (`sum` them).
pub fn render_arm(out: &mut Exposition, metrics: &ArmMetrics<'_>) {
    let arm = metrics.arm;
    let zero = Stats::default();
    for stream in &metrics.streams {
        let stats = stream.stats.unwrap_or(&zero);
        let labels = [("arm", arm), ("stream", stream.name)];
        out.sample("yardmaster_requests_arrived_total", "counter", "Requests received.", &labels, stats.arrivals as f64);
        for (outcome, count) in [
            ("on_time", stats.outcomes.on_time),
            ("late", stats.outcomes.late),
            ("dropped", stats.outcomes.dropped),
            ("failed", stats.outcomes.failed),
        ] {
            let labels = [("arm", arm), ("stream", stream.name), ("outcome", outcome)];
            out.sample("yardmaster_requests_ended_total", "counter", "Requests ended, by outcome.", &labels, count as f64);
        }
        let (latency, queue_delay) = match stream.distributions {
            Some((latency, queue_delay)) => (Some(latency), Some(queue_delay)),
            None => (None, None),
        };
        slo_histogram(
            out,
            "yardmaster_request_latency_seconds",
            "End-to-end latency of completed requests (buckets: fractions and multiples of the stream's SLO).",
            &labels,
            stream.slo_ns,
            latency,
        );
        slo_histogram(
            out,
            "yardmaster_queue_delay_seconds",
            "Time completed requests spent queued, over every stage (buckets as the latency's).",
            &labels,
            stream.slo_ns,
            queue_delay,
        );
        out.sample(
            "yardmaster_tokens_on_time_total",
            "counter",
            "Tokens of requests completed within their SLO (LLM pipelines).",
            &labels,
            stats.tokens_on_time as f64,
        );
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
    out.sample(
        "yardmaster_policy_memory_bytes",
        "gauge",
        "Linear memory of the answering policy instance after its latest call (0 while the built-in fallback answers).",
        &labels,
        policy.memory_bytes as f64,
    );
    out.sample(
        "yardmaster_policy_memory_peak_bytes",
        "gauge",
        "The most linear memory any instance of the arm's policy held.",
        &labels,
        policy.peak_memory_bytes as f64,
    );
    out.sample(
        "yardmaster_policy_infeasible_plans_total",
        "counter",
        "Plans the policy reported infeasible (its plan_infeasible metric above zero): no plan meets the SLO, it serves its own fallback plan.",
        &labels,
        policy.infeasible_plans() as f64,
    );
    for (name, emitted) in &policy.metrics {
        let labels = [("arm", arm), ("metric", name.as_str())];
        out.sample(
            "yardmaster_policy_emitted_values_total",
            "counter",
            "Values the policy emitted through the host (host.emit), by metric name.",
            &labels,
            emitted.count as f64,
        );
        out.sample(
            "yardmaster_policy_emitted_last",
            "gauge",
            "The latest value the policy emitted, by metric name.",
            &labels,
            emitted.last,
        );
    }
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

/// A histogram in seconds of the nanosecond values in `values` (none: every bucket at
/// 0), its bounds [`SLO_BUCKETS`] × `slo_ns`.
fn slo_histogram(out: &mut Exposition, name: &'static str, help: &str, labels: &[(&str, &str)], slo_ns: u64, values: Option<&Histogram>) {
    let mut buckets = Vec::with_capacity(SLO_BUCKETS.len() + 1);
    let mut below = 0;
    for fraction in SLO_BUCKETS {
        let bound_ns = (slo_ns as f64 * fraction) as u64;
        let at_most = values.map_or(0, |h| h.count_at_most(bound_ns));
        buckets.push((bound_ns as f64 / 1e9, at_most - below));
        below = at_most;
    }
    let (count, sum) = values.map_or((0, 0.0), |h| (h.count(), h.mean() * h.count() as f64 / 1e9));
    buckets.push((f64::INFINITY, count - below));
    out.histogram(name, help, labels, &buckets, sum);
}

/// Each of `known` with its count in `counts` (0 when absent), then any other kind
/// `counts` holds.
fn every_kind<'a>(known: &'a [&'static str], counts: &'a BTreeMap<&'static str, u64>) -> impl Iterator<Item = (&'static str, u64)> + 'a {
    let listed = known.iter().map(|kind| (*kind, counts.get(kind).copied().unwrap_or(0)));
    let others = counts.iter().filter(|(kind, _)| !known.contains(kind)).map(|(kind, count)| (*kind, *count));
    listed.chain(others)
}

/// The whole exposition of one engine, whose policy arm is named `arm`; call it on
/// in the engine's turn (through `ActorHandle::inspect`).
pub fn render_engine<C: Clock, X: Executor>(engine: &Engine<C, X>, arm: &str) -> String {
    let mut out = Exposition::new();
    render_one(&mut out, engine, arm, arm);
    out.finish()
}

/// The `arm` label of the arm in place `index`: `primary` for the arm serving
/// everything (and the control of an A/B run), `candidate` for the second arm of a run.
/// Stable across swaps and promotions, so dashboards and alerts keep their series; the
/// arm's name and policy are on `yardmaster_policy_info`.
pub fn stable_arm_label(index: usize) -> &'static str {
    if index == 0 {
        "primary"
    } else {
        "candidate"
    }
}

/// The exposition of every arm of a server (two during an A/B run), each series
/// labelled with its stable arm label ([`stable_arm_label`]).
pub fn render_arms<C: Clock, X: Executor>(arms: &Arms<C, X>) -> String {
    let mut out = Exposition::new();
    for (index, slot) in arms.slots().iter().enumerate() {
        render_one(&mut out, &slot.engine, stable_arm_label(index), &slot.label);
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

/// The live cluster's hosts (`[cluster]`, see `super::membership`), per host (labels
/// `host`, and `state` on the slots: local, live, left or lost):
/// `yardmaster_cluster_host_slots`, `yardmaster_cluster_host_workers`, the parameter
/// cache's `yardmaster_cluster_host_cache_bytes` and `…_cache_capacity_bytes`, and
/// `yardmaster_cluster_host_speed_ratio` (profiled over measured time of its batch
/// jobs, once it ran one); then `yardmaster_cluster_membership_changes_total` and the
/// wall time the last and the longest membership change held the engine.
///
/// `reports` are the engine's hosts (`Engine::host_reports`), matched by name.
pub fn render_cluster(status: &super::membership::ClusterStatus, reports: &[HostReport]) -> String {
    let mut out = Exposition::new();
    let report_of = |name: &str| reports.iter().find(|r| r.def.name == name);
    for host in &status.hosts {
        let labels = [("host", host.name.as_str()), ("state", host.state.name())];
        out.sample(
            "yardmaster_cluster_host_slots",
            "gauge",
            "Device slots each host of the cluster offers.",
            &labels,
            host.def().slots as f64,
        );
    }
    for host in &status.hosts {
        let labels = [("host", host.name.as_str())];
        let report = report_of(&host.name);
        let workers = report.map_or(0, |r| r.workers);
        out.sample("yardmaster_cluster_host_workers", "gauge", "Model workers running on each host.", &labels, workers as f64);
        out.sample(
            "yardmaster_cluster_host_cache_bytes",
            "gauge",
            "Bytes of model parameters each host caches (as the engine models its cache).",
            &labels,
            report.map_or(0, |r| r.cache_used) as f64,
        );
        out.sample(
            "yardmaster_cluster_host_cache_capacity_bytes",
            "gauge",
            "Parameter-cache capacity of each host.",
            &labels,
            host.cache_bytes as f64,
        );
    }
    for host in &status.hosts {
        if let Some(speed) = report_of(&host.name).and_then(|r| r.measured_speed) {
            out.sample(
                "yardmaster_cluster_host_speed_ratio",
                "gauge",
                "Profiled time over measured time of each host's batch jobs (1: as profiled; 2: twice as fast).",
                &[("host", host.name.as_str())],
                speed,
            );
        }
    }
    out.sample(
        "yardmaster_cluster_membership_changes_total",
        "counter",
        "Node joins, leaves and losses handed to the policy.",
        &[],
        status.changes as f64,
    );
    out.sample(
        "yardmaster_cluster_membership_pause_seconds",
        "gauge",
        "Wall time the last membership change held the engine.",
        &[],
        status.last_pause.as_secs_f64(),
    );
    out.sample(
        "yardmaster_cluster_membership_pause_max_seconds",
        "gauge",
        "The longest wall time a membership change held the engine.",
        &[],
        status.max_pause.as_secs_f64(),
    );
    out.finish()
}

/// Worker starts, from the executor's start log (`super::starts`):
/// `yardmaster_worker_starts_total{host,kind,predicted}` (kind: what the worker's
/// process did, warm from its model cache or cold from disk; predicted: what the
/// engine's model of the hosts' caches said), `yardmaster_worker_start_seconds_total{host,kind}`,
/// and `yardmaster_worker_starts_misplaced_total` (started on another host than the
/// engine seated them on; 0 unless placement is broken). `hosts` names the engine's
/// hosts by id.
pub fn render_worker_starts(counts: &[crate::starts::StartCount], misplaced: u64, hosts: &[String]) -> String {
    let mut out = Exposition::new();
    let kind = |warm: bool| if warm { "warm" } else { "cold" };
    let name = |host: u32| hosts.get(host as usize).cloned().unwrap_or_else(|| format!("host-{host}"));
    for count in counts {
        let host = name(count.host);
        out.sample(
            "yardmaster_worker_starts_total",
            "counter",
            "Worker starts by host, by what happened (warm: from the model cache) and what the engine predicted.",
            &[("host", &host), ("kind", kind(count.warm)), ("predicted", kind(count.predicted_warm))],
            count.starts as f64,
        );
    }
    let mut seconds: BTreeMap<(String, bool), f64> = BTreeMap::new();
    for count in counts {
        *seconds.entry((name(count.host), count.warm)).or_default() += count.seconds;
    }
    for ((host, warm), total) in &seconds {
        out.sample(
            "yardmaster_worker_start_seconds_total",
            "counter",
            "Time workers took to start (load their model), by host and start kind.",
            &[("host", host), ("kind", kind(*warm))],
            *total,
        );
    }
    out.sample(
        "yardmaster_worker_starts_misplaced_total",
        "counter",
        "Workers that started on another host than the engine seated them on.",
        &[],
        misplaced as f64,
    );
    out.finish()
}

/// One engine's series, labelled `arm`; `name` is the arm's own name (on the info series).
fn render_one<C: Clock, X: Executor>(out: &mut Exposition, engine: &Engine<C, X>, arm: &str, name: &str) {
    let state = engine.state();
    let accounting = engine.accounting();
    let summary = accounting.summary(state.now());
    let streams = state
        .pipeline()
        .streams
        .iter()
        .enumerate()
        .map(|(index, stream)| StreamMetrics {
            name: &stream.name,
            slo_ns: stream.slo_ns,
            stats: summary.streams.get(&(index as u32)),
            distributions: accounting.stream_distributions(index as u32),
        })
        .collect();
    let metrics = ArmMetrics { arm, streams, policy: engine.arm().stats(), engine: engine.stats() };
    render_arm(out, &metrics);
    let policy = engine.arm().module().map_or_else(|| engine.arm().instance_label(), |m| m.name().to_string());
    let sha256 = engine.arm().module().map(|m| m.sha256_hex()).unwrap_or_default();
    let state = super::swap::state_name(engine.arm().state());
    out.sample(
        "yardmaster_policy_info",
        "gauge",
        "The arm's name, the policy it runs (its name and SHA-256) and its state; always 1.",
        &[("arm", arm), ("name", name), ("policy", &policy), ("sha256", &sha256), ("state", state)],
        1.0,
    );
    out.sample(
        "yardmaster_requests_in_flight",
        "gauge",
        "Requests admitted and not yet ended.",
        &[("arm", arm)],
        engine.in_flight() as f64,
    );
    render_stage_loads(out, arm, &stage_loads(engine.state()));
}

/// What one stage holds now: the gauges a gateway's endpoint picker reads.
#[derive(Debug, Clone, PartialEq)]
pub struct StageLoad {
    /// The stage (the `stage` label).
    pub name: String,
    /// Requests (pieces) waiting at it: queued for the policy, handed back until a
    /// time, or waiting for their siblings at a fan-in.
    pub waiting: u64,
    /// Requests in a job running on one of its workers, or resident and paused on one
    /// (an LLM sequence between frames).
    pub running: u64,
    /// An LLM stage's KV cache: bytes resident and its workers' capacity.
    pub kv_cache: Option<(u64, u64)>,
}

/// Every stage's load, counted from the engine's pieces and workers (at scrape time).
pub fn stage_loads(state: &yardmaster_engine::ClusterState) -> Vec<StageLoad> {
    use yardmaster_engine::PieceState;
    use yardmaster_policy::contract::StageKind;
    let stages = &state.pipeline().stages;
    let mut loads: Vec<StageLoad> = stages
        .iter()
        .map(|s| StageLoad { name: s.name.clone(), waiting: 0, running: 0, kv_cache: (s.kind == StageKind::Iteration).then_some((0, 0)) })
        .collect();
    for piece in state.pieces().values() {
        let Some(load) = loads.get_mut(piece.request.stage as usize) else { continue };
        match piece.state {
            PieceState::Queued | PieceState::Deferred | PieceState::Merging => load.waiting += 1,
            PieceState::Running(_) | PieceState::Paused(_) => load.running += 1,
        }
    }
    for worker in state.workers().values() {
        if let Some(Some((used, capacity))) = loads.get_mut(worker.info.stage as usize).map(|l| l.kv_cache.as_mut()) {
            *used += worker.resident.values().sum::<u64>();
            *capacity += worker.info.memory_bytes;
        }
    }
    loads
}

/// `yardmaster_requests_waiting` and `yardmaster_requests_running` per stage, and
/// `yardmaster_kv_cache_usage_ratio` per LLM stage (0–1; 0 with no capacity yet).
pub fn render_stage_loads(out: &mut Exposition, arm: &str, loads: &[StageLoad]) {
    for load in loads {
        let labels = [("arm", arm), ("stage", load.name.as_str())];
        out.sample(
            "yardmaster_requests_waiting",
            "gauge",
            "Requests waiting at each stage (not in a running job).",
            &labels,
            load.waiting as f64,
        );
        out.sample(
            "yardmaster_requests_running",
            "gauge",
            "Requests in a running job at each stage (or resident between LLM frames).",
            &labels,
            load.running as f64,
        );
    }
    for load in loads {
        if let Some((used, capacity)) = load.kv_cache {
            let ratio = if capacity == 0 { 0.0 } else { used as f64 / capacity as f64 };
            let labels = [("arm", arm), ("stage", load.name.as_str())];
            out.sample(
                "yardmaster_kv_cache_usage_ratio",
                "gauge",
                "Fraction of an LLM stage's KV cache its resident sequences hold.",
                &labels,
                ratio,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_and_action_series_is_there_from_the_start() {
        let mut policy = ArmStats::default();
        policy.faults.insert("trap", 2);
        policy.faults.insert("a-kind-not-listed", 1);
        let engine = EngineStats::default();
        let mut out = Exposition::new();
        let quiet = StreamMetrics { name: "s", slo_ns: 200_000_000, stats: None, distributions: None };
        render_arm(&mut out, &ArmMetrics { arm: "a", streams: vec![quiet], policy: &policy, engine: &engine });
        let text = out.finish();
        for line in [
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"trap\"} 2",
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"timeout\"} 0",
            "yardmaster_policy_faults_total{arm=\"a\",kind=\"a-kind-not-listed\"} 1",
            "yardmaster_policy_actions_accepted_total{arm=\"a\",kind=\"dispatch\"} 0",
            "yardmaster_policy_actions_rejected_total{arm=\"a\",reason=\"over-capacity\"} 0",
            "yardmaster_requests_ended_total{arm=\"a\",stream=\"s\",outcome=\"on_time\"} 0",
            "yardmaster_request_latency_seconds_bucket{arm=\"a\",stream=\"s\",le=\"0.2\"} 0",
            "yardmaster_request_latency_seconds_count{arm=\"a\",stream=\"s\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn the_policy_s_memory_infeasible_plans_and_emitted_metrics_are_exposed() {
        use yardmaster_policy::arm::EmittedMetric;
        let mut policy = ArmStats { memory_bytes: 3 << 20, peak_memory_bytes: 5 << 20, ..ArmStats::default() };
        let flag = EmittedMetric { count: 7, positive: 2, sum: 2.0, last: 0.0, min: 0.0, max: 1.0 };
        policy.metrics.insert("loki.plan_infeasible".into(), flag);
        policy.metrics.insert("queue_depth".into(), EmittedMetric { count: 3, positive: 3, sum: 60.0, last: 12.5, min: 12.5, max: 30.0 });
        let engine = EngineStats::default();
        let mut out = Exposition::new();
        render_arm(&mut out, &ArmMetrics { arm: "a", streams: vec![], policy: &policy, engine: &engine });
        let text = out.finish();
        for line in [
            "yardmaster_policy_memory_bytes{arm=\"a\"} 3145728",
            "yardmaster_policy_memory_peak_bytes{arm=\"a\"} 5242880",
            "yardmaster_policy_infeasible_plans_total{arm=\"a\"} 2",
            "yardmaster_policy_emitted_values_total{arm=\"a\",metric=\"loki.plan_infeasible\"} 7",
            "yardmaster_policy_emitted_last{arm=\"a\",metric=\"queue_depth\"} 12.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn an_endpoint_picker_finds_waiting_running_and_kv_cache_gauges_per_stage() {
        let loads = [
            StageLoad { name: "detect".into(), waiting: 4, running: 2, kv_cache: None },
            StageLoad { name: "decode".into(), waiting: 0, running: 3, kv_cache: Some((1 << 30, 4 << 30)) },
        ];
        let mut out = Exposition::new();
        render_stage_loads(&mut out, "main", &loads);
        let text = out.finish();
        for line in [
            "yardmaster_requests_waiting{arm=\"main\",stage=\"detect\"} 4",
            "yardmaster_requests_running{arm=\"main\",stage=\"detect\"} 2",
            "yardmaster_requests_running{arm=\"main\",stage=\"decode\"} 3",
            "yardmaster_kv_cache_usage_ratio{arm=\"main\",stage=\"decode\"} 0.25",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("kv_cache_usage_ratio{arm=\"main\",stage=\"detect\"}"), "a batch stage has no KV cache");
    }

    #[test]
    fn the_cluster_s_hosts_show_cache_use_and_measured_speed() {
        use super::super::membership::{ClusterStatus, HostEntry, HostState};
        use yardmaster_engine::hosts::HostDef;
        let entry = |name: &str, state| HostEntry { name: name.into(), slots: 1, cache_bytes: 8 << 30, threads: 1, address: None, state };
        let status =
            ClusterStatus { hosts: vec![entry("node-0", HostState::Live), entry("node-1", HostState::Lost)], ..Default::default() };
        let report = |name: &str, speed| HostReport {
            def: HostDef::new(name, 1, 8 << 30),
            cache_used: 1 << 20,
            workers: 2,
            jobs: 10,
            measured_speed: speed,
        };
        let text = render_cluster(&status, &[report("node-0", Some(0.8)), report("node-1", None)]);
        for line in [
            "yardmaster_cluster_host_slots{host=\"node-1\",state=\"lost\"} 0",
            "yardmaster_cluster_host_workers{host=\"node-0\"} 2",
            "yardmaster_cluster_host_cache_bytes{host=\"node-0\"} 1048576",
            "yardmaster_cluster_host_cache_capacity_bytes{host=\"node-1\"} 8589934592",
            "yardmaster_cluster_host_speed_ratio{host=\"node-0\"} 0.8",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("speed_ratio{host=\"node-1\"}"), "no speed before a measured job");
    }

    #[test]
    fn worker_starts_are_labelled_by_host_kind_and_prediction() {
        use crate::starts::StartCount;
        let count = |host, predicted_warm, warm, starts, seconds| StartCount { host, predicted_warm, warm, starts, seconds };
        let counts = [count(1, false, false, 2, 0.5), count(1, true, true, 3, 0.25), count(2, true, false, 1, 0.5)];
        let text = render_worker_starts(&counts, 0, &["local".into(), "node-a".into(), "node-b".into()]);
        for line in [
            "yardmaster_worker_starts_total{host=\"node-a\",kind=\"warm\",predicted=\"warm\"} 3",
            "yardmaster_worker_starts_total{host=\"node-b\",kind=\"cold\",predicted=\"warm\"} 1",
            "yardmaster_worker_start_seconds_total{host=\"node-a\",kind=\"cold\"} 0.5",
            "yardmaster_worker_starts_misplaced_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn families_are_declared_once_and_labels_escaped() {
        let mut out = Exposition::new();
        out.sample("m_total", "counter", "Help.", &[("a", "x\"y")], 1.0);
        out.sample("m_total", "counter", "Help.", &[("a", "z")], 2.5);
        let text = out.finish();
        assert_eq!(text.matches("# TYPE m_total counter").count(), 1);
        assert!(text.contains("m_total{a=\"x\\\"y\"} 1\n"), "{text}");
        assert!(text.contains("m_total{a=\"z\"} 2.5\n"));
    }

    #[test]
    fn latency_histograms_have_buckets_fitted_to_the_slo() {
        let mut latency = Histogram::new();
        // SLO 100 ms: 10 requests at 20 ms, 5 at 95 ms, 2 at 300 ms, 1 at 1 s.
        for (ms, n) in [(20u64, 10), (95, 5), (300, 2), (1_000, 1)] {
            for _ in 0..n {
                latency.record(ms * 1_000_000);
            }
        }
        let stats = Stats { arrivals: 18, ..Stats::default() };
        let stream = StreamMetrics { name: "m", slo_ns: 100_000_000, stats: Some(&stats), distributions: Some((&latency, &latency)) };
        let (policy, engine) = (ArmStats::default(), EngineStats::default());
        let mut out = Exposition::new();
        render_arm(&mut out, &ArmMetrics { arm: "a", streams: vec![stream], policy: &policy, engine: &engine });
        let text = out.finish();
        let bucket = |le: &str| {
            let prefix = format!("yardmaster_request_latency_seconds_bucket{{arm=\"a\",stream=\"m\",le=\"{le}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no bucket {le}:\n{text}")).to_string()
        };
        assert_eq!(bucket("0.025"), "10", "at 25 % of the SLO");
        assert_eq!(bucket("0.1"), "15", "at the SLO");
        assert_eq!(bucket("0.4"), "17");
        assert_eq!(bucket("+Inf"), "18");
        assert!(text.contains("# TYPE yardmaster_request_latency_seconds histogram"), "{text}");
        assert!(!text.contains("stream=\"all\""), "no aggregate beside its parts");
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
