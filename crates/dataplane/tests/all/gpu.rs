//! The CUDA path. Runs where a GPU is lent; elsewhere each test says why it skips.
//! With a GPU but a CPU-only ONNX Runtime library, the runtime must fall back to the
//! CPU and say so; with the onnxruntime-gpu library (YARDMASTER_ORT_LIB) it must pick
//! the GPU and compute what the CPU computes.

use crate::common;

use yardmaster_dataplane::{assets, device, Device, DevicePreference, ModelCache, ModelSession, Runtime, RuntimeConfig, Tensor};

fn gpu_or_skip() -> Option<Vec<device::GpuInfo>> {
    match device::discover_gpus() {
        Ok(gpus) => Some(gpus),
        Err(why) => {
            eprintln!("skipped: no GPU ({why})");
            None
        }
    }
}

#[test]
fn gpus_report_memory_telemetry() {
    let Some(gpus) = gpu_or_skip() else { return };
    for gpu in &gpus {
        assert!(gpu.total_bytes > 0 && gpu.free_bytes <= gpu.total_bytes, "{gpu:?}");
    }
}

#[test]
fn the_runtime_picks_cuda_or_explains_why_not() {
    if gpu_or_skip().is_none() {
        return;
    }
    let runtime = Runtime::init(RuntimeConfig { library: None, device: DevicePreference::Cuda(0) }).unwrap_or_else(|e| panic!("{e}"));
    let choice = runtime.device_choice();
    if device::ort_has_cuda() {
        assert_eq!(choice.device, Device::Cuda(0), "{choice:?}");
        let spec = common::model(assets::CLS_MODEL, "cls");
        let mut session = ModelSession::start(&runtime, &ModelCache::default(), &spec, 1).unwrap().session;
        let input = Tensor::filled(vec![3, 48, 192], 0.25);
        let out = session.run_batch(&[&[input]], None).unwrap();
        let sum: f32 = out[0][0].data.iter().sum();
        assert!((sum - 1.0).abs() < 1e-3, "the classifier's probabilities sum to one on the GPU: {sum}");
    } else {
        assert_eq!(choice.device, Device::Cpu);
        assert!(choice.reason.contains("no CUDA execution provider"), "{choice:?}");
    }
}
