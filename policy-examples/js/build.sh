#!/usr/bin/env bash
# Builds the JavaScript example with componentize-js, every WASI feature disabled
# (stdio, random, clocks, http, fetch-event), so the component imports only the
# policy world.
source "$(dirname "$0")/../lib.sh"
out=$OUT_DIR/deadline-scaler-js.wasm
tool=$TOOLCHAINS/node/node_modules/.bin/componentize-js
[ -x "$tool" ] && command -v node >/dev/null || toolchain_missing "componentize-js (npm) or node"
src=$ROOT/policy-examples/js
digest=$(inputs_digest "$src/deadline-scaler.js" "$CONTRACT/policy.wit" "$TOOLCHAINS/node/package-lock.json")
up_to_date "$out" "$digest" && exit 0
"$tool" "$src/deadline-scaler.js" --wit "$CONTRACT" --world-name scheduler \
    --disable stdio random clocks http fetch-event -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
built "$out" "$digest"
