"""What a doctor check is and what it finds: a verdict with its reason, what was read, and the fix.

Checks return a Result; the runner turns it into a Finding with the check's id, title, reads and timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

PASS, WARN, FAIL, UNKNOWN, SKIP = "pass", "warn", "fail", "unknown", "skip"
VERDICTS = (PASS, WARN, FAIL, UNKNOWN, SKIP)
# Worst first: the order a report lists findings in and the summary counts them.
SEVERITY = {FAIL: 0, WARN: 1, UNKNOWN: 2, PASS: 3, SKIP: 4}


# The reason and the fix are positional-only, so a check's details may be any names (and any values).


@dataclass
class Result:
    """A check's answer. `fix` is a command or a config line; `details` holds the values it judged."""

    verdict: str
    reason: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def passed(reason: str, /, **details: Any) -> Result:
    return Result(PASS, reason, details=details)


def warn(reason: str, fix: str | None = None, /, **details: Any) -> Result:
    return Result(WARN, reason, fix, details)


def fail(reason: str, fix: str | None = None, /, **details: Any) -> Result:
    return Result(FAIL, reason, fix, details)


def unknown(reason: str, fix: str | None = None, /, **details: Any) -> Result:
    return Result(UNKNOWN, reason, fix, details)


def skip(reason: str, /, **details: Any) -> Result:
    return Result(SKIP, reason, details=details)


def worst(results: list[Result]) -> str:
    return min((r.verdict for r in results), key=SEVERITY.__getitem__, default=PASS)


@dataclass(frozen=True)
class Check:
    """One named unit: `run(io)` reads through `io` (a CheckIO) and returns a Result."""

    id: str
    title: str
    group: str
    run: Callable[[Any], Result]
    timeout_s: float | None = None  # None: the doctor's default


@dataclass
class Finding:
    id: str
    title: str
    group: str
    verdict: str
    reason: str
    fix: str | None
    read: list[str]
    details: dict[str, Any]
    duration_s: float
    timed_out: bool = False
    known: list[dict[str, str]] = field(default_factory=list)  # catalog entries about this check's subject

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "group": self.group, "verdict": self.verdict,
               "reason": self.reason, "fix": self.fix, "read": list(self.read), "details": self.details,
               "duration_s": round(self.duration_s, 4), "timed_out": self.timed_out}
        if self.known:
            out["known"] = list(self.known)
        return out
