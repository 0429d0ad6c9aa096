"""Byte sizes and durations: the one parser of operator input ("14GiB", "14GB"; "90s", "10m", "2h") and the one
formatter of human output (sizes, and series as sparklines for the console and the fleet table).

GiB means 2**30 and GB 10**9, as the units say; a lone letter (24G: GiB or GB?) and a bare number are refused
unless the option is a byte count. Output is binary (GiB), the way GPU memory is sold and reported.
(A foreign format with its own convention, such as the kernel's "kB" that means KiB, keeps its own reader.)
"""

from __future__ import annotations

import re

from gpuwarden.ops.foundation.errors import GpuwardenError

_DECIMAL = {"kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12, "pb": 10 ** 15}
_BINARY = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
# Kubernetes-style binary suffixes without the B ("24Gi") say which they mean just as clearly.
_BINARY.update({k[:-1]: v for k, v in list(_BINARY.items())})
_UNITS = {"b": 1, **_DECIMAL, **_BINARY}
_AMBIGUOUS = {"k", "m", "g", "t", "p"}
_SIZE = r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*"  # compiled at first use: status imports this
_EXAMPLES = "e.g. 512MiB, 24GiB (binary: 2^30) or 24GB (decimal: 10^9)"


def parse_size(text: str | int, *, bare_bytes: bool = False) -> int:
    """Bytes for "24GiB", "24 GB", "1.5TiB", "512Mi"; raise GpuwardenError on anything else.

    A bare number is refused (which unit?) unless `bare_bytes` (the option counts bytes); 0 is 0 anyway.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(_SIZE, str(text))
    if not m:
        raise GpuwardenError(f"cannot read size {text!r}", f"write a number and a unit, {_EXAMPLES}")
    number, unit = m.group(1).replace("_", ""), m.group(2).lower()
    if not unit:
        if bare_bytes or float(number) == 0:
            unit = "b"
        else:
            raise GpuwardenError(f"cannot read size {text!r}: it has no unit",
                                 f"say which: {number}GiB (2^30 bytes each), {number}GB (10^9), {number}MiB, "
                                 f"... or {number}B for bytes")
    if unit in _AMBIGUOUS:
        up = unit.upper()
        raise GpuwardenError(f"cannot read size {text!r}: {up} alone could mean {up}iB or {up}B",
                             f"write {number}{up}iB (binary, 2^{_BINARY[unit + 'ib'].bit_length() - 1}) or "
                             f"{number}{up}B (decimal, 10^{len(str(_DECIMAL[unit + 'b'])) - 1})")
    if unit not in _UNITS:
        raise GpuwardenError(f"cannot read size {text!r}: unknown unit {m.group(2)!r}", _EXAMPLES)
    value = float(number) * _UNITS[unit]
    if value == float("inf"):  # so many digits that the float overflowed
        raise GpuwardenError(f"cannot read size {text!r}: too large", _EXAMPLES)
    if value != int(value) and unit != "b":
        value = round(value)  # "1.3KiB": a whole number of bytes is all anyone can mean
    return int(value)


def fmt_bytes(n: int | None, *, precision: int = 1, compact: bool = False) -> str:
    """'14.0 GiB' ('14.0Gi' compact, for narrow columns); '-' for unknown."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            break
        value /= 1024
    if unit == "B":
        return f"{sign}{int(value)}{'' if compact else ' '}B"
    if compact:  # at most six cells: three digits need no decimals
        return f"{sign}{value:.{0 if value >= 99.95 else precision}f}{unit[:-1]}"
    return f"{sign}{value:.{precision}f} {unit}"


def size_arg(n: int) -> str:
    """`n` bytes as an operator types it in a command, exactly (parse_size reads it back as `n`): the largest
    binary unit that divides it, "256MiB" for 268435456; bytes ("4097B") when none does."""
    for suffix, unit in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return f"{n}B"


def fmt_used_of(used: int | None, total: int | None) -> str:
    """'12.0/24Gi': used and total in the total's unit, short enough for a narrow column."""
    if used is None or total is None:
        return "-"
    for unit, scale in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if total >= scale:
            return f"{used / scale:.1f}/{total / scale:.0f}{unit}" if unit != "Mi" else \
                f"{used / scale:.0f}/{total / scale:.0f}{unit}"
    return f"{used}/{total}B"


_KERNEL = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50, "e": 1 << 60}


def parse_kernel_size(text: str) -> int:
    """A size as the kernel writes it in /proc and mount options (memparse: `1048576k`, `2G`): a bare
    number is bytes and K, M, G, T, P, E are binary. Not for operator input: that is parse_size."""
    m = re.fullmatch(r"\s*([0-9]+)([KkMmGgTtPpEe]?)\s*", str(text))
    if not m:
        raise GpuwardenError(f"cannot read the kernel's size {text!r}", "expected digits and one of K M G T P E")
    return int(m.group(1)) * _KERNEL[m.group(2).lower()]


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
