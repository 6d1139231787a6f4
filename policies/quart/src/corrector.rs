//! Key-stage detection and the Replica Corrector (§3.3, paper §5.1): a stage whose
//! latency estimate exceeds its target is a key stage this period; a PID controller
//! on its relative error says how many replicas to add. The Corrector never removes
//! replicas, freezes the integral while replicas start (anti-windup), and when the
//! cluster has too few free GPUs it hands them out one at a time, most congested
//! stage first.

use yardmaster_sdk::helpers::Pid;

use crate::params::Params;
use crate::view::StageView;

/// Per-stage controller state.
#[derive(Debug, Clone)]
struct StageControl {
    pid: Pid,
    /// Consecutive periods in which the stage was not key.
    calm: u32,
}

/// What one Corrector period decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Correction {
    /// Per stage: the relative latency error `e_i`.
    pub errors: Vec<f64>,
    /// Per stage: key (`e_i > 0`) this period.
    pub key: Vec<bool>,
    /// Per stage: replicas granted this period.
    pub granted: Vec<u32>,
    /// Per stage: the target replica count `ŷ_i` (serving + starting + granted).
    pub targets: Vec<u32>,
}

/// The Replica Corrector.
#[derive(Debug, Clone)]
pub struct Corrector {
    stages: Vec<StageControl>,
    e_max: f64,
    period_s: f64,
}

/// Consecutive calm periods after which a stage's controller forgets its history.
const CALM_RESET: u32 = 3;

impl Corrector {
    /// A Corrector for `stages` stages with the gains and limits of `params`.
    pub fn new(stages: usize, params: &Params) -> Self {
        // The SDK's integral is kept in output units: `ki·I` with `I ≤ I_max`.
        let limit = params.ki.abs() * params.i_max;
        let pid = Pid::new(params.kp, params.ki, params.kd).with_integral_limits(0.0, limit);
        Self { stages: vec![StageControl { pid, calm: 0 }; stages], e_max: params.e_max, period_s: params.control_period_s() }
    }

    /// The integral term of a stage's controller (for tests and metrics).
    pub fn integral(&self, stage: usize) -> f64 {
        self.stages[stage].pid.integral()
    }

    /// One period: errors, key stages, PID replica increments bounded by
    /// `[r_min, r_max]` per stage (`bounds`) and by `free_gpus` overall.
    pub fn correct(&mut self, views: &[StageView], bounds: &[(u32, u32)], free_gpus: u32) -> Correction {
        let n = views.len();
        let errors: Vec<f64> = views.iter().map(|v| v.error(self.e_max)).collect();
        let key: Vec<bool> = errors.iter().map(|&e| e > 0.0).collect();
        let mut wanted = vec![0u32; n];
        for i in 0..n {
            let control = &mut self.stages[i];
            if !key[i] {
                control.calm += 1;
                if control.calm >= CALM_RESET {
                    control.pid.reset();
                }
                continue;
            }
            control.calm = 0;
            let view = &views[i];
            // Anti-windup: hold the integral while replicas are starting.
            control.pid.set_frozen(view.pending > 0);
            // Error `e` as the PID's `setpoint − measurement`; the derivative acts on
            // the measurement `−e`, i.e. on `+de/dt`.
            let u = control.pid.update(0.0, -errors[i], self.period_s);
            let step = if u.is_finite() { u.ceil().max(1.0) as u32 } else { 1 };
            let current = view.replicas();
            let stable = (view.lambda / view.mu()).floor() as u32 + 1;
            let (_, r_max) = bounds[i];
            let target = current.saturating_add(step).max(stable).min(r_max);
            wanted[i] = target.saturating_sub(current);
        }
        let granted = grant(&wanted, &errors, views, free_gpus);
        let targets = views.iter().zip(&granted).map(|(v, g)| v.replicas() + g).collect();
        Correction { errors, key, granted, targets }
    }
}

/// Hand out GPUs: everything asked when it fits; otherwise one replica at a time,
/// round-robin over the asking stages by descending error (then longer queue, then
/// lower id).
fn grant(wanted: &[u32], errors: &[f64], views: &[StageView], free: u32) -> Vec<u32> {
    let total: u32 = wanted.iter().sum();
    if total <= free {
        return wanted.to_vec();
    }
    let mut order: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i] > 0).collect();
    order.sort_by(|&a, &b| errors[b].total_cmp(&errors[a]).then(views[b].queue.total_cmp(&views[a].queue)).then(a.cmp(&b)));
    let mut granted = vec![0u32; wanted.len()];
    let mut left = free;
    while left > 0 {
        let mut progressed = false;
        for &i in &order {
            if left > 0 && granted[i] < wanted[i] {
                granted[i] += 1;
                left -= 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    granted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::tests::view;

    fn bounds(n: usize) -> Vec<(u32, u32)> {
        vec![(1, 8); n]
    }

    #[test]
    fn the_congested_stage_gets_the_spare_gpu_first() {
        // Spec property 2: 8 stages at 1 replica, stage 4 (index 3) 1.5× slower,
        // targets 1.25·t_i, λ = 0.5·μ_4, one spare GPU.
        let t = 0.02;
        let mu4 = 1.0 / (1.5 * t);
        let lambda = 0.5 * mu4;
        let views: Vec<StageView> = (0..8)
            .map(|i| {
                let ti = if i == 3 { 1.5 * t } else { t };
                view(ti, 1.25 * ti, lambda, 1)
            })
            .collect();
        let mut corrector = Corrector::new(8, &Params::defaults());
        let c = corrector.correct(&views, &bounds(8), 1);
        assert!(c.errors[3] >= 0.6 - 1e-9, "{:?}", c.errors);
        for i in (0..8).filter(|&i| i != 3) {
            assert!((c.errors[i] - 0.2).abs() < 0.01, "stage {i}: {}", c.errors[i]);
        }
        assert_eq!(c.granted, vec![0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(c.targets[3], 2);
    }

    #[test]
    fn with_equal_errors_the_longest_queue_wins() {
        let mut views: Vec<StageView> = (0..3).map(|_| view(0.02, 0.025, 100.0, 1)).collect();
        views[2].queue = 30.0;
        views[1].queue = 10.0;
        let mut corrector = Corrector::new(3, &Params::defaults());
        let c = corrector.correct(&views, &bounds(3), 1);
        assert_eq!(c.granted, vec![0, 0, 1]);
        let c = Corrector::new(3, &Params::defaults()).correct(&views, &bounds(3), 2);
        assert_eq!(c.granted, vec![0, 1, 1]);
    }

    #[test]
    fn healthy_stages_never_get_replicas_and_nothing_is_ever_removed() {
        let mut views: Vec<StageView> = (0..4).map(|_| view(0.02, 0.05, 5.0, 4)).collect();
        views[1].lambda = 400.0; // overloaded
        let mut corrector = Corrector::new(4, &Params::defaults());
        for _ in 0..10 {
            let c = corrector.correct(&views, &bounds(4), 100);
            for (i, v) in views.iter().enumerate() {
                assert!(c.targets[i] >= v.replicas(), "scale-up only");
                if c.errors[i] <= 0.0 {
                    assert_eq!(c.granted[i], 0);
                } else {
                    assert!(c.granted[i] >= 1 || c.targets[i] == 8);
                }
            }
            views[1].ready = c.targets[1];
        }
        assert_eq!(views[1].ready, 8, "capped at r_max");
    }

    #[test]
    fn the_increment_grows_with_the_error() {
        let mut previous = 0;
        for lambda in [55.0, 70.0, 90.0, 120.0, 200.0, 400.0] {
            let v = vec![view(0.02, 0.025, lambda, 2)];
            let c = Corrector::new(1, &Params::defaults()).correct(&v, &bounds(1), 100);
            assert!(c.granted[0] >= previous, "λ={lambda}: {} < {previous}", c.granted[0]);
            previous = c.granted[0];
        }
        assert!(previous > 1);
    }

    #[test]
    fn no_windup_while_replicas_start() {
        // Constant overload; replicas take several periods to start. While some are
        // pending, the integral is frozen and the target stops rising once the model
        // with pending replicas counted meets the target.
        let params = Params::defaults();
        let mut corrector = Corrector::new(1, &params);
        let mut v = view(0.02, 0.03, 150.0, 1);
        let c_star = v.floor_at(2, 1, 64).unwrap();
        let mut max_step = 0;
        let mut integral_before = None;
        for period in 0..30 {
            let c = corrector.correct(std::slice::from_ref(&v), &[(1, 64)], 1000);
            max_step = max_step.max(c.granted[0]);
            if v.pending > 0 {
                if let Some(before) = integral_before {
                    assert!(corrector.integral(0) <= before, "the integral never grows while replicas start");
                }
                assert!(c.targets[0] <= c_star + max_step, "period {period}: {} vs c*={c_star}", c.targets[0]);
            }
            integral_before = Some(corrector.integral(0));
            // Replicas become ready after 15 periods (30 s cold start).
            v.pending += c.granted[0];
            if period == 15 {
                v.ready += v.pending;
                v.pending = 0;
            }
        }
        assert!(v.replicas() <= c_star + max_step);
        assert!(v.replicas() >= c_star);
    }
}
