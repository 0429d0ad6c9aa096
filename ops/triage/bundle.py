"""Triage of an incident bundle: its kernel log, the residual VRAM it recorded, and what its engines died of.

Used by `gpuwarden triage BUNDLE` (read from the archive) and by `gpuwarden bundle` itself (from the
entries in memory), through one function that takes a reader of bundle members.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, Callable

from ..knowledge import cite
from .analyze import Analyzer, add_snapshot
from .enginecrash import engine_findings, evidence_from
from .findings import Report
from .stream import analyze_stream

KERNEL_LOG = "kernel/kernel.log"
SNAPSHOT = "gpuwarden/snapshot.json"
ARENAS = "gpuwarden/arenas.json"
VERSIONS = "node/versions.json"
_HIP_VERSION = re.compile(r"libamdhip64\.so\.(\d+\.\d+(?:\.\d+)?)")


def _json(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
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
                   known: bool = True) -> Report:
    """The report for a bundle whose members `read(relative path)` returns (None when absent); `known`: cite the
    catalog's matching entries (a caller adding findings afterwards cites once, at its end)."""
    log = read(KERNEL_LOG)
    if log is None:
        report = Analyzer("no kernel log").finish(lines=0)
        report.notes.insert(0, "no kernel log could be read (see manifest.json not_collected): "
                               "triage covers the snapshot and the engines only")
    else:
        report = analyze_stream(io.BytesIO(log), source=f"{source}:{KERNEL_LOG}" if source else KERNEL_LOG)
    snapshot = _json(read(SNAPSHOT))
    if isinstance(snapshot, dict):
        add_snapshot(report, snapshot, SNAPSHOT)
    arenas = _json(read(ARENAS))
    arena_paths = [a.get("path") for a in arenas if isinstance(a, dict) and isinstance(a.get("path"), str)] \
        if isinstance(arenas, list) else []
    evidence = evidence_from(read, names)
    findings, engines = engine_findings(evidence, report, arena_paths)
    report.findings.extend(findings)
    report.engines = engines
    if any(e.get("backtrace_note") for e in engines):
        report.notes.append("a crashed engine dumped core but no backtrace was stored (gdb/eu-stack missing on the "
                            "node, or the core was not found): see manifest.json")
    report.environment = environment(_json(read(VERSIONS)))
    if known:
        cite(report, report.environment)
    return report


def engine_names(paths: list[str]) -> list[str]:
    """Engine names from member paths relative to the bundle's top (engines/<name>/<file>)."""
    names = {p.split("/")[1] for p in paths if p.startswith("engines/") and p.count("/") >= 2}
    return sorted(names)


def triage_bundle(path: Path) -> Report:
    """Open a bundle (.tar.gz) and triage it."""
    from ..bundle.replay import open_bundle, read_member, top_dir
    with open_bundle(path) as tar:
        top = top_dir(tar)
        rel = [m.name[len(top) + 1:] for m in tar.getmembers() if m.name.startswith(top + "/")]

        def read(member: str) -> bytes | None:
            return read_member(tar, top, member)
        report = triage_members(read, engine_names(rel), str(path), known=False)
        manifest = _json(read("manifest.json"))
    if isinstance(manifest, dict):
        from ..bundle.collect import collector_findings
        report.findings.extend(collector_findings([c for c in manifest.get("collectors", []) if isinstance(c, dict)]))
    else:
        report.notes.append("the bundle's manifest.json is unreadable")
    cite(report, report.environment)  # after the collectors' findings: they can match entries too
    return report
