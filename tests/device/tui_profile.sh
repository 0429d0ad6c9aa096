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
python3 - "$OUT/tui_profile.raw" <<'PY' | tee "$OUT/tui_profile.txt"
import collections, re, sys
IDLE = re.compile(r"\.(select|wait|poll|accept|recv|recv_into|read|sleep|acquire) \(|^time\.sleep|_wait_for_tstate_lock")
own, incl, threads, total = collections.Counter(), collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n)
    frames = stack.split(";")
    if IDLE.search(frames[-1]):
        continue  # --nonblocking cannot tell a thread parked in select/wait from one running: drop them here
    total += n
    threads[frames[0].split("):")[-1].strip()] += n
    own[frames[-1]] += n
    for f in set(frames[1:]):
        incl[f] += n
print(f"{total} active samples at 500 Hz = {total / 500:.2f} s of CPU")
for t, n in threads.most_common(10): print(f"thread {100 * n / total:5.1f}%  {t}")
print("--- self")
for f, n in own.most_common(40): print(f"{100 * n / total:5.1f}%  {f[:160]}")
print("--- inclusive")
for f, n in incl.most_common(90): print(f"{100 * n / total:5.1f}%  {f[:160]}")
PY
