//! Queueing formulas for capacity planning: the M/M/c (Erlang-C) mean sojourn time
//! of a stage and the fewest replicas that keep it under a latency target.
//!
//! Erlang B is computed by its recurrence `B_k = a·B_{k−1} / (k + a·B_{k−1})`, which is
//! stable for any number of servers, and Erlang C follows from it as
//! `C = B / (1 − ρ·(1 − B))`.

/// Probability that an arrival has to wait in an M/M/c queue with offered load
/// `offered = λ/μ` (in servers) and `servers` servers (Erlang C); 1 when the queue
/// is unstable (`offered ≥ servers`) or has no server.
pub fn erlang_c(offered: f64, servers: u32) -> f64 {
    if servers == 0 || offered >= servers as f64 {
        return 1.0;
    }
    if offered <= 0.0 {
        return 0.0;
    }
    let mut blocking = 1.0;
    for k in 1..=servers {
        blocking = offered * blocking / (k as f64 + offered * blocking);
    }
    let utilisation = offered / servers as f64;
    blocking / (1.0 - utilisation * (1.0 - blocking))
}

/// Mean sojourn time (queueing wait plus service), in seconds, of an M/M/c queue
/// with arrival rate `lambda` and per-server service rate `mu` (both per second):
/// `C(a, c) / (c·μ − λ) + 1/μ`. Infinite when the queue is unstable (`λ ≥ c·μ`),
/// has no server, or `mu` is not positive.
pub fn mmc_sojourn(lambda: f64, mu: f64, servers: u32) -> f64 {
    if servers == 0 || mu <= 0.0 || !mu.is_finite() {
        return f64::INFINITY;
    }
    let lambda = lambda.max(0.0);
    let capacity = servers as f64 * mu;
    if lambda >= capacity {
        return f64::INFINITY;
    }
    erlang_c(lambda / mu, servers) / (capacity - lambda) + 1.0 / mu
}

/// The fewest servers in `[min, max]` whose M/M/c mean sojourn time is at most
/// `target` seconds, or `None` when even `max` servers miss it.
pub fn mmc_min_servers(lambda: f64, mu: f64, target: f64, min: u32, max: u32) -> Option<u32> {
    (min..=max).find(|&c| mmc_sojourn(lambda, mu, c) <= target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sojourn_matches_the_textbook_values() {
        assert!(mmc_sojourn(10.0, 3.0, 3).is_infinite());
        assert!((mmc_sojourn(10.0, 3.0, 4) - 0.6622).abs() < 1e-4, "{}", mmc_sojourn(10.0, 3.0, 4));
        assert!((erlang_c(10.0 / 3.0, 4) - 0.6577).abs() < 1e-4);
        assert!((mmc_sojourn(10.0, 3.0, 5) - 0.3987).abs() < 1e-4);
        assert!((mmc_sojourn(10.0, 3.0, 6) - 0.3519).abs() < 1e-4);
    }

    #[test]
    fn one_server_is_the_mm1_queue() {
        // M/M/1: 1/(μ − λ).
        assert!((mmc_sojourn(2.0, 5.0, 1) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(mmc_sojourn(0.0, 5.0, 1), 0.2);
    }

    #[test]
    fn unstable_or_serverless_queues_never_drain() {
        assert!(mmc_sojourn(6.0, 3.0, 2).is_infinite());
        assert!(mmc_sojourn(1.0, 3.0, 0).is_infinite());
        assert!(mmc_sojourn(1.0, 0.0, 4).is_infinite());
        assert_eq!(erlang_c(5.0, 2), 1.0);
    }

    #[test]
    fn more_servers_never_make_it_slower_and_the_minimum_is_tight() {
        let mut previous = f64::INFINITY;
        for c in 1..20 {
            let t = mmc_sojourn(40.0, 7.0, c);
            assert!(t <= previous);
            previous = t;
        }
        let c = mmc_min_servers(10.0, 3.0, 0.4, 1, 8).unwrap();
        assert_eq!(c, 5);
        assert!(mmc_sojourn(10.0, 3.0, c - 1) > 0.4);
        assert_eq!(mmc_min_servers(10.0, 3.0, 0.3, 1, 8), None, "service alone takes 0.333 s");
    }
}
