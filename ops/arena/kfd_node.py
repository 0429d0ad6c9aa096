"""The node's KFD system memory, used and limit: from debugfs kfd/mem_limit when readable, else the limit computed.

engines list shows it beside each engine's ledger; the answer always says which of the two it is.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.node.debugfs.kfd_limit import HOW, computed_limit, read_mem_total
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.arena.budget import live_limit


def node_kfd(settings: Settings) -> dict[str, Any]:
    """{"source": "debugfs" | "computed" | "unknown", "used_bytes", "limit_bytes", "note"}."""
    books, where = live_limit(settings)
    if books is not None:
        return {"source": "debugfs", "used_bytes": books.system_used, "limit_bytes": books.system_limit,
                "note": f"read from {where}"}
    total = read_mem_total(settings.proc_root)
    if total is None:
        return {"source": "unknown", "used_bytes": None, "limit_bytes": None,
                "note": f"debugfs: {where}; and no MemTotal in {settings.proc_root / 'meminfo'} to compute it from"}
    return {"source": "computed", "used_bytes": None, "limit_bytes": computed_limit(total),
            "note": f"from RAM {fmt_bytes(total)}: {HOW}; what is used needs debugfs ({where})"}


def describe(kfd: dict[str, Any]) -> str:
    """One line: 'KFD system memory: 96.0 GiB used of 121.5 GiB (debugfs, read from ...)'."""
    if kfd["source"] == "debugfs":
        return (f"KFD system memory: {fmt_bytes(kfd['used_bytes'])} used of {fmt_bytes(kfd['limit_bytes'])} "
                f"(debugfs, {kfd['note']})")
    if kfd["source"] == "computed":
        return f"KFD system memory limit: {fmt_bytes(kfd['limit_bytes'])} (computed; {kfd['note']})"
    return f"KFD system memory: unknown ({kfd['note']})"
