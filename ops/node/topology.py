"""Which GPUs share an XGMI hive, a PCIe switch and a NUMA node, and so which GPUs a reset of one takes down.

From the snapshot (hive ids) and the PCI tree under the sysfs root: a GPU's NUMA node is device/numa_node, its
PCIe switch the bridge right above it where the device's real path (/sys/devices/pci.../<bridge>/<gpu>) shows one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypedDict

from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.model import NodeSnapshot

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _card_dir(sysfs_root: Path, bus_id: str | None) -> str | None:
    """The GPU's PCI device directory: /sys/bus/pci/devices/<bdf>, else the DRM card whose uevent names it."""
    if not bus_id:
        return None
    pci = sysfs_root / "bus/pci/devices" / bus_id
    if pci.exists():
        return str(pci)
    base = sysfs_root / "class/drm"
    try:
        cards = sorted(n for n in os.listdir(base) if n.startswith("card") and n[4:].isdigit())
    except OSError:
        return None
    for card in cards:
        dev = base / card / "device"
        try:
            lines = (dev / "uevent").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.strip().partition("=")
            if key == "PCI_SLOT_NAME" and value.lower() == bus_id:
                return str(dev)
    return None


def _numa(dev: str | None) -> int | None:
    if dev is None:
        return None
    try:
        value = int(Path(dev, "numa_node").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return value if value >= 0 else None  # -1: the platform does not say


def _upstream(sysfs_root: Path, dev: str | None) -> list[str] | None:
    """PCI bridges above the device, root port first; None when the tree keeps no /sys/devices hierarchy."""
    if dev is None:
        return None
    root = os.path.realpath(sysfs_root)
    real = os.path.realpath(dev)
    if not real.startswith(root + os.sep):
        return None
    parts = real[len(root) + 1:].split(os.sep)
    if not parts or parts[0] != "devices":
        return None
    chain = [p for p in parts if _BDF.match(p)]
    return chain[:-1] if len(chain) > 1 else None


class TopologyGpu(TypedDict):
    """One GPU's row of the gpuwarden.topology/1 document (keys in the order the document lists them)."""

    index: int
    bus_id: str | None
    hive_id: str | None
    numa_node: int | None
    pcie_parent: str | None  # the bridge right above the GPU: its switch's downstream port (or the root port)
    pcie_path: list[str] | None  # bridges from the root port down
    hive_members: list[int]
    same_device: list[int]
    compute_partition: str | None
    memory_partition: str | None
    same_pcie_parent: list[int]
    reset_scope: list[int]
    engines_in_scope: list[str]


def topology(snap: NodeSnapshot, sysfs_root: Path) -> dict[str, Any]:
    """The gpuwarden.topology/1 document: per GPU its hive, switch, NUMA node and reset scope."""
    placed = []
    for g in snap.gpus:
        dev = _card_dir(sysfs_root, g.bus_id)
        placed.append((g, dev, _upstream(sysfs_root, dev)))
    by_parent: dict[str, list[int]] = {}
    for g, _, chain in placed:
        if chain:
            by_parent.setdefault(chain[-1], []).append(g.index)
    gpus: list[TopologyGpu] = []
    for g, dev, chain in placed:
        parent = chain[-1] if chain else None
        hive = [h.index for h in snap.gpus if g.hive_id and h.hive_id == g.hive_id] or [g.index]
        # MI300 partitions (DPX..CPX) are logical GPUs of one physical device: they share its PCI address.
        same_device = [d.index for d in snap.gpus if g.bus_id and d.bus_id == g.bus_id] or [g.index]
        gpu = snap.gpu(g.index)
        # A reset acts on the physical device (all its partitions); amdgpu resets an XGMI hive as one.
        scope = sorted(set(hive) | set(same_device))
        gpus.append({
            "index": g.index, "bus_id": g.bus_id, "hive_id": g.hive_id, "numa_node": _numa(dev),
            "pcie_parent": parent, "pcie_path": chain, "hive_members": hive, "same_device": same_device,
            "compute_partition": gpu.compute_partition if gpu is not None else None,
            "memory_partition": gpu.memory_partition if gpu is not None else None,
            "same_pcie_parent": by_parent.get(parent, [g.index]) if parent else [g.index],
            "reset_scope": scope,
            "engines_in_scope": sorted(e.name for e in snap.engines if e.gpu in scope
                                       and e.phase not in ("exited", "crashed") and not e.stale)})
    return document("topology", {"taken_at": snap.taken_at, "taken_at_iso": iso(snap.taken_at),
                                 "hostname": snap.hostname, "gpus": gpus})


def reset_reach(doc: dict[str, Any], gpu: int) -> str | None:
    """"resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x…: engines dp0, dp1 will lose their contexts", or None
    when the reset reaches GPU `gpu` alone and no engine serves there."""
    rows: list[TopologyGpu] = doc["gpus"]
    row = next((r for r in rows if r["index"] == gpu), None)
    if row is None:
        return None
    partitions = [i for i in row["same_device"] if i != gpu]
    others = [i for i in row["reset_scope"] if i != gpu and i not in partitions]
    engines = row["engines_in_scope"]
    if not others and not partitions and not engines:
        return None
    text = f"resetting GPU {gpu}"
    if partitions:
        text += (f" resets its physical device {row['bus_id']}, so also GPU{'s' if len(partitions) > 1 else ''} "
                 f"{_ranges(partitions)} ({row['compute_partition'] or 'partitions'} of the same device)")
    if others:
        text += (" and" if partitions else "") + \
            f" also resets GPU{'s' if len(others) > 1 else ''} {_ranges(others)} of hive {row['hive_id']}"
    if engines:
        text += f": engines {', '.join(engines)} will lose their contexts" if len(engines) > 1 else \
            f": engine {engines[0]} will lose its context"
    return text


def _ranges(indexes: list[int]) -> str:
    out: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set
    for i in sorted(indexes):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out)
