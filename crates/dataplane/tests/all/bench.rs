//! The served-vs-plain benchmark runs end to end (short settings; the numbers reported
//! come from `yardmaster dataplane bench` in release mode).

use crate::common;

use yardmaster_dataplane::assets;
use yardmaster_dataplane::bench::{self, BenchOptions};

#[test]
fn the_benchmark_measures_both_sides_and_both_starts() {
    let runtime = common::runtime();
    let spec = common::model(assets::CLS_MODEL, "cls");
    let options = BenchOptions { batch: 4, shapes: Some(vec![vec![3, 48, 192]]), runs: 4, rounds: 2, threads: 1 };
    let report = bench::served_vs_plain(&runtime, &spec, &options).unwrap();
    eprintln!("{}", report.render());
    assert!(report.plain_rps > 0.0 && report.served_rps > 0.0);
    assert_eq!(report.round_ratios.len(), 2);
    // Loose: a debug build on a shared machine; serving must not cost a multiple.
    assert!(report.ratio() > 0.3, "{}", report.render());
}
