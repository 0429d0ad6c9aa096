"""The fleet screen: one row per node, worst first, a `/` filter, Enter opens the node's console.

Rows come from the monitor's latest snapshots or Prometheus readings (no network work here), redrawn once per
refresh only when changed.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Input, Static

from gpuwarden.ops.fleet.summary import PRIORITY, NodeRow, columns, fallback_notes, worst_first

from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip
from gpuwarden.tui.widgets.rowtable import RowTable

STATE_STYLE = {"ok": S["phase.good"], "attention": S["phase.bad"], "unreachable": S["phase.bad"],
               "error": S["phase.bad"]}
STALE_INTERVALS = 5  # a node silent for this many refreshes is shown as not answering


class FleetTable(RowTable):
    pass


class FleetScreen(Screen[None]):
    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("q", "app.quit", "Quit"),
        Binding("ctrl+r", "refresh_rows", "Refresh", show=False),
    ]
    DEFAULT_CSS = """
    FleetScreen #fleet-filter { display: none; height: 3; }
    FleetScreen #fleet-filter.shown { display: block; }
    FleetScreen #fleet-title { height: 1; }
    FleetScreen #fleet-table { height: 1fr; border: round $primary; padding: 0 1; }
    FleetScreen #fleet-table:focus { border: round $accent; }
    FleetScreen #fleet-reasons { height: auto; max-height: 8; color: $text-muted; }
    """

    def __init__(self, monitor, *, refresh_s: float, read_only: bool):
        super().__init__()
        self.monitor = monitor
        self.refresh_s = refresh_s
        self.read_only = read_only
        self.filter_text = ""
        self.shown: list[NodeRow] = []

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        yield Input(placeholder="filter: part of a node name or state (Enter applies, Esc clears)", id="fleet-filter")
        table = FleetTable(id="fleet-table")
        table.border_title = "Fleet"
        yield table
        yield Static(id="fleet-reasons")
        yield KeyStrip([("q", "Quit"), ("/", "Filter"), ("enter", "Open node"), ("esc", "Clear filter")],
                       id="fleet-keys")

    def on_mount(self) -> None:
        self.refresh_rows()
        self.set_interval(self.refresh_s, self.refresh_rows)
        self.query_one(FleetTable).focus()

    def refresh_rows(self) -> None:
        every = worst_first(self.monitor.rows(stale_after=STALE_INTERVALS * self.refresh_s + 5))
        needle = self.filter_text.lower()
        rows = [r for r in every if not needle or needle in r.name.lower() or needle in r.state
                or needle in (r.reason or "").lower()]
        self.shown = rows
        table = self.query_one(FleetTable)
        cols = columns(every)
        cells = [r.cells() for r in rows]
        keys = self._fitting(cols, cells, table.content_size.width or self.size.width - 4)
        table.set_columns([title for k, title in cols if k in keys])
        table.set_rows([(r.name, self._styled(r, c, cols, keys)) for r, c in zip(rows, cells)])
        # Most telling first: an 80-column terminal cuts the end of this line.
        title = Text(" gpuwarden fleet ", style=S["header.brand"])
        if self.read_only:
            title.append(" ")
            title.append(" READ-ONLY ", style=S["header.ro"])
        if self.filter_text:
            title.append(f" filter {self.filter_text}: {len(rows)}/{len(every)} shown", style=S["header.warn"])
        ok = sum(1 for r in every if r.state == "ok")
        attention = sum(1 for r in every if r.state == "attention")
        title.append(f"  {len(every)} nodes: {ok} ok, {attention} attention, {len(every) - ok - attention} not seen"
                     f"  every {self.refresh_s:g}s")
        prom = sum(1 for r in every if r.source == "prometheus")
        if prom or getattr(self.monitor, "prom", None):
            title.append(f"  {prom} from Prometheus")
        self.query_one("#fleet-title", Static).update(title)
        reasons = [f"{r.name}: {r.reason}" for r in rows if r.state in ("unreachable", "error")]
        error = getattr(self.monitor, "prom_error", None)
        reasons += [f"prometheus: {error}"] if error else []
        reasons += [f"over SSH ({note}): {', '.join(names)}" for note, names in fallback_notes(rows).items()]
        self.query_one("#fleet-reasons", Static).update("\n".join(reasons))

    def action_refresh_rows(self) -> None:
        self.refresh_rows()

    @staticmethod
    def _fitting(cols, cells: list[dict[str, str]], room: int) -> set[str]:
        """The columns that fit side by side, most important first (an 80-column terminal keeps the story)."""
        titles = dict(cols)
        keep: set[str] = set()
        used = 0
        for key in (k for k in PRIORITY if k in titles):
            width = max([len(titles[key])] + [len(c[key]) for c in cells])
            if used + width + (2 if keep else 0) > room and keep:
                continue
            keep.add(key)
            used += width + (2 if len(keep) > 1 else 0)
        return keep

    @staticmethod
    def _styled(row: NodeRow, cells: dict[str, str], cols, keys: set[str]) -> list:
        return [Text(cells[k], style=STATE_STYLE.get(row.state, "")) if k == "state" else cells[k]
                for k, _ in cols if k in keys]

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.add_class("shown")
        box.value = self.filter_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_text = event.value.strip()
        event.input.remove_class("shown")
        self.query_one(FleetTable).focus()
        self.refresh_rows()

    def action_clear_filter(self) -> None:
        self.filter_text = ""
        self.query_one("#fleet-filter", Input).remove_class("shown")
        self.query_one(FleetTable).focus()
        self.refresh_rows()

    def on_row_table_selected(self, message: RowTable.Selected) -> None:
        message.stop()
        self.app.open_node(message.key)
