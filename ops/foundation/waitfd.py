"""Waiting until a file descriptor can be read, whatever its number.

select() cannot watch a descriptor above FD_SETSIZE (1024), and a busy node's agent holds thousands open.
"""

from __future__ import annotations

import select
from typing import Any


def readable(fd: Any, timeout_s: float) -> bool:
    """True when `fd` (a number or an object with fileno()) has data, end of file or a hang-up within timeout_s."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # POLLHUP and POLLERR are reported without asking, as select reports EOF
    return bool(poller.poll(max(0.0, timeout_s) * 1000))
