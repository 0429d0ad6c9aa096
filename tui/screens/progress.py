"""The progress view of a running playbook: its plan, each step as it starts and ends, and the outcome.

Escape hides it while the playbook goes on (its steps stay in the Events panel); c asks it to stop after the current step.
While the confirm dialog asks, this view draws nothing (the dialog stands alone) and offers no c: nothing runs yet.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from gpuwarden.playbooks.framework import Event
from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip
from gpuwarden.tui.keyhints import with_keys
from gpuwarden.playbooks.signalplan import describe_entries

MARK = {"step_ok": ("ok", S["phase.good"]), "step_failed": ("FAILED", S["phase.bad"]),
        "step_skipped": ("skipped", S["phase.busy"])}


def event_line(event: Event) -> Text:
    if event.kind != "planned":  # hints name the console's keys, not commands to paste into a shell
        event = Event(event.kind, event.playbook, event.step, with_keys(event.message), event.data, event.ts)
    t = Text()
    if event.kind == "planned":
        t.append(event.message, style="bold")
        for i, s in enumerate(event.data.get("steps", []), 1):
            t.append(f"\n  {i}. {s['description']}")
            if s.get("destructive"):
                t.append("  [changes the node]", style=S["phase.busy"])
        if event.data.get("signals"):
            t.append("\n  processes it may signal:", style="bold")
            for line in describe_entries(event.data["signals"]):
                t.append(f"\n    - {line}")
    elif event.kind == "step_started":
        t.append(f"→ {event.message}")
    elif event.kind in MARK:
        word, style = MARK[event.kind]
        t.append(f"  {word}: ", style=style)
        t.append(event.message)
        secs = event.data.get("seconds")
        if isinstance(secs, (int, float)):
            t.append(f" ({secs:.1f}s)", style="dim")
    elif event.kind == "info":
        t.append(f"  · {event.message}")
    elif event.kind == "done":
        ok = event.data.get("ok")
        # A playbook without a summary of its own finishes with plain "done": not "done: done".
        words = ("done" if event.message in ("", "done") else f"done: {event.message}") if ok \
            else f"not done: {event.message}"
        t.append(words, style=S["phase.good"] if ok else S["phase.bad"])
    return t


class ProgressScreen(ModalScreen[None]):
    BINDINGS = [("escape", "close", "Hide"), ("c", "cancel_run", "Stop after this step")]

    def __init__(self, run):
        super().__init__()
        self.run = run

    def compose(self) -> ComposeResult:
        with Vertical(id="progress"):
            yield Label(self.run.title, id="progress-title")
            with VerticalScroll(id="progress-log"):
                yield Static("", id="progress-lines")
            yield Label("", id="progress-state")
        # Two strips, one shown: keys are fixed for a strip's life (widgets/keystrip.py), and c means something only
        # while a step may run.
        yield KeyStrip([("esc", "Hide"), ("c", "Stop after this step")], id="keys-running")
        yield KeyStrip([("esc", "Hide")], id="keys-idle")

    def on_mount(self) -> None:
        self.refresh_lines()

    def refresh_lines(self) -> None:
        t = Text()
        for i, e in enumerate(self.run.events):
            if i:
                t.append("\n")
            t.append_text(event_line(e))
        lines = self.query("#progress-lines")
        if not lines:
            return  # not composed yet: on_mount draws it
        asking = self.run.result is None and getattr(self.run, "asking", False)
        self.query_one("#progress").display = not asking
        self.query_one("#keys-running").display = self.run.result is None and not asking
        self.query_one("#keys-idle").display = not self.query_one("#keys-running").display
        lines.first(Static).update(t)
        self.query_one("#progress-log", VerticalScroll).scroll_end(animate=False)
        state = self.query_one("#progress-state", Label)
        if self.run.result is None and getattr(self.run, "asking", False):
            state.update("waiting for your answer: nothing has run yet")
        elif self.run.result is None:
            state.update("running… (Esc hides this view, c stops after the current step)")
        else:
            state.update("finished: " + ("ok" if self.run.result.ok else f"exit {self.run.result.exit_code}")
                         + " — Esc to close")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_cancel_run(self) -> None:
        if self.run.result is not None or getattr(self.run, "asking", False):
            return  # finished, or nothing started yet: the strip offers no c then
        self.run.cancel()
        self.notify("stop requested: the playbook ends after the current step")
