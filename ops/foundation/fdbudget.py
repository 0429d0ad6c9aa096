"""How many file descriptors the long-lived readers of this process may keep open, all of them together.

RLIMIT_NOFILE is per process: held sysfs files and pidfds share it, so each takes from one budget
instead of each assuming the whole limit (which, at a low limit, ran out and made live processes look gone).
"""

from __future__ import annotations

import errno
import resource
from _thread import allocate_lock  # threading.Lock itself, without loading threading (~1 ms of `status`)

# Left for everything else the process opens (sockets, logs, one-off reads, libraries).
RESERVE = 256
# A read that fails with one of these says nothing about the file: the process is out of descriptors.
EXHAUSTED = (errno.EMFILE, errno.ENFILE)


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


class FdBudget:
    """A counter of descriptors that may still be kept open; take() before keeping one, give() after closing it."""

    def __init__(self, total: int | None = None):
        self._total = total
        self._left: int | None = total
        self._lock = allocate_lock()

    def _size(self) -> int:
        if self._left is None:  # sized at first use: raising the limit is a system call not every command needs
            self._total = max(0, raise_fd_limit() - RESERVE)
            self._left = self._total
        return self._left

    def take(self, n: int = 1) -> bool:
        with self._lock:
            if self._size() < n:
                return False
            self._left -= n  # type: ignore[operator]
            return True

    def give(self, n: int = 1) -> None:
        with self._lock:
            self._size()
            self._left = min(self._total, self._left + n)  # type: ignore[operator,type-var]

    @property
    def left(self) -> int:
        with self._lock:
            return self._size()


# The process's own budget: the limit it divides is the process's, so this one object is process-wide too.
PROCESS = FdBudget()


class OutOfDescriptors(OSError):
    """The process has no file descriptor left: a read failed for that, not because the file is gone."""
