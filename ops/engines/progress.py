"""An engine's phase, followed from its status protocol lines or from its log lines matching patterns.

The shim feeds it; it answers "which phase now, and when did each phase start".
"""

from __future__ import annotations

import re
import time

from ops.status_protocol import PHASES, StatusEvent

# Phases an engine may report that mean it finished registering.
REGISTERED_OR_LATER = ("registered", "serving")


class Progress:
    def __init__(self, registered_pattern: str | None = None, ready_pattern: str | None = None):
        self.registered_re = re.compile(registered_pattern) if registered_pattern else None
        self.ready_re = re.compile(ready_pattern) if ready_pattern else None
        self.phase = "starting"
        self.since: dict[str, float] = {"starting": time.time()}
        self.data: dict[str, object] = {}

    @property
    def registered(self) -> bool:
        return self.phase in REGISTERED_OR_LATER

    def _move(self, phase: str, ts: float) -> bool:
        if phase == self.phase:
            return False
        # Never step back from serving to registered because a log line came late.
        if self.phase == "serving" and phase == "registered":
            return False
        self.phase = phase
        self.since.setdefault(phase, ts)
        return True

    def on_event(self, event: StatusEvent) -> bool:
        """Apply a status protocol event; True when the phase changed."""
        if event.phase not in PHASES or event.phase == "exited":
            return False
        if event.data:
            self.data.update({k: v for k, v in event.data.items() if k != "pid"})
        return self._move(event.phase, event.ts)

    def on_line(self, line: str) -> bool:
        """Apply one log line; True when a pattern moved the phase."""
        now = time.time()
        if self.ready_re is not None and self.ready_re.search(line):
            if "registered" not in self.since and self.registered_re is not None:
                self.since["registered"] = now
            return self._move("serving", now)
        if self.registered_re is not None and self.registered_re.search(line) and not self.registered:
            self._move("registered", now)
            if self.ready_re is None:
                # Nothing else will say it is ready: registered is as far as we can see.
                self._move("serving", now)
            return True
        return False
