#!/usr/bin/env bash
# Sim-to-real on a live cluster of this machine: three `yardmaster node` processes
# (127.0.0.2-4, one slot each) and a controller that finds them (static list, cluster
# CA), serving one model from a Triton repository. For each policy and each load
# (multiples of the cluster's capacity), the same Poisson arrivals (same generator,
# same seed) are sent live with `yardmaster load` and simulated with `yardmaster sim
# compare` on the hosts the controller measured (`yardmaster cluster hosts`); the
# table compares goodput and p99 latency, live against predicted.
#
#   scripts/sim-to-real.sh [--policies "quart flex"] [--loads "0.5 1 2"]
#                          [--duration 20] [--model magika] [--slo-ms 100] [--out DIR]
#
# The model is profiled first (`yardmaster profile`, before the nodes start), its
# profile put beside its configuration. Capacity is measured, not assumed: a calibration run at the profile's capacity
# measures each node's speed (its batch jobs' profiled time over their measured time,
# GET /v2/cluster); capacity is then sum over nodes of speed x the stage's best
# items per second by its profile. Needs the release binary (cargo build --release)
# and the model the set-up script downloads (magika by default; `--model FILE.onnx`
# for another). Prints a Markdown table; writes everything into --out.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${YARDMASTER_BIN:-$root/target/release/yardmaster}"
policies="quart flex"
loads="0.5 1 2"
duration=20
model="$HOME/.cache/yardmaster/magika-1.0.3/model.onnx"
slo_ms=100
out="$(mktemp -d /tmp/yardmaster-sim-to-real.XXXXXX)"
while [ $# -gt 0 ]; do
    case "$1" in
        --policies) policies="$2"; shift 2 ;;
        --loads) loads="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --slo-ms) slo_ms="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "no release binary at $bin: cargo build --release -p yardmaster" >&2; exit 1; }
[ -f "$model" ] || { echo "no model at $model: run scripts/setup.sh, or give --model FILE.onnx" >&2; exit 1; }
mkdir -p "$out"
name=served
repo="$out/repository"
mkdir -p "$repo/$name/1"
cp "$model" "$repo/$name/1/model.onnx"
cat > "$repo/$name/config.pbtxt" <<EOF
name: "$name"
platform: "onnxruntime_onnx"
max_batch_size: 4
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "yardmaster.slo_ms" value: { string_value: "$slo_ms" } }
EOF

# The profile, measured here before anything else runs (a profile cached from a busy
# machine would mislead both the policy and the simulator), beside the configuration.
"$bin" profile "$repo/$name/1/model.onnx" --batch 1,2,4 --iterations 50 --name "$name" \
    --out "$repo/$name/profile.toml" > "$out/profile.log" 2>&1
profile="$repo/$name/profile.toml"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

node_name=yardmaster-nodes.sim-to-real
"$bin" cluster certificates --out "$out/tls" --node-name "$node_name" > /dev/null
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')
for i in 2 3 4; do
    "$bin" node --listen "127.0.0.$i:$port" --name "node-$i" --slots 1 \
        --threads 1 --cert "$out/tls/node.pem" --key "$out/tls/node-key.pem" > "$out/node-$i.out" 2> "$out/node-$i.log" &
    pids+=($!)
done

# One controller per policy: each starts from cold caches and fresh counters.
start_controller() { # policy -> sets $http and $controller
    local policy="$1"
    http="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    cat > "$out/server-$policy.toml" <<EOF
model_repository = ["$repo"]
policy = "$policy"
listen = "$http"
grpc = false
http3 = false

[cluster]
nodes = "static:127.0.0.2:$port,127.0.0.3:$port,127.0.0.4:$port"
ca = "$out/tls/ca.pem"
node_name = "$node_name"
startup_wait_secs = 30
EOF
    "$bin" serve --config "$out/server-$policy.toml" > /dev/null 2> "$out/controller-$policy.log" &
    controller=$!
    pids+=("$controller")
    for _ in $(seq 1 600); do
        if curl -sf "http://$http/v2/health/ready" > /dev/null; then return; fi
        sleep 0.2
    done
    echo "the controller for $policy was not ready in 120 s; see $out/controller-$policy.log" >&2
    exit 1
}

# Items per second of one replica at its best batch, by the measured profile.
best_rate() {
    python3 - "$1" <<'EOF'
import sys, tomllib
profile = tomllib.load(open(sys.argv[1], "rb"))
points = profile["stage"][0]["variant"][0]["profile_ms"]
print(max(b * 1000.0 / mean for b, mean, _ in points))
EOF
}

live_run() { # http rate seed -> "goodput p99_ms"
    "$bin" load --address "$1" --model "$name" --transport h1 --connections 512 --workload poisson --rate "$2" \
        --duration "$duration" --seed "$3" --slo-ms "$slo_ms" > "$out/live.txt" 2>/dev/null
    python3 - "$out/live.txt" "$duration" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
on_time = int(re.search(r"(\d+) on time", text).group(1))
p99 = float(re.search(r"p99 ([0-9.]+) ms", text).group(1))
print(on_time / float(sys.argv[2]), p99)
EOF
}

sim_run() { # policy rate seed hosts -> "goodput p99_ms"
    rm -rf "$out/sim"
    "$bin" sim compare --policies "$1" --model-repository "$repo" --hosts "$4" --workload poisson \
        --rate "$2" --duration "$duration" --seed "$3" --out "$out/sim" > /dev/null 2>&1
    python3 - "$out/sim/summary.json" "$duration" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]["summary"]["overall"]
print(run["on_time"] / float(sys.argv[2]), run["latency"]["p99"] / 1e6)
EOF
}

stop_controller() {
    kill "$controller" 2>/dev/null || true
    wait "$controller" 2>/dev/null || true
}

echo "# sim-to-real: 3 nodes x 1 slot, model $(basename "$model"), SLO $slo_ms ms, $duration s per run; files in $out" >&2
per_replica=$(best_rate "$profile")
# Calibration: load at the profile's capacity of three nodes measures each node's speed.
calibration=$(python3 -c "print(3 * $per_replica)")
start_controller edf
live_run "$http" "$calibration" 99 > /dev/null
"$bin" cluster hosts --url "$http" --out "$out/hosts-calibrated.toml" 2> /dev/null
stop_controller
capacity=$(python3 - "$out/hosts-calibrated.toml" "$per_replica" <<'EOF'
import sys, tomllib
hosts = tomllib.load(open(sys.argv[1], "rb"))["host"]
print(sum(h["slots"] * h["speed"] for h in hosts) * float(sys.argv[2]))
EOF
)
echo "capacity $capacity req/s (by the profile at speed 1: $calibration); calibrated hosts:" >&2
grep -E "^# node" "$out/hosts-calibrated.toml" >&2 || true

table="| policy | load | offered req/s | goodput live | sim, calibrated hosts | ratio | sim, hosts as measured in the run | ratio | p99 live ms | p99 sim ms (calibrated / measured) |\n|---|---|---|---|---|---|---|---|---|---|\n"
seed=1
for policy in $policies; do
    for load in $loads; do
        # A fresh controller per run: cold caches, and each node's speed measured in this run.
        start_controller "$policy"
        rate=$(python3 -c "print($load * $capacity)")
        read -r live_goodput live_p99 < <(live_run "$http" "$rate" "$seed")
        "$bin" cluster hosts --url "$http" --out "$out/hosts-$policy-$load.toml" 2> /dev/null
        stop_controller
        read -r cal_goodput cal_p99 < <(sim_run "$policy" "$rate" "$seed" "$out/hosts-calibrated.toml")
        read -r run_goodput run_p99 < <(sim_run "$policy" "$rate" "$seed" "$out/hosts-$policy-$load.toml")
        row=$(python3 -c "
lg, cg, rg = $live_goodput, $cal_goodput, $run_goodput
ratio = lambda g: f'{g / lg:.2f}' if lg > 0 else 'inf'
print(f'| $policy | ${load}x | {$rate:.0f} | {lg:.1f} | {cg:.1f} | {ratio(cg)} | {rg:.1f} | {ratio(rg)} | {$live_p99:.1f} | {$cal_p99:.1f} / {$run_p99:.1f} |')")
        echo "$row" >&2
        table+="$row\n"
        seed=$((seed + 1))
    done
done
printf "%b" "$table" | tee "$out/table.md"
