"""An engine's log, following: the last lines, then new ones as the engine writes them (across rotations).

A thread reads the file; it stops when the screen closes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Label, RichLog
from ..widgets.keystrip import KeyStrip


class EngineLogScreen(Screen[None]):
    # q and backspace as well as Esc: a terminal holds a lone Esc back ~100 ms (ESCDELAY) in case more follows.
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back")]

    def __init__(self, name: str, log_path: str | None):
        super().__init__()
        self.engine = name
        self.log_path = log_path
        self._stop_follow = threading.Event()

    def compose(self) -> ComposeResult:
        yield Label(f"engine {self.engine} — {self.log_path or 'no log recorded'} (following)", id="log-title")
        yield RichLog(id="log", max_lines=5000, wrap=False, markup=False, highlight=False)
        yield KeyStrip([("q/esc", "Back")])

    def on_mount(self) -> None:
        if self.log_path:
            self._follow()
        else:
            self.query_one(RichLog).write("this engine has no log file recorded")

    def on_unmount(self) -> None:
        self._stop_follow.set()

    @work(thread=True, exclusive=True, group="engine-log")
    def _follow(self) -> None:
        from ops.engines.logs import follow
        log = self.query_one(RichLog)
        for line in follow(Path(self.log_path), from_end_lines=200, poll_s=0.2,
                           keep_going=lambda: not self._stop_follow.is_set()):
            if self._stop_follow.is_set():
                return
            self.app.call_from_thread(log.write, line)
