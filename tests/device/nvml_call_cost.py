"""What each NVML call of a refresh costs in CPU (user + kernel) on this node: where the agent's and the console's
sampling time goes, and which calls a slower cadence would save most on. Reads only; touches no GPU setting.

Usage (on the GPU machine, after setup.sh): python3 tests/device/nvml_call_cost.py [REPEATS]
Run it beside tests/device/gpu_busy.py as well: a process on the GPU changes what the process calls cost.
"""

from __future__ import annotations

import sys
import time

import pynvml as nv


def cost(fn, *args, repeats: int) -> tuple[float, float, str]:
    """(CPU us per call, wall us per call, what it answered or raised) over `repeats` calls."""
    try:
        answer = repr(fn(*args))[:40]
    except nv.NVMLError as exc:
        answer = f"NVMLError {exc}"
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(repeats):
        try:
            fn(*args)
        except nv.NVMLError:
            pass
    return ((time.thread_time() - c0) / repeats * 1e6, (time.perf_counter() - w0) / repeats * 1e6, answer)


def main(repeats: int) -> None:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    sm, mem = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM
    volatile = nv.NVML_VOLATILE_ECC
    calls = [
        ("every refresh", "nvmlDeviceGetMemoryInfo", (h,)),
        ("every refresh", "nvmlDeviceGetUtilizationRates", (h,)),
        ("every refresh", "nvmlDeviceGetPowerUsage", (h,)),
        ("every refresh", "nvmlDeviceGetTemperature", (h, nv.NVML_TEMPERATURE_GPU)),
        ("every refresh", "nvmlDeviceGetClockInfo", (h, sm)),
        ("every refresh", "nvmlDeviceGetClockInfo", (h, mem)),
        ("every refresh", "nvmlDeviceGetCurrentClocksEventReasons", (h,)),
        ("every refresh", "nvmlDeviceGetComputeRunningProcesses", (h,)),
        ("every refresh", "nvmlDeviceGetGraphicsRunningProcesses", (h,)),
        ("while shown", "nvmlDeviceGetProcessUtilization", (h, 0)),
        ("every 10th", "nvmlDeviceGetEnforcedPowerLimit", (h,)),
        ("every 10th", "nvmlDeviceGetTotalEccErrors", (h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile)),
        ("every 10th", "nvmlDeviceGetTotalEccErrors", (h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile)),
        ("every 10th", "nvmlDeviceGetRemappedRows", (h,)),
        ("every 10th", "nvmlDeviceGetCurrPcieLinkGeneration", (h,)),
        ("every 10th", "nvmlDeviceGetCurrPcieLinkWidth", (h,)),
    ]
    print(f"NVML driver {nv.nvmlSystemGetDriverVersion()}, GPU 0 {nv.nvmlDeviceGetName(h)}, {repeats} calls each")
    print(f"{'cadence':14s} {'call':42s} {'cpu us':>8s} {'wall us':>8s}  answer")
    per_refresh = 0.0
    for cadence, name, args in calls:
        fn = getattr(nv, name, None)
        if fn is None:
            print(f"{cadence:14s} {name:42s} {'-':>8s} {'-':>8s}  not in this nvidia-ml-py")
            continue
        cpu, wall, answer = cost(fn, *args, repeats=repeats)
        per_refresh += cpu if cadence == "every refresh" else cpu / 10 if cadence == "every 10th" else 0.0
        print(f"{cadence:14s} {name:42s} {cpu:8.1f} {wall:8.1f}  {answer}")
    # nvmlDeviceGetProcessUtilization as a sampler calls it: since its last answer's newest sample, not since 0.
    fn = nv.nvmlDeviceGetProcessUtilization
    try:
        last = max((int(s.timeStamp) for s in fn(h, 0)), default=0)
    except nv.NVMLError:
        last = int(time.time() * 1e6) - 1_000_000
    for label, since in (("since 1 s ago", int(time.time() * 1e6) - 1_000_000), ("since its newest sample", last)):
        cpu, wall, answer = cost(fn, h, since, repeats=max(20, repeats // 10))
        print(f"{'while shown':14s} {'nvmlDeviceGetProcessUtilization ' + label:42s} {cpu:8.1f} {wall:8.1f}  {answer}")
    print(f"one GPU's NVML calls per refresh (every-refresh calls + a tenth of the others): {per_refresh:.0f} us of CPU")
    single_calls(h, repeats)
    nv.nvmlShutdown()


def single_calls(h, repeats: int) -> None:
    """The sized calls made once into a kept buffer (pynvml's wrappers make two: one to size, one to fill), and
    the newer per-process utilisation call: what a sampler that keeps its buffers would pay."""
    import ctypes
    get = getattr(nv, "_nvmlGetFunctionPointer", None)
    if get is None:
        print("single calls: this nvidia-ml-py has no _nvmlGetFunctionPointer")
        return
    util = get("nvmlDeviceGetProcessUtilization")
    samples = (nv.c_nvmlProcessUtilizationSample_t * 64)()
    count = ctypes.c_uint(64)

    def util_once() -> int:
        count.value = 64
        return util(h, samples, ctypes.byref(count), ctypes.c_ulonglong(0))
    procs = get("nvmlDeviceGetComputeRunningProcesses_v3")
    infos = (nv.c_nvmlProcessInfo_v3_t * 64)()
    n = ctypes.c_uint(64)

    def procs_once() -> int:
        n.value = 64
        return procs(h, ctypes.byref(n), infos)
    rows = [("nvmlDeviceGetProcessUtilization, one call", util_once),
            ("nvmlDeviceGetComputeRunningProcesses_v3, one call", procs_once)]
    newer = getattr(nv, "nvmlDeviceGetProcessesUtilizationInfo", None)
    if newer is not None:
        rows.append(("nvmlDeviceGetProcessesUtilizationInfo (pynvml)", lambda: newer(h, 0)))
    fields = getattr(nv, "nvmlDeviceGetFieldValues", None)
    ids = [getattr(nv, name, None) for name in ("NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_MEMORY_TEMP",
                                           "NVML_FI_DEV_PCIE_LINK_GEN_CURRENT", "NVML_FI_DEV_PCIE_LINK_WIDTH_CURRENT")]
    ids = [i for i in ids if i is not None]
    if fields is not None and ids:
        rows.append((f"nvmlDeviceGetFieldValues, {len(ids)} fields", lambda: fields(h, ids)))
    for label, fn in rows:
        cpu, wall, answer = cost(fn, repeats=max(20, repeats // 5))
        print(f"{'single':14s} {label:50s} {cpu:8.1f} {wall:8.1f}  {answer}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
