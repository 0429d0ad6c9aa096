"""A light table for the live panels: rows of cells drawn as one Text, a cursor, keys to move it.

Textual's DataTable renders every cell through a Rich console again whenever any cell changes; at 1 Hz
with a changing VRAM column that was most of the TUI's CPU. This draws only the rows that fit.
"""

from __future__ import annotations

import textwrap
from typing import Any, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region
from textual.strip import Strip
from textual.message import Message
from textual.widget import Widget

from gpuwarden.tui.styles import STYLES as S

GAP = 2  # cells between columns


def _text(cell: Any) -> Text:
    return cell if isinstance(cell, Text) else Text(str(cell))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Text) or isinstance(b, Text):
        return isinstance(a, Text) and isinstance(b, Text) and a.plain == b.plain and a.spans == b.spans \
            and a.style == b.style
    return a == b


class RowTable(Widget, can_focus=True):
    DEFAULT_CSS = "RowTable { height: auto; width: 1fr; }"
    BINDINGS = [
        Binding("up", "move(-1)", show=False), Binding("down", "move(1)", show=False),
        Binding("pageup", "move(-10)", show=False), Binding("pagedown", "move(10)", show=False),
        Binding("home", "move(-100000)", show=False), Binding("end", "move(100000)", show=False),
        Binding("enter", "select", show=False),
    ]

    class Selected(Message):
        """Enter (or a click) on a row."""

        def __init__(self, table: "RowTable", key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> "RowTable":
            return self.table

    def __init__(self, **kw):
        super().__init__(**kw)
        self.columns: tuple[str, ...] = ()
        self.rows: list[tuple[str, list[Any]]] = []
        self.cursor_row = 0
        self._offset = 0
        self.empty_text = ""  # shown under the header when there are no rows: what to do about it
        self._drawn_widths: list[int] = []
        # (cell, width) -> Text for a last-column cell wider than its room: a table whose last column says
        # most in its middle (a command line's arguments) shortens it so; None: cut at the end.
        self.fit_last: Any = None
        self._frame: list[Text] | None = None  # the lines as Text, until the next refresh
        self._strips: dict[int, tuple[tuple[Any, ...], Strip]] = {}  # line -> (what it showed, its segments)
        self._strips_style: Any = None

    # --- data ---------------------------------------------------------------------------------
    def set_columns(self, columns: Sequence[str]) -> None:
        if tuple(columns) != self.columns:
            self.columns = tuple(columns)
            self.refresh(layout=True)

    def set_rows(self, rows: list[tuple[str, list[Any]]]) -> None:
        """Show these (key, cells) rows; the cursor stays on the same key when it is still there."""
        changed = self._changed_lines(rows)
        if changed is not None:
            self.rows = rows
            if changed:
                # Only the lines whose cells changed are drawn again: on a busy GPU its row changes every refresh,
                # and redrawing the whole panel (borders, header, every row) was most of the console's CPU.
                width = self.content_size.width
                self.refresh(*(Region(0, y, width, 1) for y in changed))
            return
        old_key = self.cursor_key()
        resized = len(rows) != len(self.rows)
        self.rows = rows
        keys = [k for k, _ in rows]
        if old_key in keys:
            self.cursor_row = keys.index(old_key)
        self.cursor_row = min(self.cursor_row, max(len(rows) - 1, 0))
        self.refresh(layout=resized)

    def _changed_lines(self, rows: list[tuple[str, list[Any]]]) -> list[int] | None:
        """The content lines (visible ones only) of the rows that differ from those shown, when every change
        keeps the table's shape: the same keys in the same order and each changed cell as wide as before, so
        no column moves. None when the shape changes and the whole table must be drawn again."""
        if len(rows) != len(self.rows):
            return None
        body = max(self.content_size.height - 1, 1)
        lines = []
        for i, ((key, cells), (old_key, old_cells)) in enumerate(zip(rows, self.rows)):
            if key != old_key or len(cells) != len(old_cells):
                return None
            row_changed = False
            for a, b in zip(cells, old_cells):
                if _same(a, b):
                    continue
                if _text(a).cell_len != _text(b).cell_len:
                    return None
                row_changed = True
            if row_changed and self._offset <= i < self._offset + body:
                lines.append(1 + i - self._offset)  # line 0 is the header
        return lines

    def set_empty_text(self, text: str) -> None:
        if text != self.empty_text:
            self.empty_text = text
            self.refresh(layout=True)

    def cursor_key(self) -> str | None:
        if not self.rows:
            return None
        return self.rows[min(self.cursor_row, len(self.rows) - 1)][0]

    # --- keys and mouse -----------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        if not self.rows:
            return
        row = min(max(self.cursor_row + int(delta), 0), len(self.rows) - 1)
        if row != self.cursor_row:
            self.cursor_row = row
            self.refresh()

    def action_select(self) -> None:
        key = self.cursor_key()
        if key is not None:
            self.post_message(self.Selected(self, key))

    def row_at(self, event: Click) -> int | None:
        """The row under a click: inside the content (border and padding do not count), below the header."""
        at = event.get_content_offset(self)
        if at is None:
            return None
        row = at.y - 1 + self._offset
        return row if 0 <= row < len(self.rows) else None

    def column_at(self, x: int) -> int | None:
        """The column drawn at content x (as last drawn), or None between or past them."""
        left = 0
        for i, w in enumerate(self._drawn_widths):
            if left <= x < left + w:
                return i
            left += w + GAP
        return None

    def header_clicked(self, column: int) -> None:
        """A click on a column's title; tables that sort override this."""

    def on_click(self, event: Click) -> None:
        at = event.get_content_offset(self)
        if at is not None and at.y == 0:
            column = self.column_at(at.x)
            if column is not None:
                self.header_clicked(column)
            return
        row = self.row_at(event)
        if row is not None:
            self.cursor_row = row
            self.refresh()
            if event.chain == 2:
                self.action_select()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # --- drawing ------------------------------------------------------------------------------
    def get_content_height(self, container, viewport, width: int) -> int:
        return max(len(self.rows), len(self._empty_lines(width))) + 1

    def _empty_lines(self, width: int) -> list[str]:
        """The empty text wrapped at word boundaries to `width` (issue 36: a sentence cut at the edge)."""
        return [part for line in self.empty_text.splitlines()
                for part in (textwrap.wrap(line, max(width, 8)) or [""])]

    def _widths(self, texts: list[list[Text]], room: int) -> list[int]:
        widths = [cell_len(c) for c in self.columns]
        for row in texts:
            for i, t in enumerate(row[: len(widths)]):
                widths[i] = max(widths[i], t.cell_len)
        if widths:
            # The last column takes what is left (long log lines): it is cut, never the others.
            fixed = sum(widths[:-1]) + GAP * (len(widths) - 1)
            widths[-1] = max(0, min(widths[-1], room - fixed))
        return widths

    def _text_lines(self) -> list[Text]:
        """The content as drawn now, one Text per line: the header, then the rows that fit (or the empty text)."""
        width, height = self.content_size.width, self.content_size.height
        body = max(height - 1, 1)
        if self.cursor_row < self._offset:
            self._offset = self.cursor_row
        elif self.cursor_row >= self._offset + body:
            self._offset = self.cursor_row - body + 1
        self._offset = max(0, min(self._offset, max(len(self.rows) - body, 0)))
        texts = [[_text(c) for c in cells] for _, cells in self.rows]
        widths = self._widths(texts, width)
        self._drawn_widths = widths
        lines = [self._line([Text(c) for c in self.columns], widths, S["table.header"])]
        if not texts and self.empty_text:
            lines += [Text(line[:width], style=S["dim"]) for line in self._empty_lines(width)[:body]]
        for i in range(self._offset, min(len(texts), self._offset + body)):
            style = ""
            if i == self.cursor_row:
                style = S["cursor.focus"] if self.has_focus else S["cursor"]
            row = texts[i]
            if self.fit_last is not None and widths and row and row[-1].cell_len > widths[-1]:
                row = [*row[:-1], self.fit_last(row[-1], widths[-1])]
            lines.append(self._line(row, widths, style))
        return lines

    # Textual's line API: each line is turned into segments here, and only when its text changed. Drawing the whole
    # table as one Text made Textual lay out and style every line again at every refresh (0.6 ms a refresh of a
    # one-GPU panel at 160 columns, on a busy GPU each second).
    def refresh(self, *regions: Any, **kw: Any) -> Any:
        self._frame = None
        return super().refresh(*regions, **kw)

    def render_line(self, y: int) -> Strip:
        frame = getattr(self, "_frame", None)
        if frame is None:
            frame = self._frame = self._text_lines()
            self._strips_style = self.rich_style
        if y >= len(frame):
            return Strip.blank(self.content_size.width, self._strips_style)
        text = frame[y]
        sign = (text.plain, text.style, text.spans, self._strips_style)
        cached = self._strips.get(y)
        if cached is not None and cached[0] == sign:
            return cached[1]
        console = self.app.console
        base = self._strips_style
        if text.style:  # Text.render leaves the line's own style out when the line has no spans
            base = base + console.get_style(text.style)
        strip = Strip(text.render(console), text.cell_len).apply_style(base)
        self._strips[y] = (sign, strip)
        return strip

    @staticmethod
    def _line(cells: list[Text], widths: list[int], style: str) -> Text:
        line = Text(style=style, no_wrap=True)
        for i, (cell, w) in enumerate(zip(cells, widths)):
            if i:
                line.append(" " * GAP)
            if cell.cell_len > w:
                cell = cell.copy()
                cell.truncate(w, overflow="ellipsis")
            line.append_text(cell)
            line.append(" " * (w - cell.cell_len))
        return line


def row_text(cells: list[Any]) -> str:
    """A row's cells as one lower-case string, what a filter looks in."""
    return " ".join(c.plain if isinstance(c, Text) else str(c) for c in cells).lower()


class FilteredRowTable(RowTable):
    """A RowTable with a text filter (`/`): only rows whose cells contain it are shown; the panel's subtitle
    says how many are hidden."""

    BINDINGS = [Binding("slash", "app.filter_table", "Filter", show=False)]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.filter_text = ""
        self.hidden = 0
        self._all: list[tuple[str, list[Any]]] = []

    def set_filter(self, value: str) -> None:
        self.filter_text = value.strip()
        self.set_rows(self._all)

    def set_rows(self, rows: list[tuple[str, list[Any]]]) -> None:
        self._all = rows
        needle = self.filter_text.lower()
        shown = [r for r in rows if needle in row_text(r[1])] if needle else rows
        self.hidden = len(rows) - len(shown)
        super().set_rows(shown)

    def filter_note(self) -> str:
        if not self.filter_text:
            return ""
        return f"/{self.filter_text}" + (f", {self.hidden} filtered out" if self.hidden else "")
