"""deadline-scaler in Python: the same decisions as policy-examples/rust, step for step.

Built into a component with componentize-py (see build.sh); the bindings module
`wit_world` is generated from ../../wit/0.1.0 at build time. The rules are specified in
policy-examples/README.md ("The policy, exactly"): integer arithmetic throughout,
except the batch-latency interpolation, whose few float operations are IEEE-exact in
every language.
"""

import bisect
import math
from collections import deque

from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    Action_Dispatch,
    Action_Drop,
    Action_Scale,
    Dispatch,
    DropReason,
    DropRequest,
    Event_Arrival,
    Event_Frame,
    Event_RequestEnded,
    Event_Tick,
    Event_WorkerAdded,
    Event_WorkerIdle,
    Event_WorkerRemoved,
    Scale,
    StageKind,
)
from componentize_py_types import Err

MS = 1_000_000
U64_MAX = (1 << 64) - 1


def round_half_away(x):
    """Rust's f64::round for x >= 0: halves go up."""
    f = math.floor(x)
    return f + 1 if x - f >= 0.5 else f


def interpolate(points, batch):
    """Yardmaster's interpolation rule (the SDK's `interpolate`) over (batch, mean) points
    sorted by batch: linear between points, linear past the last two, the first point's
    value below the start. None without points."""
    batch = max(batch, 1)
    if not points:
        return None
    first_batch, first_mean = points[0]
    if len(points) == 1 or batch <= first_batch:
        return first_mean
    upper = bisect.bisect_left([p[0] for p in points], batch)
    upper = min(max(upper, 1), len(points) - 1)
    lo_batch, lo_mean = points[upper - 1]
    hi_batch, hi_mean = points[upper]
    if batch == hi_batch:
        return hi_mean
    slope = (float(hi_mean) - float(lo_mean)) / (float(hi_batch) - float(lo_batch))
    estimate = float(lo_mean) + slope * (float(batch) - float(lo_batch))
    return min(round_half_away(max(estimate, 0.0)), U64_MAX)


def param(config, key, default):
    for p in config.params:
        if p.key == key:
            try:
                return int(p.value.strip())
            except ValueError:
                raise Err(f"parameter `{key}`: cannot parse {p.value!r}")
    return default


class StageState:
    def __init__(self, stage, profiles, window):
        self.id = stage.id
        self.kind = stage.kind
        self.max_batch = stage.max_batch
        self.max_replicas = stage.max_replicas
        singles = [interpolate(profiles[(stage.id, v.id)], 1) for v in stage.variants if profiles[(stage.id, v.id)]]
        self.fastest_single = min(singles) if singles else 0
        full = None
        if stage.variants:
            full = interpolate(profiles[(stage.id, stage.variants[0].id)], stage.max_batch)
        self.full_batch = full if full is not None else 0
        self.queue = []  # sorted (deadline, id)
        self.arrivals = deque()  # times of fresh arrivals
        self.window = window
        self.streak = 0

    def count_arrivals(self, now):
        oldest = now - (self.window - 1)
        while self.arrivals and self.arrivals[0] < oldest:
            self.arrivals.popleft()
        return len(self.arrivals)


class DeadlineScaler:
    """The policy's state and decisions."""

    def __init__(self, config):
        window_ms = param(config, "window-ms", 1000)
        if window_ms <= 0:
            raise Err("parameter `window-ms` must be positive")
        self.window = window_ms * MS
        self.overload_permille = param(config, "overload-permille", 900)
        self.sustain_ticks = param(config, "sustain-ticks", 3)
        self.max_workers = config.max_workers
        self.profiles = {}
        for stage in config.stages:
            for v in stage.variants:
                points = sorted(((p.batch, p.mean) for p in v.profile), key=lambda p: p[0])
                self.profiles[(stage.id, v.id)] = points
        self.stages = [StageState(s, self.profiles, self.window) for s in config.stages]
        self.index = {s.id: i for i, s in enumerate(self.stages)}
        self.queued = {}  # request id -> (stage index, deadline)
        self.workers = {w.id: (w.stage, w.variant) for w in config.workers}
        self.idle = {}  # stage id -> sorted worker ids
        self.resident = {}  # worker id -> unfinished sequence ids, frame order
        self.actions = []

    # -- the SDK's bookkeeping, by hand -------------------------------------------

    def set_idle(self, worker, idle):
        info = self.workers.get(worker)
        if info is None:
            return
        ids = self.idle.setdefault(info[0], [])
        at = bisect.bisect_left(ids, worker)
        present = at < len(ids) and ids[at] == worker
        if idle and not present:
            ids.insert(at, worker)
        elif not idle and present:
            del ids[at]

    def forget_sequence(self, request):
        for ids in self.resident.values():
            if request in ids:
                ids.remove(request)

    def batch_latency(self, worker, batch):
        info = self.workers.get(worker)
        if info is None:
            return 0
        value = interpolate(self.profiles.get(info, []), batch)
        return value if value is not None else 0

    def drop(self, request, reason):
        self.forget_sequence(request)
        self.actions.append(Action_Drop(DropRequest(request, reason)))

    # -- events ----------------------------------------------------------------------

    def handle(self, now, events):
        self.now = now
        self.actions = []
        for event in events:
            if isinstance(event, Event_Arrival):
                self.on_arrival(event.value)
            elif isinstance(event, Event_WorkerIdle):
                self.set_idle(event.value, True)
            elif isinstance(event, Event_Frame):
                frame = event.value
                self.resident[frame.worker] = [s.id for s in frame.sequences if not s.finished]
            elif isinstance(event, Event_Tick):
                self.on_tick(event.value)
            elif isinstance(event, Event_WorkerAdded):
                w = event.value
                self.workers[w.id] = (w.stage, w.variant)
            elif isinstance(event, Event_WorkerRemoved):
                self.set_idle(event.value, False)
                self.workers.pop(event.value, None)
                self.resident.pop(event.value, None)
            elif isinstance(event, Event_RequestEnded):
                request = event.value[0]
                self.forget_sequence(request)
                entry = self.queued.pop(request, None)
                if entry is not None:
                    queue = self.stages[entry[0]].queue
                    del queue[bisect.bisect_left(queue, (entry[1], request))]
        self.dispatch_idle_workers()
        return self.actions

    def on_arrival(self, request):
        s = self.index.get(request.stage)
        if s is None:
            self.drop(request.id, DropReason.POLICY)
            return
        stage = self.stages[s]
        if request.requeues == 0:
            stage.arrivals.append(self.now)
        if min(self.now + stage.fastest_single, U64_MAX) > request.deadline:
            self.drop(request.id, DropReason.DEADLINE_UNREACHABLE)
            return
        bisect.insort(stage.queue, (request.deadline, request.id))
        self.queued[request.id] = (s, request.deadline)

    def on_tick(self, snapshot):
        total = sum(st.replicas + st.starting for st in snapshot.stages)
        for stats in snapshot.stages:
            s = self.index.get(stats.stage)
            if s is None or self.stages[s].kind != StageKind.BATCH:
                continue
            stage = self.stages[s]
            count = stage.count_arrivals(self.now)
            demand = count * stage.full_batch * 1000
            capacity = self.overload_permille * stats.replicas * stage.max_batch * self.window
            stage.streak = stage.streak + 1 if demand > capacity else 0
            target = stats.replicas + 1
            if (stage.streak >= self.sustain_ticks and stats.starting == 0
                    and target <= stage.max_replicas and total < self.max_workers):
                stage.streak = 0
                total += 1
                self.actions.append(Action_Scale(Scale(stage.id, target, None)))
                host.log(host.Level.INFO, f"stage {stage.id}: {count} arrivals in the window, scaling to {target}")

    def dispatch_idle_workers(self):
        for s, stage in enumerate(self.stages):
            while True:
                idle = self.idle.get(stage.id)
                if not idle:
                    break
                worker = idle[0]
                batch = self.form_batch(s, worker)
                if not batch:
                    break
                self.set_idle(worker, False)
                self.actions.append(Action_Dispatch(Dispatch(worker, batch, None)))

    def form_batch(self, s, worker):
        stage = self.stages[s]
        limit = max(stage.max_batch, 1)
        batch = self.resident.get(worker, [])[:limit]
        binding = None
        while len(batch) < limit and stage.queue:
            deadline, request = stage.queue[0]
            finish = min(self.now + self.batch_latency(worker, len(batch) + 1), U64_MAX)
            if binding is None and finish > deadline:
                stage.queue.pop(0)
                self.queued.pop(request, None)
                self.drop(request, DropReason.DEADLINE_UNREACHABLE)
                continue
            earliest = deadline if binding is None else min(binding, deadline)
            if finish > earliest:
                break
            binding = earliest
            stage.queue.pop(0)
            self.queued.pop(request, None)
            batch.append(request)
        return batch


_policy = None


class Policy(exports.Policy):
    """The component's export. componentize-py makes a fresh instance of this class for
    every call, so the policy's state lives in a module global."""

    def init(self, config):
        global _policy
        _policy = DeadlineScaler(config)
        return []

    def handle(self, now, events):
        return _policy.handle(now, events)
