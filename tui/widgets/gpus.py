"""The GPUs panel: one row per GPU with a VRAM bar, residual (highlighted), GTT, busy, temp, power, engines, trend.

Fewer columns below 100 cells of width; rows are redrawn only when what they show has changed.
"""

from __future__ import annotations

from rich.text import Text

from gpuwarden.ops.model import NodeSnapshot

from .. import text
from ..history import VramHistory
from .rowtable import FilteredRowTable
from ..styles import STYLES as S

WIDE_AT = 120  # room for GTT, power and the sparkline (short forms)
ROOMY_AT = 140  # room for the long forms: a longer bar and sparkline, "(1 holder)"
NARROW = ("GPU", "NAME", "VRAM", "USED", "RESID", "BUSY", "TEMP", "ENG", "")
NARROW_NAME = 14
TREND = ("GPU", "NAME", "VRAM", "USED", "RESIDUAL", "GTT", "BUSY", "TEMP", "POWER", "ENG", "VRAM 5 MIN", "")


class GpusPanel(FilteredRowTable):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "GPUs"
        self.subtitle = ""
        self.stale_note = ""

    def selected_gpu(self) -> int | None:
        key = self.cursor_key()
        return None if key is None else int(key)

    def show(self, snap: NodeSnapshot, history: VramHistory, width: int) -> None:
        wide = trend = width >= WIDE_AT
        roomy = width >= ROOMY_AT
        bar_w = 16 if roomy else 10
        trend_w = 20 if roomy else 12
        name_w = max(12, min(28, width - 128)) if roomy else (12 if wide else NARROW_NAME)
        res_by = {r.gpu_index: r for r in snap.residual}
        engines: dict[int, int] = {}
        for e in snap.engines:
            if e.gpu is not None and e.phase not in ("exited", "crashed"):
                engines[e.gpu] = engines.get(e.gpu, 0) + 1
        rows = []
        for g in snap.gpus:
            r = res_by.get(g.index)
            resid = r.residual if r and r.residual and r.residual > 0 else 0
            significant = bool(r and r.significant)
            res_text = Text((text.size(resid) if roomy else text.short_size(resid)) if resid else "-",
                            style=S["residual"] if significant else ("dim" if not resid else ""))
            if r and r.holders:
                many = "s" if len(r.holders) > 1 else ""
                if wide:  # at 80 columns the "!" mark and the detail view (enter) say it
                    res_text.append(f" ({len(r.holders)} holder{many})" if roomy else f" ({len(r.holders)})",
                                    style=S["residual"])
            mark = Text()
            if g.stale is not None:  # its driver did not answer: the blanks are unknown, not zero
                mark.append("STALE" if wide else "STL", style=S["stale"])
            elif g.index in snap.drained:
                mark.append("DRAINED" if wide else "DRN", style=S["drained"])
            elif significant:
                mark.append("!", style=S["residual"])
            row = [str(g.index), text.clip(g.name, name_w),
                   text.bar(g.vram_used, g.vram_total, bar_w, residual=resid if significant else None),
                   text.used_of(g.vram_used, g.vram_total), res_text]
            if wide:
                row.append(text.used_of(g.gtt_used, g.gtt_total))
            row += [text.num(g.busy_percent, ".0f", "%"), text.num(g.temperature_c, ".0f", "C")]
            if wide:
                row.append(text.num(g.power_w, ".0f", "W"))
            row.append(str(engines.get(g.index, 0)))
            if trend:
                row.append(Text(text.sparkline(history.series(g.index), trend_w), style=S["trend"]))
            row.append(mark)
            rows.append((str(g.index), row))
        self.set_columns(TREND if trend else NARROW)
        self.set_rows(rows)
        self._show_subtitle()

    def set_filter(self, value: str) -> None:
        super().set_filter(value)
        self._show_subtitle()

    def _show_subtitle(self) -> None:
        self.subtitle = self.filter_note()
        shown = " · ".join(x for x in (self.subtitle, getattr(self, "stale_note", "")) if x)
        if shown != self.border_subtitle:
            self.border_subtitle = shown
