//! Applications nobody chose (issue 43): PARD and its baselines, with the generated
//! applications and helpers of [`super::random_apps`].

use yardmaster::sim::sweep::{capacity, LOW_LOAD_ON_TIME};

use super::random_apps::{generated, on_time, simulate};

#[test]
fn pard_spreads_the_workers_it_starts_with_as_its_plan_needs_them_on_generated_applications() {
    // An imported application starts its workers spread for each stage's best batch
    // within the whole SLO; PARD's plan runs smaller batches (within half a level's
    // budget), and the planner kept the started spread until its first epoch, 5 s in.
    // On `r20-src-mid-fan-join` of seed 1 (a source, a chain of two recognisers, then
    // a classifier and a detector side by side) PARD was 95.7 % on time at half the
    // bound; on `r19-diamond` it served 0.43 of the bound at 1x, short of workers at
    // its first stage (batches of one) while the others idled. The planner now spreads
    // the started workers by its plan at once (100 % and 0.50).
    let (name, app) = generated(1, 20);
    assert_eq!(name, "r20-src-mid-fan-join");
    let share = on_time("pard", &app, 0.5, 4.0);
    assert!(share >= LOW_LOAD_ON_TIME, "{name} at 0.5x: {:.1} % on time", 100.0 * share);
    let (name, app) = generated(1, 19);
    assert_eq!(name, "r19-diamond");
    let served = simulate("pard", &[], &app, 1.0, 4.0).goodput / capacity(&app).unwrap();
    assert!(served > 0.47, "{name} at 1x: {served:.2} of the bound");
}
