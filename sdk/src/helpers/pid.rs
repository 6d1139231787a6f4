//! A PID controller with anti-windup, for feedback loops such as scaling
//! replicas to hold a latency or utilisation target.
//!
//! The controller computes `kp * e + I + D` with `e = setpoint - measurement`:
//!
//! * The integral term `I` accumulates `ki * e * dt` (it is kept in output
//!   units, so changing `ki` later would not rescale the past) and is clamped
//!   to the integral limits.
//! * The derivative term `D = -kd * d(measurement)/dt` acts on the measurement
//!   rather than on the error, so a change of setpoint causes no kick.
//! * The output is clamped to the output limits.
//!
//! Two mechanisms stop the integral from winding up:
//!
//! * **Freezing**: while [`Pid::set_frozen`] is on, the integral holds still.
//!   Use it while the actuator cannot act yet (replicas still starting), so
//!   that the error seen meanwhile does not pile up.
//! * **Conditional integration**: a step is not integrated when the output
//!   is saturated and the step would push it further into saturation; a step
//!   that would carry the output past a limit is integrated only up to it.

/// A PID controller with output and integral limits, derivative on
/// measurement, freezing and conditional integration.
#[derive(Clone, Debug, PartialEq)]
pub struct Pid {
    kp: f64,
    ki: f64,
    kd: f64,
    output_min: f64,
    output_max: f64,
    integral_min: f64,
    integral_max: f64,
    integral: f64,
    previous_measurement: Option<f64>,
    frozen: bool,
}

impl Pid {
    /// Creates a controller with proportional, integral and derivative gains
    /// and no limits.
    pub fn new(kp: f64, ki: f64, kd: f64) -> Self {
        Self {
            kp,
            ki,
            kd,
            output_min: f64::NEG_INFINITY,
            output_max: f64::INFINITY,
            integral_min: f64::NEG_INFINITY,
            integral_max: f64::INFINITY,
            integral: 0.0,
            previous_measurement: None,
            frozen: false,
        }
    }

    /// Clamps the output to `[min, max]`.
    ///
    /// # Panics
    /// Unless `min <= max`.
    #[must_use]
    pub fn with_output_limits(mut self, min: f64, max: f64) -> Self {
        assert!(min <= max, "PID output limits must satisfy min <= max, got [{min}, {max}]");
        self.output_min = min;
        self.output_max = max;
        self
    }

    /// Clamps the integral term (in output units) to `[min, max]`.
    ///
    /// # Panics
    /// Unless `min <= max`.
    #[must_use]
    pub fn with_integral_limits(mut self, min: f64, max: f64) -> Self {
        assert!(min <= max, "PID integral limits must satisfy min <= max, got [{min}, {max}]");
        self.integral_min = min;
        self.integral_max = max;
        self.integral = self.integral.clamp(min, max);
        self
    }

    /// Computes the control output for one step of `dt_secs` seconds.
    ///
    /// With a `dt_secs` that is not positive and finite, the step neither
    /// integrates nor differentiates: only the proportional and the held
    /// integral terms act. A step whose integral increment is not finite (a
    /// NaN measurement, say) is not integrated.
    pub fn update(&mut self, setpoint: f64, measurement: f64, dt_secs: f64) -> f64 {
        let error = setpoint - measurement;
        let valid_dt = dt_secs > 0.0 && dt_secs.is_finite();

        let proportional = self.kp * error;
        let derivative = match self.previous_measurement {
            Some(previous) if valid_dt => -self.kd * (measurement - previous) / dt_secs,
            _ => 0.0,
        };
        self.previous_measurement = Some(measurement);

        if valid_dt && !self.frozen {
            self.integrate(self.ki * error * dt_secs, proportional + derivative);
        }

        (proportional + self.integral + derivative).clamp(self.output_min, self.output_max)
    }

    /// Adds `step` to the integral, except for the part that would push the
    /// output (`other_terms + integral`) past the output limit it heads for.
    fn integrate(&mut self, step: f64, other_terms: f64) {
        if !step.is_finite() {
            return;
        }
        // The integral may grow until the output reaches its upper limit (or
        // shrink until it reaches the lower one), but a step never moves it
        // further once the output is saturated in the step's direction.
        let candidate = if step > 0.0 {
            let room = self.output_max - other_terms;
            (self.integral + step).min(room.max(self.integral))
        } else {
            let room = self.output_min - other_terms;
            (self.integral + step).max(room.min(self.integral))
        };
        self.integral = candidate.clamp(self.integral_min, self.integral_max);
    }

    /// Freezes (`true`) or releases (`false`) the integral term.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// `true` while the integral term is frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Clears the integral and the remembered measurement; gains, limits and
    /// the frozen flag are kept.
    pub fn reset(&mut self) {
        self.integral = 0.0;
        self.previous_measurement = None;
    }

    /// The current integral term, in output units.
    pub fn integral(&self) -> f64 {
        self.integral
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::helpers::test_rng::XorShift;

    /// First-order plant `T dy/dt = K u - y`, integrated with explicit Euler.
    struct Plant {
        gain: f64,
        time_constant: f64,
        output: f64,
    }

    impl Plant {
        fn step(&mut self, input: f64, dt: f64) -> f64 {
            self.output += dt * (self.gain * input - self.output) / self.time_constant;
            self.output
        }
    }

    fn plant(gain: f64) -> Plant {
        Plant { gain, time_constant: 1.0, output: 0.0 }
    }

    #[test]
    fn first_order_plant_converges_to_setpoint() {
        for (kp, ki, kd) in [(0.5, 1.0, 0.0), (1.0, 2.0, 0.05), (0.2, 0.5, 0.0)] {
            let mut pid = Pid::new(kp, ki, kd).with_output_limits(0.0, 100.0);
            let mut plant = plant(2.0);
            let dt = 0.01;
            let mut y = 0.0;
            for _ in 0..4_000 {
                let u = pid.update(10.0, y, dt);
                y = plant.step(u, dt);
            }
            assert!((y - 10.0).abs() < 1e-3, "gains ({kp}, {ki}, {kd}): y = {y}");
            // At steady state the integral alone supplies the input K u = y.
            assert!((pid.integral() - 5.0).abs() < 1e-2, "integral {}", pid.integral());
        }
    }

    #[test]
    fn integral_stays_bounded_under_saturation_and_recovers() {
        let (kp, ki) = (0.1, 1.0);
        let mut pid = Pid::new(kp, ki, 0.0).with_output_limits(0.0, 1.0);
        let mut plant = plant(1.0);
        let dt = 0.01;
        let mut y = 0.0;
        // Setpoint 5 is unreachable: the plant tops out at 1.
        for _ in 0..20_000 {
            let u = pid.update(5.0, y, dt);
            assert!((0.0..=1.0).contains(&u));
            y = plant.step(u, dt);
            // The integral never exceeds what saturates the output on its own.
            assert!(pid.integral() <= 1.0 + ki * 5.0 * dt, "integral {}", pid.integral());
        }
        assert!((y - 1.0).abs() < 1e-3);
        // Without anti-windup the integral would be near ki * 4 * 200 s = 800
        // and the output would stay pinned for minutes; here it recovers fast.
        let mut settled_after = None;
        for step in 0..1_000 {
            let u = pid.update(0.5, y, dt);
            y = plant.step(u, dt);
            if (y - 0.5).abs() < 0.01 {
                settled_after.get_or_insert(step);
            }
        }
        assert!(settled_after.is_some_and(|s| s < 800), "settled after {settled_after:?}");
        assert!((y - 0.5).abs() < 0.01, "y = {y}");
    }

    #[test]
    fn saturated_integral_unwinds_when_error_reverses() {
        let mut pid = Pid::new(0.0, 1.0, 0.0).with_output_limits(-1.0, 1.0);
        for _ in 0..100 {
            pid.update(1.0, 0.0, 0.1); // error +1: integrates up to the limit
        }
        // Integrated exactly up to the point where the output saturates.
        let high = pid.integral();
        assert_eq!(high, 1.0);
        let out = pid.update(0.0, 1.0, 0.1); // error -1: allowed to unwind
        assert!(pid.integral() < high);
        assert!((out - (high - 0.1)).abs() < 1e-12);
    }

    #[test]
    fn frozen_integral_does_not_change() {
        let mut pid = Pid::new(1.0, 2.0, 0.0);
        pid.update(3.0, 1.0, 0.5);
        let before = pid.integral();
        assert_eq!(before, 2.0);
        pid.set_frozen(true);
        assert!(pid.is_frozen());
        for i in 0..50 {
            let out = pid.update(10.0, f64::from(i), 0.1);
            assert_eq!(pid.integral(), before);
            // The proportional term still acts.
            assert_eq!(out, 10.0 - f64::from(i) + before);
        }
        pid.set_frozen(false);
        pid.update(10.0, 0.0, 0.1);
        assert_eq!(pid.integral(), before + 2.0);
    }

    #[test]
    fn derivative_acts_on_measurement_without_setpoint_kick() {
        let mut pid = Pid::new(0.0, 0.0, 2.0);
        assert_eq!(pid.update(0.0, 5.0, 0.1), 0.0); // no previous measurement
        assert_eq!(pid.update(100.0, 5.0, 0.1), 0.0); // setpoint jump: no kick
        let out = pid.update(100.0, 6.0, 0.5);
        assert!((out - (-2.0 * 1.0 / 0.5)).abs() < 1e-12);
        // An invalid dt neither differentiates nor integrates.
        assert_eq!(pid.update(100.0, 50.0, 0.0), 0.0);
        assert_eq!(pid.update(100.0, 60.0, f64::NAN), 0.0);
    }

    #[test]
    fn limits_clamp_output_and_integral() {
        let mut pid = Pid::new(10.0, 0.0, 0.0).with_output_limits(-1.0, 1.0);
        assert_eq!(pid.update(5.0, 0.0, 0.1), 1.0);
        assert_eq!(pid.update(-5.0, 0.0, 0.1), -1.0);
        assert_eq!(pid.update(0.05, 0.0, 0.1), 0.5);

        let mut pid = Pid::new(0.0, 1.0, 0.0).with_integral_limits(-2.0, 2.0);
        for _ in 0..100 {
            pid.update(1.0, 0.0, 1.0);
        }
        assert_eq!(pid.integral(), 2.0);
        for _ in 0..100 {
            pid.update(-1.0, 0.0, 1.0);
        }
        assert_eq!(pid.integral(), -2.0);
    }

    #[test]
    fn reset_clears_state_but_keeps_configuration() {
        let mut pid = Pid::new(1.0, 1.0, 1.0).with_output_limits(-10.0, 10.0);
        pid.update(1.0, 0.0, 1.0);
        pid.set_frozen(true);
        pid.reset();
        assert_eq!(pid.integral(), 0.0);
        assert!(pid.is_frozen());
        // No derivative on the first step after a reset.
        assert_eq!(pid.update(0.0, 3.0, 1.0), -3.0);
        assert_eq!(pid.update(0.0, 30.0, 1.0), -10.0);
    }

    #[test]
    fn nan_measurement_does_not_poison_integral() {
        let mut pid = Pid::new(0.0, 1.0, 0.0);
        pid.update(1.0, 0.0, 1.0);
        pid.update(1.0, f64::NAN, 1.0);
        assert_eq!(pid.integral(), 1.0);
    }

    #[test]
    fn random_inputs_respect_limits() {
        let mut rng = XorShift(0x1234_5678);
        for _ in 0..50 {
            let (out_lo, out_hi) = (rng.range(-10.0, 0.0), rng.range(0.0, 10.0));
            let (int_lo, int_hi) = (rng.range(-5.0, 0.0), rng.range(0.0, 5.0));
            let mut pid = Pid::new(rng.range(0.0, 3.0), rng.range(0.0, 3.0), rng.range(0.0, 1.0))
                .with_output_limits(out_lo, out_hi)
                .with_integral_limits(int_lo, int_hi);
            for _ in 0..500 {
                let before = pid.integral();
                let frozen = rng.next().is_multiple_of(4);
                pid.set_frozen(frozen);
                let out = pid.update(rng.range(-20.0, 20.0), rng.range(-20.0, 20.0), rng.range(0.001, 0.5));
                assert!((out_lo..=out_hi).contains(&out), "output {out}");
                assert!((int_lo..=int_hi).contains(&pid.integral()));
                if frozen {
                    assert_eq!(pid.integral(), before);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "PID output limits must satisfy min <= max")]
    fn inverted_output_limits_panic() {
        let _ = Pid::new(1.0, 0.0, 0.0).with_output_limits(1.0, -1.0);
    }

    #[test]
    #[should_panic(expected = "PID integral limits must satisfy min <= max")]
    fn nan_integral_limits_panic() {
        let _ = Pid::new(1.0, 0.0, 0.0).with_integral_limits(f64::NAN, 1.0);
    }
}
