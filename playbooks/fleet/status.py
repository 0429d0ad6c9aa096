"""Every node's `gpuwarden status --json`, fetched in parallel over SSH, as fleet rows.

Each node answers through its own gpuwarden (and so through its agent when one runs there).
"""

from __future__ import annotations

from typing import Callable

from ops.fleet.fanout import HostResult, run_everywhere
from ops.fleet.summary import NodeRow, from_result

from .target import FleetTarget


def collect(target: FleetTarget, on_row: Callable[[NodeRow], None] | None = None) -> list[NodeRow]:
    def done(result: HostResult) -> None:
        if on_row is not None:
            on_row(from_result(result))
    results = run_everywhere(list(target.hosts), target.remote("status", "--json"), target.ssh,
                             parallel=target.parallel, timeout=target.timeout, on_result=done)
    return [from_result(r) for r in results]
