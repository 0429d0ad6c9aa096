#!/usr/bin/env bash
# `gpuwarden doctor` on a real NVIDIA node: --json validated against ops/schemas/doctor.v1.json, every verdict
# printed, the run time (whole CLI, 7 runs, median) against the 2 s budget and against `nvidia-smi -q` measured
# in the same run; then `doctor --bundle` on a bundle taken there must give the same NVIDIA verdicts from the
# bundle's nvidia-smi -q -x as NVML gave live. Run from the repo root; results land in $OUT.
# Touches no GPU setting: doctor and bundle only read.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/bundles"
STATE=$(mktemp -d)
export GPUWARDEN_STATE_DIR=$STATE
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
FAILED=0
check() { if [ "$1" = 0 ]; then echo "ok: $2"; else echo "FAILED: $2"; FAILED=1; fi; }

echo "== node"
nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,mig.mode.current,ecc.mode.current --format=csv,noheader \
  | tee "$OUT/nvidia_smi_gpus.csv"

echo "== doctor --json"
"${GW[@]}" doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.stderr"
echo "doctor exit code: $? (0 nothing to fix, 1 a warn or fail, 2 could not run)"
"${GW[@]}" doctor --verbose > "$OUT/doctor.txt" 2>&1
python3 - "$OUT/doctor.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
try:
    from gpuwarden.ops.foundation.jsondoc import validate
    validate(doc)
    print("schema: valid gpuwarden.doctor/1")
except ImportError as exc:
    print(f"schema: NOT validated ({exc}; carry jsonschema and its wheels in .device/wheels)")
    sys.exit(1)
except ValueError as exc:
    print(f"schema: INVALID: {exc}")
    sys.exit(1)
for c in doc["checks"]:
    print(f"{c['verdict']:<7} {c['id']:<20} {c['duration_s'] * 1000:7.1f} ms  {c['reason'][:150]}")
print(f"summary {doc['summary']}, run {doc['duration_s'] * 1000:.0f} ms inside the process")
nv = {c["id"]: c["verdict"] for c in doc["checks"] if c["group"] == "nvidia"}
bad = [k for k, v in nv.items() if v in ("skip", "unknown")]
if bad:
    print(f"NVIDIA checks that did not judge on an NVIDIA node: {bad}")
    sys.exit(1)
EOF
check $? "doctor --json validates and every NVIDIA check judged the real GPUs"

echo "== run time: whole CLI (interpreter start included), 7 runs, median; peer nvidia-smi -q"
python3 - "$OUT/timing.json" "${GW[@]}" <<'EOF'
import json, statistics, subprocess, sys, time
out, argv = sys.argv[1], sys.argv[2:]
def wall(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t
doctor = [wall(argv + ["doctor", "--json"]) for _ in range(7)]
smi = [wall(["nvidia-smi", "-q"]) for _ in range(7)]
d, s = statistics.median(doctor), statistics.median(smi)
print(f"doctor --json: median {d:.3f} s (min {min(doctor):.3f}, max {max(doctor):.3f}); "
      f"nvidia-smi -q: median {s:.3f} s; doctor / nvidia-smi -q = {d / s:.2f}")
json.dump({"doctor_s": doctor, "nvidia_smi_q_s": smi}, open(out, "w"))
sys.exit(0 if d <= 2.0 else 1)
EOF
check $? "doctor within 2 s on this node"

echo "== doctor --bundle on a bundle taken here"
"${GW[@]}" bundle --output "$OUT/bundles/" --json > "$OUT/bundle.json" 2> "$OUT/bundle.stderr"
BUNDLE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$OUT/bundle.json" 2>/dev/null)
"${GW[@]}" doctor --bundle "$BUNDLE" --json > "$OUT/doctor_bundle.json" 2> "$OUT/doctor_bundle.stderr"
python3 - "$OUT/doctor.json" "$OUT/doctor_bundle.json" <<'EOF'
import json, sys
live = {c["id"]: c for c in json.load(open(sys.argv[1]))["checks"]}
replay = {c["id"]: c for c in json.load(open(sys.argv[2]))["checks"]}
differ = 0
for cid, c in live.items():
    if c["group"] != "nvidia" or cid == "nvidia-persistenced":
        continue
    same = c["verdict"] == replay[cid]["verdict"]
    differ += not same
    print(f"{cid:<20} live {c['verdict']:<7} bundle {replay[cid]['verdict']:<7} {'same' if same else 'DIFFERENT: ' + replay[cid]['reason'][:120]}")
sys.exit(1 if differ else 0)
EOF
check $? "NVIDIA verdicts from the bundle's nvidia-smi -q -x equal NVML's"

head -60 "$OUT/doctor.txt"
echo "== summary: $([ $FAILED = 0 ] && echo all checks passed || echo SOME CHECKS FAILED); files in $OUT"
exit $FAILED
