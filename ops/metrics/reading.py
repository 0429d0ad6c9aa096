"""What one scrape renders: the latest snapshot plus what only the agent knows (staleness, residual ages,
kernel-log counts), and the exporter's options (per-process series, hostname label).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gpuwarden.ops.foundation.model import NodeSnapshot

# Per-process series are capped so a node with thousands of GPU processes cannot flood Prometheus.
PER_PROCESS_MAX = 256


@dataclass(frozen=True)
class MetricsOptions:
    per_process: bool = False  # gpuwarden_process_vram_bytes, the largest PER_PROCESS_MAX (process, GPU) pairs
    per_process_max: int = PER_PROCESS_MAX
    hostname: str | None = None  # a hostname label on every series; None: leave it to Prometheus' instance


@dataclass(frozen=True)
class PlanBudget:
    """The launch plan's KFD registration charge for the configured arena, against KFD's system-memory limit."""

    arena: str
    charged: int
    limit: int
    no_limit: bool | None
    fits: bool


@dataclass(frozen=True)
class Reading:
    snapshot: NodeSnapshot
    mode: str  # "agent": served by the node agent; "oneshot": sampled for this exposition only
    stale: bool = False
    age_s: float | None = None  # how old the snapshot is; None for a one-shot
    # GPU -> when its residual became significant (the agent's change tracker); None: unknown (one-shot).
    residual_since: Mapping[int, float] | None = None
    # (category, severity) -> kernel-log occurrences the agent's watch reported; None: no watch (one-shot).
    findings: Mapping[tuple[str, str], int] | None = None
    plan: PlanBudget | None = None
    now: float = field(default=0.0)  # the scrape's time (seconds since the epoch)
