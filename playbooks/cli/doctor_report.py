"""The doctor's report for a terminal: what is wrong first, each with its reason and fix; passes one line each.

Plain text, wrapped to the terminal's width; colour only when the output is a terminal and NO_COLOR is unset.
"""

from __future__ import annotations

import os
import textwrap

from gpuwarden.ops.doctor.model import FAIL, PASS, SKIP, UNKNOWN, WARN
from gpuwarden.ops.doctor.runner import Report

LABEL = {FAIL: "FAIL", WARN: "WARN", UNKNOWN: "????", PASS: "ok", SKIP: "--"}
COLOUR = {FAIL: "\x1b[1;31m", WARN: "\x1b[33m", UNKNOWN: "\x1b[36m", PASS: "\x1b[32m", SKIP: "\x1b[2m"}
INDENT = " " * 6


def render(report: Report, width: int = 100, *, verbose: bool = False, colour: bool = False) -> str:
    width = max(60, width)
    id_width = max((len(f.id) for f in report.findings), default=8)
    lines = [f"gpuwarden doctor: {report.source}{' (SIMULATED GPUs)' if report.simulated else ''}, "
             f"{len(report.findings)} check{'' if len(report.findings) == 1 else 's'} in {report.duration_s:.2f}s", ""]
    for f in report.ordered():
        mark = LABEL[f.verdict]
        if colour:
            mark = f"{COLOUR[f.verdict]}{mark:<4}\x1b[0m"
        else:
            mark = f"{mark:<4}"
        brief = f.verdict in (PASS, SKIP) and not verbose
        head = f"{mark}  {f.id:<{id_width}}  "
        if brief:
            room = width - len(f"{LABEL[f.verdict]:<4}  {f.id:<{id_width}}  ")
            reason = f.reason if len(f.reason) <= room else f.reason[:max(10, room - 1)] + "…"
            lines.append(head + reason)
            continue
        lines.append(head + f.title + (" (cut at its timeout)" if f.timed_out else ""))
        lines += textwrap.wrap(f.reason, width, initial_indent=INDENT, subsequent_indent=INDENT)
        if f.fix:
            lines += textwrap.wrap(f"fix: {f.fix}", width, initial_indent=INDENT, subsequent_indent=INDENT + "     ")
        if f.known:
            lines += textwrap.wrap("known issues: " + "; ".join(f"{k['id']} ({k['title']})" for k in f.known), width,
                                   initial_indent=INDENT, subsequent_indent=INDENT + "     ")
        if f.read and (verbose or f.verdict in (FAIL, WARN, UNKNOWN)):
            lines += textwrap.wrap("read: " + ", ".join(f.read), width, initial_indent=INDENT,
                                   subsequent_indent=INDENT + "      ")
    counts = report.counts()
    summary = ", ".join(f"{counts[v]} {v}" for v in (FAIL, WARN, UNKNOWN, PASS, SKIP) if counts[v])
    verdict = "FIT TO SERVE" if report.exit_code == 0 else "NEEDS ATTENTION"
    lines += ["", f"doctor: {verdict} ({summary})"]
    return "\n".join(lines)


def use_colour(stream) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
