"""The one-line header: node, backend (SIMULATED when it is the sim node), refresh, read-only, staleness.

Shows no clock, so a fixed snapshot always renders the same.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widget import Widget

from gpuwarden.ops.foundation.model import NodeSnapshot

from gpuwarden.tui.text import duration
from gpuwarden.tui.styles import STYLES as S


class NodeHeader(Widget):
    """Drawn by render() and refreshed without a layout pass: it changes every tick while data is stale."""

    DEFAULT_CSS = "NodeHeader { height: 1; width: 1fr; }"

    def __init__(self, *, refresh_s: float, read_only: bool, replay: str | None = None, **kw):
        super().__init__(**kw)
        self._text = Text(" gpuwarden — waiting for the first snapshot…")
        self.refresh_s = refresh_s
        self.read_only = read_only
        self.replay = replay
        self._shown = ""

    def show(self, snap: NodeSnapshot | None, *, stale_for: float | None = None, error: str | None = None,
             attention: bool = False) -> None:
        t = Text()
        t.append(" gpuwarden ", style=S["header.brand"])
        if snap is not None:
            t.append(f" {snap.hostname} ", style=S["header.node"])
            t.append(f" {snap.backend}")
            if snap.simulated:
                t.append(" ")
                t.append(" SIMULATED ", style=S["header.sim"])
            if snap.agent:
                t.append("  via agent")
                if snap.agent.get("stale") and stale_for is None:
                    stale_for = float(snap.agent.get("age_s") or 0.0)  # the agent's sampling hangs
        if self.read_only:
            t.append("  ")
            t.append(" READ-ONLY ", style=S["header.ro"])
        if self.replay:
            t.append(f"  replay {Path(self.replay).name}", style=S["header.warn"])
        else:
            t.append(f"  every {self.refresh_s:g}s")
        if stale_for is not None:
            t.append("  ")
            t.append(f" STALE {duration(stale_for)} ", style=S["header.stale"])
        if error:
            t.append(f"  {error}", style=S["header.warn"])
        elif attention:
            t.append("  ")
            t.append(" NEEDS ATTENTION ", style=S["header.stale"])
        if t.markup != self._shown:
            self._shown = t.markup
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text
