#!/usr/bin/env bash
# Builds the Python example with componentize-py. `--stub-wasi` replaces every WASI
# import of the Python runtime with a trapping stub, so the component imports only
# the policy world.
source "$(dirname "$0")/../lib.sh"
out=$OUT_DIR/deadline-scaler-python.wasm
tool=$TOOLCHAINS/py/bin/componentize-py
[ -x "$tool" ] || toolchain_missing "componentize-py"
src=$ROOT/policy-examples/python
digest=$(inputs_digest "$src/deadline_scaler.py" "$CONTRACT/policy.wit" "$tool")
up_to_date "$out" "$digest" && exit 0
(cd "$src" && "$tool" --quiet -d "$CONTRACT" -w scheduler componentize deadline_scaler \
    -p "$src" --stub-wasi -o "$out.tmp")
rm -rf "$src/__pycache__"
mv "$out.tmp" "$out"
built "$out" "$digest"
