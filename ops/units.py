"""Byte sizes and durations: parse operator input ("24GiB", "512M", "1.5T"; "90s", "10m", "2h") and format for humans
(sizes, and series as sparklines for the console and the fleet table).

Binary units everywhere (GiB = 2**30), the way GPU memory is sold and reported.
"""

from __future__ import annotations

from .errors import GpuwardenError

_MULT = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """Return bytes for '24GiB', '512m', '4096'; raise GpuwardenError on anything else."""
    if isinstance(text, int):
        return text
    raw = text.strip().replace("_", "")
    num_end = 0
    while num_end < len(raw) and (raw[num_end].isdigit() or raw[num_end] == "."):
        num_end += 1
    number, unit = raw[:num_end], raw[num_end:].strip().lower()
    if not number or unit not in _MULT:
        raise GpuwardenError(
            f"cannot read size {text!r}",
            "write a number with an optional unit, e.g. 512MiB, 24GiB, 1.5TiB",
        )
    try:
        return int(float(number) * _MULT[unit])
    except (ValueError, OverflowError):  # "1.2.3", or so many digits that the float is infinite
        raise GpuwardenError(f"cannot read size {text!r}", "e.g. 24GiB") from None


def fmt_bytes(n: int | None, *, precision: int = 1) -> str:
    """'14.0 GiB' style; '-' for unknown."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    return f"{sign}{value:.{precision}f} TiB"


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float) -> float:
    """'90', '90s', '15m', '2h', '1d' -> seconds; raise GpuwardenError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and text >= 0:
        return float(text)
    raw = str(text).strip().lower()
    num_end = 0
    while num_end < len(raw) and (raw[num_end].isdigit() or raw[num_end] == "."):
        num_end += 1
    number, unit = raw[:num_end], raw[num_end:].strip()
    try:
        if number and unit in _SECONDS:
            return float(number) * _SECONDS[unit]
    except ValueError:  # "1.2.3"
        pass
    raise GpuwardenError(f"cannot read the duration {text!r}", "write it like 30s, 15m, 2h or 1d")


_TICKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int) -> str:
    """The last `width` fractions (0..1) as block characters; blanks where there is no history yet."""
    if width <= 0:
        return ""
    tail = values[-width:]
    cells = []
    for v in tail:
        v = min(max(v, 0.0), 1.0)
        cells.append(_TICKS[min(int(v * len(_TICKS)), len(_TICKS) - 1)])
    return " " * (width - len(tail)) + "".join(cells)
