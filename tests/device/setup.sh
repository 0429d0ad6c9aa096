#!/usr/bin/env bash
# Source me on a lent GPU machine (repo root as cwd): makes `gpuwarden` runnable there.
# The machine has no network: missing pure-Python wheels come carried in .device/wheels.
set -u
export GPUWARDEN_REPO="$PWD"
# The checkout is the gpuwarden package (pyproject maps it): a link named gpuwarden makes it importable as such.
GW_ROOT=/tmp/gw-pkgroot
mkdir -p "$GW_ROOT" && ln -sfn "$PWD" "$GW_ROOT/gpuwarden"
export PYTHONPATH="$GW_ROOT${PYTHONPATH:+:$PYTHONPATH}"
# The interposer is prebuilt in wheels; from a checkout, build it here (the image has a C compiler).
[ -f ops/engines/libgwpreload.so ] || cc -std=gnu11 -O2 -fPIC -fvisibility=hidden -shared -Wl,-z,now -Inative \
    -o ops/engines/libgwpreload.so native/*.c -ldl -lpthread 2>/dev/null || echo "setup: could not build native/"
export OUT="${OUT:-/tmp/gw-out}"
mkdir -p "$OUT"
need=()
python3 -c 'import textual' 2>/dev/null || need+=(textual mdit_py_plugins linkify_it_py platformdirs markdown_it_py mdurl)
python3 -c 'import nvitop' 2>/dev/null || need+=(nvitop)
python3 -c 'import jsonschema' 2>/dev/null || need+=(jsonschema jsonschema_specifications referencing rpds_py attrs)
python3 -c 'import prometheus_client' 2>/dev/null || need+=(prometheus_client)
python3 -c 'import nvitop_exporter' 2>/dev/null || need+=(nvitop_exporter)
python3 -c 'import xxhash' 2>/dev/null || need+=(xxhash)
python3 -c 'import re2' 2>/dev/null || need+=(google_re2)
python3 -c 'import inotify_simple' 2>/dev/null || need+=(inotify_simple)
python3 -c 'import rich' 2>/dev/null || need+=(rich pygments)
python3 -c 'import textual_plotext' 2>/dev/null || need+=(textual_plotext plotext)
if [ ${#need[@]} -gt 0 ] && [ -d .device/wheels ]; then
    files=()
    for n in "${need[@]}"; do files+=($(ls .device/wheels/${n}-*.whl 2>/dev/null)); done
    [ ${#files[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps "${files[@]}" 2>&1 | grep -v WARNING | tail -2
fi
cat > /usr/local/bin/gpuwarden <<WRAP
#!/bin/sh
PYTHONPATH="$GW_ROOT" exec python3 -m gpuwarden "\$@"
WRAP
chmod +x /usr/local/bin/gpuwarden
# Lent machines start with a small MemTotal that grows with use, so tmpfs sized at boot can be
# too small for a 32 GiB arena: give /dev/shm room (host memory only; no GPU setting is touched).
shm_kb=$(df -k --output=size /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
if [ -n "$shm_kb" ] && [ "$shm_kb" -lt $((80 * 1024 * 1024)) ]; then
    mount -o remount,size=100G /dev/shm 2>/dev/null && echo "setup: /dev/shm resized to 100G"
fi
export GPUWARDEN_STATE_DIR="${GPUWARDEN_STATE_DIR:-/tmp/gw-state}"
echo "setup: $(python3 --version), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs), gpuwarden $(gpuwarden --version 2>&1)"
# Stop every engine that bench_launch.py left in its work folders (device scripts call it on exit).
stop_bench_launches() {
    local gw=(python3 -m gpuwarden.playbooks.cli.root)
    command -v gpuwarden >/dev/null 2>&1 && gw=(gpuwarden)
    for d in /tmp/bench-launch-*; do
        [ -d "$d" ] || continue
        for s in "$d"/state-*; do [ -d "$s" ] && "${gw[@]}" --state-dir "$s" engines stop --all --timeout 10 >/dev/null 2>&1; done
    done
}
