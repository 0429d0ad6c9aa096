#!/usr/bin/env bash
# Arena reproduction on a 4-GPU NVIDIA node: a 32 GiB arena in /dev/shm, `arena probe --engines 4 --runtime cuda`
# with K=1 (one registering at a time) and K=4 (all at once); per canary: register seconds, copy GB/s, how it
# ended. Also verify throughput on every core vs one thread (bench_verify). Writes JSON and logs to $OUT.
# Run from the repo root (about 3-5 minutes). Touches no GPU setting: it pins host memory, copies it to the GPUs
# from processes it stops, and removes the arena at the end.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ARENA=/dev/shm/gpuwarden-probe.arena
SIZE=${SIZE:-32GiB}
ENGINES=${ENGINES:-4}
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
trap 'rm -f "$ARENA"' EXIT

echo "== node"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.csv"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" | tee "$OUT/machine.txt"
echo "RLIMIT_MEMLOCK $(ulimit -l); /dev/shm free $(df -h --output=avail /dev/shm | tail -1 | xargs)"
python3 -c 'import cuda.bindings, sys; print("cuda-bindings", getattr(cuda.bindings, "__version__", "?"))' 2>&1 | tail -1

echo "== create $SIZE arena, then verify it on every core"
timeout 240 "${GW[@]}" arena create "$ARENA" --size "$SIZE" --force -q --json | tee "$OUT/arena_create.json"
timeout 120 "${GW[@]}" arena verify "$ARENA" -q --json | tee "$OUT/arena_verify.json"
timeout 120 "${GW[@]}" arena verify "$ARENA" -q --json --workers 1 | tee "$OUT/arena_verify_1thread.json"

echo "== one canary alone (runtime cuda, GPU 0)"
GPUWARDEN_STATUS_FILE="$OUT/sanity_status.jsonl" CUDA_VISIBLE_DEVICES=0 timeout 180 \
    python3 -m gpuwarden.ops.canary --arena "$ARENA" --gpu 0 --runtime cuda --verify header --serve-seconds 0.5 \
    > "$OUT/sanity.log" 2>&1
echo "exit $?"; cat "$OUT/sanity.log"

for K in 1 4; do
    echo "== probe: $ENGINES canaries, concurrency $K"
    timeout 300 "${GW[@]}" arena probe --engines "$ENGINES" --concurrency "$K" --runtime cuda --arena "$ARENA" \
        --json > "$OUT/probe_k$K.json" 2> "$OUT/probe_k$K.stderr"
    echo "exit $?"
    python3 - "$OUT/probe_k$K.json" <<'PY'
import json, sys
from gpuwarden.playbooks.probe import table
try:
    report = json.load(open(sys.argv[1]))
except Exception as exc:  # the probe died before printing: show why
    print(f"no report ({exc})")
    sys.exit(0)
print("\n".join(table(report)))
PY
    # Keep each canary's log for the record.
    wd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("workdir",""))' "$OUT/probe_k$K.json" 2>/dev/null)
    [ -n "$wd" ] && [ -d "$wd" ] && mkdir -p "$OUT/probe_k$K" && cp "$wd"/canary-* "$OUT/probe_k$K/" 2>/dev/null
done

echo "== registering in 4 GiB pieces, K=4"
timeout 300 "${GW[@]}" arena probe --engines "$ENGINES" --concurrency 4 --runtime cuda --arena "$ARENA" \
    --register-chunk 4GiB --json > "$OUT/probe_k4_chunk4g.json" 2> "$OUT/probe_k4_chunk4g.stderr"
python3 -c 'import json,sys; from gpuwarden.playbooks.probe import table; print("\n".join(table(json.load(open(sys.argv[1])))))' \
    "$OUT/probe_k4_chunk4g.json" 2>&1 | tail -6

rm -f "$ARENA"
echo "== verify throughput: every core vs one thread vs the single-thread peer (8 GiB in /dev/shm)"
timeout 200 python3 tests/bench/bench_verify.py --size 8GiB --runs 2 | tee "$OUT/bench_verify.txt"
