"""The report's content from a bundle: environment, what happened, reproduction, ruled out, known issues,
attachments. One pass over the archive for the members, the bundle triage, and doctor over the bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import size_arg
from gpuwarden.ops.triage.render import clean as _clean
from gpuwarden.ops import knowledge
from gpuwarden.ops.bundle.replay import open_bundle, read_member
from gpuwarden.ops.bundle.triage_file import triage_bundle
from gpuwarden.ops.doctor.diagnose import diagnose_bundle
from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.bugreport.environment import collect

MAX_ATTACHMENTS = 60
SCHEMA = "report"


def _runtime(env: dict[str, Any], specs: list[dict[str, Any]], snapshot: dict[str, Any]) -> str:
    """The registration runtime the incident used: an engine's own --runtime, else the sim for a simulated node,
    else hip on AMD and cuda on NVIDIA."""
    for spec in specs:
        argv = [str(a) for a in spec.get("argv") or []] if isinstance(spec, dict) else []
        for i, arg in enumerate(argv[:-1]):
            if arg == "--runtime" and argv[i + 1] in ("hip", "cuda", "host", "sim"):
                return argv[i + 1]
    vendors = {(g.get("vendor") or "") for g in env.get("gpus") or [] if isinstance(g, dict)}
    simulated = "sim" in vendors or any(isinstance(w, dict) and w.get("code") == "simulated"
                                        for w in snapshot.get("warnings") or [])
    if simulated:
        return "sim"
    return "hip" if "amd" in vendors else "cuda"


def _spec_arena(specs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The arena an engine's argv names (--arena PATH), when the bundle's arena list has none."""
    for spec in specs:
        argv = [str(a) for a in spec.get("argv") or []] if isinstance(spec, dict) else []
        for i, arg in enumerate(argv[:-1]):
            if arg == "--arena":
                return {"path": argv[i + 1], "mappers": []}
    return None


def _reproduction(arenas: list[Any], snapshot: dict[str, Any], env: dict[str, Any],
                  registered: list[str], specs: list[dict[str, Any]]) -> dict[str, Any]:
    """`arena probe` with the bundle's runtime, no more canaries than its GPUs, and as many as engines that
    actually registered in their last run (not every engine record ever kept in the state dir)."""
    arena = next((a for a in arenas if isinstance(a, dict) and a.get("path")), None) or _spec_arena(specs)
    gpus = len([g for g in env.get("gpus") or [] if isinstance(g, dict)]) or None
    engines = len(registered) or (len([m for m in arena.get("mappers") or [] if isinstance(m, dict)
                                       and m.get("registered")]) if arena else 0)
    runtime = _runtime(env, specs, snapshot)
    if not arena or engines < 1:
        return {"command": None, "why": "the bundle names no arena and no engine that registered it; run "
                                       "`gpuwarden arena probe --engines N --size SIZE` with the incident's numbers"}
    capped = min(engines, gpus) if gpus else engines
    size = arena.get("size")
    size_text = size_arg(size) if isinstance(size, int) else f"{size}B"
    target = f"--arena {arena['path']}" if arena.get("path") else f"--size {size_text}"
    who = f" ({', '.join(registered)})" if registered else ""
    why = (f"{capped} engine(s){who} registered the {arena.get('path')} arena (as in the incident), on a node with "
           f"{gpus if gpus else 'an unknown number of'} GPU(s), runtime {runtime}; rerun with --visibility own and "
           f"--concurrency 1 to compare")
    if capped < engines:
        why += f"; {engines - capped} more registered than the node has GPUs: one canary per GPU"
    return {"command": f"gpuwarden arena probe --engines {capped} --concurrency {capped} {target} "
                       f"--runtime {runtime} --visibility all --hold 30", "why": why}


def _registered(report: Any) -> list[str]:
    """Engines whose last run registered (triage's node context, from the bundle's engine state files)."""
    ctx = getattr(report, "kfd_context", None)
    return sorted(getattr(ctx, "registered", {}) or {})


Reader = Callable[[str], "bytes | None"]


def _unreadable(path: Path, rel: str, why: str) -> GpuwardenError:
    return GpuwardenError(f"the bundle {path}: {rel} is unreadable ({why})",
                          "it is damaged or not a gpuwarden bundle: take a new one with `gpuwarden bundle`")


def _member_json(path: Path, read: Reader, rel: str) -> object:
    """A bundle member's JSON (None when absent); unreadable or nested past jsondoc.MAX_DEPTH is one line."""
    data = read(rel)
    if not data:
        return None
    try:
        value: object = jsondoc.loads(data)
    except ValueError as exc:
        raise _unreadable(path, rel, str(exc) if isinstance(exc, jsondoc.TooDeep) else "not valid JSON") from None
    return value


def _member_object(path: Path, read: Reader, rel: str) -> dict[str, Any]:
    """A member that gpuwarden writes as one JSON object ({} when absent or null)."""
    value = _member_json(path, read, rel)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _unreadable(path, rel, "not a JSON object")
    return value


def _member_array(path: Path, read: Reader, rel: str) -> list[Any]:
    """A member that gpuwarden writes as one JSON array ([] when absent or null)."""
    value = _member_json(path, read, rel)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _unreadable(path, rel, "not a JSON array")
    return value


def build(path: Path | str, settings: Settings | None = None) -> dict[str, Any]:
    """The gpuwarden.report/1 body for the bundle at `path`."""
    path = Path(path)
    with open_bundle(path) as tar:  # the archive and its manifest are judged there, as for every command
        top = tar.top
        names = [m.name[len(top) + 1:] for m in tar.getmembers() if m.name.startswith(top + "/")]
        cache: dict[str, bytes | None] = {}

        def read(rel: str) -> bytes | None:
            if rel not in cache:
                cache[rel] = read_member(tar, top, rel)
            return cache[rel]
        env = collect(read, names)
        manifest = tar.manifest
        snapshot = _member_object(path, read, "gpuwarden/snapshot.json")
        arenas = _member_array(path, read, "gpuwarden/arenas.json")
        probe = _member_json(path, read, "gpuwarden/probe.json")
        specs: list[dict[str, Any]] = []
        for n in names:
            if n.startswith("engines/") and n.endswith("/spec.json"):
                v = _member_json(path, read, n)
                if isinstance(v, dict):
                    inner = v.get("engine")
                    specs.append(inner if isinstance(inner, dict) else v)
    # deferred: keeps `gpuwarden report --help` cheap (0.6 ms there: concurrent.futures' thread module and queue)
    from concurrent.futures import ThreadPoolExecutor

    # doctor unpacks the bundle to a temporary tree (zlib and file writes release the GIL) while triage reads it
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-doctor") as pool:
        doctor_job = pool.submit(diagnose_bundle, path, settings or loader.resolve(check=False))
        report = triage_bundle(path)
        doctor = doctor_job.result()
    crashes = [{"title": f.title, "count": f.count, "library": f.details.get("library"),
                "offset": f.details.get("offset"),
                "processes": sorted({p for v in f.victims if isinstance(p := v.get("process"), str) and p})}
               for f in report.ordered() if f.category in ("segfault", "engine")]
    registrations = []
    for e in snapshot.get("engines") or []:
        for r in (e.get("registrations") or []) if isinstance(e, dict) else ():
            if not isinstance(r, dict):
                continue
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
        have = {k["id"] for k in known}
        known += [{"id": e.id, "title": e.title, "url": e.url, "rule": "arena", "finding": "the bundle holds an arena",
                   "versions": "no range given", "workaround": e.workaround or None, "fixed_in": e.fixed_in or None}
                  for e in knowledge.load().topic("arena-budget") if e.id not in have]
    body = {
        "bundle": str(path), "title": report.headline() or "no problem found in the bundle's logs",
        "environment": env,
        "what_happened": {"headline": report.headline(), "summary": report.summary()[:12], "crashes": crashes,
                          "registrations": registrations, "engines": report.engines},
        "reproduction": {**_reproduction(arenas, snapshot, env, _registered(report), specs), "probe_result": probe},
        "ruled_out": ruled_out, "concerns": concerns, "known_issues": known,
        "attachments": attachments, "attachments_total": len(items),
        "attachments_bytes": sum(i.get("bytes") or 0 for i in items),
    }
    cleaned: dict[str, Any] = _clean(body)  # the same shape, every string sanitized
    return cleaned
