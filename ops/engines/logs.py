"""Engine logs: a size-capped writer (the shim's) and a reader that follows a log across rotations.

The cap is kept by rotating engine.log to engine.log.1 at half the limit, so both together stay under it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from gpuwarden.ops.foundation import redact, statedir
from gpuwarden.ops.foundation.safetext import log_line
from gpuwarden.ops.engines.state import tail  # one tail implementation for list and follow

MAX_LINE = 1 << 20  # a longer "line" is shown in pieces, never held whole


class CappedLog:
    """Appends bytes to `path`; when it passes max_bytes/2 it becomes path.1 and a fresh file starts."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self.half = max(2048, max_bytes // 2)
        # Every open and rename goes through the log's checked directory: a planted symlink is refused.
        self._dir = statedir.open_dir(path.parent)
        self._fd = self._dir.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
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
        name = self.path.name
        old, tmp_old, tmp_new = f"{name}.1", f".{name}.1.tmp", f".{name}.tmp"
        for tmp in (tmp_old, tmp_new):
            self._dir.unlink(tmp)
        self._dir.link(name, tmp_old)
        self._dir.rename(tmp_old, old)
        fd = self._dir.open(tmp_new, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        self._dir.rename(tmp_new, name)
        os.close(self._fd)
        self._fd = fd
        self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._dir.close()


def follow(path: Path, *, from_end_lines: int = 20, poll_s: float = 0.2,
           keep_going: Callable[[], bool] = lambda: True) -> Iterator[str]:
    """Yield the last lines of a log, then new lines as they come, reopening it after a rotation."""
    for line in tail(path, from_end_lines):
        yield line
    f = _open_log(path)
    if f is not None:
        f.seek(0, os.SEEK_END)
    partial = b""
    while keep_going():
        if f is None:
            f = _open_log(path)
            if f is None:
                time.sleep(poll_s)
                continue
        chunk = f.read(1 << 20)
        if chunk:
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for raw in lines:
                yield log_line(redact.text(raw.decode(errors="replace")))
            if len(partial) > MAX_LINE:
                yield log_line(redact.text(partial[:MAX_LINE].decode(errors="replace"))) + " [line cut]"
                partial = b""
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


def _open_log(path: Path) -> BinaryIO | None:
    try:
        with statedir.open_dir(path.parent) as d:
            return os.fdopen(d.open(path.name), "rb")
    except FileNotFoundError:
        return None
