#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that can download nothing
# and receives at most 64 MiB per transfer, and checks it: ONNX Runtime's CUDA build
# (from the onnxruntime-gpu wheel on PyPI), the release `yardmaster` binary, the data
# plane's test binary and the PP-OCR models, packed into one archive split into parts.
#
#   bash scripts/gpu-pack.sh [OUT]        # default OUT: .gpu/ in the repository (ignored)
#
# Environment: YARDMASTER_GPU_ARCH (default 90: H100/H200) keeps only that architecture's
# GPU code in the CUDA provider (scripts/fatbin-keep.py; the library then runs on that
# architecture only, at a fifth of the compressed size); YARDMASTER_GPU_ARCH=all keeps
# every one. YARDMASTER_GPU_PART_MIB (default 54) is the size of a part: the working tree
# travels with each transfer, so a part plus the tree must stay under 64 MiB.
#
# Prints the parts with their SHA-256 and the transfer plan: carry one part per call
# into one folder there, then run scripts/gpu-check.sh on that folder (see
# docs/dataplane.md, "Running on a GPU").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu}
arch=${YARDMASTER_GPU_ARCH:-90}
part_mib=${YARDMASTER_GPU_PART_MIB:-54}
assets=${YARDMASTER_ASSETS:-$HOME/.cache/yardmaster}
ort_version=1.31.1
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

stage=$out/stage
rm -rf "$stage" "$out"/part-* "$out"/parts.sha256
mkdir -p "$stage/lib" "$stage/bin" "$stage/assets/rapidocr-1.4.4"

say "onnxruntime-gpu $ort_version (PyPI wheel, cached in $assets/wheels/onnxruntime-gpu-$ort_version)"
wheel_dir=$assets/wheels/onnxruntime-gpu-$ort_version
mkdir -p "$wheel_dir"
if ! ls "$wheel_dir"/*.whl >/dev/null 2>&1; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 "onnxruntime-gpu==$ort_version" -d "$wheel_dir"
fi
wheel=$(ls "$wheel_dir"/*.whl | head -n 1)
raw=$out/raw
mkdir -p "$raw"
python3 - "$wheel" "$raw" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1:]
wanted = ("libonnxruntime.so.1.31.1", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if base in wanted and not os.path.exists(os.path.join(out, base)):
            with z.open(name) as src, open(os.path.join(out, base), "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
PY
provider=$raw/libonnxruntime_providers_cuda.so
if [ "$arch" != all ]; then
    say "CUDA provider: keeping sm_$arch GPU code only"
    python3 "$root/scripts/fatbin-keep.py" "$provider" "$raw/provider-sm$arch.so" --keep "$arch"
    provider=$raw/provider-sm$arch.so
fi
say "compressing the libraries (xz)"
xz -T0 -9 -c "$provider" >"$stage/lib/libonnxruntime_providers_cuda.so.xz"
xz -T0 -9 -c "$raw/libonnxruntime.so.$ort_version" >"$stage/lib/libonnxruntime.so.$ort_version.xz"
cp "$raw/libonnxruntime_providers_shared.so" "$stage/lib/"

say "release build: yardmaster and the data plane's tests"
cd "$root"
cargo build --release -p yardmaster
target=${CARGO_TARGET_DIR:-$root/target}
tests=$(cargo test --release -p yardmaster-dataplane --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"] and m["target"]["name"] == "all":
        print(m["executable"])')
[ -n "$tests" ] || { echo "error: no data plane test binary was built" >&2; exit 1; }
strip -o "$raw/yardmaster" "$target/release/yardmaster"
strip -o "$raw/dataplane-tests" "$tests"
xz -T0 -9 -c "$raw/yardmaster" >"$stage/bin/yardmaster.xz"
xz -T0 -9 -c "$raw/dataplane-tests" >"$stage/bin/dataplane-tests.xz"

say "models and the font"
for model in ch_PP-OCRv4_det_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx ch_PP-OCRv4_rec_infer.onnx; do
    src=$assets/rapidocr-1.4.4/$model
    [ -f "$src" ] || { echo "error: $src is missing: run bash scripts/setup.sh --deps first" >&2; exit 1; }
    cp "$src" "$stage/assets/rapidocr-1.4.4/"
done

# Two real models no one here trained, for the model-repository step.
for model in magika-1.0.3/model.onnx nudenet-3.4.2/320n.onnx; do
    src=$assets/$model
    [ -f "$src" ] || { echo "error: $src is missing: run bash scripts/setup.sh --deps first" >&2; exit 1; }
    mkdir -p "$stage/assets/$(dirname "$model")"
    xz -T0 -9 -c "$src" >"$stage/assets/$model.xz"
done

font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
[ -f "$font" ] || { echo "error: $font is missing: run bash scripts/setup.sh --deps first" >&2; exit 1; }
cp "$font" "$stage/assets/"   # the tests and `yardmaster load --text` render pages with it

say "archive, checksums, parts of $part_mib MiB"
(cd "$stage" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum >SHA256SUMS)
tar -C "$stage" -cf "$out/payload.tar" .
(cd "$out" && split -b "${part_mib}M" -d -a 2 payload.tar part- && rm payload.tar && sha256sum part-* >parts.sha256)
rm -rf "$raw"
tree_mib=$(git -C "$root" ls-files -co --exclude-standard -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -n 1 | awk '{print int($1 / 1048576) + 1}')
echo
(cd "$stage" && du -h --apparent-size -- */* */*/* 2>/dev/null | sort -k2)
echo
cat "$out/parts.sha256"
largest=$(ls -l "$out"/part-* | awk '{print $5}' | sort -n | tail -n 1)
total=$(( largest / 1048576 + 1 + tree_mib ))
echo "largest transfer: part $((largest / 1048576 + 1)) MiB + working tree $tree_mib MiB = $total MiB (limit 64)"
[ "$total" -lt 64 ] || { echo "error: a transfer would exceed 64 MiB: lower YARDMASTER_GPU_PART_MIB" >&2; exit 1; }
n=$(ls "$out"/part-* | wc -l)
echo
echo "transfer plan ($n calls, back to back so the machine stays warm):"
for part in "$out"/part-*; do
    rel=${part#"$root"/}
    echo "  carry [$rel$( [ "$part" = "$(ls "$out"/part-* | tail -n 1)" ] && echo ", ${out#"$root"/}/parts.sha256" )]:"
    echo "    mkdir -p /root/ym-gpu && cp $rel /root/ym-gpu/"
done
echo "  and in the last call: cp ${out#"$root"/}/parts.sha256 /root/ym-gpu/ && bash scripts/gpu-check.sh --parts /root/ym-gpu --out \$OUT"
