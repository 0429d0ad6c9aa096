"""Events for the Events panel: what changed between two snapshots (gpuwarden.ops.sampling.changes, shared with the
agent's event log), and playbook progress lines.
"""

from __future__ import annotations

from gpuwarden.ops.sampling.changes import LEVELS, ChangeTracker, NodeEvent, diff  # noqa: F401 (the panel's vocabulary)


_PLAYBOOK_LEVEL = {"step_ok": "ok", "step_failed": "error", "step_skipped": "warning"}


def from_playbook(event) -> NodeEvent | None:
    """A playbook framework Event as a panel line; None for the chatter the panel leaves out."""
    if event.kind == "planned":
        return NodeEvent(event.ts, "info", f"{event.playbook}: planned {len(event.data.get('steps', []))} step(s)",
                         "playbook")
    if event.kind == "step_started":
        return None
    if event.kind in _PLAYBOOK_LEVEL:
        return NodeEvent(event.ts, _PLAYBOOK_LEVEL[event.kind], f"{event.playbook}/{event.step}: {event.message}",
                         "playbook")
    if event.kind == "done":
        return NodeEvent(event.ts, "ok" if event.data.get("ok") else "error", f"{event.playbook}: {event.message}",
                         "playbook")
    if event.kind == "info":
        return NodeEvent(event.ts, "info", f"{event.playbook}: {event.message}", "playbook")
    return None
