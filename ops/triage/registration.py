"""A failed host registration as triage evidence: which call, how much, which error, when, from the shim's records.

When an engine crashes after a registration of its returned an error, the failed call comes first in the story
("dp3: hipHostRegister of 64.0 GiB returned hipErrorOutOfMemory at 12:00:03.1; SIGSEGV ... 0.4 s later").
"""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.ops.engines.runtime_errors import name as error_name
from gpuwarden.ops.foundation.units import fmt_bytes

# A crash this soon after the failed call is taken as its consequence; later, it is only said to follow it.
CONSEQUENCE_S = 60.0


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def last_failed(state: dict[str, Any], before: float | None = None) -> dict[str, Any] | None:
    """The engine's last failed registration in its last run (the run's pid), ended before `before` when given;
    {"call", "bytes", "result", "error", "at"} with `at` the epoch second the call returned, or None."""
    pid = state.get("pid")
    for raw in reversed(state.get("registrations") or []):
        if not isinstance(raw, dict) or raw.get("kind") != "register" or raw.get("outcome") != "failed":
            continue
        if pid is not None and raw.get("pid") not in (None, pid):
            continue
        started = _num(raw.get("started_at"))
        at = started + (_num(raw.get("seconds")) or 0.0) if started is not None else None
        if before is not None and at is not None and at > before + 1.0:
            continue
        result = raw.get("result") if isinstance(raw.get("result"), int) else None
        return {"call": raw.get("call") if isinstance(raw.get("call"), str) else None,
                "bytes": raw.get("bytes") if isinstance(raw.get("bytes"), int) else None,
                "result": result, "error": error_name(raw.get("call"), result), "at": at}
    return None


def clock(ts: float | None) -> str:
    """'12:00:03.1' (local time, tenths) or '?'."""
    if ts is None:
        return "?"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 10)}"


def what_failed(name: str, failed: dict[str, Any]) -> str:
    """'dp3: hipHostRegister of 64.0 GiB returned hipErrorOutOfMemory at 12:00:03.1'."""
    error = failed.get("error") or f"error {failed.get('result')}"
    return (f"{name}: {failed.get('call') or 'a host registration'} of {fmt_bytes(failed.get('bytes'))} returned "
            f"{error} at {clock(failed.get('at'))}")


def crash_after(name: str, failed: dict[str, Any], how: str, where: str, crashed_at: float | None,
                signalled: bool) -> str:
    """The headline of a crash that followed a failed registration: the failed call first, then the crash."""
    gap = None if crashed_at is None or failed.get("at") is None else max(0.0, crashed_at - failed["at"])
    later = f" {gap:.1f} s later" if gap is not None else " later"
    text = f"{what_failed(name, failed)}; {how}{where}{later}"
    if not signalled:
        return text + " (the engine gave up after its registration failed)"
    if gap is None or gap <= CONSEQUENCE_S:
        return text + ": the engine used a buffer it failed to register"
    return text + ": it may have used the buffer it failed to register"
