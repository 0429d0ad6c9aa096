"""Shared pieces of the TUI tests: a fixed NodeSnapshot, an app factory, and waiting helpers (no tests here).

The fixed snapshot has a fixed host and clock, so snapshot tests render the same on any machine.
"""

from __future__ import annotations

import time
from gpuwarden.ops.foundation.model import (ArenaInfo, ArenaMapper, EngineInfo, GpuInfo, GpuProcess, Holder,
    NodeSnapshot, Residual)


GIB = 1 << 30


TAKEN_AT = 1_790_000_000.0


def fixed_snapshot(gpus: int = 4, *, taken_at: float = TAKEN_AT) -> NodeSnapshot:
    """A sim-like node: GPU 1 with a zombie holding residual VRAM, GPU 3 drained, four engines, one arena."""
    infos, residual, procs = [], [], []
    for i in range(gpus):
        used = [18, 23, 6, 0][i % 4] * GIB
        infos.append(GpuInfo(index=i, name="Simulated MI300X", vendor="sim", bus_id=f"0000:{0x11 + i:02x}:00.0",
                             vram_total=192 * GIB, vram_used=used, gtt_total=96 * GIB, gtt_used=GIB // 2,
                             busy_percent=[87, 0, 12, 0][i % 4], temperature_c=[61, 44, 50, 38][i % 4],
                             power_w=[612, 140, 300, 95][i % 4], kfd_gpu_id=41000 + i,
                             device_files=(f"/dev/dri/renderD{128 + i}",)))
        holders = ()
        accounted = used
        if i == 1:
            holders = (Holder(pid=4242, start_time=TAKEN_AT - 900, reason="zombie", gpus=(1,), vram_bytes=14 * GIB,
                              command="python serve.py --tp 1", ppid=4000,
                              detail="exited but not reaped by its parent (pid 4000)"),)
            accounted = used - 14 * GIB
        residual.append(Residual(gpu_index=i, device_used=used, accounted=accounted, baseline=0,
                                 residual=used - accounted, holders=holders, significant=bool(holders)))
        if used and i != 1:
            procs.append(GpuProcess(pid=5000 + i, start_time=TAKEN_AT - 3600, user="svc", command=f"engine dp{i}",
                                    state="sleeping", vram={i: used}, sources={i: "kfd"},
                                    device_files=(f"/dev/dri/renderD{128 + i}",)))
    procs.append(GpuProcess(pid=4242, start_time=TAKEN_AT - 900, user="svc", command="python serve.py --tp 1",
                            state="zombie", ppid=4000, vram={1: 14 * GIB}, sources={1: "kfd"}))
    engines = (
        EngineInfo(name="dp0", gpu=0, phase="serving", pid=5000, shim_pid=4990, started_at=TAKEN_AT - 3725,
                   log_path="/nonexistent/dp0.log", last_log_line="session is up: 4 experts mapped"),
        EngineInfo(name="dp1", gpu=1, phase="crashed", pid=None, shim_pid=None, started_at=TAKEN_AT - 900,
                   exit_code=None, signal="SIGSEGV", core_dumped=True, restarts=2,
                   last_log_line="Segmentation fault in libamdhip64.so.7"),
        EngineInfo(name="dp2", gpu=2, phase="registering", pid=5002, shim_pid=4992, started_at=TAKEN_AT - 12,
                   last_log_line="registering 64.0 GiB arena"),
        EngineInfo(name="dp3", gpu=3, phase="exited", exit_code=0, started_at=TAKEN_AT - 50,
                   last_log_line="bye"),
    )[: max(gpus, 0)]
    arenas = (ArenaInfo(path="/dev/shm/experts.arena", size=64 * GIB, header_state="ok", mappers=(
        ArenaMapper(pid=5000, command="engine dp0", rss_bytes=None, pss_bytes=None, registered=True, gpu=0),
        ArenaMapper(pid=5002, command="engine dp2", rss_bytes=None, pss_bytes=None, registered=False, gpu=2),
    )),)
    return NodeSnapshot(taken_at=taken_at, hostname="node-a17", backend="sim", simulated=True, gpus=tuple(infos),
                        processes=tuple(procs), residual=tuple(residual), engines=engines, arenas=arenas,
                        drained=(3,) if gpus > 3 else (), warnings=(), baseline_recorded=True)


def make_app(settings, source=None, **kw):
    from gpuwarden.tui.app import GpuwardenApp
    snap = fixed_snapshot()
    return GpuwardenApp(settings, source=source or (lambda: snap), **kw)


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition"):
    """Let the app run until predicate() is true; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def open_processes(app, pilot):
    """The Processes layout applied and its panel focused, returned once it is laid out and drawn (its first row,
    below its border and titles, shows its first process), not just filled."""
    app.action_apply_named_layout("processes")
    procs = app.query_one("#processes")
    procs.focus()

    def drawn() -> bool:
        lines = screen_text(app).splitlines()
        y = procs.region.y + 2
        return bool(procs.display and procs.rows and procs.region.height > 2 and y < len(lines)
                    and f" {procs.rows[0][0].split(':')[0]} " in lines[y])
    await wait_for(pilot, drawn, what="the Processes panel drawn")
    return procs


def screen_text(app) -> str:
    """What the active screen shows, as plain text lines (Textual's compositor output, colours dropped)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


async def palette_choose(app, pilot, query: str, entry: str) -> None:
    """Open the command palette (:), type `query`, and press Enter once `entry` is the highlighted hit (hits
    arrive as the search runs)."""
    await pilot.press("colon")
    await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette", what="the palette")
    await pilot.press(*query)
    await wait_for(pilot, lambda: entry in palette_highlighted(app), timeout=30, what=f"{entry!r} highlighted")
    await pilot.press("enter")


def palette_highlighted(app) -> str:
    """The text of the command palette's highlighted hit ("" while none is)."""
    from textual.widgets import OptionList
    options = app.screen.query(OptionList)
    if not options or options.first().highlighted is None:
        return ""
    option = options.first().get_option_at_index(options.first().highlighted)
    return str(getattr(option.prompt, "plain", option.prompt))
