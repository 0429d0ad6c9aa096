"""CLI: `gpuwarden journal` — what playbooks and signals did to this node: who, when, what, result.

Reads <state dir>/journal.log, one JSON object per line, oldest first.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import COUNT

from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.units import parse_duration
from gpuwarden.ops.foundation import interrupts, journal

_BASE = ("ts", "time", "host", "who", "pid", "action", "result")


def _line(entry: dict) -> str:
    rest = " ".join(f"{k}={json.dumps(v, default=str) if not isinstance(v, str) else v}"
                    for k, v in entry.items() if k not in _BASE and v not in (None, "", [], {}))
    # The journal is a file anyone with root can edit: nothing in it may drive the terminal.
    return printable(f"{entry.get('time', '?')}  {entry.get('who', '?'):<10} {entry.get('action', '?'):<22} "
                     f"{entry.get('result', '?'):<9} {rest}").rstrip()


def when(text: str, now: float | None = None) -> float:
    """--since/--until: a time ago (30m, 2h, 7d) or a local date and time (2026-12-01, 2026-12-01 21:30[:15],
    with T between them as well); the epoch seconds it names."""
    raw = text.strip()
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(raw, fmt))
        except ValueError:
            continue
    try:
        return (time.time() if now is None else now) - parse_duration(raw)
    except GpuwardenError:
        raise GpuwardenError(f"cannot read the time {text!r}",
                             "write a time ago (30m, 2h, 7d) or a local time (2026-12-01 21:30)") from None


def _show(entry: dict, json_out: bool) -> None:
    if json_out:
        ts = entry.get("ts")
        doc = document("journal-entry", {**entry, "ts_iso": iso(ts) if isinstance(ts, (int, float)) else None})
        sys.stdout.write(json.dumps(doc, default=str) + "\n")
    else:
        sys.stdout.write(_line(entry) + "\n")
    sys.stdout.flush()


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("journal")
def journal_cmd(
    ctx: typer.Context,
    tail: int = typer.Option(50, "--tail", "-n", min=0, parser=COUNT, help="Show the last N entries (0: all; with --since "
                             "or --until every entry in the window unless -n is given)."),
    since: Optional[str] = typer.Option(None, "--since", metavar="WHEN",
                                        help="Entries from then on: a time ago (30m, 2h, 7d) or a local time "
                                             "(2026-12-01 21:30)."),
    until: Optional[str] = typer.Option(None, "--until", metavar="WHEN", help="Entries up to then (as --since)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Then print new entries as they are written, "
                                "until Ctrl-C (exit 0; SIGTERM and SIGHUP exit 143 and 129)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line, as stored."),
) -> None:
    """Show the journal of every change gpuwarden made: playbook steps, signals sent, resets, removed files."""
    settings: Settings = ctx.obj
    start = when(since) if since else None
    end = when(until) if until else None
    if start is not None and end is not None and end < start:
        raise GpuwardenError(f"--until {until} is before --since {since}", "swap them")
    window = start is not None or end is not None
    source = ctx.get_parameter_source("tail")
    explicit_tail = source is not None and source.name == "COMMANDLINE"
    got = journal.read_checked(settings.state_dir, limit=None if window or not tail else tail)
    if got.skipped:
        typer.echo(f"journal: skipped {got.skipped} line(s) that are not journal entries "
                   f"(corrupt or not written by gpuwarden) in {settings.state_dir / 'journal.log'}", err=True)

    def inside(e: dict) -> bool:
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            return not window
        return (start is None or ts >= start) and (end is None or ts <= end)
    entries = [e for e in got.entries if inside(e)]
    if window and explicit_tail and tail:
        entries = entries[-tail:]
    if not entries and not json_out and not follow:
        what = "no journal entries in that window" if window else "journal is empty"
        typer.echo(f"{what} ({settings.state_dir / 'journal.log'})")
        return
    try:  # from the first line shown: a follow's Ctrl-C may come while the backlog still prints
        for e in entries:
            _show(e, json_out)
        if not follow:
            return
        # --until in the future ends the follow there; one in the past leaves nothing to wait for.
        for e in journal.follow(settings.state_dir, start=got.end or (0, 0),
                                keep_going=lambda: end is None or time.time() <= end):
            if inside(e):
                _show(e, json_out)
    except KeyboardInterrupt as exc:
        if not follow:
            raise
        interrupts.ctrl_c_only(exc)  # Ctrl-C ends a follow (0); SIGTERM and SIGHUP exit 143 and 129
