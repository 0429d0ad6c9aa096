"""The report's content from a bundle: environment, what happened, reproduction, ruled out, known issues,
attachments. One pass over the archive for the members, the bundle triage, and doctor over the bundle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..triage.render import clean as _clean
from .environment import collect

MAX_ATTACHMENTS = 60
SCHEMA = "report"


def _reproduction(arenas: Any, snapshot: dict, env: dict) -> dict[str, Any]:
    arena = next((a for a in arenas or [] if isinstance(a, dict) and a.get("path")), None)
    engines = len(snapshot.get("engines") or []) or (len(arena.get("mappers") or []) if arena else 0)
    amd = any((g.get("vendor") or "") in ("amd", "sim") for g in env.get("gpus") or [])
    runtime = "hip" if amd else "cuda"
    if not arena or engines < 1:
        return {"command": None, "why": "the bundle names no arena and engines to reproduce with; run "
                                       "`gpuwarden arena probe --engines N --size SIZE` with the incident's numbers"}
    size = arena.get("size")
    target = f"--arena {arena['path']}" if arena.get("path") else f"--size {size}B"
    return {"command": f"gpuwarden arena probe --engines {engines} --concurrency {engines} {target} "
                       f"--runtime {runtime} --visibility all --hold 30",
            "why": f"{engines} engine(s) registering the {arena.get('path')} arena at once (as in the incident; "
                   f"rerun with --visibility own and --concurrency 1 to compare)"}


def build(path: Path | str, settings=None) -> dict[str, Any]:
    """The gpuwarden.report/1 body for the bundle at `path`."""
    from ..bundle.replay import open_bundle, read_member, top_dir
    from ..settings import Settings
    from ..bundle.triage_file import triage_bundle
    path = Path(path)
    with open_bundle(path) as tar:
        top = top_dir(tar)
        names = [m.name[len(top) + 1:] for m in tar.getmembers() if m.name.startswith(top + "/")]
        cache: dict[str, bytes | None] = {}

        def read(rel: str) -> bytes | None:
            if rel not in cache:
                cache[rel] = read_member(tar, top, rel)
            return cache[rel]
        env = collect(read, names)
        manifest = json.loads(read("manifest.json") or b"{}")
        snapshot = json.loads(read("gpuwarden/snapshot.json") or b"{}")
        arenas = json.loads(read("gpuwarden/arenas.json") or b"[]")
        probe = json.loads(read("gpuwarden/probe.json") or b"null")
    from concurrent.futures import ThreadPoolExecutor

    from ..doctor.diagnose import diagnose_bundle
    # doctor unpacks the bundle to a temporary tree (zlib and file writes release the GIL) while triage reads it
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-doctor") as pool:
        doctor_job = pool.submit(diagnose_bundle, path, settings or Settings.from_env())
        report = triage_bundle(path)
        doctor = doctor_job.result()
    crashes = [{"title": f.title, "count": f.count, "library": f.details.get("library"),
                "offset": f.details.get("offset"), "processes": sorted({v.get("process") for v in f.victims
                                                                        if v.get("process")})}
               for f in report.ordered() if f.category in ("segfault", "engine")]
    registrations = []
    for e in snapshot.get("engines") or []:
        for r in e.get("registrations") or []:
            registrations.append({"engine": e.get("name"), "call": r.get("call"), "outcome": r.get("outcome"),
                                  "bytes": r.get("bytes"), "result": r.get("result"), "seconds": r.get("seconds")})
    items = [i for i in manifest.get("items", []) if isinstance(i, dict) and i.get("path")]
    items.sort(key=lambda i: -(i.get("bytes") or 0))
    attachments = [{"path": i["path"], "bytes": i.get("bytes"), "truncated": bool(i.get("truncated")),
                    "redactions": sum(r.get("count", 0) for r in i.get("redacted") or [])}
                   for i in items[:MAX_ATTACHMENTS]]
    ruled_out = [{"check": f.id, "title": f.title, "reason": f.reason} for f in doctor.ordered() if f.verdict == "pass"]
    concerns = [{"check": f.id, "verdict": f.verdict, "title": f.title, "reason": f.reason, "fix": f.fix}
                for f in doctor.ordered() if f.verdict in ("fail", "warn")]
    known = list(report.known)
    if any(f.category in ("segfault", "engine") for f in report.findings) and arenas:
        from ..knowledge import load
        have = {k["id"] for k in known}
        known += [{"id": e.id, "title": e.title, "url": e.url, "rule": "arena", "finding": "the bundle holds an arena",
                   "versions": "no range given", "workaround": e.workaround or None, "fixed_in": e.fixed_in or None}
                  for e in load().topic("arena-budget") if e.id not in have]
    body = {
        "bundle": str(path), "title": report.headline() or "no problem found in the bundle's logs",
        "environment": env,
        "what_happened": {"headline": report.headline(), "summary": report.summary()[:12], "crashes": crashes,
                          "registrations": registrations, "engines": report.engines},
        "reproduction": {**_reproduction(arenas, snapshot, env), "probe_result": probe},
        "ruled_out": ruled_out, "concerns": concerns, "known_issues": known,
        "attachments": attachments, "attachments_total": len(items),
        "attachments_bytes": sum(i.get("bytes") or 0 for i in items),
    }
    return _clean(body)
