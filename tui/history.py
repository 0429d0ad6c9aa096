"""VRAM use per GPU over the last minutes, fed one snapshot at a time (and, with an agent, its history at
start), for the GPUs panel's sparkline.

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
        seen = set()
        for g in snap.gpus:
            seen.add(g.index)
            if g.vram_used is None or not g.vram_total:
                continue
            self.add_sample(g.index, snap.taken_at, g.vram_used / g.vram_total)
        for gone in set(self._series) - seen:
            del self._series[gone]

    def add_sample(self, gpu: int, ts: float, frac: float) -> None:
        """One GPU's use at one time (snapshots, or the agent's history when the console opens)."""
        bucket = int(ts // self.bucket_s)
        series = self._series.setdefault(gpu, deque(maxlen=self.keep))
        if series and series[-1][0] == bucket:
            series[-1] = (bucket, max(series[-1][1], frac))
        elif not series or series[-1][0] < bucket:
            series.append((bucket, frac))

    def backfill(self, samples: list[tuple[int, float, float]]) -> None:
        """(gpu, ts, fraction) samples from before the first snapshot (the agent's history), merged in."""
        merged: dict[int, dict[int, float]] = {g: dict(s) for g, s in self._series.items()}
        for gpu, ts, frac in samples:
            buckets = merged.setdefault(gpu, {})
            b = int(ts // self.bucket_s)
            buckets[b] = max(buckets.get(b, 0.0), frac)
        for gpu, buckets in merged.items():
            self._series[gpu] = deque(sorted(buckets.items())[-self.keep:], maxlen=self.keep)

    def series(self, gpu: int) -> list[float]:
        """Peak use per bucket, oldest first (buckets without a sample are left out)."""
        return [frac for _, frac in self._series.get(gpu, ())]
