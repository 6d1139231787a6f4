#!/usr/bin/env bash
# Builds app.py into policy.wasm with componentize-py. `--stub-wasi` replaces every
# WASI import of the Python runtime with a trapping stub, so the component imports only
# the policy world (the host refuses anything else).
# Exits 3 when the toolchain is missing.
set -euo pipefail
cd "$(dirname "$0")"
toolchains=${YARDMASTER_TOOLCHAINS:-$HOME/.cache/yardmaster/toolchains}
tool=$(command -v componentize-py || true)
[ -n "$tool" ] || [ ! -x "$toolchains/py/bin/componentize-py" ] || tool=$toolchains/py/bin/componentize-py
if [ -z "$tool" ]; then
    echo "toolchain missing: componentize-py (install it: pip install componentize-py=={{componentize_py}})" >&2
    exit 3
fi
"$tool" --quiet -d wit/{{contract}} -w scheduler componentize app -p . --stub-wasi -o policy.wasm.tmp
rm -rf __pycache__
mv policy.wasm.tmp policy.wasm
echo "built policy.wasm ($(wc -c < policy.wasm) bytes)"
