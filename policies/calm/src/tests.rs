//! The spec's testable properties (§9) that a single policy instance can show:
//! the cut-off, length matching, quota feasibility, the preemption guard, the
//! admission timeout and no wasted expiry. (Δ-invariance is in `analyze`,
//! refinement monotonicity in `predict` and `analyze`.)

use yardmaster_sdk::testing::dispatches;
use yardmaster_sdk::{Action, DropReason, Event, EvictMode, Snapshot};

use crate::analyze::Analysis;
use crate::params::Packing;
use crate::plan::{guard, plan_frame, Candidate, FrameSetting, Role};
use crate::testing::{self, dispatched, frame, request, DS, LS, MS};

fn analysis(priority: f64, value: f64, quota: u32) -> Analysis {
    Analysis { value, t_gen: value / priority.max(1e-9), t_rem: 10.0, bandwidth: 0.1, feasible: true, quota, priority }
}

fn candidate(id: u64, key: u32, priority: f64) -> Candidate {
    Candidate {
        id,
        key,
        arrival: id,
        resident: false,
        held: 0,
        footprint: 100,
        analysis: analysis(priority, 100.0, 5),
        stall_s: 0.01,
        evict_mode: EvictMode::Recompute,
        latency: false,
        admitted: false,
    }
}

fn setting(batch: usize, p: f64, packing: Packing) -> FrameSetting {
    FrameSetting { batch, kv_capacity: 1_000_000, p, packing, delta_pre: 0.1, frame_s: 0.5, token_rate: 100.0, ls_share: 0.0 }
}

/// Deterministic pseudo-random priorities and keys.
fn scattered(n: u64) -> Vec<Candidate> {
    let mut state = 11u64;
    (0..n)
        .map(|id| {
            let (next, word) = yardmaster_sdk::splitmix64(state);
            state = next;
            candidate(id, (word % 8000) as u32 + 1, ((word >> 20) % 1000) as f64 + 1.0)
        })
        .collect()
}

#[test]
fn cutoff_every_funded_member_is_within_p_of_the_cutoff() {
    let candidates = scattered(60);
    for p in [0.5, 0.8, 0.95, 1.0] {
        let selection = plan_frame(&candidates, &setting(8, p, Packing::Paced));
        assert!(selection.cutoff > 0.0);
        for (id, role) in &selection.run {
            let c = &candidates[*id as usize];
            if *role == Role::Funded {
                assert!(c.analysis.priority >= p * selection.cutoff, "p={p}: member {id} below the cut-off");
            }
        }
        assert_eq!(selection.run.len(), 8, "the top-up keeps the batch full");
    }
}

#[test]
fn cutoff_with_p_one_and_slots_is_the_top_b() {
    let candidates = scattered(40);
    let selection = plan_frame(&candidates, &setting(6, 1.0, Packing::Slots));
    let mut by_p: Vec<&Candidate> = candidates.iter().collect();
    by_p.sort_by(|a, b| b.analysis.priority.total_cmp(&a.analysis.priority));
    let mut top: Vec<u64> = by_p[..6].iter().map(|c| c.id).collect();
    let mut funded: Vec<u64> = selection.run.iter().filter(|(_, r)| *r == Role::Funded).map(|(id, _)| *id).collect();
    top.sort();
    funded.sort();
    assert_eq!(funded, top);
}

#[test]
fn length_matching_picks_one_mode_of_a_bimodal_batch() {
    let batch = 8;
    let candidates: Vec<Candidate> = (0..2 * batch as u64).map(|id| candidate(id, if id % 2 == 0 { 100 } else { 8000 }, 50.0)).collect();
    let selection = plan_frame(&candidates, &setting(batch, 0.95, Packing::Paced));
    let keys: Vec<u32> = selection.run.iter().filter(|(_, r)| *r == Role::Funded).map(|(id, _)| candidates[*id as usize].key).collect();
    assert_eq!(keys.len(), batch);
    assert!(keys.iter().all(|&k| k == keys[0]), "one mode only: {keys:?}");
    // The P-only top-B (ties by arrival) mixes both modes: spread 7900; ours is 0.
    let p_only: Vec<u32> = candidates[..batch].iter().map(|c| c.key).collect();
    let spread = |k: &[u32]| k.iter().max().unwrap() - k.iter().min().unwrap();
    assert!(spread(&keys) <= spread(&p_only));
    assert!(spread(&p_only) > 0);
}

#[test]
fn quota_feasibility_every_funded_member_runs_the_whole_frame() {
    // Σq ≤ B·Δ: every funded request is dispatched, and a dispatched sequence decodes
    // every step of the host's frame, i.e. Δ ≥ q times.
    let mut driver = testing::driver(4, 1_000_000, &[]);
    let events: Vec<Event> = (1..=6).map(|id| Event::Arrival(request(id, DS, 0, 100 * id as u32, 0))).collect();
    driver.handle(0, events);
    let run = dispatched(&driver.handle(0, vec![Event::WorkerIdle(0)]));
    let plan = driver.policy().last_plan(0).expect("planned").clone();
    assert_eq!(run.len(), 4);
    for (id, role) in &plan.run {
        assert!(run.contains(id));
        if *role == Role::Funded {
            assert!(driver.policy().bound(*id).is_some());
        }
    }
    let quotas: u32 = plan.run.len() as u32 * 10;
    assert!(quotas <= 4 * 10);
}

#[test]
fn guard_refuses_small_gains_and_infinite_stalls() {
    let s = setting(4, 0.95, Packing::Paced);
    let victim = Candidate { resident: true, held: 500, ..candidate(1, 100, 10.0) };
    let mut incoming = candidate(2, 100, 100.0);
    // G_A ≤ 1.1·G_B: no eviction, whatever the priorities.
    incoming.analysis.value = 1.1 * victim.analysis.value;
    assert!(!guard(&incoming, &[&victim], &s));
    // Much higher goodput and a cheap stall: evict.
    incoming.analysis.value = 10.0 * victim.analysis.value;
    assert!(guard(&incoming, &[&victim], &s));
    // The same with an (almost) infinite stall (io bandwidth → 0): no eviction.
    let stuck = Candidate { stall_s: 1e12, ..victim.clone() };
    assert!(!guard(&incoming, &[&stuck], &s));
    // A lower-priority incoming request never evicts.
    let low = Candidate { analysis: Analysis { priority: 5.0, ..incoming.analysis }, ..incoming.clone() };
    assert!(!guard(&low, &[&victim], &s));
}

#[test]
fn evictions_in_a_plan_respect_the_guard_and_free_enough() {
    // A full KV cache held by a paused low-value sequence; a much better request waits.
    let mut s = setting(2, 0.95, Packing::Paced);
    s.kv_capacity = 1000;
    let paused = Candidate {
        resident: true,
        held: 900,
        footprint: 950,
        analysis: Analysis { quota: 0, ..analysis(1.0, 10.0, 0) },
        ..candidate(1, 100, 1.0)
    };
    let better = Candidate { footprint: 800, analysis: analysis(500.0, 5000.0, 5), ..candidate(2, 100, 500.0) };
    let selection = plan_frame(&[paused.clone(), better.clone()], &s);
    assert_eq!(selection.evict, vec![(1, EvictMode::Recompute)]);
    assert!(selection.run.contains(&(2, Role::Funded)));
    // Barely better (G ratio 1.05): no eviction, the waiting request is left out.
    let marginal = Candidate { analysis: analysis(500.0, 10.5, 5), ..better };
    let selection = plan_frame(&[paused, marginal], &s);
    assert!(selection.evict.is_empty());
    assert!(!selection.run.iter().any(|(id, _)| *id == 2));
}

#[test]
fn a_cache_full_of_residents_evicts_the_lowest_priority_so_the_others_grow() {
    // KV exhaustion at a frame boundary (spec §3.4's rule, issue 43): three residents
    // that ran last frame fill the cache, and each needs a frame of growth. Before, no
    // member could be reserved (the guard's victims exclude members) and the worker
    // stood idle with its cache held: on a conversation trace past capacity, 97 % of
    // CALM's plans ran nothing.
    let mut s = setting(4, 0.95, Packing::Paced);
    s.kv_capacity = 1000;
    let resident = |id: u64, priority: f64| Candidate { resident: true, held: 330, footprint: 380, ..candidate(id, 100, priority) };
    let residents = [resident(1, 30.0), resident(2, 20.0), resident(3, 10.0)];
    let selection = plan_frame(&residents, &s);
    assert_eq!(selection.evict, vec![(3, EvictMode::Recompute)]);
    assert_eq!(selection.run, vec![(1, Role::Funded), (2, Role::Funded)]);
    // With room for every growth, nothing is evicted.
    s.kv_capacity = 1200;
    let selection = plan_frame(&residents, &s);
    assert!(selection.evict.is_empty());
    assert_eq!(selection.run.len(), 3);
}

fn drops(actions: &[Action]) -> Vec<(u64, DropReason)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Drop(d) => Some((d.request, d.reason)),
            _ => None,
        })
        .collect()
}

fn tick(at: u64) -> Event {
    Event::Tick(Snapshot { at, stages: vec![], workers: vec![], host_memory_used: 0, host_memory_capacity: 0, hosts: Vec::new() })
}

#[test]
fn admission_timeout_drops_each_unscheduled_request_once() {
    // One slot, the worker busy with request 1 for a long time: the others wait
    // (the thesis's fixed `waiting_time`).
    let mut driver = testing::driver(1, 1_000_000, &[("admission_timeout", "fixed")]);
    let mut arrivals: Vec<Event> = vec![Event::Arrival(request(1, LS, 0, 10, 0))];
    arrivals.extend((2..=5).map(|id| Event::Arrival(request(id, LS, id * 100 * MS, 10, 0))));
    driver.handle(0, arrivals);
    assert_eq!(dispatched(&driver.handle(0, vec![Event::WorkerIdle(0)])), vec![1]);
    let mut dropped = Vec::new();
    let mut t = 0;
    while t <= 8000 * MS {
        let actions = driver.handle(t, vec![tick(t)]);
        for (id, reason) in drops(&actions) {
            assert_eq!(reason, DropReason::Overload);
            let sent = id * 100 * MS;
            assert!(t >= sent + 5000 * MS, "request {id} dropped early at {t}");
            assert!(t < sent + 5000 * MS + 1000 * MS, "request {id} dropped late (one tick of slack)");
            dropped.push(id);
        }
        t += 250 * MS;
    }
    dropped.sort();
    assert_eq!(dropped, vec![2, 3, 4, 5], "each exactly once; the admitted one never");
}

#[test]
fn no_wasted_expiry_requests_past_their_deadline_are_dropped_not_run() {
    let mut driver = testing::driver(4, 1_000_000, &[]);
    // A DS request (deadline 20 s) that waited in a busy system and a fresh one.
    driver.handle(0, vec![Event::Arrival(request(1, DS, 0, 100, 0))]);
    let actions = driver.handle(0, vec![Event::WorkerIdle(0)]);
    assert_eq!(dispatched(&actions), vec![1]);
    // It runs; the frame ends after its deadline.
    let late = 21_000 * MS;
    let actions = driver.handle(
        late,
        vec![Event::Arrival(request(2, DS, late, 100, 0)), frame(10, 100 * MS, &[(1, 100, 10, false)]), Event::WorkerIdle(0)],
    );
    assert_eq!(drops(&actions), vec![(1, DropReason::DeadlineUnreachable)]);
    assert_eq!(dispatched(&actions), vec![2]);
}

#[test]
fn finished_requests_teach_the_length_estimator() {
    let mut driver = testing::driver(8, 1_000_000, &[("length_prior", "7")]);
    driver.handle(0, (1..=8).map(|id| Event::Arrival(request(id, DS, 0, 100, 0))).collect());
    driver.handle(0, vec![Event::WorkerIdle(0)]);
    assert_eq!(driver.policy().bound(1), Some(7), "the prior before any completion");
    let finished: Vec<(u64, u32, u32, bool)> = (1..=8).map(|id| (id, 100, 40, true)).collect();
    driver.handle(100 * MS, vec![frame(10, 100 * MS, &finished), Event::WorkerIdle(0)]);
    driver.handle(100 * MS, vec![Event::Arrival(request(9, DS, 100 * MS, 100, 0)), Event::WorkerIdle(0)]);
    // Eight samples of 40 (fewer than 10 above g = 0 would give 2g; the pool has 8 < 10).
    assert_eq!(driver.policy().bound(9), Some(7));
    let more: Vec<Event> = (10..=21).map(|id| Event::Arrival(request(id, DS, 100 * MS, 100, 0))).collect();
    driver.handle(100 * MS, more);
    let run = dispatched(&driver.handle(100 * MS, vec![Event::WorkerIdle(0)]));
    assert!(!run.is_empty());
    let done: Vec<(u64, u32, u32, bool)> = run.iter().map(|&id| (id, 100, 40, true)).collect();
    driver.handle(200 * MS, vec![frame(10, 100 * MS, &done)]);
    driver.handle(200 * MS, vec![Event::Arrival(request(99, DS, 200 * MS, 100, 0)), Event::WorkerIdle(0)]);
    assert_eq!(driver.policy().bound(99), Some(40), "learned: every finished request had 40 tokens");
}

#[test]
fn starvation_freedom_aging_admits_a_low_priority_request_within_the_bound() {
    // Property 9: slots packing, no timeout, δ_age = 10, B = 1. A best-effort request
    // (P ≈ 1010 / 10 s ≈ 101) among a stream of short rivals (P ≈ 20 / 0.1 s ≈ 200)
    // that keep the worker saturated: aging admits it within
    // ⌈B·P_max·(t_gen,BE + ε)/δ_age⌉ + 1 frames.
    let mut driver =
        testing::driver(1, 1_000_000, &[("packing", "slots"), ("waiting_time_ms", "1e9"), ("p_tune", "false"), ("predictor", "oracle")]);
    let frame_ns = 100 * MS;
    driver.handle(0, vec![Event::Arrival(request(1_000, testing::BE, 0, 10, 1000))]);
    let (v, eps, delta_age): (f64, f64, f64) = (0.01, 0.001, 10.0);
    let t_gen_be = 10.0 * 20e-6 + 1000.0 * v;
    let p_max = 20.0 / (10.0 * 20e-6 + 10.0 * v + eps);
    let bound = (p_max * (t_gen_be + eps) / delta_age).ceil() as u64 + 1;
    let mut last: Vec<u64> = Vec::new();
    let mut admitted_at = None;
    for round in 0..bound + 5 {
        let now = round * frame_ns;
        let mut events = vec![Event::Arrival(request(round + 1, DS, now, 10, 10))];
        if !last.is_empty() {
            let done: Vec<(u64, u32, u32, bool)> = last.iter().map(|&id| (id, 10, 10, true)).collect();
            events.push(frame(10, frame_ns, &done));
        }
        events.push(Event::WorkerIdle(0));
        last = dispatched(&driver.handle(now, events));
        if last.contains(&1_000) {
            admitted_at = Some(round);
            break;
        }
    }
    let round = admitted_at.expect("the best-effort request was admitted");
    assert!(round > 10, "it did start out starved (admitted at frame {round})");
    assert!(round <= bound, "admitted at frame {round}, bound {bound}");
}

/// Run a B = 1 worker by hand, frames of 10 steps in 100 ms, on `arrivals` (at, request),
/// each request generating its hint; returns (id, finish time) of finished requests.
fn run_by_hand<P: yardmaster_sdk::Policy>(
    driver: &mut yardmaster_sdk::Driver<P>,
    arrivals: &[(u64, yardmaster_sdk::Request)],
    frames: u64,
) -> Vec<(u64, u64)> {
    let frame_ns = 100 * MS;
    let mut generated: std::collections::BTreeMap<u64, u32> = Default::default();
    let mut last: Vec<u64> = Vec::new();
    let mut finished = Vec::new();
    for round in 0..frames {
        let now = round * frame_ns;
        let mut events: Vec<Event> = arrivals.iter().filter(|(at, _)| *at == now).map(|(_, r)| Event::Arrival(r.clone())).collect();
        if !last.is_empty() {
            let mut done = Vec::new();
            for id in &last {
                let r = &arrivals.iter().find(|(_, r)| r.id == *id).expect("known").1;
                let g = generated.entry(*id).or_insert(0);
                *g = (*g + 10).min(r.expected_tokens);
                let over = *g >= r.expected_tokens;
                if over {
                    finished.push((*id, now));
                }
                done.push((*id, r.input_size, *g, over));
            }
            events.push(frame(10, frame_ns, &done));
        }
        events.push(Event::WorkerIdle(0));
        last = dispatched(&driver.handle(now, events));
    }
    finished
}

#[test]
fn adversarial_edf_instance_calm_completes_the_valuable_request_edf_does_not() {
    // Property 5 (Thm D.1) with B = 1: A (value ≈ 5000 tokens of prompt, 6 frames of
    // work, deadline 0.65 s) at 0; B_i (value 11, one frame of work) at i·0.1 s with
    // deadline (i+1)·0.1 s + 0.05 s, i = 1..5. EDF serves every B_i first and A misses;
    // CALM keeps A (its priority is far higher) and completes it on time.
    let mut arrivals = vec![(0, yardmaster_sdk::Request { deadline: 650 * MS, ..request(100, DS, 0, 5000, 60) })];
    for i in 1..=5u64 {
        let at = i * 100 * MS;
        arrivals.push((at, yardmaster_sdk::Request { deadline: at + 150 * MS, ..request(i, DS, at, 1, 10) }));
    }
    let params = [("p_tune", "false"), ("predictor", "oracle"), ("drop_expired", "false")];
    let a_done = |finished: &[(u64, u64)]| finished.iter().find(|(id, _)| *id == 100).map(|(_, t)| *t);
    let on_time_b =
        |finished: &[(u64, u64)]| finished.iter().filter(|(id, t)| *id != 100 && *t <= arrivals[*id as usize].1.deadline).count();

    let mut calm = testing::driver(1, 1_000_000, &params);
    let finished = run_by_hand(&mut calm, &arrivals, 20);
    let a = a_done(&finished).expect("CALM completes A");
    assert!(a <= 650 * MS, "CALM finished A at {a}, after its deadline");

    let config = testing::config(1, 1_000_000, &[("kv_bytes_per_token", "1000"), ("frame_steps", "10")]);
    let (mut edf, _) =
        yardmaster_sdk::Driver::<policy_calm_edf::CalmEdf>::new(config, Box::new(yardmaster_sdk::NullHost::new(0, 1))).expect("init");
    let finished = run_by_hand(&mut edf, &arrivals, 20);
    assert!(a_done(&finished).is_none_or(|t| t > 650 * MS), "EDF must miss A");
    assert_eq!(on_time_b(&finished), 5, "EDF earns exactly the N small requests");
}

#[test]
fn power_of_k_binds_each_request_to_exactly_one_of_its_sampled_replicas() {
    // Property 14 (first half): three replicas, K = 1 and K = 2.
    for k in ["1", "2"] {
        let mut config = testing::config(4, 1_000_000, &[("kv_bytes_per_token", "1000"), ("frame_steps", "10"), ("power_k", k)]);
        for id in 1..3 {
            let mut worker = config.workers[0];
            worker.id = id;
            config.workers.push(worker);
        }
        let (mut driver, _) =
            yardmaster_sdk::Driver::<crate::Calm>::new(config, Box::new(yardmaster_sdk::NullHost::new(0, 7))).expect("init");
        driver.handle(0, (1..=12).map(|id| Event::Arrival(request(id, DS, 0, 100, 0))).collect());
        let mut bound: std::collections::BTreeMap<u64, u32> = Default::default();
        for worker in 0..3u32 {
            let sampled: Vec<u64> = (1..=12).filter(|id| driver.policy().replicas(*id).is_some_and(|ws| ws.contains(&worker))).collect();
            for (w, run) in dispatches(&driver.handle(0, vec![Event::WorkerIdle(worker)])) {
                assert_eq!(w, worker);
                for id in run {
                    assert!(sampled.contains(&id), "K={k}: request {id} ran on replica {worker} it was not sampled for");
                    assert!(bound.insert(id, worker).is_none(), "K={k}: request {id} bound twice");
                    assert_eq!(driver.policy().replicas(id), Some(&[worker][..]), "bound, the other copies gone");
                }
            }
        }
        for id in 1..=12u64 {
            let copies = driver.policy().replicas(id).map_or(0, <[u32]>::len);
            assert!(copies >= 1 && copies <= k.parse().unwrap(), "K={k}: {id} has {copies} copies");
        }
        assert!(!bound.is_empty());
    }
}

/// A latency-sensitive candidate: P far below a DS request's (its G counts output
/// tokens only), `quota` decode steps needed this frame.
fn latency(id: u64, resident: bool, quota: u32) -> Candidate {
    Candidate {
        latency: true,
        admitted: resident,
        resident,
        held: if resident { 400 } else { 0 },
        footprint: 450,
        analysis: analysis(1.0, 30.0, quota),
        ..candidate(id, 100, 1.0)
    }
}

#[test]
fn the_ls_share_plans_latency_requests_first_and_keeps_their_cache() {
    // Issue 23: B = 4, six DS requests of high priority and two LS requests (one
    // streaming, ahead of its timeline; one new). The thesis's rule (share 0) leaves
    // both LS requests out; the LS share plans them first, the stream under way
    // before the new one.
    let mut candidates: Vec<Candidate> = (1..=6).map(|id| candidate(id, 100 + id as u32, 100.0)).collect();
    candidates.push(latency(7, false, 3));
    candidates.push(latency(8, true, 0));
    let mut s = setting(4, 0.95, Packing::Paced);
    let paper = plan_frame(&candidates, &s);
    assert!(!paper.run.iter().any(|(id, _)| *id >= 7), "{:?}", paper.run);
    s.ls_share = 0.5;
    let shared = plan_frame(&candidates, &s);
    assert_eq!(&shared.run[..2], &[(8, Role::Reserved), (7, Role::Reserved)]);
    assert_eq!(shared.run.len(), 4);
    assert!(shared.run[2..].iter().all(|(id, role)| *id <= 6 && *role == Role::Funded));

    // A DS request worth far more needs the KV cache a paused LS stream holds: the
    // guard lets it evict the stream under the thesis's rule; within the LS share the
    // stream keeps its cache (and runs).
    let mut s = setting(2, 0.95, Packing::Paced);
    s.kv_capacity = 1000;
    let better = Candidate { footprint: 700, analysis: analysis(500.0, 5000.0, 5), ..candidate(2, 100, 500.0) };
    let stream = latency(8, true, 0);
    let paper = plan_frame(&[stream.clone(), better.clone()], &s);
    assert_eq!(paper.evict, vec![(8, EvictMode::Recompute)]);
    s.ls_share = 0.5;
    let shared = plan_frame(&[stream, better], &s);
    assert!(shared.evict.is_empty(), "{:?}", shared.evict);
    assert_eq!(shared.run, vec![(8, Role::Reserved)]);
}

#[test]
fn the_ls_share_takes_no_more_than_its_slots_and_kv_and_evicts_only_other_classes() {
    // Six new LS requests, B = 4, share 0.5: two slots. KV for three LS footprints
    // (0.5 × 2800 = 1400 ≥ 3 × 450): the slots bind.
    let mut s = setting(4, 0.95, Packing::Paced);
    s.ls_share = 0.5;
    s.kv_capacity = 2800;
    let ls: Vec<Candidate> = (1..=6).map(|id| latency(id, false, 3)).collect();
    let plan = plan_frame(&ls, &s);
    let reserved: Vec<u64> = plan.run.iter().filter(|(_, r)| *r == Role::Reserved).map(|(id, _)| *id).collect();
    assert_eq!(reserved, vec![1, 2], "the first two by arrival");
    // A full cache held by a paused DS sequence: the share evicts it for an LS
    // request (no guard), but never another LS stream.
    s.kv_capacity = 1000;
    let paused_ds =
        Candidate { resident: true, held: 900, footprint: 950, analysis: analysis(100.0, 5000.0, 0), ..candidate(9, 100, 100.0) };
    let plan = plan_frame(&[paused_ds, latency(1, false, 3)], &s);
    assert_eq!(plan.evict, vec![(9, EvictMode::Recompute)]);
    assert!(plan.run.contains(&(1, Role::Reserved)));
}

#[test]
fn the_slo_timeout_keeps_deadline_requests_past_five_seconds_and_sheds_late_first_tokens() {
    // Issue 23: the thesis's 5 s `waiting_time` shed requests that would have met a
    // 20 s deadline (the `llm` preset's bursts). B = 1, the worker busy with request
    // 1: a DS request waiting 8 s is kept (its deadline is 20 s); an LS request is
    // shed once its first token can no longer be on time (2 s), not at 5 s.
    let mut driver = testing::driver(1, 1_000_000, &[]);
    driver.handle(0, vec![Event::Arrival(request(1, DS, 0, 10, 0)), Event::Arrival(request(2, DS, 0, 10, 0))]);
    assert_eq!(dispatched(&driver.handle(0, vec![Event::WorkerIdle(0)])), vec![1]);
    driver.handle(0, vec![Event::Arrival(request(3, LS, 0, 10, 0))]);
    let mut dropped = Vec::new();
    let mut t = 0;
    while t <= 8000 * MS {
        for (id, reason) in drops(&driver.handle(t, vec![tick(t)])) {
            assert_eq!(reason, DropReason::Overload);
            dropped.push((id, t));
        }
        t += 250 * MS;
    }
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    let (id, at) = dropped[0];
    assert_eq!(id, 3);
    assert!((2000 * MS..2500 * MS).contains(&at), "shed at {at}");
}
