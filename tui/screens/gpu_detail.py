"""One GPU in detail: its numbers, its charts (last hour, seven days), where its VRAM went (processes, baseline,
residual) and who holds the residual.

Follows the live snapshots while open; Escape goes back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Static

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.safetext import bracketed

from gpuwarden.tui import text
from gpuwarden.tui.sensor_text import sensor_lines
from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip

if TYPE_CHECKING:
    from gpuwarden.tui.widgets.charts import ChartsPane


def gpu_summary(snap: NodeSnapshot, index: int) -> Text:
    g = snap.gpu(index)
    t = Text()
    if g is None:
        t.append(f"GPU {index} is not in the latest snapshot", style=S["phase.bad"])
        return t
    t.append(f"GPU {g.index}  {g.name}", style="bold")
    t.append(f"  ({g.vendor}{', bus ' + g.bus_id if g.bus_id else ''})")
    if g.index in snap.drained:
        t.append("  DRAINED", style=S["drained"])
    if g.compute_partition or g.memory_partition:
        t.append(f"\npartition {g.compute_partition or 'n/a'} compute, {g.memory_partition or 'n/a'} memory")
        shared = [o.index for o in snap.gpus if o.index != g.index and g.bus_id and o.bus_id == g.bus_id]
        if shared:
            t.append(f" — one physical device with GPU {', '.join(map(str, shared))}: a reset acts on all of them")
    t.append(f"\nVRAM {text.size(g.vram_used)} of {text.size(g.vram_total)}   GTT {text.size(g.gtt_used)} of "
             f"{text.size(g.gtt_total)}   busy {text.num(g.busy_percent, '.0f', '%')}   "
             f"{text.num(g.temperature_c, '.0f', 'C')}   {text.num(g.power_w, '.0f', 'W')}")
    if g.sensors is not None:  # a replayed bundle from before sensors has none: nothing to show
        t.append(sensor_lines(g.sensors, g.power_w))
    if g.device_files:
        t.append(f"\ndevice files: {', '.join(g.device_files)}", style="dim")
    r = next((r for r in snap.residual if r.gpu_index == index), None)
    if r is not None:
        base = "not recorded" if r.baseline is None else text.size(r.baseline)
        t.append(f"\nused {text.size(r.device_used)} = live processes {text.size(r.accounted)} + baseline {base} + "
                 f"residual ")
        t.append(text.size(r.residual) if r.residual is not None else "unknown",
                 style=S["residual"] if r.significant else "")
        if r.significant and not r.holders:
            t.append("\nno holder found: an ownerless leak that only a GPU reset clears", style=S["residual"])
        for h in r.holders:
            t.append(f"\nholder pid {h.pid if h.pid is not None else '-'}: ", style=S["residual"])
            t.append(f"{h.reason}, {text.size(h.vram_bytes) if h.vram_bytes is not None else 'size unknown'} — "
                     f"{h.detail}" + (f" {bracketed(text.command_line(h.command, 40))}" if h.command else "")
                     + (f" — pod {h.namespace}/{h.pod}" + (" (deleted)" if h.pod_deleted_at else "") if h.pod else ""))
    return t


class GpuDetailScreen(Screen[None]):
    # q and backspace as well as Esc: a terminal holds a lone Esc back ~100 ms (ESCDELAY) in case more follows.
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back"), ("c", "charts", "Charts")]

    def __init__(self, index: int, snap: NodeSnapshot, *, charts: bool = False):
        super().__init__()
        self.index = index
        self.snap = snap
        self.charts_first = charts  # opened for its charts (c): scrolled down to them
        self._summary: tuple | None = None  # what the summary and the table show now
        self._rows: list[tuple] | None = None
        self._charts: ChartsPane | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="gpu-summary")
            table = DataTable(cursor_type="row", id="gpu-procs")
            table.border_title = "Processes on this GPU"
            yield table
            yield self._charts_or_why()
        yield KeyStrip([("q/esc", "Back"), ("c", "Charts")])

    def _charts_or_why(self) -> Static | ChartsPane:
        """The charts, or one line on why not: a chart library that does not import costs this view its charts,
        never the console (a device run had plotext 6 installed beside textual-plotext 1.0.1, which needs < 6)."""
        try:
            # deferred: a broken chart library must cost this view its charts, not the console (ImportError below)
            from gpuwarden.tui.widgets.charts import ChartsPane
        except ImportError as exc:
            return Static(Text(f"charts unavailable: {exc}. Reinstall the chart library gpuwarden depends on: "
                               "pip install --force-reinstall 'textual-plotext>=1.0.1' 'plotext<6'",
                               style=S["phase.bad"]), id="charts-missing")
        self._charts = ChartsPane(self.index)
        return self._charts

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("PID", "USER", "STATE", "VRAM", "FROM", "CONTAINER", "COMMAND")
        self.show_snapshot(self.snap)

    def charts_drawn(self, builds: int) -> None:
        """(ChartsPane) A build has landed: opened for the charts, scroll to them now that they have their size
        (again after the next builds: the first can land before the view is laid out)."""
        if self.charts_first:
            self.charts_first = builds < 3
            self.call_after_refresh(self.action_charts)

    def action_charts(self) -> None:
        """Scroll down to the charts (below the processes), or to the line that says why there are none."""
        target = self._charts if self._charts is not None else self.query_one("#charts-missing")
        self.query_one(VerticalScroll).scroll_to_widget(target, animate=False, top=True)

    def show_snapshot(self, snap: NodeSnapshot) -> None:
        self.snap = snap
        # Redrawn only when changed: a new table or summary re-lays the whole view out, charts included.
        summary = gpu_summary(snap, self.index)
        if (summary.plain, summary.spans) != self._summary:
            self._summary = (summary.plain, summary.spans)
            self.query_one("#gpu-summary", Static).update(summary)
        if self._charts is not None:
            self._charts.update(snap)
        g = snap.gpu(self.index)
        files = set(g.device_files) if g else set()
        rows = []
        for p in snap.processes:
            if self.index not in p.vram and not files.intersection(p.device_files):
                continue
            vram = p.vram.get(self.index)
            rows.append((str(p.pid), p.user or "?", Text(p.state, style="" if p.alive else S["phase.bad"]),
                         text.size(vram) if vram is not None else "files only", p.sources.get(self.index, "-"),
                         f"{p.namespace}/{p.pod}" if p.pod else (p.container or "-"),  # Kubernetes: the pod
                         text.command_line(p.command, 60)))
        shown = [tuple((c.plain, str(c.style)) if isinstance(c, Text) else c for c in row) for row in rows]
        if shown == self._rows:
            return
        self._rows = shown
        table = self.query_one(DataTable)
        table.clear()
        for row in rows:
            table.add_row(*row, key=row[0])
