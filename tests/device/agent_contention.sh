#!/usr/bin/env bash
# Does a peer polling NVML beside the agent make the agent dearer, or the agent the peer? Three windows of
# $WINDOW_S seconds (default 60) on an idle GPU, CPU from every thread's schedstat (ns, exact):
#   A. the agent alone;  B. the agent beside `nvidia-smi dmon -d 1`;  C. dmon alone.
# Each window prints each process's CPU in ms/s and the agent's per thread. Nobody reads the agent meanwhile.
# Run from the repo root on the GPU machine: bash tests/device/agent_contention.sh   (touches no GPU setting)

source tests/device/setup.sh
set -uo pipefail
WINDOW_S=${WINDOW_S:-60}
STATE=$(mktemp -d /tmp/gw-cont-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
AGENT=""; DMON=""
trap '[ -n "$AGENT" ] && kill $AGENT 2>/dev/null; [ -n "$DMON" ] && kill $DMON 2>/dev/null' EXIT
window() {  # $1 label, rest: name=pid ...
    local label=$1; shift
    python3 - "$label" "$WINDOW_S" "$@" <<'PY'
import sys
sys.path.insert(0, "tests/device")
from threadcpu import measure
label, window, named = sys.argv[1], float(sys.argv[2]), [(n, int(p)) for n, p in (a.split("=") for a in sys.argv[3:])]
spent, elapsed = measure(named, window)
for n, _ in named:
    print(f"{label}: {n:6s} {sum(spent[n].values()) / 1e6 / elapsed:6.3f} ms/s")
    if n == "agent":
        for k, d in sorted(spent[n].items(), key=lambda kv: -kv[1]):
            if d > 0:
                print(f"           {k:34s} {d / 1e6 / elapsed:6.3f} ms/s")
PY
}
gpuwarden --backend nvml agent --foreground --interval 1 > "$OUT/contention_agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 100); do [ -S "$STATE/agent.sock" ] && break; sleep 0.2; done
sleep 8
window "A agent alone" agent=$AGENT
nvidia-smi dmon -d 1 > /dev/null 2>&1 &
DMON=$!
sleep 3
window "B both" agent=$AGENT dmon=$DMON
kill $AGENT; wait $AGENT 2>/dev/null; AGENT=""
sleep 2
window "C dmon alone" dmon=$DMON
