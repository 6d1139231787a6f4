//! The Pipeline Stage Smoother (§3.5, paper §5.2 Eq. 7): every smoothing period it
//! gives back at most one surplus replica per non-key stage. The new count blends the
//! stage's own allocation with its neighbours' demand, weighted by the buffer `β` of
//! its predicted CV (bursty stages keep what they have). It never goes below the
//! replicas the latency target needs (the M/M/c floor at the most cores), and the CPU
//! compensator must find cores that make the smaller count meet the target, or the
//! reclaim is cancelled.

use yardmaster_sdk::Instant;

use crate::cpu::cores_for;
use crate::propagation::buffer;
use crate::view::StageView;

/// The Smoother's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmootherSettings {
    /// Fewest replicas per stage.
    pub r_min: u32,
    /// Most replicas per stage.
    pub r_max: u32,
    /// Base cores per replica.
    pub base_cores: u32,
    /// Most cores per replica.
    pub max_cores: u32,
    /// Compensate with cores (off: a reclaim must be feasible at the stage's cores).
    pub cpu_compensation: bool,
    /// Floor of the buffer function.
    pub buffer_alpha: f64,
    /// CV at which the buffer is halfway up.
    pub cv_threshold: f64,
    /// No reclaim within this long of a stage's last scale action.
    pub cooldown: u64,
}

/// One stage's situation as the Smoother sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SmoothInput<'a> {
    /// The stage now.
    pub view: &'a StageView,
    /// The Corrector's target this period, `ŷ_i`.
    pub target: u32,
    /// Key this period.
    pub key: bool,
    /// Predicted arrival CV.
    pub cv: f64,
    /// Mean demand `d_j` of the neighbouring stages (its own demand when it has none).
    pub neighbour_demand: f64,
    /// When the stage was last scaled.
    pub last_action: Option<Instant>,
}

/// A reclaim the Smoother decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reclaim {
    /// New replica count `r'_i` (one less than `ŷ_i`).
    pub replicas: u32,
    /// Cores per replica from now on, `C_i* ≥ C_i`.
    pub cores: u32,
    /// The M/M/c floor the reclaim respected.
    pub floor: u32,
}

/// Decide the reclaim of one stage at `now`, or `None` to keep `ŷ_i`.
pub fn smooth_stage(input: &SmoothInput<'_>, settings: &SmootherSettings, now: Instant) -> Option<Reclaim> {
    let view = input.view;
    let cooled = input.last_action.is_none_or(|at| now.saturating_sub(at) >= settings.cooldown);
    if input.key || view.pending > 0 || !cooled || input.target <= settings.r_min {
        return None;
    }
    let beta = buffer(input.cv, settings.buffer_alpha, settings.cv_threshold);
    let blended = beta * input.target as f64 + (1.0 - beta) * input.neighbour_demand;
    let floor_cores = if settings.cpu_compensation { settings.max_cores } else { view.cores };
    let floor = view.floor_at(floor_cores, settings.r_min, settings.r_max).unwrap_or(input.target);
    let rounded = (blended + 0.5).floor().max(0.0) as u32;
    let candidate = input.target.min(rounded.max(floor).max(input.target - 1).max(settings.r_min));
    if candidate >= input.target {
        return None;
    }
    let cores = if settings.cpu_compensation {
        cores_for(view, candidate, view.cores, settings.max_cores)?
    } else {
        cores_for(view, candidate, view.cores, view.cores)?
    };
    Some(Reclaim { replicas: candidate, cores: cores.max(view.cores), floor })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;
    use crate::view::tests::view;
    use yardmaster_sdk::helpers::mmc_sojourn;

    fn settings() -> SmootherSettings {
        let p = Params::defaults();
        SmootherSettings {
            r_min: p.r_min,
            r_max: p.r_max,
            base_cores: p.base_cores,
            max_cores: p.max_cores,
            cpu_compensation: true,
            buffer_alpha: p.buffer_alpha,
            cv_threshold: p.cv_threshold,
            cooldown: p.cooldown,
        }
    }

    const LATER: Instant = 1_000_000_000_000;

    fn input(view: &StageView, cv: f64) -> SmoothInput<'_> {
        SmoothInput { view, target: 4, key: false, cv, neighbour_demand: 1.0, last_action: None }
    }

    #[test]
    fn a_smooth_stage_gives_one_back_and_a_bursty_one_keeps_its_replicas() {
        // Spec property 10: ŷ = 4, neighbour demand 1, light load (floor ≤ 3).
        let v = view(0.02, 0.05, 20.0, 4);
        let smooth = smooth_stage(&input(&v, 0.1), &settings(), LATER).expect("reclaims");
        assert_eq!(smooth.replicas, 3);
        assert!(smooth.floor <= 3);
        assert_eq!(smooth_stage(&input(&v, 4.0), &settings(), LATER), None);
    }

    #[test]
    fn never_below_the_latency_floor_nor_more_than_one_per_period() {
        // Sweep loads and neighbour demands: every reclaim respects the bounds.
        let s = settings();
        for lambda in [1.0, 20.0, 60.0, 100.0, 150.0, 190.0, 250.0] {
            for target in 2..=8 {
                for demand in [0.0, 0.5, 3.0] {
                    let v = view(0.02, 0.03, lambda, target);
                    let i = SmoothInput { view: &v, target, key: false, cv: 0.0, neighbour_demand: demand, last_action: None };
                    let Some(r) = smooth_stage(&i, &s, LATER) else { continue };
                    let floor = v.floor_at(s.max_cores, s.r_min, s.r_max).unwrap();
                    assert!(r.replicas >= floor, "λ={lambda} ŷ={target}: {} < floor {floor}", r.replicas);
                    assert!(r.replicas < target && target - r.replicas <= 1);
                    assert!(r.replicas >= s.r_min);
                    // CPU compensation: more cores, and the target is met.
                    assert!(r.cores >= v.cores);
                    assert!(mmc_sojourn(lambda, v.service.rate(r.cores), r.replicas) <= v.target);
                }
            }
        }
    }

    #[test]
    fn key_starting_or_recently_scaled_stages_are_left_alone() {
        let s = settings();
        let v = view(0.02, 0.05, 20.0, 4);
        let mut i = input(&v, 0.1);
        assert!(smooth_stage(&i, &s, LATER).is_some());
        i.key = true;
        assert!(smooth_stage(&i, &s, LATER).is_none());
        i.key = false;
        i.last_action = Some(LATER - s.cooldown + 1);
        assert!(smooth_stage(&i, &s, LATER).is_none());
        i.last_action = Some(LATER - s.cooldown);
        assert!(smooth_stage(&i, &s, LATER).is_some());
        let mut starting = v.clone();
        starting.pending = 1;
        assert!(smooth_stage(&input(&starting, 0.1), &s, LATER).is_none());
    }

    #[test]
    fn an_infeasible_reduction_is_cancelled() {
        // With compensation off, a reclaim must already meet the target at the
        // current cores; at λ = 120/s three replicas at 2 cores do not.
        let mut s = settings();
        s.cpu_compensation = false;
        let v = view(0.02, 0.03, 120.0, 4);
        assert!(mmc_sojourn(120.0, v.mu(), 3) > 0.03);
        assert_eq!(smooth_stage(&input(&v, 0.0), &s, LATER), None);
        // With compensation, more cores make it feasible.
        s.cpu_compensation = true;
        let r = smooth_stage(&input(&v, 0.0), &s, LATER).expect("compensated");
        assert_eq!(r.replicas, 3);
        assert!(r.cores > 2);
    }
}
