//! Applications nobody chose (issue 43): FLEX and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].

use yardmaster::sim::sweep::CLIFF_FRACTION;

use super::random_apps::{generated, simulate};

#[test]
fn flex_holds_past_capacity_on_a_generated_mid_fan_out_by_serving_the_freshest_requests_first() {
    // `r10-mid-fan` of seed 1: a face recogniser, then an EfficientNet that fans out to
    // two more, SLO 113 ms. Past capacity FLEX's window at the first two stages took the
    // requests with the earliest deadlines that fit, so each left with the least time a
    // batch there allowed and the branches dropped what waited longer (after both first
    // stages had worked for it): 0.85 of the bound at 1×, 0.72 at 5×, 0.70 at 10×
    // (sweep, 5 s). Above the fan-out a loaded stage now serves the freshest window
    // (`fresh_window`), and a pipeline dispatches once per stage and instant
    // (`coalesce`). 3-s runs: 4,988/s at 1×, 4,504/s at 5× (0.90), and 4,016/s (0.81)
    // with the earliest window and a dispatch per arrival, as before.
    let (name, app) = generated(1, 10);
    assert_eq!(name, "r10-mid-fan");
    let at_capacity = simulate("flex", &[], &app, 1.0, 3.0).goodput;
    let past = simulate("flex", &[], &app, 5.0, 3.0).goodput;
    let paper = [("fresh_window", "false"), ("coalesce", "false")];
    let paper_past = simulate("flex", &paper, &app, 5.0, 3.0).goodput;
    eprintln!("{name}: {at_capacity:.0}/s at 1×, {past:.0}/s at 5×, {paper_past:.0}/s at 5× with the earliest window");
    assert!(past >= CLIFF_FRACTION * at_capacity, "{name}: {past:.0}/s at 5× against {at_capacity:.0}/s at 1×");
    assert!(
        paper_past < CLIFF_FRACTION * at_capacity,
        "{name} with the earliest window: {paper_past:.0}/s at 5× against {at_capacity:.0}/s at 1×"
    );
}
