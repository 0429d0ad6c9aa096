"""The triage result: findings (one per event signature) and the report that orders them.

Plain data throughout, so a report serialises to JSON and reads back for `triage BUNDLE`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("critical", "error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
_CATEGORY_ORDER = {c: i for i, c in enumerate((
    "segfault", "gpu-page-fault", "xid", "ras", "oom", "residual-vram", "gpu-reset", "ring-timeout", "mes-kiq",
    "kfd", "hung-task", "pcie-aer", "firmware", "kernel"))}
MAX_EXAMPLES = 3
MAX_VICTIMS = 64


@dataclass
class Finding:
    """Every occurrence of one kind of event with one signature (device, ring, library+offset...)."""

    rule: str  # pattern id, e.g. "amdgpu.page_fault"
    category: str  # gpu-page-fault, ring-timeout, gpu-reset, ras, pcie-aer, kfd, mes-kiq, xid, ...
    severity: str
    title: str  # one line, with the signature filled in
    signature: str  # what makes two occurrences "the same"
    meaning: str = ""  # what it means / what to look at
    count: int = 0
    first_stamp: str | None = None
    last_stamp: str | None = None
    first_line: int | None = None
    last_line: int | None = None
    devices: list[str] = field(default_factory=list)
    victims: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    source: str = ""

    def add(self, line_no: int, stamp: str | None, raw: str, device: str | None) -> None:
        self.count += 1
        if self.first_line is None:
            self.first_line, self.first_stamp = line_no, stamp
        self.last_line, self.last_stamp = line_no, stamp
        if device and device not in self.devices:
            self.devices.append(device)
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(raw)

    def add_victim(self, victim: dict[str, Any]) -> None:
        if len(self.victims) < MAX_VICTIMS and victim not in self.victims:
            self.victims.append(victim)

    @property
    def rank(self) -> tuple:
        # Shared crash signatures first (the question the operator asks first), then severity, then
        # what tends to be a cause before what tends to be a consequence, then log order.
        shared = 0 if (self.category == "segfault" and len(self.victims) > 1) else 1
        return (shared, _RANK.get(self.severity, 9), _CATEGORY_ORDER.get(self.category, len(_CATEGORY_ORDER)),
                self.first_line or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    source: str
    lines: int
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "no timestamps", residual VRAM lines

    def ordered(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: f.rank)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out

    def summary(self) -> list[str]:
        """Short lines, most important first: shared crash signatures, then critical and errors."""
        lines = []
        for f in self.ordered():
            if f.severity == "info":
                continue
            lines.append(f.title + (f" (x{f.count})" if f.count > 1 and f.category != "segfault" else ""))
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "lines": self.lines, "counts": self.counts(),
                "summary": self.summary(), "notes": list(self.notes),
                "findings": [f.to_dict() for f in self.ordered()]}
