"""The arena file's on-disk format: one header (magic, version, sizes, per-chunk xxh3 hashes), then the payload.

Reads and checks headers, builds new ones; every way a file can be wrong is an ArenaError of a named kind.

FORMAT (version 1; all integers little-endian)

    offset  size  field
    0       8     magic        b"GWARENA\\0"
    8       4     version      u32, 1; a reader refuses a version newer than it knows
    12      4     header_size  u32, bytes before the payload: a multiple of 4096 so the payload
                                    (the part engines register) starts page-aligned
    16      8     payload_size u64, bytes of payload
    24      8     chunk_size   u64, bytes per hashed chunk, a multiple of 4096 (default 16 MiB)
    32      8     chunk_count  u64, ceil(payload_size / chunk_size); the last chunk may be short
    40      4     hash_algo    u32, 1 = xxh3_64 (seed 0)
    44      4     flags        u32, 0 (reserved)
    48      8     created_ns   u64, creation time, nanoseconds since the Unix epoch
    56      64    host         creating host's name, UTF-8, NUL-padded
    120     8     header_hash  u64, xxh3_64 of bytes [0, 128 + 8 * chunk_count) with this field zeroed
    128     8*n   chunk hashes u64 each: xxh3_64 of payload bytes [i*chunk_size, min((i+1)*chunk_size, payload_size))
    ...           zero padding up to header_size
    header_size   payload

The file is exactly header_size + payload_size bytes: shorter is "truncated", longer is "size-mismatch".
A writer fills the payload first and writes the header last, into a temporary name it renames into place,
so a reader never meets a header that vouches for an unwritten payload.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
import struct
import time
from pathlib import Path

import xxhash

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.inputs import kind_of
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.units import size_arg

MAGIC = b"GWARENA\0"
VERSION = 1
HASH_XXH3_64 = 1
PAGE = 4096
FIXED = 128
DEFAULT_CHUNK = 16 << 20
# Beyond this many chunks the header alone gets silly (8 bytes each); ask for bigger chunks instead.
MAX_CHUNKS = 1 << 24
# A chunk is hashed as a stream, so its size costs no memory; past 1 TiB it can only be a typo (and the
# header's u64 field has a limit all the same). Larger than the arena is fine: create() shrinks it to fit.
MAX_CHUNK_SIZE = 1 << 40

_FIXED = struct.Struct("<8sIIQQQII Q64sQ")
assert _FIXED.size == FIXED
_HASH_FIELD = slice(120, 128)

# Header states, also ArenaInfo.header_state; integrity problems exit 1, environment problems 2.
STATES = ("ok", "missing", "truncated", "bad-magic", "newer-version", "bad-header", "size-mismatch",
          "hash-mismatch", "changed", "no-space", "no-permission", "unreadable")
# "changed": written, resized or replaced while being verified (a verify that proves nothing).
_INTEGRITY = {"truncated", "bad-magic", "newer-version", "bad-header", "size-mismatch", "hash-mismatch", "changed"}


class ArenaError(GpuwardenError):
    """An arena file that cannot be used; `kind` is one of STATES."""

    def __init__(self, kind: str, message: str, hint: str | None = None, **detail: object):
        super().__init__(message, hint)
        self.kind = kind
        self.detail = detail
        self.exit_code = 1 if kind in _INTEGRITY else 2


@record
class Header:
    version: int
    header_size: int
    payload_size: int
    chunk_size: int
    chunk_count: int
    hash_algo: int
    flags: int
    created_ns: int
    host: str
    header_hash: int
    chunk_hashes: tuple[int, ...]

    @property
    def file_size(self) -> int:
        return self.header_size + self.payload_size

    def chunk_range(self, index: int) -> tuple[int, int]:
        """(payload offset, length) of chunk `index`."""
        start = index * self.chunk_size
        return start, min(self.chunk_size, self.payload_size - start)

    def summary(self) -> dict[str, object]:
        return {
            "version": self.version, "header_size": self.header_size, "payload_size": self.payload_size,
            "file_size": self.file_size, "chunk_size": self.chunk_size, "chunk_count": self.chunk_count,
            "hash": "xxh3_64" if self.hash_algo == HASH_XXH3_64 else f"unknown({self.hash_algo})",
            "created": self.created_ns / 1e9, "host": self.host, "header_hash": f"{self.header_hash:016x}",
        }


def chunk_count_for(payload_size: int, chunk_size: int) -> int:
    return (payload_size + chunk_size - 1) // chunk_size


def header_size_for(chunk_count: int) -> int:
    raw = FIXED + 8 * chunk_count
    return (raw + PAGE - 1) // PAGE * PAGE


def check_chunk_size(chunk_size: int, payload_size: int) -> None:
    if chunk_size > MAX_CHUNK_SIZE:
        raise GpuwardenError(f"chunk size {chunk_size} bytes is larger than the {MAX_CHUNK_SIZE >> 40} TiB "
                             "an arena chunk may be", "the default is 16MiB; e.g. --chunk-size 64MiB")
    if chunk_size <= 0 or chunk_size % PAGE:
        raise GpuwardenError(f"chunk size {chunk_size} is not a positive multiple of {PAGE}",
                             "pick e.g. 16MiB (the default) or 64MiB")
    if chunk_count_for(payload_size, chunk_size) > MAX_CHUNKS:
        raise GpuwardenError(f"{payload_size} bytes in chunks of {chunk_size} makes more than {MAX_CHUNKS} chunks",
                             "raise --chunk-size")


def fit_chunk(chunk_size: int, payload_size: int) -> int:
    """The chunk size an arena of `payload_size` gets: at most the payload rounded up to a page (one chunk
    either way, and the header then names a size the payload can have)."""
    return min(chunk_size, -(-payload_size // PAGE) * PAGE)


def build(payload_size: int, chunk_size: int, chunk_hashes: list[int], created_ns: int | None = None,
          host: str | None = None) -> bytes:
    """The complete header (padded to header_size) for a payload whose chunk hashes are known."""
    count = chunk_count_for(payload_size, chunk_size)
    if len(chunk_hashes) != count:
        raise ValueError(f"{len(chunk_hashes)} hashes for {count} chunks")
    hsize = header_size_for(count)
    name = (host if host is not None else os.uname().nodename).encode()[:64]  # socket.gethostname(), unimported
    fixed = _FIXED.pack(MAGIC, VERSION, hsize, payload_size, chunk_size, count, HASH_XXH3_64, 0,
                        created_ns if created_ns is not None else time.time_ns(), name, 0)
    body = bytearray(fixed + struct.pack(f"<{count}Q", *chunk_hashes))
    body[_HASH_FIELD] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(body)))
    return bytes(body) + bytes(hsize - len(body))


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        got = os.pread(fd, size - len(out), offset + len(out))
        if not got:
            break
        out += got
    return bytes(out)


def _quoted(path: str | Path) -> str:
    return shlex.quote(str(path))


def recreate_hint(path: str | Path, payload: int | None = None) -> str:
    """The command that makes the arena again: pasteable when its payload size is known."""
    where = _quoted(path)
    if not payload:  # a header too damaged to say: the operator must supply the size, so no paste-ready command
        return f"recreate it: gpuwarden arena create {where} --force --size and the size the weights need"
    return f"recreate it with `gpuwarden arena create {where} --force --size {size_arg(payload)}`"


def read_header(fd: int, path: str | Path, file_size: int | None = None) -> Header:
    """Parse and check the header of an open arena file; raise ArenaError naming what is wrong."""
    if file_size is None:
        file_size = os.fstat(fd).st_size
    try:
        fixed = _pread_exact(fd, FIXED, 0)
    except OSError as exc:  # e.g. /proc/self/mem: a "regular" file whose reads fail (EIO)
        raise ArenaError("unreadable", f"reading arena {path} failed: {os.strerror(exc.errno or errno.EIO)}",
                         "an arena is a file on tmpfs or a regular file system; check the path") from None
    if len(fixed) < 8 or fixed[:8] != MAGIC:
        if len(fixed) < 8 and MAGIC.startswith(fixed):
            raise ArenaError("truncated", f"{path} is truncated: {file_size} bytes, shorter than an arena header",
                             recreate_hint(path))
        raise ArenaError("bad-magic", f"{path} is not a gpuwarden arena (bad magic {fixed[:8]!r})",
                         "check the path; create one with `gpuwarden arena create`")
    if len(fixed) < FIXED:
        raise ArenaError("truncated", f"{path} is truncated inside its header ({file_size} bytes)",
                         recreate_hint(path))
    (_, version, hsize, payload, chunk, count, algo, flags, created, host, hhash) = _FIXED.unpack(fixed)
    if version > VERSION:
        raise ArenaError("newer-version",
                         f"{path} has arena format version {version}; this gpuwarden reads up to {VERSION}",
                         "upgrade gpuwarden on this node, or recreate the arena with this version")
    if (version < 1 or algo != HASH_XXH3_64 or chunk <= 0 or chunk % PAGE or hsize % PAGE
            or count != chunk_count_for(payload, chunk) or count > MAX_CHUNKS or hsize < FIXED + 8 * count):
        raise ArenaError("bad-header", f"{path} has an inconsistent header (version {version}, chunk size {chunk}, "
                         f"{count} chunks, header size {hsize})", recreate_hint(path))
    if file_size < FIXED + 8 * count:  # say so before allocating a table the file cannot hold
        raise ArenaError("truncated", f"{path} is truncated inside its chunk table ({file_size} bytes)",
                         recreate_hint(path, payload))
    table = _pread_exact(fd, 8 * count, FIXED)
    if len(table) < 8 * count:
        raise ArenaError("truncated", f"{path} is truncated inside its chunk table ({file_size} bytes)",
                         recreate_hint(path, payload))
    check = bytearray(fixed + table)
    check[_HASH_FIELD] = bytes(8)
    if xxhash.xxh3_64_intdigest(bytes(check)) != hhash:
        raise ArenaError("bad-header", f"{path}: the header's own hash does not match (header corrupted)",
                         recreate_hint(path))
    header = Header(version, hsize, payload, chunk, count, algo, flags, created,
                    printable(host.rstrip(b"\0").decode(errors="replace")), hhash, struct.unpack(f"<{count}Q", table))
    if file_size < header.file_size:
        raise ArenaError("truncated", f"{path} is truncated: {file_size} bytes, the header says {header.file_size}",
                         recreate_hint(path, header.payload_size) + "; was it copied while still being written?",
                         expected=header.file_size, actual=file_size)
    if file_size > header.file_size:
        raise ArenaError("size-mismatch", f"{path} is {file_size} bytes, the header says {header.file_size}",
                         "something appended to it; " + recreate_hint(path, header.payload_size),
                         expected=header.file_size, actual=file_size)
    return header


def read_raw_header(fd: int, header: Header) -> bytes:
    """The header's bytes as they are on disk now (fixed part and chunk table), to compare with a later read."""
    return _pread_exact(fd, FIXED + 8 * header.chunk_count, 0)


def open_arena(path: str | Path, write: bool = False) -> int:
    """Open an arena file, turning the usual OS failures into one-line ArenaErrors."""
    try:
        # O_NONBLOCK: a FIFO at the arena's path must be refused, not wait forever for a writer.
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # O_RDONLY opens a directory; its first read fails
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ArenaError("unreadable", f"arena {path} is {kind_of(mode)}, not a regular file",
                             "an arena is a file on tmpfs or a regular file system; check the path")
        os.set_blocking(fd, True)
        return fd
    except FileNotFoundError:
        raise ArenaError("missing", f"arena {path} does not exist",
                         f"create it: gpuwarden arena create {_quoted(path)} --size and the size the "
                         "weights need (e.g. 32GiB), or --from the weights file") from None
    except PermissionError:
        raise ArenaError("no-permission", f"no permission to {'write' if write else 'read'} arena {path}",
                         "run as the arena's owner or root, or fix its mode") from None
    except IsADirectoryError:
        raise ArenaError("unreadable", f"arena {path} is a directory", "pass the arena file itself") from None
    except OSError as exc:
        raise ArenaError("unreadable", f"cannot open arena {path}: {os.strerror(exc.errno or errno.EIO)}") from None


def has_magic(path: str | Path) -> bool:
    """True when `path` is a regular file that starts like an arena (a cheap test, no header check)."""
    try:
        fd = open_arena(path)
    except ArenaError:
        return False
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def load_header(path: str | Path) -> Header:
    """Open, check and close: the cheap check (header and size, no payload hashing)."""
    fd = open_arena(path)
    try:
        return read_header(fd, path)
    finally:
        os.close(fd)


def header_state(path: str | Path) -> tuple[str, Header | None]:
    """("ok", header) or (kind of problem, None); never raises for a bad file."""
    try:
        return "ok", load_header(path)
    except ArenaError as exc:
        return exc.kind, None
