"""The confirm dialog for destructive playbooks: Cancel has the focus, so Enter alone never destroys anything.

Escape answers no as well; only moving to Proceed and pressing Enter (or clicking it) answers yes.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [("escape", "cancel", "Cancel"), ("left", "app.focus_previous", ""), ("right", "app.focus_next", "")]
    AUTO_FOCUS = "#cancel"

    def __init__(self, title: str, question: str):
        super().__init__()
        self.title_text = title
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text, id="dialog-title")
            yield Label(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Proceed", id="proceed", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "proceed")

    def action_cancel(self) -> None:
        self.dismiss(False)
