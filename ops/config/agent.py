"""The node config's [agent] table: sampling cadence, socket group, kernel-log source, history size, policies.

All policies are off by default; its keys, types and limits are ops/config/keys.py's section "agent".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.config import keys, schema

BUNDLE_TRIGGERS = keys.key("agent", "bundle_on").choices
KEYS = set(keys.section("agent"))


def _d(name: str) -> Any:
    return keys.default("agent", name)


@dataclass(frozen=True)
class AgentConfig:
    interval: float = _d("interval")  # seconds between refreshes
    deep_scan_interval: float = _d("deep_scan_interval")  # seconds between scans of new processes' fds
    full_scan_interval: float = _d("full_scan_interval")  # seconds between scans of every process's fds
    socket_group: str | None = _d("socket_group")  # group that may use the API socket (mode 0660)
    kmsg: str = _d("kmsg")  # "auto" (/dev/kmsg, else journalctl -k -f), "off", or a file/FIFO of kernel log lines
    events_max: int = _d("events_max")  # bytes of event log before it rotates (one older file is kept)
    bundle_on: tuple[str, ...] = _d("bundle_on")  # subset of BUNDLE_TRIGGERS
    bundle_min_interval: float = _d("bundle_min_interval")  # at most one policy bundle this often
    purge_dead_holders: bool = _d("purge_dead_holders")
    drain_on_residual_after: float | None = _d("drain_on_residual_after")  # seconds before a residual GPU drains

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


Fail = Callable[[str, str, str], Exception]  # (key, problem, hint) -> the error to raise


def parse(raw: Any, fail: Fail, report: Callable[[Any], None] | None = None) -> AgentConfig:
    """An AgentConfig from the [agent] table; `fail` builds the error that names file, line and key.

    Without `report` the first error is raised; with it each is reported and the valid keys are kept."""
    if not isinstance(raw, dict):
        raise fail("", "must be a table", "write [agent] with its keys under it")
    values, problems = schema.check_table(raw, keys.section("agent"), "[agent]")
    errors = [fail(key or "", problem, hint) for key, _sub, problem, hint in problems]
    if errors and report is None:
        raise errors[0]
    for exc in errors:
        report(exc)  # type: ignore[misc]
    return AgentConfig(**values)


DEFAULT = AgentConfig()
