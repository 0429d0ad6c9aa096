"""Create an arena file: fill the payload (a test pattern or a copy of a file) on every core, then the header.

Writes under a temporary name next to the target and renames at the end, so a failure (ENOSPC on a
full tmpfs, Ctrl-C) leaves nothing half-written behind. Interrupts are held while the temporary file comes
into being (so one cannot land before the code that removes it) and from just before the rename on: once
the arena is in place, the command finishes and says so; the signal that came meanwhile is reported.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xxhash

from gpuwarden.ops.foundation import inputs, interrupts
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena.parallel import ChunkPool, Progress, Stopwatch, check_workers, fmt_rate

# What the copy buffers of all workers together may take: the memory a create costs does not grow with
# --chunk-size or --workers (the pattern needs no per-worker buffer at all, one shared block, see _pattern_job).
BUFFER_BUDGET = 64 << 20
COPY_BLOCK = 1 << 20
MIN_COPY_BLOCK = 64 << 10
PATTERN_BLOCK = 8 << 20


MODE = 0o640  # owner writes, its group reads and maps, others nothing (less by the umask)


@dataclass(frozen=True)
class Created:
    path: str
    header: fmt.Header
    seconds: float
    workers: int
    interrupted: int | None = None  # a signal that came after the arena was complete (it was held, not acted on)

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, **self.header.summary(), "seconds": round(self.seconds, 3),
                "gbps": round(fmt_rate(self.header.payload_size, self.seconds), 3), "workers": self.workers}


def _no_space(path: Path, need: int) -> fmt.ArenaError:
    try:
        free = shutil.disk_usage(path.parent).free
        have = f"{fmt_bytes(free)} free"
    except OSError:
        have = "free space unknown"
    return fmt.ArenaError("no-space", f"no space left for a {fmt_bytes(need)} arena in {path.parent} ({have}); "
                          "nothing was left behind",
                          "free space there, pick a larger filesystem, or for tmpfs raise its size "
                          "(mount -o remount,size=... /dev/shm)", need=need)


def _os_error(exc: OSError, path: Path, need: int) -> fmt.ArenaError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return _no_space(path, need)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return fmt.ArenaError("no-permission", f"no permission to create arena {path} "
                              f"({os.strerror(exc.errno)})", "run as a user that may write that directory, or pick another path")
    return fmt.ArenaError("unreadable", f"cannot write arena {path}: {os.strerror(exc.errno or errno.EIO)}")


def create(path: str | Path, *, size: int | None = None, source: str | Path | None = None,
           chunk_size: int = fmt.DEFAULT_CHUNK, force: bool = False, workers: int | None = None,
           progress: Progress | None = None, held: interrupts.Held | None = None) -> Created:
    """Create the arena at `path` with `size` bytes of test pattern, or the bytes of `source`.

    `held`: the caller's, still holding interrupts when this returns (it reports the arena, then releases);
    without one they are released here and a signal that came after the rename is in Created.interrupted."""
    hold = held if held is not None else interrupts.Held()
    path = Path(path)
    if (size is None) == (source is None):
        raise GpuwardenError("give exactly one of --size and --from", "e.g. --size 32GiB")
    check_workers(workers)
    src_fd = None
    if source is not None:
        src_fd = _open_source(Path(source))
        size = os.fstat(src_fd).st_size
    assert size is not None
    try:
        if size <= 0:
            raise GpuwardenError(f"arena size must be positive, got {size}", "e.g. --size 1GiB")
        fmt.check_chunk_size(chunk_size, size)
        chunk_size = fmt.fit_chunk(chunk_size, size)  # a chunk past the end would only be a longer header field
        if path.is_dir():  # before "exists": --force cannot replace a directory, so it must not be suggested
            raise GpuwardenError(f"{path} is a directory",
                                 f"name the arena file, e.g. {path / 'weights.arena'}")
        if path.exists() and not force:
            raise GpuwardenError(f"{path} already exists", "pass --force to replace it (engines mapping it keep the old pages)")
        count = fmt.chunk_count_for(size, chunk_size)
        hsize = fmt.header_size_for(count)
        _sweep_partials(path)
        tmp = path.parent / f".{path.name}.partial-{os.getpid()}"
        hold.hold()  # until the try below, which removes the file: an interrupt in between would leave it
        try:
            # 0640: the weights are readable by the engines of the creator's group (they map it read-only when
            # they may not write: mapping.MappedArena), not by every local user; chgrp shares it with another.
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, MODE)
        except FileNotFoundError:
            hold.release()
            if path.parent.is_dir():  # e.g. /proc: the directory is there, files cannot be made in it
                raise GpuwardenError(f"cannot create files in {path.parent}",
                                     "pick a directory on a regular file system or tmpfs, e.g. /dev/shm") from None
            raise GpuwardenError(f"directory {path.parent} does not exist", "create it first, or pick another path") from None
        except OSError as exc:
            hold.release()
            raise _os_error(exc, path, hsize + size) from None
        try:
            hold.raise_pending()  # a Ctrl-C while the file was made: acted on now, where the file is removed
            clock = Stopwatch()
            try:
                # Reserve every block first: a full tmpfs fails here at once, not after minutes of writing.
                os.posix_fallocate(fd, 0, hsize + size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            pool = ChunkPool(count, workers)
            hashes = [0] * count
            if src_fd is None:
                job = _pattern_job(fd, hsize, size, chunk_size, hashes, pool.workers)
            else:
                job = _copy_job(src_fd, fd, hsize, size, chunk_size, hashes, pool.workers)
            pool.run(job, size, progress)
            header = fmt.build(size, chunk_size, hashes)
            _pwrite_all(fd, header, 0)
            os.fsync(fd)
            hold.hold()  # from here the arena completes: an interrupt now is reported, not acted on
            os.replace(tmp, path)
        except OSError as exc:
            hold.release()
            _discard(tmp)
            raise _os_error(exc, path, hsize + size) from None
        except BaseException:
            hold.release()
            _discard(tmp)
            raise
        finally:
            os.close(fd)
        try:
            made = Created(str(path), fmt.load_header(path), clock.seconds, pool.workers)
        finally:
            if held is None:
                hold.release()
        return dataclasses.replace(made, interrupted=hold.pending) if held is None else made
    finally:
        if src_fd is not None:
            os.close(src_fd)


def _open_source(source: Path) -> int:
    return inputs.open_regular(source, "source file", "pass the weights file to copy with --from")


def _sweep_partials(path: Path) -> None:
    """Remove partial files of earlier creates that were killed outright (SIGKILL, power loss)."""
    try:
        leftovers = list(path.parent.glob(f".{path.name}.partial-*"))
    except OSError:
        return
    for tmp in leftovers:
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _discard(tmp)


def _discard(tmp: Path) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _pattern_job(fd: int, hsize: int, size: int, chunk: int, hashes: list[int],
                 workers: int) -> Callable[[int, int], int]:
    # One random block per arena, repeated; each chunk's first 16 bytes carry its index and the nonce,
    # so every chunk hashes differently and a chunk copied to the wrong place is caught. Byte k of a chunk
    # (k >= 16) is seed[k % len(seed)]: written and hashed (as a stream) straight from the one read-only
    # seed, so memory stays 8 MiB whatever the chunk size and the worker count (issue 39, item 2: a
    # chunk-sized template and buffer per worker made a 1 MiB arena with 4 GiB chunks take 8.4 GB).
    period = 1 << 20
    # The seed repeated: pieces of up to PATTERN_BLOCK bytes per write (1 MiB writes were ~20% slower), one
    # read-only copy shared by every worker.
    seed = memoryview(os.urandom(period) * (PATTERN_BLOCK // period))
    nonce = os.urandom(8)

    def job(w: int, i: int) -> int:
        start = i * chunk
        n = min(chunk, size - start)
        h = xxhash.xxh3_64()
        head = (struct.pack("<Q", i) + nonce)[:n]
        h.update(head)
        _pwrite_all(fd, head, hsize + start)
        done = len(head)
        while done < n:
            at = done % period  # the block starts at a period boundary: seed[at:] is the chunk's byte `done` on
            piece = seed[at:at + min(len(seed) - at, n - done)]
            h.update(piece)
            _pwrite_all(fd, piece, hsize + start + done)
            done += len(piece)
        hashes[i] = h.intdigest()
        return n
    return job


def _copy_job(src: int, fd: int, hsize: int, size: int, chunk: int, hashes: list[int],
              workers: int) -> Callable[[int, int], int]:
    # Cache-sized blocks, hashed as a stream (see verify._pread_job for why); all of them within the budget.
    block = max(MIN_COPY_BLOCK, min(COPY_BLOCK, BUFFER_BUDGET // max(1, workers)))
    buffers = [bytearray(block) for _ in range(workers)]

    def job(w: int, i: int) -> int:
        start = i * chunk
        n = min(chunk, size - start)
        view = memoryview(buffers[w])
        h = xxhash.xxh3_64()
        done = 0
        while done < n:
            got = os.preadv(src, [view[:min(block, n - done)]], start + done)
            if got == 0:
                raise GpuwardenError("the source file shrank while it was being copied", "copy it when nothing writes it")
            h.update(view[:got])
            _pwrite_all(fd, view[:got], hsize + start + done)
            done += got
        hashes[i] = h.intdigest()
        return n
    return job
