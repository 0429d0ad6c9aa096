"""Findings grouped by rule and device class: one line for "the same failure on eight GPUs" in a storm.

A group is every finding of one rule whose title reads the same once the device addresses in it are blanked
(the device class); it keeps the members' total count, the devices and the first/last stamps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.ops.triage.findings import Finding, line_of
from gpuwarden.ops.triage.plan import DEVICE

SUMMARY_MAX = 30  # summary lines whatever the log: an operator reading a storm needs a page, not a book
_SHOW_DEVICES = 4


@dataclass
class Group:
    rule: str
    key: str  # the title with every device address blanked
    members: list[Finding] = field(default_factory=list)

    @property
    def lead(self) -> Finding:
        return self.members[0]

    @property
    def count(self) -> int:
        return sum(f.count for f in self.members)

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(d for f in self.members for d in f.devices))

    @property
    def first(self) -> Finding:
        return min(self.members, key=lambda f: f.first_line or 0)

    @property
    def last(self) -> Finding:
        return max(self.members, key=lambda f: f.last_line or 0)

    def when(self) -> str:
        """First and last stamp (line numbers where the log has no stamps) over every member."""
        first, last = self.first, self.last
        a = first.first_stamp or (f"line {first.first_line}" if first.first_line else "")
        b = last.last_stamp or (f"line {last.last_line}" if last.last_line else "")
        return a if not b or b == a else f"{a} … {b}"

    def line(self) -> str:
        """One summary line: a lone finding reads as before (line_of); a group names how many devices, which
        ones (the first few), the total count and when it started and stopped."""
        if len(self.members) == 1:
            return line_of(self.lead)
        devices = self.devices
        n = len(self.members)
        shown = ", ".join(devices[:_SHOW_DEVICES]) + (f" +{len(devices) - _SHOW_DEVICES} more"
                                                     if len(devices) > _SHOW_DEVICES else "")
        if len(devices) > 1 and "<dev>" in self.key:
            text = self.key.replace("<dev>", f"{len(devices)} devices", 1).replace("<dev>", "…") + f" ({shown})"
        elif len(devices) > 1:  # the title names no device (the findings do): say which
            text = f"{self.key} on {len(devices)} devices ({shown})"
        else:  # one device or none: members differ in what the title leaves out (details, signature)
            text = f"{self.lead.title} ({n} kinds)"
        when = self.when()
        return text + f" (x{self.count}" + (f", {when}" if when else "") + ")"


def device_class(f: Finding) -> str:
    """The finding's title with device addresses blanked: findings that differ only in the device are one group."""
    return DEVICE.sub("<dev>", f.title)


def group(ordered: list[Finding]) -> list[Group]:
    """Groups in the order of their first member (ordered is Report.ordered(): causal order)."""
    out: dict[tuple[str, str, str], Group] = {}
    for f in ordered:
        key = device_class(f)
        g = out.get((f.rule, f.severity, key))
        if g is None:
            g = out[(f.rule, f.severity, key)] = Group(f.rule, key)
        g.members.append(f)
    return list(out.values())


def summary(ordered: list[Finding], limit: int = SUMMARY_MAX) -> list[str]:
    """At most `limit` lines (warnings and worse): one per group, the last saying what did not fit."""
    groups = [g for g in group([f for f in ordered if f.severity != "info"])]
    if len(groups) <= limit:
        return [g.line() for g in groups]
    rest = groups[limit - 1:]
    by_severity: dict[str, int] = {}
    for g in rest:
        by_severity[g.lead.severity] = by_severity.get(g.lead.severity, 0) + len(g.members)
    found = ", ".join(f"{n} {s}" for s, n in by_severity.items())
    return [g.line() for g in groups[:limit - 1]] + [
        f"... and {len(rest)} more groups ({found}; the report's Findings and `triage --json` list every one)"]
