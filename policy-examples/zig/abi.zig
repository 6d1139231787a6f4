//! The WIT types of `yardmaster:policy@0.1.0` (../../wit/0.1.0/policy.wit) as the
//! component model's canonical ABI lays them out in linear memory on wasm32. An `extern
//! struct` has C layout, which for these records is exactly the canonical one: fields in
//! order, each at its natural alignment; `bool` and enums are one byte; strings and lists
//! are a (pointer, length) pair; an `option` or a variant is a one-byte discriminant
//! followed by its payload at the payload's alignment. Only what the policy reads or
//! writes is spelled out; unused cases are sized by a padding member. The table
//! `canonical_layouts` at the end states every type's canonical size, alignment and field
//! offsets: the comptime block checks the structs against it, and a test of the host
//! (crates/policy/tests/all/abi.rs) checks it against the WIT.

/// A `list<T>` (or `string` when T is u8).
pub fn List(comptime T: type) type {
    return extern struct {
        ptr: [*]const T,
        len: usize,

        pub fn slice(self: @This()) []const T {
            return if (self.len == 0) &.{} else self.ptr[0..self.len];
        }
    };
}

pub const String = List(u8);

pub const LatencyPoint = extern struct { batch: u32, mean: u64, tail: u64 };

pub const Variant = extern struct {
    id: u32,
    name: String,
    accuracy: f64,
    profile: List(LatencyPoint),
    memory_bytes: u64,
    fan_out: f64,
};

pub const Stage = extern struct {
    id: u32,
    name: String,
    /// `stage-kind`: 0 batch, 1 iteration.
    kind: u8,
    successors: List(u32),
    predecessors: List(u32),
    variants: List(Variant),
    max_batch: u32,
    min_replicas: u32,
    max_replicas: u32,
};

pub const Worker = extern struct {
    id: u32,
    stage: u32,
    variant: u32,
    device: u8,
    threads: u32,
    memory_bytes: u64,
};

pub const Param = extern struct { key: String, value: String };

pub const Tag = extern struct { key: String, value: String };

pub const OptionTags = extern struct { is_some: u8, value: List(Tag) };

pub const Request = extern struct {
    id: u64,
    origin: u64,
    stage: u32,
    stream: u32,
    sent_at: u64,
    arrived_at: u64,
    deadline: u64,
    priority: u32,
    input_size: u32,
    expected_tokens: u32,
    requeues: u32,
    tags: OptionTags,
};

pub const RequestResult = extern struct { id: u64, status: u8, tokens: u32 };

pub const BatchOutcome = extern struct {
    worker: u32,
    started_at: u64,
    duration: u64,
    results: List(RequestResult),
};

pub const SequenceState = extern struct { id: u64, generated: u32, kv_bytes: u64, finished: u8 };

pub const FrameReport = extern struct {
    worker: u32,
    steps: u32,
    duration: u64,
    sequences: List(SequenceState),
    kv_capacity: u64,
};

pub const StageStats = extern struct {
    stage: u32,
    queue_length: u32,
    queue_delay: u64,
    arrival_rate: f64,
    throughput: f64,
    mean_batch: f64,
    replicas: u32,
    starting: u32,
    batch_limit: u32,
};

pub const WorkerStats = extern struct {
    worker: u32,
    stage: u32,
    variant: u32,
    busy: u8,
    utilisation: f64,
    last_batch: u32,
    threads: u32,
    memory_used: u64,
    memory_capacity: u64,
};

pub const Snapshot = extern struct {
    at: u64,
    stages: List(StageStats),
    workers: List(WorkerStats),
    host_memory_used: u64,
    host_memory_capacity: u64,
};

pub const RequestEnded = extern struct { id: u64, reason: u8 };

pub const EventTag = enum(u8) {
    arrival,
    worker_idle,
    batch_done,
    frame,
    tick,
    timer,
    worker_added,
    worker_removed,
    request_ended,
};

pub const Event = extern struct {
    tag: EventTag,
    payload: extern union {
        arrival: Request,
        worker_idle: u32,
        batch_done: BatchOutcome,
        frame: FrameReport,
        tick: Snapshot,
        timer: u64,
        worker_added: Worker,
        worker_removed: u32,
        request_ended: RequestEnded,
    },
};

pub const DropReason = enum(u8) { deadline_unreachable, overload, queue_full, preempted, policy };

pub const OptionU32 = extern struct { is_some: u8, value: u32 };

pub const DropRequest = extern struct { request: u64, reason: DropReason };

pub const Dispatch = extern struct { worker: u32, requests: List(u64), variant: OptionU32 };

pub const Scale = extern struct { stage: u32, replicas: u32, variant: OptionU32 };

pub const ActionTag = enum(u8) {
    drop,
    dispatch,
    preempt,
    evict,
    scale,
    set_variant,
    set_routes,
    set_batch_limit,
    set_threads,
    defer_request,
    set_timer,
};

pub const Action = extern struct {
    tag: ActionTag,
    payload: extern union {
        drop: DropRequest,
        dispatch: Dispatch,
        scale: Scale,
        /// The largest case (`set-routes`: 20 bytes) rounded to the union's alignment.
        padding: [3]u64,
    },
};

/// `result<list<action>, string>`: a discriminant, then the list or the error string.
pub const InitResult = extern struct { is_err: u8, payload: String };

/// The canonical layout of every type above, one line each, read by the host's ABI test:
/// `.{ ZigType, "wit-type", size, alignment, .{ offset of each field, in order } }`.
/// The WIT type is a type of the `types` interface, `TYPE.MEMBER` (a record's field or a
/// variant's case payload), or `FUNC()` (the result of a `policy` function). A variant,
/// `option` or `result` is laid out as `{ discriminant, payload }`.
pub const canonical_layouts = .{
    .{ LatencyPoint, "latency-point", 24, 8, .{ 0, 8, 16 } },
    .{ Variant, "variant", 48, 8, .{ 0, 4, 16, 24, 32, 40 } },
    .{ Stage, "stage", 52, 4, .{ 0, 4, 12, 16, 24, 32, 40, 44, 48 } },
    .{ Worker, "worker", 32, 8, .{ 0, 4, 8, 12, 16, 24 } },
    .{ Param, "param", 16, 4, .{ 0, 8 } },
    .{ Tag, "tag", 16, 4, .{ 0, 8 } },
    .{ OptionTags, "request.tags", 12, 4, .{ 0, 4 } },
    .{ Request, "request", 80, 8, .{ 0, 8, 16, 20, 24, 32, 40, 48, 52, 56, 60, 64 } },
    .{ RequestResult, "request-result", 16, 8, .{ 0, 8, 12 } },
    .{ BatchOutcome, "batch-outcome", 32, 8, .{ 0, 8, 16, 24 } },
    .{ SequenceState, "sequence-state", 32, 8, .{ 0, 8, 16, 24 } },
    .{ FrameReport, "frame-report", 32, 8, .{ 0, 4, 8, 16, 24 } },
    .{ StageStats, "stage-stats", 56, 8, .{ 0, 4, 8, 16, 24, 32, 40, 44, 48 } },
    .{ WorkerStats, "worker-stats", 48, 8, .{ 0, 4, 8, 12, 16, 24, 28, 32, 40 } },
    .{ Snapshot, "snapshot", 40, 8, .{ 0, 8, 16, 24, 32 } },
    .{ RequestEnded, "event.request-ended", 16, 8, .{ 0, 8 } },
    .{ Event, "event", 88, 8, .{ 0, 8 } },
    .{ OptionU32, "dispatch.variant", 8, 4, .{ 0, 4 } },
    .{ DropRequest, "drop-request", 16, 8, .{ 0, 8 } },
    .{ Dispatch, "dispatch", 20, 4, .{ 0, 4, 12 } },
    .{ Scale, "scale", 16, 4, .{ 0, 4, 8 } },
    .{ Action, "action", 32, 8, .{ 0, 8 } },
    .{ InitResult, "init()", 12, 4, .{ 0, 4 } },
};

comptime {
    // Every struct has the canonical layout stated in the table.
    for (canonical_layouts) |layout| {
        const T = layout[0];
        const name = @typeName(T);
        if (@sizeOf(T) != layout[2]) @compileError(name ++ " does not have its canonical size");
        if (@alignOf(T) != layout[3]) @compileError(name ++ " does not have its canonical alignment");
        const fields = @typeInfo(T).@"struct".field_names;
        if (fields.len != layout[4].len) @compileError(name ++ " does not have one offset per field in canonical_layouts");
        for (fields, 0..) |field, i| {
            if (@offsetOf(T, field) != layout[4][i]) @compileError(name ++ "." ++ field ++ " is not at its canonical offset");
        }
    }
}
