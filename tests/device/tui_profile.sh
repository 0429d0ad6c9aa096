#!/usr/bin/env bash
# Where the TUI's CPU goes on a real NVIDIA node: py-spy (carried in .device/wheels) samples every thread of
# `gpuwarden --backend nvml tui --refresh 1` at 160x48 for $PROFILE_S seconds (default 90) at 500 Hz, idle
# samples left out; prints self and inclusive shares per function. Run from the repo root:
#   bash tests/device/tui_profile.sh     (folded stacks in $OUT/tui_profile.raw, summary in $OUT/tui_profile.txt)
# Touches no GPU setting; starts no GPU work.

source tests/device/setup.sh
set -uo pipefail
PROFILE_S=${PROFILE_S:-90}
command -v py-spy >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps .device/wheels/py_spy-*.whl 2>&1 | grep -v WARNING
STATE=$(mktemp -d /tmp/gw-prof-XXXX)
SOCK=$STATE/tmux.sock
trap 'tmux -S "$SOCK" kill-server 2>/dev/null' EXIT
tmux -S "$SOCK" new-session -d -s gw -x 160 -y 48 "GPUWARDEN_STATE_DIR=$STATE exec python3 -m gpuwarden --backend nvml tui --refresh 1"
sleep 5
PID=$(tmux -S "$SOCK" list-panes -t gw: -F '#{pane_pid}')
py-spy record --pid "$PID" --threads --nonblocking --format raw -r 500 -d "$PROFILE_S" -o "$OUT/tui_profile.raw" 2>&1 | tail -2
python3 tests/device/profile_summary.py "$OUT/tui_profile.raw" 500 | tee "$OUT/tui_profile.txt"
