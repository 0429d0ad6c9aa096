"""How many hosts a fleet may name, and Slurm hostlists counted before they are expanded.

`gpu[1-99999999]` is eight characters and a hundred million names: every range is sized by arithmetic first,
and nothing is expanded past the fleet's cap (MAX_HOSTS).
"""

from __future__ import annotations

import re

from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError

# One operator's fleet from one terminal: far above any rack or pod, far below what would eat the console's memory.
MAX_HOSTS = 5000
CAP_HINT = (f"a fleet command takes at most {MAX_HOSTS:,} hosts: narrow the range, or split the fleet into "
            "several inventories (one per rack or pod)")

# Inside brackets, ClusterShell's range syntax: N, N-M or N-M/STEP, negative bounds allowed (`-8--4`).
_SUBRANGE = re.compile(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*(?:/\s*(\d+)\s*)?)?")
# Between the terms of a nodeset, ClusterShell's operators: union, difference, intersection, symmetric difference.
_OPERATORS = ",!&^"


class HostBudget:
    """The hosts one fleet command may still name, shared by all its inventories: each expansion asks first."""

    def __init__(self, limit: int = MAX_HOSTS, unit: str = "hosts"):
        self.limit = limit
        self.unit = unit
        self.used = 0

    def take(self, count: int, what: str) -> None:
        """Count `count` more hosts for `what` (a line, a pattern), or refuse before any of them exists."""
        if count > self.limit:
            raise ConfigError(f"{what} names {count:,} {self.unit}, more than the {self.limit:,} a fleet command "
                              "takes", CAP_HINT)
        if self.used + count > self.limit:
            raise ConfigError(f"{what} brings the fleet to {self.used + count:,} {self.unit}, more than the "
                              f"{self.limit:,} a fleet command takes", CAP_HINT)
        self.used += count


def _bracket_size(body: str, pattern: str) -> int:
    total = 0
    for part in body.split(","):
        m = _SUBRANGE.fullmatch(part)
        if m is None:
            raise _not_a_hostlist(pattern, f"[{body}] is not a list of N or N-M ranges")
        begin, end, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if step < 1:
            raise _not_a_hostlist(pattern, f"step {step} in [{body}] must be 1 or more")
        total += max(0, (end - begin) // step + 1)
    return total


def _term_size(term: str, pattern: str) -> int:
    """Names in one term of a nodeset: the product of its bracket sizes (`n[1-10]x[1-4]` is 40)."""
    size, rest = 1, term
    while "[" in rest:
        head, _, rest = rest.partition("[")
        if "]" in head:
            raise _not_a_hostlist(pattern, "a ] without its [")
        body, closed, rest = rest.partition("]")
        if not closed or "[" in body:
            raise _not_a_hostlist(pattern, "a [ without its ]")
        size *= _bracket_size(body, pattern)
    if "]" in rest:
        raise _not_a_hostlist(pattern, "a ] without its [")
    return size


def nodeset_size(pattern: str) -> int:
    """An upper bound of the names `pattern` expands to, and of the names ClusterShell builds on the way:
    each term's ranges multiplied, the terms added (a difference or intersection still builds both sides)."""
    total, depth, start = 0, 0, 0
    for i, c in enumerate(pattern + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise _not_a_hostlist(pattern, "a ] without its [")
        elif c in _OPERATORS and (depth == 0 or i == len(pattern)):
            if depth:
                raise _not_a_hostlist(pattern, "a [ without its ]")
            term = pattern[start:i].strip()
            if term:
                total += _term_size(term, pattern)
            start = i + 1
    return total


def _not_a_hostlist(pattern: str, why: str) -> GpuwardenError:
    return GpuwardenError(f"{pattern!r} is not a hostlist: {why}",
                          "write it as Slurm does, e.g. 'gpu[01-16],gpu-b[1-4]'")
