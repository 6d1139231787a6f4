//! The same SDK policy code as a component and native makes identical decisions on
//! the benchmark's event stream (the benchmark also checks this on every run).

use yardmaster::conformance::bench::{record_stream, replay};
use yardmaster::policy::{Mode, NativePolicy, WasmPolicy};
use yardmaster_tests::{loader, shipped, unhurried};

#[test]
fn edf_decides_identically_as_component_and_native() {
    let loader = loader(Mode::Serve, unhurried());
    let module = shipped(&loader, "edf");
    let native = || NativePolicy::<policy_edf::Edf>::new("edf", 1, 100_000);
    for batch in [1, 8, 64] {
        let stream = record_stream(&mut native(), batch, 2_000 / batch);
        let mut wasm = WasmPolicy::instantiate(loader.sandbox(), module.clone(), 1, None).unwrap();
        let (_, from_wasm) = replay(&mut wasm, &stream);
        let (_, from_native) = replay(&mut native(), &stream);
        assert_eq!(from_wasm, from_native, "batch {batch}");
        let dispatches = from_native.iter().flatten().filter(|a| a.kind() == "dispatch").count();
        let drops = from_native.iter().flatten().filter(|a| a.kind() == "drop").count();
        assert!(dispatches > 0 && drops > 0, "the stream exercises both decisions ({dispatches}, {drops})");
    }
}
