//! Loading policy components: identity, caching, and refusals with clear reasons.

use yardmaster::policy::{Limits, LoadError, Mode, PolicyLoader, Sandbox};
use yardmaster_policy_artifacts::{fixtures, SHIPPED};
use yardmaster_tests::loader;

fn sha256_hex(loader: &PolicyLoader, name: &str, bytes: &[u8]) -> String {
    loader.load(name, bytes).expect("loads").sha256_hex()
}

#[test]
fn shipped_policies_load_and_are_identified() {
    let loader = loader(Mode::Serve, Limits::default());
    assert!(SHIPPED.len() >= 2, "fifo and edf are shipped");
    for artifact in SHIPPED {
        let module = loader.load(artifact.name, artifact.bytes).expect("shipped policy loads");
        assert_eq!(module.name(), artifact.name);
        assert_eq!(module.size(), artifact.bytes.len());
        assert_eq!(module.sha256_hex().len(), 64);
        assert!(!module.from_cache(), "first load compiles");
    }
    let fifo = SHIPPED.iter().find(|a| a.name == "fifo").unwrap();
    let edf = SHIPPED.iter().find(|a| a.name == "edf").unwrap();
    assert_ne!(sha256_hex(&loader, "fifo", fifo.bytes), sha256_hex(&loader, "edf", edf.bytes));
}

#[test]
fn compiled_code_is_cached_in_memory_and_on_disk() {
    let dir = std::env::temp_dir().join(format!("yardmaster-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fifo = SHIPPED.iter().find(|a| a.name == "fifo").unwrap();

    let sandbox = Sandbox::new(Mode::Simulate, Limits::default()).unwrap();
    let first = PolicyLoader::new(sandbox.clone(), Some(dir.clone()));
    assert!(!first.load("fifo", fifo.bytes).unwrap().from_cache());
    assert!(first.load("fifo", fifo.bytes).unwrap().from_cache(), "second load hits the memory cache");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one compiled artifact on disk");

    // A new loader (as after a restart) finds the compiled code on disk.
    let second = PolicyLoader::new(sandbox, Some(dir.clone()));
    let module = second.load("fifo", fifo.bytes).unwrap();
    assert!(module.from_cache(), "disk cache hit");
    drop((module, second, first));

    // A corrupt cache file is ignored, not trusted.
    for file in std::fs::read_dir(&dir).unwrap().flatten() {
        std::fs::write(file.path(), b"not a compiled component").unwrap();
    }
    let third = PolicyLoader::new(Sandbox::new(Mode::Simulate, Limits::default()).unwrap(), Some(dir.clone()));
    assert!(!third.load("fifo", fifo.bytes).unwrap().from_cache());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_policy_importing_outside_the_world_is_refused_with_the_import_named() {
    let loader = loader(Mode::Serve, Limits::default());
    let error =
        loader.load_file(std::path::Path::new(fixtures::FORBIDDEN_IMPORT)).expect_err("a policy with a network import must be refused");
    match &error {
        LoadError::ForbiddenImport { import, .. } => assert!(import.starts_with("fixture:sneaky/socket"), "{import}"),
        other => panic!("wrong refusal: {other}"),
    }
    let message = error.to_string();
    assert!(message.contains("fixture:sneaky/socket") && message.contains("outside"), "{message}");
}

#[test]
fn a_core_module_and_garbage_are_refused() {
    let loader = loader(Mode::Serve, Limits::default());
    let core = b"\0asm\x01\0\0\0";
    assert!(matches!(loader.load("core", core), Err(LoadError::CoreModule { .. })));
    let garbage = b"definitely not wasm";
    let error = loader.load("garbage", garbage).expect_err("garbage is refused");
    assert!(matches!(error, LoadError::Invalid { .. }), "{error}");
    let missing = loader.load_file(std::path::Path::new("/nonexistent/policy.wasm")).unwrap_err();
    assert!(missing.to_string().contains("/nonexistent/policy.wasm"), "{missing}");
}
