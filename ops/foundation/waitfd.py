"""Waiting until a file descriptor can be read, whatever its number, and waking a thread asleep on one.

select() cannot watch a descriptor above FD_SETSIZE (1024), and a busy node's agent holds thousands open.
"""

from __future__ import annotations

import os
import select
from typing import Any


def readable(fd: Any, timeout_s: float | None, wake: int | None = None) -> bool:
    """True when `fd` (a number or an object with fileno()) has data, end of file or a hang-up within timeout_s
    (None: however long it takes). False at the timeout, or as soon as `wake` (a pipe's read end) is readable:
    how a thread asleep on `fd` is told to stop without waking on a timer to look."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # POLLHUP and POLLERR are reported without asking, as select reports EOF
    if wake is not None:
        poller.register(wake, select.POLLIN)
    ready = poller.poll(None if timeout_s is None else max(0.0, timeout_s) * 1000)
    if wake is None:
        return bool(ready)
    mine = fd if isinstance(fd, int) else fd.fileno()
    return any(got == mine for got, _ in ready)


class WakePipe:
    """How a thread asleep on a descriptor is told to look at its stop flag without waking on a timer: it polls
    `fd` too, and wake() makes it readable until drain(). Set the flag before wake()."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        try:
            os.write(self._w, b"x")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def drain(self) -> None:
        try:
            while os.read(self.fd, 64):
                pass
        except OSError:  # empty, or closed
            pass

    def close(self) -> None:
        """Once: a second call must not close a number another file has been given since."""
        fds, self.fd, self._w = (self.fd, self._w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self.fd < 0
