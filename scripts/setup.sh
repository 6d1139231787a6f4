#!/usr/bin/env bash
# Installs what Yardmaster needs on a fresh machine, builds it, and runs the main job
# on its embedded default. Safe to run again: every step is skipped when already done.
#
#   bash scripts/setup.sh          # install, build (release), run the main job
#   bash scripts/setup.sh --deps   # install only
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed; install Rust (rustup) first" >&2
    exit 1
fi

say "Rust target wasm32-wasip2 (policies are WebAssembly components)"
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        rustup target add wasm32-wasip2
    else
        echo "already installed"
    fi
else
    sysroot=$(rustc --print sysroot)
    if [ ! -d "$sysroot/lib/rustlib/wasm32-wasip2" ]; then
        echo "error: no rustup and no wasm32-wasip2 standard library in $sysroot" >&2
        exit 1
    fi
fi

say "Fonts for PNG plots (SVG plots need none)"
if ls /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf >/dev/null 2>&1; then
    echo "already installed"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1; }) \
        && echo "installed fonts-dejavu-core" || echo "could not install fonts-dejavu-core: plots will be SVG only"
else
    echo "no DejaVu font and no apt-get as root: plots will be SVG only"
fi

if [ "${1:-}" = "--deps" ]; then
    exit 0
fi

say "Building yardmaster (release; the first build takes about 10 minutes)"
cargo build --release -p yardmaster

say "Main job: conformance check of the shipped policies, then a simulated comparison"
exec ./target/release/yardmaster
