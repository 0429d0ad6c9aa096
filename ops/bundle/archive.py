"""Packing entries: redaction, the per-output size cap (keeping the tail), sha256, the atomic .tar.gz.

The archive is written to a hidden temp name beside the target, fsynced, and renamed at the end;
any failure (a full disk included) unlinks the temp file, so no partial bundle is ever left behind.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tarfile
import tempfile
import time
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.bundle.entries import Entry
from gpuwarden.ops.foundation.redact import redact_bytes

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def pack(entry: Entry, max_bytes: int) -> None:
    """Redact, cap and hash one entry in place (dirs and links carry no data)."""
    if entry.path is None or entry.data is None or entry.kind in ("dir", "link"):
        return
    data = entry.data
    original = len(data)
    if len(data) > 2 * max_bytes:
        data = data[-2 * max_bytes:]  # bound the redaction work; the cap below cuts further
    if entry.redact:
        data, counts = redact_bytes(data, environ=entry.environ, cmdline=entry.cmdline)
        entry.redactions = dict(counts)
    if len(data) > max_bytes:
        data = data[-max_bytes:]
    if len(data) < original and (original > max_bytes):
        entry.truncated = True
        entry.original_bytes = original
    entry.data = data
    entry.sha256 = hashlib.sha256(data).hexdigest()


def _info(name: str, size: int, mtime: float, kind: bytes = tarfile.REGTYPE, mode: int = 0o600) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.type, ti.mode = size, int(mtime), kind, mode
    ti.uname = ti.gname = "root" if os.geteuid() == 0 else ""
    return ti


def write(final: Path, top: str, entries: list[Entry], extra: list[tuple[str, bytes]]) -> int:
    """Write the archive atomically; return its size. `extra` files (manifest) go last."""
    directory = final.parent
    now = time.time()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=directory)
    except OSError as exc:
        raise _error(exc, directory) from None
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
                seen: set[str] = set()
                for e in entries:
                    if e.path is None or e.path in seen:
                        continue
                    seen.add(e.path)
                    name = f"{top}/{e.path}"
                    if e.kind == "dir":
                        tar.addfile(_info(name, 0, now, tarfile.DIRTYPE, 0o700))
                    elif e.kind == "link":
                        ti = _info(name, 0, now, tarfile.SYMTYPE, 0o777)
                        ti.linkname = e.link or ""
                        tar.addfile(ti)
                    else:
                        tar.addfile(_info(name, len(e.data or b""), now), io.BytesIO(e.data or b""))
                for path, data in extra:
                    tar.addfile(_info(f"{top}/{path}", len(data), now), io.BytesIO(data))
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _error(exc, directory) from None
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return final.stat().st_size


def _error(exc: OSError, directory: Path) -> GpuwardenError:
    if exc.errno in _FULL:
        return GpuwardenError(
            f"no space left in {directory} while writing the bundle ({exc.strerror}); nothing was left behind",
            "free some space there, or pass --output on another filesystem")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return GpuwardenError(f"cannot write the bundle in {directory}: {exc.strerror}",
                              "pass --output with a directory you can write")
    return GpuwardenError(f"writing the bundle in {directory} failed: {exc.strerror or exc}",
                          "check the target filesystem, or pass --output elsewhere")
