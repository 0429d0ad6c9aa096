"""Re-reading small kernel files through descriptors kept open: one pread instead of open+read+close.

sysfs attributes and /proc/<pid>/stat regenerate on every read at offset 0, so a held fd stays
current; a read error (the process or kobject is gone) drops the fd and reports None.
"""

from __future__ import annotations

import os
import resource


def raise_fd_limit(wanted: int = 1 << 16) -> int:
    """Lift the soft RLIMIT_NOFILE towards `wanted` (never above the hard limit); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft


class HeldFiles:
    """A bounded map path -> open fd. Past `limit` open files it falls back to plain reads."""

    def __init__(self, limit: int | None = None):
        if limit is None:
            limit = max(0, raise_fd_limit() - 256)  # leave room for everything else the process opens
        self.limit = limit
        self._fds: dict[str, int] = {}

    def read(self, path: str, size: int = 4096) -> bytes | None:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return None
            if len(self._fds) >= self.limit:
                try:
                    return os.read(fd, size)
                except OSError:
                    return None
                finally:
                    os.close(fd)
            self._fds[path] = fd
        try:
            return os.pread(fd, size, 0)
        except OSError:
            self.drop(path)
            return None

    def drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def paths(self) -> list[str]:
        return list(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __len__(self) -> int:
        return len(self._fds)
