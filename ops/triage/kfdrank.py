"""Known issues ranked with the node's context: a crash storm in processes that registered a shared arena puts the
KFD system-memory entry first, with the numbers; without that context the report says what it would need.

Context comes from a bundle: what each engine registered (engine state files), the failed host-memory calls (the
state's records, the engine logs), KFD's used/limit (gpuwarden/kfd_limit.json: debugfs kfd/mem_limit as root,
else the limit computed from RAM). The cause stays a hypothesis; each sentence says what would confirm it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuwarden.ops.knowledge.catalog import load
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops.engines.runtime_errors import name as error_name
from gpuwarden.ops.triage.findings import Finding, Report
from gpuwarden.ops.triage.registration import clock

KFD_LIMIT_MEMBER = "gpuwarden/kfd_limit.json"  # written by ops/bundle/collectors.py (_arena)
SHARED = "kfd-system-mem-limit-shared-registration"  # registrations alone past the limit
PINNED = "kfd-system-mem-limit-pinned-after-registration"  # registrations fit, the next pinned allocation fails
GiB = 1 << 30
_STORM_RULES = ("engine.crash_storm", "engine.died_together")
_KFD_RULES = ("engine.host_memory_failed", "engine.hip_create_memory_failed", "kfd.svm_mem_limit")
_FAILED_LINE = re.compile(
    r"\b(?P<call>hipHostMalloc|hipMallocHost|hipHostAlloc|hipExtHostAlloc|hipHostRegister|cudaHostAlloc"
    r"|cudaMallocHost|cuMemHostAlloc|cuMemAllocHost)\s+of\s+(?P<size>[\d.]+ [KMGT]?i?B)\s+returned\s+"
    r"(?P<code>hip\w+|cuda\w+|CUDA_ERROR_\w+)")
NEEDS = ("what each process registered and pinned (a gpuwarden bundle holds the engines' state files and "
         "gpuwarden/arenas.json; engines run with progress = \"preload\" also record every pinned allocation and "
         "failed call)", "KFD's used/limit (gpuwarden/kfd_limit.json in a bundle; /sys/kernel/debug/kfd/mem_limit is "
         "readable as root: `sudo gpuwarden bundle`)")


@dataclass
class KfdContext:
    registered: dict[str, int] = field(default_factory=dict)  # engine -> bytes registered in its last run
    failed: list[dict[str, Any]] = field(default_factory=list)  # {"engine", "call", "size", "error", "at"}
    used: int | None = None
    limit: int | None = None
    limit_source: str | None = None  # "debugfs" or "computed"

    @property
    def known(self) -> bool:
        return bool(self.registered)


def _end(record: dict[str, Any]) -> float | None:
    """When a recorded call returned: its start plus its duration."""
    start, secs = record.get("started_at"), record.get("seconds")
    if not isinstance(start, (int, float)):
        return None
    return float(start) + (float(secs) if isinstance(secs, (int, float)) else 0.0)


def _gib(n: int) -> str:
    if n < GiB:
        return fmt_bytes(n)
    return f"{n / GiB:.2f}".rstrip("0").rstrip(".") + " GiB"


def context_from(read: Callable[[str], bytes | None], evidence: list[Any], kfd: Any) -> KfdContext:
    """The context a bundle holds: engine states and logs (`evidence`, ops/triage/enginecrash.py) and its
    gpuwarden/kfd_limit.json (`kfd`, already parsed, or None)."""
    ctx = KfdContext()
    for e in evidence:
        state = e.state or {}
        pid = state.get("pid")
        total = 0
        for r in state.get("registrations") or []:
            if not isinstance(r, dict) or (pid is not None and r.get("pid") not in (None, pid)):
                continue
            size = r.get("bytes") if isinstance(r.get("bytes"), int) else None
            if r.get("kind") == "register" and r.get("outcome") in ("registered", "died") and size:
                total += size
            elif r.get("outcome") == "failed":
                ctx.failed.append({"engine": e.name, "call": r.get("call") or "a host-memory call",
                                   "size": fmt_bytes(size) if size else None,
                                   "error": error_name(r.get("call"), r.get("result")) or r.get("result"),
                                   "at": _end(r)})
        for r in state.get("failed_calls") or []:  # the interposer's ledger (issue 33 item 1), when recorded
            if isinstance(r, dict):
                ctx.failed.append({"engine": e.name, "call": r.get("call"), "size": fmt_bytes(r["bytes"])
                                   if isinstance(r.get("bytes"), int) else None, "error": r.get("error") or r.get("result"),
                                   "at": r.get("at") or r.get("time")})
        if total:
            ctx.registered[e.name] = total
        for m in _FAILED_LINE.finditer(e.log or ""):
            if not any(f["engine"] == e.name and f["call"] == m["call"] for f in ctx.failed):
                ctx.failed.append({"engine": e.name, "call": m["call"], "size": m["size"], "error": m["code"],
                                   "at": None})
    if isinstance(kfd, dict):
        ctx.used = kfd.get("used") if isinstance(kfd.get("used"), int) else None
        ctx.limit = kfd.get("limit") if isinstance(kfd.get("limit"), int) else None
        ctx.limit_source = kfd.get("source") if isinstance(kfd.get("source"), str) else None
    simulated = _simulated_limit(evidence)
    if simulated is not None and ctx.limit_source != "debugfs":
        ctx.limit, ctx.limit_source, ctx.used = simulated, "simulated", None
    return ctx


def _simulated_limit(evidence: list[Any]) -> int | None:
    """The sim runtime's KFD limit (GPUWARDEN_SIM_KFD_LIMIT in an engine's spec), for a simulated incident."""
    for e in evidence:
        spec = e.spec.get("engine") if isinstance(e.spec.get("engine"), dict) else e.spec
        env = spec.get("env") if isinstance(spec, dict) else None
        raw = env.get("GPUWARDEN_SIM_KFD_LIMIT") if isinstance(env, dict) else None
        if isinstance(raw, str):
            try:
                return parse_size(raw)
            except GpuwardenError:
                continue
    return None


def _storm(report: Report) -> Finding | None:
    """A crash storm the KFD limit could explain: engines dead together, or processes crashed at one libamdhip64
    offset (the kernel's line), or a failed host-memory call / SVM refusal."""
    for f in report.ordered():
        text = f"{f.title} {f.signature}"
        if f.rule in _STORM_RULES or (f.rule == "userspace.crash" and f.count >= 2 and "libamdhip64" in text):
            return f
    return next((f for f in report.ordered() if f.rule in _KFD_RULES), None)


def _names(engines: list[str]) -> str:
    m = [re.match(r"(.*?)(\d+)$", n) for n in engines]
    if len(engines) > 2 and all(m) and len({x[1] for x in m if x}) == 1:
        nums = sorted(int(x[2]) for x in m if x)
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{m[0][1] if m[0] else ''}{nums[0]}-{m[0][1] if m[0] else ''}{nums[-1]}"
    return ", ".join(engines)


def rank(report: Report, ctx: KfdContext | None) -> None:
    """Put the KFD system-memory entry first in report.known, with the numbers, when a storm happened in processes
    that registered; else, when a storm happened, say which context would rank it and how to get it."""
    storm = _storm(report)
    if storm is None:
        return
    victims = {v.get("engine") or v.get("process") for v in storm.victims}
    # Every engine whose last run registered counts against the limit, not only the storm's victims: one whose next
    # pinned allocation fitted (after a peer died and its charges were freed) serves on, and its registration was
    # part of what the others met. No victim among them: the storm was in other processes, and it is not ranked.
    registered = dict(ctx.registered) if ctx else {}
    reg = registered if not victims or victims & registered.keys() else {}
    if not reg or ctx is None:
        what = "; ".join(NEEDS)
        report.notes.append(f"this crash storm can be KFD's system-memory limit ({PINNED}, {SHARED}); to rank it, "
                            f"triage needs {what}")
        if not any(k["id"] in (SHARED, PINNED) for k in report.known) and (entry := load().get(PINNED)):
            # Listed, not ranked: without the node's numbers it is a candidate, not the leading explanation.
            report.known.append({"id": entry.id, "title": entry.title, "url": entry.url, "rule": storm.rule,
                                 "finding": storm.title, "versions": "no range given",
                                 "workaround": entry.workaround or None, "fixed_in": entry.fixed_in or None})
        for k in report.known:
            if k["id"] in (SHARED, PINNED):
                k["needs"] = list(NEEDS)
        return
    total = sum(reg.values())
    sizes = sorted(set(reg.values()))
    each = f"{len(reg)} x {fmt_bytes(sizes[0])}" if len(sizes) == 1 else " + ".join(fmt_bytes(b) for b in reg.values())
    parts = [f"{_names(sorted(reg))} registered {each} = {fmt_bytes(total)}"]
    over = False
    if ctx.limit:
        src = {"debugfs": "KFD's own limit (debugfs)", "simulated": "the sim runtime's simulated limit"}.get(
            ctx.limit_source or "", "the limit computed from RAM")
        parts[0] += f" of a {_gib(ctx.limit)} limit ({src})"
        over = total > ctx.limit
        if ctx.used is not None:
            parts.append(f"KFD charged {_gib(ctx.used)} when the bundle was taken"
                         + (" (after the crashes: a dead process's charges are freed)" if ctx.used < total else ""))
    crash_times = [f.first_time for f in report.findings if f.time_base == "epoch" and f.first_time is not None
                   and f.rule in ("engine.died", "userspace.crash") + _STORM_RULES]
    first_crash = min(crash_times) if crash_times else None
    for f in ctx.failed:
        when = ""
        if isinstance(f.get("at"), (int, float)) and isinstance(first_crash, (int, float)):
            when = f" {max(0.0, first_crash - f['at']):.1f} s before the first crash"
        elif isinstance(f.get("at"), (int, float)):
            when = f" at {clock(f['at'])}"
        parts.append(f"{f['engine']}'s {f['call']}" + (f" of {f['size']}" if f.get("size") else "")
                     + f" returned {f['error']}{when}")
    pinned_failed = any(f["call"] and "Register" not in str(f["call"]) for f in ctx.failed)
    lead = SHARED if over and not pinned_failed else PINNED
    why = ("the registrations alone exceed the limit" if over else
           "the registrations fit, so what crossed the limit is what else the engines pinned" if ctx.limit else
           "the limit is not known here")
    confirm = ("confirm on this node: /sys/kernel/debug/kfd/mem_limit (root) near the limit while the engines run, "
               "and each engine's pinned bytes and failed calls in `gpuwarden engines list` (progress = \"preload\"); "
               "reproduce with `gpuwarden arena probe`")
    because = "; ".join(parts) + f": {why}; {confirm}"
    if not ctx.failed:
        because += "; no failed call was recorded, so this stays a hypothesis until the ledger shows one"
    cat = load()
    ordered = [lead] + [x for x in (PINNED, SHARED) if x != lead]
    placed = []
    for entry_id in ordered:
        existing = next((k for k in report.known if k["id"] == entry_id), None)
        entry = cat.get(entry_id)
        if existing is None and entry is None:
            continue
        if existing is not None:
            k = existing
        else:
            assert entry is not None
            k = {"id": entry.id, "title": entry.title, "url": entry.url, "rule": storm.rule, "finding": storm.title,
                 "versions": "no range given", "workaround": entry.workaround or None,
                 "fixed_in": entry.fixed_in or None}
        k["ranked_by"] = "node context"
        if entry_id == lead:
            k["because"] = because
        placed.append(k)
    report.known = placed + [k for k in report.known if k["id"] not in {p["id"] for p in placed}]
