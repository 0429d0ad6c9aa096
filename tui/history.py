"""VRAM use per GPU over the last minutes, fed one snapshot at a time, for the GPUs panel's sparkline.

Time is cut into fixed buckets (15 s by default) holding the peak use seen in them, so the line spans the
same minutes at any refresh rate and only moves when a bucket closes or a peak rises. Memory is bounded.
"""

from __future__ import annotations

from collections import deque

from ops.model import NodeSnapshot

BUCKET_S = 15.0
BUCKETS = 20  # 20 x 15 s: the last five minutes


class VramHistory:
    def __init__(self, bucket_s: float = BUCKET_S, keep: int = BUCKETS):
        self.bucket_s = bucket_s
        self.keep = keep
        self._series: dict[int, deque[tuple[int, float]]] = {}  # gpu -> (bucket number, peak fraction)

    @property
    def span_s(self) -> float:
        return self.bucket_s * self.keep

    def add(self, snap: NodeSnapshot) -> None:
        bucket = int(snap.taken_at // self.bucket_s)
        seen = set()
        for g in snap.gpus:
            seen.add(g.index)
            if g.vram_used is None or not g.vram_total:
                continue
            frac = g.vram_used / g.vram_total
            series = self._series.setdefault(g.index, deque(maxlen=self.keep))
            if series and series[-1][0] == bucket:
                series[-1] = (bucket, max(series[-1][1], frac))
            elif not series or series[-1][0] < bucket:
                series.append((bucket, frac))
        for gone in set(self._series) - seen:
            del self._series[gone]

    def series(self, gpu: int) -> list[float]:
        """Peak use per bucket, oldest first (buckets without a sample are left out)."""
        return [frac for _, frac in self._series.get(gpu, ())]
