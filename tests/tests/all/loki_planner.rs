//! The Loki planners on Loki's published traffic-analysis profiles: sizes and
//! solve cost of the MILP, and the regimes along a demand ramp.

use loki_core::model::PipelineModel;
use loki_core::planner::{resource_manager, PlanRequest, SolverLimits};
use yardmaster::engine::{Engine, EngineOptions, ManualClock};
use yardmaster::sim::executor::SimExecutor;
use yardmaster::sim::reproduce::loki::{data_dir, traffic_pipeline, CLUSTER};
use yardmaster_sdk::LatencyTable;

fn model(slo_ms: f64) -> PipelineModel {
    let pipeline = traffic_pipeline(&data_dir(), CLUSTER, slo_ms).unwrap();
    let config = yardmaster::policy::native::config_to_sdk(&Engine::<ManualClock, SimExecutor>::policy_config(
        &pipeline,
        "test",
        &EngineOptions::default(),
    ));
    PipelineModel::from_config(&config, &LatencyTable::from_config(&config), &[1, 2, 4, 8, 16, 32, 64]).unwrap()
}

#[test]
fn traffic_plans_scale_hardware_then_accuracy() {
    let model = model(500.0);
    let factors = loki_core::model::offline_factors(&model, &[vec![0.94, 0.06]]);
    let mut previous: Option<loki_core::plan::Plan> = None;
    let mut last_accuracy = 1.0;
    for demand in [20.0, 150.0, 400.0, 1200.0] {
        let request = PlanRequest {
            model: &model,
            factors: &factors,
            demand,
            cluster: CLUSTER,
            cap_ms: 250.0,
            limits: SolverLimits { max_nodes: 60, ..SolverLimits::default() },
            previous: previous.as_ref(),
            fill_spare: true,
            slack: 1.0,
        };
        let (plan, stats) = resource_manager(&request);
        assert!(plan.workers() <= CLUSTER);
        assert!(plan.accuracy <= last_accuracy + 1e-9, "D = {demand}: {} after {last_accuracy}", plan.accuracy);
        last_accuracy = plan.accuracy;
        match demand as u32 {
            20 | 150 => {
                assert_eq!(plan.regime, loki_core::plan::Regime::Hardware, "D = {demand}");
                assert!(plan.workers() < CLUSTER);
            }
            _ => {
                assert_eq!(plan.regime, loki_core::plan::Regime::Accuracy, "D = {demand}");
                assert!(plan.accuracy < 1.0 && plan.workers() == CLUSTER, "D = {demand}: {plan:?}");
                assert!(stats.size.0 > 100, "the MILP over the augmented graph: {:?}", stats.size);
            }
        }
        previous = Some(plan);
    }
}

#[test]
fn plan_job_slices_are_small() {
    use loki_core::planner::{start, Started};
    let model = model(500.0);
    let factors = loki_core::model::offline_factors(&model, &[vec![0.94, 0.06]]);
    let limits = SolverLimits { work_slice: 2_000_000, max_nodes: 60, ..SolverLimits::default() };
    let request = PlanRequest {
        model: &model,
        factors: &factors,
        demand: 300.0,
        cluster: CLUSTER,
        cap_ms: 250.0,
        limits,
        previous: None,
        fill_spare: true,
        slack: 1.0,
    };
    let Started::Pending(interim, mut job) = start(&request) else { panic!("past the hardware capacity") };
    let interim = interim.expect("the greedy plan serves while the MILP runs");
    let mut slices = 0;
    let plan = loop {
        slices += 1;
        if let Some(plan) = job.advance(&model, None) {
            break plan;
        }
        assert!(slices < 200);
    };
    assert!(slices > 1, "the solve is spread over several calls");
    assert!(plan.accuracy >= interim.accuracy - 1e-9, "the MILP never does worse than its warm start");
}
