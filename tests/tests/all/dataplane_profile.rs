//! The profiler's output is a pipeline the simulator reads, with the measured numbers:
//! profile a real model (the PP-OCR direction classifier, on the CPU), write the file,
//! load it through the engine's pipeline reader and compare.

use yardmaster_dataplane::profile::{self, ProfileOptions};
use yardmaster_dataplane::{assets, ModelKey, ModelSpec, Runtime};

#[test]
fn the_profile_file_loads_into_the_simulator_with_the_measured_numbers() {
    let runtime = Runtime::global().unwrap_or_else(|e| panic!("{e}"));
    let path = assets::model_path(assets::CLS_MODEL).unwrap_or_else(|e| panic!("{e}"));
    let spec = ModelSpec::new(ModelKey::new("ocr-cls", "mobile-v2"), path);
    let options = ProfileOptions {
        batches: vec![4, 1, 2],
        shapes: Some(vec![vec![3, 48, 192]]),
        warmup: 1,
        iterations: 5,
        threads: 1,
        start_repeats: 1,
    };
    let report = profile::profile(&runtime, &spec, &options).unwrap();
    assert_eq!(report.points.iter().map(|p| p.batch).collect::<Vec<_>>(), vec![1, 2, 4]);
    for p in &report.points {
        assert!(p.mean_ms > 0.0 && p.p50_ms <= p.p90_ms && p.p90_ms <= p.p99_ms, "{p:?}");
    }
    let text = report.to_pipeline_toml();
    let pipeline = yardmaster::formats::pipeline::from_toml(&text, "profile.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let stage = &pipeline.stages[0];
    assert_eq!(stage.name, "ocr-cls");
    assert_eq!(stage.max_batch, 4);
    let variant = &stage.variants[0];
    assert_eq!(variant.name, "mobile-v2");
    for p in &report.points {
        let simulated = variant.profile.mean(p.batch as u32) as f64 / 1e6;
        assert!((simulated - p.mean_ms).abs() < 1e-3, "batch {}: simulator {simulated} ms, measured {} ms", p.batch, p.mean_ms);
        let tail = variant.profile.tail(p.batch as u32) as f64 / 1e6;
        assert!((tail - p.p99_ms).abs() < 1e-3);
    }
    assert!((variant.cold_start_ns as f64 / 1e6 - report.cold_start_ms).abs() < 1e-2);
    assert!((variant.warm_start_ns as f64 / 1e6 - report.warm_start_ms).abs() < 1e-2);
    assert_eq!(variant.memory_bytes, report.memory_mib << 20);
    assert!(report.memory_mib >= 1);

    // A model with dynamic dimensions and no shape given is refused with advice.
    let error = profile::profile(&runtime, &spec, &ProfileOptions { shapes: None, ..options }).unwrap_err().to_string();
    assert!(error.contains("--shape"), "{error}");
}
