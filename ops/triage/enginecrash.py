"""What each crashed engine died of: the shim's record, the kernel's fault line, the core's backtrace, its log.

One finding per dead engine, and one on top when several died of the same signal at the same place
(the arena incident: four engines, SIGSEGV, same libamdhip64 offset, within a second of each other).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.model import FAILED_REGISTRATION
from gpuwarden.ops.triage import backtrace, registration
from gpuwarden.ops.triage.analyze import Analyzer
from gpuwarden.ops.triage.findings import CAUSE, SHARED_CRASH, Finding, Report

RUN_MARK = "--- gpuwarden: "  # the shim's line before each start of the engine (ops/engines/state.py)
_REGISTERED = ("registered", "serving")


@dataclass
class EngineEvidence:
    name: str
    state: dict[str, Any]
    spec: dict[str, Any]
    log: str = ""
    backtrace: str = ""

    @property
    def died(self) -> bool:
        s = self.state
        return s.get("phase") == "crashed" or bool(s.get("signal"))


def _json(data: bytes | None) -> dict[str, Any]:
    try:
        value = jsondoc.loads(data or b"{}")  # nesting bounded: a bundle may come from anywhere
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def evidence_from(read: Callable[[str], bytes | None], names: list[str]) -> list[EngineEvidence]:
    """The evidence of every engine named, read through `read(relative path)` (a bundle member or a file)."""
    out = []
    for name in names:
        log = (read(f"engines/{name}/engine.log") or b"").decode("utf-8", "replace")
        bt = (read(f"engines/{name}/backtrace.txt") or b"").decode("utf-8", "replace")
        out.append(EngineEvidence(name, _json(read(f"engines/{name}/state.json")),
                                  _json(read(f"engines/{name}/spec.json")), log, bt))
    return out


def _last_run(log: str) -> str:
    at = log.rfind(RUN_MARK)
    return log[log.find("\n", at) + 1:] if at >= 0 else log


def _log_error(e: EngineEvidence) -> Finding | None:
    """The last error-level finding in the engine's own log (its last run only)."""
    a = Analyzer(f"engines/{e.name}/engine.log")
    for raw in _last_run(e.log).splitlines()[-5000:]:
        a.feed(raw)
    found = [f for f in a.finish().findings if f.severity in ("critical", "error")]
    return max(found, key=lambda f: f.last_line or 0) if found else None


def _kernel_fault(kernel: Report | None, pid: Any) -> tuple[Finding, dict[str, Any]] | None:
    if kernel is None or not isinstance(pid, int):
        return None
    for f in kernel.findings:
        if f.rule == "userspace.crash":
            for v in f.victims:
                if v.get("pid") == pid:
                    return f, v
    return None


def _phase_phrase(state: dict[str, Any]) -> str:
    phases = state.get("phases") or {}
    was = state.get("died_while") or ""
    if was == "registering":
        return "while registering"
    if was == FAILED_REGISTRATION:
        return "after its registration failed"
    if was in _REGISTERED or any(p in phases for p in _REGISTERED):
        return "after registering"
    return f"while {was}" if was else ""


def engine_findings(evidence: list[EngineEvidence], kernel: Report | None = None,
                    arenas: Sequence[str] = ()) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, one summary per dead engine) for the engines that died."""
    findings: list[Finding] = []
    summaries: list[dict[str, Any]] = []
    for e in evidence:
        if not e.died:
            continue
        s = e.state
        sig = s.get("signal")
        how = sig or (f"exit code {s.get('exit_code')}" if s.get("exit_code") is not None else "an unknown cause")
        info: dict[str, Any] = {"name": e.name, "pid": s.get("pid"), "signal": sig, "exit_code": s.get("exit_code"),
                                "core_dumped": s.get("core_dumped"), "died_while": s.get("died_while")}
        frames = backtrace.parse(e.backtrace) if e.backtrace else []
        frame = backtrace.crash_frame(frames)
        fault = _kernel_fault(kernel, s.get("pid"))
        if fault:
            kf, _ = fault
            info["library"] = os.path.basename(kf.details.get("library") or "") or None
            info["offset"] = kf.details.get("offset")
            info["fault"] = kf.details.get("access")
        if frame:
            info.setdefault("library", os.path.basename(frame.module) if frame.module else None)
            if not info.get("offset"):
                info["offset"] = frame.offset
            info["function"] = frame.function
            info["backtrace"] = [f"#{f.index} {f.where()}" for f in frames[:12]]
        elif s.get("core_dumped"):
            info["backtrace_note"] = "a core was dumped but the bundle holds no backtrace of it (see manifest.json)"
        err = _log_error(e)
        if err is not None:
            info["last_error"] = err.title
        phrase = _phase_phrase(s)
        where = ""
        if info.get("library"):
            where = f" in {info['library']}" + (f" at offset {info['offset']}" if info.get("offset") else "")
            if info.get("function"):
                where += f" ({info['function']})"
        title = f"engine {e.name} died of {how}{where}" + (f" {phrase}" if phrase else "")
        if not where and err is not None:
            title += f": {err.title}"
        crashed_at = (s.get("phases") or {}).get("crashed")
        if not isinstance(crashed_at, (int, float)) and fault and fault[0].time_base == "epoch" \
                and isinstance(fault[1].get("time"), (int, float)):
            # The shim's stamp is on the interposer's clock (both CLOCK_REALTIME, within its 50 ms poll); the
            # kernel's wall time is boot time + uptime, which drifts from it by up to seconds (dmesg -T's caveat).
            crashed_at = fault[1]["time"]
        failed = registration.last_failed(s, crashed_at if isinstance(crashed_at, (int, float)) else None)
        if failed is not None:
            at = f" in {info['library']}" + (f" at {info['offset']}" if info.get("offset") else "") \
                if info.get("library") else ""
            title = registration.crash_after(e.name, failed, how, at,
                                             crashed_at if isinstance(crashed_at, (int, float)) else None,
                                             signalled=bool(sig))
            info["registration_failed"] = failed
        info["died_of"] = title
        f = Finding(rule="engine.died", category="engine", severity="error", title=title, signature=e.name,
                    tier=CAUSE, count=1, source=f"engines/{e.name}",
                    meaning="a supervised engine ended by a signal or a failing exit code",
                    check="the library and function named, then the engine's log tail (engines/NAME/engine.log)",
                    first_time=crashed_at if isinstance(crashed_at, (int, float)) else None,
                    time_base="epoch" if isinstance(crashed_at, (int, float)) else None,
                    victims=[{"process": e.name, "pid": s.get("pid"), "engine": e.name}],
                    details={k: v for k, v in info.items() if k not in ("name", "died_of") and v not in (None, [], "")})
        findings.append(f)
        summaries.append(info)
    storms = _storms(summaries, evidence, kernel, arenas)
    findings += storms
    findings += _died_together(evidence, storms)
    findings += _failed_alive(evidence)
    return findings, summaries


# Engines that end this close together are taken as one event (the arena incident's four died within ~1 s).
TOGETHER_S = 5.0


def _ended_at(state: dict[str, Any]) -> float | None:
    raw = state.get("phases")
    phases: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for value in (phases.get("crashed"), phases.get("exited"), state.get("ended_at")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _died_together(evidence: list[EngineEvidence], storms: list[Finding]) -> list[Finding]:
    """Engines dead within TOGETHER_S of each other, from their state files' crash times and exit statuses: one
    finding, whether or not the kernel logged a fault line (a storm already grouping the same engines says it)."""
    dead = sorted(((t, e) for e in evidence if e.died and (t := _ended_at(e.state)) is not None),
                  key=lambda pair: pair[0])
    clusters: list[list[tuple[float, EngineEvidence]]] = []
    for pair in dead:
        if clusters and pair[0] - clusters[-1][-1][0] <= TOGETHER_S:
            clusters[-1].append(pair)
        else:
            clusters.append([pair])
    covered = [set(f.details.get("engines") or []) for f in storms]
    out = []
    for cluster in clusters:
        names = [e.name for _, e in cluster]
        if len(cluster) < 2 or any(set(names) <= c for c in covered):
            continue
        span = cluster[-1][0] - cluster[0][0]
        how = ", ".join(f"{e.name} {e.state.get('signal') or 'exit ' + str(e.state.get('exit_code'))}"
                        for _, e in cluster)
        out.append(Finding(
            rule="engine.died_together", category="engine", severity="critical", tier=SHARED_CRASH,
            title=f"{len(cluster)} engines died within {_secs(span)} s: {how}", signature="|".join(names),
            count=len(cluster), source="engines", first_time=cluster[0][0], last_time=cluster[-1][0],
            time_base="epoch",
            meaning="several engines ended within seconds of each other: one shared event, not independent failures",
            check="what they shared at that moment: the arena's KFD budget (registrations plus pinned allocations, "
                  "`gpuwarden arena budget`; debugfs kfd/mem_limit as root), the GPU, a reset, the node's memory",
            victims=[{"process": e.name, "pid": e.state.get("pid"), "engine": e.name} for _, e in cluster],
            details={"engines": names, "span_s": round(span, 3),
                     "short": f"{len(cluster)} engines died within {_secs(span)} s"}))
    return out


def _secs(span: float) -> str:
    return f"{span:.1f}" if span >= 0.1 else f"{span:.2f}"


def _failed_alive(evidence: list[EngineEvidence]) -> list[Finding]:
    """Engines still running after a registration of theirs failed: the crash that may come is not there yet."""
    out = []
    for e in evidence:
        if e.died or e.state.get("phase") != FAILED_REGISTRATION:
            continue
        failed = registration.last_failed(e.state)
        if failed is None:
            continue
        out.append(Finding(
            rule="engine.register_failed", category="engine", severity="error", signature=e.name, tier=CAUSE, count=1,
            title=f"{registration.what_failed(e.name, failed)}; the engine runs on without that memory registered",
            source=f"engines/{e.name}",
            meaning="a host-registration call of a supervised engine returned an error and the engine went on: "
                    "its first use of that memory as registered can crash it",
            check="the error: KFD's system-memory limit refuses a registration as hipErrorInvalidValue in today's "
                  "HIP (hipErrorOutOfMemory in older releases); confirm on this node with debugfs kfd/mem_limit "
                  "(root) and `gpuwarden arena budget`; stop the engine or restart it once the cause is fixed",
            first_time=failed.get("at"), time_base="epoch" if failed.get("at") is not None else None,
            victims=[{"process": e.name, "pid": e.state.get("pid"), "engine": e.name}],
            details={"registration_failed": failed}))
    return out


def _crashed_at(e: EngineEvidence) -> float | None:
    t = (e.state.get("phases") or {}).get("crashed")
    return float(t) if isinstance(t, (int, float)) else None


def _storms(summaries: list[dict[str, Any]], evidence: list[EngineEvidence], kernel: Report | None,
            arenas: Sequence[str]) -> list[Finding]:
    """Several engines dead of the same signal at the same place: one cause, said first."""
    groups: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}  # (signal, library, offset) -> engines
    for info in summaries:
        if info.get("signal") and info.get("library"):
            groups.setdefault((info["signal"], info["library"], info.get("offset")), []).append(info)
    by_name = {e.name: e for e in evidence}
    # An engine dead of the same signal with no fault line of its own: the kernel prints "segfault at" through
    # printk_ratelimit() (arch/x86/mm/fault.c, show_signal_msg: 10 lines per 5 s), so in a storm some are dropped.
    # It joins the group it died beside (crash times within TOGETHER_S), said so in the title.
    unplaced = [i for i in summaries if i.get("signal") and not i.get("library")]
    out = []
    for (sig, lib, off), infos in groups.items():
        if len(infos) < 2:
            continue
        crashed = [t for t in (_crashed_at(by_name[i["name"]]) for i in infos) if t is not None]
        joined = [i for i in unplaced if i["signal"] == sig and crashed and (t := _crashed_at(by_name[i["name"]]))
                  is not None and min(crashed) - TOGETHER_S <= t <= max(crashed) + TOGETHER_S]
        unplaced = [i for i in unplaced if i not in joined]
        placed = len(infos)
        infos = infos + joined
        states = [by_name[i["name"]].state for i in infos]
        times = [t for t in ((s.get("phases") or {}).get("crashed") for s in states) if isinstance(t, (int, float))]
        if len(times) < len(infos) and kernel is not None:
            times = [when for f in kernel.findings if f.rule == "userspace.crash"
                     for v in f.victims if v.get("pid") in {i.get("pid") for i in infos}
                     and isinstance(when := v.get("time"), (int, float))]
        span = f" within {max(1, math.ceil(max(times) - min(times)))} s" if len(times) >= 2 else ""
        phrases = {_phase_phrase(s) for s in states}
        after = ""
        if phrases == {"after registering"}:
            shared = any(sum(1 for e in (by_name[i["name"]] for i in infos) if a in json.dumps(e.spec)) >= 2
                         for a in arenas)
            after = ", after registering a shared arena" if shared else ", after registering"
        elif phrases == {"while registering"}:
            after = ", while registering"
        names = sorted(i["name"] for i in infos)
        title = f"{len(infos)} engines died of {sig} in {lib}" + (f" at offset {off}" if off else "") + span + after
        if joined:
            title += (f" ({len(joined)} of them without a fault line of {'its' if len(joined) == 1 else 'their'} own: "
                      f"the kernel rate-limits them; {placed} name the place)")
        out.append(Finding(rule="engine.crash_storm", category="engine", severity="critical", title=title,
                           signature=f"{sig}|{lib}|{off}", tier=SHARED_CRASH, count=len(infos), source="engines",
                           meaning="several engines died of the same signal at the same place: one shared cause",
                           check="what they shared (the arena and its registration budget: `gpuwarden arena "
                                 "budget`; the runtime version); reproduce with `gpuwarden arena probe`, stagger "
                                 "with `launch --stagger 1`",
                           victims=[{"process": i["name"], "pid": i.get("pid"), "engine": i["name"]} for i in infos],
                           details={"engines": names, "signal": sig, "library": lib, "offset": off,
                                    "without_fault_line": sorted(i["name"] for i in joined),
                                    "short": f"{len(infos)} engines died of {sig}"}))
    return out
