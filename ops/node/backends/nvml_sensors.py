"""NVIDIA sensors through NVML as GpuSensors: clocks, fan, power limit, memory-controller activity, PCIe link,
clocks-event (throttle) reasons, ECC and remapped rows. Limits are asked once; ECC, links, caps every few refreshes.

Names from nvml.h / nvidia-ml-py: nvmlDeviceGetClockInfo/MaxClockInfo (MHz), nvmlDeviceGetFanSpeed (%),
nvmlDeviceGetEnforcedPowerLimit (mW), nvmlDeviceGetCurrPcieLinkGeneration/Width, nvmlDeviceGetTotalEccErrors.
"""

from __future__ import annotations

from gpuwarden.ops.foundation.model import GpuSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` tries this backend on every node
if TYPE_CHECKING:
    from typing import Any, Callable

# PCIe generation -> GT/s per lane (the PCIe base specifications).
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
# nvidia-ml-py's constant suffixes (nvmlClocksEventReason*, older nvmlClocksThrottleReason*) -> our names.
REASONS = (("GpuIdle", "idle"), ("ApplicationsClocksSetting", "app-clocks"), ("SwPowerCap", "sw-power-cap"),
           ("HwSlowdown", "hw-slowdown"), ("SyncBoost", "sync-boost"), ("SwThermalSlowdown", "sw-thermal"),
           ("HwThermalSlowdown", "hw-thermal"), ("HwPowerBrakeSlowdown", "hw-power-brake"),
           ("DisplayClockSetting", "display-clock"))
SLOW_EVERY = 10
# Figures that move over seconds rather than from one refresh to the next: the GPU's temperature, its memory clock
# (fixed on HBM parts), the video coders' % given to a GPU's sole process. Each NVML call costs 20-40 us of CPU
# asked once a second from cold caches (tests/device/nvml_floor.py): these are asked every MEDIUM_EVERY refreshes.
MEDIUM_EVERY = 5


def _bits(nv: Any) -> list[tuple[int, str]]:
    out = []
    for suffix, name in REASONS:
        bit = getattr(nv, "nvmlClocksEventReason" + suffix, getattr(nv, "nvmlClocksThrottleReason" + suffix, None))
        if isinstance(bit, int) and bit:
            out.append((bit, name))
    return out


def reasons(mask: int | None, bits: list[tuple[int, str]]) -> tuple[str, ...] | None:
    if mask is None:
        return None
    return tuple(name for bit, name in bits if mask & bit)


class NvmlSensors:
    """The sensors of one NVML device handle. `call(fn, *args)` is the backend's _try (None on an NVML error)."""

    def __init__(self, nv: Any, handle: Any, call: Callable[..., Any]):
        self._nv, self._h, self._call = nv, handle, call
        sm, mem = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)
        self._clocks = (sm, mem)
        max_clock = getattr(nv, "nvmlDeviceGetMaxClockInfo", None)
        self._sclk_max, self._mclk_max = call(max_clock, handle, sm), call(max_clock, handle, mem)
        max_gen = call(getattr(nv, "nvmlDeviceGetMaxPcieLinkGeneration", None), handle)
        self._link_max_gts = PCIE_GTS.get(max_gen) if max_gen is not None else None
        self._link_max_width = call(getattr(nv, "nvmlDeviceGetMaxPcieLinkWidth", None), handle) or None
        self._reason_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._bits = _bits(nv)
        self._calls = 0
        self._slow: dict[str, Any] = {}
        self._last: tuple[tuple[Any, ...], GpuSensors] | None = None
        self._mclk: Any = None  # asked at the first read and at each medium one

    def _read_slow(self) -> dict[str, Any]:
        nv, h, call = self._nv, self._h, self._call
        limit = call(getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None), h)
        if limit is None:
            limit = call(getattr(nv, "nvmlDeviceGetPowerManagementLimit", None), h)
        total = getattr(nv, "nvmlDeviceGetTotalEccErrors", None)
        volatile = getattr(nv, "NVML_VOLATILE_ECC", 0)
        rows = call(getattr(nv, "nvmlDeviceGetRemappedRows", None), h)
        gen = call(getattr(nv, "nvmlDeviceGetCurrPcieLinkGeneration", None), h)
        return {
            "cap_mw": limit,
            "ce": call(total, h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile),
            "ue": call(total, h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile),
            # Ampere and later remap rows instead of retiring pages: (correctable, uncorrectable, pending, failed).
            "remapped": int(rows[0]) + int(rows[1]) if rows is not None else None,
            "gts": PCIE_GTS.get(gen) if gen is not None else None,
            "width": call(getattr(nv, "nvmlDeviceGetCurrPcieLinkWidth", None), h),
        }

    def read(self, memory_busy: float | None, gpu_temperature: float | None, medium: bool) -> GpuSensors:
        """`medium`: this refresh asks the MEDIUM_EVERY figures too (the backend's cadence, one for all GPUs)."""
        if self._calls % SLOW_EVERY == 0:
            self._slow = self._read_slow()
        self._calls += 1
        nv, h, call = self._nv, self._h, self._call
        clock = getattr(nv, "nvmlDeviceGetClockInfo", None)
        if medium or self._calls == 1:
            self._mclk = call(clock, h, self._clocks[1])
        fast = (call(clock, h, self._clocks[0]), self._mclk,
                call(getattr(nv, "nvmlDeviceGetFanSpeed", None), h), call(self._reason_fn, h),
                memory_busy, gpu_temperature)
        key = (fast, tuple(self._slow.values()))
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        sclk, mclk, fan, mask = fast[:4]
        slow = self._slow
        cap = slow.get("cap_mw")
        sensors = GpuSensors(
            sclk_mhz=_f(sclk), sclk_max_mhz=_f(self._sclk_max), mclk_mhz=_f(mclk), mclk_max_mhz=_f(self._mclk_max),
            fan_percent=_f(fan), power_cap_w=cap / 1000.0 if cap else None, mem_busy_percent=memory_busy,
            link_speed_gts=slow.get("gts"), link_max_speed_gts=self._link_max_gts,
            link_width=slow.get("width") or None, link_max_width=self._link_max_width,
            throttle=reasons(mask, self._bits),
            temperatures={"gpu": gpu_temperature} if gpu_temperature is not None else {},
            ecc_corrected=_i(slow.get("ce")), ecc_uncorrected=_i(slow.get("ue")),
            retired_pages=slow.get("remapped"),
        )
        self._last = (key, sensors)
        return sensors


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


def _i(value: Any) -> int | None:
    return None if value is None else int(value)
