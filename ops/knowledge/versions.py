"""Version ranges of a catalog entry (">=6.10,<6.14") and the versions a node reports, compared as numbers.

Versions are dotted numbers with anything after them ignored ("6.8.0-45-generic" is 6.8.0, "570.124.06" is
570.124.6); a range is comma-separated clauses that must all hold. Unparseable means unknown, never a match.
"""

from __future__ import annotations

import re

_NUM = re.compile(r"\d+(?:\.\d+){0,5}")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+){0,5})\s*$")
COMPONENTS = ("kernel", "amdgpu", "rocm", "nvidia", "cuda")


def parse(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    m = _NUM.search(str(version))
    return tuple(int(p) for p in m.group(0).split(".")) if m else None


def check_range(spec: str) -> str | None:
    """Why a range is malformed, or None when every clause reads."""
    for clause in spec.split(","):
        if not _CLAUSE.match(clause):
            return f"bad version clause {clause.strip()!r} (write e.g. '>=6.10' or '<570.86')"
    return None


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def in_range(version: str | None, spec: str) -> bool | None:
    """True/False when the version is known and the range reads, None when either is not."""
    have = parse(version)
    if have is None:
        return None
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if not m:
            return None
        op, want = m.group(1) or "==", tuple(int(p) for p in m.group(2).split("."))
        c = _cmp(have, want) if op != "==" else _cmp(have[:len(want)], want)
        ok = {">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0, "==": c == 0, "!=": c != 0}[op]
        if not ok:
            return False
    return True
