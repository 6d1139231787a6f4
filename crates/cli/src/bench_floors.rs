//! The floors `serve-bench --check` and `sim bench --check` compare against: ratios
//! written in `crates/cli/bench-floors.toml` (one `key = number` per line, `#`
//! comments), each measured within one run so that it holds across machines.

/// The floors file, as built into the binary.
const FLOORS: &str = include_str!("../bench-floors.toml");

/// The floor named `key`, and the margin a measured ratio may fall below it.
pub fn floor(key: &str) -> (f64, f64) {
    let value = |name: &str| {
        FLOORS
            .lines()
            .map(|line| line.split('#').next().unwrap_or_default())
            .filter_map(|line| line.split_once('='))
            .find(|(k, _)| k.trim() == name)
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("bench-floors.toml has no number {name}"))
    };
    (value(key), value("margin"))
}

/// Compare `measured` with the floor `key`: a line saying how it stands, and whether it
/// passes (at least the floor less the margin).
pub fn check(key: &str, measured: f64) -> (String, bool) {
    let (floor, margin) = floor(key);
    let passes = measured >= floor * (1.0 - margin);
    let verdict = if passes { "ok" } else { "BELOW THE FLOOR" };
    (format!("check {key}: {measured:.3} against floor {floor:.3} (−{:.0} % allowed): {verdict}", margin * 100.0), passes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_floor_is_read_and_a_ratio_below_it_fails() {
        for key in ["serve_http1_throughput", "serve_http3_throughput", "sim_policy_events_per_native_op"] {
            let (floor, margin) = floor(key);
            assert!(floor > 0.0 && (0.0..1.0).contains(&margin), "{key}");
            assert!(check(key, floor).1, "the floor itself passes");
            let (line, passes) = check(key, floor * (1.0 - margin) * 0.99);
            assert!(!passes && line.contains("BELOW THE FLOOR"), "{line}");
        }
    }
}
