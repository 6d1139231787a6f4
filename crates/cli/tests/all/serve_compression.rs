//! Compression with Triton's own clients: tritonclient's HTTP
//! `request_compression_algorithm` and `response_compression_algorithm` (gzip and
//! deflate), its gRPC `compression_algorithm`, and a corrupt or unknown body encoding
//! refused with the reason, on a model of the `serve_repository` repository.

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{repository, serve_repository_with};

#[test]
fn tritonclient_compresses_requests_and_answers_over_http_and_grpc() {
    let dir = scratch("compression");
    let models = repository(&dir);
    let (server, _stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let seen = run_client("triton_compression.py", &[&server.address, &grpc, "add"]);
    let answer = serde_json::json!([2.0, 3.0, 4.0, 5.0]);
    for case in ["gzip-None", "deflate-None", "None-gzip", "None-deflate", "gzip-deflate"] {
        assert_eq!(seen["http"][case], answer, "HTTP {case}: {seen}");
    }
    for algorithm in ["gzip", "deflate"] {
        assert_eq!(seen["grpc"][algorithm], answer, "gRPC {algorithm}: {seen}");
    }
    assert_eq!(seen["corrupt"]["status"], 400, "{seen}");
    assert!(seen["corrupt"]["body"].as_str().unwrap().contains("could not be decompressed"), "{seen}");
    assert_eq!(seen["unknown"]["status"], 415, "{seen}");
    for encoding in ["gzip", "deflate"] {
        assert_eq!(seen["accept"][encoding]["content_encoding"], encoding, "the answer is compressed as asked: {seen}");
        assert_eq!(seen["accept"][encoding]["y"], answer, "{seen}");
    }
    assert!(seen["unknown"]["body"].as_str().unwrap().contains("\\\"br\\\""), "{seen}");
}
