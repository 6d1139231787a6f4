//! The per-replica service-time model of a stage as a function of its CPU cores:
//! the regression `t(C) = a + b/C` (paper §5.3), so `μ(C) = 1/t(C)`.
//!
//! Without an offline profile the model is anchored on the profiled time `t₀` at the
//! base core count `C₀`: a serial share `s` of `t₀` does not speed up and the rest
//! scales with `C₀/C`, i.e. `a = s·t₀` and `b = (1 − s)·C₀·t₀`. The default `s = 0.34`
//! reproduces the paper's measurement that going from 2 to 4 cores cuts latency by a
//! third.

/// `t(C) = a + b/C`, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServiceModel {
    /// Seconds that do not depend on the cores.
    pub fixed_s: f64,
    /// Seconds·cores that divide among the cores.
    pub per_core_s: f64,
}

impl ServiceModel {
    /// The model through `base_time_s` at `base_cores`, with `serial_share` of it fixed.
    pub fn anchored(base_time_s: f64, base_cores: u32, serial_share: f64) -> Self {
        let share = serial_share.clamp(0.0, 1.0);
        Self { fixed_s: share * base_time_s, per_core_s: (1.0 - share) * base_cores.max(1) as f64 * base_time_s }
    }

    /// Service time of one request with `cores` cores, in seconds.
    pub fn time(&self, cores: u32) -> f64 {
        self.fixed_s + self.per_core_s / cores.max(1) as f64
    }

    /// Service rate of one replica with `cores` cores, requests per second.
    pub fn rate(&self, cores: u32) -> f64 {
        let t = self.time(cores);
        if t > 0.0 {
            1.0 / t
        } else {
            f64::INFINITY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_share_reproduces_the_papers_core_scaling() {
        let model = ServiceModel::anchored(0.0206, 2, 0.34);
        assert!((model.time(2) - 0.0206).abs() < 1e-12);
        let ratio = |c| model.time(c) / model.time(2);
        assert!((ratio(4) - 0.67).abs() < 1e-9);
        assert!((ratio(8) - 0.505).abs() < 1e-9);
        assert!((ratio(16) - 0.4225).abs() < 1e-9);
        assert!((model.per_core_s - 1.32 * 0.0206).abs() < 1e-12);
        assert!((model.rate(2) - 1.0 / 0.0206).abs() < 1e-9);
    }
}
