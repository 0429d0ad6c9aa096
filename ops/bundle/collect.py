"""Make one incident bundle: run every collector concurrently under its deadline, pack, triage, write.

A collector that fails or runs out of time is recorded in the manifest and never stops the bundle;
only failing to write the archive itself is an error.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops import __version__
from gpuwarden.ops.foundation import jsondoc, statedir
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import parse_duration  # noqa: F401 (bundle callers find it here too)
from gpuwarden.ops.triage.bundle import engine_names, triage_members
from gpuwarden.ops.triage.findings import Finding, Report
from gpuwarden.ops.triage.render import as_json, markdown
from gpuwarden.ops.bundle import archive
from gpuwarden.ops.bundle.collectors import COLLECTORS, Collector, Context
from gpuwarden.ops.bundle.entries import MISSING, OK, SKIPPED, TIMED_OUT, Entry
from gpuwarden.ops.foundation.redact import describe as redaction_patterns
from gpuwarden.ops.foundation.redact import redact_text
from gpuwarden.ops.node.sim.node import SimNode, active_sim_root
from gpuwarden.ops.bundle.runner import Worker

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 16 << 20
# Past its deadline a collector's command is being killed; give the kill and the pipes this long.
GRACE_S = 0.75
MANIFEST = "manifest.json"

Progress = Callable[[str, str, int, int], None]  # (event, collector, done, total)


@dataclass
class BundleResult:
    path: Path
    bytes: int
    duration_s: float
    manifest: dict[str, Any]
    report: Report

    def not_collected(self) -> list[dict[str, Any]]:
        missing: list[dict[str, Any]] = self.manifest["not_collected"]  # _manifest writes that list
        return missing

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.path), "bytes": self.bytes, "duration_s": round(self.duration_s, 3),
                "items": len(m["items"]), "collectors": m["collectors"], "not_collected": m["not_collected"],
                "redaction": {k: v for k, v in m["redaction"].items() if k != "patterns"},
                "triage": m["triage"]}




def capture_roots(settings: Settings) -> tuple[Path, list[Path], bool]:
    """(sysfs root to copy, device roots whose files mark GPU holders, simulated?)."""
    sim_root = active_sim_root(settings)
    if sim_root is not None:
        return sim_root, [settings.dev_root, SimNode(settings.state_dir).dev_root], True
    return settings.sysfs_root, [settings.dev_root], False


def resolve_output(settings: Settings, output: str | Path | None, stamp: str) -> Path:
    name = f"gpuwarden-bundle-{socket.gethostname()}-{stamp}"
    if output is None or Path(output).is_dir() or str(output).endswith("/"):
        folder = statedir.ensure(settings.state_dir, statedir.BUNDLES) if output is None else Path(output)
        folder.mkdir(parents=True, exist_ok=True)
        # Two bundles in the same second (an auto bundle and an operator's) must not replace each other.
        path = folder / f"{name}.tar.gz"
        return path if not path.exists() else folder / f"{name}-{os.getpid()}.tar.gz"
    output = Path(output)
    if not output.parent.is_dir():
        raise GpuwardenError(f"the directory {output.parent} does not exist", "create it, or pick another --output")
    final = output if output.name.endswith((".tar.gz", ".tgz")) else output.with_name(output.name + ".tar.gz")
    if final.exists():
        # it may be the evidence of an earlier incident
        raise GpuwardenError(f"{final} already exists; it was left as it is",
                             "pick another name, or give a directory (bundles there get their own names)")
    return final


def collect_bundle(settings: Settings, *, output: str | Path | None = None, since: str | float | None = None,
                   safe_mode: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                   max_bytes: int = DEFAULT_MAX_BYTES, progress: Progress | None = None,
                   collectors: tuple[Collector, ...] = COLLECTORS,
                   subject: dict[str, Any] | None = None) -> BundleResult:
    """`subject`: {"engine": name, "reason": why} for a bundle taken for that engine's crash (the automatic one):
    recorded in the manifest, and its triage leads with that engine (ops/triage/focus.py)."""
    t0 = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    final = resolve_output(settings, output, stamp)
    if not os.access(final.parent, os.W_OK | os.X_OK):
        # say so before spending the collectors' time
        raise GpuwardenError(f"cannot write the bundle in {final.parent}: permission denied",
                             "pass --output with a directory you can write")
    since_s = parse_duration(since) if isinstance(since, str) else since
    if timeout_s <= 0:
        raise GpuwardenError(f"--timeout must be positive, not {timeout_s:g}")
    if max_bytes < 1024:
        raise GpuwardenError(f"--max-bytes {max_bytes} is too small", "give at least 1KiB per output")
    sysfs_root, dev_roots, simulated = capture_roots(settings)

    # --- run ---------------------------------------------------------------------------------
    workers: list[tuple[Collector, Worker | None, Context]] = []
    for c in collectors:
        ctx = Context(settings=settings, since_s=since_s, timeout_s=timeout_s, safe_mode=safe_mode,
                      sysfs_root=sysfs_root, dev_roots=dev_roots, deadline=time.monotonic() + timeout_s)
        if c.vendor and safe_mode:
            workers.append((c, None, ctx))
            continue
        workers.append((c, Worker(c.name, functools.partial(c.fn, ctx)), ctx))
    entries: list[Entry] = []
    summaries: list[dict[str, Any]] = []
    total = len(workers)
    for done, (c, w, ctx) in enumerate(workers, 1):
        if w is None:
            entries.append(Entry(c.name, c.name, "command", status=SKIPPED, error="skipped by --safe-mode"))
            summaries.append({"name": c.name, "status": SKIPPED, "duration_s": 0.0, "timed_out": False,
                              "error": "skipped by --safe-mode"})
            continue
        finished = w.wait_until(ctx.deadline + GRACE_S)
        if not finished:
            err = f"did not finish within {timeout_s:g}s; abandoned"
            entries.append(Entry(c.name, c.name, "python", status=TIMED_OUT, timed_out=True, error=err,
                                 duration_s=w.duration_s))
            summaries.append({"name": c.name, "status": TIMED_OUT, "duration_s": round(w.duration_s, 3),
                              "timed_out": True, "error": err})
        elif w.error is not None:
            err = _describe_error(w.error)
            entries.append(Entry(c.name, c.name, "python", status="failed", error=err, duration_s=w.duration_s))
            summaries.append({"name": c.name, "status": "failed", "duration_s": round(w.duration_s, 3),
                              "timed_out": False, "error": err})
        else:
            got: list[Entry] = list(w.result or [])
            entries.extend(got)
            summaries.append(_summary(c.name, got, w.duration_s))
        if progress:
            progress("collected", c.name, done, total)

    # --- pack + triage -----------------------------------------------------------------------
    for e in entries:
        archive.pack(e, max_bytes)
    report = _triage(entries, subject)
    report.findings.extend(collector_findings(summaries))
    for path, data in (("triage.md", markdown(report).encode()), ("triage.json", as_json(report).encode())):
        e = Entry("triage", "gpuwarden.ops.triage", "generated", path=path, data=data)
        archive.pack(e, max_bytes)
        entries.append(e)
    if progress:
        progress("writing", str(final), total, total)

    manifest = _manifest(settings, entries, summaries, report, since_s=since_s, safe_mode=safe_mode,
                         timeout_s=timeout_s, max_bytes=max_bytes, sysfs_root=sysfs_root, dev_roots=dev_roots,
                         simulated=simulated, started=t0, subject=subject)
    top = final.name[:-len(".tar.gz")] if final.name.endswith(".tar.gz") else final.stem
    size = archive.write(final, top, entries, [(MANIFEST, json.dumps(manifest, indent=2).encode())])
    return BundleResult(final, size, time.monotonic() - t0, manifest, report)


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, GpuwardenError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


def _summary(name: str, got: list[Entry], duration: float) -> dict[str, Any]:
    bad = [e for e in got if e.status not in (OK, MISSING)]
    stored = [e for e in got if e.path and e.status in (OK, "failed", TIMED_OUT)]
    if not bad:
        # a tool that is not installed is a fact about the node, not a failure of the collector
        status = MISSING if got and not stored and all(e.status == MISSING for e in got) else OK
    elif any(e.status == TIMED_OUT for e in bad):
        status = TIMED_OUT
    elif stored and len(bad) < len(got):
        status = "partial"
    else:
        status = bad[0].status
    out = {"name": name, "status": status, "duration_s": round(duration, 3),
           "timed_out": any(e.timed_out for e in got), "files": sum(1 for e in got if e.path)}
    noted = bad or [e for e in got if e.status == MISSING]
    if noted:
        out["error"] = "; ".join(dict.fromkeys(f"{e.source}: {e.error}" for e in noted[:3] if e.error)) or None
    return out


def collector_findings(collectors: list[dict[str, Any]]) -> list[Finding]:
    """A vendor tool that hung is evidence too: on a wedged GPU, rocm-smi and nvidia-smi block."""
    out = []
    for c in collectors:
        if c.get("status") != TIMED_OUT:
            continue
        vendor = any(c["name"].startswith(v) for v in ("amd-smi", "rocm-smi", "nvidia-smi"))
        out.append(Finding(
            rule="bundle.collector_timeout", category="ring-timeout" if vendor else "other",
            severity="error" if vendor else "warning", signature=c["name"], source="manifest.json", count=1,
            title=f"{c['name']} did not answer within the bundle's timeout",
            meaning=("a vendor tool blocking is a classic sign of a hung GPU or driver (see the kernel log "
                     "findings); collect with --safe-mode while it lasts") if vendor else
                    "this collector was abandoned; its part of the bundle is missing",
            details={"error": c.get("error")}))
    return out


def _triage(entries: list[Entry], subject: dict[str, Any] | None = None) -> Report:
    """The kernel log, the snapshot's residual VRAM and what any crashed engine died of, from the entries."""
    stored = {e.path: e.data for e in entries if e.path and e.data is not None}
    return triage_members(stored.get, engine_names(list(stored)), "", subject)


def _manifest(settings: Settings, entries: list[Entry], summaries: list[dict[str, Any]], report: Report,
              **opts: Any) -> dict[str, Any]:
    # An error can quote a tool's stderr, and a tool can print a URL with its password.
    for e in entries:
        if e.error:
            e.error = redact_text(e.error)[0]
    for summary in summaries:
        if summary.get("error"):
            summary["error"] = redact_text(summary["error"])[0]
    stored = [e for e in entries if e.path is not None and e.kind != "dir"]
    missing = [e for e in entries if e.path is None]
    by_pattern: dict[str, int] = {}
    by_item = []
    for e in entries:
        for pattern, count in e.redactions.items():
            by_pattern[pattern] = by_pattern.get(pattern, 0) + count
            by_item.append({"path": e.path, "pattern": pattern, "count": count})
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name  # not $USER: setpriv/su keep the caller's
    except KeyError:
        user = str(os.geteuid())
    now = time.time()
    return jsondoc.document("bundle-manifest", {
        "format": 1,
        "tool": "gpuwarden",
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "created_at": round(now, 3),
        "created_at_iso": jsondoc.iso(now),
        "host": socket.gethostname(),
        "collected_by": {"user": user, "uid": os.getuid(), "euid": os.geteuid(), "root": os.geteuid() == 0},
        "options": {"since_s": opts["since_s"], "safe_mode": opts["safe_mode"], "timeout_s": opts["timeout_s"],
                    "max_bytes": opts["max_bytes"]},
        "tree": {"sysfs_from": str(opts["sysfs_root"]), "proc_from": str(settings.proc_root),
                 "dev_roots": [str(d) for d in opts["dev_roots"]], "simulated": opts["simulated"],
                 "backend": settings.backend},
        "duration_s": round(time.monotonic() - opts["started"], 3),
        **({"subject": opts["subject"]} if opts.get("subject") else {}),
        "collectors": summaries,
        "items": [e.manifest() for e in stored],
        "not_collected": [e.manifest() for e in missing],
        "redaction": {"total": sum(by_pattern.values()), "by_pattern": by_pattern, "by_item": by_item,
                      "patterns": [{"name": n, "matches": what} for n, what in redaction_patterns()]},
        "triage": {"headline": report.headline(), "counts": report.counts(), "summary": report.summary()[:20]},
    })
