"""Reads an allowed debugfs file: root only, no symlinks, regular files only, at most max_bytes, within timeout_s.

A hung amdgpu blocks debugfs reads in the kernel (gem_info takes the DRM file-list lock, vram_mm the VRAM
manager's): each read runs in a daemon thread and is abandoned at its deadline, reported as "timeout" with the
file named. Everything that can go wrong is a ReadResult status, never an exception: absent files (no debugfs
mounted, an older kernel, another driver) are normal.
"""

from __future__ import annotations

import _thread  # not threading: `status` reads debugfs and must not pay threading's import
import os
import stat
import time
from pathlib import Path

from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.node.debugfs.allowlist import relative_path

DEFAULT_ROOT = Path("/sys/kernel/debug")
MAX_BYTES = 4 << 20  # gem_info of a busy node lists every BO of every client: keep the cap generous but finite
TIMEOUT_S = 1.0
OK, ABSENT, NOT_ROOT, REFUSED, TIMEOUT, TOO_BIG, ERROR = ("ok", "absent", "not-root", "refused", "timeout",
                                                          "too-big", "error")


@record
class ReadResult:
    name: str
    path: str  # as named on the node
    status: str
    data: bytes | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def why(self) -> str:
        """One phrase for a status line: why this source was not used."""
        return {ABSENT: f"{self.path} is not there (debugfs not mounted, or this kernel lacks it)",
                NOT_ROOT: f"{self.path} needs root", TIMEOUT: f"{self.path} did not answer in time (hung driver?)",
                TOO_BIG: f"{self.path} was larger than the read cap", REFUSED: f"{self.path}: {self.error}",
                }.get(self.status, f"{self.path}: {self.error or self.status}")


class DebugfsReader:
    """The one way gpuwarden reads debugfs. `root` is a parameter so tests and the sim node point it at a tree."""

    def __init__(self, root: Path | str = DEFAULT_ROOT, *, max_bytes: int = MAX_BYTES, timeout_s: float = TIMEOUT_S,
                 require_root: bool = True) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.require_root = require_root
        self._known: dict[tuple[str, int | None], tuple[str, str]] = {}

    def read(self, name: str, minor: int | None = None) -> ReadResult:
        rel = relative_path(name, minor)  # a name off the list never reaches the filesystem
        shown = str(self.root / rel)
        if self.require_root and os.geteuid() != 0:
            return ReadResult(name, shown, NOT_ROOT)
        box: dict[str, ReadResult] = {}
        done = _thread.allocate_lock()
        done.acquire()

        def work() -> None:
            try:
                box["r"] = self._read(name, rel, shown)
            except BaseException as exc:  # noqa: BLE001 - a worker must always release its waiter
                box["r"] = ReadResult(name, shown, ERROR, error=f"{type(exc).__name__}: {exc}")
            finally:
                done.release()
        t0 = time.monotonic()
        _thread.start_new_thread(work, ())  # left behind at the deadline: it holds nothing but its fd
        if not done.acquire(timeout=self.timeout_s):
            return ReadResult(name, shown, TIMEOUT, seconds=time.monotonic() - t0,
                              error=f"no answer within {self.timeout_s:g}s")
        r = box["r"]
        return ReadResult(r.name, r.path, r.status, r.data, r.error, time.monotonic() - t0)

    def read_inline(self, name: str, minor: int | None = None) -> ReadResult:
        """read() in the calling thread, with the same checks: for a caller that already reads under a deadline
        (ops/node/debugfs/books.py reads a refresh's files in one lane job), never for one that cannot wait."""
        rel, shown = self._paths(name, minor)
        if self.require_root and os.geteuid() != 0:
            return ReadResult(name, shown, NOT_ROOT)
        t0 = time.monotonic()
        try:
            r = self._read(name, rel, shown)
        except Exception as exc:  # noqa: BLE001 - as read(): every failure is a status
            r = ReadResult(name, shown, ERROR, error=f"{type(exc).__name__}: {exc}")
        return ReadResult(r.name, r.path, r.status, r.data, r.error, time.monotonic() - t0)

    def path_of(self, name: str, minor: int | None = None) -> str:
        """The allowed file's path as the node names it (ValueError off the list)."""
        return self._paths(name, minor)[1]

    def _paths(self, name: str, minor: int | None) -> tuple[str, str]:
        """(path under the root, path as shown) of an allowed file, worked out once per file."""
        key = (name, minor)
        paths = self._known.get(key)
        if paths is None:
            rel = relative_path(name, minor)  # a name off the list never reaches the filesystem
            paths = self._known[key] = (rel, str(self.root / rel))
        return paths

    def _read(self, name: str, rel: str, shown: str) -> ReadResult:
        # Walk the components without following links: a symlink inside the tree could point at a trigger file.
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return ReadResult(name, shown, ABSENT)
        except OSError as exc:
            return ReadResult(name, shown, ERROR, error=exc.strerror)
        try:
            parts = rel.split("/")
            for part in parts[:-1]:
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except FileNotFoundError:
                    return ReadResult(name, shown, ABSENT)
                except OSError as exc:
                    return ReadResult(name, shown, REFUSED if exc.errno in (40, 20) else ERROR,
                                      error=f"{part}: {exc.strerror}")
                os.close(fd)
                fd = nxt
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return ReadResult(name, shown, ABSENT)
            if not stat.S_ISREG(st.st_mode):
                return ReadResult(name, shown, REFUSED, error="not a regular file (a link, FIFO or device)")
            try:
                ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                              dir_fd=fd)
            except FileNotFoundError:
                return ReadResult(name, shown, ABSENT)
            except PermissionError:
                return ReadResult(name, shown, NOT_ROOT)
            except OSError as exc:
                return ReadResult(name, shown, ERROR, error=exc.strerror)
            try:
                if not stat.S_ISREG(os.fstat(ffd).st_mode):  # swapped between the stat and the open
                    return ReadResult(name, shown, REFUSED, error="not a regular file")
                chunks, got = [], 0
                while got <= self.max_bytes:  # debugfs files report size 0: read until EOF or the cap
                    chunk = os.read(ffd, min(1 << 16, self.max_bytes + 1 - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                if got > self.max_bytes:
                    return ReadResult(name, shown, TOO_BIG, error=f"over {self.max_bytes} bytes")
                return ReadResult(name, shown, OK, b"".join(chunks))
            except OSError as exc:
                return ReadResult(name, shown, ERROR, error=exc.strerror)
            finally:
                os.close(ffd)
        finally:
            os.close(fd)
