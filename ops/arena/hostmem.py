"""Whether an arena about to be made on tmpfs would take a large share of the host's RAM: `arena create`'s warning.

A tmpfs keeps its files in memory (and swap): an arena there is RAM the engines, the page cache and KFD's
system-memory limit for registrations (`arena budget`) then share.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.units import fmt_bytes

MEMORY_FS = {"tmpfs", "ramfs"}
SHARE = 0.5  # more than half of RAM in one file is worth a line before minutes of writing


def _unescape(field: str) -> str:
    """A /proc/mounts field: the kernel writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_of(directory: Path, proc_root: Path = Path("/proc")) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding `directory`, from <proc_root>/self/mounts."""
    try:
        text = (proc_root / "self" / "mounts").read_text(errors="replace")
    except OSError:
        return None
    where = os.path.realpath(directory)
    best: tuple[str, str] | None = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):  # the last of equal mounts is the one on top
            best = (point, parts[2])
    return best


def meminfo(proc_root: Path = Path("/proc")) -> dict[str, int]:
    """/proc/meminfo in bytes (its kB are KiB)."""
    out: dict[str, int] = {}
    try:
        text = (proc_root / "meminfo").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return out


def tmpfs_warning(path: Path, nbytes: int, proc_root: Path = Path("/proc")) -> str | None:
    """One line when `nbytes` on the filesystem of `path` would be more than half of RAM or more than is
    available now, and that filesystem keeps its files in memory; None otherwise (or when it cannot tell)."""
    fs = filesystem_of(path.parent, proc_root)
    if fs is None or fs[1] not in MEMORY_FS:
        return None
    mem = meminfo(proc_root)
    total, available = mem.get("MemTotal"), mem.get("MemAvailable")
    if not total:
        return None
    if nbytes <= total * SHARE and (available is None or nbytes <= available):
        return None
    now = f", {fmt_bytes(available)} available now" if available is not None else ""
    return (f"{fs[0]} is {fs[1]}, which keeps files in RAM: this arena takes {fmt_bytes(nbytes)}, "
            f"{nbytes / total:.0%} of this host's {fmt_bytes(total)}{now}; engines, the page cache and KFD's "
            f"registration limit share what is left (`gpuwarden arena budget` checks the registrations)")
