#!/usr/bin/env bash
# Staggered launch on a 4-GPU NVIDIA node: four canaries (runtime cuda) over one 32 GiB arena in /dev/shm,
# launched with --stagger 4 (burst), --stagger 1 (gated) and --sequential. Prints the three launch-to-
# all-serving times and the target check: gated <= (burst + 3 x one registration alone) + 10%.
# Run from the repo root; results land in $OUT. Stops every engine and removes the arena at the end.
# Touches no GPU setting: it only pins host memory and copies it to the GPUs in processes it stops.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ARENA=/dev/shm/gpuwarden-launch-bench.arena
SIZE=${SIZE:-32GiB}
ENGINES=${ENGINES:-4}
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
cleanup() {
    stop_bench_launches
    rm -f "$ARENA"
}
trap cleanup EXIT

echo "== node"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.csv"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" | tee "$OUT/machine.txt"
free -g | head -2

echo "== arena $SIZE in /dev/shm"
"${GW[@]}" arena create "$ARENA" --size "$SIZE" --force -q --json | tee "$OUT/arena_create.json"

echo "== one canary alone (sanity)"
GPUWARDEN_STATUS_FILE="$OUT/sanity_status.jsonl" CUDA_VISIBLE_DEVICES=0 timeout 120 \
    python3 -m gpuwarden.ops.canary --arena "$ARENA" --gpu 0 --runtime cuda --verify header --serve-seconds 0.5 \
    > "$OUT/sanity.log" 2>&1
echo "exit $?; $(tail -3 "$OUT/sanity.log" | tr '\n' ' ')"

echo "== launch: burst, gated, sequential"
timeout 420 python3 tests/bench/bench_launch.py --engines "$ENGINES" --runtime cuda --arena "$ARENA" \
    --json-out "$OUT/bench_launch.json" 2>&1 | tee "$OUT/bench_launch.txt"
rc=${PIPESTATUS[0]}
echo "bench exit $rc (0: target met, 1: missed, other: error)"
exit $rc
