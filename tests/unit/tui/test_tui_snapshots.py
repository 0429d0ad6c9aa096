"""Screen snapshots of the TUI at 80x24 and 160x48 from a fixed NodeSnapshot (fixed host, clock and UTC).

Regenerate after a deliberate change with: pytest tests/unit/tui/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest
from helpers.tui_support import make_app, screen_text, wait_for


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def first_snapshot(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.snapshot is not None, what="first snapshot")
    await pilot.pause()  # the snapshot's draw done before the picture


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen(snap_compare, settings, size):
    assert snap_compare(make_app(settings), terminal_size=size, run_before=first_snapshot)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen_read_only(snap_compare, settings, size):
    assert snap_compare(make_app(settings, read_only=True), terminal_size=size, run_before=first_snapshot)


def test_gpu_detail_80x24(snap_compare, settings):
    async def open_detail(pilot):
        await first_snapshot(pilot)
        await pilot.press("down", "enter")
        # The view's charts are built in a worker: the picture is taken once they are drawn.
        await wait_for(pilot, lambda: pilot.app.screen.query_one("#charts").settled(), what="the charts")
        await pilot.pause()
    assert snap_compare(make_app(settings), terminal_size=(80, 24), run_before=open_detail)


def test_help_80x24(snap_compare, settings):
    async def open_help(pilot):
        await first_snapshot(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys" in screen_text(pilot.app), what="the help")
    assert snap_compare(make_app(settings), terminal_size=(80, 24), run_before=open_help)
