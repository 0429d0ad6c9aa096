#!/usr/bin/env bash
# The TUI on an NVIDIA node with the NVML backend while two canaries (runtime cuda) serve from one arena:
# runs `gpuwarden --backend nvml tui` in tmux (160x48 and 80x24), opens GPU 0's detail view, quits, and keeps
# text captures of the screens in $OUT/tui_nvml*.txt (printed at the end). Without tmux it renders the same
# app headless through Textual's run_test. Run from the repo root.
# Touches no GPU setting: the canaries pin host memory and copy it to GPUs 0 and 1; all are stopped at the end.

source tests/device/setup.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
STATE=$(mktemp -d /tmp/gw-tui-XXXX)
export GPUWARDEN_STATE_DIR=$STATE
ARENA=/dev/shm/gpuwarden-tui.arena
SIZE=${SIZE:-4GiB}
CFG=$STATE/node.toml
if command -v gpuwarden >/dev/null 2>&1; then GW=(gpuwarden); else GW=(python3 -m gpuwarden.playbooks.cli.root); fi
SOCK=$STATE/tmux.sock
HOLDERS=()
cleanup() {
    command -v tmux >/dev/null 2>&1 && tmux -S "$SOCK" kill-server 2>/dev/null
    "${GW[@]}" --config "$CFG" engines stop --all --timeout 10 >/dev/null 2>&1
    for p in "${HOLDERS[@]}"; do kill "$p" 2>/dev/null; done
    rm -f "$ARENA"
}
trap cleanup EXIT

echo "== node"
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpus.csv"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); tmux: $(command -v tmux || echo missing)"

echo "== two canaries (runtime cuda) over a $SIZE arena, supervised"
"${GW[@]}" arena create "$ARENA" --size "$SIZE" --force -q --json > "$OUT/arena_create.json" 2>&1
cat > "$CFG" <<TOML
[arena]
path = "$ARENA"

[stagger]
slots = 1
registration_timeout = 120

[[engines]]
name = "canary0"
gpu = 0
argv = ["python3", "-m", "gpuwarden.ops.canary", "--arena", "$ARENA", "--gpu", "0", "--runtime", "cuda", "--verify", "header"]
workdir = "$PWD"

[[engines]]
name = "canary1"
gpu = 1
argv = ["python3", "-m", "gpuwarden.ops.canary", "--arena", "$ARENA", "--gpu", "0", "--runtime", "cuda", "--verify", "header"]
workdir = "$PWD"
TOML
timeout 300 "${GW[@]}" --config "$CFG" launch > "$OUT/launch.txt" 2>&1
LAUNCH_RC=$?
tail -4 "$OUT/launch.txt"
if [ $LAUNCH_RC -ne 0 ]; then
    echo "launch exit $LAUNCH_RC: falling back to two torch processes holding 6 GiB each"
    for g in 0 1; do
        CUDA_VISIBLE_DEVICES=$g python3 -c "import torch,time; x=torch.empty(6<<30, dtype=torch.uint8, device='cuda'); time.sleep(600)" &
        HOLDERS+=($!)
    done
    sleep 15
fi

capture() {  # $1 width, $2 height, $3 file: start the TUI in tmux, capture the main screen and GPU 0's detail
    tmux -S "$SOCK" kill-server 2>/dev/null
    tmux -S "$SOCK" new-session -d -x "$1" -y "$2" -s tui \
        "${GW[*]} --state-dir $STATE --config $CFG --backend nvml tui --refresh 1; echo tui-exit=\$? > $STATE/tui.rc; sleep 30"
    for _ in $(seq 1 100); do
        tmux -S "$SOCK" capture-pane -p -t tui: | grep -q "engine(s)\|none supervised" && break
        sleep 0.2
    done
    sleep 3  # a few refreshes: the sparkline and the events fill in
    tmux -S "$SOCK" capture-pane -p -t tui: > "$3"
    tmux -S "$SOCK" send-keys -t tui: Enter
    sleep 1.5
    tmux -S "$SOCK" capture-pane -p -t tui: > "${3%.txt}_gpu0.txt"
    tmux -S "$SOCK" send-keys -t tui: Escape
    sleep 0.5
    rm -f "$STATE/tui.rc"
    tmux -S "$SOCK" send-keys -t tui: q
    for _ in $(seq 1 50); do [ -f "$STATE/tui.rc" ] && break; sleep 0.2; done
    echo "$1x$2: $(cat "$STATE/tui.rc" 2>/dev/null || echo 'tui-exit=missing (did not quit)')"
}

echo "== the TUI"
if command -v tmux >/dev/null 2>&1; then
    capture 160 48 "$OUT/tui_nvml.txt"
    capture 80 24 "$OUT/tui_nvml_80x24.txt"
else
    echo "tmux missing: rendering headless with Textual's run_test"
    python3 - "$CFG" "$OUT" <<'PY'
import asyncio, sys
from pathlib import Path
from gpuwarden.ops.config import loader
from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.ops.sources.kinds import LocalSource

cfg, out = Path(sys.argv[1]), Path(sys.argv[2])

async def shot(width, height, name):
    settings = loader.resolve({"backend": "nvml", "config": cfg}, check=False)
    source = LocalSource(settings, console=True)
    close = source.close
    app = GpuwardenApp(settings, source=source, on_exit=close)
    async with app.run_test(size=(width, height)) as pilot:
        for _ in range(100):
            if app.snapshot is not None:
                break
            await pilot.pause(0.1)
        await pilot.pause(3)
        strips = app.screen._compositor.render_strips()
        (out / name).write_text("\n".join("".join(s.text for s in strip) for strip in strips) + "\n")
        app.save_screenshot(str(out / name.replace(".txt", ".svg")))
        await pilot.press("enter")
        await pilot.pause(1)
        strips = app.screen._compositor.render_strips()
        (out / name.replace(".txt", "_gpu0.txt")).write_text(
            "\n".join("".join(s.text for s in strip) for strip in strips) + "\n")

asyncio.run(shot(160, 48, "tui_nvml.txt"))
asyncio.run(shot(80, 24, "tui_nvml_80x24.txt"))
PY
fi

for f in "$OUT/tui_nvml.txt" "$OUT/tui_nvml_gpu0.txt" "$OUT/tui_nvml_80x24.txt"; do
    echo "== $(basename "$f")"
    cat "$f" 2>/dev/null || echo "(missing)"
done
grep -q "nvml" "$OUT/tui_nvml.txt" 2>/dev/null && grep -q "GPUs" "$OUT/tui_nvml.txt"
