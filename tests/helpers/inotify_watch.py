"""Records every open of the files under a tree, through Linux inotify (IN_OPEN), for the tests that prove a
file is never opened. ctypes over libc: inotify_init1, inotify_add_watch, read of struct inotify_event.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_OPEN = 0x00000020
IN_ACCESS = 0x00000001
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class OpenWatch:
    def __init__(self, root: Path):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.dirs: dict[int, Path] = {}
        for d in [root] + [p for p in sorted(root.rglob("*")) if p.is_dir()]:
            wd = self.libc.inotify_add_watch(self.fd, str(d).encode(), IN_OPEN | IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
            self.dirs[wd] = d
        self.opened: list[Path] = []

    def drain(self) -> list[Path]:
        """Every file opened or read since the last drain (relative events resolved to paths)."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            off = 0
            while off < len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, off)
                name = data[off + _EVENT.size: off + _EVENT.size + size].split(b"\0", 1)[0].decode()
                off += _EVENT.size + size
                if name and wd in self.dirs:
                    self.opened.append(self.dirs[wd] / name)
        return list(self.opened)

    def close(self) -> None:
        os.close(self.fd)
