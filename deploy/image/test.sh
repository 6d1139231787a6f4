#!/usr/bin/env bash
# The image check (CI): build the OCI image with the debug binary, unpack it, and run the
# image's own entrypoint and cmd, as recorded in its configuration, inside the unpacked
# root filesystem (unshare + chroot, as the image's user, with the image's environment
# and working directory; no container runtime is needed). It must answer
# /v2/health/ready and /v2/health/live, read a rendered line of text through the default
# PP-OCR pipeline, refuse a malformed request, serve the trivial model with the right
# numbers, and stop with status 0 on SIGTERM. Prints "N passed, M failed".
#
#   bash deploy/image/test.sh            (needs root: mounts, chroot; installs
#                                         mmdebstrap and umoci from Debian if missing)
#
# YARDMASTER_IMAGE_BINARY overrides the binary (default: $CARGO_TARGET_DIR/debug/yardmaster);
# YARDMASTER_IMAGE_READY_SECS the readiness timeout (default 120).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1
target_dir=${CARGO_TARGET_DIR:-target}
binary=${YARDMASTER_IMAGE_BINARY:-$target_dir/debug/yardmaster}
layout="$target_dir/image/yardmaster-oci-test"
tag="test"
ready_secs=${YARDMASTER_IMAGE_READY_SECS:-120}

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
summary() { echo "$passed passed, $failed failed"; [[ $failed == 0 ]]; }
abort() { bad "$*"; summary; exit 1; }

[[ $(id -u) == 0 ]] || abort "the image test needs root (mount namespaces, chroot)"
for tool in unshare curl python3; do
    command -v "$tool" >/dev/null || abort "missing tool: $tool"
done
python=$(python3 -c 'import sys; print(sys.executable)')

work=$(mktemp -d "${TMPDIR:-/tmp}/yardmaster-image-test.XXXXXX")
server_ns=""   # the unshare process of a running server
cleanup() {
    local status=$?
    if [[ -n $server_ns ]] && kill -0 "$server_ns" 2>/dev/null; then
        local child
        child=$(cat "/proc/$server_ns/task/$server_ns/children" 2>/dev/null)
        for pid in $child; do kill -TERM "$pid" 2>/dev/null; done
        for _ in $(seq 50); do kill -0 "$server_ns" 2>/dev/null || break; sleep 0.2; done
        # unshare's child dies with it (--kill-child), and everything in its namespaces.
        kill -KILL "$server_ns" 2>/dev/null
        wait "$server_ns" 2>/dev/null
    fi
    # The mounts live in the server's own mount namespace and went with it; check anyway
    # before removing the bundle.
    if findmnt -rn -o TARGET | grep -q "^$work/"; then
        findmnt -rn -o TARGET | grep "^$work/" | sort -r | while read -r m; do umount -l "$m"; done
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- Build ------------------------------------------------------------------------------
echo "==> building the image with $binary"
[[ -f $binary ]] || abort "no binary at $binary (cargo build -p yardmaster-cli, or set YARDMASTER_IMAGE_BINARY)"
t0=$(date +%s)
if bash "$here/build.sh" --binary "$binary" --with-models --out "$layout" --tag "$tag" 2>&1 | sed 's/^/    /'; then
    ok "build.sh built $layout:$tag in $(( $(date +%s) - t0 )) s"
else
    abort "build.sh failed"
fi

# --- The image's configuration ----------------------------------------------------------
# Everything the run needs comes from the OCI image config: entrypoint + cmd, env, user,
# working directory. Written as NUL-separated files and shell variables.
if ! "$python" - "$layout" "$tag" "$work" >"$work/config.sh" <<'EOF'
import json, os, shlex, sys
layout, tag, work = sys.argv[1:]
def blob(digest):
    algo, hexd = digest.split(":", 1)
    return json.load(open(os.path.join(layout, "blobs", algo, hexd)))
index = json.load(open(os.path.join(layout, "index.json")))
desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
config = blob(blob(desc["digest"])["config"]["digest"])["config"]
argv = config.get("Entrypoint", []) + config.get("Cmd", [])
user, _, group = config.get("User", "0").partition(":")
with open(os.path.join(work, "argv"), "w") as f:
    f.write("\0".join(argv))
with open(os.path.join(work, "env"), "w") as f:
    f.write("\0".join(config.get("Env", [])))
print(f"argv0={shlex.quote(argv[0])}")
print(f"uid={shlex.quote(user)} gid={shlex.quote(group or user)}")
print(f"workdir={shlex.quote(config.get('WorkingDir') or '/')}")
print(f"ports={shlex.quote(' '.join(sorted(config.get('ExposedPorts', {}))))}")
print(f"labels={shlex.quote(' '.join(sorted(config.get('Labels', {}))))}")
print(f"shown={shlex.quote(' '.join(argv))}")
env = dict(e.split("=", 1) for e in config.get("Env", []))
print(f"ort_lib={shlex.quote(env.get('YARDMASTER_ORT_LIB', ''))}")
EOF
then
    abort "reading the image configuration"
fi
argv0="" uid="" gid="" workdir="" ports="" labels="" shown="" ort_lib=""
# shellcheck disable=SC1091
source "$work/config.sh"
echo "    entrypoint + cmd: $shown (user $uid:$gid, workdir $workdir)"
problems=()
[[ $argv0 == /usr/local/bin/yardmaster ]] || problems+=("entrypoint is $argv0")
[[ $uid =~ ^[0-9]+$ && $uid != 0 && $gid =~ ^[0-9]+$ ]] || problems+=("user is '$uid:$gid', not a numeric non-root user")
for p in 8000/tcp 8000/udp 8001/tcp 7443/udp; do [[ " $ports " == *" $p "* ]] || problems+=("port $p not exposed"); done
for l in title version revision created source licenses; do
    [[ " $labels " == *" org.opencontainers.image.$l "* ]] || problems+=("no label org.opencontainers.image.$l")
done
[[ -n $ort_lib ]] || problems+=("YARDMASTER_ORT_LIB not in the image's env")
if [[ ${#problems[@]} == 0 ]]; then ok "image config: entrypoint, non-root user, ports, labels, env"; else bad "image config: ${problems[*]}"; fi

# --- Unpack -----------------------------------------------------------------------------
echo "==> unpacking into $work/bundle"
if umoci unpack --image "$layout:$tag" "$work/bundle" >"$work/unpack.log" 2>&1; then
    ok "umoci unpack"
else
    cat "$work/unpack.log"
    abort "umoci unpack"
fi
rootfs="$work/bundle/rootfs"

# The binary and ONNX Runtime resolve every library from the image itself.
links=$(chroot "$rootfs" /usr/bin/ldd "$argv0" 2>&1; chroot "$rootfs" /usr/bin/ldd "$ort_lib" 2>&1)
if [[ -f $rootfs$ort_lib ]] && ! grep -q -e 'not found' -e 'No such file' <<<"$links" && grep -q 'libc.so.6 => /' <<<"$links"; then
    ok "binary and $ort_lib link against the image's libraries only"
else
    bad "libraries in the image: $(grep -e 'not found' -e 'No such' <<<"$links" | xargs)"
fi

# --- Running the image ------------------------------------------------------------------
free_port() {
    # A port free for both TCP and UDP (HTTP/1.1 and HTTP/3 share the number).
    "$python" - <<'EOF'
import socket
while True:
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.bind(("127.0.0.1", 0))
    port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(port)
    break
EOF
}

# What runs as PID 1 of the new namespaces: /dev, /tmp and /sys for the root filesystem
# (/proc is mounted by unshare), then the entrypoint, chrooted, as the image's user, in
# its working directory, with exactly its environment.
cat >"$work/inside.sh" <<'EOF'
set -eu
rootfs=$1 python=$2 enter=$3; shift 3
mkdir -p "$rootfs/dev"
mount -t tmpfs -o mode=0755,nosuid,size=1m tmpfs "$rootfs/dev"
for d in null zero full random urandom; do
    touch "$rootfs/dev/$d"
    mount --bind "/dev/$d" "$rootfs/dev/$d"
done
ln -s /proc/self/fd "$rootfs/dev/fd"
mkdir -m 1777 "$rootfs/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=64m tmpfs "$rootfs/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$rootfs/tmp"
mount --bind /sys "$rootfs/sys"
mount -o remount,bind,ro,nosuid,nodev,noexec "$rootfs/sys"
exec "$python" "$enter" "$rootfs" "$@"
EOF
cat >"$work/enter.py" <<'EOF'
import os, sys
rootfs, uid, gid, workdir, argv_file, env_file, *extra = sys.argv[1:]
argv = open(argv_file).read().split("\0") + extra
env = dict(e.split("=", 1) for e in open(env_file).read().split("\0") if e)
os.chroot(rootfs)
os.chdir("/")
os.setgroups([])
os.setgid(int(gid))
os.setuid(int(uid))
os.chdir(workdir)
os.execve(argv[0], argv, env)
EOF

# in_image ARGV-FILE: run that argv (NUL-separated) in the image as described above.
# Always called in a subshell ($(...) or &): it becomes unshare, whose one child is the
# entrypoint, PID 1 of the new PID namespace.
in_image() {
    exec unshare --mount --pid --fork --kill-child --mount-proc="$rootfs/proc" -- \
        bash "$work/inside.sh" "$rootfs" "$python" "$work/enter.py" "$uid" "$gid" "$workdir" "$1" "$work/env"
}

# The shipped policies are in the binary (not files in the image): list them in the image.
printf '%s\0policy\0list' "$argv0" >"$work/argv.policies"
policies=$(in_image "$work/argv.policies" 2>&1)
if grep -qw edf <<<"$policies"; then
    ok "the shipped policies are embedded in the binary: $(grep -c sha256 <<<"$policies") listed by \`yardmaster policy list\` in the image"
else
    bad "\`yardmaster policy list\` in the image: ${policies:0:300}"
fi

# start_server NAME EXTRA_ARGS...: the image's argv with --listen and --grpc-listen moved
# to free loopback ports (and EXTRA_ARGS appended), started in the background.
start_server() {
    local name=$1; shift
    port=$(free_port)
    grpc_port=$(free_port)
    while [[ $grpc_port == "$port" ]]; do grpc_port=$(free_port); done
    "$python" - "$work/argv" "$work/argv.run" "127.0.0.1:$port" "127.0.0.1:$grpc_port" "$@" <<'EOF'
import sys
source, target, listen, grpc, *extra = sys.argv[1:]
argv = open(source).read().split("\0")
def put(flag, value):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            argv[i + 1] = value
            return
        if a.startswith(flag + "="):
            argv[i] = f"{flag}={value}"
            return
    argv.extend([flag, value])
put("--listen", listen)
put("--grpc-listen", grpc)
open(target, "w").write("\0".join(argv + extra))
EOF
    log="$work/$name.log"
    echo "==> starting $name: $(tr '\0' ' ' <"$work/argv.run")"
    in_image "$work/argv.run" >"$log" 2>&1 &
    server_ns=$!
    base="http://127.0.0.1:$port"
}

# wait_ready: poll /v2/health/ready until 200, the server exits, or the timeout.
wait_ready() {
    local t0 code=000 elapsed
    t0=$(date +%s)
    while :; do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$base/v2/health/ready")
        elapsed=$(( $(date +%s) - t0 ))
        [[ $code == 200 ]] && { ok "ready ($base/v2/health/ready: 200) after $elapsed s"; return 0; }
        if ! kill -0 "$server_ns" 2>/dev/null; then
            wait "$server_ns"; local status=$?
            server_ns=""
            tail -n 30 "$log" | sed 's/^/    | /'
            bad "the server exited with status $status before it was ready"
            return 1
        fi
        if (( elapsed >= ready_secs )); then
            tail -n 30 "$log" | sed 's/^/    | /'
            bad "not ready after $ready_secs s (last answer: $code)"
            return 1
        fi
        (( elapsed % 10 == 0 )) && echo "    waiting for $base/v2/health/ready ($elapsed s, last answer $code)"
        sleep 1
    done
}

# stop_server: SIGTERM to the entrypoint (PID 1 of its namespace); it must exit 0.
stop_server() {
    local child status
    child=$(cat "/proc/$server_ns/task/$server_ns/children" 2>/dev/null)
    if [[ -z $child ]]; then
        bad "the server is not running any more"
    else
        kill -TERM $child
        for _ in $(seq 150); do kill -0 "$server_ns" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$server_ns" 2>/dev/null; then
            bad "the server did not stop within 30 s of SIGTERM"
        else
            wait "$server_ns"; status=$?
            if [[ $status == 0 ]]; then ok "SIGTERM: the server stopped, status 0"; else bad "SIGTERM: the server exited with status $status"; fi
        fi
    fi
    server_ns=""
}

# request NAME METHOD PATH [BODY-FILE]: sets $code and $body.
request() {
    local path=$2 data=()
    [[ $# -ge 3 ]] && data=(-H 'Content-Type: application/json' --data-binary "@$3")
    code=$(curl -s -o "$work/body" -w '%{http_code}' --max-time 120 -X "$1" "${data[@]}" "$base$path")
    body=$(cat "$work/body" 2>/dev/null)
}

# A line of text drawn in a 5 × 7 block font, 6 pixels per dot, black on white:
# UINT8 [H, W, 3] pixels in a KServe v2 JSON request for the `ocr` ensemble.
"$python" - "$work/ocr.json" <<'EOF'
import json, sys
glyphs = {
    "H": ["10001", "10001", "10001", "11111", "10001", "10001", "10001"],
    "E": ["11111", "10000", "10000", "11110", "10000", "10000", "11111"],
    "L": ["10000", "10000", "10000", "10000", "10000", "10000", "11111"],
    "O": ["01110", "10001", "10001", "10001", "10001", "10001", "01110"],
    "4": ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    "2": ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    " ": ["00000"] * 7,
}
text, dot, margin = "HELLO 42", 6, 40
rows = ["0".join(glyphs[c][r] for c in text) for r in range(7)]
w = len(rows[0]) * dot + 2 * margin
h = 7 * dot + 2 * margin
h = max(h, w // 2)
top = (h - 7 * dot) // 2
pixels = []
for y in range(h):
    for x in range(w):
        ry, rx = (y - top) // dot, (x - margin) // dot
        ink = 0 <= y - top < 7 * dot and 0 <= x - margin < len(rows[0]) * dot and rows[ry][rx] == "1"
        v = 0 if ink else 255
        pixels.extend((v, v, v))
request = {
    "inputs": [{"name": "image", "shape": [h, w, 3], "datatype": "UINT8", "data": pixels}],
    "parameters": {"timeout": 100_000_000},
}
json.dump(request, open(sys.argv[1], "w"))
EOF
printf '{"inputs":[{"name":"image","shape":[2,2,3],"datatype":"UINT8","data":[1,2,3]}]}' >"$work/malformed.json"
printf '{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1.0,2.5,-3.0,40.0]}],"parameters":{"timeout":100000000}}' >"$work/tiny.json"

# 1. The image's own entrypoint and cmd: the default PP-OCR pipeline.
start_server default
if wait_ready; then
    request GET /v2/health/live
    [[ $code == 200 ]] && ok "live ($base/v2/health/live: 200)" || bad "/v2/health/live answered $code: $body"
    request GET /v2/models/ocr
    if [[ $code == 200 ]] && "$python" -c 'import json,sys; m=json.loads(sys.argv[1]); assert m["name"]=="ocr" and [i["name"] for i in m["inputs"]]==["image"]' "$body" 2>/dev/null; then
        ok "model metadata of ocr: input image"
    else
        bad "GET /v2/models/ocr answered $code: ${body:0:300}"
    fi
    t0=$(date +%s%N)
    request POST /v2/models/ocr/infer "$work/ocr.json"
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    read_text=$("$python" -c 'import json,sys; m=json.loads(sys.argv[1]); print(" | ".join(next(o["data"] for o in m["outputs"] if o["name"]=="texts")))' "$body" 2>/dev/null)
    if [[ $code == 200 ]] && tr -d ' ' <<<"${read_text^^}" | tr 0 O | grep -q 'HELLO42'; then
        ok "OCR inference read \"$read_text\" ($ms ms)"
    else
        bad "OCR inference: status $code, text \"$read_text\", body ${body:0:300}"
    fi
    request POST /v2/models/ocr/infer "$work/malformed.json"
    [[ $code == 400 ]] && ok "a malformed request gets 400" || bad "a malformed request got $code: ${body:0:200}"
    stop_server
fi

# 2. The same entrypoint and cmd serving the built-in trivial model: exact numbers.
start_server tiny --pipeline tiny
if wait_ready; then
    request POST /v2/models/tiny/infer "$work/tiny.json"
    if [[ $code == 200 ]] && "$python" -c 'import json,sys; m=json.loads(sys.argv[1]); y=next(o for o in m["outputs"] if o["name"]=="y"); assert y["data"]==[2.0,3.5,-2.0,41.0], y' "$body" 2>/dev/null; then
        ok "tiny inference: y = x + 1 exactly"
    else
        bad "tiny inference: status $code, body ${body:0:300}"
    fi
    stop_server
fi

summary
