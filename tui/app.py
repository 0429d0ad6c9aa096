"""The gpuwarden Textual application (placeholder until the TUI issue lands).

Shows the backend in use and the snapshot as text.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static

from ops.settings import Settings


class GpuwardenApp(App):
    TITLE = "gpuwarden"
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self, settings: Settings):
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("gpuwarden — loading…", id="body")
        yield Footer()
