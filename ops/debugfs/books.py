"""The driver's own books for a snapshot: KFD system memory used/limit and each GPU's VRAM free space.

Read through the allow-listed reader every refresh (two small files per GPU at most); a source that cannot be
read is said once, with why, and the numbers are None: callers fall back to what they compute.
"""

from __future__ import annotations

from . import parse
from .reader import DebugfsReader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` reads debugfs too
if TYPE_CHECKING:
    from typing import Any


def read(reader: DebugfsReader, gpu_indices: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"debugfs": str(reader.root), "kfd_mem_limit": None, "kfd_mem_limit_unavailable": None,
                           "vram_free": [], "vram_free_unavailable": None}
    r = reader.read("kfd_mem_limit")
    limit = parse.mem_limit(r.data) if r.ok and r.data is not None else None
    if limit is not None:
        out["kfd_mem_limit"] = {**limit.to_dict(), "source": r.path}
    else:
        out["kfd_mem_limit_unavailable"] = r.why() if not r.ok else f"{r.path}: not in the format of kfd_debugfs_kfd_mem_limits"
    why = None
    for i in gpu_indices:
        v = reader.read("vram_mm", i)
        free = parse.vram_mm(v.data) if v.ok and v.data is not None else None
        if free is None:
            why = why or (v.why() if not v.ok else f"{v.path}: not a drm_buddy or drm_mm print")
            continue
        out["vram_free"].append({"gpu": i, **free.to_dict()})
    if not out["vram_free"]:
        out["vram_free_unavailable"] = why
    return out


def holders(reader: DebugfsReader, gpu_index: int) -> tuple[dict[int, dict[str, Any]], str | None]:
    """Per pid, the VRAM/GTT amdgpu_gem_info charges on one GPU; ({}, why) when it cannot be read."""
    r = reader.read("gem_info", gpu_index)
    if not r.ok or r.data is None:
        return {}, r.why()
    return parse.holders(parse.gem_info(r.data)), None
