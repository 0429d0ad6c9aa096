#!/usr/bin/env bash
# Source me on a lent GPU machine (repo root as cwd): makes `gpuwarden` runnable there.
# The machine has no network: missing pure-Python wheels come carried in .device/wheels.
set -u
export GPUWARDEN_REPO="$PWD"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-/tmp/gw-out}"
mkdir -p "$OUT"
need=()
python3 -c 'import textual' 2>/dev/null || need+=(textual mdit_py_plugins linkify_it_py platformdirs markdown_it_py mdurl)
python3 -c 'import nvitop' 2>/dev/null || need+=(nvitop)
if [ ${#need[@]} -gt 0 ] && [ -d .device/wheels ]; then
    files=()
    for n in "${need[@]}"; do files+=($(ls .device/wheels/${n}-*.whl 2>/dev/null)); done
    [ ${#files[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps "${files[@]}" 2>&1 | grep -v WARNING | tail -2
fi
cat > /usr/local/bin/gpuwarden <<WRAP
#!/bin/sh
PYTHONPATH="$PWD" exec python3 -m playbooks.cli "\$@"
WRAP
chmod +x /usr/local/bin/gpuwarden
export GPUWARDEN_STATE_DIR="${GPUWARDEN_STATE_DIR:-/tmp/gw-state}"
echo "setup: $(python3 --version), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs), gpuwarden $(gpuwarden --version 2>&1)"
