#!/usr/bin/env bash
# The project's test: build, then the component through Yardmaster's conformance check
# (with a 100 ms decision deadline: see README.md, "Cost"). `yardmaster` is taken from
# $YARDMASTER, else from PATH.
set -euo pipefail
cd "$(dirname "$0")"
bash build.sh
"${YARDMASTER:-yardmaster}" policy check policy.wasm --deadline-ms 100
