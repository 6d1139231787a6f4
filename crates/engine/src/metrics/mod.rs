//! Metrics accounting: the one definition of every metric, used by the live server
//! and the simulator alike (the simulator's reports and plots are `yardmaster_sim::report`).
//!
//! All times are `u64` nanoseconds. A request *ends* exactly once: it completes (on
//! time when its completion time ≤ its deadline, else late), is dropped, or fails.
//!
//! | metric | definition |
//! |---|---|
//! | goodput | requests completed on time per second of elapsed time |
//! | token goodput | tokens of the requests completed on time, per second (LLMs) |
//! | drop rate | (dropped + completed late) / ended; failed requests count in the denominator only, and are reported separately as `failed` |
//! | SLO attainment | completed on time / ended |
//! | invalid rate | accelerator time spent on requests that were dropped or completed late / all accelerator time; a batch's duration is shared equally by its requests |
//! | latency p50, p90, p95, p99, max | of the end-to-end latency (completion − sent) of completed requests (on time or late) |
//! | queue delay mean, p99 | of the total per-stage queueing time of completed requests |
//! | utilisation | busy accelerator time / (workers × elapsed), the number of workers integrated over time |
//! | GPU-seconds | ∫ active workers dt |
//! | pipeline accuracy | mean over completed requests of the product of the accuracies of the variants that served each stage they passed |
//! | LLM goodput (by class) | see [`llm_goodput`]: LS tokens on their timeline, DS/BE/CP requests by their deadline |
//! | optimal goodput bound | per window: min(offered rate, capacity), the capacity (req/s) given by the caller; over a run: the duration-weighted mean over windows |
//!
//! - [`account`]: [`Accounting`], fed incrementally by the engine, gives the
//!   [`Summary`] (overall and per stream) and the per-window time series ([`Window`]);
//! - [`llm_goodput`]: goodput of LLM serving by service class (CALM's definitions);
//! - [`histogram`]: [`Histogram`], the log-bucketed latency histogram (≤ 1 % error);

pub mod account;
pub mod histogram;
pub mod llm_goodput;

pub use account::{
    Accounting, BatchRecord, Class, Outcome, Outcomes, Percentiles, RequestEnd, StageWork, Stats, Summary, Window, DEFAULT_WINDOW,
};
pub use histogram::Histogram;
pub use llm_goodput::{ClassGoodput, LlmGoodput, LlmGoodputSummary};
