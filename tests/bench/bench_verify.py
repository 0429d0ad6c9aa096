"""Arena verify throughput on every core, against single-threaded `xxhsum -H3` (XXH3-64) on the same file.

The file is several times larger than the CPU caches and sits in the page cache (tmpfs by default), so
both sides read memory, not disk. Peer fallback when xxhsum is missing: b3sum --num-threads 1, else
Python's xxh3 in one thread (the output says which). Run: python tests/bench/bench_verify.py [--size 4GiB]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import xxhash  # noqa: E402
from benchlib import cpu_model  # noqa: E402

from gpuwarden.ops.arena.create import create  # noqa: E402
from gpuwarden.ops.arena.parallel import default_workers  # noqa: E402
from gpuwarden.ops.arena.verify import verify  # noqa: E402
from gpuwarden.ops.foundation.units import parse_size  # noqa: E402


def best_of(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def peer(path: Path):
    if shutil.which("xxhsum"):
        return "xxhsum -H3 (XXH3-64, 1 thread)", lambda: subprocess.run(["xxhsum", "-H3", str(path)], check=True,
                                                                        capture_output=True)
    if shutil.which("b3sum"):
        return "b3sum --num-threads 1", lambda: subprocess.run(["b3sum", "--num-threads", "1", str(path)],
                                                               check=True, capture_output=True)

    def py_single():
        h = xxhash.xxh3_64()
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
    return "python xxh3_64, 1 thread (no xxhsum/b3sum here)", py_single


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="4GiB", help="arena payload size (default 4GiB)")
    ap.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir())
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = parse_size(args.size)
    path = Path(args.dir) / f"gw-bench-verify-{os.getpid()}.arena"
    try:
        t = time.perf_counter()
        create(path, size=size)
        created = time.perf_counter() - t
        name, peer_fn = peer(path)
        peer_fn()  # warm: both sides then read the same cached pages
        cores = default_workers()
        before_load = f"{os.getloadavg()[0]:.2f}"
        print(f"machine: nproc {os.cpu_count()}, usable {cores}, CPU {cpu_model()}")
        print(f"file: {path} ({size / 2**30:.2f} GiB payload), created in {created:.1f}s")
        configs = [(m, w) for m in ("pread", "mmap") for w in sorted({1, max(1, cores // 2), cores})]
        # Interleaved rounds, best of each: a busy machine then slows every contender alike.
        times: dict[object, list[float]] = {"peer": [], **{c: [] for c in configs}}
        for _ in range(args.runs):
            times["peer"].append(best_of(peer_fn, 1))
            for m, w in configs:
                times[(m, w)].append(best_of(lambda w=w, m=m: verify(path, workers=w, method=m), 1))
        peer_gbps = size / min(times["peer"]) / 1e9
        print(f"load average before: {before_load}, after: {os.getloadavg()[0]:.2f}")
        print(f"peer  {name}: {peer_gbps:6.2f} GB/s ({min(times['peer']):.2f}s)")
        rows = []
        for m, w in configs:
            gbps = size / min(times[(m, w)]) / 1e9
            rows.append((m, w, gbps))
            print(f"verify {m:5} x{w:<3}: {gbps:6.2f} GB/s  ratio vs peer {gbps / peer_gbps:5.2f}  (ideal {w})")
        best = max(rows, key=lambda r: r[2])
        print(f"best: verify {best[0]} with {best[1]} threads = {best[2] / peer_gbps:.2f} x the single-thread peer "
              f"on {cores} usable cores")
        print(f"median of all verify rows: {statistics.median(r[2] for r in rows):.2f} GB/s")
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
