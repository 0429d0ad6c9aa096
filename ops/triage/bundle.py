"""Triage of an incident bundle: its kernel log, the residual VRAM it recorded, and what its engines died of.

Used by `gpuwarden triage BUNDLE` (ops.bundle.triage_file reads the archive) and by `gpuwarden bundle` itself
(from the entries in memory), through one function that takes a reader of bundle members.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable

from . import focus
from .analyze import Analyzer, add_snapshot
from .enginecrash import engine_findings, evidence_from
from .findings import Report
from .stream import analyze_stream

KERNEL_LOG = "kernel/kernel.log"
SNAPSHOT = "gpuwarden/snapshot.json"
ARENAS = "gpuwarden/arenas.json"


def json_or_none(data: bytes | None) -> Any:
    """A bundle member's JSON, or None when it is missing or unreadable."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def triage_members(read: Callable[[str], bytes | None], names: list[str], source: str,
                   subject: dict[str, Any] | None = None) -> Report:
    """The report for a bundle whose members `read(relative path)` returns (None when absent). `subject`:
    {"engine": name, "reason": why} when the bundle was taken for that engine's crash (ops/triage/focus.py)."""
    log = read(KERNEL_LOG)
    if log is None:
        report = Analyzer("no kernel log").finish(lines=0)
        report.notes.insert(0, "no kernel log could be read (see manifest.json not_collected): "
                               "triage covers the snapshot and the engines only")
    else:
        report = analyze_stream(io.BytesIO(log), source=f"{source}:{KERNEL_LOG}" if source else KERNEL_LOG)
    snapshot = json_or_none(read(SNAPSHOT))
    if isinstance(snapshot, dict):
        add_snapshot(report, snapshot, SNAPSHOT)
    arenas = json_or_none(read(ARENAS))
    arena_paths = [a.get("path") for a in arenas if isinstance(a, dict) and isinstance(a.get("path"), str)] \
        if isinstance(arenas, list) else []
    evidence = evidence_from(read, names)
    findings, engines = engine_findings(evidence, report, arena_paths)
    report.findings.extend(findings)
    report.engines = engines
    if subject and isinstance(subject.get("engine"), str):
        focus.apply(report, subject["engine"], subject.get("reason"), evidence)
    if any(e.get("backtrace_note") for e in engines):
        report.notes.append("a crashed engine dumped core but no backtrace was stored (gdb/eu-stack missing on the "
                            "node, or the core was not found): see manifest.json")
    return report


def engine_names(paths: list[str]) -> list[str]:
    """Engine names from member paths relative to the bundle's top (engines/<name>/<file>)."""
    names = {p.split("/")[1] for p in paths if p.startswith("engines/") and p.count("/") >= 2}
    return sorted(names)


def subject_of(manifest: Any) -> dict[str, Any] | None:
    """The engine an automatic bundle was taken for, from its manifest; None for an operator's bundle."""
    subject = manifest.get("subject") if isinstance(manifest, dict) else None
    return subject if isinstance(subject, dict) and isinstance(subject.get("engine"), str) else None

