"""Exit notification for many processes at once: one pidfd each, one epoll over all of them.

A refresh asks which tracked processes exited (zombie or reaped) in one call instead of reading
every /proc/<pid>/stat; callers fall back to reading stat where pidfds cannot be used.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

from gpuwarden.ops.foundation.fdbudget import PROCESS, FdBudget


def usable(proc_root: Path) -> bool:
    """True when pidfds name the same processes as `proc_root`: the live /proc of our own PID namespace.

    A captured tree or a /proc mounted from another namespace numbers processes differently; a kernel
    before 5.3 (ENOSYS) or a seccomp filter (EPERM) refuses pidfd_open outright.
    """
    if not hasattr(os, "pidfd_open") or not hasattr(select, "epoll"):
        return False
    try:
        if os.readlink(os.path.join(proc_root, "self")) != str(os.getpid()):
            return False
    except OSError:
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class PidWatch:
    """pid -> pidfd, registered in one epoll. Past `limit` pidfds or the process's descriptor budget,
    track() declines (callers read stat).

    epoll rather than poll: poll walks every fd at each call (0.1 ms for 2,000 here), epoll hands back
    only the ready ones, and exits are rare.
    """

    def __init__(self, limit: int | None = None, budget: FdBudget = PROCESS):
        self.limit = limit if limit is not None else 1 << 30
        self.budget = budget
        self._ep = select.epoll()
        self._fd_of: dict[int, int] = {}
        self._pid_of: dict[int, int] = {}

    def __contains__(self, pid: int) -> bool:
        return pid in self._fd_of

    def __len__(self) -> int:
        return len(self._fd_of)

    def pids(self) -> set[int]:
        return set(self._fd_of)

    def track(self, pid: int) -> bool:
        """Watch `pid` from now on. False when it cannot be watched (no such process, a thread id, no fds left).

        Open the pidfd before reading the process's facts: the pidfd then names the process read or one
        that replaced it after an exit, and that exit shows at the next exited() call.
        """
        if pid in self._fd_of:
            return True
        if len(self._fd_of) >= self.limit or not self.budget.take():
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self.budget.give()
            return False
        try:
            self._ep.register(fd, select.EPOLLIN)
        except OSError:
            os.close(fd)
            self.budget.give()
            return False
        self._fd_of[pid] = fd
        self._pid_of[fd] = pid
        return True

    def exited(self) -> set[int]:
        """Tracked PIDs whose process has exited: zombies (readable until reaped) and reaped ones (readable
        and hung up). Level-triggered, so a zombie is reported at every call until forgotten."""
        if not self._fd_of:
            return set()
        events = self._ep.poll(0, len(self._fd_of) + 1)  # room for all: none left for the next call
        pid_of = self._pid_of
        return {pid_of[fd] for fd, _ in events if fd in pid_of}

    def forget(self, pid: int) -> None:
        fd = self._fd_of.pop(pid, None)
        if fd is None:
            return
        self._pid_of.pop(fd, None)
        # A forked child may still share this fd; unregister, or its events would outlive the close.
        try:
            self._ep.unregister(fd)
        except OSError:
            pass
        os.close(fd)
        self.budget.give()

    def close(self) -> None:
        # One atomic pop per descriptor, as forget() takes its own: a forget() still running elsewhere when the
        # owner closes (a read abandoned at its deadline) and this close never both close one descriptor.
        while True:
            try:
                _, fd = self._fd_of.popitem()
            except KeyError:
                break
            self._pid_of.pop(fd, None)
            os.close(fd)
            self.budget.give()
        self._ep.close()

