"""`gpuwarden <argv>` on the stand-in NVML node bench_idle_cpu.py measures: one H100 (a real nvidia-smi -q capture)
with one real process; BUSY=1 moves its load every refresh; the per-process utilisation call burns DEAR_MS of the
calling thread's CPU first, as the real driver's does (1.5 ms on an H100, tests/device/nvml_call_cost.py).

The gpuwarden it runs is whichever PYTHONPATH names first (the bench points it at this tree or a peer's)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TESTS)]

from standins import pynvml_standin as standin  # noqa: E402
from standins.nvsmi_capture import parse_q  # noqa: E402

CAPTURE = TESTS / "fixtures" / "nvidia" / "nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"


def build(busy: bool, dear_s: float, pid: int):
    gpus = parse_q(CAPTURE)
    g = gpus[0]
    g.processes[:] = g.processes[:1]
    g.processes[0].pid = pid
    util = {0: [(pid, 0, 50, 10, 0, 0)]}
    mod = standin.build(gpus, utilisation=util)
    rates0, power0, util0 = (mod.nvmlDeviceGetUtilizationRates, mod.nvmlDeviceGetPowerUsage,
                             mod.nvmlDeviceGetProcessUtilization)

    def rates(handle):
        mod.calls.clear()  # the stand-in's call log would grow for ever
        r = rates0(handle)
        if busy:
            r.gpu, r.memory = random.randint(40, 60), random.randint(5, 15)
            util[0][:] = [(pid, int(time.time() * 1e6), r.gpu, r.memory, 0, 0)]
        return r

    def power(handle):
        return power0(handle) + (random.randint(0, 50000) if busy else 0)

    def dear(handle, timestamp):
        until = time.thread_time() + dear_s
        while time.thread_time() < until:
            pass
        return util0(handle, timestamp)
    dear.__name__ = "nvmlDeviceGetProcessUtilization"
    mod.nvmlDeviceGetUtilizationRates, mod.nvmlDeviceGetPowerUsage = rates, power
    mod.nvmlDeviceGetProcessUtilization = dear
    return mod


def main() -> None:
    sleeper = subprocess.Popen(["sleep", "100000"])
    try:
        sys.modules["pynvml"] = build(os.environ.get("BUSY") == "1", float(os.environ.get("DEAR_MS", "1.5")) / 1e3,
                                      sleeper.pid)
        from gpuwarden.tui.main import main as gpuwarden
        sys.argv = ["gpuwarden", *sys.argv[1:]]
        gpuwarden()
    finally:
        sleeper.kill()
        sleeper.wait()


if __name__ == "__main__":
    main()
