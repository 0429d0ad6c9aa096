"""The unit half of tests/integration/tui/test_tui_operator.py (its tests that need no process, socket or server); the pair's subject:
The operator's hands in the TUI (Pilot): clicks on every panel, the processes panel (sort, filter, tree,
k on a real process), the layout and remembered settings, the key strip by width, the engine detail view.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from engines.harness import supervised  # noqa: F401  (fixture)
from helpers.tui_support import fixed_snapshot, make_app, screen_text, wait_for

from gpuwarden.ops.foundation.model import EngineInfo

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


def test_layout_and_theme_are_remembered(settings, tmp_path):
    from gpuwarden.tui import prefs
    where = tmp_path / "config" / "gpuwarden" / "tui.toml"

    async def go():
        app = make_app(settings, prefs_path=where)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("p", "p")  # processes, then stacked
            app.theme = "gruvbox"
            app.action_set_refresh(2.0)
            await wait_for(pilot, lambda: "every 2s" in screen_text(app), what="the new refresh rate shown")
    run(go())
    saved, note = prefs.load(where)
    assert note is None and saved == prefs.Prefs(theme="gruvbox", refresh=2.0, layout="stacked")

    async def again():
        app = make_app(settings, prefs=saved, prefs_path=where)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            assert app.theme == "gruvbox"
            assert app.query_one("#engines").display and app.query_one("#processes").display
    run(again())
    where.write_text('layout = "sideways"\nrefresh = "fast"\n')
    loaded, note = prefs.load(where)
    assert loaded == prefs.Prefs() and "ignored refresh, layout" in note


@pytest.mark.parametrize("width", [80, 100, 160])
def test_key_strip_gives_every_key_shown_its_meaning(settings, width):
    """At 80 columns the GPU remedies and the views, each with its word (no bare keys); from 100 every key;
    r and R read as "restart" and "Reset", never "rRst" and "RRset"."""
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(width, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            strip = screen_text(app).splitlines()[-1]
            words = strip.split()
            views = ("Details", "Palette") if width >= 160 else ("Info", "Cmds")
            for word in ("quit", "Keys", "fix", "drain", "Reset", "Purge", "kill", *views):
                assert word in words or word.capitalize() in words, (word, strip)
            assert "rRst" not in strip and "RRset" not in strip
            if width >= 100:
                for word in ("launch", "restart", "undrain", "Bundle", "procs"):
                    assert word in words or word.capitalize() in words, (word, strip)
            if width >= 160:
                assert "Launch" in strip and "Purge" in strip
    run(go())


def test_gpu_sparkline_from_120_columns(settings):
    async def go():
        for width, shown in ((119, False), (120, True)):
            app = make_app(settings)
            async with app.run_test(size=(width, 30)) as pilot:
                await wait_for(pilot, lambda app=app: app.snapshot is not None)
                assert ("VRAM 5 MIN" in app.query_one("#gpus").columns) == shown
    run(go())


def test_empty_node_says_how_to_start_a_drill(settings):
    base = fixed_snapshot()
    empty = dataclasses.replace(base, processes=(), engines=(), arenas=(),
                                residual=tuple(dataclasses.replace(r, holders=(), residual=0, significant=False)
                                               for r in base.residual))

    async def go():
        app = make_app(settings, source=lambda: empty)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            assert "`gpuwarden sim scenario arena` starts the arena drill" in screen_text(app)
            await pilot.press("p")
            await wait_for(pilot, lambda: "`gpuwarden sim scenario residual` sets up the residual drill" in screen_text(app),
                           what="the processes hint")
    run(go())


def _bundle_with_log(path: Path, log: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        # The least manifest the schema takes: every bundle reader checks it (replay.open_bundle, issue 39).
        manifest = json.dumps({"schema": "gpuwarden.bundle-manifest/1", "format": 1, "tool": "gpuwarden",
                               "created": "now", "host": "h", "collectors": [], "items": [], "not_collected": [],
                               "redaction": {"total": 0, "by_pattern": {}}}).encode()
        for name, data in (("b/manifest.json", manifest), ("b/kernel/kernel.log", log.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_engine_detail_shows_the_exit_signal_and_the_triage_headline(settings, tmp_path, fixtures):
    from gpuwarden.ops.triage import analyze_text
    from gpuwarden.ops.triage.render import headline as triage_headline
    log = (fixtures / "dmesg" / "oom_killer_dmesg_time_format_iso_perl.log").read_text()
    headline = triage_headline(analyze_text(log))
    bundle = _bundle_with_log(tmp_path / "crash.tar.gz", log)
    base = fixed_snapshot()
    crashed = EngineInfo(name="dp1", gpu=1, phase="crashed", signal="SIGSEGV", core_dumped=True, restarts=2,
                         bundle=str(bundle), last_log_line="Segmentation fault")
    snap = dataclasses.replace(base, engines=(crashed,))

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("tab", "enter")
            await wait_for(pilot, lambda: "triage:" in screen_text(app), what="triage headline")
            text = screen_text(app)
            assert "killed by SIGSEGV (core dumped)" in text and "restarts 2" in text
            assert f"triage: {headline[:60]}" in text
    run(go())



def test_a_fifo_where_the_settings_file_goes_is_ignored_not_waited_on(tmp_path):
    from gpuwarden.tui import prefs
    where = tmp_path / "tui.toml"
    os.mkfifo(where)
    loaded, note = prefs.load(where)  # a blocking open would hang the console's start here
    assert loaded == prefs.Prefs() and "not a regular file" in note


def test_the_health_line_needs_attention_while_a_registration_has_failed(settings):
    # The header reads NodeSnapshot.needs_attention, as `status` does: an engine in failed-registration is enough.
    healthy = dataclasses.replace(fixed_snapshot(), residual=(), engines=())
    assert not healthy.needs_attention()
    snap = dataclasses.replace(healthy, engines=(EngineInfo(name="dp3", gpu=3, phase="failed-registration", pid=4321),))

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: "NEEDS ATTENTION" in screen_text(app), what="the health line")
    run(go())
