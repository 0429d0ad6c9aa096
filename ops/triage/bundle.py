"""Triage of an incident bundle: its kernel log, the residual VRAM it recorded, and what its engines died of.

Used by `gpuwarden triage BUNDLE` (ops.bundle.triage_file reads the archive) and by `gpuwarden bundle` itself
(from the entries in memory), through one function that takes a reader of bundle members.
"""

from __future__ import annotations

import io
import re
from typing import Any, Callable

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.knowledge import cite
from gpuwarden.ops.triage import focus
from gpuwarden.ops.triage.analyze import Analyzer, add_snapshot
from gpuwarden.ops.triage.enginecrash import engine_findings, evidence_from
from gpuwarden.ops.triage.findings import Report
from gpuwarden.ops.triage.stream import analyze_stream

KERNEL_LOG = "kernel/kernel.log"
SNAPSHOT = "gpuwarden/snapshot.json"
ARENAS = "gpuwarden/arenas.json"
VERSIONS = "node/versions.json"
_HIP_VERSION = re.compile(r"libamdhip64\.so\.(\d+\.\d+(?:\.\d+)?)")


def json_or_none(data: bytes | None, name: str | None = None, notes: list[str] | None = None) -> Any:
    """A bundle member's JSON, or None when it is missing or unreadable (said in `notes`, naming `name`).

    Nesting past jsondoc.MAX_DEPTH is refused before parsing: a bundle may come from anywhere."""
    if not data:
        return None
    try:
        return jsondoc.loads(data)
    except ValueError as exc:
        if notes is not None:
            why = str(exc) if isinstance(exc, jsondoc.TooDeep) else "not valid JSON"
            notes.append(f"the bundle's {name} is unreadable ({why}): triage goes on without it")
        return None


def environment(versions: Any) -> dict[str, str | None]:
    """The versions the catalog's ranges are about, from a bundle's node/versions.json (None where absent)."""
    if not isinstance(versions, dict):
        return {}
    kernel = versions.get("kernel")
    hip = None
    libs = versions.get("gpu_libraries_by_pid")
    for paths in (libs.values() if isinstance(libs, dict) else ()):
        for lib in paths if isinstance(paths, list) else ():
            m = _HIP_VERSION.search(str(lib))
            hip = hip or (m.group(1) if m else None)
    return {"kernel": kernel.get("release") if isinstance(kernel, dict) else None,
            "amdgpu": versions.get("amdgpu_module"), "nvidia": versions.get("nvidia_module"), "rocm": hip}


def triage_members(read: Callable[[str], bytes | None], names: list[str], source: str,
                   subject: dict[str, Any] | None = None, known: bool = True) -> Report:
    """The report for a bundle whose members `read(relative path)` returns (None when absent). `subject`:
    {"engine": name, "reason": why} when the bundle was taken for that engine's crash (ops/triage/focus.py);
    `known`: cite the catalog's matching entries (a caller adding findings afterwards cites once, at its end)."""
    log = read(KERNEL_LOG)
    if log is None:
        report = Analyzer("no kernel log").finish(lines=0)
        report.notes.insert(0, "no kernel log could be read (see manifest.json not_collected): "
                               "triage covers the snapshot and the engines only")
    else:
        report = analyze_stream(io.BytesIO(log), source=f"{source}:{KERNEL_LOG}" if source else KERNEL_LOG)
    snapshot = json_or_none(read(SNAPSHOT), SNAPSHOT, report.notes)
    if isinstance(snapshot, dict):
        add_snapshot(report, snapshot, SNAPSHOT)
    arenas = json_or_none(read(ARENAS), ARENAS, report.notes)
    arena_paths = [p for a in arenas if isinstance(a, dict) and isinstance(p := a.get("path"), str)] \
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
    report.environment = environment(json_or_none(read(VERSIONS), VERSIONS, report.notes))
    if known:
        cite(report, report.environment)
    return report


def engine_names(paths: list[str]) -> list[str]:
    """Engine names from member paths relative to the bundle's top (engines/<name>/<file>)."""
    names = {p.split("/")[1] for p in paths if p.startswith("engines/") and p.count("/") >= 2}
    return sorted(names)


def subject_of(manifest: Any) -> dict[str, Any] | None:
    """The engine an automatic bundle was taken for, from its manifest; None for an operator's bundle."""
    subject = manifest.get("subject") if isinstance(manifest, dict) else None
    return subject if isinstance(subject, dict) and isinstance(subject.get("engine"), str) else None

