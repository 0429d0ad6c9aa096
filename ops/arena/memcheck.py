"""Before an arena is created on tmpfs: will it fit in this host's memory and in the tmpfs? Warnings, not refusals.

A tmpfs arena is RAM (and swap) that nothing else can use; an arena of more than half the host's memory, or more
than it has available now, starves the engines and the page cache (issue 36: 14 GiB on a 24 GiB host said nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.units import fmt_bytes

SHARE = 0.5  # of MemTotal: above it, the warning says so even when MemAvailable would hold it


def _meminfo(proc_root: Path) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (those present); empty when /proc/meminfo cannot be read."""
    out: dict[str, int] = {}
    try:
        text = (proc_root / "meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1)
    return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def tmpfs_mount(directory: Path, proc_root: Path) -> str | None:
    """The mount point of the tmpfs that holds `directory`, or None when it is on another file system (or
    mountinfo cannot be read). The longest mount point that contains the directory wins, as the kernel's does."""
    try:
        lines = (proc_root / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(directory)
    best, best_type = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, tail[0]
    return best if best_type == "tmpfs" else None


def warnings(size: int, mem_total: int | None, mem_available: int | None, tmpfs: str | None,
             tmpfs_free: int | None) -> list[str]:
    """What to say about a `size`-byte arena on the tmpfs mounted at `tmpfs` (None: not tmpfs, nothing to say).
    The tmpfs's free space: a tmpfs may be mounted larger than the host's memory, so room there is no promise of
    memory; an arena larger than the room is not warned of here, create() refuses it naming the free space."""
    if tmpfs is None or not mem_total or (tmpfs_free is not None and size > tmpfs_free):
        return []
    share = size / mem_total
    if share <= SHARE and (mem_available is None or size <= mem_available):
        return []
    avail = f", {fmt_bytes(mem_available)} available now" if mem_available is not None else ""
    room = f"; the tmpfs has {fmt_bytes(tmpfs_free)} free" if tmpfs_free is not None else ""
    return [f"a {fmt_bytes(size)} arena on tmpfs {tmpfs} lives in RAM: {share:.0%} of this host's "
            f"{fmt_bytes(mem_total)}{avail} (/proc/meminfo){room}; the engines, the page cache and KFD's "
            "registration limit share what is left (`gpuwarden arena budget` checks the last)"]


def check(path: Path, size: int, proc_root: Path) -> list[str]:
    """The warnings for creating a `size`-byte arena at `path`, read from this node (under `proc_root`)."""
    directory = path.parent
    mount = tmpfs_mount(directory, proc_root)
    if mount is None:
        return []
    mem = _meminfo(proc_root)
    try:
        st = os.statvfs(directory)
        free: int | None = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return warnings(size, mem.get("MemTotal"), mem.get("MemAvailable"), mount, free)
