"""Atomic replacement of a file outside the state dir (node_exporter's textfile directory, say).

Readers see the old file or the new one whole; the directory is the caller's, so it is not held to the state dir's rules.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.statedir import Dir


def replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write a hidden temp file beside `path`, fsync it, rename it over `path` (never through a symlink)."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    with Dir(fd, path.parent) as directory:  # not _check_dir: another user's directory is fine here
        directory.write_atomic(path.name, data, mode)
