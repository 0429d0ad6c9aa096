"""Small text pieces the panels draw with: VRAM bars, sparklines, sizes, ages, signal names.

Pure functions on numbers, so panels stay thin and the pieces are tested without a terminal.
"""

from __future__ import annotations

from rich.text import Text

# Panels call text.sparkline; the fleet table shares it from gpuwarden.ops.foundation.units.
from gpuwarden.ops.foundation.units import fmt_bytes, fmt_used_of, sparkline  # noqa: F401
from gpuwarden.tui.styles import STYLES as S


def bar(used: int | None, total: int | None, width: int, *, residual: int | None = None) -> Text:
    """A bar `width` cells wide: used VRAM filled, the residual part of it in the warning style."""
    if used is None or not total or width <= 0:
        return Text("-".center(max(width, 1)), style="dim")
    frac = min(max(used / total, 0.0), 1.0)
    filled = int(round(frac * width))
    res_cells = 0
    if residual and residual > 0:
        res_cells = min(filled, max(1, int(round(min(residual / total, 1.0) * width))))
    out = Text()
    out.append("█" * (filled - res_cells), style=S["bar.used"])
    out.append("█" * res_cells, style=S["bar.residual"])
    out.append("░" * (width - filled), style=S["bar.free"])
    return out


def size(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def short_size(n: int | None) -> str:
    """"14.0Gi", "512Mi": a size in at most six cells."""
    return "-" if n is None else fmt_bytes(n, compact=True)


def used_of(used: int | None, total: int | None) -> str:
    """"12.0/24Gi" in one unit, short enough for a narrow column."""
    return fmt_used_of(used, total)


def num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else format(value, fmt) + unit


def duration(seconds: float | None) -> str:
    """Compact age: 45s, 12m, 3h04m, 2d05h (seconds only in the first minute, so rows stay still)."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def clip(value: str | None, width: int) -> str:
    value = value or ""
    return value if len(value) <= width else value[: max(width - 1, 0)] + "…"


# Programs that run another program named by their next argument: that one is what the operator looks for.
_RUNNERS = ("python", "bash", "sh", "node", "perl", "ruby", "env", "uv", "torchrun", "deepspeed", "accelerate")


def _runner(name: str) -> bool:
    return any(name == r or (name.startswith(r) and name[len(r):].replace(".", "").isdigit()) for r in _RUNNERS)


def command_line(command: str | None, width: int) -> str:
    """A command line in `width` cells with its program name and arguments first: the whole line when it fits;
    else directories dropped from the program (and from the script a python or shell runs), then cut at the end.
    "/opt/x/.venv/bin/python3 /opt/x/.venv/bin/vllm serve --tp 8" -> "python3 vllm serve --tp 8"."""
    command = command or "(gone)"
    if len(command) <= width:
        return command
    words = command.split(" ")
    if words and "/" in words[0]:
        words[0] = words[0].rsplit("/", 1)[1] or words[0]
    if len(words) > 1 and _runner(words[0]) and "/" in words[1] and not words[1].startswith("-"):
        words[1] = words[1].rsplit("/", 1)[1] or words[1]
    return clip(" ".join(words), width)
