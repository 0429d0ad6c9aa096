"""GPUs on the PCI bus, whatever drivers are loaded: what to say when no GPU backend can read the node.

Reads /sys/bus/pci/devices/*/{vendor,class} and the bound driver; "2 AMD GPUs on the PCI bus, amdgpu not
loaded" tells an operator more than "no backend works".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

VENDORS = {0x1002: ("AMD", "amdgpu"), 0x10DE: ("NVIDIA", "nvidia")}
# PCI base classes of a GPU: 0x03 display controller (VGA, 3D, other), 0x12 processing accelerator.
GPU_CLASSES = (0x03, 0x12)


@dataclass(frozen=True)
class PciGpu:
    address: str  # 0000:65:00.0
    vendor: str  # "AMD" or "NVIDIA"
    driver: str | None  # the bound driver's name, None when none is bound


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def gpus_on_bus(sysfs_root: Path = Path("/sys")) -> list[PciGpu]:
    """AMD and NVIDIA display/accelerator functions on the PCI bus, in address order."""
    base = sysfs_root / "bus/pci/devices"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        dev = base / name
        vendor, cls = _hex(dev / "vendor"), _hex(dev / "class")
        if vendor not in VENDORS or cls is None or (cls >> 16) not in GPU_CLASSES:
            continue
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            driver = None
        out.append(PciGpu(name, VENDORS[vendor][0], driver))
    return out


def describe(sysfs_root: Path = Path("/sys")) -> str:
    """One clause for the operator: which GPUs the bus has and what their drivers are doing."""
    found = gpus_on_bus(sysfs_root)
    if not (sysfs_root / "bus/pci/devices").is_dir():
        return f"no PCI bus visible under {sysfs_root} (a container without /sys?)"
    if not found:
        return "no AMD or NVIDIA GPU on the PCI bus"
    parts = []
    for vendor, module in VENDORS.values():
        mine = [g for g in found if g.vendor == vendor]
        if not mine:
            continue
        n = f"{len(mine)} {vendor} GPU{'s' if len(mine) > 1 else ''} on the PCI bus"
        drivers = sorted({g.driver for g in mine if g.driver})
        if not drivers:
            loaded = (sysfs_root / "module" / module).is_dir()
            parts.append(f"{n}, {module} loaded but bound to none of them" if loaded else f"{n}, {module} not loaded")
        elif drivers == [module]:
            parts.append(f"{n}, driven by {module}")
        else:
            parts.append(f"{n}, bound to {', '.join(drivers)}")
    return "; ".join(parts)
