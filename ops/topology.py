"""Which GPUs share an XGMI hive, a PCIe switch and a NUMA node, and so which GPUs a reset of one takes down.

From the snapshot (hive ids) and the PCI tree under the sysfs root: a GPU's NUMA node is device/numa_node, its
PCIe switch the bridge right above it where the device's real path (/sys/devices/pci.../<bridge>/<gpu>) shows one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .jsondoc import document, iso
from .model import NodeSnapshot

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


def topology(snap: NodeSnapshot, sysfs_root: Path) -> dict:
    """The gpuwarden.topology/1 document: per GPU its hive, switch, NUMA node and reset scope."""
    gpus = []
    for g in snap.gpus:
        dev = _card_dir(sysfs_root, g.bus_id)
        chain = _upstream(sysfs_root, dev)
        gpus.append({"index": g.index, "bus_id": g.bus_id, "hive_id": g.hive_id, "numa_node": _numa(dev),
                     # The bridge right above the GPU: its switch's downstream port (or the root port).
                     "pcie_parent": chain[-1] if chain else None, "pcie_path": chain})
    by_parent: dict[str, list[int]] = {}
    for row in gpus:
        if row["pcie_parent"]:
            by_parent.setdefault(row["pcie_parent"], []).append(row["index"])
    for row in gpus:
        hive = [g.index for g in snap.gpus if row["hive_id"] and g.hive_id == row["hive_id"]]
        row["hive_members"] = hive or [row["index"]]
        # MI300 partitions (DPX..CPX) are logical GPUs of one physical device: they share its PCI address.
        row["same_device"] = [g.index for g in snap.gpus if row["bus_id"] and g.bus_id == row["bus_id"]] or \
            [row["index"]]
        gpu = snap.gpu(row["index"])
        row["compute_partition"] = gpu.compute_partition if gpu is not None else None
        row["memory_partition"] = gpu.memory_partition if gpu is not None else None
        row["same_pcie_parent"] = by_parent.get(row["pcie_parent"], [row["index"]]) if row["pcie_parent"] else \
            [row["index"]]
        # A reset acts on the physical device (all its partitions); amdgpu resets an XGMI hive as one.
        row["reset_scope"] = sorted(set(row["hive_members"]) | set(row["same_device"]))
        row["engines_in_scope"] = sorted(e.name for e in snap.engines if e.gpu in row["reset_scope"]
                                         and e.phase not in ("exited", "crashed") and not e.stale)
    return document("topology", {"taken_at": snap.taken_at, "taken_at_iso": iso(snap.taken_at),
                                 "hostname": snap.hostname, "gpus": gpus})


def reset_reach(doc: dict, gpu: int) -> str | None:
    """"resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x…: engines dp0, dp1 will lose their contexts", or None
    when the reset reaches GPU `gpu` alone and no engine serves there."""
    row = next((r for r in doc["gpus"] if r["index"] == gpu), None)
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
    out, start, prev = [], None, None
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
