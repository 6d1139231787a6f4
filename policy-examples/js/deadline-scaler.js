// deadline-scaler in JavaScript: the same decisions as policy-examples/rust, step for step.
//
// Built into a component with componentize-js (see build.sh). WIT `u64` values (times,
// durations, request ids) arrive as BigInt and all arithmetic on them stays BigInt, so
// nothing is rounded; `u32` values (worker, stage ids, counts) are plain numbers. The
// rules are specified in policy-examples/README.md ("The policy, exactly").

import { log } from 'yardmaster:policy/host@0.1.0';

const MS = 1_000_000n;
const U64_MAX = (1n << 64n) - 1n;

const minBig = (a, b) => (a < b ? a : b);

/** Rust's f64::round for x >= 0: halves go up. */
function roundHalfAway(x) {
  const f = Math.floor(x);
  return x - f >= 0.5 ? f + 1 : f;
}

/**
 * Yardmaster's interpolation rule (the SDK's `interpolate`) over [batch, mean] points
 * sorted by batch (mean a BigInt): linear between points, linear past the last two, the
 * first point's value below the start. `undefined` without points.
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
  const rounded = BigInt(roundHalfAway(Math.max(estimate, 0)));
  return minBig(rounded, U64_MAX);
}

function param(config, key, fallback) {
  const found = config.params.find((p) => p.key === key);
  if (found === undefined) return fallback;
  const text = found.value.trim();
  if (!/^[0-9]+$/.test(text)) throw `parameter \`${key}\`: cannot parse ${JSON.stringify(found.value)}`;
  return BigInt(text);
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

class DeadlineScaler {
  constructor(config) {
    const windowMs = param(config, 'window-ms', 1000n);
    if (windowMs <= 0n) throw 'parameter `window-ms` must be positive';
    this.window = windowMs * MS;
    this.overloadPermille = param(config, 'overload-permille', 900n);
    this.sustainTicks = Number(param(config, 'sustain-ticks', 3n));
    this.maxWorkers = config.maxWorkers;
    this.profiles = new Map(); // "stage/variant" -> [[batch, mean]]
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
      const first = stage.variants[0];
      const full = first === undefined ? undefined : interpolate(this.profiles.get(`${stage.id}/${first.id}`), stage.maxBatch);
      return {
        id: stage.id,
        kind: stage.kind,
        maxBatch: stage.maxBatch,
        maxReplicas: stage.maxReplicas,
        fastestSingle: fastestSingle ?? 0n,
        fullBatch: full ?? 0n,
        queue: [], // sorted [deadline, id]
        arrivals: [], // times of fresh arrivals, oldest first
        arrivalsHead: 0,
        streak: 0,
      };
    });
    this.index = new Map(this.stages.map((s, i) => [s.id, i]));
    this.queued = new Map(); // request id -> [stage index, deadline]
    this.workers = new Map(config.workers.map((w) => [w.id, [w.stage, w.variant]]));
    this.idle = new Map(); // stage id -> sorted worker ids
    this.resident = new Map(); // worker id -> unfinished sequence ids, frame order
    this.actions = [];
    this.now = 0n;
  }

  // -- the SDK's bookkeeping, by hand ------------------------------------------------

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

  forgetSequence(request) {
    for (const ids of this.resident.values()) {
      const at = ids.indexOf(request);
      if (at >= 0) ids.splice(at, 1);
    }
  }

  batchLatency(worker, batch) {
    const info = this.workers.get(worker);
    if (info === undefined) return 0n;
    return interpolate(this.profiles.get(`${info[0]}/${info[1]}`) ?? [], batch) ?? 0n;
  }

  drop(request, reason) {
    this.forgetSequence(request);
    this.actions.push({ tag: 'drop', val: { request, reason } });
  }

  unqueue(stage, entry) {
    stage.queue.splice(lowerBound(stage.queue, entry, compareEntries), 1);
    this.queued.delete(entry[1]);
  }

  // -- events ------------------------------------------------------------------------

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
        case 'tick':
          this.onTick(event.val);
          break;
        case 'worker-added':
          this.workers.set(event.val.id, [event.val.stage, event.val.variant]);
          break;
        case 'worker-removed':
          this.setIdle(event.val, false);
          this.workers.delete(event.val);
          this.resident.delete(event.val);
          break;
        case 'request-ended': {
          const request = event.val[0];
          this.forgetSequence(request);
          const entry = this.queued.get(request);
          if (entry !== undefined) this.unqueue(this.stages[entry[0]], [entry[1], request]);
          break;
        }
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
    if (request.requeues === 0) stage.arrivals.push(this.now);
    if (minBig(this.now + stage.fastestSingle, U64_MAX) > request.deadline) {
      this.drop(request.id, 'deadline-unreachable');
      return;
    }
    const entry = [request.deadline, request.id];
    stage.queue.splice(lowerBound(stage.queue, entry, compareEntries), 0, entry);
    this.queued.set(request.id, [s, request.deadline]);
  }

  countArrivals(stage) {
    const oldest = this.now - (this.window - 1n);
    while (stage.arrivalsHead < stage.arrivals.length && stage.arrivals[stage.arrivalsHead] < oldest) {
      stage.arrivalsHead += 1;
    }
    if (stage.arrivalsHead > 1024) {
      stage.arrivals = stage.arrivals.slice(stage.arrivalsHead);
      stage.arrivalsHead = 0;
    }
    return BigInt(stage.arrivals.length - stage.arrivalsHead);
  }

  onTick(snapshot) {
    let total = 0;
    for (const st of snapshot.stages) total += st.replicas + st.starting;
    for (const stats of snapshot.stages) {
      const s = this.index.get(stats.stage);
      if (s === undefined || this.stages[s].kind !== 'batch') continue;
      const stage = this.stages[s];
      const count = this.countArrivals(stage);
      const demand = count * stage.fullBatch * 1000n;
      const capacity = this.overloadPermille * BigInt(stats.replicas) * BigInt(stage.maxBatch) * this.window;
      stage.streak = demand > capacity ? stage.streak + 1 : 0;
      const target = stats.replicas + 1;
      if (stage.streak >= this.sustainTicks && stats.starting === 0 && target <= stage.maxReplicas && total < this.maxWorkers) {
        stage.streak = 0;
        total += 1;
        this.actions.push({ tag: 'scale', val: { stage: stage.id, replicas: target, variant: undefined } });
        log('info', `stage ${stage.id}: ${count} arrivals in the window, scaling to ${target}`);
      }
    }
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
    const limit = Math.max(stage.maxBatch, 1);
    const batch = (this.resident.get(worker) ?? []).slice(0, limit);
    let binding;
    while (batch.length < limit && stage.queue.length > 0) {
      const [deadline, request] = stage.queue[0];
      const finish = minBig(this.now + this.batchLatency(worker, batch.length + 1), U64_MAX);
      if (binding === undefined && finish > deadline) {
        this.unqueue(stage, stage.queue[0]);
        this.drop(request, 'deadline-unreachable');
        continue;
      }
      const earliest = binding === undefined ? deadline : minBig(binding, deadline);
      if (finish > earliest) break;
      binding = earliest;
      this.unqueue(stage, stage.queue[0]);
      batch.push(request);
    }
    return batch;
  }
}

let policyState;

/** The component's export: `yardmaster:policy/policy`. */
export const policy = {
  init(config) {
    policyState = new DeadlineScaler(config);
    return [];
  },
  handle(now, events) {
    return policyState.handle(now, events);
  },
};
