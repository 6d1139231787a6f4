"""{{name}}: earliest deadline first, in Python.

- Each stage keeps its waiting requests ordered by (deadline, id).
- A request that cannot finish even alone on the stage's fastest variant is dropped
  when it arrives (deadline-unreachable); so is a queue head that cannot finish alone
  on the worker about to take it.
- Once per call, every idle worker (lowest id first) gets its resident LLM sequences,
  then the most urgent requests, as many as keep the earliest deadline in the batch
  reachable.

componentize-py generates the `wit_world` bindings from wit/ at build time (build.sh).
"""

import bisect
import math

from wit_world import exports
from wit_world.imports.types import (
    Action_Dispatch,
    Action_Drop,
    Dispatch,
    DropReason,
    DropRequest,
    Event_Arrival,
    Event_Frame,
    Event_RequestEnded,
    Event_WorkerAdded,
    Event_WorkerIdle,
    Event_WorkerRemoved,
)

U64_MAX = (1 << 64) - 1


def round_half_away(x):
    """Rust's f64::round for x >= 0: halves go up."""
    f = math.floor(x)
    return f + 1 if x - f >= 0.5 else f


def interpolate(points, batch):
    """The host's interpolation rule over (batch, mean) points sorted by batch: linear
    between points, linear past the last two, the first point's value below the start.
    None without points."""
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


class DeadlineFirst:
    """The policy's state and decisions."""

    def __init__(self, config):
        self.profiles = {}  # (stage, variant) -> sorted (batch, mean)
        for stage in config.stages:
            for v in stage.variants:
                self.profiles[(stage.id, v.id)] = sorted((p.batch, p.mean) for p in v.profile)
        self.stages = []  # configuration order: (id, max batch, fastest single, queue)
        for stage in config.stages:
            singles = [interpolate(self.profiles[(stage.id, v.id)], 1) for v in stage.variants]
            singles = [s for s in singles if s is not None]
            self.stages.append((stage.id, max(stage.max_batch, 1), min(singles) if singles else 0, []))
        self.index = {s[0]: i for i, s in enumerate(self.stages)}
        self.queued = {}  # request id -> (stage index, deadline)
        self.workers = {w.id: (w.stage, w.variant) for w in config.workers}
        self.idle = {}  # stage id -> sorted idle worker ids
        self.resident = {}  # worker id -> unfinished sequence ids, frame order
        self.now = config.now
        self.actions = []

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
            elif isinstance(event, Event_WorkerAdded):
                self.workers[event.value.id] = (event.value.stage, event.value.variant)
            elif isinstance(event, Event_WorkerRemoved):
                self.set_idle(event.value, False)
                self.workers.pop(event.value, None)
                self.resident.pop(event.value, None)
            elif isinstance(event, Event_RequestEnded):
                self.forget(event.value[0])
        self.dispatch_idle_workers()
        return self.actions

    def on_arrival(self, request):
        s = self.index.get(request.stage)
        if s is None:
            self.drop(request.id, DropReason.POLICY)
            return
        _, _, fastest_single, queue = self.stages[s]
        if min(self.now + fastest_single, U64_MAX) > request.deadline:
            self.drop(request.id, DropReason.DEADLINE_UNREACHABLE)
            return
        bisect.insort(queue, (request.deadline, request.id))
        self.queued[request.id] = (s, request.deadline)

    def dispatch_idle_workers(self):
        for s, (stage, _, _, _) in enumerate(self.stages):
            while self.idle.get(stage):
                worker = self.idle[stage][0]
                batch = self.form_batch(s, worker)
                if not batch:
                    break
                self.set_idle(worker, False)
                self.actions.append(Action_Dispatch(Dispatch(worker, batch, None)))

    def form_batch(self, s, worker):
        _, limit, _, queue = self.stages[s]
        batch = self.resident.get(worker, [])[:limit]
        binding = None
        while len(batch) < limit and queue:
            deadline, request = queue[0]
            finish = min(self.now + self.batch_latency(worker, len(batch) + 1), U64_MAX)
            if binding is None and finish > deadline:
                self.forget(request)
                self.drop(request, DropReason.DEADLINE_UNREACHABLE)
                continue
            earliest = deadline if binding is None else min(binding, deadline)
            if finish > earliest:
                break
            binding = earliest
            self.forget(request)
            batch.append(request)
        return batch

    # -- bookkeeping (what the Rust SDK's Ctx does) -----------------------------------

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

    def forget(self, request):
        """The request leaves its queue and every resident list."""
        for ids in self.resident.values():
            if request in ids:
                ids.remove(request)
        entry = self.queued.pop(request, None)
        if entry is not None:
            queue = self.stages[entry[0]][3]
            del queue[bisect.bisect_left(queue, (entry[1], request))]

    def batch_latency(self, worker, batch):
        info = self.workers.get(worker)
        value = interpolate(self.profiles.get(info, []), batch) if info is not None else None
        return value if value is not None else 0

    def drop(self, request, reason):
        self.forget(request)
        self.actions.append(Action_Drop(DropRequest(request, reason)))


_policy = None


class Policy(exports.Policy):
    """The component's export. componentize-py makes a fresh instance of this class for
    every call, so the policy's state lives in a module global."""

    def init(self, config):
        global _policy
        _policy = DeadlineFirst(config)
        return []

    def handle(self, now, events):
        return _policy.handle(now, events)
