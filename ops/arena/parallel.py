"""Run one job per arena chunk on a pool of threads, with progress and an early stop.

Threads suffice: os.pread/os.pwrite and xxhash's xxh3 release the GIL, so chunks hash on every core.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from gpuwarden.ops.foundation.errors import GpuwardenError

Progress = Callable[[int, int], object]  # (bytes done, bytes total); what it returns is ignored


# Measured on a 32-core H200 host: 16 hashing threads read 58 GB/s, 32 only 33 GB/s. Past about 16 the
# memory bus is the limit and more threads only fight over it (tests/bench/RESULTS.md, "Arena verify").
MAX_DEFAULT_WORKERS = 16


# More threads than this cannot help (see above) and each costs a stack and a buffer: refused, not clamped,
# since a number this large is a typo.
MAX_WORKERS = 1024


def check_workers(workers: int | None) -> None:
    """Refuse a --workers that is not a thread count (0, negative, absurd); None means the default."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise GpuwardenError(f"--workers must be a whole number from 1 to {MAX_WORKERS}, got {workers}",
                             "leave it out for one per core (at most 16), or e.g. --workers 4")


def default_workers() -> int:
    """One worker per usable core, at most MAX_DEFAULT_WORKERS; `--workers` overrides."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


class ChunkPool:
    """Hands chunk indexes to workers in order; `stop_after(i)` makes later chunks skip."""

    def __init__(self, count: int, workers: int | None = None):
        self.count = count
        self.workers = max(1, min(workers or default_workers(), count or 1))
        self._next = 0
        self._limit = count
        self._lock = threading.Lock()
        self.done_bytes = 0
        self.error: BaseException | None = None

    def take(self) -> int | None:
        with self._lock:
            if self.error is not None or self._next >= self._limit:
                return None
            i = self._next
            self._next += 1
            return i

    def stop_after(self, index: int) -> None:
        """Chunks after `index` need not run (an earlier failure already decides the answer)."""
        with self._lock:
            self._limit = min(self._limit, index + 1)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done_bytes += nbytes

    def run(self, job: Callable[[int, int], int], total: int, progress: Progress | None = None,
            tick_s: float = 0.2) -> None:
        """Call job(worker, index) -> bytes for each chunk; re-raise the first exception a job raised."""

        def worker(w: int) -> None:
            try:
                while (i := self.take()) is not None:
                    self.add(job(w, i))
            except BaseException as exc:  # handed to the caller's thread below
                with self._lock:
                    if self.error is None:
                        self.error = exc

        threads = [threading.Thread(target=worker, args=(w,), daemon=True, name=f"arena-{w}")
                   for w in range(self.workers)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(tick_s)
                    if progress is not None:
                        progress(self.done_bytes, total)
        except BaseException as exc:  # Ctrl-C: let workers finish their chunk, then give up
            with self._lock:
                self.error = self.error or exc
            for t in threads:
                t.join()
            raise
        if progress is not None:
            progress(self.done_bytes, total)
        if self.error is not None:
            raise self.error


def fmt_rate(nbytes: int, seconds: float) -> float:
    """GB/s (decimal, the way bandwidth is quoted)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0
