#!/usr/bin/env bash
# gpuwarden's /metrics on an NVIDIA node, side by side with nvitop-exporter under the same scrape loop:
# scrape latency and exporter CPU per scrape (gpuwarden must be cheaper), and gpuwarden's VRAM series
# against nvidia-smi while a torch process holds 10 GiB on GPU 0. Run from the repo root; results in $OUT.
# Needs prometheus_client and nvitop_exporter (wheels in .device/wheels). Touches no GPU setting.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
STATE=$(mktemp -d)
export GPUWARDEN_STATE_DIR=$STATE
GW_PORT=${GW_PORT:-19835}
NV_PORT=${NV_PORT:-19836}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

for mod in prometheus_client nvitop_exporter; do
    python3 -c "import $mod" 2>/dev/null || { echo "missing $mod: carry its wheel in .device/wheels"; exit 1; }
done

echo "== a torch process holding 10 GiB on GPU 0"
READY=$OUT/holder.ready
python3 - "$READY" > "$OUT/holder.log" 2>&1 <<'PY' &
import os, sys, time, torch
block = torch.empty(10 << 30, dtype=torch.uint8, device="cuda:0")
block.fill_(1)
torch.cuda.synchronize()
open(sys.argv[1], "w").write(f"{os.getpid()}\n")
while True:
    time.sleep(1)
PY
HOLDER_PID=$!
PIDS+=("$HOLDER_PID")
for _ in $(seq 1 240); do [ -s "$READY" ] && break; kill -0 "$HOLDER_PID" 2>/dev/null || break; sleep 0.5; done
[ -s "$READY" ] || { echo "holder did not come up:"; tail -5 "$OUT/holder.log"; exit 1; }
echo "holder pid $HOLDER_PID"

wait_http() {  # $1 url, $2 pid, $3 log
    for _ in $(seq 1 120); do
        python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2).read()" "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || { echo "exited:"; tail -5 "$3"; return 1; }
        sleep 0.5
    done
    echo "no answer from $1"; return 1
}

echo "== gpuwarden agent (1 s sampling) and nvitop-exporter (1 s interval)"
gpuwarden --backend nvml agent --foreground --interval 1 --per-process \
    --metrics-listen "127.0.0.1:$GW_PORT" > "$OUT/agent.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
python3 -m nvitop_exporter --bind-address 127.0.0.1 --port "$NV_PORT" --interval 1 > "$OUT/nvitop_exporter.log" 2>&1 &
NV_PID=$!
PIDS+=("$NV_PID")
wait_http "http://127.0.0.1:$GW_PORT/metrics" "$GW_PID" "$OUT/agent.log" || exit 1
wait_http "http://127.0.0.1:$NV_PORT/metrics" "$NV_PID" "$OUT/nvitop_exporter.log" || exit 1
sleep 3  # both past their first samples
gpuwarden metrics --per-process > "$OUT/gpuwarden_metrics.prom" 2> "$OUT/gpuwarden_metrics.stderr"
echo "gpuwarden metrics (via the agent's socket) exit $?: $(grep -c '^gpuwarden_' "$OUT/gpuwarden_metrics.prom") series"
python3 -c "import urllib.request,sys; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())" \
    "http://127.0.0.1:$NV_PORT/metrics" > "$OUT/nvitop_metrics.prom"

echo "== same scrape loop against both (200 scrapes each, 20 s idle first)"
python3 tests/device/metrics_compare.py "http://127.0.0.1:$GW_PORT/metrics" "$GW_PID" \
    "http://127.0.0.1:$NV_PORT/metrics" "$NV_PID" "$HOLDER_PID" "$OUT/metrics_compare.json"
RC=$?
echo "== summary: metrics_compare exit $RC (0 = gpuwarden cheaper per scrape and VRAM matches nvidia-smi); files in $OUT"
exit $RC
