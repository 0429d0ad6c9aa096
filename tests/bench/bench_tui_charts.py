"""The TUI's refresh cost with the GPU detail view's charts open against closed, on a simulated node of 8 GPUs and
2,000 processes, peers in the same run.

1. CPU at 1 Hz in tmux (real terminals), side by side over WINDOW_S: `gpuwarden tui` on its main view, the same
   with GPU 0's charts open (c), and `gpuwarden status --watch --interval 1` (same data, no TUI).
2. In process (Textual's Pilot, refresh 0.25 s): event-loop time per refresh (the snapshot's handling, the
   panels, the open screen, the built charts handed over) with the charts closed and open, and the chart
   worker's time per build (off the event loop).
Run: .venv/bin/python tests/bench/bench_tui_charts.py   (needs tmux and psutil: pip install -e ".[bench]"; ~2 min)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))

import psutil  # noqa: E402

from bench_tui import cpu_percent_over, end_sessions, find_pid, tmux  # noqa: E402
from benchlib import cpu_model  # noqa: E402
from gpuwarden.ops.node.sim.node import SimNode  # noqa: E402

GPUWARDEN = Path(sys.executable).parent / "gpuwarden"
N_GPUS, N_PROCS = 8, 2000
WARMUP_S, WINDOW_S = 8.0, 30.0
REFRESHES = 40


def measure_cpu(state: Path) -> dict[str, float]:
    sock = state / "tmux.sock"
    base = f"{GPUWARDEN} --state-dir {state} --backend sim"
    sessions = {"tui, main view": f"{base} tui --refresh 1", "tui, charts open": f"{base} tui --refresh 1",
                "status --watch": f"{base} status --watch --interval 1"}
    names = {}
    for i, (label, cmd) in enumerate(sessions.items()):
        names[label] = f"s{i}"
        tmux(sock, "new-session", "-d", "-x", "160", "-y", "48", "-s", f"s{i}", cmd)
    pids: dict[str, int] = {}
    try:
        pids = {label: find_pid(sock, names[label], "status --watch" if "status" in label else " tui")
                for label in sessions}
        time.sleep(WARMUP_S / 2)
        tmux(sock, "send-keys", "-t", names["tui, charts open"], "c")
        time.sleep(WARMUP_S / 2)
        screen = tmux(sock, "capture-pane", "-p", "-t", names["tui, charts open"]).stdout
        return {"screen": screen, **cpu_percent_over(pids, WINDOW_S)}
    finally:
        end_sessions(sock, pids)


async def loop_cost(state: Path, charts: bool) -> tuple[list[float], list[float], list[float]]:
    """(event-loop ms per snapshot handled, event-loop ms per set of built charts handed over, worker ms per
    build) over REFRESHES refreshes."""
    from helpers.tui_support import wait_for

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.sources import live_source
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.tui.widgets import charts as charts_mod

    settings = Settings(state_dir=state, backend="sim", config_path=state / "node.toml")
    source, close = live_source(settings)
    app = GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25)
    loop_ms: list[float] = []
    show_ms: list[float] = []
    build_ms: list[float] = []
    handle = GpuwardenApp.on_snapshot_arrived

    def timed(self, message):
        t0 = time.perf_counter()
        handle(self, message)
        loop_ms.append(1000 * (time.perf_counter() - t0))
    GpuwardenApp.on_snapshot_arrived = timed  # type: ignore[method-assign]
    original_build, original_show = charts_mod.ChartsPane._build, charts_mod.ChartsPane._show

    def build(self, *a):
        t0 = time.perf_counter()
        original_build(self, *a)
        build_ms.append(1000 * (time.perf_counter() - t0))

    def show(self, *a):
        t0 = time.perf_counter()
        original_show(self, *a)
        show_ms.append(1000 * (time.perf_counter() - t0))  # the hand-over runs on the event loop too
    charts_mod.ChartsPane._build, charts_mod.ChartsPane._show = build, show  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=60, what="first snapshot")
            if charts:
                await pilot.press("c")
                await wait_for(pilot, lambda: type(app.screen).__name__ == "GpuDetailScreen", what="charts")
            await pilot.pause(1.0)
            loop_ms.clear()
            show_ms.clear()
            build_ms.clear()
            await wait_for(pilot, lambda: len(loop_ms) >= REFRESHES, timeout=120, what="refreshes")
    finally:
        charts_mod.ChartsPane._build, charts_mod.ChartsPane._show = original_build, original_show
        GpuwardenApp.on_snapshot_arrived = handle  # type: ignore[method-assign]
    return loop_ms, show_ms, build_ms


def main() -> int:
    if shutil.which("tmux") is None:
        print("tmux is not installed: cannot run the TUI in a terminal")
        return 2
    state = Path(tempfile.mkdtemp(prefix="gw-bench-charts-"))
    SimNode(state).init(gpus=N_GPUS, vram=192 << 30)
    sleepers = [subprocess.Popen(["sleep", "900"]) for _ in range(N_PROCS)]
    node = SimNode(state)
    for i, p in enumerate(sleepers[:32]):  # 32 of them hold simulated VRAM, like tenants
        node.allocate(p.pid, i % N_GPUS, (2 + i % 5) << 30)
    try:
        print(f"machine: {os.cpu_count()} cores, {cpu_model()}; load {os.getloadavg()[0]:.1f}; "
              f"{len(psutil.pids())} processes on the host")
        print(f"node: {N_GPUS} simulated GPUs, {N_PROCS} sleeping processes (32 holding VRAM)")
        cpu = measure_cpu(state)
        print(f"\nCPU over {WINDOW_S:.0f} s at 1 Hz, side by side (% of one core):")
        for k in ("tui, main view", "tui, charts open", "status --watch"):
            print(f"  {k:<18} {cpu[k]:6.2f}%")
        print(f"  ratio charts open / main view = {cpu['tui, charts open'] / max(cpu['tui, main view'], 1e-6):.2f}; "
              f"main view / status --watch = {cpu['tui, main view'] / max(cpu['status --watch'], 1e-6):.2f}")
        shown = "last hour" in cpu["screen"] and "minutes ago" in cpu["screen"]
        print(f"  the charts session's screen {'showed' if shown else 'did NOT show'} the charts")

        print(f"\nevent-loop ms per refresh in process (Pilot, 160x48, refresh 0.25 s, {REFRESHES} refreshes):")
        closed, _, _ = asyncio.run(loop_cost(state, charts=False))
        opened, shows, builds = asyncio.run(loop_cost(state, charts=True))
        for label, ms in (("charts closed", closed), ("charts open", opened), ("charts handed over", shows)):
            if ms:
                print(f"  {label:<18} median {statistics.median(ms):6.2f}  p95 {sorted(ms)[int(0.95 * len(ms))]:6.2f}"
                      f"  max {max(ms):6.2f} (n={len(ms)})")
        per_open = statistics.median(opened) + (statistics.median(shows) * len(shows) / len(opened) if shows else 0)
        print(f"  ratio open / closed per refresh (medians, hand-overs included) = "
              f"{per_open / statistics.median(closed):.2f}")
        if builds:
            print(f"  chart worker (off the loop): median {statistics.median(builds):.1f} ms per build of 5 charts, "
                  f"{len(builds)} builds")
        return 0
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
