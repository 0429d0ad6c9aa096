"""Run doctor checks concurrently, each in its own daemon thread under its own deadline; never wait past it.

A check still running at its deadline (a hung driver, NVML stuck on a wedged GPU) is reported as cut and left
behind: its thread is a daemon, so it cannot hold the process open.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops import knowledge
from gpuwarden.ops.doctor.model import FAIL, SEVERITY, UNKNOWN, VERDICTS, WARN, Check, Finding, Result
from gpuwarden.ops.doctor.probe import CheckIO, Probe

DEFAULT_TIMEOUT_S = 1.5

Progress = Callable[[str, int, int], None]  # (check now waited for, checks done, total)


@dataclass
class Report:
    findings: list[Finding]
    started_at: float
    duration_s: float
    roots: dict[str, str]
    source: str  # "live", "tree" or "bundle:<path>"
    simulated: bool = False
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for f in self.findings if f.verdict == v) for v in VERDICTS}

    @property
    def exit_code(self) -> int:
        """0 every check passed (or did not apply, or could not tell), 1 a warning or a failure."""
        return 1 if any(f.verdict in (WARN, FAIL) for f in self.findings) else 0

    def ordered(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: SEVERITY[f.verdict])


class _Slot:
    """One check's thread and where its finding lands."""

    def __init__(self, check: Check, probe: Probe, timeout_s: float):
        self.check, self.timeout_s = check, timeout_s
        self.io = CheckIO(probe)
        self.result: Result | None = None
        self.done = threading.Event()
        self.deadline = time.monotonic() + timeout_s
        self.started: float | None = None  # when its thread got to run it
        self.finished: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"doctor-{check.id}", daemon=True)

    def _run(self) -> None:
        self.started = time.monotonic()
        try:
            result = self.check.run(self.io)
            if not isinstance(result, Result) or result.verdict not in VERDICTS:
                result = Result(UNKNOWN, f"the check returned {result!r}, not a verdict")
        except GpuwardenError as exc:
            result = Result(UNKNOWN, exc.message, exc.hint)
        except Exception as exc:  # a check's bug must cost one unknown, not the whole report
            result = Result(UNKNOWN, f"the check failed: {type(exc).__name__}: {exc}")
        self.result = result
        self.finished = time.monotonic()
        self.done.set()

    def finding(self) -> Finding:
        c = self.check
        if self.result is None:
            return Finding(c.id, c.title, c.group, UNKNOWN,
                           f"did not finish within {self.timeout_s:g}s and was cut (a hung driver or vendor "
                           f"library?); the rest of the report did not wait for it", None, list(self.io.reads), {},
                           self.timeout_s, timed_out=True)
        r = self.result
        return Finding(c.id, c.title, c.group, r.verdict, r.reason, r.fix, list(self.io.reads), r.details,
                       (self.finished or time.monotonic()) - (self.started or self.finished or 0.0))


def run_checks(checks: list[Check], probe: Probe, *, timeout_s: float | None = None,
               progress: Progress | None = None, source: str = "live") -> Report:
    """`timeout_s` given: every check's limit; None: each check's own (Check.timeout_s), else DEFAULT_TIMEOUT_S."""
    started_at, t0 = time.time(), time.monotonic()
    slots = [_Slot(c, probe, timeout_s or c.timeout_s or DEFAULT_TIMEOUT_S) for c in checks]
    for s in slots:
        s.thread.start()
    findings: list[Finding] = []
    for i, s in enumerate(slots):
        if progress and not s.done.is_set():
            progress(s.check.id, i, len(slots))
        s.done.wait(max(0.0, s.deadline - time.monotonic()))
        findings.append(s.finding())
    cite_known(findings)
    return Report(findings, started_at, time.monotonic() - t0, probe.roots.where(), source,
                  simulated=probe.roots.simulated)


def cite_known(findings: list[Finding]) -> None:
    """A check that did not pass names the catalog entries about its subject (topic `doctor:<check id>`)."""
    cat = knowledge.load()
    for f in findings:
        if f.verdict in (FAIL, WARN, UNKNOWN):
            f.known = [{"id": e.id, "title": e.title, "url": e.url} for e in cat.topic(f"doctor:{f.id}")]


def select(checks: list[Check], only: list[str] | None) -> list[Check]:
    """The checks named in `only` (ids or groups), in registry order; an unknown name is an error naming the choices."""
    if not only:
        return list(checks)
    ids = {c.id for c in checks}
    groups = {c.group for c in checks}
    wanted = [w.strip() for w in only if w.strip()]
    bad = [w for w in wanted if w not in ids and w not in groups]
    if bad:
        raise GpuwardenError(f"no doctor check named {', '.join(bad)}",
                             f"choose from: {', '.join(sorted(ids))} (or a group: {', '.join(sorted(groups))})")
    return [c for c in checks if c.id in wanted or c.group in wanted]

