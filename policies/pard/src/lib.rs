//! `pard`: proactive request dropping for inference pipelines (Zhao et al., "PARD:
//! Enhancing Goodput for Inference Pipeline via ProActive Request Dropping",
//! EuroSys'26; spec `specs/pard.md`).
//!
//! When a request is taken out of a worker's queue for the next batch (at t_b), PARD
//! estimates its whole end-to-end latency — the time already spent, the wait for the
//! batch to start (t_e), the batch's profiled duration d_k(b_k) and a forecast of the
//! modules downstream (windowed queueing delays, profiled durations and the
//! λ-quantile of their summed batch waits, the maximum over downstream paths) — and
//! drops it at once if that exceeds its deadline: drops happen early in the pipeline,
//! before GPU time is spent on requests that would miss anyway. Each worker's queue
//! is a double-ended priority queue on the deadline, served High-Budget-First while
//! the module is overloaded (μ > 1 + ε) and Low-Budget-First while it is not
//! (μ < 1 − ε), ε following the burstiness of the input. Batch sizes and replicas
//! follow a Nexus-style planner shared with the baselines.
//!
//! The paper's ablations are parameter modes of this policy (see [`PardParams`]):
//! `estimate=back` (PARD-back), `estimate=sf` (PARD-sf), `admission=oc` (PARD-oc),
//! `budget=split` / `budget=wcl` (PARD-split, PARD-WCL), `lambda=0` / `lambda=1`
//! (PARD-lower, PARD-upper), `priority=fcfs|hbf|lbf|instant`. The baselines (naive,
//! Nexus, Clipper++) are policies of their own (`pard-naive`, `pard-nexus`,
//! `pard-clipper`).
//!
//! Modules: [`params`] (every constant, with the paper's defaults), [`estimate`]
//! (wait sampling and the downstream estimate), [`load`] (input rate, ε, μ and the
//! mode transition), [`overload`] (PARD-oc's throttle) and [`rule`] (the broker's
//! drop test and order, and the per-tick state synchronisation).

pub mod estimate;
pub mod load;
pub mod overload;
pub mod params;
pub mod rule;

pub use load::Mode;
pub use params::{Admission, Budget, Estimate, PardParams, Priority};
pub use rule::PardRule;

/// PARD as a policy: its rule on the shared broker and planner.
pub type Pard = yardmaster_sdk::helpers::BrokeredPipeline<PardRule>;

yardmaster_sdk::export_policy!(Pard);

#[cfg(test)]
mod scenarios {
    //! The paper's worked scenarios (Fig. 3a, Fig. 7) and the soundness of the drop
    //! test, on the rule directly.

    use yardmaster_sdk::helpers::{Discipline, FillContext, Filled, PriorityQueue, Queued, StageGraph, WorkerQueue};
    use yardmaster_sdk::testing::{constant_variant, one_stage};
    use yardmaster_sdk::{Ctx, DropReason, NullHost};

    use super::*;

    const MS: u64 = 1_000_000;
    /// Scenario time zero (so that earlier arrivals have positive times).
    const T0: u64 = 1_000 * MS;

    /// One module whose batches take 20 ms whatever their size.
    fn single_module(batch: u32) -> Ctx {
        Ctx::new(one_stage(vec![constant_variant(20 * MS)], batch, 1), Box::new(NullHost::default()))
    }

    fn rule(ctx: &Ctx, priority: Priority, mode: Mode) -> PardRule {
        let params = PardParams { priority, ..PardParams::default() };
        let mut rule = PardRule::with_params(ctx, &StageGraph::chain(1), params);
        rule.set_module(0, mode, 0.0);
        rule
    }

    /// A request sent and arrived at `arrived` (ms after T0, may be negative) with a
    /// deadline `deadline` ms after T0, keyed as the rule keys it.
    fn request(rule: &PardRule, id: u64, arrived: i64, deadline: u64) -> Queued {
        let at = (T0 as i64 + arrived * MS as i64) as u64;
        let mut q = Queued { id, stage: 0, sent_at: at, arrived_at: at, deadline: T0 + deadline * MS, key: 0 };
        q.key = yardmaster_sdk::helpers::PipelineRule::key(rule, &q);
        q
    }

    fn fill(rule: &mut PardRule, queue: &mut PriorityQueue, room: usize, expected_start_ms: u64) -> Filled {
        let mut out = Filled::default();
        let context = FillContext { worker: 0, stage: 0, room, open: 0, expected_start: T0 + expected_start_ms * MS, now: T0 };
        rule.fill(&single_module(4), queue, &context, &mut out);
        out
    }

    fn ids(requests: &[Queued]) -> Vec<u64> {
        requests.iter().map(|q| q.id).collect()
    }

    /// Property 10 (Fig. 3a): b = 4, d = 20 ms, worker busy until 20 ms, eight
    /// requests queued with deadlines 50, 55, …, 85 ms: HBF admits 70–85, FCFS 50–65.
    #[test]
    fn fig3a_hbf_admits_the_high_budget_half_and_fcfs_the_oldest() {
        let ctx = single_module(4);
        for (priority, mode, expected) in
            [(Priority::Adaptive, Mode::Hbf, vec![85, 80, 75, 70]), (Priority::Fcfs, Mode::Lbf, vec![50, 55, 60, 65])]
        {
            let mut rule = rule(&ctx, priority, mode);
            let mut queue = PriorityQueue::default();
            for (i, deadline) in (50..=85).step_by(5).enumerate() {
                queue.push(request(&rule, deadline, i as i64 - 8, deadline));
            }
            let out = fill(&mut rule, &mut queue, 4, 20);
            assert_eq!(ids(&out.admit), expected, "{priority:?}");
            assert!(out.drop.is_empty());
            assert_eq!(queue.len(), 4);
        }
    }

    /// Property 11 (Fig. 7): b = 2, d = 20 ms, the running batch ends at 20 ms;
    /// A (t_r −10, D 60), R5 (t_r −5, D 90), R4 (t_r −1, D 45). LBF admits R4 and A,
    /// then R5 in the next batch: all three meet the SLO. FCFS admits A and R5, and R4
    /// fails the test in the next batch (40 + 20 > 45) and is dropped.
    #[test]
    fn fig7_lbf_rescues_the_marginal_request_that_fcfs_drops() {
        let ctx = single_module(2);
        let (a, r5, r4) = (1, 5, 4);
        for (priority, first, second, dropped) in
            [(Priority::Adaptive, vec![r4, a], vec![r5], vec![]), (Priority::Fcfs, vec![a, r5], vec![], vec![r4])]
        {
            let mut rule = rule(&ctx, priority, Mode::Lbf);
            let mut queue = PriorityQueue::default();
            queue.push(request(&rule, a, -10, 60));
            queue.push(request(&rule, r5, -5, 90));
            queue.push(request(&rule, r4, -1, 45));
            let out = fill(&mut rule, &mut queue, 2, 20);
            assert_eq!(ids(&out.admit), first, "{priority:?} first batch");
            let out = fill(&mut rule, &mut queue, 2, 40);
            assert_eq!(ids(&out.admit), second, "{priority:?} second batch");
            let drops: Vec<u64> = out.drop.iter().map(|(q, _)| q.id).collect();
            assert_eq!(drops, dropped, "{priority:?} drops");
        }
    }

    /// Property 12 (unit part): every request the test drops has L > SLO at t_b and
    /// every admitted one L ≤ SLO; requests that can never pass are purged as expired.
    #[test]
    fn drop_test_is_sound() {
        let ctx = single_module(4);
        let mut source = estimate::Draws::new(3, 3);
        for case in 0..200 {
            let mode = if case % 2 == 0 { Mode::Hbf } else { Mode::Lbf };
            let mut rule = rule(&ctx, Priority::Adaptive, mode);
            let downstream = source.uniform() * 60.0 * MS as f64;
            rule.set_module(0, mode, downstream);
            let mut queue = PriorityQueue::default();
            for id in 0..12 {
                let deadline = 10 + (source.uniform() * 150.0) as u64;
                queue.push(request(&rule, id, -(source.uniform() * 30.0) as i64, deadline));
            }
            let t_e = (source.uniform() * 40.0) as u64;
            let out = fill(&mut rule, &mut queue, 4, t_e);
            // L = t_e + d_k(b_k) + L_sub, the same for every request of this decision point.
            let estimate = (T0 + t_e * MS) as f64 + 20.0 * MS as f64 + downstream;
            for admitted in &out.admit {
                assert!(estimate <= admitted.deadline as f64);
            }
            for (q, reason) in &out.drop {
                match reason {
                    DropReason::Overload => assert!(estimate > q.deadline as f64),
                    DropReason::DeadlineUnreachable => assert!(q.deadline < T0 + 20 * MS),
                    other => panic!("unexpected reason {other:?}"),
                }
            }
            assert_eq!(out.admit.len() + out.drop.len() + queue.len(), 12);
        }
    }
}
