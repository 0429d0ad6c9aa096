"""The NVML backend: NVIDIA GPUs and their processes through nvidia-ml-py (`import pynvml`).

Handles and static facts are read once at open; each refresh costs a few NVML calls per GPU.
"""

from __future__ import annotations

import _thread
import functools
import time
from types import ModuleType

from gpuwarden.ops.foundation.deadline import LateRead
from gpuwarden.ops.foundation.errors import BackendUnavailable
from gpuwarden.ops.foundation.model import GpuInfo, ProcessUsage, stale_read
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.backends import libload
from gpuwarden.ops.node.backends.nvml_sensors import MEDIUM_EVERY, NvmlSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` tries this backend on every node
if TYPE_CHECKING:
    from typing import Any

_HINT = "install the NVIDIA driver (libnvidia-ml.so.1) or pick another source with --backend"

# nvmlDeviceGetProcessUtilization is the one dear call of a refresh: 1.4-2.3 ms of CPU a call on an H100, with a
# process on it or not, against 0.05 ms for every other call of the refresh together (driver 580.159.04,
# tests/device/nvml_call_cost.py; the filling costs it, sizing the array 1-2 us). It is asked only for GPUs with
# two or more processes (process_utilisation), and where a pass costs more than UTIL_DEAR_S, again only after its
# cost over UTIL_SHARE of a core (at most UTIL_MAX_EVERY_S): per-process GPU% is then that many seconds old, its
# newest sample in the window, as every call answers.
UTIL_DEAR_S = 0.0002
UTIL_SHARE = 0.0002
UTIL_MAX_EVERY_S = 5.0
# While nobody reads per-process GPU% (an agent with no client: see Sampler.quiet_process_gpu), a dear pass is asked
# this often instead: the first reader after a quiet spell sees a figure up to this old, the next ones fresh.
UTIL_QUIET_EVERY_S = 30.0

# Process memory that NVML would not tell us (not permitted, or hidden inside a MIG instance):
# the PID still uses the GPU, but its VRAM must not be read as 0 bytes by the residual arithmetic.
SOURCE_UNKNOWN = "nvml-unknown"


def bus_id(text: str | None) -> str | None:
    """NVML's "00000000:18:00.0" in the kernel's spelling, "0000:18:00.0" (lower-case hex)."""
    if not text:
        return None
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        return text.strip().lower()


class NvmlBackend(libload.LibraryBackend):
    """Backend over NVML. `module` replaces `import pynvml` (tests inject a replaying stand-in)."""

    name = "nvml"
    simulated = False

    def __init__(self, settings: Settings, module: ModuleType | Any = None):
        self._settings = settings
        self._deadlines(settings)
        nv = module if module is not None else libload.import_vendor(
            "pynvml", "nvml", "nvidia-ml-py cannot load", _HINT)
        self._nv = nv
        self._opening(self._open)

    def _open(self) -> None:
        """nvmlInit, the handles and the static facts: in a lane, since a wedged GPU can hang any of them."""
        nv = self._nv
        self._errors: tuple[type[BaseException], ...] = tuple(
            e for e in (getattr(nv, "NVMLError", None), getattr(nv, "NVMLLibraryMismatchError", None)) if e)
        self._unsupported = tuple(e for e in (getattr(nv, "NVMLError_NotSupported", None),) if e)
        try:
            nv.nvmlInit()
        except self._errors as exc:
            raise BackendUnavailable(f"nvml: {_init_failure(nv, exc)}", _HINT) from None
        self._shutdown = nv.nvmlShutdown
        try:
            count = nv.nvmlDeviceGetCount()
        except self._errors as exc:
            self.close()
            raise BackendUnavailable(f"nvml: cannot count GPUs ({exc})", _HINT) from None
        # NVML index -> handle. A GPU this user may not open (its /dev/nvidiaN denied) is left out
        # rather than failing the node; the others keep NVML's numbering, which nvidia-smi shows.
        self._handles: dict[int, Any] = {}
        refused = None
        for i in range(count):
            try:
                self._handles[i] = nv.nvmlDeviceGetHandleByIndex(i)
            except self._errors as exc:
                refused = exc
        if not self._handles:
            self.close()
            why = f": {count} found, none could be opened ({refused})" if count else " found"
            raise BackendUnavailable(f"nvml: no usable NVIDIA GPU{why}", _HINT)
        # The v2 struct keeps driver-reserved memory out of `used`, which is what nvidia-smi shows as
        # Used; v1's used is total - free and so includes the reserved part. Drivers before r510 lack v2.
        self._memory_version = getattr(nv, "nvmlMemory_v2", None)
        self._temperature_v = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        # The unversioned process listers call the _v3 symbols (drivers r510+); older drivers raise a
        # version mismatch there and answer only the _v2 ones. Newest first; a mismatch drops it for good.
        self._listers = [
            [f for f in (getattr(nv, newest, None), getattr(nv, older, None)) if f]
            for newest, older in (
                ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
                ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"))]
        self._mismatch = tuple(e for e in (getattr(nv, "NVMLLibraryMismatchError", None),
                                           getattr(nv, "NVMLError_FunctionNotFound", None)) if e)
        self._static = {i: self._static_info(i, h) for i, h in self._handles.items()}
        self._sensors = {i: NvmlSensors(nv, h, self._try) for i, h in self._handles.items()}
        self._util_seen: dict[int, int] = {}  # gpu -> the newest utilisation sample's timestamp (us)
        # A GPU whose lists hold one process: its GPU% is the GPU's own (see process_utilisation). gpu -> the
        # refresh's (sm, mem) %, and gpu -> (its one pid, (sm, mem, enc, dec) %).
        self._rates: dict[int, tuple[int, int]] = {}
        self._sole: dict[int, tuple[int, tuple[int, int, int, int]]] = {}
        # Asked every MEDIUM_EVERY refreshes (nvml_sensors): gpu -> its temperature; gpu -> (encoder, decoder) %.
        self._temperatures: dict[int, float | None] = {}
        self._coder_pct: dict[int, tuple[int, int]] = {}
        self._coders = (getattr(nv, "nvmlDeviceGetEncoderUtilization", None),
                        getattr(nv, "nvmlDeviceGetDecoderUtilization", None))
        self._util_last: dict[int, dict[int, tuple[int, int, int, int]]] | None = None
        self._process_keys: frozenset[tuple[int, int]] | None = None  # (gpu, pid) of the last process lists
        self._lister_lock = _thread.allocate_lock()
        self._refresh = 0  # gpus() calls so far
        # gpu -> (the gpus() call its lists came with, 0: the processes lane; their (pid, bytes) pairs; the
        # ProcessUsage list made of them): unchanged lists are the same objects again
        self._lists: dict[int, tuple[int, tuple[tuple[int, int | None], ...], list[ProcessUsage]]] = {}
        self._lists_used = 0  # the gpus() call whose lists process_usage() answered with
        self._util_for: frozenset[tuple[int, int]] | None = None  # ... when the dear call last answered
        self._util_next = 0.0  # monotonic time the dear call is due again
        self._util_asked = 0.0  # monotonic time it last answered
        self.util_every_s = 0.0  # how old per-process GPU% may be (0: asked every refresh)
        self.util_quiet = False  # nobody reads per-process GPU% now: a dear pass waits UTIL_QUIET_EVERY_S

    # ----------------------------------------------------------------- protocol

    def gpus(self) -> list[GpuInfo]:
        # Each GPU's lane job reads its process lists too, for the process_usage() that follows: one hand-off to
        # a lane thread a refresh instead of two (a cold hand-off costs ~0.1 ms of CPU, as much as the calls).
        self._refresh += 1
        read = functools.partial(self._gpu_and_processes, self._refresh)
        return self._gpus_in_lanes(list(self._handles.items()), read, self._stale_gpu)

    def _gpu_and_processes(self, refresh: int, index: int, handle: Any) -> GpuInfo:
        medium = refresh % MEDIUM_EVERY == 1  # the first refresh, then every MEDIUM_EVERY-th
        info = self._gpu(index, handle, medium)
        self._gpu_processes(index, handle, refresh, medium)
        return info

    def _stale_gpu(self, index: int, late: LateRead) -> GpuInfo:
        self._rates.pop(index, None)  # its figures are not this refresh's: no process is given them as its own
        self._sole.pop(index, None)
        self._temperatures.pop(index, None)
        self._coder_pct.pop(index, None)
        static = self._static[index]
        return GpuInfo(index=index, name=static["name"], vendor="nvidia", bus_id=static["bus_id"],
                       uuid=static["uuid"], device_files=static["device_files"], stale=stale_read(late))

    def process_usage(self) -> list[ProcessUsage]:
        refresh, lists = self._refresh, self._lists
        if refresh != self._lists_used and all(lists.get(i, (0,))[0] == refresh for i in self._handles):
            # Every GPU's lists came with this refresh's gpus(): no lane hand-off (each list once, then the lane).
            self._lists_used = refresh
            usage = [u for i in self._handles for u in lists[i][2]]
            self._process_keys = frozenset((u.gpu_index, u.pid) for u in usage)
            self._last_usage, self.late = usage, ()
            return usage
        return self._usage_in_lane(self._process_usage)

    def _process_usage(self) -> list[ProcessUsage]:
        usage = [u for index, handle in self._handles.items() for u in self._gpu_processes(index, handle)]
        self._process_keys = frozenset((u.gpu_index, u.pid) for u in usage)
        return usage

    def _gpu_processes(self, index: int, handle: Any, refresh: int = 0, medium: bool = False) -> list[ProcessUsage]:
        # A process can sit in both lists (type C+G) with the same figure: count it once.
        seen: dict[int, int | None] = {}
        for candidates in self._listers:
            for pid, used in self._running(candidates, handle):
                earlier = seen.get(pid)
                seen[pid] = used if earlier is None else (earlier if used is None else max(earlier, used))
        figures = tuple(seen.items())
        last = self._lists.get(index)
        if last is not None and last[1] == figures:
            usage = last[2]  # the same objects: the sampler then knows nothing changed without comparing fields
        else:
            usage = [ProcessUsage(pid=pid, gpu_index=index, vram_bytes=int(used) if used is not None else 0,
                                  source="nvml" if used is not None else SOURCE_UNKNOWN) for pid, used in figures]
        self._lists[index] = (refresh, figures, usage)
        rates = self._rates.get(index)
        if len(figures) == 1 and rates is not None:
            coders = self._coder_pct.get(index)
            if coders is None or medium:
                enc, dec = (self._try(f, handle) for f in self._coders)  # [percent, sampling period us]
                coders = self._coder_pct[index] = (int(enc[0]) if enc else 0, int(dec[0]) if dec else 0)
            self._sole[index] = (figures[0][0], (rates[0], rates[1], *coders))
        else:
            self._sole.pop(index, None)
        return usage

    def process_utilisation(self) -> dict[int, dict[int, tuple[int, int, int, int]]] | None:
        """gpu -> pid -> (sm, mem, enc, dec) % since the last call (nvmlDeviceGetProcessUtilization), for the GPUs
        that answered; None when the driver has no such call or the calls are late (their lane names them).

        A GPU whose process lists hold one process answers from its own figures instead, fresh each refresh and
        without the dear call: every kernel it ran was that process's, so the GPU's busy time
        (nvmlDeviceGetUtilizationRates: the share of the sample period a kernel ran) is the process's. A per-process
        SM figure (DCGM's) of a sole process was reported 1 point below its GPU's in NVIDIA/dcgm-exporter#107;
        tests/device/sole_process_util.py compares NVML's two on a node. Two or more processes (MPS lists its
        server and clients) take the dear call."""
        sole = dict(self._sole)
        keys = self._process_keys
        shared = keys is None or any(gpu not in sole for gpu, _ in keys)
        public = getattr(self._nv, "nvmlDeviceGetProcessUtilization", None)
        if shared:  # some GPU with processes has more than one, or none was listed yet
            answer = self._shared_utilisation(public, frozenset(sole)) if public is not None else None
        else:
            answer = {i: {} for i in self._handles}
        if not sole:
            return answer
        out = dict(answer) if answer is not None else {}
        out.update((gpu, {pid: figures}) for gpu, (pid, figures) in sole.items())
        return out

    def _shared_utilisation(self, public: Any, sole: frozenset[int]
                            ) -> dict[int, dict[int, tuple[int, int, int, int]]] | None:
        """The dear call, for the GPUs with processes not in `sole`, at its cadence (UTIL_SHARE)."""
        get = functools.partial(_samples, public)
        now = time.monotonic()
        if self._util_last is not None and self._process_keys == self._util_for and (
                now < self._util_next or (self.util_quiet and self.util_every_s and
                                          now < self._util_asked + UTIL_QUIET_EVERY_S)):
            return self._util_last  # a process that came or went is asked about at once, not seconds later
        cost = [0.0]

        def timed() -> dict[int, dict[int, tuple[int, int, int, int]]] | None:
            began = time.thread_time()  # the lane thread's own CPU: its waits in the driver do not count
            try:
                return self._utilisation(get, sole)
            finally:
                cost[0] = time.thread_time() - began
        try:
            answer: dict[int, dict[int, tuple[int, int, int, int]]] | None = self._lanes.run(
                (self.name, "utilisation"), self._in_lane(timed), self.deadline_s, source=self.name)
        except LateRead:
            return None
        self.util_every_s = min(UTIL_MAX_EVERY_S, cost[0] / UTIL_SHARE) if cost[0] > UTIL_DEAR_S else 0.0
        self._util_next = now + self.util_every_s
        self._util_asked = now
        self._util_last, self._util_for = answer, self._process_keys
        return answer

    def _utilisation(self, get: Any, sole: frozenset[int]) -> dict[int, dict[int, tuple[int, int, int, int]]] | None:
        nv = self._nv
        not_found = getattr(nv, "NVML_ERROR_NOT_FOUND", 6)
        seen = self._util_seen
        out: dict[int, dict[int, tuple[int, int, int, int]]] = {}
        # A GPU on which the last process list found nobody has no process to give a share of its time to; the
        # call is skipped there (on an idle H200 it was three fifths of the console's CPU).
        keys = self._process_keys
        with_processes = {gpu for gpu, _ in keys} if keys is not None else None  # None: not listed yet
        for index, handle in self._handles.items():
            if with_processes is not None and index not in with_processes or index in sole:
                out[index] = {}  # (a sole process's figures are the GPU's own: process_utilisation adds them)
                continue
            mark = self._marks.get(_thread.get_ident())
            if mark is not None:
                mark("nvmlDeviceGetProcessUtilization", None, index)
            try:
                samples = get(handle, seen.get(index, 0))
            except self._errors as exc:
                # NOT_FOUND: no process ran on it since the timestamp; pynvml raises NVML_SUCCESS when the first
                # call found nothing to size. Both mean "nothing ran"; anything else: this GPU cannot say.
                if getattr(exc, "value", None) in (not_found, 0):
                    out[index] = {}
                continue  # NOT_SUPPORTED (vGPU, MIG), NO_PERMISSION: this GPU's processes show n/a
            latest: dict[int, tuple[int, int, int, int, int, int]] = {}
            for sample in samples:
                pid = sample[0]
                if pid not in latest or sample[1] > latest[pid][1]:
                    latest[pid] = sample  # several samples of one process in the window: the newest
            if latest:
                seen[index] = max(s[1] for s in latest.values())
            out[index] = {pid: (s[2], s[3], s[4], s[5]) for pid, s in latest.items()}
        return out if out else None

    def device_globs(self) -> list[str]:
        dev = self._settings.dev_root
        return [str(dev / "nvidia[0-9]*"), str(dev / "nvidiactl"), str(dev / "nvidia-uvm")]

    # ----------------------------------------------------------------- readings

    def _running(self, candidates: list[Any], handle: Any) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None) of one list, from the first lister this driver answers."""
        while candidates:
            lister = candidates[0]
            try:
                return [(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in lister(handle)]
            except self._mismatch:
                with self._lister_lock:  # GPUs' lanes list at once: the one that failed is dropped once
                    if candidates and candidates[0] is lister:
                        candidates.pop(0)
            except self._errors:
                return []
        return []

    def _static_info(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self._nv
        pci = self._try(nv.nvmlDeviceGetPciInfo, handle)
        minor = self._try(nv.nvmlDeviceGetMinorNumber, handle)
        return {
            "name": _text(self._try(nv.nvmlDeviceGetName, handle)) or f"NVIDIA GPU {index}",
            "bus_id": bus_id(_text(getattr(pci, "busId", None))),
            "uuid": _text(self._try(nv.nvmlDeviceGetUUID, handle)),
            "device_files": (str(self._settings.dev_root / f"nvidia{minor}"),) if minor is not None else (),
        }

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        nv = self._nv
        if self._memory_version is not None:
            try:
                info = nv.nvmlDeviceGetMemoryInfo(handle, version=self._memory_version)
                return int(info.total), int(info.used)
            except self._errors:
                self._memory_version = None  # old driver: stay on v1 from now on
        info = self._try(nv.nvmlDeviceGetMemoryInfo, handle)
        if info is None:
            return None, None
        return int(info.total), int(info.used)

    def _temperature(self, handle: Any) -> float | None:
        nv = self._nv
        sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        if self._temperature_v is not None:
            try:
                return float(self._temperature_v(handle, sensor))
            except self._errors:
                self._temperature_v = None  # driver without nvmlDeviceGetTemperatureV
        value = self._try(nv.nvmlDeviceGetTemperature, handle, sensor)
        return None if value is None else float(value)

    def _gpu(self, index: int, handle: Any, medium: bool) -> GpuInfo:
        nv = self._nv
        static = self._static[index]
        total, used = self._memory(handle)
        rates = self._try(nv.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            self._rates[index] = (int(rates.gpu), int(rates.memory))
        else:
            self._rates.pop(index, None)
        milliwatts = self._try(nv.nvmlDeviceGetPowerUsage, handle)
        if medium or index not in self._temperatures:
            self._temperatures[index] = self._temperature(handle)
        temperature = self._temperatures[index]
        return GpuInfo(
            index=index, name=static["name"], vendor="nvidia", bus_id=static["bus_id"], uuid=static["uuid"],
            vram_total=total, vram_used=used,
            busy_percent=float(rates.gpu) if rates is not None else None,
            temperature_c=temperature,
            power_w=milliwatts / 1000.0 if milliwatts is not None else None,
            device_files=static["device_files"],
            sensors=self._sensors[index].read(float(rates.memory) if rates is not None else None, temperature,
                                              medium),
        )


def _samples(get: Any, handle: Any, since_us: int) -> list[tuple[int, int, int, int, int, int]]:
    """nvmlDeviceGetProcessUtilization's samples as (pid, timestamp us, sm %, mem %, enc %, dec %)."""
    return [(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil), int(s.encUtil), int(s.decUtil))
            for s in get(handle, since_us)]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    value = str(value).strip()
    return value or None


def _init_failure(nv: Any, exc: BaseException) -> str:
    """nvmlInit's failure as a clause that says what is missing."""
    reasons = (
        ("NVMLError_LibraryNotFound", "libnvidia-ml.so.1 not found (no NVIDIA driver)"),
        ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
        ("NVMLError_NoPermission", "no permission to open /dev/nvidia*"),
        ("NVMLError_LibRmVersionMismatch", "driver and libnvidia-ml versions differ (reload the driver or reboot)"),
    )
    for class_name, clause in reasons:
        cls = getattr(nv, class_name, None)
        if cls is not None and isinstance(exc, cls):
            return clause
    return f"nvmlInit failed ({exc})"
