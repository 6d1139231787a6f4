#!/usr/bin/env bash
# The project's test: the native unit tests, then the component through Yardmaster's
# conformance check. `yardmaster` is taken from $YARDMASTER, else from PATH.
set -euo pipefail
cd "$(dirname "$0")"
cargo test --quiet
bash build.sh
"${YARDMASTER:-yardmaster}" policy check policy.wasm
