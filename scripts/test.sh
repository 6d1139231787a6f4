#!/usr/bin/env bash
# Runs the whole test suite: installs the WebAssembly target if needed, then
# `cargo test --workspace` (which also rebuilds every policy .wasm that changed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --deps
echo "==> cargo test --workspace"
cargo test --workspace "$@"
