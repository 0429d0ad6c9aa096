"""The served console's side of a browser session: it ends when `gpuwarden serve` closes its input or dies.

Textual's web driver stops reading at end of input and leaves the app running with nobody to draw for.
"""

from __future__ import annotations

import ctypes
import os
import signal

from textual import messages
from textual.drivers.web_driver import WebDriver

SERVE_PID_ENV = "GPUWARDEN_SERVE_PID"  # set by `serve` for its consoles: the process they must not outlive
PR_SET_PDEATHSIG = 1  # include/uapi/linux/prctl.h


def die_with_serve() -> None:
    """In a console `serve` started: ask the kernel for SIGKILL when serve goes, however it goes.

    Called first thing in the console. serve forks its consoles from its event-loop thread, its main thread, so
    the death signal (which follows the forking *thread*) follows serve's own life. serve may have died before
    the prctl: then the parent is already someone else, and the console leaves at once."""
    expected = os.environ.pop(SERVE_PID_ENV, "")  # not for what the console starts in turn
    if not expected.isdigit():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: serve's own stop and process-group kill still end the console
    if os.getppid() != int(expected):
        os._exit(0)


class ServedWebDriver(WebDriver):
    """Textual's web driver, plus: end of input (serve closed the session, or died) ends the app."""

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        finally:
            if not self.exit_event.is_set():  # not our own exit: the other side went away
                self._app.post_message(messages.ExitApp())
