#!/usr/bin/env bash
# The registration interposer with unmodified PyTorch engines on an NVIDIA node. Each engine
# (tests/device/torch_engine.py, no gpuwarden code in it) maps one shared arena file and calls
# torch.cuda.cudart().cudaHostRegister on it; the engines run under progress = "preload", so only the
# interposer (LD_PRELOAD) gates and reports their registrations. Same run: --stagger N (burst),
# --stagger 1 (gated), --sequential; prints each mode's registration timeline from the status events and
# the target check: gated <= (burst + (N-1) x one registration alone) + 10%.
#   ENGINES=4 (default) all on GPU 0; PER_GPU=1 puts engine i on GPU i (a 4-GPU machine, issue 17).
#   SIZE=32GiB arena in /dev/shm. Exit 0: target met and the interposer caught every engine's call.
# Run from the repo root; results land in $OUT. Stops every engine and removes the arena at the end.
# Touches no GPU setting: it only pins host memory in processes it stops.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ARENA=/dev/shm/gpuwarden-preload-torch.arena
SIZE=${SIZE:-32GiB}
ENGINES=${ENGINES:-4}
PER_GPU=${PER_GPU:-0}
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
cleanup() {
    stop_bench_launches
    rm -f "$ARENA"
}
trap cleanup EXIT

echo "== node"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.csv"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(uname -r)" | tee "$OUT/machine.txt"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$PER_GPU" = 1 ] && [ "$gpus" -lt "$ENGINES" ]; then
    echo "PER_GPU=1 needs $ENGINES GPUs, this node has $gpus: run with PER_GPU=0 (all on GPU 0) or fewer ENGINES"
    exit 2
fi
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' \
    | tee "$OUT/torch.txt" || { echo "no PyTorch with CUDA here: this script needs it"; exit 2; }

echo "== the interposer: build it here from native/ (a C compiler is needed), or use a carried build"
LIB=ops/engines/libgwpreload.so
if python3 setup.py -q build_ext --inplace > "$OUT/build.txt" 2>&1; then
    echo "built $LIB"
elif [ -f "$LIB" ]; then
    echo "build failed ($(grep -m1 '^error' "$OUT/build.txt")); using the carried $LIB"
else
    echo "cannot build the interposer and none was carried: $(grep -m1 '^error' "$OUT/build.txt")"
    echo "build it on the lead's machine (pip install -e .) and carry ops/engines/libgwpreload.so"
    exit 2
fi

echo "== how torch.cuda.cudart().cudaHostRegister resolves"
TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
for so in libtorch_python.so libtorch_cuda.so; do
    [ -f "$TORCH_LIB/$so" ] || continue
    echo "$so: NEEDED $(readelf -d "$TORCH_LIB/$so" 2>/dev/null | grep -o 'libcudart[^]]*' | tr '\n' ' ')"
    echo "$so: cudaHostRegister $(nm -D "$TORCH_LIB/$so" 2>/dev/null | grep -w cudaHostRegister | tr -s ' ' | tr '\n' ' ')"
done | tee "$OUT/torch_linkage.txt"

echo "== one engine alone under the interposer (1 GiB arena): is its call seen?"
SMALL=/dev/shm/gpuwarden-preload-small.arena
"${GW[@]}" arena create "$SMALL" --size 1GiB --force -q >/dev/null
rm -f "$OUT/alone_status.jsonl"
CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$PWD/$LIB" GPUWARDEN_STATUS_FILE="$OUT/alone_status.jsonl" \
    GPUWARDEN_PRELOAD_THRESHOLD=$((256 << 20)) timeout 180 python3 tests/device/torch_engine.py "$SMALL" \
    > "$OUT/alone.log" 2>&1 &
alone=$!
for _ in $(seq 1 900); do grep -q '^serving' "$OUT/alone.log" && break; kill -0 $alone 2>/dev/null || break; sleep 0.2; done
kill -TERM $alone 2>/dev/null; wait $alone; echo "engine exit $?"
rm -f "$SMALL"
cat "$OUT/alone.log"
grep -v '"preloaded"' "$OUT/alone_status.jsonl"
if ! grep -q '"phase":"registered"' "$OUT/alone_status.jsonl"; then
    echo "FAIL: the interposer saw no registration in a torch engine (see above); the gate cannot work for torch here"
    exit 1
fi
echo "caught: $(grep -m1 '"phase":"registered"' "$OUT/alone_status.jsonl" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["call"], "via", d["via"], "in", round(d["seconds"], 3), "s")')"

echo "== arena $SIZE in /dev/shm"
"${GW[@]}" arena create "$ARENA" --size "$SIZE" --force -q --json | tee "$OUT/arena_create.json"

echo "== launch $ENGINES torch engines ($([ "$PER_GPU" = 1 ] && echo "one GPU each" || echo "all on GPU 0")): burst, gated, sequential"
flags=(--torch --engines "$ENGINES" --arena "$ARENA")
[ "$PER_GPU" = 1 ] || flags+=(--same-gpu)
timeout 540 python3 tests/bench/bench_launch.py "${flags[@]}" --json-out "$OUT/bench_preload_torch.json" 2>&1 \
    | tee "$OUT/bench_preload_torch.txt"
rc=${PIPESTATUS[0]}
caught=$(grep -c 'cudaHostRegister via\|cuMemHostRegister via' "$OUT/bench_preload_torch.txt")
echo "registrations the interposer reported in the three launches: $caught (expected $((3 * ENGINES)))"
[ "$caught" -ge $((3 * ENGINES)) ] || { echo "FAIL: some engines' registrations were not seen"; [ $rc = 0 ] && rc=1; }
echo "bench exit $rc (0: target met, 1: missed, other: error)"
exit $rc
