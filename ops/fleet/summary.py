"""One row per node from its `status --json` or its Prometheus series (or why there is none), worst first, and
the fleet's JSON document. The CLI table, the fleet TUI and `fleet status --json` show these rows, so they agree.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.units import fmt_bytes, sparkline
from gpuwarden.ops.fleet.fanout import HostResult

# Node states in the order of their exit codes: ok 0, attention 1, unreachable/error 2.
STATES = ("ok", "attention", "unreachable", "error")
EXIT = {"ok": 0, "attention": 1, "unreachable": 2, "error": 2}
SCHEMA = "fleet-status"
# Where a row came from: the node's own status over SSH, its agent's series in Prometheus, or nowhere.
SOURCES = ("prometheus", "ssh", "unreachable")


@dataclass(frozen=True)
class NodeHistory:
    """The node's last `window_s` from Prometheus: significant residual VRAM over time, crashes and kernel errors."""

    window_s: float
    step_s: float
    residual: tuple[tuple[float, float], ...] = ()  # (ts, bytes), oldest first
    crashes: int = 0
    kernel_errors: int = 0

    @property
    def residual_max(self) -> int:
        return int(max((v for _, v in self.residual), default=0))

    def cells(self, width: int = 12) -> dict[str, str]:
        peak = self.residual_max
        trend = sparkline([v / peak if peak else 0.0 for _, v in self.residual], width)
        events = f"{self.crashes} crash{'es' if self.crashes != 1 else ''}"
        if self.kernel_errors:
            events += f", {self.kernel_errors} kernel"
        return {"trend": f"{trend} max {fmt_bytes(peak)}" if peak else f"{trend} none", "events": events}

    def to_dict(self) -> dict[str, Any]:
        return {"window_s": self.window_s, "step_s": _round(self.step_s),
                "residual_bytes": [[t, int(v)] for t, v in self.residual], "residual_max_bytes": self.residual_max,
                "crashes": self.crashes, "kernel_errors": self.kernel_errors}


@dataclass(frozen=True)
class NodeRow:
    name: str
    target: str
    state: str
    reason: str | None = None
    hint: str | None = None
    hostname: str | None = None
    gpus: int | None = None
    residual_bytes: int | None = None
    residual_gpus: tuple[int, ...] = ()
    holders: int = 0
    engines: int = 0
    serving: int = 0
    crashed: int = 0
    drained: tuple[int, ...] = ()
    agent: bool | None = None  # None: this node's gpuwarden does not say
    backend: str | None = None
    simulated: bool | None = None
    warnings: tuple[str, ...] = ()
    taken_at: float | None = None
    duration_s: float | None = None
    via: str = "ssh"  # "prometheus" or "ssh": how a seen node was read (see source)
    note: str | None = None  # with --prometheus: why this node was read over SSH instead
    history: NodeHistory | None = None
    snapshot: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> str:
        return "unreachable" if self.state == "unreachable" else self.via

    @property
    def exit_code(self) -> int:
        return EXIT[self.state]

    def sort_key(self) -> tuple[int, int, int, str]:
        """Worst first: nodes we cannot see, then attention (most residual, most crashes), then healthy."""
        rank = {"unreachable": 0, "error": 0, "attention": 1, "ok": 2}[self.state]
        return (rank, -(self.residual_bytes or 0), -self.crashed, self.name)

    def cells(self) -> dict[str, str]:
        """The table's text for this node, column by column (see COLUMNS)."""
        if self.state in ("unreachable", "error"):
            return {"node": self.name, "gpus": "-", "residual": "-", "engines": "-", "drained": "-",
                    "agent": "-", "backend": "-", "state": self.state.upper(), "source": self.source,
                    **self._history_cells()}
        residual = "-"
        if self.residual_gpus:
            residual = f"{fmt_bytes(self.residual_bytes)} on {','.join(map(str, self.residual_gpus))}"
            if self.holders:
                residual += f" ({self.holders} holder{'s' if self.holders != 1 else ''})"
        engines = "-" if not self.engines else f"{self.serving}/{self.engines} serving"
        if self.crashed:
            engines += f" {self.crashed} CRASHED"
        backend = "SIMULATED" if self.simulated and self.backend == "sim" else \
            (self.backend or "?") + (" SIMULATED" if self.simulated else "")
        agent = {True: "up", False: "down", None: "-"}[self.agent]
        state = "ok" if self.state == "ok" else "ATTENTION"
        return {"node": self.name, "gpus": str(self.gpus if self.gpus is not None else "?"), "residual": residual,
                "engines": engines, "drained": ",".join(map(str, self.drained)) or "-", "agent": agent,
                "backend": backend, "state": state, "source": self.source, **self._history_cells()}

    def _history_cells(self) -> dict[str, str]:
        return self.history.cells() if self.history else {"trend": "-", "events": "-"}

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.name, "target": self.target, "state": self.state, "exit_code": self.exit_code,
                "reason": self.reason, "hint": self.hint, "hostname": self.hostname, "gpus": self.gpus,
                "residual_bytes": self.residual_bytes, "residual_gpus": list(self.residual_gpus),
                "holders": self.holders,
                "engines": {"total": self.engines, "serving": self.serving, "crashed": self.crashed},
                "drained": list(self.drained), "agent": self.agent, "backend": self.backend,
                "simulated": self.simulated, "warnings": list(self.warnings), "taken_at": self.taken_at,
                "taken_at_iso": jsondoc.iso(self.taken_at), "duration_s": _round(self.duration_s),
                "source": self.source, "source_note": self.note,
                "history": self.history.to_dict() if self.history else None}


COLUMNS = (("node", "NODE"), ("state", "STATE"), ("gpus", "GPUS"), ("residual", "RESIDUAL"), ("engines", "ENGINES"),
           ("drained", "DRAINED"), ("agent", "AGENT"), ("backend", "BACKEND"), ("source", "SOURCE"))
# Shown when some row has Prometheus history (fleet status --history, the fleet console with --prometheus).
HISTORY_COLUMNS = (("trend", "RESIDUAL TREND"), ("events", "CRASHES"))
# What a narrow screen keeps first.
PRIORITY = ("node", "state", "residual", "engines", "trend", "events", "backend", "gpus", "drained", "agent", "source")


def columns(rows: list[NodeRow]) -> tuple[tuple[str, str], ...]:
    """The table's columns for these rows: the history ones only when there is history to show."""
    return COLUMNS + (HISTORY_COLUMNS if any(r.history for r in rows) else ())


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def agent_up(snap: dict[str, Any]) -> bool | None:
    """Whether the node's agent served this status (issue 10: the snapshot document then carries an "agent"
    object). A gpuwarden.snapshot document without one was sampled by `status` itself: no agent runs. An
    older node's plain snapshot (no "schema") cannot say: None."""
    agent = snap.get("agent")
    if isinstance(agent, dict):
        return not agent.get("stale", False)
    if isinstance(agent, bool):
        return agent
    return False if isinstance(snap.get("schema"), str) else None


def _warning_text(w: Any) -> str:
    """A warning as people read it: structured warnings ({"code", "message"}) or plain strings of older nodes."""
    return str(w.get("message", w)) if isinstance(w, dict) else str(w)


def from_snapshot(result: HostResult, snap: dict[str, Any]) -> NodeRow:
    residual = [r for r in snap.get("residual", []) if r.get("significant") or r.get("holders")]
    engines = snap.get("engines", [])
    crashed = sum(1 for e in engines if e.get("phase") == "crashed")
    attention = bool(residual) or crashed > 0 or snap.get("needs_attention") is True
    if result.exit_status == 1:
        attention = True  # the node's own verdict wins when it knows more than these fields show
    return NodeRow(
        name=result.host.name, target=result.host.target, state="attention" if attention else "ok",
        hostname=snap.get("hostname"), gpus=len(snap.get("gpus", [])),
        residual_bytes=sum(max(0, r.get("residual") or 0) for r in residual) if residual else None,
        residual_gpus=tuple(r.get("gpu_index") for r in residual),
        holders=sum(len(r.get("holders", [])) for r in residual),
        engines=len(engines), serving=sum(1 for e in engines if e.get("phase") == "serving"), crashed=crashed,
        drained=tuple(snap.get("drained", [])), agent=agent_up(snap), backend=snap.get("backend"),
        simulated=snap.get("simulated"), warnings=tuple(_warning_text(w) for w in snap.get("warnings", [])),
        taken_at=snap.get("taken_at"), duration_s=result.duration_s, snapshot=snap)


def from_result(result: HostResult) -> NodeRow:
    """A row from one node's `gpuwarden status --json` run (exit 0 healthy, 1 attention, 2 error)."""
    def unseen(state: str, reason: str | None, hint: str | None) -> NodeRow:
        return NodeRow(name=result.host.name, target=result.host.target, state=state, reason=reason, hint=hint,
                       duration_s=result.duration_s)

    if not result.reached:
        return unseen("unreachable", result.error, result.hint)
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        first = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
        return unseen("error", f"status exited {result.exit_status} without JSON: {first[:200]}",
                      "run `gpuwarden status` on that node")
    if "error" in doc and "gpus" not in doc:  # gpuwarden.error/1: the node's own one-line failure
        return unseen("error", str(doc.get("error")), doc.get("hint"))
    return from_snapshot(result, doc)


def worst_first(rows: list[NodeRow]) -> list[NodeRow]:
    return sorted(rows, key=NodeRow.sort_key)


def exit_code(rows: list[NodeRow]) -> int:
    """The worst node's: 0 all healthy, 1 some need attention, 2 some could not be seen."""
    return max((r.exit_code for r in rows), default=0)


def document(rows: list[NodeRow], taken_at: float | None = None, duration_s: float | None = None,
             prometheus: dict[str, Any] | None = None, duplicates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The gpuwarden.fleet-status/1 document; `prometheus` ({"url", "error"}) when --prometheus was asked;
    `duplicates` the inventory entries that named a node again (inventory.Duplicate.to_dict)."""
    taken_at = time.time() if taken_at is None else taken_at
    counts = {s: sum(1 for r in rows if r.state == s) for s in STATES}
    return jsondoc.document(SCHEMA, {
        "taken_at": taken_at, "taken_at_iso": jsondoc.iso(taken_at), "duration_s": _round(duration_s),
        "exit_code": exit_code(rows),
        "counts": {"nodes": len(rows), **counts}, "sources": {s: sum(1 for r in rows if r.source == s) for s in SOURCES},
        "prometheus": prometheus, "duplicates": list(duplicates or []), "nodes": [r.to_dict() for r in worst_first(rows)]})


def table(rows: list[NodeRow]) -> str:
    """The fleet as a text table, worst first, with a count line under it."""
    cols = columns(rows)
    cells = [r.cells() for r in worst_first(rows)]
    widths = {k: max([len(title)] + [len(c[k]) for c in cells]) for k, title in cols}
    lines = ["  ".join(title.ljust(widths[k]) for k, title in cols).rstrip()]
    for c in cells:
        lines.append("  ".join(c[k].ljust(widths[k]) for k, _ in cols).rstrip())
    counts = {s: sum(1 for r in rows if r.state == s) for s in STATES}
    lines.append("")
    lines.append(f"{len(rows)} node(s): {counts['ok']} ok, {counts['attention']} need attention, "
                 f"{counts['unreachable'] + counts['error']} not seen")
    # Nodes Prometheus could not vouch for, grouped by why: a scrape that fails is worth fixing tonight too.
    for note, names in fallback_notes(rows).items():
        lines.append(f"over SSH ({note}): {', '.join(names)}")
    # Reasons get whole lines of their own: the one thing the operator needs about a node we cannot see.
    for r in worst_first(rows):
        if r.state in ("unreachable", "error"):
            lines.append(f"{r.name}: {r.reason}")
            if r.hint:
                lines.append(f"  hint: {r.hint}")
    return "\n".join(lines)


def fallback_notes(rows: list[NodeRow]) -> dict[str, list[str]]:
    """Why nodes were not read from Prometheus -> those nodes, in the table's order."""
    out: dict[str, list[str]] = {}
    for r in worst_first(rows):
        if r.note:
            out.setdefault(r.note, []).append(r.name)
    return out
