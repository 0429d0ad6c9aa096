"""Show a triage Report: text for people (triage.md, the CLI), a gpuwarden.triage/1 document for scripts.

The first line is the headline (the top finding and what it led to), then a summary in causal order.
Everything quoted from a log passes through sanitize(): a log line can carry terminal escapes.
"""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.ops.foundation import redact
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.foundation.jsondoc import iso, document, dumps
from gpuwarden.ops.triage.findings import Finding, Report, line_of
from gpuwarden.ops.triage.groups import SUMMARY_MAX, group

_MARK = {"critical": "CRITICAL", "error": "ERROR", "warning": "warning", "info": "info"}
SCHEMA = "triage"


def sanitize(text: str) -> str:
    """Text quoted from a log made safe to show: secrets redacted (ops/foundation/redact, every sink's one list), control
    characters as visible escapes (\\x1b, ops/foundation/safetext), so printing a log line can neither leak a token nor
    drive the terminal."""
    return printable(redact.text(text) if len(text) > 7 else text, newlines=True)


def clean(value: Any) -> Any:
    """Every string inside a JSON-like value through sanitize()."""
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


def headline(report: Report) -> str:
    text = report.headline()
    if text is not None:
        return sanitize(text)
    where = "in the snapshot" if report.source == "no kernel log" else (
        "in the log" if report.lines else "(the log was empty)")
    return f"no problems found {where}"


def summary_lines(report: Report, limit: int = 12) -> list[str]:
    lines = [sanitize(s) for s in report.summary()]
    if not lines:
        return [headline(report)]
    more = len(lines) - limit
    return lines[:limit] + ([f"... and {more} more (see triage.md)"] if more > 0 else [])


def timeline_lines(report: Report, limit: int = 30) -> list[str]:
    """Warnings and worse by where they first appear: what went wrong first is often the cause. One line per
    group (the same failure on several devices appears once, at its first device)."""
    firsts = [g.first for g in group([f for f in report.ordered() if f.severity != "info"])]
    shown = sorted((f for f in firsts if f.first_line is not None), key=lambda f: f.first_line or 0)
    return [sanitize(f"{f.first_stamp or f'line {f.first_line}'}: {f.title}") for f in shown[:limit]]


def _victim(v: dict[str, object]) -> str:
    parts = [f"{v.get('process', '?')}[{v.get('pid', '?')}]"]
    for key in ("engine", "thread", "ip", "address", "error", "cpu", "constraint", "reason", "stamp"):
        if v.get(key) not in (None, ""):
            parts.append(f"{key}={v[key]}")
    for key in ("anon_rss", "vram"):
        size = v.get(key)
        if isinstance(size, int):
            parts.append(f"{key.replace('_', '-')}={fmt_bytes(size)}")
    return sanitize(" ".join(str(p) for p in parts))


def _details(f: Finding) -> str:
    shown = {k: v for k, v in f.details.items() if v not in (None, [], "") and k != "short"}
    return sanitize("; ".join(f"{k}={', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in shown.items()))


def known_lines(report: Report, limit: int = 12) -> list[str]:
    """One bullet per matching catalog entry: what it is, which finding, versions, what to do, where upstream."""
    out = []
    for k in report.known[:limit]:
        text = f"- `{k['id']}`: {k['title']} (matches `{k['rule']}`; versions: {k['versions']})"
        if k.get("because"):
            text += f"; ranked first on this node's evidence: {k['because'].rstrip('.')}"
        elif k.get("needs"):
            text += "; to rank it, triage needs " + "; ".join(k["needs"])
        if k.get("workaround"):
            text += f"; workaround: {k['workaround'].rstrip('.')}"
        if k.get("fixed_in"):
            text += f"; fixed in: {k['fixed_in'].rstrip('.')}"
        out.append(sanitize(text + f"; {k['url']}"))
    more = len(report.known) - limit
    return out + ([f"- ... and {more} more (`triage --json`: known_issues)"] if more > 0 else [])


# The Markdown report stays readable whatever the log: findings are written in group order until this many
# bytes are out, the rest named by count (the --json document carries every one). Each finding is capped
# (MAX_EXAMPLES, MAX_VICTIMS, MAX_DETAIL_VALUES), so one block stays far below the headroom to REPORT_MAX.
REPORT_MAX = 256 * 1024
FINDINGS_BUDGET = 200 * 1024
FULL_PER_GROUP = 3  # members of a group written in full; the rest one line each
BRIEF_PER_GROUP = 40


def _when(f: Finding) -> str:
    when = f.first_stamp or (f"line {f.first_line}" if f.first_line else "")
    if f.count > 1 and when and (f.last_stamp or f.last_line):
        when = f"{when} … {f.last_stamp or f'line {f.last_line}'}"
    return when


def _finding_block(f: Finding) -> list[str]:
    out = [f"### [{_MARK.get(f.severity, f.severity)}] {sanitize(line_of(f))}", ""]
    when = _when(f)
    out.append(f"- category: {f.category} · rule: `{f.rule}` · occurrences: {f.count}"
               + (f" · when: {sanitize(when)}" if when else ""))
    if f.devices:
        out.append(f"- devices: {sanitize(', '.join(f.devices))}")
    if f.meaning:
        out.append(f"- meaning: {sanitize(f.meaning)}")
    if f.check:
        out.append(f"- first check: {sanitize(f.check)}")
    if f.victims:
        out.append(f"- victims ({len(f.victims)}):")
        out += [f"  - {_victim(v)}" for v in f.victims]
    details = _details(f)
    if details:
        out.append("- details: " + details)
    if f.examples:
        out += ["", "```"] + [sanitize(e) for ex in f.examples for e in ex.splitlines()] + ["```"]
    out.append("")
    return out


def markdown(report: Report) -> str:
    counts = report.counts()
    found = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    out = [headline(report), "",
           f"Triage of {sanitize(report.source or 'log')}: {report.lines} lines read; "
           + (f"findings: {found}" if report.findings else "no findings") + ".", "", "## Summary", ""]
    out += [f"- {line}" for line in summary_lines(report, limit=SUMMARY_MAX)]
    timeline = timeline_lines(report)
    if len(timeline) > 1:
        out += ["", "## Timeline (first occurrence of each problem, in log order)", ""] + [f"- {t}" for t in timeline]
    if report.known:
        out += ["", "## Known issues that match (`gpuwarden known ID` for the whole entry)", ""]
        out += known_lines(report)
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {sanitize(n)}" for n in report.notes]
    if report.findings:
        out += ["", "## Findings", ""]
    size = sum(len(line.encode()) + 1 for line in out)
    left = 0
    for g in group(report.ordered()):
        if left or size > FINDINGS_BUDGET:
            left += len(g.members)
            continue
        for i, f in enumerate(g.members):
            if i == FULL_PER_GROUP:  # the rest of a group: one line each, they differ only in the device
                rest = g.members[i:]
                block = ["#### more of the same", ""] + [
                    f"- {sanitize(line_of(m))} · {sanitize(_when(m))}" for m in rest[:BRIEF_PER_GROUP]]
                if len(rest) > BRIEF_PER_GROUP:
                    block.append(f"- ... and {len(rest) - BRIEF_PER_GROUP} more (`triage --json`)")
                block.append("")
            else:
                block = _finding_block(f)
            out += block
            size += sum(len(line.encode()) + 1 for line in block)
            if i == FULL_PER_GROUP:
                break
    if left:
        out += [f"... and {left} more findings not shown, to keep this report under {REPORT_MAX // 1024} KiB: "
                "`gpuwarden triage --json` has every one with its details.", ""]
    text = "\n".join(out).rstrip() + "\n"
    if len(text.encode()) > REPORT_MAX:  # only where the sections above the findings are themselves huge
        cut = text.encode()[:REPORT_MAX - 200].decode(errors="ignore")
        text = cut[:cut.rfind("\n") + 1] + "... (cut here to stay under 256 KiB; `triage --json` has the rest)\n"
    return text


def _iso_times(d: dict[str, Any], f: Finding) -> None:
    for name in ("first_time", "last_time"):
        value = d.get(name)
        # seconds since boot (dmesg [mono]) have no calendar date; epoch seconds do
        d[f"{name}_iso"] = iso(value) if f.time_base == "epoch" and isinstance(value, (int, float)) else None


def as_document(report: Report) -> dict[str, Any]:
    """The gpuwarden.triage/1 document (ops/schemas/triage.v1.json)."""
    body = report.to_dict()
    for d, f in zip(body["findings"], report.ordered()):
        _iso_times(d, f)
    now = time.time()
    body = {"generated": now, "generated_iso": iso(now), "exit_code": report.exit_code(), **body}
    return document(SCHEMA, clean(body))


def as_json(report: Report, indent: int | None = 2) -> str:
    return dumps(as_document(report), indent=indent)
