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

/// `edf` as built against contract 0.1.0, committed (see its README).
const EDF_0_1_0: &[u8] = include_bytes!("../../fixtures/contract-0.1.0/edf.wasm");
/// The fixture's SHA-256, as its README records it.
const EDF_0_1_0_SHA256: &str = "122c10bf5888221edeb350f43c16f3af160755447cbd3a3633acafba810f19a1";

/// The fixture with its contract names (`yardmaster:policy/INTERFACE@0.1.0`, wherever
/// they occur) rewritten to claim other versions: a component as another contract's
/// build would name itself. Versions keep their length so the encoding stays valid.
fn claiming(versions: &[(&str, &str)]) -> Vec<u8> {
    let mut bytes = EDF_0_1_0.to_vec();
    for (interface, version) in versions {
        let from = format!("yardmaster:policy/{interface}@0.1.0");
        let to = format!("yardmaster:policy/{interface}@{version}");
        assert_eq!(from.len(), to.len());
        let mut at = 0;
        let mut found = 0;
        while let Some(i) = bytes[at..].windows(from.len()).position(|w| w == from.as_bytes()) {
            bytes[at + i..at + i + to.len()].copy_from_slice(to.as_bytes());
            at += i + to.len();
            found += 1;
        }
        assert!(found > 0, "{from} does not occur in the fixture");
    }
    bytes
}

#[test]
fn a_policy_built_against_contract_0_1_0_loads_and_decides_as_todays_build() {
    use yardmaster::conformance::bench::{record_stream, replay};
    use yardmaster::conformance::{check_component, CheckOptions};
    use yardmaster::policy::contract::ContractVersion;
    use yardmaster::policy::{NativePolicy, WasmPolicy};

    let loader = loader(Mode::Serve, yardmaster_tests::unhurried());
    let fixture = loader.load("edf-0.1.0", EDF_0_1_0).expect("a 0.1.0 policy keeps loading");
    assert_eq!(fixture.sha256_hex(), EDF_0_1_0_SHA256, "the committed fixture changed: it must never be rebuilt");
    assert_eq!(fixture.contract_version(), ContractVersion::new(0, 1, 0));
    let today = yardmaster_tests::shipped(&loader, "edf");

    // Action for action on the benchmark's event streams.
    let native = || NativePolicy::<policy_edf::Edf>::new("edf", 1, 100_000);
    for batch in [1, 8, 64] {
        let stream = record_stream(&mut native(), batch, 2_000 / batch);
        let mut old = WasmPolicy::instantiate(loader.sandbox(), fixture.clone(), 1, None).unwrap();
        let mut new = WasmPolicy::instantiate(loader.sandbox(), today.clone(), 1, None).unwrap();
        let (_, from_old) = replay(&mut old, &stream);
        let (_, from_new) = replay(&mut new, &stream);
        assert_eq!(from_old, from_new, "batch {batch}");
        let dispatches = from_new.iter().flatten().filter(|a| a.kind() == "dispatch").count();
        let drops = from_new.iter().flatten().filter(|a| a.kind() == "drop").count();
        assert!(dispatches > 0 && drops > 0, "the stream exercises both decisions ({dispatches}, {drops})");
    }

    // The same outcomes in the conformance harness's scripted cluster (ticks, a
    // cancellation, a worker added and one removed).
    let options = CheckOptions::default();
    let old = check_component("edf-0.1.0", EDF_0_1_0, &options).expect("loads");
    let new = check_component("edf", yardmaster_policy_artifacts::shipped("edf").unwrap().bytes, &options).expect("loads");
    assert!(old.passed(), "{}", old.render());
    assert_eq!(old.deterministic, Some(true));
    assert_eq!(
        (&old.outcomes, old.events, old.actions, &old.rejected, &old.faults, &old.lost),
        (&new.outcomes, new.events, new.actions, &new.rejected, &new.faults, &new.lost)
    );
}

#[test]
fn a_component_built_against_an_unaccepted_contract_version_is_refused_naming_both() {
    use yardmaster::policy::contract::ACCEPTED;

    let loader = loader(Mode::Serve, Limits::default());
    assert_eq!(claiming(&[]), EDF_0_1_0);
    for version in ["0.9.0", "0.0.1", "1.1.0"] {
        let bytes = claiming(&[("types", version), ("host", version), ("policy", version)]);
        let error = loader.load("edf-renamed", &bytes).expect_err("an unaccepted contract version is refused");
        match &error {
            LoadError::UnsupportedContract { found, accepted, .. } => {
                assert_eq!(found, version);
                assert_eq!(*accepted, ACCEPTED);
            }
            other => panic!("wrong refusal for {version}: {other}"),
        }
        let message = error.to_string();
        assert!(message.contains(&format!("yardmaster:policy@{version}")), "{message}");
        assert!(message.contains(&ACCEPTED.to_string()) && message.contains("0.1.0"), "{message}");
    }
}

#[test]
fn a_component_mixing_contract_versions_is_refused() {
    let loader = loader(Mode::Serve, Limits::default());
    let bytes = claiming(&[("host", "0.9.0")]);
    let error = loader.load("edf-mixed", &bytes).expect_err("imports of another contract version are refused");
    match &error {
        LoadError::MixedContract { import, version, .. } => {
            assert_eq!(import, "yardmaster:policy/host@0.9.0");
            assert_eq!(version.to_string(), "0.1.0");
        }
        other => panic!("wrong refusal: {other}"),
    }
}

/// `quart` as built against contract 0.2.0 (placement), committed (see its README).
const QUART_0_2_0: &[u8] = include_bytes!("../../fixtures/contract-0.2.0/quart.wasm");
/// The fixture's SHA-256, as its README records it.
const QUART_0_2_0_SHA256: &str = "c6ab614e299507a5b3bebc883e68a6c9b78e89a52ecfca8990845d00ad57ec5c";

#[test]
fn a_policy_built_against_contract_0_2_0_loads_and_places_as_it_did_when_it_was_built() {
    use yardmaster::policy::contract::ContractVersion;
    use yardmaster::sim::reproduce::quart::{spec, GammaArrivals};
    use yardmaster::sim::{run, PolicySpec};

    let loader = loader(Mode::Simulate, Limits::default());
    let fixture = loader.load("quart-0.2.0", QUART_0_2_0).expect("a 0.2.0 policy loads");
    assert_eq!(fixture.sha256_hex(), QUART_0_2_0_SHA256, "the committed fixture changed: it must never be rebuilt");
    assert_eq!(fixture.contract_version(), ContractVersion::new(0, 2, 0));
    // The same bursty minute on the 12-server cluster, every placement accepted. The
    // fixture must decide as it did when it was built: its recorded results (the
    // fixture's README). Today's QUART decides differently on purpose since 603e189
    // (each growing stage's warm starts placed first, after the host began caching a
    // stage only once its replica loaded): as many replicas, more of them warm.
    let simulate = |name: &str, bytes: &[u8]| {
        let policy = PolicySpec { name: "quart".into(), bytes: std::sync::Arc::new(bytes.to_vec()) };
        let spec = spec(11, 60.0, true).unwrap();
        let outcome = run::run(&spec, &policy, &loader, GammaArrivals::new(97.0, 4.0, 60.0, 11), &mut |_| {}).unwrap();
        assert!(outcome.arm.rejected.is_empty(), "{name}: {:?}", outcome.arm.rejected);
        outcome
    };
    let old = simulate("fixture", QUART_0_2_0);
    let new = simulate("today", yardmaster_policy_artifacts::shipped("quart").unwrap().bytes);
    let recorded = &old.report.summary.overall;
    assert_eq!(old.starts, (16, 24), "the fixture's recorded warm and cold starts");
    assert_eq!((recorded.arrivals, recorded.outcomes.on_time, recorded.outcomes.late), (5288, 3078, 2210), "its recorded report");
    assert_eq!(old.starts.0 + old.starts.1, new.starts.0 + new.starts.1, "{:?} against {:?}", old.starts, new.starts);
    assert!(new.starts.0 > old.starts.0, "today's build starts warm first: {:?} against {:?}", new.starts, old.starts);
}

/// `fifo` as built against contract 0.3.0 (client batches and sequences), committed
/// (see its README).
const FIFO_0_3_0: &[u8] = include_bytes!("../../fixtures/contract-0.3.0/fifo.wasm");
/// The fixture's SHA-256, as its README records it.
const FIFO_0_3_0_SHA256: &str = "49d6bb333852691ee5a8325e34632ca9199908f3e4fe84fc0cefe5516aa65dbf";

#[test]
fn a_policy_built_against_contract_0_3_0_keeps_client_batches_and_sequences_within_the_rules() {
    use std::collections::BTreeMap;
    use yardmaster::conformance::scripted::{Fate, MS};
    use yardmaster::engine::{SequenceStep, Submission};
    use yardmaster::policy::contract::{Action, ContractVersion};
    use yardmaster::policy::FailureMode;
    use yardmaster_tests::Driver;

    let loader = loader(Mode::Simulate, Limits::default());
    let fixture = loader.load("fifo-0.3.0", FIFO_0_3_0).expect("a 0.3.0 policy loads");
    assert_eq!(fixture.sha256_hex(), FIFO_0_3_0_SHA256, "the committed fixture changed: it must never be rebuilt");
    assert_eq!(fixture.contract_version(), ContractVersion::new(0, 3, 0));

    // On the check's cluster (detect batches at most 8 items): client batches of 3
    // items, and two sequences of four steps each, all sent at once, interleaved.
    let run = |name: &str, module| {
        let mut driver = Driver::start(&loader, module, Vec::new(), FailureMode::FailOpen);
        let now = driver.harness.now();
        let due = now + 10_000 * MS;
        let mut step_of = BTreeMap::new();
        let mut batches = Vec::new();
        for k in 0..4u32 {
            batches.push(driver.harness.submit(Submission { stream: 0, sent_at: now, deadline: due, items: 3, ..Submission::default() }));
            for sequence in [7u64, 8] {
                let step = SequenceStep { id: sequence, start: k == 0, end: k == 3 };
                let id = driver.harness.submit(Submission {
                    stream: 0,
                    sent_at: now,
                    deadline: due,
                    sequence: Some(step),
                    ..Submission::default()
                });
                step_of.insert(id, (sequence, k));
            }
        }
        driver.harness.flush();
        driver.advance_to(now + 5_000 * MS);
        let outputs = driver.outputs();
        let rejected: Vec<_> = outputs.iter().flat_map(|o| o.rejected.iter()).collect();
        assert!(rejected.is_empty(), "{name}: every dispatch is within the rules: {rejected:?}");
        assert_eq!(driver.harness.count(Fate::Completed { late: false }), 12, "{name}: every request completes on time");
        // Each sequence's steps were dispatched in order, all to one detect worker; no batch
        // held more items than its stage's limit (detect 8, classify 4).
        let state = driver.harness.engine().state();
        let mut ran: BTreeMap<u64, Vec<(u32, u32)>> = BTreeMap::new();
        for output in &outputs {
            for action in &output.actions {
                let Action::Dispatch(dispatch) = action else { continue };
                let items: u32 = dispatch.requests.iter().map(|id| if batches.contains(id) { 3 } else { 1 }).sum();
                let stage = state.workers()[&dispatch.worker].info.stage;
                let limit = state.pipeline().stages[stage as usize].max_batch;
                assert!(items <= limit, "{name}: a batch of {items} items, over {limit}: {dispatch:?}");
                // A sequence is bound at the stage it enters; later stages see plain requests.
                for id in dispatch.requests.iter().filter(|_| stage == 0) {
                    if let Some(&(sequence, k)) = step_of.get(id) {
                        ran.entry(sequence).or_default().push((dispatch.worker, k));
                    }
                }
            }
        }
        for (sequence, steps) in &ran {
            assert_eq!(steps.iter().map(|s| s.1).collect::<Vec<_>>(), [0, 1, 2, 3], "{name}: sequence {sequence} in order");
            assert!(steps.iter().all(|s| s.0 == steps[0].0), "{name}: sequence {sequence} on one worker: {steps:?}");
        }
        ran
    };
    let old = run("fixture", fixture);
    let today = loader.load("fifo", yardmaster_policy_artifacts::shipped("fifo").unwrap().bytes).unwrap();
    assert_eq!(old, run("today", today), "the fixture decides as today's fifo");
}
