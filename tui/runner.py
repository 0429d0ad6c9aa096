"""Runs one playbook in a thread with the framework's own run(): events go to the app, confirmation to a dialog.

The runner blocks its own thread (never the event loop) while the operator answers the confirm dialog.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gpuwarden.playbooks.framework import Event, Playbook, Result, run

from gpuwarden.tui.messages import PlaybookFinished, PlaybookProgress
from gpuwarden.tui.screens.confirm import ConfirmScreen
from gpuwarden.playbooks.signalplan import describe_entries

if TYPE_CHECKING:
    from textual.app import App

    from gpuwarden.ops.foundation.settings import Settings


class PlaybookRun:
    def __init__(self, app: "App", playbook: Playbook, settings: "Settings", title: str, *, confirmed: bool = False):
        self.app = app
        self.confirmed = confirmed  # the operator already said yes in a dialog of the action's own
        self.playbook = playbook
        self.settings = settings
        self.title = title
        self.cancelled = threading.Event()
        self.events: list[Event] = []
        self.result: Result | None = None
        # Until the operator answers the confirm dialog nothing runs, and the view behind must not say so.
        self.asking = bool(getattr(playbook, "destructive", False)) and not confirmed
        self._thread = threading.Thread(target=self._main, name=f"playbook-{playbook.name}", daemon=True)

    @property
    def running(self) -> bool:
        return self.result is None

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self.result = run(self.playbook, self.settings, sink=self._sink, confirm=self._confirm,
                              assume_yes=self.confirmed, cancelled=self.cancelled)
        except Exception as exc:  # run() catches expected failures; anything else must still end the run
            event = Event("done", self.playbook.name, None, f"{type(exc).__name__}: {exc}", {"ok": False})
            self._sink(event)
            self.result = Result(ok=False, events=self.events, failed_step="(runner)")
        self.app.post_message(PlaybookFinished(self))

    def _sink(self, event: Event) -> None:
        self.events.append(event)
        self.app.post_message(PlaybookProgress(self, event))

    def _confirm(self, question: str) -> bool:
        planned = next((e for e in reversed(self.events) if e.kind == "planned"), None)
        steps = list(planned.data.get("steps", [])) if planned is not None else []
        if planned is not None and planned.data.get("signals"):
            steps += [{"signal": line} for line in describe_entries(planned.data["signals"])]
        self.asking = True
        try:
            return ask_in_dialog(self.app, self.title, question, self.cancelled, steps)
        finally:
            self.asking = False  # the next event (a step starting, or done) redraws the view behind


def ask_in_dialog(app: "App", title: str, question: str, cancelled: threading.Event,
                  steps: list[dict] | None = None) -> bool:
    """Ask in the confirm dialog (Cancel is the default) from a worker thread; blocks that thread only.

    `steps` (the plan event's) are listed in the dialog, so the operator sees what Proceed does."""
    answered = threading.Event()
    answer: list[bool] = []

    def done(ok: bool | None) -> None:
        answer.append(bool(ok))
        answered.set()

    try:
        # Built on the event loop's thread, like every widget.
        app.call_from_thread(lambda: app.push_screen(ConfirmScreen(title, question, steps), done))
    except RuntimeError:
        return False  # the app is gone: nobody said yes
    while not answered.wait(0.2):
        if cancelled.is_set() or not app.is_running:
            return False
    return answer[0]
