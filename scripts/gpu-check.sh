#!/usr/bin/env bash
# The GPU check: runs Yardmaster's data plane on ONNX Runtime's CUDA provider on a
# machine with an NVIDIA GPU and CUDA 13's libraries (in its Python environment), from
# the parts scripts/gpu-pack.sh prepared, and writes every result into one folder.
#
#   bash scripts/gpu-check.sh --parts DIR --out DIR [--expect cuda|cpu] [--quick] [--budget S]
#                             [--experiments] [--stacking] [--skip 'GLOB…']
#
# Steps (each under a time limit; one failing does not stop the others):
#   unpack    reassemble the parts, check every SHA-256, decompress
#   libraries find the CUDA libraries (Python's `nvidia` packages), check that ONNX
#             Runtime's CUDA provider resolves every library it needs
#   gpu       nvidia-smi
#   device    `yardmaster dataplane devices`: the data plane must choose cuda:0
#   tests     the data plane's whole test suite (every test runs on the GPU there)
#   bench-*   `yardmaster dataplane bench`: served through a worker vs a plain ONNX
#             Runtime CUDA Run loop, recogniser at batch 1, 24 (the pipeline's largest)
#             and 64, detector at 1 and 8 (the pipeline's largest); with --experiments
#             also the provider's options against the defaults (arena growth, what a
#             warm start keeps, cuDNN's convolution search) and batches stacked in
#             host memory against the default of stacking on the device (--stacking
#             runs only that comparison)
#   profile-* `yardmaster profile` of each PP-OCR model on the GPU
#   repository `yardmaster serve --model-repository` of Magika, NudeNet and an ensemble
#             under explicit model control: start to ready with a cold profile (measured
#             on the device) and with the cached one, inferences, 20 unload/load cycles
#             of NudeNet with the GPU memory before and after
#   serve     `yardmaster serve` (the OCR pipeline, with the profiles just measured)
#             under `yardmaster load` of rendered three-line pages at two rates
#             (YARDMASTER_GPU_RATES, default "50 200"), GPU memory from the server's
#             own /metrics (read through cudarc)
#
# --expect cpu runs the same flow where there is no GPU (the dry run): the device step
# then expects the CPU, the library and gpu steps are skipped. --quick shortens every
# measurement (for the dry run on a small machine). --budget (default 480 s) caps the
# whole run: a step gets at most what is left of it, and steps are skipped once it is
# spent, so the summary and results are written before the machine's own limit.
# --skip leaves out the steps whose names match any of its globs (e.g. 'tests bench-*'
# for a run that only profiles and serves).
# Results: OUT/summary.txt (PASS/FAIL per step with its key line) and
# OUT/results.tar.gz (every log, profile and metrics scrape).
set -uo pipefail
parts="" out="" expect=cuda quick=0 budget=480 experiments=0 stacking=0 skip=""
while [ $# -gt 0 ]; do
    case "$1" in
        --parts) parts=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --expect) expect=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        --experiments) experiments=1; shift ;;
        --stacking) stacking=1; shift ;;
        --budget) budget=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$parts" ] && [ -n "$out" ] || { echo "usage: $0 --parts DIR --out DIR [--expect cuda|cpu] [--quick]" >&2; exit 2; }
parts=$(cd "$parts" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${YARDMASTER_GPU_WORK:-/tmp/yardmaster-gpu-check}
results=$work/results
rm -rf "$work"
mkdir -p "$work/payload" "$results"
summary=$out/summary.txt
: >"$summary"
began=$(date +%s)

record() { # record STATUS STEP LINE
    printf '%-5s %-22s %s\n' "$1" "$2" "$3" | tee -a "$summary"
}
step() { # step NAME SECONDS COMMAND…: run, log to results/NAME.log, record PASS/FAIL
    local name=$1 limit=$2; shift 2
    local log=$results/$name.log t0=$(date +%s)
    local left=$(( budget - (t0 - began) - 15 )) pattern patterns
    read -ra patterns <<<"$skip" # split on spaces, without expanding the globs
    for pattern in "${patterns[@]}"; do
        # shellcheck disable=SC2254 # the pattern is a glob on purpose
        case "$name" in $pattern) record SKIP "$name" "--skip $pattern"; return 1 ;; esac
    done
    if [ $left -lt 10 ]; then record SKIP "$name" "the ${budget}s budget is spent"; return 1; fi
    [ "$limit" -gt "$left" ] && limit=$left
    printf '\n===== %s (limit %ss)\n' "$name" "$limit"
    if declare -F "$1" >/dev/null; then # a function of this script: run it in a child bash
        timeout --kill-after=5 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
    else
        timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
    fi
    local rc=$?
    tail -n 25 "$log"
    local took=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then record PASS "$name" "(${took}s) $(key_line "$name" "$log")"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then record FAIL "$name" "timed out after ${limit}s"
    else record FAIL "$name" "exit $rc (${took}s): $(grep -m1 -iE 'error|panicked|failed' "$log" | cut -c1-160)"
    fi
    return $rc
}
key_line() { # the line of a step's log worth showing in the summary
    case "$1" in
        bench-*) grep -m1 -E 'ratio' "$2" | cut -c1-200 ;;
        profile-*) grep -m1 -E 'replica start' "$2" ;;
        tests) grep -E '^test result' "$2" | tail -n 1 ;;
        device) grep -m1 '^device:' "$2" ;;
        *) tail -n 1 "$2" | cut -c1-160 ;;
    esac
}
finish() {
    local status=0
    grep -q '^FAIL' "$summary" && status=1
    echo "total $(( $(date +%s) - began ))s" >>"$summary"
    cp "$summary" "$results/"
    tar -C "$work" -czf "$out/results.tar.gz" results
    printf '\n===== summary (%s)\n' "$out"
    cat "$summary"
    exit $status
}

# --- unpack ---------------------------------------------------------------------------
unpack() {
    cd "$parts"
    if [ -f parts.sha256 ]; then sha256sum -c parts.sha256 || return 1; fi
    cat part-* | tar -x -C "$work/payload" || return 1
    cd "$work/payload"
    sha256sum -c --quiet SHA256SUMS || return 1
    for packed in $(find . -name '*.xz'); do
        if command -v xz >/dev/null; then xz -d "$packed" || return 1
        else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$packed" && rm "$packed" || return 1
        fi
    done
    chmod +x bin/*
    ln -sf libonnxruntime.so.1.31.1 lib/libonnxruntime.so
    ls -la lib bin assets/*
}
export parts work results expect
export -f unpack
step unpack 120 unpack || finish
bin=$work/payload/bin
export YARDMASTER_ORT_LIB=$work/payload/lib/libonnxruntime.so.1.31.1
export YARDMASTER_ASSETS=$work/payload/assets
export YARDMASTER_FONT=$work/payload/assets/DejaVuSans.ttf
export RUST_LOG=${RUST_LOG:-info} bin

# --- libraries and the GPU --------------------------------------------------------------
if [ "$expect" = cuda ]; then
    cuda_dirs=$(python3 - <<'PY'
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
dirs = set()
for root in nvidia.__path__:
    for d, _, files in os.walk(root):
        if any(f.startswith("lib") and ".so" in f for f in files):
            dirs.add(d)
print(":".join(sorted(dirs)))
PY
)
    export LD_LIBRARY_PATH=$work/payload/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    libraries() {
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tr ':' '\n'
        ldd "$work/payload/lib/libonnxruntime_providers_cuda.so"
        for lib in libcudnn.so.9 libcufft.so.12; do
            found=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | while read -r d; do [ -e "$d/$lib" ] && echo "$d/$lib"; done | head -n 1)
            echo "$lib (loaded at run time): ${found:-not found}"
        done
        ! ldd "$work/payload/lib/libonnxruntime_providers_cuda.so" | grep -q 'not found'
    }
    export -f libraries
    step libraries 30 libraries
    step gpu 30 nvidia-smi
else
    record SKIP libraries "expecting the CPU"
    record SKIP gpu "expecting the CPU"
fi

device_is() { "$bin/yardmaster" dataplane devices && "$bin/yardmaster" dataplane devices | grep -q "^device: $expect"; }
export -f device_is
step device 60 device_is

# --- the data plane's tests -------------------------------------------------------------
step tests 150 "$bin/dataplane-tests" --test-threads 4

# --- served vs plain, cold vs warm ----------------------------------------------------------
rec=$YARDMASTER_ASSETS/rapidocr-1.4.4/ch_PP-OCRv4_rec_infer.onnx
det=$YARDMASTER_ASSETS/rapidocr-1.4.4/ch_PP-OCRv4_det_infer.onnx
cls=$YARDMASTER_ASSETS/rapidocr-1.4.4/ch_ppocr_mobile_v2.0_cls_infer.onnx
if [ $quick = 1 ]; then small="--runs 5 --rounds 2" large="--runs 2 --rounds 2" big=8 iters=3 rates="2 4" span=5
else small="--runs 200 --rounds 5" large="--runs 40 --rounds 5" big=64 iters=30 rates="${YARDMASTER_GPU_RATES:-50 200}" span=15
fi
step bench-rec-b1 60 "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch 1 $small --device "$expect"
# The OCR pipeline's largest recogniser batch (8 pages of 3 lines), then a large one.
step bench-rec-b24 60 "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch 24 $large --device "$expect"
step bench-rec-b$big 60 "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch $big $large --device "$expect"
step bench-det-b1 60 "$bin/yardmaster" dataplane bench --model "$det" --shape 3x736x736 --batch 1 $large --device "$expect"
step bench-det-b8 60 "$bin/yardmaster" dataplane bench --model "$det" --shape 3x736x736 --batch 8 $large --device "$expect"
if [ $experiments = 1 ]; then
    # The execution provider's options against the defaults, same model and batch.
    step bench-rec-b$big-arena-pow2 60 env YARDMASTER_CUDA_ARENA=next-power-of-two \
        "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch $big $large --device "$expect"
    step bench-rec-b$big-warm-model 60 env YARDMASTER_WARM_START=model \
        "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch $big $large --device "$expect"
    step bench-det-b8-exhaustive 60 env YARDMASTER_CUDA_CONV_ALGO=exhaustive \
        "$bin/yardmaster" dataplane bench --model "$det" --shape 3x736x736 --batch 8 $large --device "$expect"
fi
if [ $experiments = 1 ] || [ $stacking = 1 ]; then
    # Batches stacked in host memory (ONNX Runtime copies them) against the default of
    # copying each request straight into device memory.
    step bench-rec-b$big-stack-host 60 env YARDMASTER_CUDA_STACK=host \
        "$bin/yardmaster" dataplane bench --model "$rec" --shape 3x48x320 --batch $big $large --device "$expect"
    step bench-det-b8-stack-host 60 env YARDMASTER_CUDA_STACK=host \
        "$bin/yardmaster" dataplane bench --model "$det" --shape 3x736x736 --batch 8 $large --device "$expect"
fi

# --- profiles of the PP-OCR models on the device ----------------------------------------------
mkdir -p "$results/profiles"
step profile-det 90 "$bin/yardmaster" profile "$det" --name det --variant ppocrv4 --shape 3x736x736 --batch 1,2,4,8 \
    --iterations $iters --device "$expect" --out "$results/profiles/det.toml"
step profile-cls 60 "$bin/yardmaster" profile "$cls" --name cls --variant mobile-v2 --shape 3x48x192 --batch 1,3,6,12,24,$big \
    --iterations $iters --device "$expect" --out "$results/profiles/cls.toml"
step profile-rec 60 "$bin/yardmaster" profile "$rec" --name rec --variant ppocrv4 --shape 3x48x320 --batch 1,3,6,12,24,$big \
    --iterations $iters --device "$expect" --out "$results/profiles/rec.toml"

# The OCR pipeline with the profiles just measured, so the policy plans with this device's
# latencies: the preset's stages, each variant's points, start times and memory replaced.
# Classification and recognition points are per request at 3 text lines per image, as in
# the preset: request batch b is the measured crop batch 3b.
ocr_pipeline_from_profiles() {
    python3 - crates/formats/presets/ocr.toml "$results/profiles" "$results/ocr-measured.toml" "$expect" <<'PY'
import re, sys, tomllib
preset, profiles, out, device = sys.argv[1:]
text = open(preset).read()
blocks = re.split(r"(?m)^(?=\[\[stage\]\])", text)
result = [blocks[0].replace('name = "ocr"', 'name = "ocr"  # profiles measured by scripts/gpu-check.sh')]
for block in blocks[1:]:
    stage = re.search(r'(?m)^name = "(\w+)"', block).group(1)
    measured = tomllib.load(open(f"{profiles}/{stage}.toml", "rb"))["stage"][0]["variant"][0]
    points = {int(b): (mean, p99) for b, mean, p99 in measured["profile_ms"]}
    per = 1 if stage == "det" else 3
    rows = [[b, *points[b * per]] for b in (1, 2, 4, 8) if b * per in points]
    block = re.sub(r"(?m)^profile_ms = .*$", "profile_ms = " + ", ".join(f"[{b}, {m:.4f}, {p:.4f}]" for b, m, p in rows).join("[]"), block)
    for key in ("memory_mib", "cold_start_ms", "warm_start_ms"):
        block = re.sub(rf"(?m)^{key} = .*$", f"{key} = {measured[key]}", block)
    block = re.sub(r"(?m)^max_batch = .*$", f"max_batch = {rows[-1][0]}", block)
    block = re.sub(r'(?m)^device = .*$', f'device = "{"cpu" if device == "cpu" else "gpu"}"', block)
    result.append(block)
open(out, "w").write("".join(result))
print(open(out).read())
PY
}
export -f ocr_pipeline_from_profiles
if ls "$results"/profiles/{det,cls,rec}.toml >/dev/null 2>&1; then
    step pipeline-measured 20 ocr_pipeline_from_profiles
else # the profile steps were skipped or failed: serve then runs the preset's profiles
    record SKIP pipeline-measured "no measured profile of every stage"
fi

# --- the OCR pipeline served on the device, under load -----------------------------------------
serve_under_load() { # serve_under_load [ENV=VALUE…]: the server runs with those settings
    local port=18000 server
    local pipeline=ocr
    [ -f "$results/ocr-measured.toml" ] && pipeline=$results/ocr-measured.toml
    echo "serving $pipeline"
    env YARDMASTER_LOG=info,yardmaster_serve::executor=debug "$@" "$bin/yardmaster" serve --pipeline "$pipeline" \
        --listen 127.0.0.1:$port --for 300 >"$results/server.log" 2>&1 &
    server=$!
    python3 - "$port" <<'PY' || { kill $server; cat "$results/server.log"; return 1; }
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready"
for _ in range(240):
    try:
        if urllib.request.urlopen(url, timeout=1).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.25)
sys.exit("the server did not become ready in 60 s")
PY
    scrape() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://127.0.0.1:$port/metrics" >"$results/metrics-$1.txt"; }
    scrape idle
    grep -h '^yardmaster_gpu_memory' "$results/metrics-idle.txt" | sed 's/^/idle: /'
    local rc=0
    for rate in $rates; do
        # A rendered page of three text lines per request (what the preset's profiles
        # assume: detection on a 736 x 736 page, three crops to classify and read).
        "$bin/yardmaster" load --address 127.0.0.1:$port --rate "$rate" --duration "$span" \
            --text "Yardmaster serves PP-OCR|policies decide every batch|measured on this device" || rc=1
        scrape "rate$rate"
        grep -h '^yardmaster_gpu_memory' "$results/metrics-rate$rate.txt" | sed "s/^/after rate $rate: /"
    done
    command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    kill -TERM $server # a background job of a script ignores SIGINT
    wait $server
    local status=$?
    # A graceful stop must exit 0: a crash at exit (it happened, see docs/dataplane.md)
    # is a failure even when every request was answered.
    [ "$status" -eq 0 ] || { echo "the server exited with status $status after SIGTERM"; rc=1; }
    grep -v 'job f' "$results/server.log" | tail -n 5
    # Where the time went, per stage: the worker's job (stack, Run, split) and the fold
    # (post-processing and the next stage's inputs).
    python3 - "$results/server.log" <<'PY'
import re, sys, collections
runs, folds = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    stage = re.search(r"stage=(\d+)", line)
    requests = re.search(r"requests=(\d+)", line)
    if not stage or not requests:
        continue
    for key, table in (("duration_ms", runs), ("fold_ms", folds)):
        value = re.search(key + r"=([0-9.]+)", line)
        if value:
            table[int(stage.group(1))].append((int(requests.group(1)), float(value.group(1))))
for stage in sorted(set(runs) | set(folds)):
    for name, table in (("job", runs), ("fold", folds)):
        rows = table[stage]
        if rows:
            mean_n = sum(n for n, _ in rows) / len(rows)
            mean_ms = sum(ms for _, ms in rows) / len(rows)
            print(f"stage {stage} {name}: {len(rows)} jobs, {mean_n:.1f} requests each, mean {mean_ms:.2f} ms, max {max(ms for _, ms in rows):.2f} ms")
# Per batch size: a job whose size differs from the one before may pay for new plans
# (ONNX Runtime's CUDA convolutions re-plan on a shape change), so show each size.
for stage in sorted(runs):
    sizes = collections.defaultdict(list)
    for n, ms in runs[stage]:
        sizes[n].append(ms)
    print(f"stage {stage} by batch: " + ", ".join(
        f"{n}: {len(v)}× median {sorted(v)[len(v) // 2]:.1f} ms" for n, v in sorted(sizes.items())))
PY
    grep -E "worker ready|worker failed|scal" "$results/server.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200
    return $rc
}
export rates span
export -f serve_under_load
step serve 120 serve_under_load

# --- a model repository on the device, models loaded and unloaded ------------------------------
serve_repository() {
    local port=18100 repo=$work/repository
    rm -rf "$repo" && mkdir -p "$repo/magika/1" "$repo/nudenet/1"
    cp "$work/payload/assets/magika-1.0.3/model.onnx" "$repo/magika/1/"
    cp "$work/payload/assets/nudenet-3.4.2/320n.onnx" "$repo/nudenet/1/model.onnx"
    cat >"$repo/nudenet/config.pbtxt" <<'PBTXT'
name: "nudenet"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]
output [ { name: "output0" data_type: TYPE_FP32 dims: [ 22, -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
PBTXT
    export YARDMASTER_ASSETS=$work/assets-repository   # a fresh profile cache
    rm -rf "$YARDMASTER_ASSETS"
    local rc=0 start
    for round in cold cached; do
        start=$(date +%s.%N)
        "$bin/yardmaster" serve --model-repository "$repo" --model-control-mode explicit --listen 127.0.0.1:$port \
            --for 300 >"$results/repository-$round.log" 2>&1 &
        local server=$!
        python3 - "$port" "$round" "$start" <<'PY' || rc=1
import json, sys, time, urllib.request
port, round_, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
base = f"http://127.0.0.1:{port}"
def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="GET" if body is None and not path.startswith("/v2/repository") else "POST")
    with urllib.request.urlopen(request, timeout=120) as answer:
        return answer.status, answer.read()
def answers_ok(path, tries):
    """Whether GET path answers 200 within tries × 0.1 s."""
    for _ in range(tries):
        try:
            if call(path)[0] == 200:
                return True
        except Exception:
            pass
        time.sleep(0.1)
    return False
if not answers_ok("/v2/health/ready", 1200):
    sys.exit("not ready in 120 s")
print(f"{round_}: start to ready {time.time() - start:.2f} s")
def gpu_memory():
    text = call("/metrics")[1].decode()
    return [line for line in text.splitlines() if line.startswith("yardmaster_gpu_memory_used")]
def infer(model, name, datatype, shape, value):
    n = 1
    for d in shape:
        n *= d
    t0 = time.time()
    status, body = call(f"/v2/models/{model}/infer", {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": [value] * n}]})
    return status, (time.time() - t0) * 1e3, json.loads(body)["outputs"][0]["shape"]
meta = json.loads(call("/v2/models/magika")[1])
width = meta["inputs"][0]["shape"][1]
for model, args in (("magika", ("bytes", "INT32", [1, width], 7)), ("nudenet", ("images", "FP32", [1, 3, 320, 320], 0.5))):
    runs = [infer(model, *args) for _ in range(5)]
    print(f"{round_}: {model} status {runs[-1][0]} shape {runs[-1][2]} latency ms {[round(r[1], 1) for r in runs]}")
if round_ == "cached":
    print("gpu memory before cycles:", gpu_memory())
    t0 = time.time()
    for cycle in range(20):
        call("/v2/repository/models/nudenet/unload", {})
        call("/v2/repository/models/nudenet/load", {})
    print(f"20 unload/load cycles of nudenet: {time.time() - t0:.2f} s")
    answers_ok("/v2/models/nudenet/ready", 600)
    print("nudenet after cycles:", infer("nudenet", "images", "FP32", [1, 3, 320, 320], 0.5)[:2])
    print("gpu memory after cycles:", gpu_memory())
PY
        kill -TERM $server
        wait $server || { echo "$round: the server exited with status $? after SIGTERM"; rc=1; }
        grep -E "profil|not served|warning" "$results/repository-$round.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 | head -8
    done
    return $rc
}
export -f serve_repository
step repository 150 serve_repository
if [ $experiments = 1 ]; then
    mkdir -p "$results/serve-default" && mv "$results"/metrics-*.txt "$results/server.log" "$results/serve-default/"
    rates=${YARDMASTER_GPU_ALT_RATES:-50}
    step serve-arena-pow2-exhaustive 60 serve_under_load YARDMASTER_CUDA_ARENA=next-power-of-two YARDMASTER_CUDA_CONV_ALGO=exhaustive
fi
finish
