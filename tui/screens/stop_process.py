"""The dialog before k stops a process: what it is, and how — Cancel (focused), TERM then KILL, or KILL now.

Enter alone never stops anything; Escape cancels too.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpuwarden.ops.foundation.model import GpuProcess

from gpuwarden.tui import text


class StopProcessScreen(ModalScreen[str | None]):
    """Answers "TERM", "KILL" or None (cancelled)."""

    BINDINGS = [("escape", "cancel", "Cancel"), ("left", "app.focus_previous", ""), ("right", "app.focus_next", "")]
    AUTO_FOCUS = "#cancel"

    def __init__(self, process: GpuProcess, grace_s: float):
        super().__init__()
        self.process = process
        self.grace_s = grace_s

    def compose(self) -> ComposeResult:
        p = self.process
        gpus = ",".join(map(str, sorted(p.vram))) or "device files only"
        with Vertical(id="dialog"):
            yield Label(f"Stop pid {p.pid}", id="dialog-title")
            yield Label(f"{text.command_line(p.command, 120)}\nuser {p.user or '?'}, {p.state}, GPU {gpus}, "
                        f"{text.size(sum(p.vram.values())) if p.vram else 'no VRAM'}\n"
                        f"TERM asks it to exit and sends KILL after {self.grace_s:g}s; KILL ends it at once. "
                        "Its PID and start time are checked again first.", id="question")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("TERM, then KILL", id="term", variant="warning")
                yield Button("KILL now", id="kill", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss({"term": "TERM", "kill": "KILL"}.get(event.button.id or ""))

    def action_cancel(self) -> None:
        self.dismiss(None)
