"""The node config's [agent] table: sampling cadence, socket group, kernel-log source, history size, policies.

All policies are off by default; parse() validates each key and names the line of a bad one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import parse_duration, parse_size

BUNDLE_TRIGGERS = ("residual", "crash", "kernel-fault")
KEYS = {
    "interval", "deep_scan_interval", "full_scan_interval", "socket_group", "kmsg", "events_max", "bundle_on",
    "bundle_min_interval", "purge_dead_holders", "drain_on_residual_after",
}


@dataclass(frozen=True)
class AgentConfig:
    interval: float = 1.0  # seconds between refreshes
    deep_scan_interval: float = 30.0  # seconds between scans of new processes' /proc/<pid>/fd for device holders
    full_scan_interval: float = 300.0  # seconds between scans of every process's /proc/<pid>/fd
    socket_group: str | None = None  # group that may use the API socket (mode 0660); None: only the agent's user
    kmsg: str = "auto"  # "auto" (/dev/kmsg, else journalctl -k -f), "off", or a file/FIFO of kernel log lines
    events_max: int = 16 << 20  # bytes of event log before it rotates (one older file is kept)
    bundle_on: tuple[str, ...] = ()  # subset of BUNDLE_TRIGGERS
    bundle_min_interval: float = 1800.0  # at most one policy bundle this often
    purge_dead_holders: bool = False
    drain_on_residual_after: float | None = None  # seconds a residual must last before its GPU is drained

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


Fail = Callable[[str, str, str], GpuwardenError]  # (key, problem, hint) -> the error to raise


def parse(raw: Any, fail: Fail) -> AgentConfig:
    """An AgentConfig from the [agent] table; `fail` builds the error that names file, line and key."""
    if not isinstance(raw, dict):
        raise fail("", "must be a table", "write [agent] with its keys under it")
    for key in raw:
        if key not in KEYS:
            raise fail(key, "unknown key", f"[agent] takes {', '.join(sorted(KEYS))}")
    out: dict[str, Any] = {}

    def seconds(key: str, minimum: float) -> None:
        if key not in raw:
            return
        try:
            value = parse_duration(raw[key])
        except GpuwardenError:
            value = -1.0
        if value < minimum:
            raise fail(key, f"must be a duration of at least {minimum:g}s, got {raw[key]!r}", f'e.g. {key} = "10m"')
        out[key] = value

    seconds("interval", 0.25)
    seconds("deep_scan_interval", 1.0)
    seconds("full_scan_interval", 1.0)
    seconds("bundle_min_interval", 0.0)
    seconds("drain_on_residual_after", 1.0)
    group = raw.get("socket_group")
    if group is not None:
        if not isinstance(group, str) or not group:
            raise fail("socket_group", "must be a group name", 'e.g. socket_group = "gpuops"')
        out["socket_group"] = group
    kmsg = raw.get("kmsg")
    if kmsg is not None:
        if not isinstance(kmsg, str) or not kmsg:
            raise fail("kmsg", 'must be "auto", "off" or a path', 'e.g. kmsg = "off"')
        out["kmsg"] = kmsg
    if "events_max" in raw:
        try:
            out["events_max"] = parse_size(raw["events_max"])
        except (GpuwardenError, AttributeError):
            raise fail("events_max", f"cannot read size {raw['events_max']!r}", 'e.g. events_max = "16MiB"') from None
        if out["events_max"] < 64 << 10:
            raise fail("events_max", "must be at least 64KiB", 'e.g. events_max = "16MiB"')
    triggers = raw.get("bundle_on", [])
    if not isinstance(triggers, list) or any(t not in BUNDLE_TRIGGERS for t in triggers):
        raise fail("bundle_on", f"must be a list of {', '.join(BUNDLE_TRIGGERS)}, got {triggers!r}",
                   'e.g. bundle_on = ["crash", "kernel-fault"]')
    out["bundle_on"] = tuple(dict.fromkeys(triggers))
    purge = raw.get("purge_dead_holders", False)
    if not isinstance(purge, bool):
        raise fail("purge_dead_holders", f"must be true or false, got {purge!r}", "e.g. purge_dead_holders = true")
    out["purge_dead_holders"] = purge
    return AgentConfig(**out)


DEFAULT = AgentConfig()
