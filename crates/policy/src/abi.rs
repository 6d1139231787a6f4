//! The canonical-ABI layout (wasm32) of the hot event records of the latest contract:
//! sizes, alignments, field offsets and discriminants that the fast lowering in
//! [`crate::fast_events`] writes by hand.
//!
//! These numbers are derived from the WIT, not invented: the crate's `abi` test computes
//! the layout of `wit/<latest>/` with wit-parser (the version wasmtime uses) and compares
//! it with every constant here — and with the layout table of
//! `policy-examples/zig/abi.zig` — so a contract change cannot silently misalign them.
//! In debug builds the fast lowering is also checked byte for byte against wasmtime's.

/// The `event` variant: a one-byte discriminant, then the case's payload.
pub mod event {
    /// Size of one `event` (the stride of a `list<event>`).
    pub const SIZE: usize = 120;
    /// Alignment of `event`.
    pub const ALIGN: usize = 8;
    /// Offset of every case's payload (the discriminant rounded up to the largest case's alignment).
    pub const PAYLOAD: usize = 8;
    /// Discriminant of `arrival(request)`.
    pub const ARRIVAL: u8 = 0;
    /// Discriminant of `worker-idle(worker-id)`.
    pub const WORKER_IDLE: u8 = 1;
    /// Discriminant of `batch-done(batch-outcome)`.
    pub const BATCH_DONE: u8 = 2;
}

/// The `request` record (the payload of `arrival`).
pub mod request {
    /// Size of `request`.
    pub const SIZE: usize = 112;
    /// Alignment of `request`.
    pub const ALIGN: usize = 8;
    /// `id: request-id` (u64).
    pub const ID: usize = 0;
    /// `origin: request-id` (u64).
    pub const ORIGIN: usize = 8;
    /// `stage: stage-id` (u32).
    pub const STAGE: usize = 16;
    /// `stream: stream-id` (u32).
    pub const STREAM: usize = 20;
    /// `sent-at: instant` (u64).
    pub const SENT_AT: usize = 24;
    /// `arrived-at: instant` (u64).
    pub const ARRIVED_AT: usize = 32;
    /// `deadline: instant` (u64).
    pub const DEADLINE: usize = 40;
    /// `priority: u32`.
    pub const PRIORITY: usize = 48;
    /// `input-size: u32`.
    pub const INPUT_SIZE: usize = 52;
    /// `expected-tokens: u32`.
    pub const EXPECTED_TOKENS: usize = 56;
    /// `requeues: u32`.
    pub const REQUEUES: usize = 60;
    /// `tags: option<list<tag>>`: its discriminant byte (0 is `none`).
    pub const TAGS: usize = 64;
    /// `items: u32`.
    pub const ITEMS: usize = 76;
    /// `correlation: option<correlation>`: its discriminant byte (0 is `none`), then
    /// the record at [`CORRELATION_PAYLOAD`].
    pub const CORRELATION: usize = 80;
    /// Offset of the `correlation` record inside the request (its option's payload).
    pub const CORRELATION_PAYLOAD: usize = 88;
}

/// The `correlation` record (a request's place in a stateful sequence).
pub mod correlation {
    /// `id: u64`.
    pub const ID: usize = 0;
    /// `start: bool` (one byte).
    pub const START: usize = 8;
    /// `end: bool` (one byte).
    pub const END: usize = 9;
    /// `worker: option<worker-id>`: its discriminant byte (0 is `none`), then the id at
    /// [`WORKER_ID`].
    pub const WORKER: usize = 12;
    /// The worker id inside `worker`'s option.
    pub const WORKER_ID: usize = 16;
}

/// The `batch-outcome` record (the payload of `batch-done`).
pub mod batch_outcome {
    /// Size of `batch-outcome`.
    pub const SIZE: usize = 32;
    /// Alignment of `batch-outcome`.
    pub const ALIGN: usize = 8;
    /// `worker: worker-id` (u32).
    pub const WORKER: usize = 0;
    /// `started-at: instant` (u64).
    pub const STARTED_AT: usize = 8;
    /// `duration: duration` (u64).
    pub const DURATION: usize = 16;
    /// `results: list<request-result>`: the list's pointer (u32), then its length (u32).
    pub const RESULTS: usize = 24;
}

/// The `request-result` record (an element of `batch-outcome.results`).
pub mod request_result {
    /// Size of `request-result` (the stride of its list).
    pub const SIZE: usize = 16;
    /// Alignment of `request-result`.
    pub const ALIGN: usize = 8;
    /// `id: request-id` (u64).
    pub const ID: usize = 0;
    /// `status: request-status` (a one-byte enum).
    pub const STATUS: usize = 8;
    /// `tokens: u32`.
    pub const TOKENS: usize = 12;
    /// Discriminant of `request-status.ok`.
    pub const STATUS_OK: u8 = 0;
    /// Discriminant of `request-status.failed`.
    pub const STATUS_FAILED: u8 = 1;
}

/// The `action` variant (an element of the `list<action>` `handle` returns): a one-byte
/// discriminant, then the case's payload.
pub mod action {
    /// Size of one `action` (the stride of a `list<action>`).
    pub const SIZE: usize = 32;
    /// Alignment of `action`.
    pub const ALIGN: usize = 8;
    /// Offset of every case's payload.
    pub const PAYLOAD: usize = 8;
    /// Discriminant of `drop(drop-request)`.
    pub const DROP: u8 = 0;
    /// Discriminant of `dispatch(dispatch)`.
    pub const DISPATCH: u8 = 1;
}

/// The `drop-request` record (the payload of `drop`).
pub mod drop_request {
    /// `request: request-id` (u64).
    pub const REQUEST: usize = 0;
    /// `reason: drop-reason` (a one-byte enum).
    pub const REASON: usize = 8;
    /// Cases of `drop-reason` (its discriminants are 0 to `REASONS - 1`).
    pub const REASONS: u8 = 5;
}

/// The `dispatch` record (the payload of `dispatch`).
pub mod dispatch {
    /// `worker: worker-id` (u32).
    pub const WORKER: usize = 0;
    /// `requests: list<request-id>`: the list's pointer (u32), then its length (u32).
    pub const REQUESTS: usize = 4;
    /// `variant: option<variant-id>`: its discriminant byte (0 is `none`), then the id
    /// at [`VARIANT_ID`].
    pub const VARIANT: usize = 12;
    /// The variant id inside `variant`'s option.
    pub const VARIANT_ID: usize = 16;
}
