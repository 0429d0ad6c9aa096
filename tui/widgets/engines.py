"""The Engines panel: name, GPU, pid, phase (coloured), uptime, restarts, exit reason and the last log line.

Uptime counts to the snapshot's own time, so a fixed snapshot renders the same at any hour.
"""

from __future__ import annotations

from rich.text import Text

from gpuwarden.ops.foundation.model import EngineInfo, NodeSnapshot

from gpuwarden.tui import text
from gpuwarden.tui.widgets.rowtable import FilteredRowTable
from gpuwarden.tui.styles import STYLES as S

COLUMNS = ("ENGINE", "GPU", "PID", "PHASE", "UP", "RST", "EXIT", "LAST LOG LINE")
PHASE_STYLE = {"serving": S["phase.good"], "registered": S["phase.good"], "crashed": S["phase.bad"], "stale": S["phase.bad"],
               "exited": "dim", "stopping": S["phase.busy"]}


def exit_reason(e: EngineInfo) -> str:
    if e.signal:
        return e.signal + (" core" if e.core_dumped else "")
    if e.exit_code is not None and e.phase in ("exited", "crashed"):
        return f"code {e.exit_code}"
    return ""


class EnginesPanel(FilteredRowTable):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "Engines"
        self.subtitle = ""  # the count; the app adds how old the data is when it is stale
        self.stale_note = ""
        self._engines: dict[str, EngineInfo] = {}

    def on_mount(self) -> None:
        self.set_columns(COLUMNS)

    def selected(self) -> EngineInfo | None:
        key = self.cursor_key()
        return None if key is None else self._engines.get(key)

    def show(self, snap: NodeSnapshot, width: int) -> None:
        rows = []
        for e in snap.engines:
            up = None if e.started_at is None or e.phase in ("exited", "crashed") else snap.taken_at - e.started_at
            rows.append((e.name, [
                text.clip(e.name, 16), "-" if e.gpu is None else str(e.gpu), str(e.pid or "-"),
                Text(e.phase, style=PHASE_STYLE.get(e.phase, S["phase.busy"])), text.duration(up), str(e.restarts),
                Text(exit_reason(e), style=S["phase.bad"] if e.signal else ""), text.clip(e.last_log_line, 200),
            ]))
        self._engines = {e.name: e for e in snap.engines}
        self._count = len(rows)
        self._simulated = snap.simulated
        self.set_rows(rows)
        self._show_subtitle()

    def set_filter(self, value: str) -> None:
        super().set_filter(value)
        self._show_subtitle()

    def _show_subtitle(self) -> None:
        count = getattr(self, "_count", 0)
        self.subtitle = " · ".join(x for x in (
            "none supervised" if not count else f"{count} engine(s)", self.filter_note()) if x)
        if count and self.hidden == count:
            self.set_empty_text(f"nothing matches /{self.filter_text} (/ then Esc clears it)")
        else:
            self.set_empty_text("no engines supervised: l (or `gpuwarden launch`) starts the engines the node "
                                "config names"
                                + ("\nsimulated node: `gpuwarden sim scenario arena` starts the arena drill"
                                   if getattr(self, "_simulated", False) else ""))
        shown = " · ".join(x for x in (self.subtitle, self.stale_note) if x)
        if shown != self.border_subtitle:
            self.border_subtitle = shown
