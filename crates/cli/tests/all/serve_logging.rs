//! Triton's logging extension with Triton's own clients: the settings read over HTTP
//! and gRPC, the verbosity raised while serving and the server's log then showing the
//! debug records it did not show before, and a setting it cannot honour refused.

use super::serve_end_to_end::{run_client, scratch};
use super::serve_repository::{repository, serve_repository_with};

#[test]
fn tritonclient_reads_and_changes_the_log_settings_and_the_log_follows() {
    let dir = scratch("logging");
    let models = repository(&dir);
    let (server, stderr) = serve_repository_with(&dir, &models, &[]);
    let grpc = server.grpc.clone().expect("the banner names the gRPC address");
    let seen = run_client("triton_logging.py", &[&server.address, &grpc, "add", stderr.to_str().unwrap()]);
    assert_eq!(seen["initial"]["log_verbose_level"], 0, "{seen}");
    assert_eq!(seen["initial"]["log_warning"], true, "{seen}");
    assert_eq!(seen["debug_before"], 0, "no debug records at the default level: {seen}");
    assert_eq!(seen["raised"]["log_verbose_level"], 1, "{seen}");
    assert!(seen["debug_after"].as_u64().unwrap() > 0, "debug records once raised: {seen}");
    assert_eq!(seen["grpc_read"]["settings"]["log_verbose_level"]["uint32_param"], 1, "{seen}");
    assert_eq!(seen["grpc_lowered"]["settings"]["log_verbose_level"]["uint32_param"], 0, "{seen}");
    assert!(seen["refused"].as_str().unwrap().contains("log_file"), "{seen}");
}
