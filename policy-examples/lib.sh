# Shared by the example policies' build scripts (sourced, not run).
#
#   ROOT        the repository
#   TOOLCHAINS  where scripts/toolchains.sh installs the non-Rust toolchains
#               ($YARDMASTER_TOOLCHAINS, else ~/.cache/yardmaster/toolchains)
#   OUT_DIR     where the components land ($YARDMASTER_EXAMPLES_OUT, else
#               policy-examples/build)
#   CONTRACT    the WIT the examples are built against: the released contract version
#               the SDK targets (wit/0.1.0; see wit/README.md)
#
# A build script exits 3 when its toolchain is not installed, so callers (the tests)
# can tell "cannot build here" from "the build failed".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLCHAINS=${YARDMASTER_TOOLCHAINS:-$HOME/.cache/yardmaster/toolchains}
OUT_DIR=${YARDMASTER_EXAMPLES_OUT:-$ROOT/policy-examples/build}
WASM_TOOLS=$TOOLCHAINS/py/bin/wasm-tools
CONTRACT=$ROOT/wit/0.1.0
mkdir -p "$OUT_DIR"

# toolchain_missing WHAT: report and exit 3.
toolchain_missing() {
    echo "toolchain missing: $1 (install it with: bash scripts/toolchains.sh)" >&2
    exit 3
}

# inputs_digest FILE...: one digest of the files' contents (and names).
inputs_digest() {
    sha256sum "$@" | sha256sum | cut -d' ' -f1
}

# up_to_date OUTPUT DIGEST: whether OUTPUT exists and was built from DIGEST.
up_to_date() {
    [ -f "$1" ] && [ -f "$1.inputs" ] && [ "$(cat "$1.inputs")" = "$2" ]
}

# built OUTPUT DIGEST: record what OUTPUT was built from.
built() {
    echo "$2" > "$1.inputs"
    echo "built $1 ($(wc -c < "$1") bytes)"
}
