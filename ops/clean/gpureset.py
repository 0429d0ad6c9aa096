"""The vendor ways to reset one GPU, chosen per node, each run through an injectable runner.

AMD: amdsmi_reset_gpu through the amdsmi library, else `amd-smi reset --gpureset`, else `rocm-smi --gpureset`;
NVIDIA: `nvidia-smi -r`; sim: the simulated driver. Callers verify the GPU afterwards; this only acts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.errors import BackendUnavailable, GpuwardenError
from gpuwarden.ops.foundation.model import GpuInfo
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.backends.libload import import_vendor
from gpuwarden.ops.node.sim.node import SimNode

# A hung GPU can keep a vendor tool waiting for minutes; a reset that long has failed anyway.
RESET_TIMEOUT_S = 180.0
QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str


Runner = Callable[[list[str], float], Ran]
Which = Callable[[str], "str | None"]


def run_command(argv: list[str], timeout_s: float) -> Ran:
    """The real runner: argv without a shell, output captured, a timeout that names the command."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GpuwardenError(f"`{' '.join(argv)}` did not finish in {timeout_s:g}s",
                             "the GPU may be hung: collect a bundle (gpuwarden bundle) and consider a reboot") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot run {argv[0]}: {exc.strerror}") from None
    return Ran(proc.returncode, (proc.stdout or "") + (proc.stderr or ""))


def load_amdsmi() -> Any:
    """The amdsmi module, or BackendUnavailable in one line when it or libamd_smi.so is missing."""
    return import_vendor("amdsmi", "amdsmi", "libamd_smi.so not found", "install amd-smi-lib from ROCm")


@dataclass(frozen=True)
class ResetPath:
    method: str  # "amdsmi", "amd-smi", "rocm-smi", "nvidia-smi", "sim"
    gpu: int
    what: str  # the exact call or command, for the plan and the journal
    argv: tuple[str, ...] = ()
    bus_id: str | None = None


def _short_bdf(bus: str) -> str:
    """Bus id without the PCI domain, lower case: tools print it with or without "0000:"."""
    bus = bus.strip().lower()
    return bus[5:] if bus.count(":") == 2 else bus


def choose(gpu: GpuInfo, *, which: Which = shutil.which,
           amdsmi_loader: Callable[[], Any] = load_amdsmi) -> ResetPath:
    """Which way this node resets `gpu`. Raises GpuwardenError naming what is missing."""
    if gpu.vendor == "sim":
        return ResetPath("sim", gpu.index, f"simulated driver reset of GPU {gpu.index}")
    if gpu.vendor == "nvidia":
        if not which("nvidia-smi"):
            raise GpuwardenError("cannot reset an NVIDIA GPU: nvidia-smi is not on PATH",
                                 "install the NVIDIA driver utilities")
        argv: tuple[str, ...] = ("nvidia-smi", "-r", "-i", str(gpu.index))
        return ResetPath("nvidia-smi", gpu.index, " ".join(argv), argv, gpu.bus_id)
    if gpu.vendor != "amd":
        raise GpuwardenError(f"GPU {gpu.index}: no reset path for vendor {gpu.vendor!r}")
    if not gpu.bus_id:
        # Each AMD tool numbers GPUs its own way; without the bus id the wrong GPU could be reset.
        raise GpuwardenError(f"GPU {gpu.index}: its PCI bus id is unknown, so the GPU cannot be named safely "
                             "to the reset tool", "check /sys/class/drm/card*/device/uevent (PCI_SLOT_NAME)")
    try:
        amdsmi_loader()
        return ResetPath("amdsmi", gpu.index, f"amdsmi_reset_gpu(<handle of {gpu.bus_id}>)", (), gpu.bus_id)
    except BackendUnavailable:
        pass
    if which("amd-smi"):
        argv = ("amd-smi", "reset", "--gpureset", "-g", gpu.bus_id)
        return ResetPath("amd-smi", gpu.index, " ".join(argv), argv, gpu.bus_id)
    if which("rocm-smi"):
        return ResetPath("rocm-smi", gpu.index,
                         f"rocm-smi --gpureset -d <rocm-smi index of {gpu.bus_id}>", (), gpu.bus_id)
    raise GpuwardenError(f"cannot reset AMD GPU {gpu.index}: neither the amdsmi library nor amd-smi nor rocm-smi "
                         "is available", "install ROCm's amd-smi (amd-smi-lib)")


def rocm_smi_index(bus_id: str, runner: Runner) -> int:
    """rocm-smi's own index of the GPU at `bus_id`, read from `rocm-smi --showbus --json`."""
    ran = runner(["rocm-smi", "--showbus", "--json"], QUERY_TIMEOUT_S)
    try:
        data = json.loads(ran.output[ran.output.find("{"):]) if "{" in ran.output else {}
    except json.JSONDecodeError:
        data = {}
    for card, fields in data.items():
        if not (card.startswith("card") and card[4:].isdigit() and isinstance(fields, dict)):
            continue
        bus = next((v for k, v in fields.items() if k.lower().startswith("pci bus")), None)
        if isinstance(bus, str) and _short_bdf(bus) == _short_bdf(bus_id):
            return int(card[4:])
    raise GpuwardenError(f"rocm-smi does not list a GPU at {bus_id}, so it cannot be named to rocm-smi",
                         "run `rocm-smi --showbus` to compare, or install amd-smi")


def perform(settings: Settings, path: ResetPath, *, runner: Runner = run_command,
            amdsmi_loader: Callable[[], Any] = load_amdsmi) -> str:
    """Reset the GPU the way `path` says; journal the exact call. Returns a one-line account."""
    done = _perform(settings, path, runner, amdsmi_loader)
    journal.write(settings.state_dir, "gpu-reset", "ok", gpu=path.gpu, method=path.method, call=done)
    return done


def _perform(settings: Settings, path: ResetPath, runner: Runner, amdsmi_loader: Callable[[], Any]) -> str:
    try:
        if path.method == "sim":
            SimNode(settings.state_dir).reset(path.gpu)
            return path.what
        if path.method == "amdsmi":
            return _amdsmi_reset(amdsmi_loader(), path.bus_id or "")
        argv = list(path.argv)
        if path.method == "rocm-smi":
            argv = ["rocm-smi", "--gpureset", "-d", str(rocm_smi_index(path.bus_id or "", runner))]
        ran = runner(argv, RESET_TIMEOUT_S)
        text = ran.output.strip()
        # amd-smi reports a failed reset in its output and still exits 0.
        if ran.returncode != 0 or "failed to reset" in text.lower() or "requires elevation" in text.lower():
            last = text.splitlines()[-1] if text else f"exit status {ran.returncode}"
            raise GpuwardenError(f"`{' '.join(argv)}` failed: {last[:200]}",
                                 "reset needs root and no process on the GPU; see dmesg for the driver's view")
        return " ".join(argv)
    except GpuwardenError as exc:
        journal.write(settings.state_dir, "gpu-reset", "failed", gpu=path.gpu, method=path.method, error=str(exc))
        raise


def _amdsmi_reset(m: Any, bus_id: str) -> str:
    errors = (getattr(m, "AmdSmiException", RuntimeError),)
    call = f"amdsmi_reset_gpu(amdsmi_get_processor_handle_from_bdf({bus_id!r}))"
    try:
        m.amdsmi_init(m.AmdSmiInitFlags.INIT_AMD_GPUS)
    except errors as exc:
        raise GpuwardenError(f"amdsmi could not start: {exc}", "check the amdgpu driver is loaded") from None
    try:
        handle = m.amdsmi_get_processor_handle_from_bdf(bus_id)
        m.amdsmi_reset_gpu(handle)
    except errors as exc:
        code = getattr(exc, "err_code", None)
        wrapper = getattr(m, "amdsmi_wrapper", None)
        no_perm = wrapper is not None and code == getattr(wrapper, "AMDSMI_STATUS_NO_PERM", object())
        raise GpuwardenError(f"{call} failed: {exc}",
                             "run as root" if no_perm else "see dmesg for the driver's view of the reset") from None
    finally:
        try:
            m.amdsmi_shut_down()
        except errors:
            pass
    return call
