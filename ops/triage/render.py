"""Show a triage Report: markdown for people (triage.md, the CLI), JSON for scripts (triage.json).

The summary comes first and leads with shared crash signatures, then critical and error findings.
"""

from __future__ import annotations

import json

from ..units import fmt_bytes
from .findings import Report

_MARK = {"critical": "CRITICAL", "error": "ERROR", "warning": "warning", "info": "info"}


def summary_lines(report: Report, limit: int = 12) -> list[str]:
    lines = report.summary()
    if not lines:
        where = "in the snapshot" if report.source == "no kernel log" else (
            "in the kernel log" if report.lines else "(the kernel log was empty)")
        return [f"no problems found {where}"]
    more = len(lines) - limit
    return lines[:limit] + ([f"... and {more} more (see triage.md)"] if more > 0 else [])


def timeline_lines(report: Report, limit: int = 30) -> list[str]:
    """Warnings and worse by where they first appear: what went wrong first is often the cause."""
    shown = sorted((f for f in report.findings if f.severity != "info" and f.first_line is not None),
                   key=lambda f: f.first_line)
    return [f"{f.first_stamp or f'line {f.first_line}'}: {f.title}" for f in shown[:limit]]


def _victim(v: dict) -> str:
    parts = [f"{v.get('process', '?')}[{v.get('pid', '?')}]"]
    for key in ("engine", "thread", "ip", "address", "error", "cpu", "constraint", "reason", "stamp"):
        if v.get(key) not in (None, ""):
            parts.append(f"{key}={v[key]}")
    for key in ("anon_rss", "vram"):
        if isinstance(v.get(key), int):
            parts.append(f"{key.replace('_', '-')}={fmt_bytes(v[key])}")
    return " ".join(parts)


def markdown(report: Report) -> str:
    counts = report.counts()
    out = [f"# Triage: {report.source or 'log'}", "",
           f"{report.lines} lines read; findings: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) if
           report.findings else f"{report.lines} lines read; no findings.", "", "## Summary", ""]
    out += [f"- {line}" for line in summary_lines(report, limit=50)]
    timeline = timeline_lines(report)
    if len(timeline) > 1:
        out += ["", "## Timeline (first occurrence of each problem, in log order)", ""] + [f"- {t}" for t in timeline]
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    if report.findings:
        out += ["", "## Findings", ""]
    for f in report.ordered():
        out.append(f"### [{_MARK.get(f.severity, f.severity)}] {f.title}")
        out.append("")
        when = f.first_stamp or (f"line {f.first_line}" if f.first_line else "")
        if f.count > 1:
            when = f"{when} … {f.last_stamp or f'line {f.last_line}'}"
        out.append(f"- category: {f.category} · rule: `{f.rule}` · occurrences: {f.count}"
                   + (f" · when: {when}" if when else ""))
        if f.devices:
            out.append(f"- devices: {', '.join(f.devices)}")
        if f.meaning:
            out.append(f"- meaning: {f.meaning}")
        if f.victims:
            out.append(f"- victims ({len(f.victims)}):")
            out += [f"  - {_victim(v)}" for v in f.victims]
        shown = {k: v for k, v in f.details.items() if v not in (None, [], "")}
        if shown:
            out.append("- details: " + "; ".join(
                f"{k}={', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in shown.items()))
        if f.examples:
            out += ["", "```"] + [e for ex in f.examples for e in ex.splitlines()] + ["```"]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def as_json(report: Report, indent: int | None = 2) -> str:
    return json.dumps(report.to_dict(), indent=indent, default=str)
