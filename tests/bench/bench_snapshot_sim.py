"""Cost of one full gpuwarden snapshot on a simulated node of 8 GPUs with 2,000 processes.

Peer in the same run: psutil.process_iter over the same processes (what a typical Python
monitor does per refresh). Run: .venv/bin/python tests/bench/bench_snapshot_sim.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402

from ops.backends.sysfs import SysfsBackend  # noqa: E402
from ops.settings import Settings  # noqa: E402
from ops.sim.node import SimNode  # noqa: E402
from ops.snapshot import Sampler  # noqa: E402

N_PROCS = 2000
N_GPUS = 8


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    state = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    settings = Settings(state_dir=state)
    node = SimNode(state)
    node.init(gpus=N_GPUS, vram=192 << 30)
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(N_PROCS)]
    try:
        pids = [p.pid for p in procs]
        print(f"machine: {os.cpu_count()} cores; {len(psutil.pids())} processes on the host")
        peer = median_ms(lambda: [p.info for p in psutil.process_iter(["pid", "status", "memory_info"])], 10)
        rows = []
        for label, holders in (("32 GPU processes", pids[:32]), ("2,000 GPU processes", pids)):
            for i, pid in enumerate(holders):
                node.allocate(pid, i % N_GPUS, 64 << 20)
            backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
            sampler = Sampler(settings, backend, deep_every_s=1e9)
            deep = median_ms(lambda: sampler.snapshot(deep=True), 3)
            snap = sampler.snapshot(deep=False)
            assert len(snap.gpus) == N_GPUS and len(snap.processes) >= len(holders)
            warm = median_ms(lambda: sampler.snapshot(deep=False), 30)
            sync = median_ms(node.sync, 5)
            rows.append((label, warm, deep, sync))
        print(f"peer: psutil.process_iter(pid,status,memory_info) over the host: {peer:.2f} ms")
        print(f"{'case':<22} {'snapshot':>10} {'vs peer':>8} {'deep scan':>10} {'sim driver sync':>16}")
        for label, warm, deep, sync in rows:
            print(f"{label:<22} {warm:>8.2f}ms {peer / warm:>7.1f}x {deep:>8.1f}ms {sync:>14.1f}ms")
        print("target: snapshot < 10 ms for 8 GPUs with 2,000 processes")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
