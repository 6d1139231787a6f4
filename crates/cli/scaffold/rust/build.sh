#!/usr/bin/env bash
# Builds the policy into policy.wasm: a component straight from rustc (target
# wasm32-wasip2), in the release profile of Cargo.toml.
# Exits 3 when the toolchain is missing.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo >/dev/null || { echo "toolchain missing: cargo (install Rust: https://rustup.rs)" >&2; exit 3; }
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "toolchain missing: the wasm32-wasip2 target (install it: rustup target add wasm32-wasip2)" >&2
    exit 3
fi
cargo build --quiet --release --target wasm32-wasip2
target=${CARGO_TARGET_DIR:-target}
cp "$target/wasm32-wasip2/release/{{crate}}.wasm" policy.wasm
echo "built policy.wasm ($(wc -c < policy.wasm) bytes)"
