"""The confirm dialog for destructive playbooks: Cancel has the focus, so Enter alone never destroys anything.

Escape answers no as well; only moving to Proceed and pressing Enter (or clicking it) answers yes.
The plan's steps are listed above the buttons (scrollable), so nobody confirms a count of steps unseen.
"""

from __future__ import annotations

from textual.app import ComposeResult
from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from gpuwarden.tui.styles import STYLES as S


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [("escape", "cancel", "Cancel"), ("left", "app.focus_previous", ""), ("right", "app.focus_next", ""),
                ("up", "scroll_plan(-1)", ""), ("down", "scroll_plan(1)", ""),
                ("pageup", "scroll_plan(-5)", ""), ("pagedown", "scroll_plan(5)", "")]
    AUTO_FOCUS = "#cancel"

    def __init__(self, title: str, question: str, steps: list[dict] | None = None):
        super().__init__()
        self.title_text = title
        self.question = question
        self.steps = list(steps or [])

    def plan_text(self) -> Text:
        t = Text()
        for i, s in enumerate(self.steps, 1):
            if i > 1:
                t.append("\n")
            t.append(f"{i}. {s.get('description', s.get('name', '?'))}")
            if s.get("destructive"):
                t.append("  [changes the node]", style=S["phase.busy"])
        return t

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text, id="dialog-title")
            yield Label(self.question, id="question")
            if self.steps:
                with VerticalScroll(id="plan"):
                    yield Static(self.plan_text(), id="plan-steps")
                yield Label("↑ ↓ scroll the plan · ← → choose · Esc cancels", id="plan-keys")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Proceed", id="proceed", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "proceed")

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_scroll_plan(self, lines: int) -> None:
        for plan in self.query("#plan"):
            plan.scroll_relative(y=lines, animate=False)
