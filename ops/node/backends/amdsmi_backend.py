"""The amdsmi backend: AMD GPUs and their processes through the amdsmi Python library (ROCm 6.x and 7.x).

Every reading that the library cannot give ("N/A", an all-ones sentinel, AmdSmiLibraryException) becomes None.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from gpuwarden.ops.foundation.errors import BackendUnavailable
from gpuwarden.ops.foundation.model import GpuInfo, ProcessUsage, stale_read
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.backends import libload, sysfs
from gpuwarden.ops.node.backends.amdsmi_sensors import AmdSmiSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` tries this backend on every node
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.foundation.deadline import LateRead

MIB = 1024 * 1024
# Unsigned "no value" sentinels the C library leaves in fields it could not fill; 6.x passes them through
# unconverted, 7.x turns most of them into "N/A".
_SENTINELS = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})

_HINT = "install amd-smi-lib from ROCm (or pick another source with --backend sysfs)"


def known(value: Any) -> Any:
    """The value, or None when amdsmi says it does not know ("N/A", "", an all-ones sentinel)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip()
        return None if text in ("", "N/A", "n/a") else text
    if isinstance(value, int) and value in _SENTINELS:
        return None
    return value


def number(value: Any) -> float | None:
    """A numeric reading, or None; amdsmi sometimes gives numbers as strings."""
    value = known(value)
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class AmdSmiBackend(libload.LibraryBackend):
    """Backend over the amdsmi library. `module` replaces `import amdsmi` (tests inject a stand-in)."""

    name = "amdsmi"
    simulated = False

    def __init__(self, settings: Settings, module: ModuleType | Any = None):
        self._settings = settings
        self._deadlines(settings)
        m = module if module is not None else libload.import_vendor(
            "amdsmi", "amdsmi", "libamd_smi.so not found", _HINT)
        self._m = m
        self._opening(self._open)

    def _open(self) -> None:
        """amdsmi_init, the handles and the static facts: in a lane, since a wedged GPU can hang any of them."""
        m = self._m
        self._errors: tuple[type[BaseException], ...] = (getattr(m, "AmdSmiException", RuntimeError),)
        missing = _missing_api(m)
        if missing:
            names = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise BackendUnavailable(f"amdsmi: this amdsmi predates the ROCm 6.0 API (no {names})",
                                     "install amd-smi-lib from ROCm 6.0 or later (or the amdsmi wheel)")
        try:
            m.amdsmi_init(m.AmdSmiInitFlags.INIT_AMD_GPUS)
        except self._errors as exc:
            raise BackendUnavailable(f"amdsmi: {_init_failure(exc)}", _HINT) from None
        self._shutdown = m.amdsmi_shut_down
        try:
            self._handles = list(m.amdsmi_get_processor_handles())
        except self._errors as exc:
            self.close()
            raise BackendUnavailable(f"amdsmi: cannot list GPUs ({_short(exc)})", _HINT) from None
        if not self._handles:
            self.close()
            raise BackendUnavailable("amdsmi: no AMD GPU found", _HINT)
        # 6.1 and older hand back process handles that need a second call; 6.2+ return dicts directly.
        self._process_info = getattr(m, "amdsmi_get_gpu_process_info", None)
        self._kfd_nodes: list[sysfs.KfdNode] | None = None
        self._cards: list[sysfs.DrmCard] | None = None
        self._static = [self._static_info(i, h) for i, h in enumerate(self._handles)]
        self._sensors = [AmdSmiSensors(m, h, self._try, number) for h in self._handles]

    # ----------------------------------------------------------------- protocol

    def gpus(self) -> list[GpuInfo]:
        return self._gpus_in_lanes(list(enumerate(self._handles)), self._gpu, self._stale_gpu)

    def _stale_gpu(self, index: int, late: LateRead) -> GpuInfo:
        static = self._static[index]
        return GpuInfo(index=index, vendor="amd", vram_used=None, stale=stale_read(late), **static)

    def process_usage(self) -> list[ProcessUsage]:
        return self._usage_in_lane(self._process_usage)

    def _process_usage(self) -> list[ProcessUsage]:
        usage: list[ProcessUsage] = []
        for index, handle in enumerate(self._handles):
            entries = self._try(self._m.amdsmi_get_gpu_process_list, handle)
            for entry in entries or ():
                info = entry if isinstance(entry, Mapping) else self._try(self._process_info, handle, entry)
                if not info:
                    continue
                pid = known(info.get("pid"))
                if pid is None:
                    continue
                memory = info.get("memory_usage")
                memory = memory if isinstance(memory, Mapping) else {}
                vram = number(memory.get("vram_mem"))
                if vram is None:
                    vram = number(info.get("mem"))
                gtt = number(memory.get("gtt_mem"))
                usage.append(ProcessUsage(
                    pid=int(pid), gpu_index=index, vram_bytes=int(vram or 0), source="amdsmi",
                    gtt_bytes=None if gtt is None else int(gtt)))
        return usage

    def device_globs(self) -> list[str]:
        dev = self._settings.dev_root
        return [str(dev / "kfd"), str(dev / "dri" / "renderD*")]

    # ----------------------------------------------------------------- readings

    def _field(self, fn_name: str, handle: Any, *keys: str) -> Any:
        """The first known value among `keys` of the dict that `fn_name(handle)` returns."""
        result = self._try(getattr(self._m, fn_name, None), handle)
        if not isinstance(result, Mapping):
            return None
        for key in keys:
            value = known(result.get(key))
            if value is not None:
                return value
        return None

    def _memory(self, fn_name: str, handle: Any, kind: str) -> int | None:
        mem_type = getattr(self._m.AmdSmiMemoryType, kind, None)
        if mem_type is None:
            return None
        value = number(self._try(getattr(self._m, fn_name, None), handle, mem_type))
        return None if value is None else int(value)

    def _static_info(self, index: int, handle: Any) -> dict[str, Any]:
        """What does not change while the driver is loaded: asked once, at open."""
        m = self._m
        bdf = known(self._try(m.amdsmi_get_gpu_device_bdf, handle))
        bdf = bdf.lower() if isinstance(bdf, str) else None
        vram_total = self._memory("amdsmi_get_gpu_memory_total", handle, "VRAM")
        if vram_total is None:
            mib = number(self._field("amdsmi_get_gpu_vram_usage", handle, "vram_total"))
            vram_total = None if mib is None else int(mib) * MIB  # this call counts in MiB
        hive = number(self._field("amdsmi_get_xgmi_info", handle, "xgmi_hive_id"))
        kfd_id = number(self._field("amdsmi_get_gpu_kfd_info", handle, "kfd_id"))
        return {
            "name": self._field("amdsmi_get_gpu_asic_info", handle, "market_name") or f"AMD GPU {index}",
            "bus_id": bdf,
            "uuid": known(self._try(m.amdsmi_get_gpu_device_uuid, handle)),
            "vram_total": vram_total,
            "gtt_total": self._memory("amdsmi_get_gpu_memory_total", handle, "GTT"),
            "kfd_gpu_id": int(kfd_id) if kfd_id is not None else self._kfd_gpu_id_from_sysfs(bdf),
            "hive_id": f"{int(hive):#x}" if hive else None,  # 0: not in an XGMI hive
            "device_files": self._device_files(handle, bdf),
            # 6.2+: "SPX".."CPX" and "NPS1".."NPS8" (strings); older libraries have neither call.
            "compute_partition": known(self._try(getattr(m, "amdsmi_get_gpu_compute_partition", None), handle)),
            "memory_partition": known(self._try(getattr(m, "amdsmi_get_gpu_memory_partition", None), handle)),
        }

    def _gpu(self, index: int, handle: Any) -> GpuInfo:
        static = self._static[index]
        vram_used = self._memory("amdsmi_get_gpu_memory_usage", handle, "VRAM")
        if vram_used is None:
            mib = number(self._field("amdsmi_get_gpu_vram_usage", handle, "vram_used"))
            vram_used = None if mib is None else int(mib) * MIB
        self._metrics_read: Mapping[str, Any] | None = None  # the gpu_metrics table, when _live_metrics asks for it: read once a refresh
        busy, temperature, power = self._live_metrics(handle)
        return GpuInfo(
            index=index, name=static["name"], vendor="amd", bus_id=static["bus_id"], uuid=static["uuid"],
            vram_total=static["vram_total"], vram_used=vram_used,
            gtt_total=static["gtt_total"], gtt_used=self._memory("amdsmi_get_gpu_memory_usage", handle, "GTT"),
            busy_percent=busy, temperature_c=temperature, power_w=power,
            kfd_gpu_id=static["kfd_gpu_id"], hive_id=static["hive_id"],
            compute_partition=static["compute_partition"], memory_partition=static["memory_partition"],
            device_files=static["device_files"], sensors=self._sensors[index].read(self._metrics_read),
        )

    def _live_metrics(self, handle: Any) -> tuple[float | None, float | None, float | None]:
        """Busy %, temperature (hotspot, else edge) and socket power.

        The dedicated calls come first because their units are fixed (%, degrees C after amdsmi's own
        /1000, W); the kernel's gpu_metrics table only states its units from v1.4 (MI300) on, so it is
        read, once, just for what those calls could not give.
        """
        busy = number(self._field("amdsmi_get_gpu_activity", handle, "gfx_activity"))
        temperature = self._temperature(handle)
        power = number(self._field("amdsmi_get_power_info", handle,
                                   "socket_power", "current_socket_power", "average_socket_power"))
        if busy is None or temperature is None or power is None:
            metrics = self._try(getattr(self._m, "amdsmi_get_gpu_metrics_info", None), handle)
            metrics = metrics if isinstance(metrics, Mapping) else {}
            self._metrics_read = metrics
            if busy is None:
                busy = number(metrics.get("average_gfx_activity"))
            if temperature is None:
                temperature = number(metrics.get("temperature_hotspot"))
                if temperature is None:
                    temperature = number(metrics.get("temperature_edge"))
            if power is None:
                power = number(metrics.get("current_socket_power"))
                if power is None:
                    power = number(metrics.get("average_socket_power"))
        if busy is not None and not 0 <= busy <= 100:
            busy = None
        return (None if busy is None else float(busy),
                None if temperature is None else float(temperature),
                None if power is None else float(power))

    def _temperature(self, handle: Any) -> float | None:
        m = self._m
        kinds = getattr(m, "AmdSmiTemperatureType", None)
        metric = getattr(getattr(m, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        if kinds is None or metric is None:
            return None
        for kind in ("HOTSPOT", "EDGE"):
            sensor = getattr(kinds, kind, None)
            if sensor is None:
                continue
            value = number(self._try(getattr(m, "amdsmi_get_temp_metric", None), handle, sensor, metric))
            if value is not None:
                return float(value)  # amdsmi already divides the kernel's millidegrees by 1000
        return None

    # ----------------------------------------------------------------- device files

    def _device_files(self, handle: Any, bdf: str | None) -> tuple[str, ...]:
        """The render node a process opens to use this GPU (what the holder scan matches)."""
        info = self._try(getattr(self._m, "amdsmi_get_gpu_enumeration_info", None), handle)
        render = number(info.get("drm_render")) if isinstance(info, Mapping) else None
        if render is None and bdf is not None:
            # 6.x has no enumeration info: the PCI device's drm/ folder names the same node.
            render = next((c.render_minor for c in self._sysfs_cards() if c.bus_id == bdf), None)
        if render is None:
            return ()
        return (str(self._settings.dev_root / "dri" / f"renderD{int(render)}"),)

    def _kfd_gpu_id_from_sysfs(self, bdf: str | None) -> int | None:
        """KFD's gpu_id for this PCI address, from the KFD topology (6.x has no amdsmi_get_gpu_kfd_info)."""
        if bdf is None:
            return None
        if self._kfd_nodes is None:
            self._kfd_nodes = sysfs.kfd_gpu_nodes(self._settings.sysfs_root)
        return next((n.gpu_id for n in self._kfd_nodes if n.bus_id == bdf), None)

    def _sysfs_cards(self) -> list[sysfs.DrmCard]:
        if self._cards is None:
            self._cards = sysfs.amd_cards(self._settings.sysfs_root)
        return self._cards


# Reached without a fallback. ROCm 5.x spelled them amdsmi_get_device_handles, AmdSmiInitFlags.AMD_GPUS, ...
_REQUIRED = ("amdsmi_init", "amdsmi_shut_down", "amdsmi_get_processor_handles", "amdsmi_get_gpu_process_list",
             "amdsmi_get_gpu_device_bdf", "amdsmi_get_gpu_device_uuid", "AmdSmiMemoryType")


def _missing_api(m: Any) -> list[str]:
    missing = [name for name in _REQUIRED if not hasattr(m, name)]
    if not hasattr(getattr(m, "AmdSmiInitFlags", None), "INIT_AMD_GPUS"):
        missing.append("AmdSmiInitFlags.INIT_AMD_GPUS")
    return sorted(missing)


def _short(exc: BaseException) -> str:
    info = getattr(exc, "get_error_info", None)
    try:
        text = str(info()) if callable(info) else str(exc)
    except Exception:  # describing an amdsmi error must not raise a second one
        text = str(exc)
    return " ".join(text.split()) or type(exc).__name__


def _init_failure(exc: BaseException) -> str:
    """amdsmi_init's failure as a clause that says what to do about it."""
    text = _short(exc)
    if "NO_PERM" in text:
        return "no permission to open the GPU (add the user to the render and video groups)"
    if "DRIVER_NOT_LOADED" in text or "NOT_FOUND" in text or "FAIL_LOAD" in text:
        return "amdgpu driver not loaded"
    return f"amdsmi_init failed ({text})"
