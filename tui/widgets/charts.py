"""One GPU's charts in its detail view: VRAM used and residual, busy, power and temperature over the last hour and,
with an agent, the seven-day trend. Line charts by textual-plotext, imported here only (this view's module).

textual-plotext's PlotextPlot builds its figure in render(), on the event loop (10-20 ms a chart on the dev box,
more when loaded). Here every figure is built in a worker thread, on a plotext figure of its own, and the widget
shows the built text: a refresh costs the event loop a few Text swaps.
"""

from __future__ import annotations

import threading

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.containers import Grid
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from gpuwarden.ops.foundation.model import NodeSnapshot

from gpuwarden.tui import chartdata
from gpuwarden.tui.chartdata import ChartSpec

KEYS = ("vram", "busy_percent", "power_mw", "temperature_mc", "week")
TWO_COLUMNS_AT = 160  # terminal width from which the charts sit two a row
CHART_H = 12
WEEK_POINTS = 336  # the 7-day chart: a point every half hour
TREND_EVERY_S = 60.0  # the agent closes a minute of its trend once a minute: ask no more often


class Chart(PlotextPlot):
    """A chart whose figure arrives built (show); until then it says it is drawing."""

    DEFAULT_CSS = """
    Chart { height: 12; width: 1fr; }  /* CHART_H */
    Chart.na { height: 3; }
    """

    def __init__(self, key: str, **kw):
        super().__init__(id=f"chart-{key}", **kw)
        self.key = key
        self.built: Text | None = None
        self.built_size: tuple[int, int] = (0, 0)

    def render(self) -> RenderResult:
        return self.built if self.built is not None else Text(f"{self.key}: drawing…", style="dim")

    def show(self, built: Text, size: tuple[int, int], na: bool) -> None:
        self.built, self.built_size = built, size
        self.set_class(na, "na")  # a chart with nothing to draw keeps its title and the reason only
        self.refresh()

    def theme_name(self) -> str:
        """The plotext theme that matches the app's (PlotextPlot registers it on mount)."""
        return self._get_plotext_theme_name(self.app.theme)

    def on_resize(self) -> None:
        parent = self.parent
        if isinstance(parent, ChartsPane) and self.size.width != self.built_size[0]:
            parent.redraw()


def draw(spec: ChartSpec, width: int, height: int, theme: str) -> Text:
    """(worker thread) The chart as text of width x height: plotext's figure, or the title and why it is n/a."""
    if spec.na is not None or width < 24 or height < 6:
        t = Text(spec.title, style="bold")
        t.append("\n" + (spec.na or "too small to draw: widen the terminal"), style="dim")
        return t
    plt = Plot()
    plt.theme(theme)
    plt.plotsize(width, height)
    plt._set_size(width, height)  # as PlotextPlot.render does: plotsize alone leaves the figure's size stale
    top = spec.y_max or max(max(line.ys) for line in spec.lines) * 1.1 or 1.0
    for line in spec.lines:
        plt.plot(line.xs, line.ys, label=line.label, marker="braille")
    plt.title(spec.title)
    plt.xlabel(spec.x_unit)
    plt.xlim(-spec.x_span, 0)
    plt.ylim(0, top)
    return Text.from_ansi(plt.build())


class ChartsPane(Grid):
    """The charts of GPU `index`; update(snap) redraws them in a worker, one build at a time."""

    DEFAULT_CSS = """
    ChartsPane { grid-size: 1; grid-gutter: 0 1; height: auto; grid-rows: auto; }
    ChartsPane.two { grid-size: 2; }
    """

    def __init__(self, index: int, **kw):
        super().__init__(id="charts", **kw)
        self.index = index
        self.snap: NodeSnapshot | None = None
        self._busy = threading.Lock()
        self._again = False
        self._agent_fine: dict | None = None  # the agent's last hour, asked once: the console's own follows
        self._agent_fine_asked = False
        self._trend: dict | None = None
        self._trend_at = float("-inf")
        self._bins: chartdata.HourBins | None = None  # (worker thread only) the hour so far, binned
        self._fed_t = float("-inf")  # the newest sample of the console's history already binned
        self._week: tuple[float, ChartSpec] | None = None  # (trend fetched at, its chart)
        self.builds = 0  # finished builds (the tests wait on it)
        self._drawn: dict[str, tuple] = {}  # key -> (spec, size, theme) last drawn (worker thread only)

    def compose(self) -> ComposeResult:
        for key in KEYS:
            yield Chart(key)

    def on_mount(self) -> None:
        self.set_class(self.app.size.width >= TWO_COLUMNS_AT, "two")

    def update(self, snap: NodeSnapshot) -> None:
        self.snap = snap
        self.redraw()

    def redraw(self) -> None:
        """Start a build of every chart at its current size; while one runs, one more is queued."""
        if self.snap is None or not self.is_mounted:
            return
        self.set_class(self.app.size.width >= TWO_COLUMNS_AT, "two")
        if not self._busy.acquire(blocking=False):
            self._again = True
            return
        self._again = False
        # A chart not laid out yet (or shrunk to its n/a line) is drawn at the size it will have.
        cols = 2 if self.has_class("two") else 1
        fallback = max(1, (self.size.width or self.app.size.width) // cols - cols + 1)
        sizes = {c.key: (c.size.width or fallback, CHART_H) for c in self.query(Chart)}
        theme = self.query_one(Chart).theme_name()
        snap = self.snap
        try:
            self.run_worker(lambda: self._build(snap, sizes, theme), thread=True, group="charts",
                            exit_on_error=False)
        except Exception:
            self._busy.release()
            raise

    def _agent(self, snap: NodeSnapshot):
        source = getattr(self.app, "source", None)
        return source if snap.agent and hasattr(source, "agent_json") else None

    def _build(self, snap: NodeSnapshot, sizes: dict[str, tuple[int, int]], theme: str) -> None:
        """(worker thread) Gather the series, build every figure, hand them to the event loop."""
        try:
            # The snapshot's time, not the clock's: a replayed bundle charts the hour before it was taken.
            now = snap.taken_at
            gpu = snap.gpu(self.index)
            total = gpu.vram_total if gpu is not None else None
            agent = self._agent(snap)
            if agent is not None and not self._agent_fine_asked:
                self._agent_fine_asked = True
                doc = agent.agent_json(f"/v1/history?gpu={self.index}&resolution=fine&since={now - chartdata.HOUR_S:.3f}")
                self._agent_fine = ((doc or {}).get("gpus") or {}).get(str(self.index), {}).get("fine")
            if agent is not None and now - self._trend_at >= TREND_EVERY_S:
                doc = agent.agent_json(f"/v1/history?gpu={self.index}&resolution=minute"
                                       f"&since={now - chartdata.WEEK_S:.3f}")
                self._trend = ((doc or {}).get("gpus") or {}).get(str(self.index), {}).get("minute")
                self._trend_at = now
            history = getattr(self.app, "chart_history", None)
            if self._bins is None:
                self._bins = chartdata.HourBins()
                # The agent's points first: where they overlap the console's own, a bin keeps the peak of both.
                self._bins.add(*chartdata.absolute(self._agent_fine))
            if history is not None:
                since = max(now - chartdata.HOUR_S, self._fed_t + 1e-6)
                ts, cols = chartdata.absolute(history.series(self.index, since, "fine").get("fine"))
                self._bins.add(ts, cols)
                self._fed_t = ts[-1] if ts else self._fed_t
            source = "the agent" if agent is not None else f"the {snap.backend} backend"
            specs = chartdata.hour_charts(self._bins, now, total, source)
            if self._week is None or self._week[0] != self._trend_at:
                why_not = None
                if agent is None and snap.agent:  # an agent serves the node, but not through this console
                    why_not = ("n/a: the node's agent keeps the 7-day trend; this console does not reach it "
                               "(`gpuwarden history` on the node)")
                self._week = (self._trend_at, chartdata.week_chart(self._trend, now, WEEK_POINTS, total,
                                                                   agent is not None, why_not))
            specs.append(self._week[1])
            built = {}
            for spec in specs:
                size = sizes.get(spec.key, (80, CHART_H))
                drawn = (spec, size, theme)
                if self._drawn.get(spec.key) == drawn:
                    continue  # the same points at the same size: plotext is the costly part, skip it
                self._drawn[spec.key] = drawn
                try:
                    figure = draw(spec, *size, theme)
                except Exception as exc:  # a figure plotext cannot draw must not leave the view "drawing…"
                    figure = Text(f"{spec.title}\nnot drawn: {type(exc).__name__}: {exc}", style="dim")
                built[spec.key] = (figure, size, spec.na is not None)
        finally:
            self._busy.release()  # before handing over: _show may start the queued build
        try:
            self.app.call_from_thread(self._show, built)
        except RuntimeError:
            pass  # the app is closing: nobody to show them to

    def settled(self) -> bool:
        """Every chart drawn at the width it has, and no build running or queued (the tests wait on it)."""
        return self.builds > 0 and not self._busy.locked() and not self._again and all(
            c.built is not None and c.built_size[0] == c.size.width for c in self.query(Chart))

    def _show(self, built: dict[str, tuple[Text, tuple[int, int], bool]]) -> None:
        for chart in self.query(Chart):
            if chart.key in built:
                chart.show(*built[chart.key])
        self.builds += 1
        drawn = getattr(self.screen, "charts_drawn", None)
        if drawn is not None:
            drawn(self.builds)
        if self._again:
            self.redraw()
