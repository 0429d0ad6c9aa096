"""The Engines panel: name, GPU, pid, phase (coloured), uptime, restarts, exit reason and the last log line.

Uptime counts to the snapshot's own time, so a fixed snapshot renders the same at any hour.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ops.model import EngineInfo, NodeSnapshot

from .. import text
from ..styles import STYLES as S

COLUMNS = ("ENGINE", "GPU", "PID", "PHASE", "UP", "RST", "EXIT", "LAST LOG LINE")
PHASE_STYLE = {"serving": S["phase.good"], "registered": S["phase.good"], "crashed": S["phase.bad"], "stale": S["phase.bad"],
               "exited": "dim", "stopping": S["phase.busy"]}


def exit_reason(e: EngineInfo) -> str:
    if e.signal:
        return e.signal + (" core" if e.core_dumped else "")
    if e.exit_code is not None and e.phase in ("exited", "crashed"):
        return f"code {e.exit_code}"
    return ""


class EnginesPanel(DataTable):
    def __init__(self, **kw):
        super().__init__(cursor_type="row", **kw)
        self.border_title = "Engines"
        self._rows: list = []
        self._engines: dict[str, EngineInfo] = {}
        self._empty = False

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def selected(self) -> EngineInfo | None:
        if not self.row_count or self._empty:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return self._engines.get(str(key.value))

    def show(self, snap: NodeSnapshot, width: int) -> None:
        log_w = max(12, width - 64)
        rows = []
        for e in snap.engines:
            up = None if e.started_at is None or e.phase in ("exited", "crashed") else snap.taken_at - e.started_at
            rows.append((e.name, [
                text.clip(e.name, 16), "-" if e.gpu is None else str(e.gpu), str(e.pid or "-"),
                Text(e.phase, style=PHASE_STYLE.get(e.phase, S["phase.busy"])), text.duration(up), str(e.restarts),
                Text(exit_reason(e), style=S["phase.bad"] if e.signal else ""), text.clip(e.last_log_line, log_w),
            ]))
        fingerprint = [(k, tuple(str(c) for c in row)) for k, row in rows] + [log_w]
        self._engines = {e.name: e for e in snap.engines}
        if fingerprint == self._rows:
            return
        cursor = self.cursor_row
        self.clear()
        self._empty = not rows
        self.border_subtitle = "none supervised" if not rows else f"{len(rows)} engine(s)"
        for key, row in rows:
            self.add_row(*row, key=key)
        self._rows = fingerprint
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1), animate=False)
