"""`gpuwarden triage BUNDLE`: the triage of a bundle archive on disk, members read from the tar.

Triage itself (gpuwarden.ops.triage.bundle) knows nothing of archives; the manifest's collectors add theirs.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.ops.knowledge import cite
from gpuwarden.ops.triage.bundle import engine_names, json_or_none, subject_of, triage_members
from gpuwarden.ops.triage.findings import Report
from gpuwarden.ops.bundle.collect import collector_findings
from gpuwarden.ops.bundle.replay import open_bundle, read_member, top_dir


def triage_bundle(path: Path, engine: str | None = None) -> Report:
    """Open a bundle (.tar.gz) and triage it; about `engine` when given, else about the engine it was taken for."""
    with open_bundle(path) as tar:
        top = top_dir(tar)
        rel = [m.name[len(top) + 1:] for m in tar.getmembers() if m.name.startswith(top + "/")]

        def read(member: str) -> bytes | None:
            return read_member(tar, top, member)
        notes: list[str] = []
        manifest = json_or_none(read("manifest.json"), "manifest.json", notes)
        subject = subject_of(manifest)
        if engine is not None and (subject is None or subject["engine"] != engine):
            subject = {"engine": engine, "reason": None}
        report = triage_members(read, engine_names(rel), str(path), subject, known=False)
    report.notes[:0] = notes
    if isinstance(manifest, dict):
        report.findings.extend(collector_findings([c for c in manifest.get("collectors", []) if isinstance(c, dict)]))
    elif not notes:
        report.notes.append("the bundle's manifest.json is unreadable")
    cite(report, report.environment)  # after the collectors' findings: they can match entries too
    return report
