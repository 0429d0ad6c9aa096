"""Facts several doctor checks need, computed once per run: the AMD GPUs, NVIDIA presence, the node config, RAM.

Each getter records, on the calling check, the files the fact comes from (whichever check computed it first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.ops.node.backends import sysfs
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.arena.budget import mem_total as read_mem_total
from gpuwarden.ops.doctor.probe import CheckIO

NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class AmdGpu:
    index: int  # HIP's order (KFD topology), else the cards' order
    card: str | None  # "card0"
    bus: str | None
    kfd_node: int | None
    props: dict[str, int] = field(default_factory=dict)

    @property
    def dev(self) -> str | None:
        """The device directory relative to the GPU tree."""
        return f"class/drm/{self.card}/device" if self.card else None

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.bus})" if self.bus else "")


def amd_gpus(io: CheckIO) -> list[AmdGpu]:
    io.note("/sys/class/drm/card*/device/vendor")
    io.note("/sys/class/kfd/kfd/topology/nodes/*/properties")
    root = io.roots.gpu

    def scan() -> list[AmdGpu]:
        cards = sysfs.amd_cards(root)
        nodes = sysfs.kfd_gpu_nodes(root)
        out = []
        for i, (card, _, node) in enumerate(sysfs.pair(nodes, cards)):
            bus = (card.bus_id if card else None) or (node.bus_id if node else None)
            out.append(AmdGpu(i, card.card if card else None, bus, node.node if node else None,
                              dict(node.props) if node else {}))
        return out
    return io.shared("amd_gpus", scan)


def device_model(io: CheckIO, gpu: AmdGpu) -> str:
    """What makes two GPUs "the same model" for firmware comparison: PCI device id and revision."""
    if gpu.dev is None:
        return f"kfd device_id {gpu.props.get('device_id', '?')}"
    device = io.line("gpu", f"{gpu.dev}/device") or "?"
    revision = io.line("gpu", f"{gpu.dev}/revision")
    name = io.line("gpu", f"{gpu.dev}/product_name")
    return " ".join(x for x in (name, f"[{device}" + (f" rev {revision}]" if revision else "]")) if x)


def nvidia_present(io: CheckIO) -> bool:
    """The NVIDIA kernel module is loaded (its sysfs directory or its /proc file), or a card says vendor 0x10de."""
    if io.exists("gpu", "module/nvidia") or io.exists("proc", "driver/nvidia/version"):
        return True
    for card in io.listdir("gpu", "class/drm"):
        if not (card.startswith("card") and card[4:].isdigit()):
            continue
        if io.int("gpu", f"class/drm/{card}/device/vendor") == NVIDIA_VENDOR:
            return True
    return False


def node_config(io: CheckIO) -> Any:
    """The node config, None when there is none; a config that does not load raises (the check says unknown)."""
    path = io.settings.config_path
    io.note(str(path))
    if not path.exists():
        return None

    def load() -> Any:
        return nodeconfig.load(io.settings)
    return io.shared("node_config", load)


def mem_total(io: CheckIO) -> int | None:
    io.note("/proc/meminfo")
    try:
        return read_mem_total(io.roots.proc)
    except GpuwardenError:
        return None


def meminfo(io: CheckIO) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in (io.text("proc", "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1)
    return out


def kernel_release(io: CheckIO) -> str | None:
    release = io.line("proc", "sys/kernel/osrelease")
    if release:
        return release
    version = io.line("proc", "version") or ""
    parts = version.split()
    # "Linux version 6.8.0-52-generic (buildd@...) ..."
    return parts[2] if len(parts) > 2 and parts[:2] == ["Linux", "version"] else None


def cmdline(io: CheckIO) -> list[str]:
    return (io.line("proc", "cmdline") or "").replace("\x00", " ").split()


def cmdline_value(args: list[str], key: str) -> str | None:
    """The last `key=value` on the kernel command line (the kernel applies the last one), "" for a bare `key`."""
    found = None
    for arg in args:
        name, eq, value = arg.partition("=")
        if name == key:
            found = value if eq else ""
    return found


def readable_cpus(text: str | None) -> set[int]:
    """A cpulist ("0-15,32-47") as a set."""
    out: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            out.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return out


def is_live_proc(io: CheckIO) -> bool:
    return io.live and os.path.realpath(io.roots.proc) == "/proc"
