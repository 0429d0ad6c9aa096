"""What several test files share with test_tui_actions.py: select_gpu.

Taken out of test_tui_actions.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations


async def select_gpu(app, pilot, gpu: int) -> None:
    table = app.query_one("#gpus")
    table.focus()
    await pilot.press("home", *(["down"] * gpu))
    assert table.selected_gpu() == gpu
