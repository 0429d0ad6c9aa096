#!/usr/bin/env bash
# The whole suite N times in a row (default 3) while a CPU hog keeps both cores busy (issue 16's stability
# check), each run's outcome line and wall time printed at the end. Pytest arguments pass through.
# Usage: bash tests/bench/suite_under_load.sh [RUNS] [pytest args...]   (logs under ${LOGDIR:-/tmp/suite-load})
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
shift || true
logdir=${LOGDIR:-/tmp/suite-load}
mkdir -p "$logdir"
command -v stress-ng >/dev/null || { echo "stress-ng missing: apt-get install stress-ng" >&2; exit 2; }

# The hog runs at the suite's niceness, so the two share the cores evenly (a hog at nice 19 would barely load).
nice -n 10 stress-ng --cpu "$(nproc)" --timeout 0 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT

summary=()
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f "%U %S" -o "$logdir/run$i.cpu" \
        nice -n 10 bash tests/run-all.sh -q -p no:cacheprovider "$@" >"$logdir/run$i.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    cpu=$(awk '{printf "%.0f", $1 + $2}' "$logdir/run$i.cpu")
    outcome=$(grep -E '^[=]* ?[0-9]+ (passed|failed)' "$logdir/run$i.log" | tail -1 | tr -d '=')
    summary+=("run $i: exit $rc, ${took}s wall, ${cpu}s CPU (suite and children), load at start $load:${outcome}")
    echo "${summary[-1]}"
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), hog: stress-ng --cpu $(nproc) at nice 10"
printf '%s\n' "${summary[@]}"
