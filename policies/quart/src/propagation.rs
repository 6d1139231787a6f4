//! CV prediction along the pipeline (§3.4 (b), the analytic default): the
//! coefficient of variation of a stage's inter-arrival times is predicted from its
//! predecessors' with the QNA departure-process approximation,
//! `ĈV² = 1 + (1 − ρ²)(CV_p² − 1) + ρ²(c_s² − 1)/√c`. Low input CV grows downstream
//! and high input CV is damped by the stages' throughput limit. Also the Smoother's
//! buffer function `β(CV)`.

/// The departure CV of a stage with `servers` replicas at utilisation `rho`, fed with
/// arrival CV `cv_in`, whose service times have squared CV `service_scv`.
pub fn departure_cv(cv_in: f64, rho: f64, servers: u32, service_scv: f64) -> f64 {
    let rho2 = rho.clamp(0.0, 1.0).powi(2);
    let c = servers.max(1) as f64;
    let scv = 1.0 + (1.0 - rho2) * (cv_in * cv_in - 1.0) + rho2 * (service_scv - 1.0) / c.sqrt();
    scv.max(0.0).sqrt()
}

/// One stage's inputs to the prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowStage {
    /// Arrival rate.
    pub lambda: f64,
    /// Utilisation of its replicas.
    pub rho: f64,
    /// Replicas.
    pub servers: u32,
    /// Measured arrival CV, if enough samples.
    pub cv_measured: Option<f64>,
}

/// Predicted arrival CV of every stage. `order` lists the stages so that each comes
/// after its predecessors; an entry stage gets its measured CV (1 without one); a
/// stage with several predecessors mixes their departure SCVs weighted by rate. A
/// predecessor's measured CV is used when it has one, else its prediction.
pub fn predict_cvs(stages: &[FlowStage], predecessors: &[Vec<usize>], order: &[usize], service_scv: f64) -> Vec<f64> {
    let mut predicted = vec![1.0; stages.len()];
    for &i in order {
        let preds = &predecessors[i];
        if preds.is_empty() {
            predicted[i] = stages[i].cv_measured.unwrap_or(1.0);
            continue;
        }
        let total: f64 = preds.iter().map(|&p| stages[p].lambda).sum();
        let mut scv = 0.0;
        for &p in preds {
            let weight = if total > 0.0 { stages[p].lambda / total } else { 1.0 / preds.len() as f64 };
            let cv_in = stages[p].cv_measured.unwrap_or(predicted[p]);
            scv += weight * departure_cv(cv_in, stages[p].rho, stages[p].servers, service_scv).powi(2);
        }
        predicted[i] = scv.sqrt();
    }
    predicted
}

/// The Smoother's buffer `β(CV) = α + (1 − α)·σ(CV/CV_th − 1)`: near 1 for bursty
/// stages (keep the own allocation), lower for smooth ones.
pub fn buffer(cv: f64, alpha: f64, cv_threshold: f64) -> f64 {
    let x = cv / cv_threshold.max(1e-9) - 1.0;
    alpha + (1.0 - alpha) / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_specified_propagation_values() {
        assert!((departure_cv(0.1, 0.5, 1, 0.05) - 0.1414).abs() < 1e-3);
        assert!((departure_cv(4.0, 0.9, 1, 0.05) - 1.755).abs() < 1e-3);
    }

    #[test]
    fn a_chain_converges_monotonically_to_the_service_cv_from_both_sides() {
        let limit = 0.05f64.sqrt();
        for start in [0.1, 4.0] {
            let mut cv = start;
            let mut gap = (cv - limit).abs();
            for _ in 0..60 {
                let next = departure_cv(cv, 0.7, 1, 0.05);
                let next_gap = (next - limit).abs();
                assert!(next_gap <= gap + 1e-12, "monotone from {start}");
                if next_gap > 1e-9 {
                    assert_eq!((next - limit).signum(), (cv - limit).signum(), "never crosses");
                }
                cv = next;
                gap = next_gap;
            }
            assert!(gap < 1e-3, "from {start}: {cv}");
        }
    }

    #[test]
    fn prediction_walks_the_chain_and_prefers_measurements() {
        let stage = |cv| FlowStage { lambda: 10.0, rho: 0.5, servers: 1, cv_measured: cv };
        let stages = [stage(Some(0.1)), stage(None), stage(None)];
        let preds = vec![vec![], vec![0], vec![1]];
        let cvs = predict_cvs(&stages, &preds, &[0, 1, 2], 0.05);
        assert_eq!(cvs[0], 0.1);
        assert!((cvs[1] - 0.1414).abs() < 1e-3);
        assert!(cvs[2] > cvs[1], "low CV rises downstream");
        let measured = [stage(Some(0.1)), stage(Some(2.0)), stage(None)];
        let cvs = predict_cvs(&measured, &preds, &[0, 1, 2], 0.05);
        assert!((cvs[2] - departure_cv(2.0, 0.5, 1, 0.05)).abs() < 1e-12);
    }

    #[test]
    fn buffer_values() {
        for (cv, beta) in [(0.0, 0.634), (0.1, 0.645), (1.0, 0.75), (2.0, 0.866), (4.0, 0.976), (8.0, 1.0)] {
            assert!((buffer(cv, 0.5, 1.0) - beta).abs() < 1e-3, "β({cv}) = {}", buffer(cv, 0.5, 1.0));
        }
    }
}
