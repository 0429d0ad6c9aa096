"""The TUI's pure pieces: bars, sparklines, durations, VRAM history, and events derived from snapshot diffs."""

from __future__ import annotations

import dataclasses

from helpers.tui_support import GIB, TAKEN_AT, fixed_snapshot

from gpuwarden.ops.foundation.model import EngineInfo, Residual
from gpuwarden.tui import node_events, text
from gpuwarden.tui.history import VramHistory


def test_bar_fills_in_proportion_and_marks_the_residual_part():
    b = text.bar(12 * GIB, 24 * GIB, 10)
    assert b.plain == "█" * 5 + "░" * 5
    b = text.bar(20 * GIB, 24 * GIB, 12, residual=6 * GIB)
    assert b.plain.count("█") == 10 and b.plain.count("░") == 2
    residual_cells = sum(s.end - s.start for s in b.spans if "red" in str(s.style))
    assert residual_cells == 3
    assert text.bar(None, 24 * GIB, 8).plain.strip() == "-"


def test_sparkline_keeps_the_newest_and_pads_the_left():
    assert text.sparkline([0.0, 0.5, 1.0], 5) == "  ▁▅█"
    assert text.sparkline([1.0] * 30, 4) == "████"
    assert text.sparkline([], 3) == "   "


def test_duration_drops_seconds_after_the_first_minute():
    assert [text.duration(s) for s in (5, 59, 61, 3599, 3600 + 240, 2 * 86400 + 3600)] == \
        ["5s", "59s", "1m", "59m", "1h04m", "2d01h"]
    assert text.duration(None) == "-"


def test_history_keeps_the_peak_per_bucket_and_only_the_last_buckets():
    h = VramHistory(bucket_s=15, keep=3)
    snap = fixed_snapshot()
    start = 15 * 1000
    gpu0 = snap.gpus[0]
    for i, used in enumerate([4, 9, 2, 6, 1, 8, 3, 5]):  # two samples per bucket
        gpus = (dataclasses.replace(gpu0, vram_used=used * GIB, vram_total=10 * GIB),)
        h.add(dataclasses.replace(snap, taken_at=start + i * 7.5, gpus=gpus))
    assert [round(x, 1) for x in h.series(0)] == [0.6, 0.8, 0.5]
    assert h.span_s == 45
    h.add(dataclasses.replace(snap, taken_at=start + 100, gpus=snap.gpus[1:]))
    assert h.series(0) == []  # a GPU that disappeared has no history


def test_first_snapshot_reports_crash_and_residual():
    events = node_events.diff(None, fixed_snapshot())
    texts = [e.text for e in events]
    assert texts[0].startswith("watching node-a17: 4 GPU(s) via sim (SIMULATED)")
    assert "engine dp1 crashed: SIGSEGV (core dumped)" in texts
    assert any("GPU 1: residual VRAM 14.0 GiB appeared; 1 holder(s)" in t for t in texts)


def test_diff_names_phase_changes_crashes_restarts_drains_and_cleared_residual():
    before = fixed_snapshot()
    engines = list(before.engines)
    engines[0] = dataclasses.replace(engines[0], phase="crashed", signal="SIGSEGV", core_dumped=False, restarts=1)
    engines[2] = dataclasses.replace(engines[2], phase="serving")
    residual = tuple(Residual(gpu_index=r.gpu_index, device_used=r.device_used, accounted=r.accounted,
                              baseline=r.baseline, residual=0, holders=(), significant=False)
                     for r in before.residual)
    after = dataclasses.replace(before, taken_at=TAKEN_AT + 1, engines=tuple(engines), residual=residual,
                                drained=(2,))
    got = {(e.level, e.text) for e in node_events.diff(before, after)}
    assert ("error", "engine dp0 crashed: SIGSEGV") in got
    assert ("warning", "engine dp0 restarted (restart 1)") in got
    assert ("ok", "engine dp2: registering → serving") in got
    assert ("ok", "GPU 1: residual VRAM cleared") in got
    assert ("warning", "GPU 2 drained") in got and ("ok", "GPU 3 back in service (undrained)") in got
    assert node_events.diff(after, after) == []


def test_new_engine_and_removed_engine():
    before = fixed_snapshot()
    new = EngineInfo(name="dp9", gpu=0, phase="starting")
    after = dataclasses.replace(before, engines=before.engines[1:] + (new,))
    texts = [e.text for e in node_events.diff(before, after)]
    assert "engine dp9 on GPU 0: starting" in texts and "engine dp0 removed" in texts


def test_playbook_events_become_panel_lines():
    from gpuwarden.playbooks.framework import Event
    assert node_events.from_playbook(Event("step_started", "drain", "mark")) is None
    line = node_events.from_playbook(Event("step_failed", "reset", "verify", "GPU 0 still holds 2 GiB"))
    assert line.level == "error" and line.text == "reset/verify: GPU 0 still holds 2 GiB"
    done = node_events.from_playbook(Event("done", "purge", None, "done", {"ok": True}))
    assert done.level == "ok" and done.text == "purge: done"


def test_new_warnings_become_events_once_but_not_the_simulated_label():
    before = dataclasses.replace(fixed_snapshot(), warnings=("SIMULATED node: no real GPU was found",))
    after = dataclasses.replace(before, taken_at=TAKEN_AT + 1,
                                warnings=before.warnings + ("engine state unreadable: bad json",))
    assert [(e.level, e.text) for e in node_events.diff(before, after)] == \
        [("warning", "engine state unreadable: bad json")]
    assert not any("SIMULATED node" in e.text for e in node_events.diff(None, before))
    assert node_events.diff(after, after) == []
