"""amdgpu's sensor files (clocks, fan, power cap, memory activity, PCIe link, temperatures, RAS) as GpuSensors.

Formats from the kernel's amdgpu_pm.c / amdgpu_ras.c / pci-sysfs.c and hwmon sysfs ABI; the files are re-read
through the backend's own reader (held descriptors), the slow ones (RAS, bad pages, caps) every few refreshes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuwarden.ops.foundation.model import GpuSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Callable

# "1: 1300Mhz *": a DPM level, its clock, the star on the one in use. "S:" is deep sleep (not a level of its own).
_DPM_LINE = re.compile(r"^\s*(\w+):\s*(\d+)\s*mhz\s*(\*)?", re.IGNORECASE | re.MULTILINE)
_GTS = re.compile(r"^\s*([\d.]+)\s*GT/s")
_SENSOR_NAMES = {"mem": "memory"}  # hwmon's label -> the name the snapshot uses for every vendor
# Refreshes between two reads of what changes slowly or costs the driver a query (RAS counters ask the firmware).
SLOW_EVERY = 10


def parse_dpm(text: str | None) -> tuple[float | None, float | None]:
    """pp_dpm_sclk / pp_dpm_mclk: (clock of the starred line, highest level) in MHz; None where absent."""
    current = highest = None
    for key, mhz, star in _DPM_LINE.findall(text or ""):
        value = float(mhz)
        if star:
            current = value
        if key.isdigit():
            highest = value if highest is None else max(highest, value)
    return current, highest


def parse_link_speed(text: str | None) -> float | None:
    """current_link_speed / max_link_speed: '32.0 GT/s PCIe' (older kernels '8 GT/s') -> 32.0."""
    m = _GTS.match(text or "")
    return float(m[1]) if m else None


def parse_int(raw: bytes | str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.split()[0], 0)
    except (ValueError, IndexError):
        return None


def parse_ras(text: str | None) -> dict[str, int] | None:
    """ras/<block>_err_count: 'ue: 0\\nce: 3\\n' (UMC adds 'de: N') -> counts; None when inaccessible."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        value = value.strip()
        if sep and value.isdigit():
            out[key.strip()] = int(value)
    return out or None


def parse_bad_pages(text: str | None) -> tuple[int, int] | None:
    """ras/gpu_vram_bad_pages ('0x<page> : 0x<size> : R|P|F' per line) -> (retired, pending); None when absent."""
    if text is None:
        return None
    retired = pending = 0
    for line in text.splitlines():
        flag = line.rpartition(":")[2].strip()
        if flag == "R":
            retired += 1
        elif flag == "P":
            pending += 1
    return retired, pending


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode(errors="replace")


class SysfsSensors:
    """The sensor files of one amdgpu device directory, found once; `read()` gives its GpuSensors.

    `read_file(path, size)` is the backend's reader (bytes, or None when the file cannot be read). A refresh whose
    files read the same bytes as the last one gives back the same GpuSensors object."""

    def __init__(self, dev: Path, read_file: Callable[[str, int], bytes | None], sysfs_root: Path | None = None):
        self._read = read_file
        self._fast: list[tuple[str, str]] = []  # (what, path) read every refresh
        self._slow: list[tuple[str, str]] = []  # read every SLOW_EVERY refreshes
        d = str(dev)
        for what, name in (("sclk", "pp_dpm_sclk"), ("mclk", "pp_dpm_mclk"), ("mem_busy", "mem_busy_percent")):
            if os.path.exists(f"{d}/{name}"):
                self._fast.append((what, f"{d}/{name}"))
        # The link's state changes with power management, but an operator looks for a link that trained low
        # (x8, Gen3), which stays so: read with the slow group.
        for what, name in (("link_speed", "current_link_speed"), ("link_width", "current_link_width"),
                           ("link_max_speed", "max_link_speed"), ("link_max_width", "max_link_width"),
                           ("bad_pages", "ras/gpu_vram_bad_pages")):
            if os.path.exists(f"{d}/{name}"):
                self._slow.append((what, f"{d}/{name}"))
        try:
            ras_names = sorted(n for n in os.listdir(f"{d}/ras") if n.endswith("_err_count"))
        except OSError:
            ras_names = []
        self._slow += [("ras:" + n[:-len("_err_count")], f"{d}/ras/{n}") for n in ras_names]
        self._labels: dict[str, str] = {}  # temp input path -> sensor name
        hwmon = self._hwmon(d)
        if hwmon is not None:
            try:
                names = sorted(os.listdir(hwmon))
            except OSError:
                names = []
            for name in names:
                m = re.fullmatch(r"temp(\d+)_input", name)
                if m:
                    label = _text(self._read(f"{hwmon}/temp{m[1]}_label", 64))
                    label = (label or "").strip() or f"temp{m[1]}"
                    path = f"{hwmon}/{name}"
                    self._labels[path] = _SENSOR_NAMES.get(label, label)
                    self._fast.append(("temp", path))
            for what, name, group in (("fan_rpm", "fan1_input", self._fast), ("pwm", "pwm1", self._fast),
                                      ("pwm_max", "pwm1_max", self._slow), ("power_cap", "power1_cap", self._slow)):
                if name in names:
                    group.append((what, f"{hwmon}/{name}"))
        self._threshold = None
        if sysfs_root is not None:
            value = parse_int(self._read(str(sysfs_root / "module/amdgpu/parameters/bad_page_threshold"), 64))
            # -1 (auto) and -2 (ignore) leave the number to the driver, which does not publish it.
            self._threshold = value if value is not None and value > 0 else None
        self._calls = 0
        self._slow_raw: tuple[bytes | None, ...] = ()
        self._last: tuple[tuple[tuple[bytes | None, ...], tuple[bytes | None, ...]], GpuSensors] | None = None

    @staticmethod
    def _hwmon(d: str) -> str | None:
        try:
            names = sorted(os.listdir(f"{d}/hwmon"))
        except OSError:
            return None
        return f"{d}/hwmon/{names[0]}" if names else None

    @property
    def empty(self) -> bool:
        return not self._fast and not self._slow

    def read(self) -> GpuSensors:
        if self._calls % SLOW_EVERY == 0 or not self._slow_raw:
            self._slow_raw = tuple(self._read(path, 65536 if what == "bad_pages" else 256)
                                   for what, path in self._slow)
        self._calls += 1
        fast_raw = tuple(self._read(path, 256) for _, path in self._fast)
        key = (fast_raw, self._slow_raw)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        sensors = self._parse(fast_raw, self._slow_raw)
        self._last = (key, sensors)
        return sensors

    def _parse(self, fast_raw: tuple[bytes | None, ...], slow_raw: tuple[bytes | None, ...]) -> GpuSensors:
        values: dict[str, Any] = {}
        temps: dict[str, float] = {}
        ras: dict[str, dict[str, int]] = {}
        for (what, path), raw in zip(self._fast + self._slow, fast_raw + slow_raw):
            if raw is None:
                continue
            if what == "temp":
                milli = parse_int(raw)
                if milli is not None:
                    temps[self._labels[path]] = milli / 1000.0
            elif what.startswith("ras:"):
                counts = parse_ras(_text(raw))
                if counts is not None:
                    ras[what[4:]] = counts
            else:
                values[what] = raw
        sclk, sclk_max = parse_dpm(_text(values.get("sclk")))
        mclk, mclk_max = parse_dpm(_text(values.get("mclk")))
        pwm, pwm_max = parse_int(values.get("pwm")), parse_int(values.get("pwm_max")) or 255  # hwmon ABI: 0-255
        cap = parse_int(values.get("power_cap"))
        pages = parse_bad_pages(_text(values["bad_pages"])) if "bad_pages" in values else None
        busy = parse_int(values.get("mem_busy"))
        width, max_width = parse_int(values.get("link_width")), parse_int(values.get("link_max_width"))
        return GpuSensors(
            sclk_mhz=sclk, sclk_max_mhz=sclk_max, mclk_mhz=mclk, mclk_max_mhz=mclk_max,
            fan_rpm=parse_int(values.get("fan_rpm")),
            fan_percent=round(100.0 * pwm / pwm_max, 1) if pwm is not None else None,
            power_cap_w=cap / 1e6 if cap else None,  # microwatts; 0 means no cap is reported
            mem_busy_percent=float(busy) if busy is not None and 0 <= busy <= 100 else None,
            link_speed_gts=parse_link_speed(_text(values.get("link_speed"))),
            link_max_speed_gts=parse_link_speed(_text(values.get("link_max_speed"))),
            link_width=width or None, link_max_width=max_width or None,  # 0: the link state is unknown
            throttle=None,  # only the binary gpu_metrics table says, which this reader does not decode
            temperatures=temps, ras=ras,
            ecc_corrected=sum(c.get("ce", 0) for c in ras.values()) if ras else None,
            ecc_uncorrected=sum(c.get("ue", 0) for c in ras.values()) if ras else None,
            retired_pages=pages[0] if pages else None, pending_pages=pages[1] if pages else None,
            bad_page_threshold=self._threshold,
        )
