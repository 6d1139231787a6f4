//! A/B runs: two policies on live traffic, each scheduling its own share of the
//! workers, compared with confidence intervals.
//!
//! - [`split`]: which arm a request goes to (by ratio, stream or client key);
//! - [`arms`]: the server's engines — one, or two during a run — and how a run starts
//!   and ends (promote, roll back) without losing or repeating a request;
//! - [`stats`]: each arm's tally and the comparison an operator reads
//!   (`yardmaster ab report`).

pub mod arms;
pub mod split;
pub mod stats;

pub use arms::{AbStatus, ArmEngine, ArmSlot, ArmStatus, Arms};
pub use split::{key_hash, Split, SplitBy, KEY_HEADER};
pub use stats::{compare, AbReport, ArmFigures, ArmTally, Difference};
