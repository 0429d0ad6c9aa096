"""The operator's hands in the TUI (Pilot): clicks on every panel, the processes panel (sort, filter, tree,
k on a real process), the layout and remembered settings, the key strip by width, the engine detail view.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from engines.harness import supervised  # noqa: F401  (fixture)
from helpers.tui_support import TAKEN_AT, fixed_snapshot, make_app, screen_text, wait_for

from helpers.journal import read_journal
from gpuwarden.ops.foundation.model import GpuProcess

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


def family_snapshot():
    """The fixed node plus a tenant (pid 7000) with two workers under it: a tree to show."""
    base = fixed_snapshot()
    extra = (GpuProcess(pid=7000, start_time=TAKEN_AT - 600, user="alice", command="torchrun --nproc 2 train.py",
                        state="sleeping", ppid=1, container="3f2a9c1d0b7e8a6f", vram={0: 1 << 30}),
             GpuProcess(pid=7001, start_time=TAKEN_AT - 590, user="alice", command="python train.py --rank 0",
                        state="running", ppid=7000, vram={0: 5 << 30}),
             GpuProcess(pid=7002, start_time=TAKEN_AT - 590, user="alice", command="python train.py --rank 1",
                        state="running", ppid=7000, vram={2: 5 << 30}))
    return dataclasses.replace(base, processes=base.processes + extra)


async def _click_rows(pilot, panel, count: int) -> None:
    # Row i sits under the border (1) and the column titles (1): y = 2 + i from the panel's top.
    for i in reversed(range(count)):  # bottom up: the last row first, it used to be out of reach
        await pilot.click(f"#{panel.id}", offset=(4, 2 + i))
        await wait_for(pilot, lambda i=i: panel.cursor_row == i, what=f"{panel.id}'s cursor on row {i}")
    before = panel.cursor_row
    await pilot.click(f"#{panel.id}", offset=(4, 0))  # the border: nothing moves
    await pilot.pause()
    assert panel.cursor_row == before


def test_clicks_select_the_row_under_the_mouse_on_every_panel(settings):
    snap = family_snapshot()

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(140, 60)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            app.action_apply_named_layout("stacked")
            gpus, engines, procs = (app.query_one(f"#{n}") for n in ("gpus", "engines", "processes"))
            await wait_for(pilot, lambda: all(p.display and p.region.height > 2 for p in (gpus, engines, procs)),
                           what="the stacked layout")
            for panel, count in ((gpus, 4), (engines, 4), (procs, 6)):
                await _click_rows(pilot, panel, count)
            # What the keys act on is what was clicked.
            await pilot.click("#gpus", offset=(4, 2 + 2))
            assert app._target().gpu == 2
            await pilot.click("#engines", offset=(4, 2 + 1))
            assert app._target().engine == "dp1"
    run(go())


def test_processes_sort_filter_and_tree(settings):
    snap = family_snapshot()

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("p")  # engines -> processes
            procs = app.query_one("#processes")
            assert procs.display and app.focused is procs
            pids = lambda: [k.split(":")[0] for k, _ in procs.rows]  # noqa: E731
            assert pids()[0] == "5000"  # by VRAM, biggest first
            await pilot.click("#processes", offset=(2, 1))  # the PID title: sort by it
            await wait_for(pilot, lambda: pids() in (sorted(pids(), key=int), sorted(pids(), key=int, reverse=True)),
                           what="sorted by PID")
            first = pids()
            await pilot.press("I")
            assert pids() == first[::-1]
            await pilot.press("greater_than_sign")  # next column: USER
            assert "USER▲" in procs.columns or "USER▼" in procs.columns

            await pilot.press("slash")
            await pilot.press(*"train")
            await wait_for(pilot, lambda: sorted(pids()) == ["7000", "7001", "7002"], what="the filter applied")
            assert "3 filtered out" in procs.subtitle
            await pilot.press("enter")
            assert app.focused is procs and procs.filter_text == "train"
            await pilot.press("T")
            assert pids()[0] == "7000" and sorted(pids()[1:]) == ["7001", "7002"]
            text = screen_text(app)
            assert "└ python train.py --rank 0" in text and "3f2a9c1d0b7e" in text
            await pilot.press("slash", "escape")
            await wait_for(pilot, lambda: procs.filter_text == "" and len(procs.rows) == 6, what="the filter cleared")
    run(go())


# --- against real processes ----------------------------------------------------------------------

def test_k_stops_a_real_process_after_the_dialog(tmp_path, state_dir):
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    from helpers.simnode import cli_argv, proc_state
    from helpers.reaper_family import holds_sim_vram, start_family
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.ops.sources.kinds import LocalSource
    SimNode(state_dir).init(gpus=2, vram=8 << 30)
    settings = Settings(state_dir=state_dir, backend="sim", config_path=state_dir / "node.toml")
    # Its parent is a subreaper that reaps it (a test's own child would stay a zombie under pytest).
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "1GiB"), mode="direct")
    tenant = fam.tenant
    try:
        deadline = time.monotonic() + 20
        while not holds_sim_vram(state_dir, tenant):
            assert time.monotonic() < deadline, "the tenant never held its VRAM"
            time.sleep(0.05)
        async def go():
            source = LocalSource(settings, console=True)  # the console's node, no agent asked
            close = source.close
            app = GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25)
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.processes, timeout=20)
                await pilot.press("p")
                procs = app.query_one("#processes")
                await wait_for(pilot, lambda: procs.selected() is not None)
                assert procs.selected().pid == tenant
                await pilot.press("k")
                await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="dialog")
                await pilot.press("enter")  # Cancel is the default: nothing happens
                await wait_for(pilot, lambda: app.focused is not None and app.focused.id != "cancel",
                               what="the dialog closed")
                assert proc_state(tenant) not in (None, "Z") and app.current_run is None
                await pilot.press("k")
                await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="dialog")
                await pilot.press("right", "enter")  # TERM, then KILL
                await wait_for(pilot, lambda: app.current_run is not None and not app.current_run.running,
                               timeout=20, what="the stop to finish")
                assert app.current_run.result.ok, "\n".join(f"{e.kind} {e.message}" for e in app.current_run.events)
        run(go())
        assert proc_state(tenant) is None
    finally:
        fam.stop()
    lines = read_journal(state_dir)
    sent = [x for x in lines if x["action"] == "reaper-signal" and x["result"] == "ok"]
    assert sent and sent[0]["pid"] == tenant and sent[0]["signal"] == "SIGTERM"
    assert sent[0]["why"] == "the operator asked to stop it"
    assert ("stop-process", "ok") in [(x["action"], x["result"]) for x in lines]


def test_r_restarts_a_crashed_engine(supervised):  # noqa: F811
    from engines.harness import engine_argv, records
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks.framework import run as run_playbook
    from gpuwarden.playbooks.restart import RestartEnginePlaybook
    from helpers.simnode import wait_for as wait
    from gpuwarden.tui.actions import Target, by_name
    settings = Settings(state_dir=supervised)
    engine = EngineConfig(name="bad", argv=tuple(engine_argv("--register-s", "0.05", "--exit-after-register", "3")),
                          gpu=0)
    control.start(settings, engine, gate_slots=1, registration_timeout=30, workdir=None)
    wait(lambda: records(supervised).get("bad", {}).get("phase") == "crashed", 15, "crashed")
    first = records(supervised)["bad"]["shim_pid"]
    pb = by_name("restart").build(settings, Target(engine="bad", engine_gpu=0))
    assert isinstance(pb, RestartEnginePlaybook) and by_name("restart").key == "r"
    result = run_playbook(pb, settings, assume_yes=True)
    assert result.ok, [e.to_dict() for e in result.events]
    assert records(supervised)["bad"]["shim_pid"] != first
