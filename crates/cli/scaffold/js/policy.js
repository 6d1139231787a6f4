// {{name}}: earliest deadline first, in JavaScript.
//
// - Each stage keeps its waiting requests ordered by (deadline, id).
// - A request that cannot finish even alone on the stage's fastest variant is dropped
//   when it arrives (deadline-unreachable); so is a queue head that cannot finish alone
//   on the worker about to take it.
// - Once per call, every idle worker (lowest id first) gets its resident LLM sequences,
//   then the most urgent requests, as many as keep the earliest deadline in the batch
//   reachable.
//
// WIT `u64` values (times, durations, request ids) arrive as BigInt: keep their
// arithmetic in BigInt. `u32` values (worker and stage ids, counts) are numbers.
// Host functions are imported from 'yardmaster:policy/host@{{contract}}', e.g.
//   import { log } from 'yardmaster:policy/host@{{contract}}';

const U64_MAX = (1n << 64n) - 1n;

const minBig = (a, b) => (a < b ? a : b);

/** Rust's f64::round for x >= 0: halves go up. */
function roundHalfAway(x) {
  const f = Math.floor(x);
  return x - f >= 0.5 ? f + 1 : f;
}

/**
 * The host's interpolation rule over [batch, mean] points sorted by batch (mean a
 * BigInt): linear between points, linear past the last two, the first point's value
 * below the start. `undefined` without points.
 */
function interpolate(points, batch) {
  batch = Math.max(batch, 1);
  if (points.length === 0) return undefined;
  const [firstBatch, firstMean] = points[0];
  if (points.length === 1 || batch <= firstBatch) return firstMean;
  let upper = points.findIndex(([b]) => b >= batch);
  if (upper < 0) upper = points.length;
  upper = Math.min(Math.max(upper, 1), points.length - 1);
  const [loBatch, loMean] = points[upper - 1];
  const [hiBatch, hiMean] = points[upper];
  if (batch === hiBatch) return hiMean;
  const slope = (Number(hiMean) - Number(loMean)) / (hiBatch - loBatch);
  const estimate = Number(loMean) + slope * (batch - loBatch);
  return minBig(BigInt(roundHalfAway(Math.max(estimate, 0))), U64_MAX);
}

/** Compare two [deadline, id] queue entries. */
function compareEntries(a, b) {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}

/** Index of the first element not below `entry` in a sorted array. */
function lowerBound(array, entry, compare) {
  let lo = 0;
  let hi = array.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (compare(array[mid], entry) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

class DeadlineFirst {
  constructor(config) {
    this.profiles = new Map(); // "stage/variant" -> [[batch, mean]], sorted by batch
    for (const stage of config.stages) {
      for (const v of stage.variants) {
        const points = v.profile.map((p) => [p.batch, p.mean]);
        points.sort((a, b) => a[0] - b[0]);
        this.profiles.set(`${stage.id}/${v.id}`, points);
      }
    }
    this.stages = config.stages.map((stage) => {
      let fastestSingle;
      for (const v of stage.variants) {
        const single = interpolate(this.profiles.get(`${stage.id}/${v.id}`), 1);
        if (single !== undefined && (fastestSingle === undefined || single < fastestSingle)) fastestSingle = single;
      }
      return { id: stage.id, limit: Math.max(stage.maxBatch, 1), fastestSingle: fastestSingle ?? 0n, queue: [] };
    });
    this.index = new Map(this.stages.map((s, i) => [s.id, i]));
    this.queued = new Map(); // request id -> [stage index, deadline]
    this.workers = new Map(config.workers.map((w) => [w.id, [w.stage, w.variant]]));
    this.idle = new Map(); // stage id -> sorted idle worker ids
    this.resident = new Map(); // worker id -> unfinished sequence ids, frame order
    this.actions = [];
    this.now = config.now;
  }

  handle(now, events) {
    this.now = now;
    this.actions = [];
    for (const event of events) {
      switch (event.tag) {
        case 'arrival':
          this.onArrival(event.val);
          break;
        case 'worker-idle':
          this.setIdle(event.val, true);
          break;
        case 'frame':
          this.resident.set(event.val.worker, event.val.sequences.filter((s) => !s.finished).map((s) => s.id));
          break;
        case 'worker-added':
          this.workers.set(event.val.id, [event.val.stage, event.val.variant]);
          break;
        case 'worker-removed':
          this.setIdle(event.val, false);
          this.workers.delete(event.val);
          this.resident.delete(event.val);
          break;
        case 'request-ended':
          this.forget(event.val[0]);
          break;
        default:
          break;
      }
    }
    this.dispatchIdleWorkers();
    return this.actions;
  }

  onArrival(request) {
    const s = this.index.get(request.stage);
    if (s === undefined) {
      this.drop(request.id, 'policy');
      return;
    }
    const stage = this.stages[s];
    if (minBig(this.now + stage.fastestSingle, U64_MAX) > request.deadline) {
      this.drop(request.id, 'deadline-unreachable');
      return;
    }
    const entry = [request.deadline, request.id];
    stage.queue.splice(lowerBound(stage.queue, entry, compareEntries), 0, entry);
    this.queued.set(request.id, [s, request.deadline]);
  }

  dispatchIdleWorkers() {
    for (const stage of this.stages) {
      for (;;) {
        const idle = this.idle.get(stage.id);
        if (idle === undefined || idle.length === 0) break;
        const worker = idle[0];
        const batch = this.formBatch(stage, worker);
        if (batch.length === 0) break;
        this.setIdle(worker, false);
        this.actions.push({ tag: 'dispatch', val: { worker, requests: batch, variant: undefined } });
      }
    }
  }

  formBatch(stage, worker) {
    const batch = (this.resident.get(worker) ?? []).slice(0, stage.limit);
    let binding;
    while (batch.length < stage.limit && stage.queue.length > 0) {
      const [deadline, request] = stage.queue[0];
      const finish = minBig(this.now + this.batchLatency(worker, batch.length + 1), U64_MAX);
      if (binding === undefined && finish > deadline) {
        this.forget(request);
        this.drop(request, 'deadline-unreachable');
        continue;
      }
      const earliest = binding === undefined ? deadline : minBig(binding, deadline);
      if (finish > earliest) break;
      binding = earliest;
      this.forget(request);
      batch.push(request);
    }
    return batch;
  }

  // -- bookkeeping (what the Rust SDK's Ctx does) -----------------------------------

  setIdle(worker, idle) {
    const info = this.workers.get(worker);
    if (info === undefined) return;
    let ids = this.idle.get(info[0]);
    if (ids === undefined) this.idle.set(info[0], (ids = []));
    const at = lowerBound(ids, worker, (a, b) => a - b);
    const present = at < ids.length && ids[at] === worker;
    if (idle && !present) ids.splice(at, 0, worker);
    else if (!idle && present) ids.splice(at, 1);
  }

  /** The request leaves its queue and every resident list. */
  forget(request) {
    for (const ids of this.resident.values()) {
      const at = ids.indexOf(request);
      if (at >= 0) ids.splice(at, 1);
    }
    const entry = this.queued.get(request);
    if (entry === undefined) return;
    const queue = this.stages[entry[0]].queue;
    queue.splice(lowerBound(queue, [entry[1], request], compareEntries), 1);
    this.queued.delete(request);
  }

  batchLatency(worker, batch) {
    const info = this.workers.get(worker);
    if (info === undefined) return 0n;
    return interpolate(this.profiles.get(`${info[0]}/${info[1]}`) ?? [], batch) ?? 0n;
  }

  drop(request, reason) {
    this.forget(request);
    this.actions.push({ tag: 'drop', val: { request, reason } });
  }
}

let state;

/** The component's export: the `yardmaster:policy/policy` interface. */
export const policy = {
  init(config) {
    // Throwing a string here refuses the configuration with that reason.
    state = new DeadlineFirst(config);
    return [];
  },
  handle(now, events) {
    return state.handle(now, events);
  },
};
