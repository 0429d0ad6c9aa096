"""Atomic replacement of a file outside the state dir (node_exporter's textfile directory, say).

Readers see the old file or the new one whole; state-dir files go through ops.statedir's checked opens instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from .statedir import write_all


def replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write a hidden temp file beside `path`, fsync it, rename it over `path` (never through a symlink)."""
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    tmp = f".{path.name}.{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
        try:
            try:
                write_all(fd, data)
                os.fchmod(fd, mode)  # the umask may have taken bits away
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            os.unlink(tmp, dir_fd=directory)
            raise
    finally:
        os.close(directory)
