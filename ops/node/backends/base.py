"""The protocol every GPU backend implements, and what callers may rely on.

A backend answers two questions quickly: which GPUs, and which PIDs hold how much VRAM on each.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpuwarden.ops.foundation.model import GpuInfo, ProcessUsage


@runtime_checkable
class Backend(Protocol):
    name: str  # "amdsmi", "sysfs", "nvml", "sim"
    simulated: bool

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, index order. Fields the source cannot give are None."""
        ...

    def process_usage(self) -> list[ProcessUsage]:
        """VRAM per (host PID, GPU). May include PIDs that no longer exist (KFD leftovers)."""
        ...

    def device_globs(self) -> list[str]:
        """Glob patterns (absolute) of device files whose holders count as GPU users."""
        ...

    def close(self) -> None:
        ...
