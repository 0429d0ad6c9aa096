"""VRAM use over the last minutes, per GPU and per process, fed one snapshot at a time (and, with an agent,
the GPUs' history at start), for the sparklines.

Time is cut into fixed buckets (15 s by default) holding the peak use seen in them, so a line spans the
same minutes at any refresh rate and only moves when a bucket closes or a peak rises. Memory is bounded.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

from gpuwarden.ops.foundation.model import NodeSnapshot

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
        """One snapshot's (key, fraction) pairs; keys it does not name are dropped."""
        seen = set()
        for key, frac in values:
            seen.add(key)
            self.add_sample(key, taken_at, frac)
        self.keep_only(seen)

    def keep_only(self, keys: set) -> None:
        for gone in set(self._series) - keys:
            del self._series[gone]

    def add_sample(self, key: Hashable, ts: float, frac: float) -> None:
        """One key's use at one time (snapshots, or the agent's history when the console opens)."""
        bucket = int(ts // self.bucket_s)
        series = self._series.setdefault(key, deque(maxlen=self.keep))
        if series and series[-1][0] == bucket:
            series[-1] = (bucket, max(series[-1][1], frac))
        elif not series or series[-1][0] < bucket:
            series.append((bucket, frac))

    def backfill(self, samples: Iterable[tuple[Hashable, float, float]]) -> None:
        """(key, ts, fraction) samples from before the first snapshot (the agent's history), merged in."""
        merged: dict[Hashable, dict[int, float]] = {k: dict(s) for k, s in self._series.items()}
        for key, ts, frac in samples:
            buckets = merged.setdefault(key, {})
            b = int(ts // self.bucket_s)
            buckets[b] = max(buckets.get(b, 0.0), frac)
        for key, buckets in merged.items():
            self._series[key] = deque(sorted(buckets.items())[-self.keep:], maxlen=self.keep)

    def series(self, key: Hashable) -> list[float]:
        """Peak use per bucket, oldest first (buckets without a sample are left out)."""
        return [frac for _, frac in self._series.get(key, ())]


class VramHistory(BucketSeries):
    """Per GPU: used / total."""

    def add(self, snap: NodeSnapshot) -> None:  # type: ignore[override]
        for g in snap.gpus:
            if g.vram_used is not None and g.vram_total:
                self.add_sample(g.index, snap.taken_at, g.vram_used / g.vram_total)
        self.keep_only({g.index for g in snap.gpus})  # a GPU that cannot say its use keeps its line


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
