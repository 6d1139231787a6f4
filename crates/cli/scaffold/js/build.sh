#!/usr/bin/env bash
# Builds policy.js into policy.wasm with componentize-js, every WASI feature disabled
# (stdio, random, clocks, http, fetch-event), so the component imports only the policy
# world (the host refuses anything else).
# Exits 3 when the toolchain is missing.
set -euo pipefail
cd "$(dirname "$0")"
toolchains=${YARDMASTER_TOOLCHAINS:-$HOME/.cache/yardmaster/toolchains}
tool=$(command -v componentize-js || true)
[ -n "$tool" ] || [ ! -x "$toolchains/node/node_modules/.bin/componentize-js" ] || tool=$toolchains/node/node_modules/.bin/componentize-js
[ -n "$tool" ] || [ ! -x node_modules/.bin/componentize-js ] || tool=node_modules/.bin/componentize-js
if [ -z "$tool" ] || ! command -v node >/dev/null; then
    echo "toolchain missing: node and componentize-js (install it: npm install @bytecodealliance/componentize-js@{{componentize_js}})" >&2
    exit 3
fi
"$tool" policy.js --wit wit/{{contract}} --world-name scheduler \
    --disable stdio random clocks http fetch-event -o policy.wasm.tmp >/dev/null
mv policy.wasm.tmp policy.wasm
echo "built policy.wasm ($(wc -c < policy.wasm) bytes)"
