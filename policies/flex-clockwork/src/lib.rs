//! `flex-clockwork`: the Clockwork-like baseline of SHEPHERD's evaluation (spec §6): one
//! central scheduler over every worker, one deadline-ordered queue per model, never
//! preempting. An idle worker first drops the requests that cannot finish even alone,
//! then, for each model, takes the largest allowed batch size (`1, 2, 4, …, max_batch`)
//! that fits the queue and the head's deadline, and runs the model whose batch must
//! start soonest (the least slack `d_head − l(b)`; ties → lower model index) — the
//! order of Clockwork's strategy queue. Workers keep every model resident and switch
//! per batch (see [`yardmaster_sdk::helpers::models`]).
//!
//! Parameters: `max_batch` (128), `power_of_two_batches` (true: only sizes
//! 1, 2, 4, …; false: any size).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use yardmaster_sdk::helpers::{dispatch_idle, ModelCatalog};
use yardmaster_sdk::{Ctx, DropReason, EndReason, Instant, Policy, Request, RequestId};

/// Queue order: (deadline, arrival, id).
type Key = (Instant, Instant, RequestId);

/// The Clockwork-like scheduler.
pub struct Clockwork {
    catalog: ModelCatalog,
    max_batch: u32,
    power_of_two: bool,
    /// Per model: queued requests.
    queues: BTreeMap<usize, BTreeSet<Key>>,
    /// Where each queued request sits.
    where_queued: HashMap<RequestId, (usize, Key)>,
}

impl Clockwork {
    /// The batch sizes Clockwork may run, ascending, up to `limit`.
    fn allowed(&self, limit: u32) -> impl Iterator<Item = u32> {
        let power_of_two = self.power_of_two;
        (1..=limit).filter(move |b| !power_of_two || b.is_power_of_two())
    }

    /// The next batch for an idle worker of `stage`: (model, requests).
    fn choose(&mut self, ctx: &mut Ctx, stage: u32) -> Option<(usize, Vec<RequestId>)> {
        let now = ctx.now();
        let mut best: Option<(Instant, usize, u32)> = None;
        let models: Vec<usize> = self.queues.keys().copied().filter(|&m| self.catalog.get(m).stage == stage).collect();
        for model in models {
            let info = self.catalog.get(model).clone();
            let queue = self.queues.get_mut(&model).expect("queue");
            // Drop what cannot finish even alone.
            while let Some(&head) = queue.first() {
                if now + info.latency(1) <= head.0 {
                    break;
                }
                queue.pop_first();
                self.where_queued.remove(&head.2);
                ctx.drop_request(head.2, DropReason::DeadlineUnreachable);
            }
            let Some(&head) = queue.first() else { continue };
            let limit = self.max_batch.min(info.max_batch).min(queue.len() as u32);
            let size = self.allowed(limit).filter(|&b| now + info.latency(b) <= head.0).last().unwrap_or(1);
            let latest_start = head.0 - info.latency(size);
            if best.is_none_or(|(s, m, _)| (latest_start, model) < (s, m)) {
                best = Some((latest_start, model, size));
            }
        }
        let (_, model, size) = best?;
        let queue = self.queues.get_mut(&model).expect("queue");
        let batch: Vec<RequestId> = (0..size).filter_map(|_| queue.pop_first()).map(|k| k.2).collect();
        for id in &batch {
            self.where_queued.remove(id);
        }
        Some((model, batch))
    }
}

impl Policy for Clockwork {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let catalog = ModelCatalog::from_config(ctx.config());
        let max_batch: u32 = ctx.param_or("max_batch", 128)?;
        if max_batch == 0 {
            return Err("parameter `max_batch` must be at least 1".into());
        }
        let queues = (0..catalog.len()).map(|m| (m, BTreeSet::new())).collect();
        Ok(Self { catalog, max_batch, power_of_two: ctx.param_or("power_of_two_batches", true)?, queues, where_queued: HashMap::new() })
    }

    fn on_arrival(&mut self, ctx: &mut Ctx, request: Request) {
        let Some(model) = self.catalog.model_of(request.stream, request.stage) else {
            ctx.drop_request(request.id, DropReason::Policy);
            return;
        };
        let key = (request.deadline, request.arrived_at, request.id);
        // A handed-back request replaces its old entry.
        if let Some((m, old)) = self.where_queued.insert(request.id, (model, key)) {
            self.queues.entry(m).or_default().remove(&old);
        }
        self.queues.entry(model).or_default().insert(key);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        if let Some((model, key)) = self.where_queued.remove(&request) {
            self.queues.entry(model).or_default().remove(&key);
        }
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        // Iteration workers continue their paused sequences first.
        dispatch_idle(ctx, |ctx, _, stage| {
            let (model, batch) = self.choose(ctx, stage)?;
            Some((self.catalog.get(model).variant, batch))
        });
    }
}

yardmaster_sdk::export_policy!(Clockwork);

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_sdk::testing::{linear_variant, one_stage, MS};
    use yardmaster_sdk::{Action, Config, Driver, Event, NullHost, Stream};

    fn config() -> Config {
        // RN18 and RS269 (SHEPHERD's Table 4), in microseconds.
        let variants = vec![linear_variant(0, "rn18", 220_000, 3_740_000, 128), linear_variant(1, "rs269", 4_370_000, 74_200_000, 128)];
        let mut config = one_stage(variants, 128, 1);
        config.streams = vec![
            Stream { id: 0, name: "rn18".into(), entry: 0, slo: 500 * MS },
            Stream { id: 1, name: "rs269".into(), entry: 0, slo: 80 * MS },
        ];
        config
    }

    fn request(id: u64, stream: u32, deadline: u64) -> Request {
        yardmaster_sdk::testing::request(id, stream, 0, deadline)
    }

    #[test]
    fn the_least_slack_model_runs_first_with_a_power_of_two_batch() {
        // 128 relaxed RN18 requests and one urgent RS269 request: Clockwork runs RS269
        // (FLEX would run the 128-wide RN18 batch).
        let (mut driver, _) = Driver::<Clockwork>::new(config(), Box::new(NullHost::new(0, 1))).unwrap();
        let mut events: Vec<Event> = (0..128).map(|id| Event::Arrival(request(id, 0, 500 * MS))).collect();
        events.push(Event::Arrival(request(1000, 1, 80 * MS)));
        events.push(Event::WorkerIdle(0));
        let actions = driver.handle(0, events);
        match &actions[..] {
            [Action::Dispatch(d)] => {
                assert_eq!(d.requests, vec![1000]);
                assert_eq!(d.variant, Some(1));
            }
            other => panic!("{other:?}"),
        }
        // Next: RN18, the largest power of two within the queue (128).
        let done = yardmaster_sdk::BatchOutcome { worker: 0, started_at: 0, duration: 78 * MS, results: vec![] };
        let actions = driver.handle(78 * MS, vec![Event::BatchDone(done), Event::WorkerIdle(0)]);
        let Action::Dispatch(d) = &actions[0] else { panic!("{actions:?}") };
        assert_eq!((d.requests.len(), d.variant), (128, Some(0)));
    }

    #[test]
    fn requests_that_cannot_finish_alone_are_dropped_and_sizes_are_powers_of_two() {
        let (mut driver, _) = Driver::<Clockwork>::new(config(), Box::new(NullHost::new(0, 1))).unwrap();
        let mut events: Vec<Event> = vec![Event::Arrival(request(1, 1, 10 * MS))];
        events.extend((10..30).map(|id| Event::Arrival(request(id, 0, 500 * MS))));
        events.push(Event::WorkerIdle(0));
        let actions = driver.handle(0, events);
        assert!(actions.iter().any(|a| matches!(a, Action::Drop(d) if d.request == 1)));
        let sizes: Vec<usize> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Dispatch(d) => Some(d.requests.len()),
                _ => None,
            })
            .collect();
        assert_eq!(sizes, vec![16], "20 queued: the largest power of two is 16");
    }
}
