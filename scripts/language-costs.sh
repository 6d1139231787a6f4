#!/usr/bin/env bash
# What a policy costs in each language: `yardmaster policy new` writes the same starter
# policy (earliest deadline first) in Rust, Python, JavaScript and Zig — it makes the
# same decisions as the shipped `edf` — and this script measures each next to `edf`, in
# the same run:
#
#   - the component's size;
#   - the decision cost per event from the conformance check (`policy check FILE
#     --deadline-ms 1000`: serve-mode ns per event, and fuel = WebAssembly instructions,
#     what a simulation spends);
#   - the served throughput of a closed loop and the longest policy call
#     (`serve-bench --policy FILE --deadline-ms 100`: the trivial model, HTTP/1.1 and
#     HTTP/3; a deadline well above the default 5 ms, so that no call faults and the
#     throughput is the policy's own, not the built-in fallback's — compare the longest
#     call with the deadline you will give the policy).
#
# Prints a Markdown table (ratios against `edf`). Languages whose toolchain is missing
# are left out.
#
#   bash scripts/language-costs.sh [YARDMASTER]   (default: target/release/yardmaster;
#                                                  build it with cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
yardmaster=${1:-${CARGO_TARGET_DIR:-target}/release/yardmaster}
[ -x "$yardmaster" ] || { echo "no $yardmaster: build it with cargo build --release -p yardmaster" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/yardmaster-language-costs.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}/policy-new

policies=(edf)
names=(edf)
for lang in rust python js zig; do
    "$yardmaster" policy new --lang "$lang" "$work/$lang" >/dev/null
    if bash "$work/$lang/build.sh" >"$work/$lang.build" 2>&1; then
        policies+=("$work/$lang/policy.wasm")
        names+=("$lang")
    else
        echo "left out $lang: $(tail -1 "$work/$lang.build")" >&2
    fi
done

for i in "${!policies[@]}"; do
    name=${names[$i]}
    echo "measuring $name …" >&2
    "$yardmaster" policy check "${policies[$i]}" --deadline-ms 1000 >"$work/$name.check" 2>/dev/null
    "$yardmaster" serve-bench --policy "${policies[$i]}" --deadline-ms 100 >"$work/$name.bench" 2>/dev/null
    if [ "$name" = edf ]; then
        "$yardmaster" policy export --dir "$work/shipped" >/dev/null
        cp "$work/shipped/edf.wasm" "$work/edf.wasm"
    else
        cp "${policies[$i]}" "$work/$name.wasm"
    fi
done

python3 - "$work" "${names[@]}" <<'EOF'
import re, sys, os
work, names = sys.argv[1], sys.argv[2:]
titles = {"edf": "`edf` (Rust, shipped)", "rust": "Rust (SDK)", "python": "Python", "js": "JavaScript", "zig": "Zig"}

def check(name):
    costs = {}
    for line in open(os.path.join(work, name + ".check")):
        m = re.match(r"\s+(arrival|mixed|tick)\s+\d+\s+\d+\s+(\d+)\s+(\d+)", line)
        if m:
            costs[m[1]] = (int(m[2]), int(m[3]))
    return costs

def bench(name):
    rates, longest, faults = [], None, None
    for line in open(os.path.join(work, name + ".bench")):
        m = re.match(r"served\s+(\S+).*\|\s+(\d+) req/s", line)
        if m:
            rates.append(int(m[2]))
        m = re.search(r"longest call ([\d.]+) ms, (\d+) faults", line)
        if m:
            longest, faults = float(m[1]), int(m[2])
    return rates, (longest, faults)

def size(name):
    n = os.path.getsize(os.path.join(work, name + ".wasm"))
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"

base_costs, (base_rates, _) = check("edf"), bench("edf")
print("| policy | component | arrival ns/event | mixed call ns/event | tick ns/event | fuel/event (mixed) | served req/s HTTP/1.1 | served req/s HTTP/3 | longest call |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name in names:
    costs, (rates, longest) = check(name), bench(name)
    def ratio(value, base):
        r = value / base
        return f"{value:,}".replace(",", " ") + ("" if name == "edf" else f" ({r:.0f}×)" if r >= 10 else f" ({r:.2g}×)")
    cells = [titles[name], size(name)]
    for kind in ("arrival", "mixed", "tick"):
        cells.append(ratio(costs[kind][0], base_costs[kind][0]) if kind in costs else "?")
    cells.append(ratio(costs["mixed"][1], base_costs["mixed"][1]) if "mixed" in costs else "?")
    for i in range(2):
        cells.append(ratio(rates[i], base_rates[i]) if len(rates) > i else "?")
    cells.append(f"{longest[0]:.2f} ms ({longest[1]} faults)" if longest[0] is not None else "?")
    print("| " + " | ".join(cells) + " |")
EOF
