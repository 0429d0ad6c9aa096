"""Engine logs: a size-capped writer (the shim's) and a reader that follows a log across rotations.

The cap is kept by rotating engine.log to engine.log.1 at half the limit, so both together stay under it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterator


class CappedLog:
    """Appends bytes to `path`; when it passes max_bytes/2 it becomes path.1 and a fresh file starts."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self.half = max(2048, max_bytes // 2)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        while data:
            room = self.half - self._size
            if room <= 0:
                self._rotate()
                continue
            # Cut at a newline where one is near, so a rotation rarely splits a line.
            piece = data[:room]
            if len(data) > room:
                nl = piece.rfind(b"\n")
                if nl > 0:
                    piece = piece[:nl + 1]
            os.write(self._fd, piece)
            self._size += len(piece)
            data = data[len(piece):]

    def _rotate(self) -> None:
        # Link and rename only, so the log path exists at every instant for readers following it.
        old = self.path.with_name(self.path.name + ".1")
        tmp_old = self.path.with_name(f".{self.path.name}.1.tmp")
        tmp_new = self.path.with_name(f".{self.path.name}.tmp")
        for tmp in (tmp_old, tmp_new):
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        os.link(self.path, tmp_old)
        os.replace(tmp_old, old)
        fd = os.open(tmp_new, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o640)
        os.replace(tmp_new, self.path)
        os.close(self._fd)
        self._fd = fd
        self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def follow(path: Path, *, from_end_lines: int = 20, poll_s: float = 0.2,
           keep_going: Callable[[], bool] = lambda: True) -> Iterator[str]:
    """Yield the last lines of a log, then new lines as they come, reopening it after a rotation."""
    from .state import tail  # one tail implementation for list and follow

    for line in tail(path, from_end_lines):
        yield line
    try:
        f = open(path, "rb")
        f.seek(0, os.SEEK_END)
    except FileNotFoundError:
        f = None
    partial = b""
    while keep_going():
        if f is None:
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                time.sleep(poll_s)
                continue
        chunk = f.read()
        if chunk:
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for raw in lines:
                yield raw.decode(errors="replace")
            continue
        try:
            rotated = os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            rotated = True
        if rotated:
            f.close()
            f = None
            continue
        time.sleep(poll_s)
