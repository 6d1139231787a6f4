#!/usr/bin/env bash
# Builds the Rust example for wasm32-wasip2 (a component straight from rustc).
source "$(dirname "$0")/../lib.sh"
out=$OUT_DIR/deadline-scaler-rust.wasm
command -v cargo >/dev/null || toolchain_missing "cargo"
# Its own target directory, so a build started from inside `cargo test` never waits on
# the outer build's lock.
target=${CARGO_TARGET_DIR:-$ROOT/target}/policy-examples
CARGO_TARGET_DIR=$target cargo build --quiet --manifest-path "$ROOT/policy-examples/rust/Cargo.toml" \
    --target wasm32-wasip2 --profile policy
wasm=$target/wasm32-wasip2/policy/example_deadline_scaler.wasm
if ! cmp -s "$wasm" "$out"; then
    cp "$wasm" "$out"
    echo "built $out ($(wc -c < "$out") bytes)"
fi
