"""AMD sensors through the amdsmi library (ROCm 6.x and 7.x) as GpuSensors.

Names and units from amdsmi's API: amdsmi_get_clock_info (6.0 cur_clk, 6.1+ clk; MHz), amdsmi_get_gpu_activity
umc_activity (%), amdsmi_get_power_cap_info power_cap (uW), amdsmi_get_pcie_info (6.1+: pcie_metric.pcie_speed in
MT/s, pcie_static), amdsmi_get_temp_metric (C), amdsmi_get_gpu_ecc_count per AmdSmiGpuBlock, bad-page info, and
gpu_metrics' indep_throttle_status (the kernel's SMU_THROTTLER_*_BIT layout, amdgpu_smu.h).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuwarden.ops.foundation.model import GpuSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` tries this backend on every node
if TYPE_CHECKING:
    from typing import Any, Callable

SLOW_EVERY = 10
# indep_throttle_status bit -> name (amdgpu_smu.h SMU_THROTTLER_*_BIT).
THROTTLERS = {0: "ppt0", 1: "ppt1", 2: "ppt2", 3: "ppt3", 4: "spl", 5: "fppt", 6: "sppt", 7: "sppt-apu",
              16: "tdc-gfx", 17: "tdc-soc", 18: "tdc-mem", 19: "tdc-vdd", 20: "tdc-cvip", 21: "edc-cpu",
              22: "edc-gfx", 23: "apcc", 32: "temp-gpu", 33: "temp-core", 34: "temp-mem", 35: "temp-edge",
              36: "temp-hotspot", 37: "temp-soc", 38: "temp-vr-gfx", 39: "temp-vr-soc", 40: "temp-vr-mem0",
              41: "temp-vr-mem1", 42: "temp-liquid0", 43: "temp-liquid1", 44: "vrhot0", 45: "vrhot1",
              46: "prochot-cpu", 47: "prochot-gfx", 56: "ppm", 57: "fit"}
RAS_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "ATHUB", "PCIE_BIF", "HDP", "XGMI_WAFL", "DF", "SMN", "SEM", "MP0",
              "MP1", "FUSE")
_TEMPS = (("EDGE", "edge"), ("HOTSPOT", "junction"), ("VRAM", "memory"))


def throttle_names(mask: int | None) -> tuple[str, ...] | None:
    if mask is None:
        return None
    return tuple(name for bit, name in THROTTLERS.items() if mask >> bit & 1)


def gts(value: float | None) -> float | None:
    """A PCIe speed as amdsmi gives it (MT/s in pcie_metric; GT/s or MT/s in pcie_static, by version) in GT/s."""
    if value is None or value <= 0:
        return None
    return value / 1000.0 if value >= 1000 else float(value)


class AmdSmiSensors:
    """The sensors of one amdsmi processor handle; `known`/`number` are the backend's converters of "N/A"."""

    def __init__(self, m: Any, handle: Any, call: Callable[..., Any], number: Callable[[Any], float | None]):
        self._m, self._h, self._call, self._num = m, handle, call, number
        self._calls = 0
        self._slow: dict[str, Any] = {}
        self._last: tuple[tuple[Any, ...], GpuSensors] | None = None

    def _get(self, name: str, *args: Any) -> Any:
        return self._call(getattr(self._m, name, None), self._h, *args)

    def _key(self, result: Any, *keys: str) -> float | None:
        if not isinstance(result, Mapping):
            return None
        for key in keys:
            value = self._num(result.get(key))
            if value is not None:
                return value
        return None

    def _clock(self, kind: str) -> tuple[float | None, float | None]:
        clk = getattr(getattr(self._m, "AmdSmiClkType", None), kind, None)
        if clk is None:
            return None, None
        info = self._get("amdsmi_get_clock_info", clk)
        return self._key(info, "clk", "cur_clk"), self._key(info, "max_clk")

    def _read_slow(self) -> dict[str, Any]:
        cap = self._key(self._get("amdsmi_get_power_cap_info"), "power_cap")
        pcie = self._get("amdsmi_get_pcie_info")
        static = pcie.get("pcie_static") if isinstance(pcie, Mapping) else None
        metric = pcie.get("pcie_metric") if isinstance(pcie, Mapping) else None
        ras: dict[str, dict[str, int]] = {}
        blocks = getattr(self._m, "AmdSmiGpuBlock", None)
        for name in RAS_BLOCKS:
            block = getattr(blocks, name, None)
            counts = self._get("amdsmi_get_gpu_ecc_count", block) if block is not None else None
            if isinstance(counts, Mapping):
                out = {short: int(v) for short, key in (("ce", "correctable_count"), ("ue", "uncorrectable_count"),
                                                        ("de", "deferred_count"))
                       if (v := self._num(counts.get(key))) is not None}
                if out:
                    ras[name.lower()] = out
        pages = self._get("amdsmi_get_gpu_bad_page_info")
        retired = pending = None
        if isinstance(pages, list):
            statuses = [str(p.get("status", "")).upper() if isinstance(p, Mapping) else "" for p in pages]
            retired = sum(1 for s in statuses if "RESERVED" in s and "UNRESERVABLE" not in s)
            pending = sum(1 for s in statuses if "PENDING" in s)
        threshold = self._num(self._get("amdsmi_get_gpu_bad_page_threshold"))  # 7.x only
        return {"cap": cap / 1e6 if cap else None,
                "speed": gts(self._key(metric, "pcie_speed")), "width": self._key(metric, "pcie_width"),
                "max_speed": gts(self._key(static, "max_pcie_speed")), "max_width": self._key(static, "max_pcie_width"),
                "ras": ras, "retired": retired, "pending": pending,
                "threshold": int(threshold) if threshold else None}

    def read(self, metrics: Mapping[str, Any] | None = None) -> GpuSensors:
        """`metrics`: the gpu_metrics table when the backend has read it this refresh (it is asked for once)."""
        if self._calls % SLOW_EVERY == 0:
            self._slow = self._read_slow()
        self._calls += 1
        sclk = self._clock("GFX")
        mclk = self._clock("MEM")
        umc = self._key(self._get("amdsmi_get_gpu_activity"), "umc_activity")
        temps = {}
        kinds = getattr(self._m, "AmdSmiTemperatureType", None)
        current = getattr(getattr(self._m, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        for kind, label in _TEMPS:
            sensor = getattr(kinds, kind, None)
            if sensor is not None and current is not None:
                value = self._num(self._get("amdsmi_get_temp_metric", sensor, current))
                if value is not None:
                    temps[label] = float(value)
        rpm = self._num(self._get("amdsmi_get_gpu_fan_rpms", 0))
        speed, top = self._num(self._get("amdsmi_get_gpu_fan_speed", 0)), None
        if speed is not None:
            top = self._num(self._get("amdsmi_get_gpu_fan_speed_max", 0))
        if metrics is None:
            metrics = self._get("amdsmi_get_gpu_metrics_info")
        mask = self._num(metrics.get("indep_throttle_status")) if isinstance(metrics, Mapping) else None
        fast = (sclk, mclk, umc, tuple(temps.items()), rpm, speed, top, mask)
        key = (fast, tuple((k, repr(v)) for k, v in self._slow.items()))
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        slow = self._slow
        ras = slow.get("ras") or {}
        sensors = GpuSensors(
            sclk_mhz=sclk[0], sclk_max_mhz=sclk[1], mclk_mhz=mclk[0], mclk_max_mhz=mclk[1],
            fan_rpm=int(rpm) if rpm is not None else None,
            fan_percent=round(100.0 * speed / top, 1) if speed is not None and top else None,
            power_cap_w=slow.get("cap"), mem_busy_percent=float(umc) if umc is not None and 0 <= umc <= 100 else None,
            link_speed_gts=slow.get("speed"), link_max_speed_gts=slow.get("max_speed"),
            link_width=int(slow["width"]) if slow.get("width") else None,
            link_max_width=int(slow["max_width"]) if slow.get("max_width") else None,
            throttle=throttle_names(int(mask)) if mask is not None else None,
            temperatures=temps, ras=ras,
            ecc_corrected=sum(c.get("ce", 0) for c in ras.values()) if ras else None,
            ecc_uncorrected=sum(c.get("ue", 0) for c in ras.values()) if ras else None,
            retired_pages=slow.get("retired"), pending_pages=slow.get("pending"),
            bad_page_threshold=slow.get("threshold"),
        )
        self._last = (key, sensors)
        return sensors
