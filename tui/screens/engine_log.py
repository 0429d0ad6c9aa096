"""An engine's log, following: the last lines, then new ones as the engine writes them (across rotations).

A thread reads the file; it stops when the screen closes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.screen import Screen
from rich.text import Text
from textual.widgets import Label, RichLog, Static

from gpuwarden.ops.foundation.model import EngineInfo
from gpuwarden.ops.bundle.triage_file import triage_bundle
from gpuwarden.ops.engines.logs import follow
from gpuwarden.ops.triage.render import headline

from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip


def how_it_ended(e: EngineInfo) -> Text:
    """Phase, exit signal or code, core, restarts and the crash bundle, on one or two lines."""
    t = Text()
    t.append(f"phase {e.phase}", style=S["phase.bad"] if e.phase in ("crashed", "stale") else "")
    if e.signal:
        t.append(f" · killed by {e.signal}" + (" (core dumped)" if e.core_dumped else ""), style=S["phase.bad"])
    elif e.exit_code is not None and e.phase in ("exited", "crashed"):
        t.append(f" · exit code {e.exit_code}")
    t.append(f" · restarts {e.restarts}")
    if e.bundle:
        t.append(f"\nincident bundle {e.bundle} (t opens its triage)")
    return t


def triage_headline(bundle: Path, engine: str | None = None) -> str:
    """The first line of the bundle's triage about `engine` (its crash, its failed registration, then its run's
    findings; other processes' crashes last), as `gpuwarden triage BUNDLE` says it.

    A narrow call on purpose: triage_bundle and render.headline only (the triage package evolves).
    """
    try:
        return headline(triage_bundle(bundle, engine))
    except Exception as exc:  # evidence that cannot be read must not take the view down
        return f"unreadable ({exc}); `gpuwarden triage {bundle}` says more"


class EngineLogScreen(Screen[None]):
    # q and backspace as well as Esc: a terminal holds a lone Esc back ~100 ms (ESCDELAY) in case more follows.
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back")]

    def __init__(self, name: str, log_path: str | None, info: EngineInfo | None = None):
        super().__init__()
        self.engine = name
        self.log_path = log_path
        self.info = info
        self._stop_follow = threading.Event()

    def compose(self) -> ComposeResult:
        yield Label(f"engine {self.engine} — {self.log_path or 'no log recorded'} (following)", id="log-title")
        if self.info is not None:
            yield Static(how_it_ended(self.info), id="engine-summary")
        yield RichLog(id="log", max_lines=5000, wrap=False, markup=False, highlight=False)
        yield KeyStrip([("q/esc", "Back")])

    def on_mount(self) -> None:
        if self.log_path:
            self._follow()
        else:
            self.query_one(RichLog).write("this engine has no log file recorded")
        if self.info is not None and self.info.bundle:
            self._headline(self.info.bundle)

    @work(thread=True, exclusive=True, group="engine-headline")
    def _headline(self, bundle: str) -> None:
        line = triage_headline(Path(bundle), self.engine)
        summary = how_it_ended(self.info) if self.info else Text()
        summary.append(f"\ntriage: {line}", style=S["phase.bad"] if "no problems" not in line else "")
        self.app.call_from_thread(self.query_one("#engine-summary", Static).update, summary)

    def on_unmount(self) -> None:
        self._stop_follow.set()

    @work(thread=True, exclusive=True, group="engine-log")
    def _follow(self) -> None:
        log = self.query_one(RichLog)
        for line in follow(Path(self.log_path), from_end_lines=200, poll_s=0.2,
                           keep_going=lambda: not self._stop_follow.is_set()):
            if self._stop_follow.is_set():
                return
            self.app.call_from_thread(log.write, line)
