"""`gpuwarden status --topology`: XGMI hives, PCIe parents, NUMA nodes and each GPU's reset scope, as a table or
the gpuwarden.topology/1 document.
"""

from __future__ import annotations

import json
import sys

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.topology import reset_reach, topology
from gpuwarden.ops.sources.kinds import LocalSource


COLUMNS = ("GPU", "BUS", "PARTITION", "HIVE", "NUMA", "PCIE PARENT", "SHARES PARENT WITH", "RESET REACHES")


def table_rows(doc: dict) -> list[tuple[str, ...]]:
    """The gpuwarden.topology/1 document as rows of COLUMNS (the CLI's table and the console's)."""
    rows = []
    for r in doc["gpus"]:
        peers = [i for i in r["same_pcie_parent"] if i != r["index"]]
        part = "/".join(p for p in (r["compute_partition"], r["memory_partition"]) if p) or "-"
        rows.append((str(r["index"]), r["bus_id"] or "n/a", part, r["hive_id"] or "-",
                     "n/a" if r["numa_node"] is None else str(r["numa_node"]), r["pcie_parent"] or "n/a",
                     ", ".join(map(str, peers)) or "-", ", ".join(map(str, r["reset_scope"]))))
    return rows


def run(settings: Settings, *, json_out: bool = False) -> int:
    # Always sampled here: the reset scopes come from the sysfs tree the backend reads, which no agent serves.
    local = LocalSource(settings, use_pidfds=False)
    try:
        snap = local.snapshot(deep=False)
        # The tree the backend reads (the simulated node's own, under --backend sim), else the node's /sys.
        root = getattr(local.sampler.backend, "sysfs_root", settings.sysfs_root)
    finally:
        local.close()
    doc = topology(snap, root)
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    rows = [COLUMNS, *table_rows(doc)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    notes = [reset_reach(doc, r["index"]) for r in doc["gpus"]]
    for note in dict.fromkeys(n for n in notes if n):
        sys.stdout.write(note + "\n")
    if all(r["pcie_parent"] is None for r in doc["gpus"]):
        sys.stdout.write("PCIe parents n/a: this sysfs tree keeps no /sys/devices hierarchy (a captured or "
                         "simulated node)\n")
    return 0
