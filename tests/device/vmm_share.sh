#!/usr/bin/env bash
# Issue 26 item 8 on an NVIDIA node: the canary's two ways to give 2 engines one 4 GiB arena, side by side.
#  (a) registered: 2 canaries, each cudaHostRegister (cuMemHostRegister underneath) of the arena file's pages;
#  (b) shared by descriptor: 1 keeper (cuMemCreate HOST_NUMA + load the arena once) + 1 importer (fd over a
#      unix socket, cuMemImport + map + set access).
# Per process: registration (or create / import) seconds, copy GB/s; per mode: host memory pinned (sum of what
# the processes pinned) and MemFree's drop while both run. Ratios are against (a) from this same run.
# Run from the repo root (about 1-2 minutes): bash tests/device/vmm_share.sh. Touches no GPU setting.
# Dry run of the plumbing without a GPU: VMM_SHARE_DRY=1 RUNTIME=sim SIZE=64MiB bash tests/device/vmm_share.sh

[ "${VMM_SHARE_DRY:-}" = 1 ] || source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ARENA=/dev/shm/gpuwarden-vmm.arena
SOCK=/dev/shm/gpuwarden-vmm.keeper.sock
SIZE=${SIZE:-4GiB}
RUNTIME=${RUNTIME:-cuda}
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait; rm -f "$ARENA" "$SOCK"; }
trap cleanup EXIT

echo "== node"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/gpus.csv"
    NG=$(nvidia-smi -L | wc -l)
else
    NG=1
fi
G1=$(( NG > 1 ? 1 : 0 ))
echo "nproc $(nproc); GPUs $NG (second engine on GPU $G1); RLIMIT_MEMLOCK $(ulimit -l)"
python3 -c 'import cuda.bindings as c; print("cuda-bindings", getattr(c, "__version__", "?"))' 2>&1 | tail -1
timeout 240 "${GW[@]}" arena create "$ARENA" --size "$SIZE" --force -q --json > "$OUT/arena_create.json" || exit 1

memfree() { echo $(( $(awk '/^MemFree:/ {print $2}' /proc/meminfo) * 1024 )); }
# Wait (bounded) until every status file shows serving, or one shows exited.
wait_serving() {
    python3 - "$@" <<'PY'
import sys, time
from gpuwarden.ops.foundation.status_protocol import read_events
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    phases = [[e.phase for e in read_events(p)] for p in sys.argv[1:]]
    if any("exited" in ph for ph in phases):
        sys.exit(f"a canary exited early: {phases}")
    if all("serving" in ph for ph in phases):
        sys.exit(0)
    time.sleep(0.1)
sys.exit("timed out waiting for serving")
PY
}
canary() {  # canary STATUS LOG ARGS...: start one in the background, remember its pid
    local status=$1 log=$2; shift 2
    GPUWARDEN_STATUS_FILE="$status" python3 -m gpuwarden.ops.canary --arena "$ARENA" --runtime "$RUNTIME" --verify header \
        "$@" > "$log" 2>&1 &
    PIDS+=($!)
}
stop_all() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; for p in "${PIDS[@]}"; do wait "$p"; echo "exit $?"; done; PIDS=(); }

echo "== (a) cuMemHostRegister in each of 2 processes"
rm -f "$OUT"/a*.jsonl
M0=$(memfree)
canary "$OUT/a0.jsonl" "$OUT/a0.log" --gpu 0
canary "$OUT/a1.jsonl" "$OUT/a1.log" --gpu "$G1"
wait_serving "$OUT/a0.jsonl" "$OUT/a1.jsonl"; echo "serving: $?"
echo $(( M0 - $(memfree) )) > "$OUT/a_memdrop"
stop_all; cat "$OUT"/a0.log "$OUT"/a1.log

echo "== (b) keeper + 1 importer via the descriptor"
rm -f "$OUT"/b*.jsonl
M0=$(memfree)
canary "$OUT/b_keeper.jsonl" "$OUT/b_keeper.log" --gpu 0 --share keeper --share-socket "$SOCK"
wait_serving "$OUT/b_keeper.jsonl"; echo "keeper serving: $?"
canary "$OUT/b_import.jsonl" "$OUT/b_import.log" --gpu "$G1" --share import --share-socket "$SOCK"
wait_serving "$OUT/b_import.jsonl"; echo "importer serving: $?"
echo $(( M0 - $(memfree) )) > "$OUT/b_memdrop"
stop_all; cat "$OUT"/b_keeper.log "$OUT"/b_import.log

echo "== table"
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path
from gpuwarden.ops.foundation.status_protocol import read_events
out = Path(sys.argv[1])
def ev(name, phase):
    return next((e.data for e in read_events(out / name) if e.phase == phase), {})
rows = []
for label, name in (("(a) register, proc 1", "a0.jsonl"), ("(a) register, proc 2", "a1.jsonl"),
                    ("(b) keeper", "b_keeper.jsonl"), ("(b) importer", "b_import.jsonl")):
    reg, srv = ev(name, "registered"), ev(name, "serving")
    rows.append((label, reg.get("seconds"), reg.get("load_seconds"), srv.get("gbps"), reg.get("bytes", 0) if name != "b_import.jsonl" else 0))
a_reg = [r[1] for r in rows[:2] if r[1]]
a_gbps = [r[3] for r in rows[:2] if r[3]]
ref_reg = sum(a_reg) / len(a_reg) if a_reg else None
ref_gbps = sum(a_gbps) / len(a_gbps) if a_gbps else None
ratio = lambda v, ref: f"{v / ref:.2f}x" if v and ref else "-"
fmt = lambda v, f: (f % v) if isinstance(v, (int, float)) else "-"
print(f"{'process':22} {'register s':>10} {'vs (a)':>7} {'load s':>7} {'copy GB/s':>9} {'vs (a)':>7}")
for label, reg_s, load_s, gbps, _ in rows:
    print(f"{label:22} {fmt(reg_s, '%.3f'):>10} {ratio(reg_s, ref_reg):>7} {fmt(load_s, '%.3f'):>7} "
          f"{fmt(gbps, '%.1f'):>9} {ratio(gbps, ref_gbps):>7}")
pinned_a = sum(r[4] for r in rows[:2]); pinned_b = sum(r[4] for r in rows[2:])
drop = {m: int((out / f"{m}_memdrop").read_text()) for m in "ab"}
gib = lambda n: f"{n / (1 << 30):.2f} GiB"
print(f"pinned (sum of registrations): (a) {gib(pinned_a)}  (b) {gib(pinned_b)}  ratio {ratio(pinned_b, pinned_a)}")
print(f"MemFree drop while both ran:   (a) {gib(drop['a'])}  (b) {gib(drop['b'])}  "
      "((a) pins the arena file's existing /dev/shm pages; (b) allocates the keeper's copy)")
json.dump({"rows": rows, "pinned": {"a": pinned_a, "b": pinned_b}, "memfree_drop": drop},
          open(out / "vmm_share.json", "w"), indent=2)
PY
