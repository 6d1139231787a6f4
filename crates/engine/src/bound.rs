//! The optimal goodput bound's capacity: the most end-to-end requests per second the
//! cluster could serve under any decisions a policy may take, so that no policy's
//! goodput can exceed `min(offered, bound)` (metrics: "of optimal").
//!
//! A policy may scale every stage between its replica bounds within the cluster's
//! `max_workers`, run any variant, and form batches up to `max_batch`. So each stage's
//! best per-replica throughput is its fastest variant at its best batch size
//! (`b / mean(b)`, over `b ≤ max_batch` whose `mean(b)` is within the longest SLO:
//! a request riding a longer batch is late whatever else happens), a request reaching stage `i` brings
//! `pieces[i]` pieces there (fan-out), and the bound is the largest `T` for which
//! replicas `r_i = max(min_i, ⌈T·pieces_i / rate_i⌉)` fit: every `r_i ≤ max_i` and
//! `Σ r_i ≤ max_workers`. It is found by bisection on `T` (the replica total grows with
//! `T`). The bound ignores start-up and noise: it is an upper bound, not a forecast.

use super::pipeline::Pipeline;

/// The best throughput of one replica of each stage, requests (pieces) per second:
/// the fastest variant at its best batch size among those that take no longer than
/// the pipeline's longest SLO (a request riding a longer batch cannot be on time; a
/// batch of one always counts).
pub fn best_replica_rates(pipeline: &Pipeline) -> Vec<f64> {
    let longest_slo = pipeline.streams.iter().map(|s| s.slo_ns).max().unwrap_or(u64::MAX);
    pipeline
        .stages
        .iter()
        .map(|stage| {
            let batches = 1..=stage.max_batch.max(1);
            let per_variant = |v: &super::pipeline::VariantDef| {
                batches
                    .clone()
                    .filter(|&b| b == 1 || v.profile.mean(b) <= longest_slo)
                    .map(|b| b as f64 / (v.profile.mean(b).max(1) as f64 / 1e9))
                    .fold(0.0, f64::max)
            };
            stage.variants.iter().map(per_variant).fold(0.0, f64::max)
        })
        .collect()
}

/// The cluster's capacity bound in end-to-end requests per second with at most
/// `max_workers` workers (NaN when no stage is reachable by a stream).
pub fn capacity_bound(pipeline: &Pipeline, max_workers: u32) -> f64 {
    let pieces = super::pieces_per_request(pipeline);
    let rates = best_replica_rates(pipeline);
    let used: Vec<usize> = (0..pipeline.stages.len()).filter(|&i| pieces[i] > 0.0).collect();
    if used.is_empty() {
        return f64::NAN;
    }
    // Replicas stage `i` needs to carry `t` requests per second (at least its minimum).
    let needed = |i: usize, t: f64| -> f64 {
        let stage = &pipeline.stages[i];
        (t * pieces[i] / rates[i].max(f64::MIN_POSITIVE)).ceil().max(stage.min_replicas as f64)
    };
    let fits = |t: f64| -> bool {
        let mut total: f64 = (0..pipeline.stages.len()).filter(|i| !used.contains(i)).map(|i| pipeline.stages[i].min_replicas as f64).sum();
        for &i in &used {
            let r = needed(i, t);
            if r > pipeline.stages[i].max_replicas as f64 {
                return false;
            }
            total += r;
        }
        total <= max_workers as f64
    };
    // The most any allocation allows: every used stage at its most replicas.
    let mut high = used.iter().map(|&i| pipeline.stages[i].max_replicas as f64 * rates[i] / pieces[i]).fold(f64::INFINITY, f64::min);
    if !high.is_finite() || high <= 0.0 {
        return 0.0;
    }
    if fits(high) {
        return high;
    }
    let mut low = 0.0;
    if !fits(low) {
        return 0.0;
    }
    for _ in 0..100 {
        let mid = (low + high) / 2.0;
        if fits(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{LlmCosts, Profile, StageDef, StreamDef, VariantDef};
    use yardmaster_policy::contract::{DeviceKind, StageKind};

    /// A chain of stages, each `(ms per request of its variants, max batch, min, max replicas)`.
    fn chain(stages: &[(&[f64], u32, u32, u32)], max_workers: u32) -> Pipeline {
        let n = stages.len() as u32;
        let stages = stages
            .iter()
            .enumerate()
            .map(|(i, &(variants, max_batch, min, max))| StageDef {
                name: format!("s{i}"),
                kind: StageKind::Batch,
                successors: if (i as u32) + 1 < n { vec![i as u32 + 1] } else { vec![] },
                predecessors: if i > 0 { vec![i as u32 - 1] } else { vec![] },
                variants: variants
                    .iter()
                    .map(|&ms| VariantDef {
                        name: "v".into(),
                        accuracy: 1.0,
                        // 1 ms per batch plus `ms` per request: larger batches are faster per request.
                        profile: Profile::Linear { alpha_ns: ms * 1e6, beta_ns: 1e6 },
                        memory_bytes: 0,
                        fan_out: vec![],
                        cold_start_ns: 0,
                        warm_start_ns: 0,
                    })
                    .collect(),
                max_batch,
                replicas: min,
                min_replicas: min,
                max_replicas: max,
                device: DeviceKind::Gpu,
                threads: 1,
                parallel_fraction: None,
                worker_memory_bytes: 0,
                llm: LlmCosts::default(),
            })
            .collect();
        let streams = vec![StreamDef { name: "s".into(), entry: 0, slo_ns: 1_000_000_000 }];
        Pipeline { name: "t".into(), stages, streams, max_workers, hosts: vec![] }
    }

    #[test]
    fn the_bound_balances_replicas_across_stages_with_the_fastest_variant_at_its_best_batch() {
        // Stage 0: 9 ms per request + 1 ms, batch ≤ 1: 100 req/s per replica. Stage 1:
        // variants of 4 and 1 ms per request, batch ≤ 4: the fast one at batch 4 does
        // 4 / 5 ms = 800 req/s. With 5 workers: 4 replicas of stage 0 (400 req/s) and
        // one of stage 1 is the best split.
        let p = chain(&[(&[9.0], 1, 1, 8), (&[4.0, 1.0], 4, 1, 8)], 5);
        let bound = capacity_bound(&p, 5);
        assert!((bound - 400.0).abs() < 1e-6, "{bound}");
        // Replica bounds cap it: stage 0 at most 2 replicas.
        let capped = chain(&[(&[9.0], 1, 1, 2), (&[4.0, 1.0], 4, 1, 8)], 5);
        assert!((capacity_bound(&capped, 5) - 200.0).abs() < 1e-6);
        // Too few workers for the minimums: nothing fits.
        assert_eq!(capacity_bound(&p, 1), 0.0);
    }

    #[test]
    fn a_batch_longer_than_the_slo_does_not_count() {
        // One stage, 1 ms per request plus 1 ms, batches up to 64: at batch 64 (65 ms)
        // 985 req/s a replica, but with an SLO of 20 ms no request riding a batch over
        // 20 ms is on time: the best is batch 19 (20 ms), 950 req/s.
        let mut p = chain(&[(&[1.0], 64, 1, 1)], 1);
        assert!((capacity_bound(&p, 1) - 64.0 / 0.065).abs() < 1e-6);
        p.streams[0].slo_ns = 20_000_000;
        assert!((capacity_bound(&p, 1) - 19.0 / 0.020).abs() < 1e-6, "{}", capacity_bound(&p, 1));
        // Not even a batch of one fits: the batch of one counts (the bound stays a rate).
        p.streams[0].slo_ns = 1_000_000;
        assert!((capacity_bound(&p, 1) - 1.0 / 0.002).abs() < 1e-6);
    }
}
