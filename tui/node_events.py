"""Events for the Events panel: what changed between two snapshots, and playbook progress lines.

Derived by diffing consecutive NodeSnapshots, so the panel needs nothing from the engines but their state.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.model import EngineInfo, NodeSnapshot
from ops.units import fmt_bytes

LEVELS = ("info", "ok", "warning", "error")


@dataclass(frozen=True)
class NodeEvent:
    ts: float
    level: str  # one of LEVELS
    text: str


def _engine_exit(e: EngineInfo) -> str:
    if e.signal:
        return e.signal + (" (core dumped)" if e.core_dumped else "")
    if e.exit_code is not None:
        return f"exit code {e.exit_code}"
    return "no exit status"


def _engine_events(ts: float, before: EngineInfo | None, now: EngineInfo) -> list[NodeEvent]:
    if before is None:
        if now.phase == "crashed":
            return [NodeEvent(ts, "error", f"engine {now.name} crashed: {_engine_exit(now)}")]
        return [NodeEvent(ts, "info", f"engine {now.name} on GPU {_gpu(now.gpu)}: {now.phase}")]
    out = []
    if now.restarts > before.restarts:
        out.append(NodeEvent(ts, "warning", f"engine {now.name} restarted (restart {now.restarts})"))
    if now.phase != before.phase:
        if now.phase == "crashed":
            out.append(NodeEvent(ts, "error", f"engine {now.name} crashed: {_engine_exit(now)}"))
        elif now.phase == "stale":
            out.append(NodeEvent(ts, "warning", f"engine {now.name}: its shim is gone (state is stale)"))
        else:
            level = "ok" if now.phase in ("registered", "serving") else "info"
            out.append(NodeEvent(ts, level, f"engine {now.name}: {before.phase} → {now.phase}"))
    return out


def _gpu(index: int | None) -> str:
    return "-" if index is None else str(index)


def diff(before: NodeSnapshot | None, now: NodeSnapshot) -> list[NodeEvent]:
    """Events that explain how `now` differs from `before` (None: the first snapshot), oldest first."""
    ts = now.taken_at
    out: list[NodeEvent] = []
    if before is None:
        out.append(NodeEvent(ts, "info", f"watching {now.hostname}: {len(now.gpus)} GPU(s) via {now.backend}"
                             + (" (SIMULATED)" if now.simulated else "")))
    old_engines = {e.name: e for e in before.engines} if before else {}
    for e in now.engines:
        out.extend(_engine_events(ts, old_engines.get(e.name), e))
    if before is not None:
        for name in sorted(set(old_engines) - {e.name for e in now.engines}):
            out.append(NodeEvent(ts, "info", f"engine {name} removed"))

    old_res = {r.gpu_index: r for r in before.residual} if before else {}
    for r in now.residual:
        prev = old_res.get(r.gpu_index)
        was = prev is not None and prev.significant
        if r.significant and not was:
            who = f"; {len(r.holders)} holder(s)" if r.holders else "; no live holder (ownerless)"
            out.append(NodeEvent(ts, "error", f"GPU {r.gpu_index}: residual VRAM {fmt_bytes(r.residual)} appeared{who}"))
        elif was and not r.significant:
            out.append(NodeEvent(ts, "ok", f"GPU {r.gpu_index}: residual VRAM cleared"))
        old_holders = {(h.pid, h.reason) for h in prev.holders} if prev else set()
        for h in r.holders:
            if prev is not None and (h.pid, h.reason) not in old_holders:
                out.append(NodeEvent(ts, "warning", f"GPU {r.gpu_index}: pid {h.pid} holds VRAM ({h.reason})"))

    old_warnings = set(before.warnings) if before else set()
    for w in now.warnings:
        # The header already says SIMULATED; every other warning is worth a line when it first shows.
        if w not in old_warnings and not w.startswith("SIMULATED"):
            out.append(NodeEvent(ts, "warning", w))
    if before is not None:
        for g in sorted(set(now.drained) - set(before.drained)):
            out.append(NodeEvent(ts, "warning", f"GPU {g} drained"))
        for g in sorted(set(before.drained) - set(now.drained)):
            out.append(NodeEvent(ts, "ok", f"GPU {g} back in service (undrained)"))
        old_gpus = {g.index for g in before.gpus}
        new_gpus = {g.index for g in now.gpus}
        for g in sorted(old_gpus - new_gpus):
            out.append(NodeEvent(ts, "error", f"GPU {g} disappeared from the backend"))
        for g in sorted(new_gpus - old_gpus):
            out.append(NodeEvent(ts, "info", f"GPU {g} appeared"))
    return out


_PLAYBOOK_LEVEL = {"step_ok": "ok", "step_failed": "error", "step_skipped": "warning"}


def from_playbook(event) -> NodeEvent | None:
    """A playbook framework Event as a panel line; None for the chatter the panel leaves out."""
    if event.kind == "planned":
        return NodeEvent(event.ts, "info", f"{event.playbook}: planned {len(event.data.get('steps', []))} step(s)")
    if event.kind == "step_started":
        return None
    if event.kind in _PLAYBOOK_LEVEL:
        return NodeEvent(event.ts, _PLAYBOOK_LEVEL[event.kind], f"{event.playbook}/{event.step}: {event.message}")
    if event.kind == "done":
        return NodeEvent(event.ts, "ok" if event.data.get("ok") else "error", f"{event.playbook}: {event.message}")
    if event.kind == "info":
        return NodeEvent(event.ts, "info", f"{event.playbook}: {event.message}")
    return None
