"""Which GPUs are kept from new tenants now, and why: set at once when a GPU turns dirty, lifted only once verified.

A GPU leaves the set when a purge, reset or post-clean verified it, or after it has stayed clean for clear_after_s;
the per-GPU paths (DeviceTaintRules, the device plugin's health) read the same set.
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

    def update(self, dirty: dict[int, str], verified: frozenset[int] = frozenset()) -> dict[int, str]:
        """The set after this sample: `dirty` GPUs join (keeping the first reason), excluded ones that are no
        longer dirty leave when `verified`, or once clean for clear_after_s."""
        now = self.clock()
        for g, why in dirty.items():
            self.excluded.setdefault(g, why)
            self._clean_since.pop(g, None)
        for g in [g for g in self.excluded if g not in dirty]:
            since = self._clean_since.setdefault(g, now)
            if g in verified or now - since >= self.clear_after_s:
                del self.excluded[g]
                del self._clean_since[g]
        return dict(self.excluded)

    def due_in(self) -> float | None:
        """Seconds until an excluded GPU's clean time is up (None: none waiting)."""
        if not self._clean_since:
            return None
        return max(0.0, min(self._clean_since.values()) + self.clear_after_s - self.clock())
