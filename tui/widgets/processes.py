"""The Processes panel: every GPU process with user, pod/container, GPUs, VRAM, GPU%/CPU%/RSS, state, age, TIME,
VRAM trend.

Sort by any column (< > pick it, I reverses, or click its title), filter with /, T shows the tree by parent
(a tenant's workers under it). The selected process is what k stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rich.text import Text
from textual.binding import Binding

from gpuwarden.ops.foundation.model import GpuProcess, NodeSnapshot, ProcessLoad

from gpuwarden.tui import text
from gpuwarden.tui.history import ProcessVramHistory
from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.rowtable import RowTable

TREND_AT = 120  # room for the sparkline


@dataclass(frozen=True)
class Column:
    title: str
    key: Callable[[GpuProcess, float, ProcessLoad | None], Any]  # sort key from (process, snapshot time, its load)
    load: bool = False  # shown only when the snapshot carries per-process load
    min_width: int = 0  # shown only from this panel width up


def workload(p: GpuProcess) -> str:
    """namespace/pod/container when the process record knows them (Kubernetes), else the container id."""
    if p.pod:
        return "/".join(x for x in (p.namespace, p.pod, p.container_name) if x)
    return (p.container or "")[:12] or "-"


def _age(p: GpuProcess, now: float, load: ProcessLoad | None = None) -> float:
    return now - p.start_time if p.start_time else -1.0


def _num(value: float | None) -> float:
    return -1.0 if value is None else value


COLUMNS = (
    Column("PID", lambda p, now, load: p.pid),
    Column("USER", lambda p, now, load: p.user or ""),
    Column("POD/CONTAINER", lambda p, now, load: workload(p)),
    Column("GPU", lambda p, now, load: sorted(p.vram) or [-1]),
    Column("VRAM", lambda p, now, load: sum(p.vram.values())),
    Column("GPU%", lambda p, now, load: _num(load.gpu_percent if load else None), load=True),
    Column("CPU%", lambda p, now, load: _num(load.cpu_percent if load else None), load=True, min_width=100),
    Column("RSS", lambda p, now, load: _num(load.rss_bytes if load else None), load=True, min_width=100),
    Column("STATE", lambda p, now, load: p.state),
    Column("AGE", _age),
    Column("TIME", lambda p, now, load: _num(load.cpu_time_s if load else None), load=True, min_width=120),
    Column("COMMAND", lambda p, now, load: p.command),
)
VRAM_COL = 4
# Sizes, loads and ages sort largest first when their title is clicked.
LARGEST_FIRST = frozenset({"VRAM", "GPU%", "CPU%", "RSS", "AGE", "TIME"})
TREND_TITLE = "VRAM 5 MIN"


def cpu_time(seconds: float | None) -> str:
    """CPU time as top's TIME+ column: 0:07.52, 12:03.1, 3:04:11 (hours once there are any)."""
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{int(seconds) // 60}:{seconds % 60:05.2f}"
    s = int(seconds)
    return f"{s // 3600}:{(s % 3600) // 60:02d}:{s % 60:02d}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


class ProcessesPanel(RowTable):
    BINDINGS = [
        Binding("less_than_sign", "sort(-1)", "Sort ←", show=False),
        Binding("greater_than_sign", "sort(1)", "Sort →", show=False),
        Binding("I", "reverse", "Reverse sort", show=False),
        Binding("T", "tree", "Tree", show=False),
        Binding("slash", "app.filter_table", "Filter", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "Processes"
        self.subtitle = ""
        self.stale_note = ""
        self.sort_col = VRAM_COL  # VRAM, biggest first: who holds the memory is the first question
        self.reverse = True
        self.tree_view = False
        self.filter_text = ""
        self.history = ProcessVramHistory()
        self._procs: dict[str, GpuProcess] = {}
        self._snap: NodeSnapshot | None = None
        self._width = 80
        self.fit_last = _fit_command

    def selected(self) -> GpuProcess | None:
        key = self.cursor_key()
        return None if key is None else self._procs.get(key)

    # --- keys and mouse ---------------------------------------------------------------------------
    def visible(self) -> list[int]:
        """COLUMNS indexes shown at this width for this snapshot (the load columns need a snapshot that has it)."""
        loads = bool(self._snap is not None and self._snap.process_load)
        return [i for i, c in enumerate(COLUMNS) if (loads or not c.load) and self._width >= c.min_width]

    def action_sort(self, delta: int) -> None:
        shown = self.visible()
        at = shown.index(self.sort_col) if self.sort_col in shown else 0
        self.sort_col = shown[(at + int(delta)) % len(shown)]
        self._redraw()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._redraw()

    def action_tree(self) -> None:
        self.tree_view = not self.tree_view
        self._redraw()

    def header_clicked(self, column: int) -> None:
        index = self._column_index(column)
        if index is None:
            return
        if index == self.sort_col:
            self.reverse = not self.reverse
        else:
            self.sort_col, self.reverse = index, COLUMNS[index].title in LARGEST_FIRST
        self._redraw()

    def set_filter(self, value: str) -> None:
        self.filter_text = value.strip()
        self._redraw()

    def _column_index(self, drawn: int) -> int | None:
        """COLUMNS index of a drawn column (the trend column sits before COMMAND when shown)."""
        shown = self.visible()
        if self._width >= TREND_AT:
            if drawn == len(shown) - 1:
                return None  # the trend: not sortable
            if drawn == len(shown):
                return shown[-1]
        return shown[drawn] if drawn < len(shown) else None

    # --- data -------------------------------------------------------------------------------------
    def feed(self, snap: NodeSnapshot) -> None:
        """Every snapshot, shown or not: the trend needs them all."""
        self.history.add(snap)

    def show(self, snap: NodeSnapshot, width: int) -> None:
        self._snap, self._width = snap, width
        self._redraw()

    def _redraw(self) -> None:
        snap = self._snap
        if snap is None:
            return
        shown = self.visible()
        if self.sort_col not in shown:
            self.sort_col = VRAM_COL
        col = COLUMNS[self.sort_col]
        loads = snap.process_load
        procs = sorted(snap.processes, key=lambda p: (col.key(p, snap.taken_at, loads.get(p.pid)), p.pid),
                       reverse=self.reverse)
        depth: dict[int, int] = {}
        if self.tree_view:
            procs, depth = _tree_order(procs)
        rows = []
        needle = self.filter_text.lower()
        trend = self._width >= TREND_AT
        titles_shown = {COLUMNS[i].title for i in shown}
        for p in procs:
            cells = self._cells(p, snap, depth.get(p.pid, 0), trend, titles_shown)
            if needle and needle not in " ".join(c.plain if isinstance(c, Text) else str(c) for c in cells).lower():
                continue
            rows.append((f"{p.pid}:{p.start_time}", cells))
        self._procs = {f"{p.pid}:{p.start_time}": p for p in procs}
        titles = [COLUMNS[i].title + (("▼" if self.reverse else "▲") if i == self.sort_col else "") for i in shown]
        if trend:
            titles.insert(len(titles) - 1, TREND_TITLE)
        self.set_columns(titles)
        hidden = len(snap.processes) - len(rows)
        if not snap.processes:
            self.set_empty_text("no GPU processes" + ("\nsimulated node: `gpuwarden sim scenario residual` sets up "
                                                        "the residual drill" if snap.simulated else ""))
        else:
            self.set_empty_text(f"nothing matches /{self.filter_text} (/ then Esc clears it)" if hidden else "")
        self.subtitle = " · ".join(x for x in (
            f"{len(rows)} process(es)" + (f", {hidden} filtered out" if hidden else ""),
            f"/{self.filter_text}" if self.filter_text else "", "tree" if self.tree_view else "") if x)
        shown_sub = " · ".join(x for x in (self.subtitle, self.stale_note) if x)
        if shown_sub != self.border_subtitle:
            self.border_subtitle = shown_sub
        self.set_rows(rows)

    def _cells(self, p: GpuProcess, snap: NodeSnapshot, depth: int, trend: bool, titles: set[str]) -> list:
        vram = sum(p.vram.values())
        load = snap.process_load.get(p.pid)
        state = Text(p.state, style="" if p.alive else S["phase.bad"])
        command = ("  " * (depth - 1) + "└ " if depth else "") + (p.command or "(gone)")
        cells: list = [str(p.pid), text.clip(p.user or "?", 10), text.clip(workload(p), 28),
                       ",".join(map(str, sorted(p.vram))) or "files", text.short_size(vram) if p.vram else "-"]
        if "GPU%" in titles:
            cells.append(percent(load.gpu_percent if load else None))
        if "CPU%" in titles:
            cells.append(percent(load.cpu_percent if load else None))
        if "RSS" in titles:
            cells.append(text.short_size(load.rss_bytes if load else None))
        cells += [state, text.duration(_age(p, snap.taken_at) if p.start_time else None)]
        if "TIME" in titles:
            cells.append(cpu_time(load.cpu_time_s if load else None))
        if trend:
            cells.append(Text(text.sparkline(self.history.series((p.pid, p.start_time)), 12), style=S["trend"]))
        cells.append(text.clip(command, 400))
        return cells


def _tree_order(procs: list[GpuProcess]) -> tuple[list[GpuProcess], dict[int, int]]:
    """Parents first with their children right under them (in the current sort order); pid -> depth."""
    by_pid = {p.pid: p for p in procs}
    children: dict[int, list[GpuProcess]] = {}
    roots = []
    for p in procs:
        if p.ppid in by_pid and p.ppid != p.pid:
            children.setdefault(p.ppid, []).append(p)
        else:
            roots.append(p)
    out: list[GpuProcess] = []
    depth: dict[int, int] = {}

    def walk(p: GpuProcess, d: int) -> None:
        if p.pid in depth:
            return  # a cycle in bad data must not loop
        depth[p.pid] = d
        out.append(p)
        for c in children.get(p.pid, []):
            walk(c, d + 1)
    for r in roots:
        walk(r, 0)
    for p in procs:  # anything only reachable through a cycle
        walk(p, 0)
    return out, depth


def _fit_command(cell: Text, width: int) -> Text:
    """A COMMAND cell cut to `width` with the program's name and arguments kept (the tree's indent too)."""
    plain = cell.plain
    cut = plain.find("└ ") + 2 if "└ " in plain[:80] else 0
    return Text(plain[:cut] + text.command_line(plain[cut:], max(width - cut, 1)))
