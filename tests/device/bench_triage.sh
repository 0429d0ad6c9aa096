#!/usr/bin/env bash
# bench_triage.py on a quiet many-core host (one core per triage child): 200 MiB node and storm logs, and
# `gpuwarden triage BUNDLE` end to end. The 2-core development machine is shared; this is the idle figure.
# Run from the repo root; results land in $OUT. Touches no GPU.
source tests/device/setup.sh
set -uo pipefail
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 tests/bench/bench_triage.py --mb 200 --kinds node,storm,storm-fresh 2>&1 | tee "$OUT/bench_triage.txt"
