//! The data structures the reference policies share.
//!
//! * [`MinMaxHeap`]: a double-ended priority queue, for schedulers that serve
//!   (or shed) from either end of a priority order.
//! * [`SlidingWindow`], [`LinearWeightedWindow`] and [`CountWindow`]: windows
//!   over recent samples, by time or by count.
//! * [`Ewma`] and [`TimeEwma`]: exponentially weighted moving averages, per
//!   sample or per unit of elapsed time.
//! * [`P2Quantile`] and [`WindowQuantile`]: streaming and windowed quantiles.
//! * [`Pid`]: a PID controller with anti-windup.
//! * [`StageGraph`]: the pipeline graph (downstream paths, levels, longest paths).
//! * [`EntryShedder`]: admission at a pipeline's entry from the share of pieces its
//!   later stages drop.
//! * [`NexusPlan`] and [`ScalingPlanner`]: Nexus-style SLO split, batch sizes and
//!   replica counts for a pipeline.
//! * [`BatchBroker`]: per-worker queues and open batches with round-robin
//!   dispatch, for pipeline policies whose [`Discipline`] picks and drops;
//!   [`BrokeredPipeline`] makes a whole policy of a [`PipelineRule`] with them.
//! * [`ModelCatalog`]: the models (stage, variant) of a multi-model cluster, the
//!   model each stream needs, and batch latencies and budgets per model.
//! * [`milp`]: a branch-and-bound mixed-integer linear program solver with node,
//!   pivot and clock budgets and warm starts.
//! * [`mmc_sojourn`] and friends: M/M/c (Erlang-C) latency for capacity planning.
//! * [`StageFifo`]: per-stage FIFO queues that dispatch to idle workers and measure
//!   time-averaged queue length and per-stage sojourn time; [`ScaledFifo`] makes
//!   a whole autoscaling policy of a [`ScalingRule`] with them.
//! * [`LengthEstimator`]: a survival-conditioned quantile estimator of LLM output
//!   lengths, learned online.
//! * [`LlmBook`], [`plan_by_rank`], [`idle_iteration_workers`],
//!   [`resume_resident`] and [`dispatch_idle`]: the live request table of an LLM
//!   (iteration-level) policy, service classes, KV footprints, frame plans, the
//!   workers to plan frames for and the paused sequences to continue.
//! * [`RankedLlm`]: a whole LLM baseline policy given a [`Ranking`] (FCFS, EDF, SJF).
//! * [`replica_bounds`] and [`is_offline`]: a policy's replica limits narrowed to a
//!   stage's, an offline stage (its model out of service) allowing none.
//!
//! Everything here is plain `std` Rust, so it behaves the same compiled
//! natively and for WebAssembly.

pub mod batch_broker;
pub mod compound;
pub mod ewma;
pub mod fifo_policy;
pub mod length;
pub mod llm;
pub mod milp;
pub mod minmax_heap;
pub mod models;
pub mod nexus_planner;
pub mod pid;
pub mod pipeline_policy;
pub mod quantile;
pub mod queueing;
pub mod ranked;
pub mod replicas;
pub mod shed;
pub mod stage_fifo;
pub mod stage_graph;
pub mod window;

#[cfg(test)]
mod test_rng;

pub use batch_broker::{
    Admitted, BatchBroker, Discipline, FifoQueue, FillContext, Filled, PriorityQueue, Queued, RunningBatch, WorkerQueue, WorkerSlot,
};
pub use ewma::{Ewma, TimeEwma};
pub use fifo_policy::{ScaledFifo, ScalingRule};
pub use length::LengthEstimator;
pub use llm::{
    dispatch_idle, idle_iteration_workers, plan_by_rank, resume_resident, BatchStageFifo, Finished, FramePlan, LlmBook, LlmRequest,
    Preemption, Residence, ServiceClass,
};
pub use minmax_heap::MinMaxHeap;
pub use models::{ModelCatalog, ModelInfo};
pub use nexus_planner::{pieces_per_request, NexusPlan, ScalingPlanner};
pub use pid::Pid;
pub use pipeline_policy::{planned_replicas, BrokeredPipeline, PipelineRule};
pub use quantile::{P2Quantile, WindowQuantile};
pub use queueing::{erlang_c, mmc_min_servers, mmc_sojourn};
pub use ranked::{RankedLlm, Ranking};
pub use replicas::{bottleneck_fill, is_offline, replica_bounds};
pub use shed::EntryShedder;
pub use stage_fifo::StageFifo;
pub use stage_graph::StageGraph;
pub use window::{CountWindow, LinearWeightedWindow, SlidingWindow};
