#!/usr/bin/env bash
# Where the console's CPU goes on this node, step by step (tests/device/tui_cpu_split.py times each step in its
# thread's CPU): the console at 1 Hz, 160x48, for $SECONDS_EACH seconds (default 90), then quit with q.
# LOAD=1 runs tests/device/gpu_busy.py meanwhile. Results in $OUT/tui_cpu_split.txt. Touches no GPU setting.
source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECONDS_EACH=${SECONDS_EACH:-90}
STATE=$(mktemp -d /tmp/gw-split-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
SOCK=$STATE/tmux.sock
rm -f "$OUT/tui_cpu_split.txt"  # a table left by an earlier run must not pass for this one
BUSY=""
cleanup() { tmux -S "$SOCK" kill-server 2>/dev/null; [ -n "$BUSY" ] && kill "$BUSY" 2>/dev/null; }
trap cleanup EXIT
if [ "${LOAD:-0}" = 1 ]; then
    python3 tests/device/gpu_busy.py 0.5 > "$STATE/busy.out" 2>&1 &
    BUSY=$!
    for _ in $(seq 120); do grep -q busy "$STATE/busy.out" && break; sleep 0.5; done
fi
tmux -S "$SOCK" new-session -d -s gw -x 160 -y 48 \
    "CPU_SPLIT_OUT=$OUT/tui_cpu_split.txt PYTHONPATH=$PYTHONPATH python3 tests/device/tui_cpu_split.py --backend nvml tui --refresh 1"
sleep "$SECONDS_EACH"
tmux -S "$SOCK" send-keys -t gw: q
for _ in $(seq 50); do [ -s "$OUT/tui_cpu_split.txt" ] && break; sleep 0.2; done
cat "$OUT/tui_cpu_split.txt"
