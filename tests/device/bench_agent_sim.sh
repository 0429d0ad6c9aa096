#!/usr/bin/env bash
# bench_agent.py on a quiet many-core machine: status start-up against bare python, the agent's CPU and RSS
# on the simulated node of 8 GPUs, 32 engines and 2,000 processes, and /v1/snapshot latency with 10 clients.
# The 2-core development machine is shared and loaded; this gives the same bench an idle host for comparison.
# Run from the repo root; results land in $OUT. Touches no GPU: the sim node only.
source tests/device/setup.sh
set -uo pipefail
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 tests/bench/bench_agent.py --runs 20 --window 60 --json-out "$OUT/bench_agent.json" 2>&1 | tee "$OUT/bench_agent.txt"
