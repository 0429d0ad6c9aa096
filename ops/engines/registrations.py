"""An engine's host registrations as its status events tell them: call, bytes, seconds, wait, outcome.

The shim feeds every status event in and stores `records` in the engine's state.json ("registrations"):
engines list, the TUI's arena panel and the metrics read them there.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from gpuwarden.ops.foundation.model import Registration
from gpuwarden.ops.foundation.status_protocol import StatusEvent
from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.engines import runtime_errors

# The newest records kept per engine (restarts included).
KEEP = 32

# outcome: running -> registered | failed | hung (-> registered | failed when the call returns late) | died
STARTS = {"registering": "register", "unregistering": "unregister"}
ENDS = {"registered": ("register", "registered"), "register-failed": ("register", "failed"),
        "unregistered": ("unregister", "registered"), "unregister-failed": ("unregister", "failed")}


class RegistrationRecord(TypedDict):
    """One call as state.json keeps it; call, pid, via and slot are the engine's own words, passed through."""

    kind: str  # "register" or "unregister"
    call: object
    bytes: int | None
    outcome: str  # running, registered, failed, hung, died
    started_at: float | None
    seconds: float | None
    wait_s: float | None
    result: int | None
    pid: object
    via: object
    slot: object
    late: NotRequired[bool]  # the call returned after it had been reported hung


class RegistrationLog:
    def __init__(self, records: list[RegistrationRecord] | None = None):
        self.records: list[RegistrationRecord] = list(records or [])

    def _open(self, pid: object, kind: str) -> RegistrationRecord | None:
        for record in reversed(self.records):
            if record["pid"] == pid and record["kind"] == kind and record["outcome"] in ("running", "hung"):
                return record
        return None

    def on_event(self, event: StatusEvent) -> RegistrationRecord | None:
        """Apply one status event; the record it created or changed, None when it was about something else."""
        data = event.data
        pid = data.get("pid")
        if event.phase in STARTS:
            started: RegistrationRecord = {
                "kind": STARTS[event.phase], "call": data.get("call"), "bytes": _int(data.get("bytes")),
                "outcome": "running", "started_at": event.ts, "seconds": None, "wait_s": _num(data.get("wait_s")),
                "result": None, "pid": pid, "via": data.get("via") or ("engine" if data.get("source") != "preload" else None),
                "slot": data.get("slot"),
            }
            self.records.append(started)
            del self.records[:-KEEP]
            return started
        if event.phase in ENDS:
            kind, outcome = ENDS[event.phase]
            record = self._open(pid, kind)
            if record is None:
                # An engine that says only "registered" (the canary's seconds, a log-less report): one record.
                seconds = _num(data.get("seconds"))
                record = {"kind": kind, "call": data.get("call"), "bytes": _int(data.get("bytes")), "outcome": "running",
                          "started_at": event.ts - seconds if seconds is not None else None, "seconds": None,
                          "wait_s": _num(data.get("wait_s")), "result": None, "pid": pid,
                          "via": data.get("via") or "engine", "slot": data.get("slot")}
                self.records.append(record)
                del self.records[:-KEEP]
            record["outcome"], record["result"] = outcome, _int(data.get("result"))
            record["seconds"] = (_num(data.get("seconds")) if data.get("seconds") is not None
                                 else (event.ts - record["started_at"] if record["started_at"] else None))
            if record.get("bytes") is None:
                record["bytes"] = _int(data.get("bytes"))
            if data.get("late"):
                record["late"] = True
            return record
        if event.phase == "register-hung":
            record = self._open(pid, "register") or self._open(pid, "unregister")
            if record is not None:
                record["outcome"], record["seconds"] = "hung", _num(data.get("seconds"))
            return record
        return None

    def running(self) -> list[RegistrationRecord]:
        return [r for r in self.records if r["outcome"] in ("running", "hung")]

    def died(self, now: float) -> bool:
        """The engine is gone: calls still open ended with it. True when any did."""
        changed = False
        for record in self.running():
            record["outcome"] = "died"
            record["seconds"] = now - record["started_at"] if record["started_at"] else None
            changed = True
        return changed


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def describe(reg: Registration, *, short: bool = False) -> str:
    """One registration in words: '64.0 GiB in 12.3s, waited 3.1s', '64.0 GiB FAILED: hipErrorOutOfMemory (2) after 0.1s'."""
    size = fmt_bytes(reg.bytes)
    secs = reg.seconds or 0.0
    if reg.outcome == "registered":
        text = f"{size} in {secs:.1f}s"
        if reg.wait_s and reg.wait_s >= 0.05 and not short:
            text += f", waited {reg.wait_s:.1f}s"
        return text
    if reg.outcome == "failed":
        return f"{size} FAILED" + ("" if short else f": {runtime_errors.describe(reg.call, reg.result)} after {secs:.1f}s")
    if reg.outcome == "hung":
        return f"{size} HUNG {secs:.0f}s"
    if reg.outcome == "died":
        return f"{size} died in call" + ("" if short else f" after {secs:.1f}s")
    return f"{size} registering"


def latest(regs: tuple[Registration, ...]) -> Registration | None:
    """The engine's most recent registration (not unregistration)."""
    return next((r for r in reversed(regs) if r.kind == "register"), None)
