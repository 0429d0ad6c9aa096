"""The GPUs panel: one row per GPU with a VRAM bar, residual (highlighted), GTT, busy, temp, power, engines, trend;
MI300 partitions (logical GPUs of one device) grouped under a row of their physical device.

Fewer columns below 100 cells of width; rows are redrawn only when what they show has changed.
"""

from __future__ import annotations

from rich.text import Text

from gpuwarden.ops.foundation.model import NodeSnapshot

from gpuwarden.tui import text
from gpuwarden.tui.history import VramHistory
from gpuwarden.tui.widgets.rowtable import FilteredRowTable
from gpuwarden.tui.styles import STYLES as S

WIDE_AT = 120  # room for GTT, power and the sparkline (short forms)
ROOMY_AT = 140  # room for the long forms: a longer bar and sparkline, "(1 holder)"
NARROW = ("GPU", "NAME", "VRAM", "USED", "RESID", "BUSY", "TEMP", "ENG", "")
NARROW_NAME = 14
# The marks of the last column, said where they show (the panel's subtitle) and in the `?` list (issue 36: the
# "!" was never explained).
MARKS = (("!", "residual VRAM above the tolerance: enter shows its holders, f fixes it"),
         ("STALE / STL", "its driver did not answer in time: blanks are unknown, not zero"),
         ("DRAINED / DRN", "drained: engines kept off it (u undrains)"))
MARK_NOTE = "! residual: enter"
TREND = ("GPU", "NAME", "VRAM", "USED", "RESIDUAL", "GTT", "BUSY", "TEMP", "POWER", "ENG", "VRAM 5 MIN", "")


DEVICE_KEY = "dev:"  # the key of a physical device's row: "dev:<bus id>"


def devices(snap: NodeSnapshot) -> dict[str, list[int]]:
    """bus id -> the GPU indexes that are partitions of that one physical device (devices of 2+ only)."""
    by_bus: dict[str, list[int]] = {}
    for g in snap.gpus:
        if g.bus_id:
            by_bus.setdefault(g.bus_id, []).append(g.index)
    return {bus: members for bus, members in by_bus.items() if len(members) > 1}


class GpusPanel(FilteredRowTable):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "GPUs"
        self.subtitle = ""
        self.stale_note = ""
        self.mark_note = ""  # MARK_NOTE while a row shows "!"
        self.device_members: dict[str, list[int]] = {}

    def selected_gpu(self) -> int | None:
        """The GPU under the cursor; on a physical device's row its first partition (a reset takes them all)."""
        key = self.cursor_key()
        if key is not None and key.startswith(DEVICE_KEY):
            members = self.device_members.get(key[len(DEVICE_KEY):])
            return members[0] if members else None
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
        marked = False
        groups = devices(snap)
        self.device_members = groups
        member_of = {i: bus for bus, members in groups.items() for i in members}
        by_index = {g.index: g for g in snap.gpus}
        order = []
        for g in snap.gpus:  # a device's partitions together, under its row, where its first one stands
            bus = member_of.get(g.index)
            if bus is None:
                order.append(g)
            elif groups[bus][0] == g.index:
                order.append(bus)
                order += [by_index[i] for i in groups[bus]]
        ncols = len(TREND if trend else NARROW)
        for g in order:
            if isinstance(g, str):
                rows.append((DEVICE_KEY + g, self._device_row(snap, g, groups[g], res_by, ncols, wide, name_w)))
                continue
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
                marked = True
            name = f"└ {g.compute_partition or 'part'} {groups[member_of[g.index]].index(g.index)}" \
                if g.index in member_of else g.name
            row = [str(g.index), text.clip(name, name_w),
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
        self.mark_note = MARK_NOTE if marked else ""
        self._show_subtitle()

    @staticmethod
    def _device_row(snap: NodeSnapshot, bus: str, members: list[int], res_by: dict, ncols: int, wide: bool,
                    name_w: int) -> list:
        """The physical device's row: its partition mode and how many of its partitions hold a residual.

        No VRAM sum: partitions of an NPS1 device each report the one shared pool, so adding them up would lie.
        """
        first = snap.gpu(members[0])
        modes = (first.compute_partition, first.memory_partition if wide else None) if first else ()
        mode = "/".join(m for m in modes if m)
        short = bus[5:] if not wide and bus.startswith("0000:") else bus  # 80 columns: the domain says least
        label = Text(text.clip(f"{short} {mode}".strip(), name_w), style="bold")
        leaky = sum(1 for i in members if (r := res_by.get(i)) is not None and r.significant)
        res = Text(f"{leaky} of {len(members)}" if leaky else "-", style=S["residual"] if leaky else "dim")
        row: list = ["dev", label, Text(f"{len(members)} partitions", style="dim"), "", res]
        row += [""] * (ncols - len(row) - 1)
        row.append(Text(f"reset: all {len(members)}" if wide else "dev", style="dim"))
        return row

    def set_filter(self, value: str) -> None:
        super().set_filter(value)
        self._show_subtitle()

    def _show_subtitle(self) -> None:
        self.subtitle = self.filter_note()
        shown = " · ".join(x for x in (self.subtitle, getattr(self, "stale_note", ""), getattr(self, "mark_note", ""))
                           if x)
        if shown != self.border_subtitle:
            self.border_subtitle = shown
