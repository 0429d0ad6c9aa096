"""The floor under any Python agent at 1 s: one thread asks NVML what an agent refresh asks of every GPU (memory,
utilisation, power, temperature, clocks, both process lists), once a second, and keeps, serves and computes nothing.

--lane: the calls run in a worker thread that the main thread hands them to and waits for under a deadline, as the
agent's lanes do (ops/foundation/deadline.py): what that hand-off adds to the floor. Measured beside the agent and
dmon by tests/device/agent_vs_peers.sh. Usage: python3 tests/device/nvml_floor.py [--lane]
"""

from __future__ import annotations

import _thread
import sys
import time

import pynvml as nv


def ask(handles: list) -> None:
    for h in handles:
        nv.nvmlDeviceGetMemoryInfo(h)
        nv.nvmlDeviceGetUtilizationRates(h)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
        nv.nvmlDeviceGetComputeRunningProcesses(h)
        nv.nvmlDeviceGetGraphicsRunningProcesses(h)


def main(lane: bool) -> None:
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    go, done = _thread.allocate_lock(), _thread.allocate_lock()
    go.acquire()
    done.acquire()

    def worker() -> None:
        while True:
            go.acquire()
            ask(handles)
            done.release()
    if lane:
        _thread.start_new_thread(worker, ())
    due = time.monotonic()
    while True:
        if lane:
            go.release()
            done.acquire(timeout=3.0)
        else:
            ask(handles)
        due += 1.0
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main("--lane" in sys.argv[1:])
