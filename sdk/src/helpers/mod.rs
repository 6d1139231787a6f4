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
//!
//! Everything here is plain `std` Rust, so it behaves the same compiled
//! natively and for WebAssembly.

pub mod ewma;
pub mod minmax_heap;
pub mod pid;
pub mod quantile;
pub mod window;

#[cfg(test)]
mod test_rng;

pub use ewma::{Ewma, TimeEwma};
pub use minmax_heap::MinMaxHeap;
pub use pid::Pid;
pub use quantile::{P2Quantile, WindowQuantile};
pub use window::{CountWindow, LinearWeightedWindow, SlidingWindow};
