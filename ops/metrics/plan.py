"""The launch plan's KFD registration budget for the metrics: gpuwarden.ops.arena.budget over the node config, recomputed
at most once a minute (RAM and the config rarely change; a scrape must stay cheap).
"""

from __future__ import annotations

import time

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.arena import budget
from gpuwarden.ops.metrics.reading import PlanBudget

REFRESH_S = 60.0


class PlanCache:
    """None while the node config has no arena or engines, or KFD is not here (the limit does not apply)."""

    def __init__(self, settings: Settings, refresh_s: float = REFRESH_S):
        self.settings = settings
        self.refresh_s = refresh_s
        self._at = -refresh_s
        self._value: PlanBudget | None = None

    def current(self) -> PlanBudget | None:
        now = time.monotonic()
        if now - self._at >= self.refresh_s:
            self._at = now
            self._value = self._compute()
        return self._value

    def _compute(self) -> PlanBudget | None:
        settings = self.settings
        if settings.replay or not settings.config_path.exists() or budget.count_gpus(settings.sysfs_root) is None:
            return None
        try:
            cfg = nodeconfig.load(settings)
            if cfg.arena is None or not cfg.engines:
                return None
            size, visible = budget.from_config(settings)
            verdict = budget.compute(settings, size, visible)
        except (GpuwardenError, OSError, ValueError):
            return None  # an arena file not created yet, a bad config: `config check` and doctor say why
        return PlanBudget(arena=cfg.arena.path, charged=verdict.charged, limit=verdict.limit,
                          no_limit=verdict.no_limit, fits=verdict.fits)
