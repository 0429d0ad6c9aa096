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
hz=$(getconf CLK_TCK)
t0=$(awk '{print $14 + $15}' "/proc/$AGENT/stat")
py-spy record --pid "$AGENT" --threads --nonblocking --format raw -r 500 -d "$PROFILE_S" -o "$OUT/agent_profile.raw" 2>&1 | tail -2
t1=$(awk '{print $14 + $15}' "/proc/$AGENT/stat")
echo "agent CPU while profiled (py-spy's reads included): $(( (t1 - t0) * 1000 / hz )) ms over ${PROFILE_S} s"
python3 tests/device/profile_summary.py "$OUT/agent_profile.raw" 500 | tee "$OUT/agent_profile.txt"
