#!/usr/bin/env bash
# Incident bundle on a real NVIDIA node: a torch process holds 4 GiB on GPU 0 with secrets in its
# environment and command line; `gpuwarden bundle` must find it as a GPU holder (/dev/nvidia* fds),
# run nvidia-smi -q -x, take the NVML snapshot, redact the secrets, and checksum every file. Then a
# stand-in nvidia-smi that hangs must be killed at --timeout. Prints one line per check; results in $OUT.
# Touches no GPU setting: it only allocates memory in a process it kills at the end.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/bundles" "$OUT/hung"
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
SECRET_HF="hf_$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 30)"
SECRET_PW="Pw-$(head -c 12 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 12)"
HOLDER_PID=""
cleanup() { [ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

echo "== holder: torch, 4 GiB on GPU 0, secrets planted"
HF_TOKEN="$SECRET_HF" MY_DB_PASSWORD="$SECRET_PW" python3 - --password "$SECRET_PW" > "$OUT/holder.log" 2>&1 <<'PY' &
import time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:0")
print("holding", flush=True)
time.sleep(600)
PY
HOLDER_PID=$!
for _ in $(seq 1 120); do grep -q holding "$OUT/holder.log" && break; sleep 0.5; done
echo "holder pid $HOLDER_PID: $(cat "$OUT/holder.log" | tail -1)"

echo "== bundle"
start=$(date +%s.%N)
"${GW[@]}" bundle --output "$OUT/bundles" --timeout 20 --json > "$OUT/bundle.json" 2> "$OUT/bundle.err"
rc=$?
end=$(date +%s.%N)
echo "bundle exit $rc in $(python3 -c "print(round($end-$start,2))") s (CLI, interpreter start included)"
BUNDLE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$OUT/bundle.json")
"${GW[@]}" triage "$BUNDLE" > "$OUT/triage.md"; echo "triage exit $? (0 clean, 1 findings)"
"${GW[@]}" status --bundle "$BUNDLE" --json > "$OUT/replay.json"; echo "status --bundle exit $? (0/1 ok)"

python3 - "$BUNDLE" "$HOLDER_PID" "$SECRET_HF" "$SECRET_PW" "$OUT" <<'PY'
import gzip, hashlib, json, sys, tarfile
path, pid, secrets, out = sys.argv[1], sys.argv[2], sys.argv[3:5], sys.argv[5]
tf = tarfile.open(path)
top = tf.getnames()[0].split("/")[0]
def read(rel):
    return tf.extractfile(f"{top}/{rel}").read()
m = json.loads(read("manifest.json"))
ok = lambda c, what: print(("PASS " if c else "FAIL ") + what)
for c in m["collectors"]:
    print(f"  collector {c['name']:18s} {c['status']:18s} {c['duration_s']:6.2f}s {c.get('error') or ''}"[:160])
ok(next(c for c in m["collectors"] if c["name"] == "nvidia-smi")["status"] == "ok", "nvidia-smi -q -x collected")
snap = json.loads(read("gpuwarden/snapshot.json"))
ok(snap["backend"] == "nvml" and len(snap["gpus"]) > 0, f"snapshot via {snap['backend']}, {len(snap['gpus'])} GPUs")
ok(any(p["pid"] == int(pid) for p in snap["processes"]), "holder in the snapshot's processes")
pids = json.loads(read("gpuwarden/pids.json"))
ok(int(pid) in pids["gpu_holders"], "holder found by its /dev/nvidia* file descriptors")
env = read(f"tree/proc/{pid}/environ")
ok(b"HF_TOKEN=[REDACTED:" in env, "holder environ collected and redacted")
raw = gzip.decompress(open(path, "rb").read())
ok(all(s.encode() not in raw for s in secrets), "planted secrets appear nowhere in the archive")
bad = [i["path"] for i in m["items"] if i["kind"] not in ("dir", "link")
       and hashlib.sha256(read(i["path"])).hexdigest() != i["sha256"]]
ok(not bad, f"sha256 of {len(m['items'])} files match")
replay = json.load(open(f"{out}/replay.json"))
ok(replay["source"] == f"bundle:{path}", f"replay source {replay['source'][:60]}")
print("triage summary:", json.loads(read("triage.json"))["summary"][:5])
PY

echo "== hung nvidia-smi stand-in, --timeout 3"
mkdir -p "$OUT/stub"
printf '#!/bin/sh\nsleep 120 & wait\n' > "$OUT/stub/nvidia-smi"; chmod +x "$OUT/stub/nvidia-smi"
start=$(date +%s.%N)
PATH="$OUT/stub:$PATH" "${GW[@]}" bundle --output "$OUT/hung" --timeout 3 --json > "$OUT/hung.json" 2>&1
end=$(date +%s.%N)
python3 - "$OUT/hung.json" "$(python3 -c "print($end-$start)")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); took = float(sys.argv[2])
c = next(c for c in r["collectors"] if c["name"] == "nvidia-smi")
print(("PASS " if c["status"] == "timed-out" and r["duration_s"] < 4.0 else "FAIL ")
      + f"hung nvidia-smi: {c['status']}, bundle {r['duration_s']:.2f}s (CLI {took:.2f}s incl. start)")
PY
pgrep -f "sleep 120" >/dev/null && echo "FAIL stand-in's sleep survived" || echo "PASS stand-in's sleep was killed with its group"
