//! Triton's system shared-memory extension with Triton's own clients (HTTP and gRPC)
//! and its shared-memory utilities: regions registered, an input read from one and the output
//! written into another (equal to a plain request's), and the bad cases refused with
//! the reason — a size past the region, an unregistered region, a key that does not
//! exist; CUDA shared memory refused with a reason that names it.

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{repository, serve_repository_with};

#[test]
fn tritonclient_infers_through_system_shared_memory_over_http_and_grpc() {
    let dir = scratch("shared-memory");
    let models = repository(&dir);
    let (server, _stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let seen = run_client("triton_shared_memory.py", &[&server.address, &grpc, "add"]);
    assert_eq!(seen["status"], serde_json::json!(["input", "output"]), "{seen}");
    assert_eq!(seen["y_from_shared_memory"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "{seen}");
    assert_eq!(seen["y_plain"], seen["y_from_shared_memory"], "{seen}");
    assert_eq!(seen["output_entry"], serde_json::json!(["datatype", "name", "shape"]), "no data, as Triton answers: {seen}");
    assert!(seen["past_the_region"].as_str().unwrap().contains("do not fit in shared memory region 'input'"), "{seen}");
    assert!(seen["after_unregister"].as_str().unwrap().contains("Unable to find system shared memory region: 'input'"), "{seen}");
    assert!(seen["missing_key"].as_str().unwrap().starts_with("Unable to open shared memory region"), "{seen}");
    assert_eq!(seen["status_after"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["grpc_status"], serde_json::json!(["input", "output"]), "{seen}");
    assert_eq!(seen["grpc_y_from_shared_memory"], serde_json::json!([2.0, 3.0, 4.0, 5.0]), "over gRPC: {seen}");
    assert!(seen["grpc_after_unregister"].as_str().unwrap().contains("Unable to find system shared memory region: 'input'"), "{seen}");
    assert_eq!(seen["grpc_status_after"], serde_json::json!({}), "{seen}");
    assert_eq!(seen["grpc_cuda_status"], serde_json::json!({}), "{seen}");
    for refusal in ["grpc_cuda_register", "http_cuda_register"] {
        assert!(seen[refusal].as_str().unwrap().contains("no CUDA device: this server runs its models on the CPU"), "{refusal}: {seen}");
    }
}

/// perf_analyzer with `--shared-memory system` on a model with a 1.2 MB input
/// (nudenet, 3×320×320 FP32) over HTTP and gRPC: every request's input and output go
/// through regions it registers, and it reports no error.
#[test]
fn perf_analyzer_drives_a_large_input_model_through_system_shared_memory() {
    use std::process::Command;
    let dir = scratch("shared-memory-perf");
    let models = repository(&dir);
    let (server, _stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    for (protocol, url) in [("http", &server.address), ("grpc", &grpc)] {
        let perf = Command::new(super::serve_repository::perf_analyzer())
            .args(["-m", "nudenet", "-u", url, "-i", protocol, "--shared-memory", "system", "--output-shared-memory-size", "400000"])
            .args(["--measurement-interval", "1500", "--stability-percentage", "80", "--max-trials", "10"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&perf.stdout).into_owned() + &String::from_utf8_lossy(&perf.stderr);
        assert!(perf.status.success(), "perf_analyzer --shared-memory system over {protocol} failed:\n{text}");
        assert!(text.contains("Successful request count"), "{protocol}: {text}");
        assert!(!text.to_lowercase().contains("error"), "{protocol}: {text}");
    }
}
