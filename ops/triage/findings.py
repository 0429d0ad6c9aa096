"""The triage result: findings (one per event signature) and the report that orders them.

Plain data throughout, so a report serialises to JSON and reads back for `triage BUNDLE`. Order is by
causality and impact: what broke the hardware, what kept a GPU from starting, crashes shared by several
processes, the event that names a culprit, firmware that stopped answering, and only then consequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("critical", "error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

# Causal tiers: lower comes first. Within a tier, TIME_ORDERED tiers keep log order (the first failure
# of an init chain is its cause); the others put the worse severity first, then log order.
HARDWARE, INIT, SHARED_CRASH, CAUSE, FIRMWARE, CONSEQUENCE, OTHER = range(7)
TIER_NAMES = ("hardware", "init", "shared-crash", "cause", "firmware", "consequence", "other")
TIME_ORDERED = frozenset({INIT, SHARED_CRASH, FIRMWARE})
MAX_EXAMPLES = 3
MAX_VICTIMS = 64
# Where a finding stands relative to the engine a bundle was taken for (Report.subject); None: no subject, or
# inside its run. The order is the order of the report: that engine's own findings, what happened during its
# run, what happened on the host outside it, and other processes' crashes last.
SCOPES = ("subject", "window", "outside", "other-process")
_SCOPE_RANK = {"subject": 0, None: 2, "window": 2, "outside": 3, "other-process": 4}


@dataclass
class Finding:
    """Every occurrence of one kind of event with one signature (device, ring, library+offset...)."""

    rule: str  # pattern id, e.g. "amdgpu.page_fault"
    category: str  # gpu-page-fault, ring-timeout, gpu-reset, ras, pcie-aer, kfd, mes-kiq, xid, engine, ...
    severity: str
    title: str  # one line, with the signature filled in
    signature: str  # what makes two occurrences "the same"
    meaning: str = ""  # what it means
    check: str = ""  # the first thing to check
    tier: int = OTHER
    count: int = 0
    first_stamp: str | None = None
    last_stamp: str | None = None
    first_line: int | None = None
    last_line: int | None = None
    first_time: float | None = None  # seconds (since the epoch or since boot), where the log says
    last_time: float | None = None
    time_base: str | None = None  # "epoch" (wall clock) or "boot" (seconds since boot) for the times above
    devices: list[str] = field(default_factory=list)
    victims: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    source: str = ""
    scope: str | None = None  # one of SCOPES, set by ops/triage/focus.py for a bundle taken for one engine

    def add(self, line_no: int, stamp: str | None, raw: str, device: str | None, when: float | None = None,
            base: str | None = None) -> None:
        self.count += 1
        if when is not None and self.time_base not in (None, base):
            when = None  # a log mixing clocks: times of another clock are not comparable
        elif when is not None:
            self.time_base = base
        if self.first_line is None:
            self.first_line, self.first_stamp, self.first_time = line_no, stamp, when
        self.last_line, self.last_stamp = line_no, stamp
        if when is not None:
            self.last_time = when
            if self.first_time is None:
                self.first_time = when
        if device and device not in self.devices:
            self.devices.append(device)
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(raw)

    def add_victim(self, victim: dict[str, Any]) -> bool:
        if len(self.victims) < MAX_VICTIMS and victim not in self.victims:
            self.victims.append(victim)
            return True
        return False

    @property
    def rank(self) -> tuple[bool, int, int, int, int]:
        severity = 0 if self.tier in TIME_ORDERED else _RANK.get(self.severity, 9)
        lead = _SCOPE_RANK.get(self.scope, 2)
        if lead == 2 and self.details.get("registration_failed"):
            lead = 1  # a crash after a failed registration: the failed call is the first fact of the incident
        return (self.severity == "info", lead, self.tier, severity, self.first_line or 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tier"] = TIER_NAMES[self.tier] if 0 <= self.tier < len(TIER_NAMES) else str(self.tier)
        return d


@dataclass
class Report:
    source: str
    lines: int
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "no timestamps", residual VRAM lines
    engines: list[dict[str, Any]] = field(default_factory=list)  # bundles: what each dead engine died of
    # bundles taken for one engine's crash: {"engine", "reason", "window": [from, to] (epoch s) or None}
    subject: dict[str, Any] | None = None
    known: list[dict[str, Any]] = field(default_factory=list)  # catalog entries the findings match (ops/knowledge)
    environment: dict[str, Any] = field(default_factory=dict)  # versions the matches were judged against
    kfd_context: Any = None  # a bundle's node context for ranking known issues (ops/triage/kfdrank.py)

    def ordered(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: f.rank)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out

    def exit_code(self) -> int:
        """1 when anything is at error level or worse (a person must act), else 0."""
        c = self.counts()
        return 1 if c.get("critical") or c.get("error") else 0

    def summary(self) -> list[str]:
        """Short lines, most important first (info findings left out): one per group of findings that differ
        only in the device (ops/triage/groups.py), at most groups.SUMMARY_MAX lines whatever the log."""
        # deferred: import cycle with gpuwarden.ops.triage
        from gpuwarden.ops.triage import groups  # groups builds on this module

        return groups.summary(self.ordered())

    def headline(self) -> str | None:
        """One sentence: the top finding, and what it led to on the same GPU (reset, VRAM lost)."""
        # Other processes' crashes (ops/triage/focus.py) are kept in the report but never lead it.
        top = next((f for f in self.ordered() if f.severity != "info" and f.scope != "other-process"), None)
        if top is None:
            return None
        text = line_of(top)
        if top.tier < CONSEQUENCE:
            after = [f for f in self.ordered() if f.tier == CONSEQUENCE and f.severity in ("critical", "error")
                     and f is not top and f.scope not in ("outside", "other-process") and (not top.devices or not f.devices or set(f.devices) & set(top.devices))
                     and (f.first_line or 0) >= (top.first_line or 0)]
            if after:
                text += "; then " + ", ".join(dict.fromkeys(_short(f) for f in after[:3]))
        return text

    def to_dict(self) -> dict[str, Any]:
        out = {"source": self.source, "lines": self.lines, "headline": self.headline(), "counts": self.counts(),
               "summary": self.summary(), "notes": list(self.notes)}
        if self.engines:
            out["engines"] = list(self.engines)
        if self.subject:
            out["subject"] = dict(self.subject)
        if self.environment:
            out["environment"] = dict(self.environment)
        if self.known:
            out["known_issues"] = list(self.known)
        if self.kfd_context is not None and getattr(self.kfd_context, "known", False):
            out["node_context"] = dict(self.kfd_context.__dict__)
        out["findings"] = [f.to_dict() for f in self.ordered()]
        return out


def line_of(f: Finding) -> str:
    """A finding as one summary line: its title, the process it names, and how often when it repeated."""
    text = f.title
    who = [v for v in f.victims if v.get("process")]
    if who and f.category not in ("segfault", "oom", "engine", "residual-vram") and who[0]["process"] not in text:
        v = who[0]
        text += f" (process {v['process']}" + (f"[{v['pid']}]" if v.get("pid") else "") + (
            f" and {len(who) - 1} more" if len(who) > 1 else "") + ")"
    return text + (f" (x{f.count})" if f.count > 1 and f.category not in ("segfault", "engine") else "")


def _short(f: Finding) -> str:
    """A consequence as a few words: its title without the device the headline already named."""
    return f.title.replace(f" on {f.devices[0]}", "") if f.devices else f.title
