"""The GPU detail view's sensor lines: clocks, power against its cap, fan, PCIe link, temperatures, throttling, RAS.

"n/a" wherever the source has no reading; a link below its maximum, throttling and uncorrected errors stand out.
"""

from __future__ import annotations

from rich.text import Text

from gpuwarden.ops.foundation.model import GpuSensors

from gpuwarden.tui.styles import STYLES as S

NA = "n/a"


def _n(value: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return NA if value is None else format(value, fmt) + unit


def _of(current: float | None, top: float | None, unit: str) -> str:
    if current is None and top is None:
        return NA
    return f"{_n(current)}/{_n(top)} {unit}"


def _link(speed: float | None, width: int | None) -> str:
    if speed is None and width is None:
        return NA
    return f"{_n(speed, 'g', ' GT/s')} x{width if width is not None else '?'}"


def sensor_lines(s: GpuSensors, power_w: float | None) -> Text:
    """Five or six lines (each starting with a newline) for the GPU summary."""
    t = Text()
    t.append(f"\nclocks  sclk {_of(s.sclk_mhz, s.sclk_max_mhz, 'MHz')}   mclk {_of(s.mclk_mhz, s.mclk_max_mhz, 'MHz')}"
             f"   memory busy {_n(s.mem_busy_percent, '.0f', '%')}")
    cap = f" of {_n(s.power_cap_w, '.0f', ' W')} cap" if s.power_cap_w is not None else " (cap n/a)"
    fan = NA if s.fan_rpm is None and s.fan_percent is None else \
        " ".join(x for x in (_n(s.fan_rpm, "d", " RPM") if s.fan_rpm is not None else "",
                             _n(s.fan_percent, ".0f", "%") if s.fan_percent is not None else "") if x)
    t.append(f"\npower   {_n(power_w, '.0f', ' W')}{cap}   fan {fan}")
    t.append("\nPCIe    ")
    low = (s.link_width is not None and s.link_max_width is not None and s.link_width < s.link_max_width) or \
        (s.link_speed_gts is not None and s.link_max_speed_gts is not None and s.link_speed_gts < s.link_max_speed_gts)
    t.append(_link(s.link_speed_gts, s.link_width), style=S["residual"] if low else "")
    t.append(f" (max {_link(s.link_max_speed_gts, s.link_max_width)})")
    temps = "   ".join(f"{name} {value:.0f}C" for name, value in s.temperatures.items()) or NA
    t.append(f"\ntemps   {temps}   throttle ")
    if s.throttle is None:
        t.append(NA)
    else:
        t.append(", ".join(s.throttle) or "none", style=S["residual"] if set(s.throttle) - {"idle"} else "")
    t.append("\nRAS     ")
    if s.ecc_corrected is None and s.ecc_uncorrected is None and s.retired_pages is None:
        t.append(NA)
        return t
    t.append(f"corrected {_n(s.ecc_corrected, 'd')}  uncorrected ")
    t.append(_n(s.ecc_uncorrected, "d"), style=S["phase.bad"] if s.ecc_uncorrected else "")
    bad = [f"{block} ue {c['ue']}" for block, c in s.ras.items() if c.get("ue")]
    if bad:
        t.append(f" ({', '.join(bad)})", style=S["phase.bad"])
    t.append(f"   retired pages {_n(s.retired_pages, 'd')}")
    if s.pending_pages:
        t.append(f" (+{s.pending_pages} pending)", style=S["residual"])
    t.append(f" of threshold {_n(s.bad_page_threshold, 'd')}")
    return t
