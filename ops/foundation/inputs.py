"""One safe way to open what gpuwarden reads from outside its state dir: configs, arenas, bundles, logs.

Anything but a regular file is refused in one line (a FIFO would hang the open, /dev/zero never ends),
the open itself never blocks, and every read is bounded; `-` may be a terminal or a pipe.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.units import fmt_bytes


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | Path, what: str, hint: str | None = None) -> int:
    """A blocking read-only fd on the regular file `path`; anything else is one GpuwardenError.

    `what` names the file for the operator ("node config", "bundle", "arena"); `hint` says what to do
    when it does not exist."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise NotFound(f"{what} {path} does not exist", hint) from None
    except PermissionError:
        raise GpuwardenError(f"no permission to read the {what} {path}",
                             "run as a user that can read it, or fix its mode") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise GpuwardenError(f"{what} {path} is not a regular file", f"give the {what} file itself") from None
        raise GpuwardenError(f"cannot open the {what} {path}: {exc.strerror or exc}", "check the path") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise GpuwardenError(f"{what} {path} is {kind_of(mode)}, not a regular file",
                                 f"give the {what} file itself")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int, what: str, path: str | Path) -> bytes:
    """Everything up to EOF from `fd`, refusing more than `limit` bytes."""
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        except OSError as exc:
            raise GpuwardenError(f"reading the {what} {path} failed: {exc.strerror or exc}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise GpuwardenError(f"the {what} {path} is larger than {fmt_bytes(limit)}, more than a {what} can be",
                                 f"is it the {what} at all? give the right file")


def read_regular(path: str | Path, what: str, limit: int, hint: str | None = None) -> bytes:
    """The whole regular file `path` (at most `limit` bytes), or one GpuwardenError."""
    fd = open_regular(path, what, hint)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise GpuwardenError(f"the {what} {path} is {fmt_bytes(size)}, larger than a {what} can be "
                                 f"({fmt_bytes(limit)})", f"is it the {what} at all? give the right file")
        return read_fd(fd, limit, what, path)
    finally:
        os.close(fd)


def read_stdin(what: str, limit: int) -> bytes:
    """Standard input, when it is a terminal, a pipe or a regular file (not a device such as /dev/zero)."""
    fd = sys.stdin.fileno()
    mode = os.fstat(fd).st_mode
    if not (os.isatty(fd) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)):
        raise GpuwardenError(f"standard input is {kind_of(mode)}; the {what} must come from a pipe or a file",
                             f"e.g. `dmesg | gpuwarden ... -`, or give the {what} file")
    return read_fd(fd, limit, what, "on standard input")


def tail_regular(path: str | Path, limit: int, what: str) -> tuple[bytes, int] | None:
    """(the last `limit` bytes, the file size) of a regular file; None when it does not exist."""
    try:
        fd = open_regular(path, what)
    except NotFound:
        return None
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)), size
    finally:
        os.close(fd)
