"""Rough edges a new user hit in the console (issue 36), each through Textual's pilot on the fixed snapshot:
the GPU an action means, the holder's name, the help box, the GPU table's marks, the stacked layout.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers.tui_support import make_app, open_processes, screen_text, wait_for

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


async def _cancel_run(app, pilot):
    await wait_for(pilot, lambda: not app.current_run.running or (app.focused is not None and app.focused.id == "cancel"),
                   what="confirm dialog")
    if not app.current_run.running:
        return
    await pilot.press("enter")  # Cancel
    await wait_for(pilot, lambda: not app.current_run.running, what="the run to end")


def test_an_action_from_the_processes_panel_means_the_selected_process_gpu(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            assert app.query_one("#gpus").selected_gpu() == 0
            procs = await open_processes(app, pilot)
            await pilot.press("home")
            for _ in range(len(procs.rows)):
                if procs.selected() is not None and procs.selected().pid == 5002:
                    break
                await pilot.press("down")
            assert procs.selected().pid == 5002 and set(procs.selected().vram) == {2}
            await pilot.press("d")
            await wait_for(pilot, lambda: app.current_run is not None, what="d to start")
            assert app.current_run.title == "Drain GPU 2", app.current_run.title
            await _cancel_run(app, pilot)
    run(go())


def test_a_zombie_holder_named_by_the_kernel_is_bracketed_once():
    # A zombie has no command line: procs.py names it [comm]; the GPU view drew [[python3]] (issue 36).
    from dataclasses import replace

    from helpers.tui_support import fixed_snapshot

    from gpuwarden.tui.screens.gpu_detail import gpu_summary
    snap = fixed_snapshot()
    res = [replace(r, holders=tuple(replace(h, command="[python3]") for h in r.holders)) if r.gpu_index == 1 else r
           for r in snap.residual]
    shown = gpu_summary(replace(snap, residual=tuple(res)), 1).plain
    assert " [python3]" in shown and "[[python3]]" not in shown, shown
    assert " [python serve.py --tp 1]" in gpu_summary(snap, 1).plain


def test_the_confirm_dialog_stands_alone_and_nothing_offers_to_stop_what_has_not_started(state_dir):
    # Issue 36: the fix confirmation was drawn over the progress view, which showed through at both sides, and the
    # footer offered "Stop after this step" before anything was confirmed.
    from helpers.tui_actions import select_gpu
    from helpers.tui_app import live_app, sim_settings

    from gpuwarden.tui.screens.confirm import ConfirmScreen
    from gpuwarden.tui.screens.progress import ProgressScreen

    async def go():
        app = live_app(sim_settings(state_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await select_gpu(app, pilot, 0)
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirm dialog")
            await pilot.pause()
            progress = next(s for s in app.screen_stack if isinstance(s, ProgressScreen))
            assert not progress.query_one("#progress").display
            shown = screen_text(app)
            assert "Stop after this step" not in shown and "Drain GPU 0" in shown, shown
            await pilot.press("right", "enter")  # Proceed
            await wait_for(pilot, lambda: not app.current_run.running, timeout=30, what="the drain to end")
            await wait_for(pilot, lambda: app.screen is progress and "finished" in screen_text(app),
                           what="the progress view after the answer")
            assert progress.query_one("#progress").display
            assert "Stop after this step" not in screen_text(app)  # nothing left to stop
    run(go())


def test_the_key_list_uses_the_terminal_and_cuts_no_entry_and_explains_the_marks(settings):
    # Issue 36: the `?` box was 70 columns on a 100-column terminal and cut entries; the GPU table's "!" was never
    # explained.
    from rich.console import Console

    from gpuwarden.tui.screens.help import HelpScreen

    def words(text: str) -> str:
        return " ".join(text.split())

    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            gpus = app.query_one("#gpus")
            await wait_for(pilot, lambda: "! residual" in str(gpus.border_subtitle), what="the mark said")
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the key list")
            await pilot.pause()
            box = app.screen.query_one("#help")
            assert box.region.width >= 96, box.region
            listing = app.screen.query_one("#help-list")
            console = Console(width=listing.content_region.width, record=True, file=open("/dev/null", "w"))
            console.print(app.screen.listing())
            drawn = words(console.export_text())
            for _key, what in app.screen.keys + list(app.screen.marks):
                assert words(what) in drawn, what
            assert any(mark == "!" for mark, _ in app.screen.marks)
            shown = screen_text(app)
            assert "KEY" in shown and "…" not in shown, shown
    run(go())


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
def test_the_remembered_stacked_layout_keeps_every_panel_on_the_screen(settings, size):
    # Issue 36: at 80x24 the stacked layout left Processes, Arena and Events below the fold with Engines 14 blank
    # rows tall, and the console remembered it. Started with it remembered, every panel is on the screen.
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.tui.prefs import Prefs
    from helpers.tui_support import fixed_snapshot
    snap = fixed_snapshot()

    async def go():
        app = GpuwardenApp(settings, source=lambda: snap, prefs=Prefs().with_(layout="stacked"))
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None and app.query_one("#processes").rows)
            await pilot.pause()
            bottom_row = size[1] - 1  # the key strip's
            for name in ("gpus", "engines", "processes", "arena", "events"):
                region = app.query_one(f"#{name}").region
                assert region.height >= 4 and region.y + region.height <= bottom_row, (name, region)
            engines = app.query_one("#engines")
            assert engines.region.height <= len(snap.engines) + 3, engines.region  # borders, titles, rows
            shown = screen_text(app)
            assert "Processes" in shown and "Events" in shown and "Arena" in shown
    run(go())


@pytest.mark.parametrize("size", [(80, 24), (60, 24)])
def test_the_empty_engines_panel_says_its_whole_sentence(settings, size):
    # Issue 36: "no engines supervised: `gpuwarden launch` starts the node config's" — cut, in the text and at the edge.
    from dataclasses import replace

    from gpuwarden.tui.app import GpuwardenApp
    from helpers.tui_support import fixed_snapshot
    snap = replace(fixed_snapshot(), engines=())

    async def go():
        app = GpuwardenApp(settings, source=lambda: snap)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.pause()
            panel = app.query_one("#engines")
            top = panel.region.y
            body = "\n".join(screen_text(app).splitlines()[top:top + panel.region.height])
            said = " ".join(w for w in body.replace("│", " ").split() if w not in ("╭─", "╰─"))
            assert "starts the engines the node config names" in said, body
            assert "l (or `gpuwarden launch`)" in said, body
            assert "sim scenario arena` starts the arena drill" in said, body
    run(go())


def test_the_bundle_result_shows_its_time_once(sim_settings, tmp_path):
    # Issue 36: the console's bundle result said "(…, 1.2s) (1.2s)": the playbook's message and the step's seconds.
    import re

    from gpuwarden.playbooks.bundle import BundlePlaybook
    from gpuwarden.playbooks.framework import run as run_playbook
    from gpuwarden.tui.screens.progress import event_line
    events = []
    result = run_playbook(BundlePlaybook(output=tmp_path / "b.tar.gz", timeout_s=5.0), sim_settings,
                          sink=events.append, assume_yes=True)
    assert result.ok, [e.message for e in events]
    [ok] = [e for e in events if e.kind == "step_ok"]
    line = event_line(ok).plain
    assert len(re.findall(r"\d+\.\d+s\b", line)) == 1, line
