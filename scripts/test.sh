#!/usr/bin/env bash
# Runs the whole test suite: installs the WebAssembly target if needed, then
# `cargo test --workspace` (which also rebuilds every policy .wasm that changed), then
# checks the Helm chart and builds and runs the OCI image.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --deps
echo "==> cargo test --workspace"
cargo test --workspace "$@"
echo "==> the Helm chart and manifests (helm lint/template, kubernetes-validate)"
bash scripts/chart-check.sh
if [ "$(id -u)" = 0 ]; then
    echo "==> the OCI image: built from Debian packages, its entrypoint serving"
    bash deploy/image/test.sh
else
    echo "==> the OCI image test needs root (unshare/chroot): skipped"
fi
