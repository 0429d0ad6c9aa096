"""What one GPU's charts plot: its last hour (the console's own history, older points from the agent's) and its
seven-day minute trend (the agent's), cut into as many peak-per-bin points as the chart has room for.

Plain data, no Textual: built in the chart worker thread. A field the source never gave is "n/a", not zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = float(1 << 30)
HOUR_S = 3600.0
HOUR_BINS = 360  # 10 s a point: about what a wide chart's braille dots resolve (2 a cell)
WEEK_S = 7 * 24 * 3600.0

# Fine-series column -> (chart title, scale to the unit shown)
FINE = {"busy_percent": ("busy %", 1.0), "power_mw": ("power W", 1000.0), "temperature_mc": ("temperature C", 1000.0)}
CHARTED = frozenset(("used", "residual", *FINE))


@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float]


@dataclass
class ChartSpec:
    """One chart: its lines (x in minutes or days back from now, negative), or why it has none."""

    key: str
    title: str
    x_unit: str  # "minutes ago" or "days ago"
    x_span: float  # how far back the x axis reaches, in x_unit
    lines: list[Line] = field(default_factory=list)
    y_max: float | None = None
    na: str | None = None  # why there is nothing to plot ("n/a: ...")


def absolute(series: dict | None) -> tuple[list[float], dict[str, list]]:
    """(times since the epoch, columns) of a history series ({"t0", "t": offsets, columns...}); empty if none."""
    if not series or series.get("t0") is None:
        return [], {}
    t0 = float(series["t0"])
    ts = [t0 + dt for dt in series.get("t") or ()]
    cols = {k: list(v) for k, v in series.items() if isinstance(v, list) and k != "t" and len(v) == len(ts)}
    return ts, cols


def peaks(ts: list[float], values: list, now: float, span_s: float, bins: int, unit_s: float,
          scale: float = 1.0) -> tuple[list[float], list[float]]:
    """Peak of each of `bins` equal time bins over the last `span_s` seconds (x: the bin's end, in units of
    `unit_s` back from the end of the current bin, negative); bins without a known value are left out.

    Bins are fixed in time (multiples of their width), so the points only move when a bin closes or a peak
    rises: a chart whose points did not change is not drawn again."""
    bins = max(1, bins)
    width = span_s / bins
    now = math.ceil(now / width) * width
    best: dict[int, float] = {}
    lo = now - span_s
    for t, v in zip(ts, values):
        if v is None or t < lo or t > now + width:
            continue
        b = min(bins - 1, int((t - lo) / width))
        if b not in best or v > best[b]:
            best[b] = v
    xs = [(lo + (b + 1) * width - now) / unit_s for b in sorted(best)]
    return xs, [best[b] / scale for b in sorted(best)]


class HourBins:
    """Peak of each column per fixed 10 s bin over the last hour, fed points as they come (the console's own
    samples, the agent's older ones): a refresh costs its new points, not the hour's 3,600."""

    def __init__(self, span_s: float = HOUR_S, bins: int = HOUR_BINS):
        self.span_s = span_s
        self.bins = bins
        self.width = span_s / bins
        self.peaks: dict[str, dict[int, float]] = {}
        self.samples = 0

    def add(self, ts: list[float], cols: dict[str, list]) -> None:
        self.samples += len(ts)
        for name, values in cols.items():
            if name not in CHARTED:
                continue
            best = self.peaks.setdefault(name, {})
            for t, v in zip(ts, values):
                if v is None:
                    continue
                b = int(t // self.width)
                if v > best.get(b, float("-inf")):
                    best[b] = v

    def line(self, name: str, now: float, unit_s: float, scale: float = 1.0) -> tuple[list[float], list[float]]:
        """(x, peak / scale) of the bins within the span, x in units of `unit_s` back from the current bin's
        end; older bins are dropped. Bins are fixed in time, so points move only when a bin closes or a peak
        rises: a chart whose points did not change is not drawn again."""
        end = math.ceil(now / self.width)
        best = self.peaks.get(name, {})
        for old in [b for b in best if b < end - self.bins]:
            del best[old]
        keys = sorted(b for b in best if b < end)
        return [((b + 1) - end) * self.width / unit_s for b in keys], [best[b] / scale for b in keys]


def hour_charts(bins: HourBins, now: float, vram_total: int | None, source: str) -> list[ChartSpec]:
    """VRAM used and residual, busy, power and temperature over the last hour."""
    out = []
    vram = ChartSpec("vram", "VRAM GiB (used, residual), last hour", "minutes ago", 60.0,
                     y_max=vram_total / GIB if vram_total else None)
    for name in ("used", "residual"):
        xs, ys = bins.line(name, now, 60.0, GIB)
        if xs:
            vram.lines.append(Line(name, xs, ys))
    if not vram.lines:
        vram.na = f"n/a: no VRAM reading yet from {source}"
    elif len(vram.lines) == 1:
        vram.title = "VRAM GiB (used; residual n/a), last hour"
    out.append(vram)
    for col, (title, scale) in FINE.items():
        spec = ChartSpec(col, f"{title}, last hour", "minutes ago", 60.0, y_max=100.0 if col == "busy_percent" else None)
        xs, ys = bins.line(col, now, 60.0, scale)
        if xs:
            spec.lines.append(Line(title.split()[0], xs, ys))
        else:
            spec.na = f"n/a: {source} gives no {title.split()[0]} reading for this GPU" if bins.samples else \
                f"n/a: no sample yet from {source}"
        out.append(spec)
    return out


def week_chart(minute: dict | None, now: float, bins: int, vram_total: int | None, agent: bool,
               why_not: str | None = None) -> ChartSpec:
    """The agent's minute trend of the last seven days: VRAM used (average, peak) and residual (peak).
    `why_not`: why there is no agent to ask, when that is not "none serves this node"."""
    spec = ChartSpec("week", "VRAM GiB, last 7 days (agent's minute trend)", "days ago", 7.0,
                     y_max=vram_total / GIB if vram_total else None)
    if not agent:
        spec.na = why_not or "n/a: the 7-day trend is the agent's; no agent serves this node (`gpuwarden agent install`)"
        return spec
    ts, cols = absolute(minute)
    for name, label in (("used_avg", "used avg"), ("used_max", "used peak"), ("residual_max", "residual peak")):
        xs, ys = peaks(ts, cols.get(name, []), now, WEEK_S, bins, 86400.0, GIB)
        if xs:
            spec.lines.append(Line(label, xs, ys))
    if not spec.lines:
        spec.na = "n/a: the agent has no minute closed yet for this GPU"
    return spec
