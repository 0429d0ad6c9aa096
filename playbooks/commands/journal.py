"""CLI: `gpuwarden journal` — what playbooks and signals did to this node: who, when, what, result.

Reads <state dir>/journal.log, one JSON object per line, oldest first.
"""

from __future__ import annotations

import json
import sys

import typer

from gpuwarden.ops.safetext import printable
from gpuwarden.ops.settings import Settings

_BASE = ("ts", "time", "host", "who", "pid", "action", "result")


def _line(entry: dict) -> str:
    rest = " ".join(f"{k}={json.dumps(v, default=str) if not isinstance(v, str) else v}"
                    for k, v in entry.items() if k not in _BASE and v not in (None, "", [], {}))
    # The journal is a file anyone with root can edit: nothing in it may drive the terminal.
    return printable(f"{entry.get('time', '?')}  {entry.get('who', '?'):<10} {entry.get('action', '?'):<22} "
                     f"{entry.get('result', '?'):<9} {rest}").rstrip()


def register(app: typer.Typer) -> None:
    @app.command("journal")
    def journal_cmd(
        ctx: typer.Context,
        tail: int = typer.Option(50, "--tail", "-n", min=0, help="Show the last N entries (0: all)."),
        json_out: bool = typer.Option(False, "--json", help="One JSON object per line, as stored."),
    ) -> None:
        """Show the journal of every change gpuwarden made: playbook steps, signals sent, resets, removed files."""
        from gpuwarden.ops import journal
        settings: Settings = ctx.obj
        got = journal.read_checked(settings.state_dir, limit=tail or None)
        if got.skipped:
            typer.echo(f"journal: skipped {got.skipped} line(s) that are not journal entries "
                       f"(corrupt or not written by gpuwarden) in {settings.state_dir / 'journal.log'}", err=True)
        if json_out:
            from gpuwarden.ops.jsondoc import document, iso
            for e in got.entries:
                ts = e.get("ts")
                doc = document("journal-entry", {**e, "ts_iso": iso(ts) if isinstance(ts, (int, float)) else None})
                sys.stdout.write(json.dumps(doc, default=str) + "\n")
            return
        if not got.entries:
            typer.echo(f"journal is empty ({settings.state_dir / 'journal.log'})")
            return
        for e in got.entries:
            typer.echo(_line(e))
