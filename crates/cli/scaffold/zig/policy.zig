//! {{name}}: earliest deadline first, in Zig.
//!
//! - Each stage keeps its waiting requests ordered by (deadline, id).
//! - A request that cannot finish even alone on the stage's fastest variant is dropped
//!   when it arrives (deadline-unreachable); so is a queue head that cannot finish
//!   alone on the worker about to take it.
//! - Once per call, every idle worker (lowest id first) gets its resident LLM
//!   sequences, then the most urgent requests, as many as keep the earliest deadline in
//!   the batch reachable.
//!
//! There is no bindings generator for Zig, so this file speaks the component model's
//! canonical ABI itself: `abi.zig` mirrors the WIT records as `extern struct`s (whose C
//! layout is the canonical layout), the two exports take their arguments flattened or
//! through memory as the ABI says, and `cabi_realloc` hands the host memory for
//! arguments, released when the call returns. `build.sh` compiles it for
//! `wasm32-freestanding` (no WASI at all) and wraps the core module into a component.

const std = @import("std");
const abi = @import("abi.zig");

const gpa = std.heap.wasm_allocator;
const U64_MAX: u64 = std.math.maxInt(u64);

// Host imports are declared like this one (levels: 0 trace, 1 debug, 2 info, 3 warn, 4 error).
extern "yardmaster:policy/host@{{contract}}" fn log(level: i32, ptr: [*]const u8, len: usize) void;

// -- memory the host lowers arguments into ---------------------------------------------

const Block = struct { ptr: [*]u8, len: usize, alignment: std.mem.Alignment };
var argument_blocks: std.ArrayList(Block) = .empty;

/// The canonical ABI's allocator: the host asks for memory to lower call arguments
/// into. Every block lives until the end of the call (`releaseArguments`).
export fn cabi_realloc(old_ptr: ?[*]u8, old_len: usize, alignment: usize, new_len: usize) ?[*]u8 {
    const al = std.mem.Alignment.fromByteUnits(alignment);
    const ptr = gpa.rawAlloc(@max(new_len, 1), al, @returnAddress()) orelse @trap();
    if (old_ptr) |old| @memcpy(ptr[0..@min(old_len, new_len)], old[0..@min(old_len, new_len)]);
    argument_blocks.append(gpa, .{ .ptr = ptr, .len = @max(new_len, 1), .alignment = al }) catch @trap();
    return ptr;
}

fn releaseArguments() void {
    for (argument_blocks.items) |block| gpa.rawFree(block.ptr[0..block.len], block.alignment, @returnAddress());
    argument_blocks.clearRetainingCapacity();
}

// -- the policy's state ----------------------------------------------------------------

const Point = struct { batch: u32, mean: u64 };
const Profile = struct { stage: u32, variant: u32, points: []Point };
const Entry = struct { deadline: u64, id: u64 };
const WorkerInfo = struct { id: u32, stage: u32, variant: u32 };
const Resident = struct { worker: u32, ids: std.ArrayList(u64) };
const Queued = struct { stage: usize, deadline: u64 };

const StageState = struct {
    id: u32,
    limit: usize,
    fastest_single: u64,
    /// Waiting requests, sorted by (deadline, id).
    queue: std.ArrayList(Entry) = .empty,
    /// Idle workers, ascending ids.
    idle: std.ArrayList(u32) = .empty,
};

var profiles: std.ArrayList(Profile) = .empty;
var stages: std.ArrayList(StageState) = .empty;
var workers: std.ArrayList(WorkerInfo) = .empty;
var residents: std.ArrayList(Resident) = .empty;
var queued: std.AutoHashMapUnmanaged(u64, Queued) = .empty;
var now: u64 = 0;

/// The answer of the current call; it stays valid until the next call.
var actions: std.ArrayList(abi.Action) = .empty;
/// Request lists of the dispatches in `actions`.
var batches: std.ArrayList([]u64) = .empty;

fn oom() noreturn {
    @trap();
}

// -- latency profiles ------------------------------------------------------------------

/// Rust's f64::round for x >= 0: halves go up.
fn roundHalfAway(x: f64) f64 {
    const f = @floor(x);
    return if (x - f >= 0.5) f + 1 else f;
}

/// The host's interpolation rule: linear between points, linear past the last two, the
/// first point's value below the start.
fn interpolate(points: []const Point, requested: u32) ?u64 {
    const batch = @max(requested, 1);
    if (points.len == 0) return null;
    if (points.len == 1 or batch <= points[0].batch) return points[0].mean;
    var upper: usize = 0;
    while (upper < points.len and points[upper].batch < batch) upper += 1;
    upper = std.math.clamp(upper, 1, points.len - 1);
    const lo = points[upper - 1];
    const hi = points[upper];
    if (batch == hi.batch) return hi.mean;
    const lo_batch: f64 = @floatFromInt(lo.batch);
    const hi_batch: f64 = @floatFromInt(hi.batch);
    const lo_mean: f64 = @floatFromInt(lo.mean);
    const hi_mean: f64 = @floatFromInt(hi.mean);
    const slope = (hi_mean - lo_mean) / (hi_batch - lo_batch);
    const b: f64 = @floatFromInt(batch);
    const rounded = roundHalfAway(@max(lo_mean + slope * (b - lo_batch), 0.0));
    if (rounded >= 18446744073709551615.0) return U64_MAX;
    return @intFromFloat(rounded);
}

fn profileOf(stage: u32, variant: u32) []const Point {
    for (profiles.items) |p| {
        if (p.stage == stage and p.variant == variant) return p.points;
    }
    return &.{};
}

// -- bookkeeping (what the Rust SDK's Ctx does) ------------------------------------------

fn stageIndex(id: u32) ?usize {
    for (stages.items, 0..) |s, i| {
        if (s.id == id) return i;
    }
    return null;
}

fn workerIndex(id: u32) ?usize {
    for (workers.items, 0..) |w, i| {
        if (w.id == id) return i;
    }
    return null;
}

fn setIdle(worker: u32, idle: bool) void {
    const w = workerIndex(worker) orelse return;
    const s = stageIndex(workers.items[w].stage) orelse return;
    const list = &stages.items[s].idle;
    var at: usize = 0;
    while (at < list.items.len and list.items[at] < worker) at += 1;
    const present = at < list.items.len and list.items[at] == worker;
    if (idle and !present) list.insert(gpa, at, worker) catch oom();
    if (!idle and present) _ = list.orderedRemove(at);
}

fn residentOf(worker: u32) ?*Resident {
    for (residents.items) |*r| {
        if (r.worker == worker) return r;
    }
    return null;
}

fn lowerBound(queue: []const Entry, entry: Entry) usize {
    var lo: usize = 0;
    var hi: usize = queue.len;
    while (lo < hi) {
        const mid = (lo + hi) / 2;
        const m = queue[mid];
        if (m.deadline < entry.deadline or (m.deadline == entry.deadline and m.id < entry.id)) lo = mid + 1 else hi = mid;
    }
    return lo;
}

/// The request leaves its queue and every resident list.
fn forget(id: u64) void {
    for (residents.items) |*r| {
        var i: usize = 0;
        while (i < r.ids.items.len) {
            if (r.ids.items[i] == id) {
                _ = r.ids.orderedRemove(i);
            } else i += 1;
        }
    }
    const q = queued.get(id) orelse return;
    const queue = &stages.items[q.stage].queue;
    const at = lowerBound(queue.items, .{ .deadline = q.deadline, .id = id });
    if (at < queue.items.len and queue.items[at].id == id) _ = queue.orderedRemove(at);
    _ = queued.remove(id);
}

fn batchLatency(worker: u32, batch: u32) u64 {
    const w = workerIndex(worker) orelse return 0;
    return interpolate(profileOf(workers.items[w].stage, workers.items[w].variant), batch) orelse 0;
}

fn dropRequest(id: u64, reason: abi.DropReason) void {
    forget(id);
    actions.append(gpa, .{ .tag = .drop, .payload = .{ .drop = .{ .request = id, .reason = reason } } }) catch oom();
}

// -- init ------------------------------------------------------------------------------

var init_return: abi.InitResult = undefined;

fn setUp(config_stages: []const abi.Stage, config_workers: []const abi.Worker) void {
    for (config_stages) |stage| {
        var fastest: ?u64 = null;
        for (stage.variants.slice()) |v| {
            const points = gpa.alloc(Point, v.profile.len) catch oom();
            for (v.profile.slice(), 0..) |p, i| points[i] = .{ .batch = p.batch, .mean = p.mean };
            std.sort.insertion(Point, points, {}, struct {
                fn less(_: void, a: Point, b: Point) bool {
                    return a.batch < b.batch;
                }
            }.less);
            profiles.append(gpa, .{ .stage = stage.id, .variant = v.id, .points = points }) catch oom();
            if (interpolate(points, 1)) |single| {
                if (fastest == null or single < fastest.?) fastest = single;
            }
        }
        stages.append(gpa, .{ .id = stage.id, .limit = @max(stage.max_batch, 1), .fastest_single = fastest orelse 0 }) catch oom();
    }
    for (config_workers) |w| workers.append(gpa, .{ .id = w.id, .stage = w.stage, .variant = w.variant }) catch oom();
}

/// `init(config)`: the config record's fields, flattened (a string or list is a pointer
/// and a length). Return `.is_err = 1` with a message to refuse the configuration.
export fn @"yardmaster:policy/policy@{{contract}}#init"(
    arm_ptr: [*]const u8,
    arm_len: usize,
    stages_ptr: [*]const abi.Stage,
    stages_len: usize,
    workers_ptr: [*]const abi.Worker,
    workers_len: usize,
    streams_ptr: usize,
    streams_len: usize,
    params_ptr: [*]const abi.Param,
    params_len: usize,
    tick_interval: u64,
    max_workers: u32,
    seed: u64,
    config_now: u64,
) *abi.InitResult {
    _ = .{ arm_ptr, arm_len, streams_ptr, streams_len, params_ptr, params_len, tick_interval, max_workers, seed };
    defer releaseArguments();
    now = config_now;
    setUp(stages_ptr[0..stages_len], workers_ptr[0..workers_len]);
    init_return = .{ .is_err = 0, .payload = .{ .ptr = undefined, .len = 0 } };
    return &init_return;
}

// -- handle ----------------------------------------------------------------------------

fn onArrival(r: *const abi.Request) void {
    const s = stageIndex(r.stage) orelse {
        dropRequest(r.id, .policy);
        return;
    };
    const stage = &stages.items[s];
    if (now +| stage.fastest_single > r.deadline) {
        dropRequest(r.id, .deadline_unreachable);
        return;
    }
    const entry: Entry = .{ .deadline = r.deadline, .id = r.id };
    stage.queue.insert(gpa, lowerBound(stage.queue.items, entry), entry) catch oom();
    queued.put(gpa, r.id, .{ .stage = s, .deadline = r.deadline }) catch oom();
}

fn onFrame(frame: *const abi.FrameReport) void {
    const entry = residentOf(frame.worker) orelse blk: {
        residents.append(gpa, .{ .worker = frame.worker, .ids = .empty }) catch oom();
        break :blk &residents.items[residents.items.len - 1];
    };
    entry.ids.clearRetainingCapacity();
    for (frame.sequences.slice()) |seq| {
        if (seq.finished == 0) entry.ids.append(gpa, seq.id) catch oom();
    }
}

fn onWorkerRemoved(worker: u32) void {
    setIdle(worker, false);
    if (workerIndex(worker)) |w| _ = workers.orderedRemove(w);
    for (residents.items, 0..) |*r, i| {
        if (r.worker == worker) {
            r.ids.deinit(gpa);
            _ = residents.orderedRemove(i);
            break;
        }
    }
}

fn formBatch(s: usize, worker: u32) []u64 {
    const stage = &stages.items[s];
    var batch: std.ArrayList(u64) = .empty;
    if (residentOf(worker)) |r| {
        for (r.ids.items[0..@min(stage.limit, r.ids.items.len)]) |id| batch.append(gpa, id) catch oom();
    }
    var binding: ?u64 = null;
    while (batch.items.len < stage.limit and stage.queue.items.len > 0) {
        const head = stage.queue.items[0];
        const finish = now +| batchLatency(worker, @intCast(batch.items.len + 1));
        if (binding == null and finish > head.deadline) {
            dropRequest(head.id, .deadline_unreachable);
            continue;
        }
        const earliest = if (binding) |b| @min(b, head.deadline) else head.deadline;
        if (finish > earliest) break;
        binding = earliest;
        forget(head.id);
        batch.append(gpa, head.id) catch oom();
    }
    return batch.toOwnedSlice(gpa) catch oom();
}

fn dispatchIdleWorkers() void {
    for (0..stages.items.len) |s| {
        while (stages.items[s].idle.items.len > 0) {
            const worker = stages.items[s].idle.items[0];
            const batch = formBatch(s, worker);
            if (batch.len == 0) {
                gpa.free(batch);
                break;
            }
            setIdle(worker, false);
            batches.append(gpa, batch) catch oom();
            actions.append(gpa, .{ .tag = .dispatch, .payload = .{ .dispatch = .{
                .worker = worker,
                .requests = .{ .ptr = batch.ptr, .len = batch.len },
                .variant = .{ .is_some = 0, .value = 0 },
            } } }) catch oom();
        }
    }
}

var handle_return: abi.List(abi.Action) = undefined;

/// `handle(now, events)`: the time, then the event list's pointer and length.
export fn @"yardmaster:policy/policy@{{contract}}#handle"(call_now: u64, events_ptr: [*]const abi.Event, events_len: usize) *abi.List(abi.Action) {
    defer releaseArguments();
    for (batches.items) |b| gpa.free(b);
    batches.clearRetainingCapacity();
    actions.clearRetainingCapacity();
    now = call_now;
    for (events_ptr[0..events_len]) |*event| {
        switch (event.tag) {
            .arrival => onArrival(&event.payload.arrival),
            .worker_idle => setIdle(event.payload.worker_idle, true),
            .frame => onFrame(&event.payload.frame),
            .worker_added => {
                const w = event.payload.worker_added;
                if (workerIndex(w.id)) |i| {
                    workers.items[i] = .{ .id = w.id, .stage = w.stage, .variant = w.variant };
                } else workers.append(gpa, .{ .id = w.id, .stage = w.stage, .variant = w.variant }) catch oom();
            },
            .worker_removed => onWorkerRemoved(event.payload.worker_removed),
            .request_ended => forget(event.payload.request_ended.id),
            .batch_done, .tick, .timer => {},
        }
    }
    dispatchIdleWorkers();
    handle_return = .{ .ptr = actions.items.ptr, .len = actions.items.len };
    return &handle_return;
}
