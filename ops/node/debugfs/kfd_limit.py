"""KFD's system-memory limit as amdgpu computes it at load, for when debugfs kfd/mem_limit cannot be read.

Cheap on purpose (one small read of meminfo): status falls back on it on every node whose debugfs it cannot read.
"""

from __future__ import annotations

from pathlib import Path

RESERVE = 3 << 29  # AMDGPU_RESERVE_MEM_LIMIT, 1.5 GiB
HOW = "RAM - RAM/64 - 1.5 GiB, as amdgpu_amdkfd_gpuvm_init_mem_limits computes it at driver load"


def computed_limit(mem_total: int) -> int:
    """Linux drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd_gpuvm.c, amdgpu_amdkfd_gpuvm_init_mem_limits: the RAM less
    1/64, less AMDGPU_RESERVE_MEM_LIMIT; halved instead when that would leave less than twice the reserve.
    ops/arena/budget.py's kfd_system_limit calls this."""
    limit = mem_total - (mem_total >> 6)
    return limit >> 1 if limit < 2 * RESERVE else limit - RESERVE


def read_mem_total(proc_root: Path) -> int | None:
    """MemTotal of <proc_root>/meminfo in bytes; None when it cannot be read."""
    try:
        with open(proc_root / "meminfo", "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith(b"MemTotal:"):
            parts = line.split()
            try:
                return int(parts[1]) * (1024 if len(parts) > 2 and parts[2].lower() == b"kb" else 1)
            except (IndexError, ValueError):
                return None
    return None


def computed(proc_root: Path) -> dict[str, object] | None:
    """{"system_limit", "mem_total", "how"} for the snapshot's driver books; None without a readable MemTotal."""
    total = read_mem_total(proc_root)
    if total is None:
        return None
    return {"system_limit": computed_limit(total), "mem_total": total, "how": HOW}
