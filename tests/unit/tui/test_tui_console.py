"""The console's rough edges a new user hit (issue 24): Enter on a process, the plan in the confirm dialog, k on a
zombie, hints that name keys, wording. Textual's Pilot on the fixed snapshot, or on the sim node with real playbooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
from helpers.tui_app import live_app
from helpers.tui_support import make_app, open_processes, palette_choose, screen_text, wait_for

pytestmark = pytest.mark.timeout(90)
# The sim node of the live-console tests (conftest.py's sim_settings fixture reads it).
SIM_NODE = {"gpus": 4, "vram": "24GiB"}


def run(coro):
    return asyncio.run(coro)


def notes(app) -> str:
    """Every notification the app has shown, as one string."""
    return " | ".join(n.message for n in app._notifications)


async def _processes(app, pilot):
    await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
    return await open_processes(app, pilot)


async def _select_process(app, pilot, pid: int) -> None:
    """The Processes panel focused, its cursor on pid's row."""
    procs = await _processes(app, pilot)
    keys = [k for k, _ in procs.rows]
    procs.cursor_row = keys.index(next(k for k in keys if k.startswith(f"{pid}:")))


@contextlib.asynccontextmanager
async def _live_console(settings, size: tuple[int, int]):
    """The console on the live sim node with real playbooks, its GPUs panel focused once the first snapshot is in."""
    app = live_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
        app.query_one("#gpus").focus()
        yield app, pilot


@pytest.mark.parametrize("screen", ["gpu", "process", "topology"])
def test_a_snapshot_arriving_before_a_pushed_view_is_composed_is_kept_for_it(settings, screen):
    # CI caught this: a snapshot landed between push_screen and the view's compose, and show_snapshot queried
    # widgets that did not exist yet (NoMatches, the console died). The draw is made in that window on purpose here.
    from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen
    from gpuwarden.tui.screens.process_detail import ProcessDetailScreen
    from gpuwarden.tui.screens.topology import TopologyScreen

    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            snap = app.snapshot
            view = {"gpu": lambda: GpuDetailScreen(2, snap), "process": lambda: ProcessDetailScreen(next(p for p in snap.processes if p.pid == 5002), snap),
                    "topology": lambda: TopologyScreen(snap)}[screen]()
            mounted = app.push_screen(view)
            assert app.screen is view and not view.is_mounted
            newer = dataclasses.replace(snap, taken_at=snap.taken_at + 1)
            app.snapshot = newer
            app._draw([])  # the window the race hit
            assert view.snap is newer
            await mounted
            await wait_for(pilot, lambda: view.is_mounted, what="the view mounted")
            await pilot.pause()
            assert app.return_code is None and app._exception is None

    run(go())


def test_a_snapshot_for_a_view_missing_a_child_it_draws_into_does_not_end_the_console(settings):
    # CI saw it once more with the view mounted: the detail view without its charts at a snapshot's draw. The
    # console keeps the snapshot for the view and goes on; the child is taken away here on purpose.
    from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen
    from gpuwarden.tui.widgets.charts import ChartsPane

    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            view = GpuDetailScreen(1, app.snapshot)
            await app.push_screen(view)
            await wait_for(pilot, lambda: view.is_mounted and view.query(ChartsPane), what="the view mounted")
            await view.query_one(ChartsPane).remove()
            newer = dataclasses.replace(app.snapshot, taken_at=app.snapshot.taken_at + 1)
            app.snapshot = newer
            app._draw([])
            assert view.snap is newer
            await pilot.pause()
            assert app.return_code is None and app._exception is None

    run(go())


def test_a_chart_library_that_does_not_import_costs_the_view_its_charts_not_the_console(settings, monkeypatch):
    # A lent H200 had plotext 6 beside textual-plotext 1.0.1 (which imports plotext._dict, gone in 6): Enter on a GPU
    # ended the console. Here plotext._dict is made unimportable the same way, and the chart modules unloaded.
    import sys

    from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen

    for name in [m for m in sys.modules if m.split(".")[0] in ("plotext", "textual_plotext")] + [
            "gpuwarden.tui.widgets.charts"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "plotext._dict", None)

    async def go():
        app = make_app(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            view = GpuDetailScreen(1, app.snapshot, charts=True)
            await app.push_screen(view)
            await wait_for(pilot, lambda: view.is_mounted, what="the view mounted")
            await pilot.press("c")
            newer = dataclasses.replace(app.snapshot, taken_at=app.snapshot.taken_at + 1)
            app.snapshot = newer
            app._draw([])
            await pilot.pause()
            line = str(view.query_one("#charts-missing").render())
            assert "charts unavailable" in line and "plotext._dict" in line and "pip install" in line
            assert "GPU 1" in screen_text(app)
            assert app.return_code is None and app._exception is None

    run(go())


def test_enter_on_a_process_opens_its_gpu_not_the_gpu_panels(settings):
    # Enter on a process opens the process's own view (issue 24); g there opens its GPU, not the GPU panel's.
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select_process(app, pilot, 5002)  # engine dp2, on GPU 2
            assert app.query_one("#gpus").selected_gpu() == 0  # the GPUs panel's cursor stays on GPU 0
            await pilot.press("enter")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ProcessDetailScreen", what="process view")
            await pilot.press("g")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "GpuDetailScreen", what="GPU detail")
            assert app.screen.index == 2 and "GPU 2  Simulated MI300X" in screen_text(app)
    run(go())


def test_k_on_a_zombie_points_to_fix_and_purge_not_signals(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select_process(app, pilot, 4242)
            await pilot.press("k")
            await wait_for(pilot, lambda: notes(app), what="the note on the zombie")
            note = notes(app)
            assert type(app.screen).__name__ != "StopProcessScreen"  # no TERM/KILL dialog
            for needle in ("TERM and KILL cannot reach it", "parent pid 4000", "press f (fix) or P (purge)"):
                assert needle in note, needle
    run(go())


def test_the_confirm_dialog_lists_the_plan_at_80x24_and_nothing_says_running_before_yes(sim_settings):
    async def go():
        async with _live_console(sim_settings, (80, 24)) as (app, pilot):
            await pilot.press("down", "down", "d")  # drain GPU 2: destructive, asks first
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", timeout=30,
                           what="the confirm dialog")
            await wait_for(pilot, lambda: "1. " in screen_text(app), what="the plan in the dialog")
            text = screen_text(app)
            assert "1. " in text and "[changes the node]" in text, text
            assert "scroll the plan" in text
            behind = app.screen_stack[-2]
            assert type(behind).__name__ == "ProgressScreen"
            state = str(behind.query_one("#progress-state").render())
            assert "running" not in state and "nothing has run yet" in state
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.current_run.result is not None, timeout=30,
                           what="the cancelled run to end")
            assert app.current_run.result.refused == "cancelled"
    run(go())


def test_reset_refused_in_the_console_names_the_drain_key(sim_settings):
    async def go():
        async with _live_console(sim_settings, (120, 36)) as (app, pilot):
            await pilot.press("down", "R")
            await wait_for(pilot, lambda: app.current_run is not None and app.current_run.result is not None,
                           timeout=30, what="the reset to be refused")
            await wait_for(pilot, lambda: "select GPU 1 and press d first" in notes(app), what="the key in the notice")
            await wait_for(pilot, lambda: "select GPU 1 and press d first" in " ".join(screen_text(app).split()),
                           what="the key in the progress view")
            assert "`gpuwarden drain 1`" not in screen_text(app)
            assert app.current_run.title == "Reset GPU 1"
    run(go())


def test_done_without_a_summary_is_not_done_done():
    from gpuwarden.playbooks.framework import Event
    from gpuwarden.tui.screens.progress import event_line
    assert event_line(Event("done", "drain", None, "done", {"ok": True})).plain == "done"
    assert event_line(Event("done", "fix", None, "GPU 2 is clean", {"ok": True})).plain == "done: GPU 2 is clean"


def test_action_titles_name_the_gpu_once():
    from gpuwarden.tui.actions import Target, by_name
    assert by_name("fix").title_for(Target(gpu=2)) == "Fix GPU 2"
    assert by_name("purge").title_for(Target(gpu=2)) == "Purge residual holders on GPU 2"
    assert by_name("stop").title_for(Target(engine="dp0")) == "Stop engine dp0"


LONG = "/home/operator/work/inference/.venv/bin/python3 /home/operator/work/inference/.venv/bin/vllm serve " \
       "/models/llama-70b --tensor-parallel-size 8 --port 8001"


def test_a_long_command_line_shows_the_program_and_its_arguments(settings):
    from dataclasses import replace
    from helpers.tui_support import fixed_snapshot
    base = fixed_snapshot()
    snap = replace(base, processes=tuple(replace(p, command=LONG) if p.pid == 5000 else p for p in base.processes))

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(100, 30)) as pilot:
            await _processes(app, pilot)
            row = next(line for line in screen_text(app).splitlines() if " 5000 " in line)
            assert "python3 vllm serve /models/llama-70b" in row, row
            assert ".venv/bin" not in row
    run(go())


def test_command_line_keeps_a_line_that_fits_and_shortens_paths_first():
    from gpuwarden.tui.text import command_line
    assert command_line(LONG, 200) == LONG
    assert command_line(LONG, 60) == "python3 vllm serve /models/llama-70b --tensor-parallel-size…"
    assert command_line("/usr/bin/python3.11 -m sglang.launch_server --port 1", 40) == \
        "python3.11 -m sglang.launch_server --po…"
    assert command_line(None, 10) == "(gone)"


def test_slash_filters_the_focused_table_gpus_and_engines_too(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            gpus = app.query_one("#gpus")
            gpus.focus()
            await pilot.press("slash", *"drn")
            await wait_for(pilot, lambda: [k for k, _ in gpus.rows] == ["3"], what="only the drained GPU")
            assert "/drn, 3 filtered out" in gpus.border_subtitle
            await pilot.press("enter")
            assert app.focused is gpus and gpus.filter_text == "drn"
            await pilot.press("slash", "escape")
            await wait_for(pilot, lambda: len(gpus.rows) == 4, what="every GPU back")
            engines = app.query_one("#engines")
            engines.focus()
            await pilot.press("slash", *"crashed")
            await wait_for(pilot, lambda: [k for k, _ in engines.rows] == ["dp1"], what="only the crashed engine")
            assert "3 filtered out" in engines.border_subtitle and "4 engine(s)" in engines.border_subtitle
            await pilot.press(*"zzz")
            await wait_for(pilot, lambda: "nothing matches /crashedzzz" in screen_text(app), what="the empty note")
    run(go())


def test_plus_and_minus_change_the_refresh_rate_while_it_runs(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            assert app.refresh_s == 1.0
            await pilot.press("minus")
            assert app.refresh_s == 2.0 and app.sampler.interval == 2.0
            await wait_for(pilot, lambda: "every 2s" in screen_text(app), what="the header's new rate")
            await pilot.press("plus", "plus")
            assert app.refresh_s == 0.5 and app.sampler.interval == 0.5
            await pilot.press("plus")
            assert app.refresh_s == 0.5 and "already the fastest" in notes(app)
    run(go())


def test_colon_jumps_to_a_gpu_through_the_palette(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            await palette_choose(app, pilot, "go to gpu 2", "Go to GPU 2")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "GpuDetailScreen", what="GPU 2's detail")
            assert app.screen.index == 2
            await pilot.press("escape")
            await wait_for(pilot, lambda: type(app.screen).__name__ != "GpuDetailScreen", what="back")
            app.action_focus_panel("processes")
            await wait_for(pilot, lambda: app.focused is app.query_one("#processes"), what="the Processes panel")
    run(go())
