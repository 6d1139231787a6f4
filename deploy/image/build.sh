#!/usr/bin/env bash
# Build the Yardmaster OCI image on this machine from Debian packages only.
#
#   bash deploy/image/build.sh [--binary PATH] [--with-models] [--tag TAG] [--out DIR] ...
#
# 1. a minimal Debian root filesystem (mmdebstrap, variant essential + the C++ runtime),
#    cached as a tarball keyed by a hash of its recipe;
# 2. an application layer: the yardmaster binary, the ONNX Runtime library, optionally
#    the PP-OCR models, and the writable state folder of the non-root user;
# 3. both packed as an OCI image layout with umoci (layers, entrypoint, cmd, env, user,
#    ports, labels), then the digest and size are printed.
#
# See deploy/image/README.md. Every option is listed by --help.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

target_dir=${CARGO_TARGET_DIR:-target}
assets=${YARDMASTER_ASSETS:-$HOME/.cache/yardmaster}
ort_version=1.31.1       # crates/dataplane/src/assets.rs: ORT_VERSION
rapidocr_version=1.4.4   # crates/dataplane/src/assets.rs: RAPIDOCR_VERSION

binary="$target_dir/release/yardmaster"
out="$target_dir/image/yardmaster-oci"
tag=0.1.0
ort_dir="$assets/onnxruntime-$ort_version"
models_dir="$assets/rapidocr-$rapidocr_version"
with_models=0
suite=bookworm
sources=()
cache_dir=${YARDMASTER_TOOLS:-$HOME/.cache/yardmaster/tools}
rebuild_base=0
install_tools=1

usage() {
    cat <<EOF
usage: bash deploy/image/build.sh [options]

  --binary PATH       the yardmaster executable (default: $binary)
  --tag TAG           image tag (default: $tag)
  --out DIR           OCI image layout to write (default: $out)
  --ort-dir DIR       folder holding libonnxruntime.so* (default: $ort_dir)
  --with-models       put the PP-OCR models in the image, so the default \`serve\` works
  --models-dir DIR    folder holding the PP-OCR .onnx files (default: $models_dir)
  --suite NAME        Debian suite of the base (default: $suite)
  --sources FILE      an apt sources file (.list or .sources) to build the base from;
                      repeat for several (default: the host's configured $suite sources)
  --cache-dir DIR     where the base tarball is cached (default: $cache_dir)
  --rebuild-base      build the base tarball again even if it is cached
  --no-install        do not apt-get install missing tools (mmdebstrap, umoci)

Environment: SOURCE_DATE_EPOCH (default: the commit time of HEAD) dates the files and
the image; CARGO_TARGET_DIR, YARDMASTER_ASSETS, YARDMASTER_TOOLS as in scripts/setup.sh.
EOF
}

die() { echo "build.sh: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }
need_arg() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --binary) need_arg "$@"; binary=$2; shift 2 ;;
        --tag) need_arg "$@"; tag=$2; shift 2 ;;
        --out) need_arg "$@"; out=$2; shift 2 ;;
        --ort-dir) need_arg "$@"; ort_dir=$2; shift 2 ;;
        --with-models) with_models=1; shift ;;
        --models-dir) need_arg "$@"; models_dir=$2; shift 2 ;;
        --suite) need_arg "$@"; suite=$2; shift 2 ;;
        --sources) need_arg "$@"; sources+=("$2"); shift 2 ;;
        --cache-dir) need_arg "$@"; cache_dir=$2; shift 2 ;;
        --rebuild-base) rebuild_base=1; shift ;;
        --no-install) install_tools=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "--tag '$tag' is not a valid OCI tag"

started=$(date +%s)

# --- Tools ------------------------------------------------------------------------------
step "checking tools"
missing=()
for tool in mmdebstrap:mmdebstrap umoci:umoci python3:python3 tar:tar sha256sum:coreutils; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $install_tools == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "    installing from Debian: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
            || die "could not install ${missing[*]} with apt-get"
    else
        die "missing tools: ${missing[*]} (install the Debian packages: apt-get install ${missing[*]})"
    fi
fi
echo "    mmdebstrap $(mmdebstrap --version | awk '{print $2}'), $(umoci --version)"

# --- Inputs -----------------------------------------------------------------------------
step "checking inputs"
if [[ ! -f $binary ]]; then
    hint="build it with \`cargo build --release -p yardmaster-cli\` (or pass --binary PATH)"
    [[ -f $target_dir/debug/yardmaster ]] && hint+="; a debug build is at $target_dir/debug/yardmaster"
    die "no yardmaster binary at $binary: $hint"
fi
[[ -x $binary ]] || die "$binary is not executable"
head -c 4 "$binary" | grep -q $'\x7fELF' || die "$binary is not an ELF executable"
ort_lib="$ort_dir/libonnxruntime.so.$ort_version"
[[ -f $ort_lib ]] || die "no ONNX Runtime library at $ort_lib: run \`bash scripts/setup.sh --deps\` (or pass --ort-dir DIR)"
model_files=(ch_PP-OCRv4_det_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx ch_PP-OCRv4_rec_infer.onnx)
if [[ $with_models == 1 ]]; then
    for f in "${model_files[@]}"; do
        [[ -f $models_dir/$f ]] || die "no PP-OCR model $models_dir/$f: run \`bash scripts/setup.sh --deps\` (or pass --models-dir DIR)"
    done
fi
echo "    binary       $binary ($(du -h "$binary" | cut -f1))"
echo "    onnxruntime  $ort_lib"
[[ $with_models == 1 ]] && echo "    models       $models_dir (${model_files[*]})"

# The shared libraries both need at run time; each must come from the base below.
needed_libs=$( { ldd "$binary"; ldd "$ort_lib"; } | awk '/=>/ {print $1} /^[[:space:]]*\/.*ld-linux/ {print $1}' \
    | grep -v -e '^linux-vdso' -e 'libonnxruntime' | xargs -n1 basename | sort -u)
if { ldd "$binary"; ldd "$ort_lib"; } | grep -q 'not found'; then
    die "a library of the binary or of ONNX Runtime is not found on this host: $( { ldd "$binary"; ldd "$ort_lib"; } | grep 'not found' | xargs)"
fi
echo "    run-time libraries: $(tr '\n' ' ' <<<"$needed_libs")"

arch=$(dpkg --print-architecture)
case $arch in
    amd64|arm64|ppc64le|s390x|riscv64) oci_arch=$arch ;;
    armhf) oci_arch=arm ;;
    i386) oci_arch=386 ;;
    *) die "unsupported architecture $arch" ;;
esac

if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# --- Base root filesystem ---------------------------------------------------------------
# Debian's essential set (dpkg, coreutils, bash, libc6, libgcc-s1, ...) and the C++
# runtime ONNX Runtime links against; merged /usr without the usrmerge package (and
# perl); no documentation, manuals or translations; no /dev (the runtime provides it);
# the image's user, uid and gid 10001, whose home is the state folder.
step "base root filesystem (Debian $suite, $arch)"
if [[ ${#sources[@]} -eq 0 ]]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        # Only the host's Debian sources for this suite (not third-party repositories).
        if grep -v '^[[:space:]]*#' "$f" | grep -Eq "(^|[[:space:]])$suite([[:space:]]|$)"; then
            sources+=("$f")
        fi
    done
    [[ ${#sources[@]} -gt 0 ]] || die "no apt sources for $suite configured on this host (pass --sources FILE)"
fi
for f in "${sources[@]}"; do
    [[ -f $f ]] || die "--sources $f: no such file"
    [[ $f == *.list || $f == *.sources ]] || die "--sources $f: the name must end in .list or .sources"
done
echo "    apt sources: ${sources[*]}"

base_packages=(libc6 libgcc-s1 libstdc++6)
user_hook='echo "yardmaster:x:10001:10001:Yardmaster:/var/lib/yardmaster:/usr/sbin/nologin" >> "$1/etc/passwd"; echo "yardmaster:x:10001:" >> "$1/etc/group"; if [ -f "$1/etc/shadow" ]; then echo "yardmaster:*:19000:0:99999:7:::" >> "$1/etc/shadow"; fi'
clean_hook='rm -f "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/etc/machine-id; find "$1/var/log" -type f -delete'
mm_args=(
    --variant=essential
    "--include=$(IFS=,; echo "${base_packages[*]}")"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    --customize-hook="$user_hook"
    --customize-hook="$clean_hook"
    --skip=output/dev
)
# The cache key: everything that decides the base's contents (not the date it is built).
base_key=$( { echo "recipe 1 $suite $arch"; printf '%s\n' "${mm_args[@]}"; cat "${sources[@]}"; } | sha256sum | cut -c1-16)
base_tar="$cache_dir/image-base-$base_key.tar"
mkdir -p "$cache_dir"
if [[ -f $base_tar && $rebuild_base == 0 ]]; then
    echo "    cached: $base_tar ($(du -h "$base_tar" | cut -f1))"
else
    [[ -f /usr/share/mmdebstrap/hooks/merged-usr/setup00.sh ]] || die "mmdebstrap's merged-usr hook is missing (/usr/share/mmdebstrap/hooks/merged-usr)"
    echo "    building $base_tar with mmdebstrap (downloads the packages; about a minute)"
    t0=$(date +%s)
    partial="$base_tar.partial.$$"
    trap 'rm -f "$partial"' EXIT
    log="$cache_dir/image-base-$base_key.log"
    if ! mmdebstrap --mode=auto --format=tar "${mm_args[@]}" "$suite" "$partial" "${sources[@]}" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "mmdebstrap failed (full log: $log)"
    fi
    mv -f "$partial" "$base_tar"
    trap - EXIT
    echo "    built in $(( $(date +%s) - t0 )) s: $(du -h "$base_tar" | cut -f1)"
fi

# Every run-time library must be in the base.
base_listing=$(tar -tf "$base_tar")
for lib in $needed_libs; do
    awk -v lib="$lib" '{ n = split($0, part, "/"); if (part[n] == lib && index($0, "./usr/lib") == 1) found = 1 } END { exit !found }' <<<"$base_listing" \
        || die "the base has no $lib, which the binary or ONNX Runtime needs: add its package to base_packages in $0"
done
echo "    all $(wc -w <<<"$needed_libs") run-time libraries are in the base"

# --- Application layer ------------------------------------------------------------------
step "application layer"
work=$(mktemp -d "${TMPDIR:-/tmp}/yardmaster-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
install -d -m 0755 "$stage/usr/local/bin" "$stage/opt/yardmaster/lib"
install -m 0755 "$binary" "$stage/usr/local/bin/yardmaster"
install -m 0644 "$ort_lib" "$stage/opt/yardmaster/lib/libonnxruntime.so.$ort_version"
ln -s "libonnxruntime.so.$ort_version" "$stage/opt/yardmaster/lib/libonnxruntime.so.1"
ln -s "libonnxruntime.so.1" "$stage/opt/yardmaster/lib/libonnxruntime.so"
env_vars=(
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/var/lib/yardmaster
    YARDMASTER_ASSETS=/var/lib/yardmaster
    YARDMASTER_ORT_LIB=/opt/yardmaster/lib/libonnxruntime.so
)
if [[ $with_models == 1 ]]; then
    install -d -m 0755 "$stage/opt/yardmaster/models/rapidocr-$rapidocr_version"
    for f in "${model_files[@]}"; do
        install -m 0644 "$models_dir/$f" "$stage/opt/yardmaster/models/rapidocr-$rapidocr_version/$f"
    done
    env_vars+=("YARDMASTER_MODELS=/opt/yardmaster/models/rapidocr-$rapidocr_version")
fi
install -d -m 0750 "$stage/var/lib/yardmaster"
chmod 0755 "$stage" "$stage/usr" "$stage/usr/local" "$stage/opt" "$stage/opt/yardmaster"
install -d -m 0755 "$stage/var" "$stage/var/lib"
install -d -m 0755 "$stage/dev"   # empty: the runtime mounts it (the base has none)
# Files owned by root, the state folder by the image's user; sorted names and one date.
tar_opts=(--sort=name "--mtime=@$SOURCE_DATE_EPOCH" --numeric-owner --format=gnu)
tar -C "$stage" "${tar_opts[@]}" --owner=0 --group=0 --exclude=./var/lib/yardmaster -cf "$work/app.tar" .
tar -C "$stage" "${tar_opts[@]}" --owner=10001 --group=10001 -cf "$work/state.tar" ./var/lib/yardmaster
tar -Af "$work/app.tar" "$work/state.tar"
echo "    $(tar -tf "$work/app.tar" | grep -vc '/$') files, $(du -h "$work/app.tar" | cut -f1)"

# --- OCI image --------------------------------------------------------------------------
step "OCI image $out:$tag"
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$repo" status --porcelain -- crates sdk policies policy-artifacts wit Cargo.toml Cargo.lock 2>/dev/null) ]]; then
    revision+="-dirty"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
license=$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)
source_url=$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -n1)
base_count=$(tar -xOf "$base_tar" ./var/lib/dpkg/status | awk '/^Package:/{p=$2} /^Version:/{print p"="$2}' | wc -l)

if [[ -e $out && ! -f $out/oci-layout ]]; then
    die "$out exists and is not an OCI image layout; remove it or pass another --out"
fi
if [[ ! -d $out ]]; then
    mkdir -p "$(dirname "$out")"
    umoci init --layout "$out"
fi
if umoci ls --layout "$out" | grep -qx -- "$tag"; then
    umoci rm --image "$out:$tag"
fi
umoci new --image "$out:$tag"
umoci raw add-layer --image "$out:$tag" \
    --history.created "$created" --history.author "Yardmaster deploy/image/build.sh" \
    --history.created_by "mmdebstrap --variant=essential --include=$(IFS=,; echo "${base_packages[*]}") $suite ($base_count packages)" \
    "$base_tar"
umoci raw add-layer --image "$out:$tag" \
    --history.created "$created" --history.author "Yardmaster deploy/image/build.sh" \
    --history.created_by "yardmaster $version, ONNX Runtime $ort_version$([[ $with_models == 1 ]] && echo ", PP-OCR models (rapidocr $rapidocr_version)")" \
    "$work/app.tar"

config_args=(
    --no-history
    --created "$created"
    --author "Yardmaster"
    --architecture "$oci_arch" --os linux
    --config.user 10001:10001
    --config.workingdir /var/lib/yardmaster
    --config.entrypoint /usr/local/bin/yardmaster
    --config.cmd=serve --config.cmd=--listen --config.cmd=0.0.0.0:8000
    --config.stopsignal SIGTERM
)
for port in 8000/tcp 8000/udp 8001/tcp 7443/udp; do
    config_args+=(--config.exposedports "$port")
done
for e in "${env_vars[@]}"; do
    config_args+=(--config.env "$e")
done
labels=(
    "org.opencontainers.image.title=Yardmaster"
    "org.opencontainers.image.description=Inference-serving host whose scheduling decisions are made by sandboxed WebAssembly policies (KServe v2 over HTTP/1.1, HTTP/3 and gRPC)"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.created=$created"
    "org.opencontainers.image.licenses=$license"
    "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.base.name=debian:$suite"
    "org.opencontainers.image.ref.name=$tag"
)
for l in "${labels[@]}"; do
    config_args+=(--config.label "$l" --manifest.annotation "$l")
done
umoci config --image "$out:$tag" "${config_args[@]}"
umoci gc --layout "$out"

# --- Summary ----------------------------------------------------------------------------
step "done in $(( $(date +%s) - started )) s"
python3 - "$out" "$tag" <<'EOF'
import json, os, sys
out, tag = sys.argv[1], sys.argv[2]
def blob(digest):
    algo, hexd = digest.split(":", 1)
    return os.path.join(out, "blobs", algo, hexd)
index = json.load(open(os.path.join(out, "index.json")))
desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(desc["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
compressed = desc["size"] + manifest["config"]["size"] + sum(l["size"] for l in manifest["layers"])
print(f"    image    {out}:{tag}")
print(f"    digest   {desc['digest']}")
print(f"    size     {compressed / 2**20:.1f} MiB compressed ({len(manifest['layers'])} layers: "
      + ", ".join(f"{l['size'] / 2**20:.1f}" for l in manifest["layers"]) + " MiB)")
c = config["config"]
print(f"    run      {' '.join(c['Entrypoint'] + c.get('Cmd', []))}  as {c['User']} in {c['WorkingDir']}")
print(f"    ports    {' '.join(sorted(c.get('ExposedPorts', {})))}")
EOF
echo "    push it: skopeo copy oci:$out:$tag docker://REGISTRY/yardmaster:$tag"
