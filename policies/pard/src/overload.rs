//! PARD-oc's admission (DAGOR-style overload control, spec §5): a module whose mean
//! queueing delay over a tick exceeded a threshold is overloaded; for the next tick
//! it and all of its ancestors admit a fraction `1 − α` of their arrivals, chosen
//! deterministically by a credit counter.

/// One module's throttle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Throttle {
    /// Whether arrivals are throttled this tick.
    pub active: bool,
    credit: f64,
}

impl Throttle {
    /// Decide one arrival: admitted unless throttled and out of credit.
    pub fn admit(&mut self, alpha: f64) -> bool {
        if !self.active {
            return true;
        }
        self.credit += 1.0 - alpha;
        if self.credit >= 1.0 {
            self.credit -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Mean queueing delay of the requests a module admitted during one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TickDelay {
    sum: f64,
    count: u64,
}

impl TickDelay {
    /// Record one admitted request's queueing delay (ns).
    pub fn record(&mut self, delay: f64) {
        self.sum += delay;
        self.count += 1;
    }

    /// The mean over the tick (0 without samples), and start the next tick.
    pub fn take_mean(&mut self) -> f64 {
        let mean = if self.count > 0 { self.sum / self.count as f64 } else { 0.0 };
        *self = Self::default();
        mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Property 16: while throttled, the admitted fraction per tick is 0.6 ± 1/n.
    #[test]
    fn throttle_admits_one_minus_alpha() {
        let mut throttle = Throttle::default();
        assert!((0..10).all(|_| throttle.admit(0.4)), "not throttled: all admitted");
        throttle.active = true;
        for n in [1usize, 7, 10, 55, 1000] {
            let admitted = (0..n).filter(|_| throttle.admit(0.4)).count();
            let fraction = admitted as f64 / n as f64;
            assert!((fraction - 0.6).abs() <= 1.0 / n as f64 + 1e-9, "n={n}: {fraction}");
        }
    }

    #[test]
    fn tick_delay_is_a_mean_per_tick() {
        let mut delay = TickDelay::default();
        delay.record(10.0);
        delay.record(30.0);
        assert_eq!(delay.take_mean(), 20.0);
        assert_eq!(delay.take_mean(), 0.0);
    }
}
