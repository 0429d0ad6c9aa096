"""Whether a GPU's own busy figure is its one process's: nvmlDeviceGetUtilizationRates' gpu/memory % against the
newest nvmlDeviceGetProcessUtilization sample's sm/mem % of the GPU's only process, once a second.
Run beside tests/device/gpu_busy.py (one process on GPU 0): python3 tests/device/sole_process_util.py [SECONDS=15]
"""

from __future__ import annotations

import sys
import time

import pynvml as nv


def main(seconds: int) -> None:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h) + nv.nvmlDeviceGetGraphicsRunningProcesses(h)
    print(f"GPU 0 processes: {[p.pid for p in procs]} (the comparison means something only for one)")
    last = int(time.time() * 1e6) - 1_000_000
    rows = []
    for _ in range(seconds):
        time.sleep(1)
        rates = nv.nvmlDeviceGetUtilizationRates(h)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, last)
        except nv.NVMLError as exc:
            print(f"device {rates.gpu:3d}/{rates.memory:3d}  process: {exc}")
            continue
        newest = max(samples, key=lambda s: s.timeStamp)
        last = newest.timeStamp
        rows.append((rates.gpu, newest.smUtil, rates.memory, newest.memUtil))
        print(f"device gpu {rates.gpu:3d}% mem {rates.memory:3d}%   process {newest.pid} sm {newest.smUtil:3d}% "
              f"mem {newest.memUtil:3d}%   ({len(samples)} samples)")
    if rows:
        gap = sum(abs(a - b) for a, b, _, _ in rows) / len(rows)
        print(f"mean |device gpu% - process sm%| over {len(rows)} s: {gap:.1f} points; device mean "
              f"{sum(r[0] for r in rows) / len(rows):.1f}%, process mean {sum(r[1] for r in rows) / len(rows):.1f}%")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
