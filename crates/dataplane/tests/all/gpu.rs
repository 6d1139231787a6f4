//! The CUDA path. Runs where a GPU is lent; elsewhere each test says why it skips.
//! With a GPU but a CPU-only ONNX Runtime library, the runtime must fall back to the
//! CPU and say so; with the onnxruntime-gpu library (YARDMASTER_ORT_LIB) it must pick
//! the GPU and compute what the CPU computes.

use crate::common;

use std::sync::mpsc;
use std::time::Duration;

use yardmaster_dataplane::profile::{self, ProfileOptions};
use yardmaster_dataplane::{
    assets, device, Device, DevicePreference, Job, ModelCache, ModelSession, Request, Runtime, RuntimeConfig, Tensor, Worker,
    WorkerContext, WorkerEvent,
};

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
        let sum: f32 = out[0][0].data.floats().iter().sum();
        assert!((sum - 1.0).abs() < 1e-3, "the classifier's probabilities sum to one on the GPU: {sum}");
    } else {
        assert_eq!(choice.device, Device::Cpu);
        assert!(choice.reason.contains("no CUDA execution provider"), "{choice:?}");
    }
}

#[test]
fn a_profile_tells_the_policy_the_memory_a_replica_holds_on_its_device() {
    let runtime = common::runtime();
    let spec = common::model(assets::CLS_MODEL, "cls");
    let options = ProfileOptions {
        batches: vec![1, 8],
        shapes: Some(vec![vec![3, 48, 192]]),
        iterations: 3,
        warmup: 1,
        start_repeats: 1,
        ..ProfileOptions::default()
    };
    let report = profile::profile(&runtime, &spec, &options).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.cached_mib > 0, "{report:?}");
    match runtime.device() {
        // On a GPU the policy is told what one replica holds there: weights, arena and
        // library workspaces (hundreds of MiB for this 1 MiB model).
        Device::Cuda(_) => {
            let gpu = report.gpu_mib.expect("a GPU profile measures GPU memory");
            assert!(gpu > report.cached_mib, "{report:?}");
            assert_eq!(report.memory_mib, gpu);
            assert!(report.to_pipeline_toml().contains(&format!("memory_mib = {gpu}  # GPU memory one replica holds")));
        }
        Device::Cpu => {
            assert_eq!(report.gpu_mib, None);
            assert_eq!(report.memory_mib, report.cached_mib);
        }
    }
}

#[test]
fn several_workers_share_one_device_and_each_computes_its_own_requests() {
    let runtime = common::runtime();
    let spec = common::model(assets::CLS_MODEL, "cls");
    let cache = common::cache();
    let (tx, events) = mpsc::channel();
    let workers: Vec<Worker> = (0..3)
        .map(|id| Worker::provision(id, spec.clone(), 1, WorkerContext { runtime: runtime.clone(), cache: cache.clone() }, tx.clone()))
        .collect();
    for _ in &workers {
        match events.recv_timeout(Duration::from_secs(120)).expect("an event") {
            WorkerEvent::Ready { .. } => {}
            other => panic!("expected Ready, got {other:?}"),
        }
    }
    // The same requests on each worker at once, and once more on a session of this thread.
    let requests: Vec<Request> =
        (0..4).map(|i| Request::new(i, vec![yardmaster_dataplane::profile::synthetic(&[3, 48, 192], 40 + i)])).collect();
    for (id, worker) in workers.iter().enumerate() {
        worker.start(Job { id: id as u64, requests: requests.clone() }).unwrap();
    }
    let mut session = ModelSession::start(&runtime, &cache, &spec, 1).unwrap().session;
    let refs: Vec<&[Tensor]> = requests.iter().map(|r| r.inputs.as_slice()).collect();
    let expected = session.run_batch(&refs, None).unwrap();
    for _ in &workers {
        match events.recv_timeout(Duration::from_secs(120)).expect("an event") {
            WorkerEvent::Finished { result, job, .. } => {
                for (out, want) in result.unwrap().iter().zip(&expected) {
                    let diff = out.outputs[0].max_abs_diff(&want[0]);
                    assert!(diff < 1e-5, "worker {job}: request {}: differs by {diff} from the same batch on one session", out.id);
                }
            }
            other => panic!("expected Finished, got {other:?}"),
        }
    }
}
