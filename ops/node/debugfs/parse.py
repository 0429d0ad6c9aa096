"""The kernel's print formats of the allowed debugfs files, parsed into numbers. Supported versions:

- kfd/mem_limit (kfd_debugfs_kfd_mem_limits, since the kernel that added it, ~6.2, and ROCm's amdgpu-dkms):
  "System mem used %lldM out of %lluM" / "TTM mem used %lldM out of %lluM" (MiB, rounded down).
- amdgpu_gem_info (amdgpu_debugfs_gem_info_show + amdgpu_bo_print_info): "pid %8d command %s:" per DRM client,
  then "\t\t0x%08x: %12lld byte %s" per BO; placement "VRAM"/" GTT"/" CPU" (up to ~6.3) or "VRAM", "VRAM
  VISIBLE", "GTT", "CPU", "GDS", "GWS", "OA", "PREEMPTIBLE", "DOORBELL", "NONE", "UNKNOWN" (later), then
  optional " pin count N", " imported from/exported as ...", flags and fences (ignored).
- amdgpu_vm_info (amdgpu_debugfs_vm_bo_info, 5.11+): "pid:%d\tProcess:%s ----------" per VM, sections
  "\tIdle BOs:" ... "\tDone BOs:" of BO lines, then "\tTotal <state> size: %12lld\tobjs:\t%d".
- amdgpu_vram_mm: drm_buddy (5.19+): "chunk_size: %lluKiB, total: %lluMiB, free: %lluMiB[, clear_free: ...]"
  then "order-%2d free: %8llu KiB|MiB, blocks: %llu"; drm_mm (older): "0x...-0x...: %llu: free|used" per
  node and "total: %llu, used %llu free %llu" (pages of 4 KiB in amdgpu's VRAM manager).
Lines of any other shape are skipped and counted, so a new kernel's extra line costs nothing.
"""

from __future__ import annotations

import re

from gpuwarden.ops.foundation.records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` reads debugfs too
if TYPE_CHECKING:
    from typing import Any

MIB = 1 << 20
PAGE = 4096

_MEM = re.compile(r"^(System|TTM) mem used (-?\d+)M out of (\d+)M\s*$")
_CLIENT = re.compile(r"^pid\s+(\d+) command (.{0,64}?)(?: (\S.{0,200}?))?:\s*$")
_BO = re.compile(r"^\t\t0x([0-9a-fA-F]{1,8}):\s+(\d+) byte\s+(VRAM VISIBLE|VRAM|GTT|CPU|GDS|GWS|OA|PREEMPTIBLE|DOORBELL"
                 r"|NONE|UNKNOWN)(?P<rest>.*)$")
_PIN = re.compile(r" pin count (\d+)")
_VM = re.compile(r"^pid:(\d+)\tProcess:(.{0,64}?) ----------\s*$")
_VM_SECTION = re.compile(r"^\t(Idle|Evicted|Relocated|Moved|Invalidated|Done) BOs:\s*$")
_VM_TOTAL = re.compile(r"^\tTotal (idle|evicted|relocated|moved|invalidated|done) size:\s+(\d+)\tobjs:\t(\d+)\s*$")
_BUDDY_HEAD = re.compile(r"^chunk_size: (\d+)KiB, total: (\d+)MiB, free: (\d+)MiB")
_BUDDY_ORDER = re.compile(r"^order-\s*(\d+) free:\s+(\d+) (KiB|MiB), blocks: (\d+)\s*$")
_MM_NODE = re.compile(r"^0x([0-9a-f]+)-0x([0-9a-f]+): (\d+): (free|used)\s*$")
_MM_TOTAL = re.compile(r"^total: (\d+), used (\d+) free (\d+)\s*$")


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


@record
class MemLimit:
    system_used: int
    system_limit: int
    ttm_used: int | None
    ttm_limit: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"system_used": self.system_used, "system_limit": self.system_limit, "ttm_used": self.ttm_used,
                "ttm_limit": self.ttm_limit}


def mem_limit(data: bytes) -> MemLimit | None:
    found: dict[str, tuple[int, int]] = {}
    for line in _lines(data):
        m = _MEM.match(line)
        if m:
            found[m[1]] = (max(0, int(m[2])) * MIB, int(m[3]) * MIB)
    if "System" not in found:
        return None
    ttm = found.get("TTM", (None, None))
    return MemLimit(found["System"][0], found["System"][1], ttm[0], ttm[1])


class Client:
    """One DRM file (a process's open of the render node) and the buffer objects it holds."""

    def __init__(self, pid: int, command: str, name: str | None = None) -> None:
        self.pid, self.command = pid, command
        self.name = name  # newer kernels print the client name a process set
        self.bytes_by_placement: dict[str, int] = {}
        self.objects = 0
        self.pinned_bytes = 0

    @property
    def vram(self) -> int:
        return self.bytes_by_placement.get("VRAM", 0) + self.bytes_by_placement.get("VRAM VISIBLE", 0)

    @property
    def gtt(self) -> int:
        return self.bytes_by_placement.get("GTT", 0)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "name": self.name, "objects": self.objects,
                "vram_bytes": self.vram, "gtt_bytes": self.gtt, "pinned_bytes": self.pinned_bytes,
                "bytes_by_placement": dict(self.bytes_by_placement)}


def _bo(line: str) -> tuple[int, str, int] | None:
    m = _BO.match(line)
    if not m:
        return None
    pin = _PIN.search(m["rest"] or "")
    return int(m[2]), m[3].strip(), int(pin[1]) if pin else 0


def gem_info(data: bytes) -> list[Client]:
    clients: list[Client] = []
    for line in _lines(data):
        m = _CLIENT.match(line)
        if m:
            clients.append(Client(int(m[1]), m[2], m[3]))
            continue
        bo = _bo(line) if clients else None
        if bo:
            size, placement, pins = bo
            c = clients[-1]
            c.bytes_by_placement[placement] = c.bytes_by_placement.get(placement, 0) + size
            c.objects += 1
            if pins:
                c.pinned_bytes += size
    return clients


def holders(clients: list[Client]) -> dict[int, dict[str, Any]]:
    """Per pid (several DRM files of one process summed): VRAM and GTT bytes the driver's books charge it."""
    out: dict[int, dict[str, Any]] = {}
    for c in clients:
        h = out.setdefault(c.pid, {"pid": c.pid, "command": c.command, "vram_bytes": 0, "gtt_bytes": 0,
                                   "objects": 0, "clients": 0})
        h["vram_bytes"] += c.vram
        h["gtt_bytes"] += c.gtt
        h["objects"] += c.objects
        h["clients"] += 1
    return out


class VmState:
    """One process's GPU VM: bytes and objects per BO state (idle/evicted/relocated/moved/invalidated/done)."""

    def __init__(self, pid: int, process: str) -> None:
        self.pid, self.process = pid, process
        self.sizes: dict[str, int] = {}
        self.objects: dict[str, int] = {}

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "process": self.process, "sizes": dict(self.sizes), "objects": dict(self.objects)}


def vm_info(data: bytes) -> list[VmState]:
    vms: list[VmState] = []
    for line in _lines(data):
        m = _VM.match(line)
        if m:
            vms.append(VmState(int(m[1]), m[2]))
            continue
        t = _VM_TOTAL.match(line) if vms else None
        if t:
            vms[-1].sizes[t[1]] = int(t[2])
            vms[-1].objects[t[1]] = int(t[3])
    return vms


@record
class VramFree:
    """The VRAM allocator's free space: total free and the largest block one allocation can get."""

    allocator: str  # "drm_buddy" or "drm_mm"
    total: int | None
    free: int
    largest_free_block: int
    free_blocks: int

    @property
    def fragmentation(self) -> float | None:
        """1 - largest/total free: 0 when all free VRAM is one block, near 1 when it is in crumbs."""
        return None if self.free <= 0 else round(1.0 - self.largest_free_block / self.free, 4)

    def to_dict(self) -> dict[str, Any]:
        return {"allocator": self.allocator, "total": self.total, "free": self.free,
                "largest_free_block": self.largest_free_block, "free_blocks": self.free_blocks,
                "fragmentation": self.fragmentation}


def vram_mm(data: bytes) -> VramFree | None:
    lines = _lines(data)
    chunk = total = head_free = None
    orders_free, largest, blocks = 0, 0, 0
    seen_order = False
    for line in lines:
        m = _BUDDY_HEAD.match(line.strip())
        if m and chunk is None:  # the first header is the VRAM manager's own; "reserved:" blocks follow later
            chunk, total, head_free = int(m[1]) << 10, int(m[2]) * MIB, int(m[3]) * MIB
            continue
        o = _BUDDY_ORDER.match(line.strip()) if chunk is not None else None
        if o and chunk is not None:  # o never matches before the chunk size is known; the test narrows chunk's type
            seen_order = True
            count = int(o[4])
            orders_free += int(o[2]) << (10 if o[3] == "KiB" else 20)
            if count:
                blocks += count
                largest = max(largest, chunk << int(o[1]))
    if chunk is not None and seen_order:
        return VramFree("drm_buddy", total, head_free if head_free is not None else orders_free, largest, blocks)
    free = used = 0
    largest = blocks = 0
    nodes = False
    mm_total = None
    for line in lines:
        n = _MM_NODE.match(line.strip())
        if n:
            nodes = True
            size = int(n[3]) * PAGE
            if n[4] == "free":
                free += size
                blocks += 1
                largest = max(largest, size)
            else:
                used += size
            continue
        t = _MM_TOTAL.match(line.strip())
        if t:
            mm_total = int(t[1]) * PAGE
    if nodes:
        return VramFree("drm_mm", mm_total or free + used, free, largest, blocks)
    return None
