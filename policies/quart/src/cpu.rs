//! The CPU compensator (§3.6, paper §5.3): the fewest cores per replica with which a
//! stage meets its latency target with a given number of replicas. The Smoother uses
//! it to make a reclaim safe (the remaining replicas get more cores) or to cancel the
//! reclaim; every smoothing period also gives back cores a stage no longer needs.

use yardmaster_sdk::helpers::mmc_sojourn;

use crate::view::StageView;

/// Smallest core count in `[low, max]` with which `replicas` replicas meet the stage's
/// target at its cautious arrival rate, or `None` when none does.
pub fn cores_for(view: &StageView, replicas: u32, low: u32, max: u32) -> Option<u32> {
    (low.max(1)..=max).find(|&cores| mmc_sojourn(view.lambda_smooth, view.service.rate(cores), replicas) <= view.target)
}

/// The cores a stage keeps after a smoothing period that did not shrink it: the fewest
/// from `base` up that still meet the target at its current replicas, when fewer than
/// it has now; otherwise its current cores.
pub fn released_cores(view: &StageView, base: u32, max: u32) -> u32 {
    if view.cores <= base {
        return view.cores;
    }
    match cores_for(view, view.replicas(), base, max) {
        Some(cores) if cores < view.cores => cores,
        _ => view.cores,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::tests::view;

    #[test]
    fn more_cores_make_fewer_replicas_feasible() {
        // t(2) = 20 ms, target 25 ms, λ = 60/s: 2 replicas at 2 cores miss it.
        let v = view(0.02, 0.025, 60.0, 3);
        assert_eq!(cores_for(&v, 3, 2, 16), Some(2));
        let two = cores_for(&v, 2, 2, 16).expect("feasible with more cores");
        assert!(two > 2);
        assert!(mmc_sojourn(60.0, v.service.rate(two), 2) <= 0.025);
        assert!(mmc_sojourn(60.0, v.service.rate(two - 1), 2) > 0.025);
        assert_eq!(cores_for(&v, 1, 2, 4), None, "one replica with at most 4 cores cannot carry 60/s");
    }

    #[test]
    fn cores_return_to_the_base_once_load_falls() {
        let mut v = view(0.02, 0.025, 5.0, 2);
        v.cores = 9;
        assert_eq!(released_cores(&v, 2, 16), 2);
        v.lambda_smooth = 60.0;
        let needed = released_cores(&v, 2, 16);
        assert!(needed > 2 && needed <= 9);
    }
}
