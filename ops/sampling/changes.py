"""Node events derived from consecutive snapshots: residual appeared/cleared, holders, engines, drains, GPUs.

The TUI's Events panel and the agent's event log both come from here, so they say the same thing.
ChangeTracker remembers when each residual appeared, so "cleared" can say how long it lasted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwarden.ops.foundation.model import EngineInfo, NodeSnapshot
from gpuwarden.ops.foundation.units import fmt_bytes

LEVELS = ("info", "ok", "warning", "error")
# What an event is about; scripts filter on it (the agent's events schema lists the same kinds).
KINDS = (
    "watching", "engine-phase", "engine-crashed", "engine-restarted", "engine-removed", "residual-appeared",
    "residual-cleared", "holder-appeared", "holder-gone", "warning", "drained", "undrained", "gpu-gone",
    "gpu-appeared", "kernel", "playbook", "policy", "agent", "kubernetes",
)


@dataclass(frozen=True)
class NodeEvent:
    ts: float
    level: str  # one of LEVELS
    text: str
    kind: str = "info"  # one of KINDS
    gpu: int | None = None
    data: dict[str, Any] = field(default_factory=dict, compare=False)


def _engine_exit(e: EngineInfo) -> str:
    if e.signal:
        return e.signal + (" (core dumped)" if e.core_dumped else "")
    if e.exit_code is not None:
        return f"exit code {e.exit_code}"
    return "no exit status"


def _engine_events(ts: float, before: EngineInfo | None, now: EngineInfo) -> list[NodeEvent]:
    data = {"engine": now.name, "phase": now.phase}
    if before is None:
        if now.phase == "crashed":
            return [NodeEvent(ts, "error", f"engine {now.name} crashed: {_engine_exit(now)}", "engine-crashed",
                              now.gpu, data)]
        return [NodeEvent(ts, "info", f"engine {now.name} on GPU {_gpu(now.gpu)}: {now.phase}", "engine-phase",
                          now.gpu, data)]
    out = []
    if now.restarts > before.restarts:
        out.append(NodeEvent(ts, "warning", f"engine {now.name} restarted (restart {now.restarts})",
                             "engine-restarted", now.gpu, data))
    if now.phase != before.phase:
        data = {**data, "was": before.phase}
        if now.phase == "crashed":
            out.append(NodeEvent(ts, "error", f"engine {now.name} crashed: {_engine_exit(now)}", "engine-crashed",
                                 now.gpu, data))
        elif now.phase == "stale":
            out.append(NodeEvent(ts, "warning", f"engine {now.name}: its shim is gone (state is stale)",
                                 "engine-phase", now.gpu, data))
        else:
            level = "ok" if now.phase in ("registered", "serving") else "info"
            out.append(NodeEvent(ts, level, f"engine {now.name}: {before.phase} → {now.phase}", "engine-phase",
                                 now.gpu, data))
    return out


def _gpu(index: int | None) -> str:
    return "-" if index is None else str(index)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def diff(before: NodeSnapshot | None, now: NodeSnapshot,
         residual_since: dict[int, float] | None = None) -> list[NodeEvent]:
    """Events that explain how `now` differs from `before` (None: the first snapshot), oldest first.

    `residual_since`: GPU -> when its residual appeared (ChangeTracker keeps it), for the cleared event's duration."""
    ts = now.taken_at
    out: list[NodeEvent] = []
    if before is None:
        out.append(NodeEvent(ts, "info", f"watching {now.hostname}: {len(now.gpus)} GPU(s) via {now.backend}"
                             + (" (SIMULATED)" if now.simulated else ""), "watching"))
    old_engines = {e.name: e for e in before.engines} if before else {}
    for e in now.engines:
        out.extend(_engine_events(ts, old_engines.get(e.name), e))
    if before is not None:
        for name in sorted(set(old_engines) - {e.name for e in now.engines}):
            out.append(NodeEvent(ts, "info", f"engine {name} removed", "engine-removed", old_engines[name].gpu,
                                 {"engine": name}))

    old_res = {r.gpu_index: r for r in before.residual} if before else {}
    for r in now.residual:
        prev = old_res.get(r.gpu_index)
        was = prev is not None and prev.significant
        gi = r.gpu_index
        if r.significant and not was:
            who = f"; {len(r.holders)} holder(s)" if r.holders else "; no live holder (ownerless)"
            out.append(NodeEvent(ts, "error", f"GPU {gi}: residual VRAM {fmt_bytes(r.residual)} appeared{who}",
                                 "residual-appeared", gi, {"bytes": r.residual, "holders": len(r.holders)}))
        elif was and not r.significant:
            since = (residual_since or {}).get(gi)
            lasted = f" after {_duration(ts - since)}" if since is not None else ""
            out.append(NodeEvent(ts, "ok", f"GPU {gi}: residual VRAM cleared{lasted}", "residual-cleared", gi,
                                 {"lasted_s": round(ts - since, 3) if since is not None else None}))
        old_holders = {(h.pid, h.reason) for h in prev.holders} if prev else set()
        for h in r.holders:
            if prev is not None and (h.pid, h.reason) not in old_holders:
                out.append(NodeEvent(ts, "warning", f"GPU {gi}: pid {h.pid} holds VRAM ({h.reason})",
                                     "holder-appeared", gi, {"pid": h.pid, "reason": h.reason}))
        if prev is not None:
            new_holders = {(h.pid, h.reason) for h in r.holders}
            for pid, reason in sorted(old_holders - new_holders, key=lambda x: (x[0] or 0, x[1])):
                out.append(NodeEvent(ts, "info", f"GPU {gi}: pid {pid} no longer holds VRAM ({reason})",
                                     "holder-gone", gi, {"pid": pid, "reason": reason}))

    if before is not None:
        # A GPU whose driver answers again: its "did not answer" warning said when it went; this says it is back.
        now_by = {g.index: g for g in now.gpus}
        for g in before.gpus:
            back = now_by.get(g.index)
            if g.stale is not None and back is not None and back.stale is None:
                out.append(NodeEvent(ts, "ok", f"GPU {g.index}: its driver answers again ({g.stale.source} read of "
                                     f"{g.stale.what} was stuck for {_duration(ts - g.stale.since)})", "warning",
                                     g.index, {"code": "stale", "cleared": True}))

    old_warnings = set(before.warnings) if before else set()
    for w in now.warnings:
        # The header already says SIMULATED; every other warning is worth a line when it first shows.
        if w not in old_warnings and w.code != "simulated":
            out.append(NodeEvent(ts, "warning", w.message, "warning", w.gpu, {"code": w.code}))
    if before is not None:
        for index in sorted(set(now.drained) - set(before.drained)):
            out.append(NodeEvent(ts, "warning", f"GPU {index} drained", "drained", index))
        for index in sorted(set(before.drained) - set(now.drained)):
            out.append(NodeEvent(ts, "ok", f"GPU {index} back in service (undrained)", "undrained", index))
        old_gpus = {g.index for g in before.gpus}
        new_gpus = {g.index for g in now.gpus}
        for index in sorted(old_gpus - new_gpus):
            out.append(NodeEvent(ts, "error", f"GPU {index} disappeared from the backend", "gpu-gone", index))
        for index in sorted(new_gpus - old_gpus):
            out.append(NodeEvent(ts, "info", f"GPU {index} appeared", "gpu-appeared", index))
    return out


class ChangeTracker:
    """Feeds snapshots one by one and returns the events each brings; remembers when each residual appeared."""

    def __init__(self) -> None:
        self.last: NodeSnapshot | None = None
        self.residual_since: dict[int, float] = {}

    def feed(self, snap: NodeSnapshot) -> list[NodeEvent]:
        events = diff(self.last, snap, self.residual_since)
        for r in snap.residual:
            if r.significant:
                self.residual_since.setdefault(r.gpu_index, snap.taken_at)
            else:
                self.residual_since.pop(r.gpu_index, None)
        self.last = snap
        return events
