"""Append-only JSON-lines files that survive a kill -9 mid-write: a torn last line is cut off on open.

Used by the agent's event log and its 7-day trend; writers append whole lines with one write() each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator


def repair(path: Path) -> int:
    """Cut a torn last line (no newline at the end) off the file; return the bytes removed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)  # a planted link is refused, never followed
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        # Walk back to the last newline, 64 KiB at a time.
        end = size
        while end > 0:
            start = max(0, end - 65536)
            chunk = os.pread(fd, end - start, start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                os.ftruncate(fd, keep)
                return size - keep
            end = start
        os.ftruncate(fd, 0)
        return size
    finally:
        os.close(fd)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Each line that parses as a JSON object, oldest first; others are skipped."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW), "rb") as f:
            for raw in f:
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    yield obj
    except FileNotFoundError:
        return


class Appender:
    """One file opened O_APPEND; append(obj) writes one line with one write()."""

    def __init__(self, path: Path, mode: int = 0o640):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        repair(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)

    def append(self, obj: dict[str, Any]) -> int:
        """Write one whole line, or nothing: a write the disk cut short (ENOSPC) is taken back, so the lines
        after it, once there is room again, are not glued to a torn one."""
        line = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
        before = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, line)
        except OSError:
            self._take_back(before)
            raise
        if written != len(line):
            self._take_back(before)
            raise OSError(28, "No space left on device (short write)")
        return len(line)

    def _take_back(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            pass  # a read-only file system wrote nothing to take back

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
