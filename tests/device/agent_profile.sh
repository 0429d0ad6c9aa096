#!/usr/bin/env bash
# Where the agent's CPU goes on a real NVIDIA node: py-spy samples every thread of
# `gpuwarden --backend nvml agent --foreground --interval 1` for $PROFILE_S seconds (default 60) at 500 Hz after a
# 10 s warm-up, idle samples left out; prints self and inclusive shares per function (tests/device/profile_summary.py).
# Run from the repo root: bash tests/device/agent_profile.sh   (raw stacks and summary in $OUT). Touches no GPU setting.

source tests/device/setup.sh
set -uo pipefail
PROFILE_S=${PROFILE_S:-60}
command -v py-spy >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps .device/wheels/py_spy-*.whl 2>&1 | grep -v WARNING
STATE=$(mktemp -d /tmp/gw-aprof-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
python3 -m gpuwarden --backend nvml agent --foreground --interval 1 > "$OUT/agent.log" 2>&1 &
AGENT=$!
trap 'kill $AGENT 2>/dev/null' EXIT
for _ in $(seq 100); do
    curl -sf --unix-socket "$STATE/agent.sock" http://agent/healthz >/dev/null 2>&1 && break
    sleep 0.2
done
sleep 10
# Each thread's own CPU over the window from /proc/<pid>/task/<tid>/stat (exact, unlike sampling), named by py-spy dump.
thread_ticks() { for t in /proc/$AGENT/task/*; do echo "${t##*/} $(sed 's/^.*) //' "$t/stat" | awk '{print $12 + $13}')"; done; }
thread_ticks > "$OUT/threads0.txt"
py-spy record --pid "$AGENT" --threads --nonblocking --format raw -r 500 -d "$PROFILE_S" -o "$OUT/agent_profile.raw" 2>&1 | tail -2
thread_ticks > "$OUT/threads1.txt"
py-spy dump --pid "$AGENT" 2>/dev/null | grep '^Thread' > "$OUT/thread_names.txt"
python3 - "$OUT" "$PROFILE_S" "$(getconf CLK_TCK)" <<'PY' | tee "$OUT/agent_threads.txt"
import re, sys
out, window, hz = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
read = lambda name: dict(line.split() for line in open(f"{out}/{name}") if line.strip())
a, b = read("threads0.txt"), read("threads1.txt")
names = {m.group(1): (m.group(2) or "(unnamed)") for m in
         re.finditer(r'^Thread (\d+) \([^)]*\)(?::\s*"([^"]*)")?', open(f"{out}/thread_names.txt").read(), re.M)}
rows = sorted(((int(b[t]) - int(a.get(t, 0))) * 1000 / hz, t) for t in b)
total = sum(ms for ms, _ in rows)
print(f"agent CPU over {window:.0f} s while profiled: {total:.0f} ms = {100 * total / 1000 / window:.3f}% of a core")
for ms, t in reversed(rows):
    print(f"{ms:7.0f} ms  {ms / window:6.2f} ms/s  tid {t}  {names.get(t, '?')}")
PY
python3 tests/device/profile_summary.py "$OUT/agent_profile.raw" 500 | tee "$OUT/agent_profile.txt"
