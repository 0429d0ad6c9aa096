"""VRAM use per GPU over the last minutes, fed one snapshot at a time, for the GPUs panel's sparkline.

Bounded: it keeps `keep` samples per GPU, so memory does not grow with uptime.
"""

from __future__ import annotations

from collections import deque

from ops.model import NodeSnapshot


class VramHistory:
    def __init__(self, keep: int = 300):
        self.keep = keep
        self._series: dict[int, deque[float]] = {}
        self._last_taken: float | None = None

    def add(self, snap: NodeSnapshot) -> None:
        # The same snapshot offered twice (a replayed bundle, a fixed test source) is one sample.
        if snap.taken_at == self._last_taken:
            return
        self._last_taken = snap.taken_at
        seen = set()
        for g in snap.gpus:
            seen.add(g.index)
            series = self._series.setdefault(g.index, deque(maxlen=self.keep))
            if g.vram_used is not None and g.vram_total:
                series.append(g.vram_used / g.vram_total)
        for gone in set(self._series) - seen:
            del self._series[gone]

    def series(self, gpu: int) -> list[float]:
        return list(self._series.get(gpu, ()))
