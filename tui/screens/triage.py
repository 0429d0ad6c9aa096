"""A bundle's triage summary (the triage.md the bundle carries on top), scrollable.

Reads the tar directly in a worker thread, so it works for any bundle file and a large one never blocks the keys.
"""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path

from gpuwarden.ops.bundle.replay import open_stream
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.safetext import printable

from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Label, Static
from gpuwarden.tui.widgets.keystrip import KeyStrip

TRIAGE_NAMES = ("triage.md", "triage.txt")
LIMIT = 512 * 1024


def triage_text(bundle: Path) -> str:
    """The triage summary inside a bundle, or a sentence that says why there is none."""
    try:
        with open_stream(bundle) as tar:  # a regular file only: a FIFO here must not hang the worker
            for member in tar:  # triage.md comes first: stop there instead of listing the whole archive
                if member.isfile() and Path(member.name).name in TRIAGE_NAMES:
                    f = tar.extractfile(member)
                    if f is not None:
                        return printable(f.read(LIMIT).decode(errors="replace"), newlines=True)
    except GpuwardenError as exc:
        return exc.message
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        return f"{bundle}: not a readable bundle ({exc})"
    return f"{bundle} has no triage summary (triage.md); run `gpuwarden triage {bundle}`"


class TriageScreen(Screen[None]):
    # q and backspace as well as Esc: a terminal holds a lone Esc back ~100 ms (ESCDELAY) in case more follows.
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back")]

    def __init__(self, bundle: Path):
        super().__init__()
        self.bundle = bundle

    def compose(self) -> ComposeResult:
        yield Label(f"triage of {self.bundle}", id="triage-title")
        with VerticalScroll(id="triage"):
            yield Static("reading the bundle…", markup=False, id="triage-text")
        yield KeyStrip([("q/esc", "Back")])

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="triage")
    def _load(self) -> None:
        body = triage_text(self.bundle)
        self.app.call_from_thread(self.query_one("#triage-text", Static).update, body)
