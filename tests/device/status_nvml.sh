#!/usr/bin/env bash
# Proof of the NVML backend on an NVIDIA node: `gpuwarden --backend nvml status --json` against
# nvidia-smi for every GPU, a torch process holding 10 GiB on GPU 0 seen with its VRAM, and the
# snapshot benchmark against nvidia-smi and nvitop. Run from the repo root; results land in $OUT.
# Touches no GPU setting: it only reads, and allocates memory in a process it starts and stops.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
STATE=$(mktemp -d)
export GPUWARDEN_STATE_DIR=$STATE
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
HOLDER_PID=""
cleanup() { [ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null && wait "$HOLDER_PID" 2>/dev/null; }
trap cleanup EXIT

echo "== node"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi_gpus.csv"

compare() {  # $1: status json, $2: nvidia-smi csv -> per-GPU match/mismatch lines, exit 1 on a mismatch
  python3 - "$1" "$2" <<'EOF'
import json, sys
snap = json.load(open(sys.argv[1]))
smi = {}
for line in open(sys.argv[2]):
    index, used, total = (int(x) for x in line.split(","))
    smi[index] = (used, total)
bad = 0
for g in snap["gpus"]:
    used, total = g["vram_used"] >> 20, g["vram_total"] >> 20
    s_used, s_total = smi.get(g["index"], (None, None))
    # The two reads are a few ms apart; a busy GPU may move by a MiB or two in between.
    ok = s_total == total and s_used is not None and abs(s_used - used) <= 2
    bad += not ok
    print(f"GPU {g['index']}: gpuwarden {used}/{total} MiB  nvidia-smi {s_used}/{s_total} MiB  "
          f"{'match' if ok else 'MISMATCH'}")
missing = set(smi) - {g["index"] for g in snap["gpus"]}
if missing:
    print(f"GPUs nvidia-smi lists but gpuwarden does not: {sorted(missing)}")
    bad += 1
sys.exit(1 if bad else 0)
EOF
}

echo "== idle: status --json vs nvidia-smi (memory.used, memory.total in MiB)"
"${GW[@]}" --backend nvml status --json > "$OUT/status_idle.json" 2> "$OUT/status_idle.stderr"
echo "status exit code: $? (0 healthy, 1 needs attention, 2 error)"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits > "$OUT/smi_idle.csv"
compare "$OUT/status_idle.json" "$OUT/smi_idle.csv"; IDLE_MATCH=$?

echo "== which NVML memory struct nvidia-smi's Used follows (GPU 0)"
python3 - <<'EOF' | tee "$OUT/nvml_memory_versions.txt"
import subprocess, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
smi = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used,memory.reserved", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.strip()
print(f"v1 used {v1.used >> 20} MiB; v2 used {v2.used >> 20} MiB, reserved {v2.reserved >> 20} MiB; "
      f"nvidia-smi used,reserved: {smi}")
pynvml.nvmlShutdown()
EOF

echo "== a torch process holding 10 GiB on GPU 0"
READY=$OUT/holder.ready
python3 - "$READY" > "$OUT/holder.log" 2>&1 <<'EOF' &
import os, sys, time, torch
block = torch.empty(10 << 30, dtype=torch.uint8, device="cuda:0")
block.fill_(1)  # touch every page so the driver really backs it
torch.cuda.synchronize()
open(sys.argv[1], "w").write(f"{os.getpid()}\n")
while True:
    time.sleep(1)
EOF
HOLDER_PID=$!
for _ in $(seq 1 240); do [ -s "$READY" ] && break; kill -0 "$HOLDER_PID" 2>/dev/null || break; sleep 0.5; done
if [ ! -s "$READY" ]; then echo "holder did not come up:"; tail -5 "$OUT/holder.log"; exit 1; fi
echo "holder pid $HOLDER_PID"
"${GW[@]}" --backend nvml status --json > "$OUT/status_holder.json" 2> "$OUT/status_holder.stderr"
echo "status exit code: $?"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits > "$OUT/smi_holder.csv"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/smi_apps_holder.csv"
"${GW[@]}" --backend nvml status > "$OUT/status_holder.txt" 2>&1
compare "$OUT/status_holder.json" "$OUT/smi_holder.csv"; HOLDER_MATCH=$?
python3 - "$OUT/status_holder.json" "$OUT/smi_apps_holder.csv" "$HOLDER_PID" <<'EOF'
import json, sys
snap = json.load(open(sys.argv[1]))
pid = int(sys.argv[3])
smi = {int(p): int(m) for p, m in (l.split(",") for l in open(sys.argv[2]) if l.strip())}
proc = next((p for p in snap["processes"] if p["pid"] == pid), None)
if proc is None:
    print(f"holder pid {pid} NOT in status --json; processes there: "
          f"{[(p['pid'], p['vram']) for p in snap['processes']]}; warnings: {snap['warnings']}")
    sys.exit(1)
gib = proc["vram"].get("0", 0) / (1 << 30)
ok = 10.0 <= gib <= 11.5  # 10 GiB asked plus the CUDA context
print(f"holder pid {pid}: {gib:.2f} GiB on GPU 0 (source {proc['sources'].get('0')}, state {proc['state']}, "
      f"command {proc['command'][:60]!r}); nvidia-smi compute-apps: {smi.get(pid)} MiB -> "
      f"{'ok' if ok else 'UNEXPECTED'}")
sys.exit(0 if ok else 1)
EOF
SEEN=$?
head -25 "$OUT/status_holder.txt"

echo "== benchmark (holder still running)"
python3 tests/bench/bench_snapshot_nvml.py --runs 30 --out "$OUT/bench_snapshot_nvml.json"

kill "$HOLDER_PID" 2>/dev/null; wait "$HOLDER_PID" 2>/dev/null; HOLDER_PID=""
echo "== summary: idle match=$([ $IDLE_MATCH = 0 ] && echo yes || echo NO)," \
     "with holder match=$([ $HOLDER_MATCH = 0 ] && echo yes || echo NO)," \
     "10 GiB holder seen=$([ $SEEN = 0 ] && echo yes || echo NO); files in $OUT"
