"""The API's query parameters: each endpoint names what it takes, every value is checked, mistakes are 400s.

A parse error names the parameter and what it accepts, so `curl` users see what to fix.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import overload
from urllib.parse import parse_qsl

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import parse_duration

MAX_QUERY = 2048


class BadRequest(Exception):
    """A request the API refuses with 400; the message says what was wrong."""


def parse(query: str, allowed: dict[str, str]) -> dict[str, str]:
    """name -> value for a query string; `allowed` is name -> what it takes (for the error message)."""
    if len(query) > MAX_QUERY:
        raise BadRequest(f"query string longer than {MAX_QUERY} characters")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=len(allowed) + 1,
                          errors="strict")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"cannot read the query string ({exc})") from None
    out: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            takes = ", ".join(f"{k} ({v})" for k, v in allowed.items()) or "no parameters"
            raise BadRequest(f"unknown parameter {name!r}: this endpoint takes {takes}")
        if name in out:
            raise BadRequest(f"parameter {name!r} given twice")
        out[name] = value
    return out


@overload
def integer(params: dict[str, str], name: str, lo: int, hi: int, default: int) -> int: ...
@overload
def integer(params: dict[str, str], name: str, lo: int, hi: int, default: None = None) -> int | None: ...
def integer(params: dict[str, str], name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise BadRequest(f"{name} must be a whole number from {lo} to {hi}, got {raw[:40]!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be from {lo} to {hi}, got {value}")
    return value


def flag(params: dict[str, str], name: str) -> bool:
    raw = params.get(name)
    if raw is None:
        return False
    if raw not in ("0", "1", "true", "false"):
        raise BadRequest(f"{name} must be 1 or 0, got {raw[:40]!r}")
    return raw in ("1", "true")


def choice(params: dict[str, str], name: str, options: tuple[str, ...], default: str) -> str:
    raw = params.get(name, default)
    if raw not in options:
        raise BadRequest(f"{name} must be one of {', '.join(options)}, got {raw[:40]!r}")
    return raw


def moment(params: dict[str, str], name: str, now: float | None = None) -> float | None:
    """A point in time: a duration back from now ("2h"), seconds since the epoch, or ISO-8601."""
    raw = params.get(name)
    if raw is None:
        return None
    now = time.time() if now is None else now
    text = raw.strip()
    if text and (text[-1:].isalpha() and text[:-1].replace(".", "", 1).isdigit()):
        try:
            return now - parse_duration(text)
        except GpuwardenError:
            pass
    try:
        value = float(text)
        if value == value and 0 <= value < 1e11:  # not NaN, not absurd
            return value
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return when.timestamp()
    except (ValueError, OverflowError, OSError):
        pass
    raise BadRequest(f"{name} must be a duration back from now (30m, 2h, 1d), seconds since the epoch, or an "
                     f"ISO-8601 time, got {raw[:40]!r}")
