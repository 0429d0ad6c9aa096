"""Which of the agent's files cannot be written right now (a full or read-only state dir), said once a sink.

The agent keeps sampling and serving from memory while a sink fails; the operator gets one line when a sink
starts failing and one when it works again, never a line a second, and /healthz lists what is failing.
"""

from __future__ import annotations

import threading
from typing import Callable


class WriteWatch:
    """Owned by the agent; History and EventLog report each write's outcome to it."""

    def __init__(self, log: Callable[[str, str], None]):
        self._log = log
        self._failing: dict[str, str] = {}  # sink -> what went wrong, while it does
        self._lock = threading.Lock()

    def failed(self, sink: str, path: object, exc: Exception) -> None:
        why = getattr(exc, "strerror", None) or getattr(exc, "message", None) or str(exc)
        with self._lock:
            first = sink not in self._failing
            self._failing[sink] = f"{path}: {why}"
        if first:
            self._log("error", f"{sink}: writing {path} failed ({why}); the agent keeps it in memory and serves on, "
                               "and tries again with the next write: free space in the state dir or make it writable")

    def ok(self, sink: str) -> None:
        if sink not in self._failing:  # the common case: no lock taken
            return
        with self._lock:
            was = self._failing.pop(sink, None)
        if was is not None:
            self._log("info", f"{sink}: writing works again")

    def failing(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failing)


def ignore(log: Callable[[str, str], None] | None = None) -> WriteWatch:
    """A watch for readers that never write (the history command reading the trend)."""
    return WriteWatch(log or (lambda level, text: None))
