"""Verify an arena: check the header, then hash every payload chunk on every core and name the first bad one.

Two readers: "pread" (copies each chunk into a per-thread buffer; a file truncated under us gives a short
read, not SIGBUS) and "mmap" (hashes the page cache in place); tests/bench/bench_verify.py compares them.
A file written while it is verified is no "ok": the file's identity, size, mtime and ctime are compared
before and after the pass, and the chunks hashed first (the longest exposed) are hashed again after it,
which also catches a write through a mapping on tmpfs (it changes no timestamp).
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xxhash

from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena.parallel import ChunkPool, Progress, Stopwatch, fmt_rate

METHODS = ("pread", "mmap")
READ_BLOCK = 1 << 20
RECHECK_BYTES = 64 << 20  # at least this much of the payload's start, and one chunk per worker, is hashed twice


@dataclass(frozen=True)
class Verified:
    path: str
    header: fmt.Header
    seconds: float
    workers: int
    method: str

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "ok": True, **self.header.summary(), "seconds": round(self.seconds, 3),
                "gbps": round(fmt_rate(self.header.payload_size, self.seconds), 3),
                "workers": self.workers, "method": self.method}


def verify(path: str | Path, *, expect_size: int | None = None, workers: int | None = None,
           method: str = "pread", progress: Progress | None = None) -> Verified:
    """Check header, size and every chunk hash; raise ArenaError (kind "hash-mismatch" names the chunk)."""
    if method not in METHODS:
        raise fmt.ArenaError("unreadable", f"unknown verify method {method!r}", f"choose one of {', '.join(METHODS)}")
    fd = fmt.open_arena(path)
    try:
        before = os.fstat(fd)
        header = fmt.read_header(fd, path, before.st_size)
        raw_header = fmt.read_raw_header(fd, header)
        if expect_size is not None and expect_size != header.payload_size:
            raise fmt.ArenaError("size-mismatch",
                                 f"{path} holds {header.payload_size} payload bytes ({fmt_bytes(header.payload_size)}), "
                                 f"expected {expect_size} ({fmt_bytes(expect_size)})",
                                 "recreate the arena at the configured size, or fix the configured size",
                                 expected=expect_size, actual=header.payload_size)
        clock = Stopwatch()
        pool = ChunkPool(header.chunk_count, workers)
        bad: list[int] = []
        try:
            if method == "pread":
                job = _pread_job(fd, header, pool, bad)
                pool.run(job, header.payload_size, progress)
            else:
                bad = _mapped_in_child(fd, path, header, pool, progress)
            if not bad:
                _unchanged(fd, path, header, raw_header, before, pool.workers)
        except OSError as exc:
            raise fmt.ArenaError("unreadable", f"reading arena {path} failed: {os.strerror(exc.errno or errno.EIO)}",
                                 "check the device under it (dmesg), or give the arena file itself") from None
        if bad:
            first = min(bad)
            start, length = header.chunk_range(first)
            raise fmt.ArenaError(
                "hash-mismatch",
                f"{path}: chunk {first} of {header.chunk_count} is corrupt (payload bytes {start}..{start + length - 1}, "
                f"file offset {header.header_size + start})",
                "the arena's content changed after creation; " + fmt.recreate_hint(path, header.payload_size),
                chunk=first, payload_offset=start, file_offset=header.header_size + start, length=length)
        return Verified(str(path), header, clock.seconds, pool.workers, method)
    finally:
        os.close(fd)


def _unchanged(fd: int, path: str | Path, header: fmt.Header, raw_header: bytes, before: os.stat_result,
               workers: int) -> None:
    """Raise ArenaError "changed" when the file was written, replaced or resized while it was being verified."""
    recheck = ChunkPool(min(header.chunk_count, max(workers, -(-RECHECK_BYTES // header.chunk_size))), workers)
    again: list[int] = []
    recheck.run(_pread_job(fd, header, recheck, again), header.payload_size)
    after = os.fstat(fd)
    what = []
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (before.st_size, before.st_mtime_ns, before.st_ctime_ns):
        what.append(_stat_change(before, after))
    if fmt.read_raw_header(fd, header) != raw_header:
        what.append("its header was rewritten")
    if again:
        start, _ = header.chunk_range(min(again))
        what.append(f"chunk {min(again)} (payload bytes from {start}) no longer matches the hash it had "
                    "when it was read")
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            what.append("the path now names another file (replaced by a rename)")
    except OSError:
        what.append("the path no longer exists")
    if what:
        raise fmt.ArenaError("changed", f"{path} changed while it was being verified: {'; '.join(what)}; "
                             "this pass proves nothing", "verify it again when nothing writes it (is an engine "
                             "or a copy still writing it? `gpuwarden arena inspect` lists its mappers)",
                             changes=what)


def _stat_change(before: os.stat_result, after: os.stat_result) -> str:
    if after.st_size != before.st_size:
        return f"its size went from {before.st_size} to {after.st_size} bytes"
    if after.st_mtime_ns != before.st_mtime_ns:
        return f"it was written (mtime moved {(after.st_mtime_ns - before.st_mtime_ns) / 1e9:+.3f} s)"
    return "its inode changed (ctime moved: written, or its mode or owner changed)"


def _mapped_in_child(fd: int, path: str | Path, header: fmt.Header, pool: ChunkPool,
                     progress: Progress | None) -> list[int]:
    """Hash the mapped file in a forked child: a file truncated under the mapping raises SIGBUS on the
    first vanished page, which no Python code can catch; the child dies of it and we say so in one line."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: hash, report progress and the bad chunks over the pipe, never return
        code = 0
        try:
            os.close(r)
            out = os.fdopen(w, "w", buffering=1)
            bad: list[int] = []
            try:
                mm = mmap.mmap(fd, header.file_size, mmap.MAP_SHARED, mmap.PROT_READ)
            except ValueError:  # "mmap length is greater than file size": it shrank since the header check
                out.write("shrank\n")
                os._exit(0)
            with mm:
                view = memoryview(mm)
                pool.run(_mmap_job(view, header, pool, bad), header.payload_size,
                         (lambda done, total: out.write(f"progress {done}\n")) if progress else None)
                view.release()
            out.write("bad " + " ".join(map(str, bad)) + "\n")
            out.flush()
        except BaseException:  # noqa: BLE001 - an interrupt or error: the parent reports it
            code = 3
        os._exit(code)
    os.close(w)
    bad_chunks: list[int] | None = None
    shrank = False
    try:
        with os.fdopen(r, "r") as lines:
            for line in lines:
                word, _, rest = line.partition(" ")
                if word == "progress" and progress:
                    progress(int(rest), header.payload_size)
                elif word == "bad":
                    bad_chunks = [int(x) for x in rest.split()]
                elif word.strip() == "shrank":
                    shrank = True
        _, status = os.waitpid(pid, 0)
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        raise
    if shrank or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS):
        raise fmt.ArenaError("truncated", f"{path} shrank while it was being verified (its mapped pages "
                             "vanished: SIGBUS)", "verify it again when nothing is writing or truncating it")
    if bad_chunks is None:
        raise fmt.ArenaError("unreadable", f"verifying {path} through mmap failed "
                             f"({'signal ' + str(os.WTERMSIG(status)) if os.WIFSIGNALED(status) else 'exit ' + str(os.waitstatus_to_exitcode(status))})",
                             "try --method pread")
    return bad_chunks


def _record_bad(pool: ChunkPool, bad: list[int], i: int) -> None:
    bad.append(i)
    pool.stop_after(i)


def _pread_job(fd: int, header: fmt.Header, pool: ChunkPool, bad: list[int]) -> Callable[[int, int], int]:
    # Read each chunk in cache-sized blocks and hash as a stream: a block copied by pread is still in
    # L2 when xxh3 reads it, where one whole-chunk buffer would go out to DRAM and back (2x slower).
    buffers = [bytearray(READ_BLOCK) for _ in range(pool.workers)]

    def job(w: int, i: int) -> int:
        start, length = header.chunk_range(i)
        view = memoryview(buffers[w])
        h = xxhash.xxh3_64()
        pos = header.header_size + start
        end = pos + length
        while pos < end:
            n = os.preadv(fd, [view[:min(READ_BLOCK, end - pos)]], pos)
            if n == 0:
                raise fmt.ArenaError("truncated", f"{pos} bytes into the arena the file ended: "
                                     "it was truncated while being verified", "recreate it")
            h.update(view[:n])
            pos += n
        if h.intdigest() != header.chunk_hashes[i]:
            _record_bad(pool, bad, i)
        return length
    return job


def _mmap_job(view: memoryview, header: fmt.Header, pool: ChunkPool, bad: list[int]) -> Callable[[int, int], int]:
    def job(w: int, i: int) -> int:
        start, length = header.chunk_range(i)
        off = header.header_size + start
        piece = view[off:off + length]
        try:
            if xxhash.xxh3_64_intdigest(piece) != header.chunk_hashes[i]:
                _record_bad(pool, bad, i)
        finally:
            piece.release()
        return length
    return job
