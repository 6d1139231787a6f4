#!/usr/bin/env bash
# Requests per second through one controller: the trivial model (`tiny`, y = x + 1)
# served by the controller's own workers on this machine, against the same model on
# three `yardmaster node` processes (127.0.0.2-4, one slot each) that the controller
# reaches over QUIC. Open-loop Poisson load over HTTP/1.1 well past what either
# serves; the figure is requests answered per second, and the ratio cluster / local.
#
#   scripts/cluster-throughput.sh [--rate 60000] [--duration 5] [--policy edf] [--out DIR]
#
# Needs the release binary (cargo build --release -p yardmaster). On a machine with
# few cores the nodes, the controller and the load generator share them: the ratio
# then says what the extra hop costs in CPU, not what more machines would add.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${YARDMASTER_BIN:-$root/target/release/yardmaster}"
rate=60000
duration=5
policy=edf
out="$(mktemp -d /tmp/yardmaster-cluster-throughput.XXXXXX)"
while [ $# -gt 0 ]; do
    case "$1" in
        --rate) rate="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --policy) policy="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "no release binary at $bin: cargo build --release -p yardmaster" >&2; exit 1; }
mkdir -p "$out"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve CONFIG_TAIL NAME -> answered req/s
measure() {
    local name="$1" tail="$2" http controller
    http="127.0.0.1:$(free_port)"
    printf 'pipeline = "tiny"\npolicy = "%s"\nlisten = "%s"\ngrpc = false\nhttp3 = false\n%b' "$policy" "$http" "$tail" > "$out/$name.toml"
    "$bin" serve --config "$out/$name.toml" > /dev/null 2> "$out/$name.log" &
    controller=$!
    for _ in $(seq 1 300); do curl -sf "http://$http/v2/health/ready" > /dev/null && break; sleep 0.2; done
    curl -sf "http://$http/v2/health/ready" > /dev/null || { echo "$name: not ready; see $out/$name.log" >&2; exit 1; }
    "$bin" load --address "$http" --model tiny --transport h1 --connections 64 --max-outstanding 256 \
        --workload poisson --rate "$rate" --duration "$duration" --slo-ms 1000 > "$out/$name.txt" 2> /dev/null
    kill "$controller"; wait "$controller" 2> /dev/null || true
    python3 - "$out/$name.txt" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
sent, elapsed, on_time, late = re.search(r"sent (\d+) in ([0-9.]+) s: (\d+) on time, (\d+) late", text).groups()
print(f"{(int(on_time) + int(late)) / float(elapsed):.0f}")
EOF
}

"$bin" cluster certificates --out "$out/tls" --node-name nodes.throughput > /dev/null
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')
for i in 2 3 4; do
    "$bin" node --listen "127.0.0.$i:$port" --name "node-$i" --slots 1 \
        --cert "$out/tls/node.pem" --key "$out/tls/node-key.pem" > /dev/null 2> "$out/node-$i.log" &
    pids+=($!)
done

local_rate=$(measure local "")
cluster_rate=$(measure cluster "\n[cluster]\nnodes = \"static:127.0.0.2:$port,127.0.0.3:$port,127.0.0.4:$port\"\nca = \"$out/tls/ca.pem\"\nnode_name = \"nodes.throughput\"\nstartup_wait_secs = 30\n")
python3 -c "print(f'tiny, $policy, offered $rate req/s for $duration s over HTTP/1.1: one machine $local_rate req/s, three nodes through one controller $cluster_rate req/s ({$cluster_rate / $local_rate:.2f}x)')"
