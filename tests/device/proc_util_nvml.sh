#!/usr/bin/env bash
# Per-process GPU utilisation on NVIDIA (issue 24): a CUDA process busy ~50% (tests/device/gpu_busy.py), then
# gpuwarden's sampler (two refreshes 2 s apart: nvmlDeviceGetProcessUtilization since the last sample) against
# `nvidia-smi pmon -s u` for the same PID; also the TUI's Processes panel (GPU% column) and its process view.
# Run from the repo root: bash tests/device/proc_util_nvml.sh   (results in $OUT/proc_util_nvml.txt)

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
STATE=$(mktemp -d /tmp/gw-pu-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
SOCK=$STATE/tmux.sock
python3 tests/device/gpu_busy.py 0.5 > "$STATE/busy.out" 2>&1 &
BUSY=$!
cleanup() { kill "$BUSY" 2>/dev/null; tmux -S "$SOCK" kill-server 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 120); do grep -q busy "$STATE/busy.out" && break; sleep 0.5; done
grep -q busy "$STATE/busy.out" || { echo "the CUDA process did not start:"; cat "$STATE/busy.out"; exit 1; }
{
echo "== gpuwarden sampler, pid $BUSY"
python3 - "$BUSY" <<'PY'
import sys, time
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.sampling.sampler import Sampler
pid = int(sys.argv[1])
sampler = Sampler(Settings(backend="nvml"))
for i in range(4):
    t = time.perf_counter()
    snap = sampler.snapshot()
    took = (time.perf_counter() - t) * 1e3
    load = snap.process_load.get(pid)
    print(f"refresh {i}: {took:.1f} ms; pid {pid}: "
          + (f"GPU% {load.gpu_percent}, engines {[(g, l.engines) for g, l in load.gpus.items()]}, "
             f"CPU% {load.cpu_percent}, RSS {load.rss_bytes}" if load else "not in the snapshot"))
    time.sleep(2)
sampler.close()
PY
echo "== nvidia-smi pmon -s u -c 3 (sm% per process)"
nvidia-smi pmon -s u -c 3 2>&1 | grep -E "^#|$BUSY"
} | tee "$OUT/proc_util_nvml.txt"
tmux -S "$SOCK" new-session -d -s gw -x 160 -y 48 "gpuwarden --backend nvml tui --refresh 1"
sleep 6
tmux -S "$SOCK" send-keys -t gw: p  # the Processes panel
sleep 3
tmux -S "$SOCK" capture-pane -p -t gw: > "$OUT/proc_util_tui_processes.txt"
tmux -S "$SOCK" send-keys -t gw: i  # the selected process's view (the busy one: most VRAM)
sleep 3
tmux -S "$SOCK" capture-pane -p -t gw: > "$OUT/proc_util_tui_process_view.txt"
echo "== TUI Processes panel"; cat "$OUT/proc_util_tui_processes.txt"
echo "== TUI process view"; cat "$OUT/proc_util_tui_process_view.txt"
