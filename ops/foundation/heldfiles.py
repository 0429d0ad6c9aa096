"""Re-reading small kernel files through descriptors kept open: one pread instead of open+read+close.

sysfs attributes and /proc/<pid>/stat regenerate on every read at offset 0, so a held fd stays
current; a read error (the process or kobject is gone) drops the fd and reports None.
"""

from __future__ import annotations

import os

from gpuwarden.ops.foundation.fdbudget import EXHAUSTED, PROCESS, FdBudget, OutOfDescriptors, raise_fd_limit  # noqa: F401 (re-export)


def open_or_none(path: str, blocking: bool = False) -> int | None:
    """os.open for reading; None when the file is not there (or not readable), OutOfDescriptors when no fd is left.

    Not `blocking`, a FIFO in a captured tree opens at once (and reads nothing); blocking, it waits for a writer,
    as a wedged driver's attribute does: only for reads that run under a deadline (gpuwarden.ops.foundation.deadline)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if blocking else os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno in EXHAUSTED:
            raise OutOfDescriptors(exc.errno, f"no file descriptor left to read {path}") from None
        return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # already gone with its file (EBADF cannot come from us: the fd was ours alone)
        pass


class HeldFiles:
    """A map path -> open fd, kept within the process's descriptor budget; past it, plain reads.

    `limit` caps this map on its own as well (tests); the budget is shared with every other holder."""

    def __init__(self, limit: int | None = None, budget: FdBudget = PROCESS, *, blocking_open: bool = False):
        self.limit = limit if limit is not None else 1 << 30
        self.budget = budget
        self.blocking_open = blocking_open
        self._fds: dict[str, int] = {}

    def read(self, path: str, size: int = 4096) -> bytes | None:
        fd = self._fds.get(path)
        if fd is None:
            fd = open_or_none(path, self.blocking_open)
            if fd is None:
                return None
            if len(self._fds) >= self.limit or not self.budget.take():
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

    def fd(self, path: str) -> int | None:
        """The descriptor held for `path` (valid until drop/close), None when it is read without one."""
        return self._fds.get(path)

    # A lane thread abandoned at its deadline may still read, and drop, while the owner closes: each descriptor is
    # taken out of the map by one atomic pop before it is closed, so exactly one of them closes it (a second close
    # would fail with EBADF, or close a descriptor the number was given to since).
    def drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            _close(fd)
            self.budget.give()

    def paths(self) -> list[str]:
        return list(self._fds)

    def close(self) -> None:
        """Close every held descriptor; the map stays usable (a reader after this holds its files anew)."""
        while True:
            try:
                _, fd = self._fds.popitem()
            except KeyError:
                return
            _close(fd)
            self.budget.give()

    def __len__(self) -> int:
        return len(self._fds)
