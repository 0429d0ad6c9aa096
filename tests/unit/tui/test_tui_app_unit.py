"""The unit half of tests/integration/tui/test_tui_app.py (its tests that need no process, socket or server); the pair's subject:
The TUI under Textual's Pilot: header, panels, read-only, stale data, confirm dialog, and every action.

Actions run against real supervised engines (fake_engine under real shims) on the simulated node.
"""

from __future__ import annotations

import asyncio
import json
import tarfile
import threading
import time

import pytest
from engines.harness import records, supervised, write_config  # noqa: F401
from helpers.tui_support import make_app, screen_text, wait_for

from helpers.tui_app import live_app, sim_settings

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


def test_header_and_panels_show_the_snapshot(settings):
    async def go():
        app = make_app(settings, read_only=True)
        async with app.run_test(size=(160, 40)) as pilot:
            needles = ("node-a17", "SIMULATED", "every 1s", "READ-ONLY", "dp1", "SIGSEGV", "crashed",
                       "14.0 GiB", "/dev/shm/experts.arena", "residual VRAM 14.0 GiB appeared", "DRAINED")
            await wait_for(pilot, lambda: all(n in screen_text(app) for n in needles), what="the panels drawn")
    run(go())


def test_read_only_removes_action_bindings_and_palette_entries(settings):
    from gpuwarden.tui.actions import ACTIONS

    async def go():
        app = make_app(settings, read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            keys = {b.key for _, b in app._bindings}
            assert not keys & {a.key for a in ACTIONS}, keys
            footer = screen_text(app).splitlines()[-1]
            assert footer.startswith(" q Quit  ? Keys") and " d " not in footer and " P " not in footer
            assert all("act(" not in action for _, _, action in app.palette_commands())
            # The palette's provider offers no action either.
            from gpuwarden.tui.palette import GpuwardenCommands
            provider = GpuwardenCommands(app.screen)
            titles = [hit.text async for hit in provider.search("drain")] + \
                     [hit.text async for hit in provider.discover()]
            assert not any("Drain" in str(t) for t in titles)
            await pilot.press("d", "R", "P")
            await pilot.pause()  # the keys handled (none is bound): nothing may have started
            assert app.current_run is None
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: "Keys" in screen_text(app), what="help")
            assert "Drain GPU" not in screen_text(app) and "read-only" in screen_text(app)

        app = make_app(settings)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            footer = screen_text(app).splitlines()[-1]
            # The same check can fail (at 80 columns the keys are drawn as accelerators: "drain", "Purge").
            assert "drain" in footer.split() and "Purge" in footer.split(), footer
            keys = {b.key for _, b in app._bindings}
            assert {a.key for a in ACTIONS} <= keys
            from gpuwarden.tui.palette import GpuwardenCommands
            provider = GpuwardenCommands(app.screen)
            titles = [str(hit.text) async for hit in provider.search("drain")]
            assert any("Drain GPU" in t for t in titles)
    run(go())


def test_every_action_path_refuses_in_read_only_and_while_a_playbook_runs(settings):
    """The GPU actions, the process stop dialog and the process view's signal menu share one guard."""
    async def go():
        app = make_app(settings, read_only=True)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            process = next(iter(app.snapshot.processes), None)
            app.action_act("drain")
            app.action_stop_process()
            app.send_process_signal(process, "TERM", True)
            def said(text: str) -> int:
                return [n.message for n in app._notifications].count(text)
            await wait_for(pilot, lambda: said("read-only: actions are disabled") == 3, what="three refusals")
            assert app.current_run is None

            app.read_only = False
            app._notifications.clear()

            class Running:  # what the app keeps of a playbook it started, still going
                title, running = "Drain GPU 1", True
            app.current_run = Running()
            app.action_act("purge")
            app.action_stop_process()
            app.send_process_signal(process, "KILL", True)
            await wait_for(pilot, lambda: said("Drain GPU 1 is still running (o shows it)") == 3,
                           what="three refusals while one runs")
            assert isinstance(app.current_run, Running) and len(app.screen_stack) == 1
            app.current_run = None  # nothing for the app's exit to cancel
    run(go())


def test_confirm_dialog_focuses_cancel_and_enter_cancels():
    from gpuwarden.tui.screens.confirm import ConfirmScreen
    from textual.app import App

    answers = []

    class Host(App):
        def on_mount(self):
            self.push_screen(ConfirmScreen("Reset GPU 1", "reset it?"), answers.append)

    async def go():
        app = Host()
        async with app.run_test(size=(80, 24)) as pilot:
            focused = lambda: app.focused is not None and app.focused.id == "cancel"  # noqa: E731
            await wait_for(pilot, focused, what="Cancel focused")
            await pilot.press("enter")
            await wait_for(pilot, lambda: answers == [False], what="the first answer")
            app.push_screen(ConfirmScreen("Reset GPU 1", "reset it?"), answers.append)
            await wait_for(pilot, focused, what="Cancel focused")
            await pilot.press("escape")
            await wait_for(pilot, lambda: answers == [False, False], what="the second answer")
            app.push_screen(ConfirmScreen("Reset GPU 1", "reset it?"), answers.append)
            await wait_for(pilot, focused, what="Cancel focused")
            await pilot.press("right", "enter")
            await wait_for(pilot, lambda: answers == [False, False, True], what="the third answer")
    run(go())


def test_gpu_detail_names_the_holder(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("down", "enter")
            await wait_for(pilot, lambda: "holder pid 4242" in screen_text(app), what="GPU 1 detail")
            text = screen_text(app)
            assert "zombie" in text and "python serve.py" in text
            await pilot.press("escape")
            await wait_for(pilot, lambda: "Engines" in screen_text(app))
    run(go())


def test_triage_view_reads_the_bundle(settings, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    src = tmp_path / "triage.md"
    src.write_text("# triage\n4 segfaults in libamdhip64.so.7 at the same offset\n")
    # The least manifest the schema takes: the TUI reads a bundle through the one reader every command uses.
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schema": "gpuwarden.bundle-manifest/1", "format": 1, "tool": "gpuwarden",
                                    "created": "now", "host": "h", "collectors": [], "items": [],
                                    "not_collected": [], "redaction": {"total": 0, "by_pattern": {}}}))
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(src, arcname="bundle-x/triage.md")
        tar.add(manifest, arcname="bundle-x/manifest.json")

    async def go():
        app = make_app(settings, bundle=bundle)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            assert app.read_only
            await pilot.press("t")
            await wait_for(pilot, lambda: "4 segfaults in libamdhip64" in screen_text(app), what="triage text")
    run(go())


def test_arena_panel_shows_the_drivers_books(tmp_path):
    from gpuwarden.ops.node.sim.node import SimNode
    settings = sim_settings(tmp_path / "state")
    SimNode(settings.state_dir).set_fault("vram-fragmented", True)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_for(pilot, lambda: "KFD system memory" in screen_text(app)
                           and "VRAM fragmented" in screen_text(app), timeout=30, what="KFD and fragmentation lines")
    run(go())


def test_quit_while_a_playbook_runs_asks_for_a_second_q(settings):
    from gpuwarden.playbooks.framework import Playbook, Step
    from gpuwarden.tui.runner import PlaybookRun
    started = threading.Event()

    class Slow(Playbook):
        name = "slow"
        description = "a step that waits"

        def plan(self, ctx):
            def wait(c):
                started.set()
                while not c.cancelled.is_set():
                    time.sleep(0.02)
                return "stopped"
            return [Step("wait", "wait until cancelled", wait), Step("after", "never runs", lambda c: "ran")]

    async def go():
        app = make_app(settings)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            run = PlaybookRun(app, Slow(), settings, "Slow")
            app.current_run = run
            run.start()
            await wait_for(pilot, started.is_set)
            await pilot.press("q")
            await wait_for(pilot, lambda: any("press q again" in n.message for n in app._notifications),
                           what="the second-q warning")
            assert app.is_running
            await pilot.press("q")
            await wait_for(pilot, lambda: not run.running, what="the run to stop")
            kinds = [(e.kind, e.step) for e in run.events]
            assert ("step_skipped", "after") in kinds
    run(go())
