"""A bundle taken for one engine's crash: that engine's findings first, then what happened during its run.

The host's kernel log holds every process's faults: other processes' crashes stay in the report, labelled as
theirs and listed last; findings stamped outside the engine's run come after the ones inside it.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.triage.enginecrash import EngineEvidence
from gpuwarden.ops.triage.findings import Finding, Report

# Kernel lines a moment before the engine started still belong to its start; its crash's consequences
# (a GPU reset, a ring timeout) are logged some seconds after it.
BEFORE_S = 5.0
AFTER_S = 30.0
_OWN = ("engine.died", "engine.register_failed")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def window_of(state: dict[str, Any]) -> tuple[float, float] | None:
    """The engine's last run as epoch seconds (from its start to its end, or its last record when it runs on)."""
    raw = state.get("phases")
    phases: dict[str, Any] = raw if isinstance(raw, dict) else {}
    times = [t for t in (_num(v) for v in phases.values()) if t is not None]
    start = _num(state.get("started_at")) or (min(times) if times else None)
    end = _num(phases.get("crashed")) or _num(phases.get("exited")) or _num(state.get("updated_at")) or \
        (max(times) if times else None)
    if start is None or end is None:
        return None
    return start - BEFORE_S, max(start, end) + AFTER_S


def apply(report: Report, engine: str, reason: str | None, evidence: list[EngineEvidence]) -> None:
    """Place every finding against `engine` (the bundle's subject) and record the subject on the report."""
    subject = next((e for e in evidence if e.name == engine and e.state), None)
    if subject is None:
        # Nothing to tell its processes from the others by: the report stays as the log alone makes it.
        report.notes.append(f"the bundle holds no record of engine {engine}: its findings are not placed against it")
        return
    window = window_of(subject.state)
    report.subject = {"engine": engine, "reason": reason, "window": [round(t, 3) for t in window] if window else None}
    own_pid = subject.state.get("pid")
    engine_pids = {e.state.get("pid") for e in evidence if isinstance(e.state.get("pid"), int)}
    for f in report.findings:
        pids = {v.get("pid") for v in f.victims}
        if f.rule in _OWN and f.signature == engine:
            f.scope = "subject"  # the kernel's own line about its fault is in its window, below
            continue
        if own_pid is not None and own_pid in pids:
            f.scope = "window"
            strangers = [v for v in f.victims if v.get("pid") not in engine_pids and not v.get("engine")]
            if strangers:
                f.title += f" ({len(strangers)} of them no engine of this bundle)"
            continue
        if f.category in ("segfault", "oom") and f.victims and not pids & engine_pids \
                and not any(v.get("engine") for v in f.victims):
            _other_processes(f, engine)
            continue
        if window is not None and f.time_base == "epoch" and f.first_time is not None:
            last = f.last_time if f.last_time is not None else f.first_time
            f.scope = "window" if last >= window[0] and f.first_time <= window[1] else "outside"
            if f.scope == "outside":
                f.title += f" (outside {engine}'s run)"


def _other_processes(f: Finding, engine: str) -> None:
    """A crash of processes that are no engine of this bundle: kept, said to be theirs, never the headline."""
    names = sorted({str(v.get("process")) for v in f.victims if v.get("process")})
    who = "another process" if len(names) <= 1 and len(f.victims) <= 1 else "other processes"
    f.scope = "other-process"
    f.title = f"{who} on this host, not {engine} nor another engine of this bundle: {f.title}"
    f.details["severity_as_found"] = f.severity
    if f.severity in ("critical", "error"):
        f.severity = "warning"
