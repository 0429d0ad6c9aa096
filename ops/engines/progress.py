"""An engine's phase, followed from its status protocol lines or from its log lines matching patterns.

The shim feeds it; it answers "which phase now, and when did each phase start".
"""

from __future__ import annotations

import re
import time

from gpuwarden.ops.foundation.model import FAILED_REGISTRATION
from gpuwarden.ops.foundation.status_protocol import PHASES, StatusEvent

# Phases an engine may report that mean it finished registering.
REGISTERED_OR_LATER = ("registered", "serving")
# FAILED_REGISTRATION: a registration call returned an error. The engine may go on (most ignore the result) but uses
# memory it could not register; it stays so, whatever the engine prints, until a registration succeeds or it stops.
_LEAVES_FAILED = ("registered", "stopping", "exited")


class Progress:
    def __init__(self, registered_pattern: str | None = None, ready_pattern: str | None = None,
                 serving_when_registered: bool = False):
        self.registered_re = re.compile(registered_pattern) if registered_pattern else None
        self.ready_re = re.compile(ready_pattern) if ready_pattern else None
        # An engine whose registration the interposer reports, with nothing to say when it serves.
        self.serving_when_registered = serving_when_registered
        self.phase = "starting"
        self.since: dict[str, float] = {"starting": time.time()}
        self.data: dict[str, object] = {}
        self.ready_seen = False  # ready_pattern matched (while failed-registration too)

    @property
    def registered(self) -> bool:
        return self.phase in REGISTERED_OR_LATER

    def _move(self, phase: str, ts: float) -> bool:
        if phase == self.phase:
            return False
        if self.phase == FAILED_REGISTRATION and phase not in _LEAVES_FAILED:
            return False
        # Never step back from serving because a log line came late or the engine registered more memory;
        # a failed registration is the one thing that moves a serving engine back.
        if self.phase == "serving" and phase not in ("stopping", FAILED_REGISTRATION):
            return False
        self.phase = phase
        self.since.setdefault(phase, ts)
        return True

    def on_event(self, event: StatusEvent) -> bool:
        """Apply a status protocol event; True when the phase changed."""
        if event.phase == "waiting" and self.phase == "starting":
            return self._move("waiting", event.ts)  # the interposer is held at the gate
        if event.phase == "register-failed":
            if self.phase == "stopping":
                return False  # an engine on its way out is not put back in need of attention
            self.since[FAILED_REGISTRATION] = event.ts  # the latest failure, not the first
            moved = self.phase != FAILED_REGISTRATION
            self.phase = FAILED_REGISTRATION
            return moved
        if event.phase not in PHASES or event.phase == "exited":
            return False
        if event.data:
            self.data.update({k: v for k, v in event.data.items() if k != "pid"})
        moved = self._move(event.phase, event.ts)
        if event.phase == "registered" and (self.serving_when_registered or self.ready_seen):
            moved |= self._move("serving", event.ts)
        return moved

    def on_line(self, line: str) -> bool:
        """Apply one log line; True when a pattern moved the phase."""
        now = time.time()
        if self.ready_re is not None and self.ready_re.search(line):
            self.ready_seen = True
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
