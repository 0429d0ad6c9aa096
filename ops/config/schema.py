"""The checks behind each key type of ops/config/keys.py, and one table's check that collects every error.

A check returns the value as gpuwarden uses it (seconds as float, sizes as bytes, lists as tuples) or raises Bad.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from gpuwarden.ops.config.keys import Key, path_problem
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.regexshape import nested_repeat
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.interrupts import signal_name
from gpuwarden.ops.foundation.units import fmt_bytes, parse_duration, parse_size

MAX_PATTERN = 1024
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # fullmatch: no trailing newline
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GATE_RELEASE_RE = re.compile(r"^(registered|ready|(\d+(\.\d+)?)s)$")


class Bad(Exception):
    """What is wrong with one value: `problem`; `hint` (else the key's own); `sub`, a path below the key
    (("env", "X")); `more`, further Bads of the same value (each entry of a table)."""

    def __init__(self, problem: str, hint: str | None = None, sub: tuple[str, ...] = (),
                 more: Iterable["Bad"] = ()):
        super().__init__(problem)
        self.problem, self.hint, self.sub, self.more = problem, hint, sub, list(more)


def show(value: Any) -> str:
    text = printable(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _path(k: Key, v: Any) -> str:
    problem = path_problem(k, v)
    if problem:
        raise Bad(problem.replace(repr(v), show(v)))
    return str(v)


def _str(k: Key, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise Bad(f"must be a non-empty string, got {show(v)}")
    return v


def _text(k: Key, v: Any) -> str:
    if not isinstance(v, str):
        raise Bad(f"must be a string, got {show(v)}")
    return v


def _int(k: Key, v: Any) -> int:
    low, high = int(k.low or 0), k.high
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        most = f" and at most {int(high)}" if high is not None else ""
        raise Bad(f"must be a whole number of at least {low}{most}, got {show(v)}")
    return v


def _gpu(k: Key, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= (k.high or 0):
        raise Bad(f"must be a GPU index (0, 1, ...), got {show(v)}")
    return v


def _seconds(k: Key, v: Any) -> float:
    low, high = k.low or 0.0, k.high if k.high is not None else math.inf
    if not _number(v) or not math.isfinite(v) or not low <= v <= high:
        raise Bad(f"must be a number of seconds from {low:g} to {high:g}, got {show(v)}", f"e.g. {k.name} = 30")
    return float(v)


def _duration(k: Key, v: Any) -> float:
    try:
        seconds = parse_duration(v)
    except GpuwardenError:
        raise Bad(f"cannot read duration {show(v)}") from None
    if (k.low is not None and seconds < k.low) or (k.high is not None and seconds > k.high):
        raise Bad(f"must be a duration of at least {k.low or 0:g}s"
                  + (f" and at most {k.high:g}s" if k.high is not None else "") + f", got {show(v)}")
    return seconds


def _size(k: Key, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise Bad(f"cannot read size {show(v)}")
    try:
        n = parse_size(v)
    except GpuwardenError:
        raise Bad(f"cannot read size {show(v)}") from None
    low, high = int(k.low or 0), k.high
    if n < low or (high is not None and n > high):
        if high is None:
            raise Bad(f"must be at least {fmt_bytes(low)}, got {show(v)}")
        raise Bad(f"must be from {fmt_bytes(low)} to {fmt_bytes(int(high))}, got {show(v)}")
    return n


def _bool(k: Key, v: Any) -> bool:
    if not isinstance(v, bool):
        raise Bad(f"must be true or false, got {show(v)}")
    return v


def _choice(k: Key, v: Any) -> str:
    if not isinstance(v, str) or v not in k.choices:
        raise Bad(f"must be one of {', '.join(k.choices)}, got {show(v)}")
    return v


def _choices(k: Key, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or any(not isinstance(t, str) or t not in k.choices for t in v):
        raise Bad(f"must be a list of {', '.join(k.choices)}, got {show(v)}")
    return tuple(dict.fromkeys(v))


def _names(k: Key, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(d, str) and d for d in v):
        raise Bad(f"must be a list of names, got {show(v)}")
    return tuple(v)


def _name(k: Key, v: Any) -> str:
    if not isinstance(v, str) or not NAME_RE.fullmatch(v):
        raise Bad(f"needs name: letters, digits, '.', '_' or '-', got {show(v)}")
    return v


def _argv(k: Key, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(a, str) for a in v) or len(v) > 4096:
        raise Bad("argv must be a non-empty list of strings")
    if not v[0] or any("\0" in a for a in v):
        raise Bad("argv cannot hold an empty program name or a NUL character",
                  "the program is argv[0]; each argument is one string")
    return tuple(v)


def _env(k: Key, v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        raise Bad('must be a table of NAME = "value"')
    out, bad = {}, []
    for name, value in v.items():
        if not ENV_NAME_RE.fullmatch(name):
            bad.append(Bad(f"{show(name)} is not a variable name (letters, digits and '_', no '=')", sub=(name,)))
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)) or "\0" in str(value):
            bad.append(Bad(f"must be a string without NUL, got {show(value)}", sub=(name,)))
        else:
            out[name] = str(value)
    if bad:
        raise Bad(bad[0].problem, sub=bad[0].sub, more=bad[1:])
    return out


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` may not follow an engine's log (None when it may): too long, not valid, or shaped to
    backtrack catastrophically (a repeat inside a repeat) on a long line. Checked once, when the config is."""
    if len(pattern) > MAX_PATTERN:
        return f"a pattern of {len(pattern)} characters; at most {MAX_PATTERN}"
    if "\0" in pattern:
        return "a pattern cannot hold a NUL character"
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return f"not a valid regular expression ({printable(str(exc))})"
    if compiled.groups > 32:
        return f"{compiled.groups} groups; a log pattern needs a few at most"
    if nested_repeat(pattern):
        return "a repeat inside a repeat (like (a+)+ or (\\w*\\s?)*) can take forever on a long line"
    return None


def _regex(k: Key, v: Any) -> str:
    if not isinstance(v, str):
        raise Bad("must be a regular expression string", f'e.g. {k.name} = "session is up"')
    problem = regex_problem(v)
    if problem:
        raise Bad(problem, "Python `re` syntax; keep it simple: a literal phrase the engine prints, e.g. "
                           '"session is up"; escape literal brackets with \\\\')
    return v


def _signal(k: Key, v: Any) -> str:
    name = signal_name(v) if isinstance(v, str) else None
    if name is None:
        raise Bad(f"unknown signal {show(v)}")
    return name


def _gate_release(k: Key, v: Any) -> str:
    if not isinstance(v, str) or not GATE_RELEASE_RE.match(v.strip()):
        raise Bad(f'must be "registered", "ready" or a number of seconds like "30s", got {show(v)}')
    return v.strip()


CHECKS: dict[str, Callable[[Key, Any], Any]] = {
    "path": _path, "str": _str, "text": _text, "int": _int, "gpu": _gpu, "seconds": _seconds,
    "duration": _duration, "size": _size, "bool": _bool, "choice": _choice, "choices": _choices,
    "names": _names, "name": _name, "argv": _argv, "env": _env, "regex": _regex, "signal": _signal,
    "gate_release": _gate_release,
}

# (key or None for the table itself, sub-path, problem, hint): an error for the caller to place (file:line).
Problem = tuple["str | None", tuple[str, ...], str, str]


def check_value(k: Key, value: Any) -> Any:
    """The checked value of one key; raises Bad."""
    return CHECKS[k.type](k, value)


def check_table(raw: dict[str, Any], keys: dict[str, Key], label: str,
                skip: Callable[[Key], bool] = lambda k: False, require: bool = True,
                ) -> tuple[dict[str, Any], list[Problem]]:
    """(the valid values given, every problem): unknown keys, bad values, and (with `require`) required keys
    missing. Keys `skip` names are unknown here ([defaults] has no engine names)."""
    known = {name: k for name, k in keys.items() if not skip(k)}
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, value in raw.items():
        k = known.get(name)
        if k is None:
            problems.append((name, (), "unknown key", f"{label} takes {', '.join(sorted(known))}"))
            continue
        try:
            values[name] = check_value(k, value)
        except Bad as bad:
            for b in (bad, *bad.more):
                problems.append((name, b.sub, b.problem, b.hint or k.hint or f"e.g. {name} = ..."))
    if require:
        problems.extend(missing(raw, known))
    return values, problems


def missing(raw: dict[str, Any], keys: dict[str, Key]) -> list[Problem]:
    """A problem for each required key `raw` lacks (placed on the table itself)."""
    return [(None, (), f"needs {name}, a string" if k.type == "path" else
             f"{name} must be a non-empty list of strings" if k.type == "argv" else
             f"needs {name}: letters, digits, '.', '_' or '-', got None", k.hint or "")
            for name, k in keys.items() if k.required and name not in raw]


def defaults(keys: dict[str, Key]) -> dict[str, Any]:
    return {name: k.default for name, k in keys.items()}
