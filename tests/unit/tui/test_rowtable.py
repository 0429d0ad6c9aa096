"""The live panels' table: a change that keeps every column's width redraws only its own line; one that moves a
column, or adds a row, redraws the table. Either way the screen shows the new values."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult

from gpuwarden.tui.widgets.rowtable import RowTable

ROWS = [("0", ["0", "GPU zero", "55%", "633W"]), ("1", ["1", "GPU one", "12%", "90W"]),
        ("2", ["2", "GPU two", "0%", "75W"])]


class _TableApp(App):
    CSS = "RowTable { border: round white; height: 6; }"

    def compose(self) -> ComposeResult:
        yield RowTable(id="t")


def _with(rows: list, row: int, col: int, value: str) -> list:
    out = [(k, list(cells)) for k, cells in rows]
    out[row][1][col] = value
    return out


def _dirty_heights(table: RowTable) -> list[int]:
    return sorted(r.height for r in table._repaint_regions)


def _screen_text(app: App) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def test_a_same_width_change_redraws_its_line_only_and_a_wider_one_the_table():
    async def scenario() -> None:
        app = _TableApp()
        async with app.run_test(size=(60, 10)) as pilot:
            table = app.query_one(RowTable)
            table.set_columns(["GPU", "NAME", "BUSY", "POWER"])
            table.set_rows(ROWS)
            await pilot.pause()
            table._repaint_regions.clear()

            table.set_rows(_with(ROWS, 1, 2, "48%"))  # same width: row 1's line only (the header is line 0)
            assert _dirty_heights(table) == [1]
            assert [r.y for r in table._repaint_regions] == [table.content_offset.y + 2]
            await pilot.pause()
            assert "48%" in _screen_text(app) and "12%" not in _screen_text(app)

            table._repaint_regions.clear()
            table.set_rows(_with(_with(ROWS, 1, 2, "48%"), 0, 3, "1000W"))  # wider: the whole table
            assert _dirty_heights(table) == [table.outer_size.height]
            await pilot.pause()
            assert "1000W" in _screen_text(app)

            table._repaint_regions.clear()
            table.set_rows(_with(_with(ROWS, 1, 2, "48%"), 0, 3, "1000W"))  # nothing changed: nothing drawn
            assert _dirty_heights(table) == []

            table.set_rows(ROWS[:2])  # a row gone: the whole table again
            await pilot.pause()
            assert "GPU two" not in _screen_text(app)

    asyncio.run(scenario())
