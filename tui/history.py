"""VRAM use over the last minutes, per GPU and per process, fed one snapshot at a time, for the sparklines.

Time is cut into fixed buckets (15 s by default) holding the peak use seen in them, so a line spans the
same minutes at any refresh rate and only moves when a bucket closes or a peak rises. Memory is bounded.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

from ops.model import NodeSnapshot

BUCKET_S = 15.0
BUCKETS = 20  # 20 x 15 s: the last five minutes


class BucketSeries:
    """Peak fraction per time bucket for any number of keys; keys not seen in a snapshot are dropped."""

    def __init__(self, bucket_s: float = BUCKET_S, keep: int = BUCKETS):
        self.bucket_s = bucket_s
        self.keep = keep
        self._series: dict[Hashable, deque[tuple[int, float]]] = {}  # key -> (bucket number, peak fraction)

    @property
    def span_s(self) -> float:
        return self.bucket_s * self.keep

    def add(self, taken_at: float, values: Iterable[tuple[Hashable, float]]) -> None:
        bucket = int(taken_at // self.bucket_s)
        seen = set()
        for key, frac in values:
            seen.add(key)
            series = self._series.setdefault(key, deque(maxlen=self.keep))
            if series and series[-1][0] == bucket:
                series[-1] = (bucket, max(series[-1][1], frac))
            elif not series or series[-1][0] < bucket:
                series.append((bucket, frac))
        for gone in set(self._series) - seen:
            del self._series[gone]

    def series(self, key: Hashable) -> list[float]:
        """Peak use per bucket, oldest first (buckets without a sample are left out)."""
        return [frac for _, frac in self._series.get(key, ())]


class VramHistory(BucketSeries):
    """Per GPU: used / total."""

    def add(self, snap: NodeSnapshot) -> None:  # type: ignore[override]
        super().add(snap.taken_at, ((g.index, g.vram_used / g.vram_total) for g in snap.gpus
                                    if g.vram_used is not None and g.vram_total))

    def series(self, gpu: int) -> list[float]:  # type: ignore[override]
        return super().series(gpu)


class ProcessVramHistory(BucketSeries):
    """Per process (pid + start time, so a reused pid starts a new line): its VRAM over the total of the
    GPUs it uses."""

    def add(self, snap: NodeSnapshot) -> None:  # type: ignore[override]
        totals = {g.index: g.vram_total or 0 for g in snap.gpus}

        def values():
            for p in snap.processes:
                room = sum(totals.get(g, 0) for g in p.vram)
                if room:
                    yield (p.pid, p.start_time), sum(p.vram.values()) / room
        super().add(snap.taken_at, values())
