"""Map an arena MAP_SHARED the way engines do, and hand out the payload's address and size for registration.

libc mmap through ctypes gives a plain address to register and an explicit munmap; Python's mmap object
would pin itself against close() while any buffer export lives.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

from gpuwarden.ops.arena import format as fmt

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_MAP_FAILED = ctypes.c_void_p(-1).value


class MappedArena:
    """An open, header-checked, MAP_SHARED arena; close() unmaps."""

    def __init__(self, path: str | Path, writable: bool = True):
        self.path = str(path)
        self.fd = -1
        self.base = 0
        try:
            self.fd = fmt.open_arena(path, write=True) if writable else fmt.open_arena(path)
            self.writable = writable
        except fmt.ArenaError as exc:
            if not writable or exc.kind != "no-permission":
                raise
            # Read-only arenas still map and register (pinning takes pages, not write access).
            self.fd = fmt.open_arena(path)
            self.writable = False
        try:
            self.header = fmt.read_header(self.fd, path)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            addr = _libc.mmap(None, self.header.file_size, prot, mmap.MAP_SHARED, self.fd, 0)
            if addr in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise fmt.ArenaError("unreadable", f"cannot map arena {path}: {os.strerror(err or errno.EIO)}",
                                     "check free address space and the file's filesystem")
            self.base = addr
        except BaseException:
            self.close()
            raise

    @property
    def payload_address(self) -> int:
        return self.base + self.header.header_size

    @property
    def payload_size(self) -> int:
        return self.header.payload_size

    def close(self) -> None:
        if self.base:
            _libc.munmap(ctypes.c_void_p(self.base), self.header.file_size)
            self.base = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "MappedArena":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
