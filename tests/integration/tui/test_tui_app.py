"""The TUI under Textual's Pilot: header, panels, read-only, stale data, confirm dialog, and every action.

Actions run against real supervised engines (fake_engine under real shims) on the simulated node.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engines.harness import records, supervised, write_config  # noqa: F401
from helpers.tui_support import fixed_snapshot, make_app, screen_text, wait_for

from gpuwarden.ops.foundation import journal
from helpers.tui_app import live_app, sim_settings

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


def test_hung_backend_marks_data_stale_and_keys_still_work(settings):
    release = threading.Event()
    calls = []

    def source():
        calls.append(time.monotonic())
        if len(calls) > 1:
            release.wait(20)  # the second call hangs like a wedged GPU driver
        return fixed_snapshot(taken_at=time.time())

    async def go():
        app = make_app(settings, source=source, refresh_s=0.25)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await wait_for(pilot, lambda: "STALE" in screen_text(app), timeout=5, what="stale mark")
            assert app.query_one("#gpus").has_class("stale")
            await wait_for(pilot, lambda: "stale: " in str(app.query_one("#engines").border_subtitle), what="age")
            assert "4 engine(s) · stale: " in screen_text(app)
            t0 = time.monotonic()
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: "Keys" in screen_text(app), timeout=2, what="help while hung")
            # Far inside the 20 s the call hangs for: the keys never waited on it (no tighter: a busy box).
            assert time.monotonic() - t0 < 5.0
            await pilot.press("escape")
            assert len(calls) == 2  # the hung call was never overlapped by another
            release.set()
            await wait_for(pilot, lambda: "STALE" not in screen_text(app), timeout=5, what="fresh data")
            assert not app.query_one("#gpus").has_class("stale") and "stale: " not in screen_text(app)
    run(go())


def test_sampling_never_overlaps_itself(settings):
    active, peak, count = [0], [0], [0]
    lock = threading.Lock()

    def slow():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.3)  # slower than the refresh interval
        with lock:
            active[0] -= 1
            count[0] += 1
        return fixed_snapshot(taken_at=time.time())

    async def go():
        app = make_app(settings, source=slow, refresh_s=0.25)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: count[0] >= 3, timeout=10)
    run(go())
    assert peak[0] == 1


def test_engine_log_follows_new_lines(settings, tmp_path):
    from gpuwarden.ops.foundation.model import EngineInfo
    log = tmp_path / "engine.log"
    log.write_text("first line\n")
    base = fixed_snapshot()
    snap = base.__class__(**{**base.__dict__, "engines": (EngineInfo(name="e9", gpu=0, phase="serving", pid=1,
                                                                     log_path=str(log)),)})

    async def go():
        app = make_app(settings, source=lambda: snap)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("tab", "enter")
            await wait_for(pilot, lambda: "first line" in screen_text(app), what="log tail")
            with open(log, "a") as f:
                f.write("second line arrives\n")
            await wait_for(pilot, lambda: "second line arrives" in screen_text(app), what="followed line")
            await pilot.press("escape")
    run(go())


def test_triage_view_cites_the_known_issues_a_bundle_matches(tmp_path, monkeypatch, fixtures):
    import os

    from gpuwarden.ops.bundle.collect import collect_bundle
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = fixtures.parent / "triage_corpus/c32_ogkm446_ctime_xid119_gsp_rpc_timeout_nvidia_smi.log"
    (bindir / "dmesg").write_text(f"#!/bin/sh\ncat {log}\n")
    (bindir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    settings = sim_settings(tmp_path / "state")
    bundle = collect_bundle(settings, output=tmp_path, timeout_s=5).path

    async def go():
        app = make_app(settings, bundle=bundle)
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("t")
            await wait_for(pilot, lambda: "Known issues that match" in screen_text(app)
                           and "nvidia-gsp-rpc-timeout-xid119" in screen_text(app), what="known issues in triage")
    run(go())


# --- actions against real supervised engines -----------------------------------------------------

def test_launch_then_stop_engine_with_confirm(tmp_path, supervised):  # noqa: F811
    cfg = write_config(tmp_path / "node.toml", 2, register_s=0.1)
    settings = sim_settings(supervised, cfg)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("l")
            await wait_for(pilot, lambda: app.current_run is not None and not app.current_run.running,
                           timeout=30, what="launch to finish")
            assert app.current_run.result.ok, [e.to_dict() for e in app.current_run.events]
            # The outcome: "done" alone when the playbook has no summary of its own (it said "done: done").
            await wait_for(pilot, lambda: "finished: ok" in screen_text(app), what="outcome on the progress view")
            assert "done: done" not in screen_text(app)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.snapshot and sum(e.phase == "serving" for e in app.snapshot.engines) == 2,
                           timeout=10, what="engines serving in the panel")
            engines = app.query_one("#engines")
            engines.focus()
            await wait_for(pilot, lambda: app.focused is engines and engines.selected() is not None, what="an engine")
            name = engines.selected().name
            pid = records(supervised)[name]["pid"]

            await pilot.press("s")  # destructive: asks, Cancel focused
            await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="dialog")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not app.current_run.running, what="cancelled run")
            assert app.current_run.result.refused == "cancelled"
            assert records(supervised)[name]["phase"] == "serving"
            await pilot.press("escape")

            await pilot.press("s")
            await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="dialog")
            await pilot.press("right", "enter")
            await wait_for(pilot, lambda: not app.current_run.running, timeout=20, what="stop to finish")
            assert app.current_run.result.ok
            assert records(supervised)[name]["phase"] == "exited"
            await pilot.press("escape")
            await wait_for(pilot, lambda: f"engine {name}: serving → exited" in screen_text(app)
                           or f"stop/stop:{name}" in screen_text(app), what="event line")
            return name, pid

    name, pid = run(go())
    import os
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    entries = list(journal.read(supervised))
    actions = [(e.get("action"), e.get("result")) for e in entries]
    assert ("stop", "cancelled") in actions, actions
    assert ("engine-stop", "ok") in actions and (f"stop:stop:{name}", "ok") in actions, actions


def test_an_open_console_follows_a_sim_node_rebuilt_in_another_shell(state_dir, cli):
    """`sim scenario residual` in another shell rebuilds the sim tree: the console holds the old files open and
    must find the new ones (as after a driver reload), not keep showing 0.0/24Gi."""
    settings = sim_settings(state_dir)

    async def go():
        app = live_app(settings, read_only=True)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            assert app.snapshot.gpu(2).vram_used == 0
            proc = await asyncio.to_thread(cli, "--backend", "sim", "sim", "scenario", "residual")
            assert proc.returncode == 0, proc.stderr
            await wait_for(pilot, lambda: app.snapshot.gpu(2).vram_used == 14 << 30, timeout=30,
                           what="GPU 2's 14 GiB in the open console")
            await wait_for(pilot, lambda: "14.0/24Gi" in screen_text(app), what="the GPUs panel to show it")
    try:
        run(go())
    finally:
        cli("--backend", "sim", "sim", "scenario", "clean")
