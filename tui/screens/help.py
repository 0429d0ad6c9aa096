"""The key list that `?` opens: every key the main screen has right now (none of the actions when read-only).

A full screen rather than a dialog: a dialog over the live panels costs a slow machine a noticeable pause.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Label, Static


class HelpScreen(Screen[None]):
    BINDINGS = [("escape", "close", "Close"), ("question_mark", "close", "Close"), ("q", "close", "Close")]

    def __init__(self, keys: list[tuple[str, str]], note: str = "", marks: tuple[tuple[str, str], ...] = ()):
        super().__init__()
        self.keys = keys
        self.note = note
        self.marks = marks  # what the GPU table's last column shows

    def listing(self) -> Table:
        """Every key, then every mark, each description wrapped to the box's width: never cut (issue 36)."""
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(ratio=1, overflow="fold")
        grid.add_row("KEY", "WHAT IT DOES", style="dim")
        for key, what in self.keys:
            grid.add_row(key, what)
        if self.marks:
            grid.add_row("", "")
            grid.add_row("MARK", "IN THE GPU TABLE'S LAST COLUMN", style="dim")
            for mark, what in self.marks:
                grid.add_row(Text(mark), what)
        return grid

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(f"Keys ({len(self.keys)}; the list scrolls)", id="help-title")
            with VerticalScroll(id="help-keys"):
                yield Static(self.listing(), id="help-list")
            if self.note:
                yield Label(self.note, id="help-note")
            yield Label("↑ ↓ PgUp PgDn scroll this list · Esc, ? or q closes it", id="help-scroll")

    def on_mount(self) -> None:
        self.query_one("#help-keys").focus()  # the arrows and pages scroll the list

    def action_close(self) -> None:
        self.app.pop_screen()
