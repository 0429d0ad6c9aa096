"""Verify an arena: check the header, then hash every payload chunk on every core and name the first bad one.

Two readers: "pread" (copies each chunk into a per-thread buffer; a file truncated under us gives a short
read, not SIGBUS) and "mmap" (hashes the page cache in place); tests/bench/bench_verify.py compares them.
"""

from __future__ import annotations

import mmap
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import xxhash

from gpuwarden.ops.units import fmt_bytes

from . import format as fmt
from .parallel import ChunkPool, Progress, Stopwatch, fmt_rate

METHODS = ("pread", "mmap")
READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class Verified:
    path: str
    header: fmt.Header
    seconds: float
    workers: int
    method: str

    def to_dict(self) -> dict:
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
        header = fmt.read_header(fd, path)
        if expect_size is not None and expect_size != header.payload_size:
            raise fmt.ArenaError("size-mismatch",
                                 f"{path} holds {header.payload_size} payload bytes ({fmt_bytes(header.payload_size)}), "
                                 f"expected {expect_size} ({fmt_bytes(expect_size)})",
                                 "recreate the arena at the configured size, or fix the configured size",
                                 expected=expect_size, actual=header.payload_size)
        clock = Stopwatch()
        pool = ChunkPool(header.chunk_count, workers)
        bad: list[int] = []
        if method == "pread":
            job = _pread_job(fd, header, pool, bad)
            pool.run(job, header.payload_size, progress)
        else:
            bad = _mapped_in_child(fd, path, header, pool, progress)
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


def _pread_job(fd: int, header: fmt.Header, pool: ChunkPool, bad: list[int]):
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


def _mmap_job(view: memoryview, header: fmt.Header, pool: ChunkPool, bad: list[int]):
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
