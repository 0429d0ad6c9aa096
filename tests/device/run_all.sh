#!/usr/bin/env bash
# Run several device scripts in one lease: each gets its own output folder, a time limit, and a
# summary line; everything is packed into $OUT/results.tgz (the device tool returns few files).
# Usage (repo root, on the GPU machine): bash tests/device/run_all.sh SCRIPT:SECONDS [SCRIPT:SECONDS...]
set -u
FINAL=${OUT:-/tmp/gw-final}
WORK=/tmp/gw-runs
mkdir -p "$FINAL" "$WORK"
for spec in "$@"; do
    name=${spec%%:*}; limit=${spec##*:}
    dir=$WORK/$name; mkdir -p "$dir"
    echo "################ $name (limit ${limit}s)"
    start=$(date +%s)
    OUT=$dir timeout "$limit" bash "tests/device/$name.sh" > "$dir/console.txt" 2>&1
    rc=$?
    echo "exit $rc after $(( $(date +%s) - start ))s"
    tail -c 3500 "$dir/console.txt"
    echo
done
tar czf "$FINAL/results.tgz" -C "$WORK" . 2>/dev/null
ls -la "$FINAL"
