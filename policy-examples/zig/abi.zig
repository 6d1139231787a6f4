//! The WIT types of `yardmaster:policy@0.1.0` (../../wit/policy.wit) as the component
//! model's canonical ABI lays them out in linear memory on wasm32. An `extern struct`
//! has C layout, which for these records is exactly the canonical one: fields in order,
//! each at its natural alignment; `bool` and enums are one byte; strings and lists are a
//! (pointer, length) pair; an `option` or a variant is a one-byte discriminant followed
//! by its payload at the payload's alignment. Only what the policy reads or writes is
//! spelled out; unused cases are sized by a padding member.

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

comptime {
    // The canonical sizes, checked against the WIT (see the module docs).
    const expect = struct {
        fn size(comptime T: type, comptime n: usize) void {
            if (@sizeOf(T) != n) @compileError(@typeName(T) ++ " does not have its canonical size");
        }
    };
    expect.size(Variant, 48);
    expect.size(Stage, 52);
    expect.size(Worker, 32);
    expect.size(Request, 80);
    expect.size(SequenceState, 32);
    expect.size(FrameReport, 32);
    expect.size(StageStats, 56);
    expect.size(WorkerStats, 48);
    expect.size(Snapshot, 40);
    expect.size(Event, 88);
    expect.size(Dispatch, 20);
    expect.size(Action, 32);
    expect.size(InitResult, 12);
}
