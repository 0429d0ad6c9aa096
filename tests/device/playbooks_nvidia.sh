#!/usr/bin/env bash
# drain / purge / baseline / reset --dry-run on a real NVIDIA GPU (GPU 0) with a real CUDA tenant, and one
# fact for the purge design: does a SIGKILLed CUDA process that its parent never reaps (a zombie) keep VRAM?
# Never resets anything: reset runs only with --dry-run, and a guard on PATH refuses `nvidia-smi -r`.
# Run from the repo root; results land in $OUT; a compact summary is printed at the end.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export GPUWARDEN_STATE_DIR=$(mktemp -d)
GW=(gpuwarden --backend nvml)

# Guard: whatever happens, no GPU reset reaches the driver from this script.
REAL_SMI=$(command -v nvidia-smi)
mkdir -p "$OUT/guard"
cat > "$OUT/guard/nvidia-smi" <<EOF
#!/bin/sh
for a in "\$@"; do case "\$a" in -r|--gpu-reset) echo "guard: refused nvidia-smi \$*" >&2; echo "\$*" >> "$OUT/guard/refused.txt"; exit 97;; esac; done
exec "$REAL_SMI" "\$@"
EOF
chmod +x "$OUT/guard/nvidia-smi"
export PATH="$OUT/guard:$PATH"

PARENT_PID=""
cleanup() { [ -n "$PARENT_PID" ] && kill -9 "$PARENT_PID" 2>/dev/null; }
trap cleanup EXIT
summary=()
note() { summary+=("$1"); echo "$1"; }

# A careless parent: starts a CUDA tenant holding 4 GiB on GPU 0 and never waits for it.
python3 - > "$OUT/parent.txt" 2>&1 <<'EOF' &
import subprocess, sys, time
code = ("import torch, time, sys; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda:0'); "
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)")
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
child._child_created = False  # never reaped, not even at exit
time.sleep(900)
EOF
PARENT_PID=$!
for _ in $(seq 1 120); do [ -s "$OUT/parent.txt" ] && break; sleep 0.5; done
TENANT=$(head -1 "$OUT/parent.txt")
note "tenant pid $TENANT (parent $PARENT_PID) holds 4 GiB on GPU 0"

"${GW[@]}" status --json > "$OUT/1_status_tenant.json"
note "$(python3 - "$OUT/1_status_tenant.json" "$TENANT" <<'EOF'
import json, os, sys
snap = json.load(open(sys.argv[1])); t = int(sys.argv[2])
p = next((p for p in snap["processes"] if p["pid"] == t), None)
print(f"status sees tenant: {bool(p)} vram={p and p['vram']}")
EOF
)"

"${GW[@]}" drain 0 --yes --timeout 5 > "$OUT/2_drain_busy.txt" 2>&1
rc=$?
grep -q "pid $TENANT" "$OUT/2_drain_busy.txt" && named=yes || named=no
grep -qE "gpuwarden.playbooks.cli.root|gpuwarden.tui.main" "$OUT/2_drain_busy.txt" && self=yes || self=no
note "drain with a non-engine tenant: exit $rc (want 1), tenant named: $named, gpuwarden itself listed: $self"

kill -9 "$TENANT"
sleep 3
state=$(awk '{print $3}' /proc/$TENANT/stat 2>/dev/null)
"${GW[@]}" status --json > "$OUT/3_status_zombie.json"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$OUT/3_smi_apps_zombie.csv"
nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits > "$OUT/3_smi_used_zombie.txt"
note "$(python3 - "$OUT/3_status_zombie.json" "$TENANT" <<'EOF'
import json, sys
snap = json.load(open(sys.argv[1])); t = int(sys.argv[2])
r0 = next(r for r in snap["residual"] if r["gpu_index"] == 0)
p = next((p for p in snap["processes"] if p["pid"] == t), None)
print(f"after SIGKILL: tenant in snapshot={bool(p)} state={p and p['state']} vram={p and p['vram']}; "
      f"GPU0 used={snap['gpus'][0]['vram_used'] >> 20} MiB residual={(r0['residual'] or 0) >> 20} MiB "
      f"holders={[(h['pid'], h['reason']) for h in r0['holders']]}")
EOF
)"
note "tenant state after SIGKILL: ${state:-gone}; nvidia-smi apps: $(tr '\n' ';' < "$OUT/3_smi_apps_zombie.csv") GPU0 used MiB: $(cat "$OUT/3_smi_used_zombie.txt")"

"${GW[@]}" purge 0 --dry-run > "$OUT/4_purge_plan.txt" 2>&1
"${GW[@]}" purge 0 --yes --json --grace 3 > "$OUT/4_purge.jsonl" 2> "$OUT/4_purge.stderr"
rc=$?
state=$(awk '{print $3}' /proc/$TENANT/stat 2>/dev/null)
note "purge 0: exit $rc; tenant afterwards: ${state:-gone}; parent alive: $(kill -0 $PARENT_PID 2>/dev/null && echo yes || echo no)"

"${GW[@]}" drain 0 --yes --timeout 20 > "$OUT/5_drain_idle.txt" 2>&1
note "drain 0 once the tenant is gone: exit $? (want 0)"
"${GW[@]}" baseline record 0 --json > "$OUT/6_baseline.jsonl" 2>&1
note "baseline record 0: exit $?; $("${GW[@]}" baseline show | head -1)"
"${GW[@]}" reset 0 --dry-run > "$OUT/7_reset_plan.txt" 2>&1
note "reset 0 --dry-run: exit $?; plan: $(grep -o 'via .*\[' "$OUT/7_reset_plan.txt" | head -1)"
"${GW[@]}" undrain 0 > "$OUT/8_undrain.txt" 2>&1
note "undrain 0: exit $?"
cp "$GPUWARDEN_STATE_DIR/journal.log" "$OUT/journal.log" 2>/dev/null
note "reset attempts stopped by the guard: $(wc -l < "$OUT/guard/refused.txt" 2>/dev/null || echo 0) (want 0); gpu-reset journal lines: $(grep -c '"gpu-reset"' "$OUT/journal.log")"

echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
