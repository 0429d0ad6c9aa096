"""Rewriting the simulated node's stand-ins for kernel attribute files without a new inode: readers hold them
open and pread them, as they do real sysfs, debugfs and fdinfo files.
"""

from __future__ import annotations

import os


def rewrite(fd: int, data: bytes) -> None:
    """Make the open file `fd` hold exactly `data`, writing only when it differs. The new bytes go in before the
    old tail is cut, so a reader between the two sees the new value (and perhaps a stale tail), never nothing."""
    if os.pread(fd, len(data) + 1, 0) != data:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
