"""Which GPUs are kept from new tenants now, and why: set at once when a GPU turns dirty, lifted only once verified.

A GPU leaves the set when a purge, reset or post-clean verified it, or after it has stayed clean for clear_after_s;
a sample taken before the verification is older news than it. DeviceTaintRules and device-plugin health read it.
"""

from __future__ import annotations

import time
from typing import Callable


class Exclusions:
    """GPU -> reason (a taint value: residual-vram, dead-holders, reset-needed, drained, tenant-left, clean-failed)."""

    def __init__(self, clear_after_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.clear_after_s = clear_after_s
        self.clock = clock
        self.excluded: dict[int, str] = {}
        self._clean_since: dict[int, float] = {}
        self._verified_at: dict[int, float] = {}  # GPU -> wall time of the sample that verified it clean

    def update(self, dirty: dict[int, str], verified: dict[int, float] | None = None,
               taken_at: float | None = None) -> dict[int, str]:
        """The set after the sample taken at `taken_at` (wall time): `dirty` GPUs join (keeping the first reason);
        excluded ones leave when verified (GPU -> when), or once clean for clear_after_s. A GPU dirty only in a
        sample older than its verification stays verified: that sample saw what the clean removed."""
        now = self.clock()
        excluded = dict(self.excluded)  # replaced whole at the end: the gate's thread reads it meanwhile
        for g, at in (verified or {}).items():
            self._verified_at[g] = max(at, self._verified_at.get(g, at))
        for g, why in dirty.items():
            if taken_at is not None and taken_at < self._verified_at.get(g, float("-inf")):
                continue
            self._verified_at.pop(g, None)
            excluded.setdefault(g, why)
            self._clean_since.pop(g, None)
        for g in [g for g in excluded if g not in dirty or g in self._verified_at]:
            since = self._clean_since.setdefault(g, now)
            if g in self._verified_at or now - since >= self.clear_after_s:
                del excluded[g]
                del self._clean_since[g]
        self.excluded = excluded
        # A verification is news for the samples taken before it only; later ones say for themselves.
        if taken_at is not None:
            self._verified_at = {g: t for g, t in self._verified_at.items() if t > taken_at}
        return dict(self.excluded)

    def due_in(self) -> float | None:
        """Seconds until an excluded GPU's clean time is up (None: none waiting)."""
        if not self._clean_since:
            return None
        return max(0.0, min(self._clean_since.values()) + self.clear_after_s - self.clock())
