#!/usr/bin/env bash
# The agent at 1 s against its peers and its floor, all in the same windows: this tree's agent, optionally peer
# trees' agents (PEER_TREES="dir ...", each an exported gpuwarden tree, e.g. `git archive REV`), `nvidia-smi dmon -d 1`,
# and tests/device/nvml_floor.py (one Python thread asking NVML what a refresh asks, once a second, nothing else;
# and again with the calls handed to a worker thread, as the agent's deadline lanes do).
# A reader asks each agent's /v1/snapshot every 20 s, so per-process GPU% has a reader throughout.
# Two windows of WINDOW_S seconds (default 90): one CUDA process ~50% busy on GPU 0 (tests/device/gpu_busy.py;
# sole_process_util.py first compares its GPU's figures), then the GPU idle. CPU of every thread from schedstat.
# Only reads the GPUs. Run from the repo root: [PEER_TREES=".device/a .device/b"] bash tests/device/agent_vs_peers.sh

source tests/device/setup.sh
set -uo pipefail
WINDOW_S=${WINDOW_S:-90}
RUN=$(mktemp -d /tmp/gw-peers-XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null' EXIT

start_agent() {  # $1 name, $2 PYTHONPATH root -> the agent's pid in $STARTED; its state dir is $RUN/$1
    mkdir -p "$RUN/$1"
    GPUWARDEN_STATE_DIR="$RUN/$1" PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}" python3 -m gpuwarden --backend nvml agent --foreground \
        --interval 1 > "$OUT/agent_$1.log" 2>&1 &
    STARTED=$!
    PIDS+=($STARTED)
    for _ in $(seq 150); do [ -S "$RUN/$1/agent.sock" ] && return 0; sleep 0.2; done
    echo "agent $1 did not come up:"; tail -5 "$OUT/agent_$1.log"; exit 1
}

window() {  # $1 label; rest: name=pid ... -> ms/s of CPU each, the agent's threads, ratios
    python3 - "$1" "$WINDOW_S" "${@:2}" <<'PY' | tee -a "$OUT/agent_vs_peers.txt"
import sys
sys.path.insert(0, "tests/device")
from threadcpu import last_cpu, measure
label, window, named = sys.argv[1], float(sys.argv[2]), [(n, int(p)) for n, p in (a.split("=") for a in sys.argv[3:])]
pid_of = dict(named)
spent, elapsed = measure(named, window)
ms = {}
for n, _ in named:
    ms[n] = sum(spent[n].values()) / 1e6 / elapsed
    print(f"{label}: {n:8s} {ms[n]:6.3f} ms/s ({ms[n] / 10:.3f}% of a core)")
    if n.startswith("agent"):
        top = sorted(((d, k) for k, d in spent[n].items()), reverse=True)[:3]
        print("          " + ", ".join(f"{k.split()[1]} {d / 1e6 / elapsed:.3f} (cpu {last_cpu(pid_of[n], k)})"
                                       for d, k in top if d > 0))
for n in ms:
    if n != "dmon" and ms.get("dmon"):
        print(f"{label}: {n} / dmon = {ms[n] / ms['dmon']:.2f}x" + (f"; {n} / floor = {ms[n] / ms['floor']:.2f}x"
                                                                   if n.startswith("agent") and "floor" in ms else ""))
PY
}

: > "$OUT/agent_vs_peers.txt"
echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nproc) cores, $(python3 --version)" \
    | tee -a "$OUT/agent_vs_peers.txt"
python3 tests/device/gpu_busy.py 0.5 > "$RUN/busy.out" 2>&1 &
BUSY=$!; PIDS+=($BUSY)
for _ in $(seq 240); do grep -q busy "$RUN/busy.out" && break; sleep 0.5; done
echo "== a GPU's sole process: its GPU's figures against NVML's per-process ones" | tee -a "$OUT/agent_vs_peers.txt"
python3 tests/device/sole_process_util.py 15 2>&1 | tee -a "$OUT/agent_vs_peers.txt"

named=()
start_agent this /tmp/gw-pkgroot; named+=("agent=$STARTED")
for tree in ${PEER_TREES:-}; do  # each peer tree as the package gpuwarden under its own root
    peer=$(basename "$tree")
    mkdir -p "/tmp/gw-peerroot-$peer" && ln -sfn "$(cd "$tree" && pwd)" "/tmp/gw-peerroot-$peer/gpuwarden"
    start_agent "$peer" "/tmp/gw-peerroot-$peer"; named+=("agent-$peer=$STARTED")
done
nvidia-smi dmon -d 1 > /dev/null 2>&1 &
PIDS+=($!); named+=("dmon=$!")
python3 tests/device/nvml_floor.py &
PIDS+=($!); named+=("floor=$!")
python3 tests/device/nvml_floor.py --lane &
PIDS+=($!); named+=("floorlane=$!")
python3 - "$RUN" <<'PY' &
import glob, sys, time
sys.path.insert(0, "/tmp/gw-pkgroot")
from gpuwarden.ops.agent.client import get
while True:
    for sock in glob.glob(f"{sys.argv[1]}/*/agent.sock"):
        get(sock, "/v1/snapshot")
    time.sleep(20)
PY
PIDS+=($!)
sleep 10  # warm-up: first deep scans, NVML handles
echo "== one busy process, a reader, ${WINDOW_S} s" | tee -a "$OUT/agent_vs_peers.txt"
window busy "${named[@]}"
kill $BUSY
sleep 8
echo "== idle GPU, a reader, ${WINDOW_S} s" | tee -a "$OUT/agent_vs_peers.txt"
window idle "${named[@]}"
