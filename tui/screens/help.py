"""The key list that `?` opens: every key the main screen has right now (none of the actions when read-only).

A full screen rather than a dialog: a dialog over the live panels costs a slow machine a noticeable pause.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label


class HelpScreen(Screen[None]):
    BINDINGS = [("escape", "close", "Close"), ("question_mark", "close", "Close"), ("q", "close", "Close")]

    def __init__(self, keys: list[tuple[str, str]], note: str = ""):
        super().__init__()
        self.keys = keys
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label(f"Keys ({len(self.keys)}; the list scrolls)", id="help-title")
            table = DataTable(show_cursor=False, id="help-keys")
            yield table
            if self.note:
                yield Label(self.note, id="help-note")
            yield Label("↑ ↓ PgUp PgDn scroll this list · Esc, ? or q closes it", id="help-scroll")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("KEY", "WHAT IT DOES")
        for key, what in self.keys:
            table.add_row(key, what)

    def action_close(self) -> None:
        self.app.pop_screen()
