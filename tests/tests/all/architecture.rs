//! The crate graph keeps the architecture's rules (README, "Layout"): the engine depends
//! on neither driver, the two drivers do not depend on each other, and a simulator or
//! conformance build compiles no server stack. Read from `cargo metadata`, so a new
//! dependency that breaks a rule fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Package name → the names of everything it depends on at build time for its library
/// (normal dependencies, transitively; dev- and build-dependencies excluded).
fn dependency_closure() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only the dependencies of this machine's platform: those of other targets (e.g.
    // `half`'s for GPU shader targets) were never downloaded here.
    let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())).arg("-vV").output().expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &host])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata is JSON");
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id"), p["name"].as_str().expect("name")))
        .collect();
    let mut direct: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in metadata["resolve"]["nodes"].as_array().expect("resolve nodes") {
        let id = node["id"].as_str().expect("node id");
        let normal = node["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .filter(|d| d["dep_kinds"].as_array().expect("dep kinds").iter().any(|k| k["kind"].is_null()));
        direct.insert(id, normal.map(|d| d["pkg"].as_str().expect("dep id")).collect());
    }
    let mut closure = BTreeMap::new();
    for (&id, &name) in &names {
        let mut seen = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(next) = stack.pop() {
            for &dep in direct.get(next).map(Vec::as_slice).unwrap_or_default() {
                if seen.insert(dep) {
                    stack.push(dep);
                }
            }
        }
        closure.insert(name.to_string(), seen.iter().map(|d| names[d].to_string()).collect());
    }
    closure
}

#[test]
fn the_engine_and_the_drivers_keep_to_their_rooms() {
    let closure = dependency_closure();
    let deps = |crate_name: &str| closure.get(crate_name).unwrap_or_else(|| panic!("{crate_name} is a workspace crate"));
    let server_stack = ["hyper", "quinn", "h3", "h3-quinn", "ort", "tokio", "rustls", "yardmaster-dataplane"];
    for crate_name in ["yardmaster-policy", "yardmaster-engine", "yardmaster-formats", "yardmaster-sim", "yardmaster-conformance"] {
        let pulled: Vec<&str> = server_stack.iter().copied().filter(|s| deps(crate_name).contains(*s)).collect();
        assert!(pulled.is_empty(), "{crate_name} compiles part of the server stack: {pulled:?}");
    }
    for driver in ["yardmaster-sim", "yardmaster-serve", "yardmaster-conformance", "yardmaster-formats"] {
        assert!(!deps("yardmaster-engine").contains(driver), "the engine depends on {driver}");
    }
    assert!(!deps("yardmaster-sim").contains("yardmaster-serve"), "the simulator depends on the server");
    assert!(!deps("yardmaster-serve").contains("yardmaster-sim"), "the server depends on the simulator");
    assert!(!deps("yardmaster-policy").contains("yardmaster-engine"), "the policy runtime depends on the engine");
    assert!(deps("yardmaster").contains("yardmaster-serve") && deps("yardmaster").contains("yardmaster-sim"));
}
