#!/usr/bin/env bash
# The TUI's CPU against nvitop's, side by side on the same NVIDIA node at 1 Hz (issue 24: gpuwarden <= 0.5x nvitop
# with the sensor fields on). Both run in their own tmux session at 160x48 for $SECONDS_EACH seconds (default 120),
# at the same time, each refreshing once a second; CPU = utime+stime of each process tree from /proc, read at the
# start and the end. Run from the repo root: bash tests/device/tui_vs_nvitop.sh   (results in $OUT/tui_vs_nvitop.txt)
# Touches no GPU setting. LOAD=1 runs a CUDA process busy ~50% (tests/device/gpu_busy.py) during the window, so
# both tools show per-process utilisation (nvmlDeviceGetProcessUtilization) as well; default: no GPU work.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECONDS_EACH=${SECONDS_EACH:-120}
STATE=$(mktemp -d /tmp/gw-tvn-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
SOCK=$STATE/tmux.sock
cleanup() { tmux -S "$SOCK" kill-server 2>/dev/null; }
trap cleanup EXIT
command -v tmux >/dev/null 2>&1 || { echo "tmux is missing: apt-get install tmux"; exit 2; }
python3 -c 'import nvitop' 2>/dev/null || { echo "nvitop is missing (setup.sh installs it from .device/wheels)"; exit 2; }

tree_ticks() {  # utime+stime (clock ticks) of a process and its descendants
    local root=$1 total=0 pid
    for pid in $root $(pgrep -P "$root" 2>/dev/null); do
        [ -r /proc/$pid/stat ] || continue
        set -- $(sed 's/^.*) //' /proc/$pid/stat)
        total=$((total + ${12} + ${13}))
    done
    echo $total
}

if [ "${LOAD:-0}" = 1 ]; then
    python3 tests/device/gpu_busy.py 0.5 > "$STATE/busy.out" 2>&1 &
    BUSY=$!
    trap 'kill $BUSY 2>/dev/null; cleanup' EXIT
    for _ in $(seq 120); do grep -q busy "$STATE/busy.out" && break; sleep 0.5; done
fi
tmux -S "$SOCK" new-session -d -s gw -x 160 -y 48 "gpuwarden --backend nvml tui --refresh 1"
tmux -S "$SOCK" new-session -d -s nv -x 160 -y 48 "python3 -m nvitop --interval 1"
sleep 5  # both past their start-up (imports, first NVML init) before counting
GW=$(tmux -S "$SOCK" list-panes -t gw: -F '#{pane_pid}')
NV=$(tmux -S "$SOCK" list-panes -t nv: -F '#{pane_pid}')
tmux -S "$SOCK" capture-pane -p -t gw: > "$OUT/tui_vs_nvitop_gw_start.txt"
thread_ticks() {  # "tid ticks" for each thread of the console's process (the main thread's tid is its pid)
    for t in /proc/$1/task/*; do set -- $(sed 's/^.*) //' "$t/stat"); echo "${t##*/} $((${12} + ${13}))"; done
}
g0=$(tree_ticks "$GW"); n0=$(tree_ticks "$NV"); t0=$(date +%s.%N)
thread_ticks "$GW" > "$OUT/threads_start.txt"
sleep "$SECONDS_EACH"
g1=$(tree_ticks "$GW"); n1=$(tree_ticks "$NV"); t1=$(date +%s.%N)
thread_ticks "$GW" > "$OUT/threads_end.txt"
# Where the console's CPU went: its main thread (Textual: drawing, events) against the others (the sampler, the
# read lanes, Textual's writer), in clock ticks over the window.
awk -v pid="$GW" 'NR==FNR {a[$1]=$2; next} {d=$2-a[$1]; if ($1==pid) m+=d; else o+=d}
    END {printf "console threads: main %d ticks, others %d ticks\n", m, o}' \
    "$OUT/threads_start.txt" "$OUT/threads_end.txt" | tee "$OUT/threads.txt"
tmux -S "$SOCK" send-keys -t gw: Down Enter  # GPU 0's detail view: the sensor lines
sleep 2
tmux -S "$SOCK" capture-pane -p -t gw: > "$OUT/tui_vs_nvitop_gw_detail.txt"
hz=$(getconf CLK_TCK)
python3 - "$g0" "$g1" "$n0" "$n1" "$t0" "$t1" "$hz" <<'PY' | tee "$OUT/tui_vs_nvitop.txt"
import sys
g0, g1, n0, n1 = map(int, sys.argv[1:5]); t0, t1, hz = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
wall = t1 - t0
gw, nv = (g1 - g0) / hz, (n1 - n0) / hz
print(f"window {wall:.0f} s, both at 1 Hz, 160x48")
print(f"gpuwarden tui (nvml): {gw:.2f} s CPU = {100 * gw / wall:.2f}% of a core")
print(f"nvitop:               {nv:.2f} s CPU = {100 * nv / wall:.2f}% of a core")
print(f"ratio gpuwarden/nvitop: {gw / nv:.2f}x (target <= 0.5x)" if nv else "nvitop used no CPU?")
PY
echo "== gpuwarden GPU 0 detail"; cat "$OUT/tui_vs_nvitop_gw_detail.txt"
if [ "${LOAD:-0}" = 1 ]; then echo "== gpuwarden at the start (GPU% of the busy process)"; cat "$OUT/tui_vs_nvitop_gw_start.txt"; fi
