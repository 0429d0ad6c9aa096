"""Cost of one gpuwarden snapshot over NVML against `nvidia-smi --query-gpu=index,memory.used` run as a
subprocess and nvitop's take_snapshots(), medians of warm runs in one process, as ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib import machine, median_ms  # noqa: E402

from gpuwarden.ops.node.backends.nvml import NvmlBackend  # noqa: E402
from gpuwarden.ops.foundation.settings import Settings  # noqa: E402
from gpuwarden.ops.sampling.sampler import Sampler, take_snapshot  # noqa: E402

# Needs an NVIDIA GPU; tests/device/status_nvml.sh runs it.
# python3 tests/bench/bench_snapshot_nvml.py [--runs 30] [--out results.json]
TARGET_VS_SMI = 100.0
TARGET_VS_NVITOP = 20.0


def nvml_call_costs(backend: NvmlBackend, runs: int) -> dict[str, float]:
    """Median microseconds of each NVML call a refresh makes, on the first GPU."""
    nv = backend._nv
    handle = next(iter(backend._handles.values()))
    calls = {
        "nvmlDeviceGetMemoryInfo(v2)": lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2),
        "nvmlDeviceGetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetTemperature": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetComputeRunningProcesses": lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle),
        "nvmlDeviceGetGraphicsRunningProcesses": lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(handle),
    }
    out = {}
    for name, fn in calls.items():
        try:
            out[name] = round(median_ms(fn, runs) * 1e3, 1)
        except Exception as exc:  # an unsupported query on this GPU: say so, keep measuring the rest
            out[name] = f"failed: {exc}"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    settings = Settings(state_dir=Path(tempfile.mkdtemp(prefix="gw-bench-nvml-")), backend="nvml")
    backend = NvmlBackend(settings)
    sampler = Sampler(settings, backend, deep_every_s=1e9)
    snap = sampler.snapshot(deep=True)
    results: dict[str, object] = {
        "machine": {**machine(), "gpus": [g.name for g in snap.gpus], "gpu_processes": len(snap.processes)},
        "runs": args.runs,
    }
    timings = {
        "gpuwarden refresh (Sampler.snapshot, warm)": median_ms(lambda: sampler.snapshot(deep=False), args.runs),
        "gpuwarden backend only (gpus + process_usage)":
            median_ms(lambda: (backend.gpus(), backend.process_usage()), args.runs),
        "gpuwarden take_snapshot (deep /proc fd scan)":
            median_ms(lambda: take_snapshot(settings, backend, deep=True), max(5, args.runs // 3)),
        "gpuwarden take_snapshot cold (opens NVML)":
            median_ms(lambda: take_snapshot(settings), 5, warmup=1),
    }
    smi_cmd = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv"]
    timings["nvidia-smi --query-gpu subprocess"] = median_ms(
        lambda: subprocess.run(smi_cmd, check=True, capture_output=True), args.runs)
    try:
        from nvitop import take_snapshots
        timings["nvitop take_snapshots()"] = median_ms(take_snapshots, args.runs)
    except ImportError as exc:
        results["nvitop"] = f"not installed: {exc}"
    results["median_ms"] = {k: round(v, 3) for k, v in timings.items()}
    results["nvml_call_us"] = nvml_call_costs(backend, args.runs * 10)

    ours = timings["gpuwarden refresh (Sampler.snapshot, warm)"]
    full = timings["gpuwarden take_snapshot (deep /proc fd scan)"]
    ratios = {"nvidia-smi / gpuwarden refresh": timings["nvidia-smi --query-gpu subprocess"] / ours,
              "nvidia-smi / gpuwarden deep snapshot": timings["nvidia-smi --query-gpu subprocess"] / full}
    if "nvitop take_snapshots()" in timings:
        ratios["nvitop / gpuwarden refresh"] = timings["nvitop take_snapshots()"] / ours
        ratios["nvitop / gpuwarden deep snapshot"] = timings["nvitop take_snapshots()"] / full
    results["ratios"] = {k: round(v, 1) for k, v in ratios.items()}
    sampler.close()

    m = results["machine"]
    print(f"machine: {m['nproc']} cores, {m['cpu']}; {len(m['gpus'])} GPU(s) {m['gpus'][:1]}; "
          f"{m['gpu_processes']} GPU process(es); median of {args.runs} warm runs")
    for name, ms in timings.items():
        print(f"  {name:<48} {ms:9.3f} ms")
    for name, ratio in ratios.items():
        target = TARGET_VS_SMI if name.startswith("nvidia-smi") else TARGET_VS_NVITOP
        verdict = "meets" if ratio >= target else "MISSES"
        print(f"  {name:<48} {ratio:8.1f}x  ({verdict} the {target:.0f}x target)")
    print("  NVML call cost on the first GPU (us): " + ", ".join(
        f"{k.removeprefix('nvmlDevice')}={v}" for k, v in results["nvml_call_us"].items()))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
