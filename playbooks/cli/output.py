"""How the CLI shows playbook events and asks for confirmation.

Terminal: one progress line per step. --json: one event object per line, nothing else on stdout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Callable

import typer

from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.playbooks.framework import Event, Playbook, Result, run
from gpuwarden.playbooks.cli.hints import Invocation

_MARK = {"step_ok": "ok", "step_failed": "FAILED", "step_skipped": "skipped"}


def event_printer(json_out: bool, cli_words: tuple[str, ...] = (), prefix: str = "") -> Callable[[Event], None]:
    """Print events as they come; `prefix` (e.g. a fleet node's name) starts every text line. Commands that
    hints name get `cli_words`, the global options of this command line (gpuwarden.playbooks.cli.hints)."""
    paste_ready = Invocation(list(cli_words)).paste_ready

    def echo(text: str, err: bool = False) -> None:
        typer.echo(prefix + text, err=err)

    def show(event: Event) -> None:
        event = replace(event, message=paste_ready(event.message) or "")
        if json_out:
            sys.stdout.write(json.dumps(event.to_dict(), default=str) + "\n")
            sys.stdout.flush()
            return
        if event.kind == "planned":
            steps = event.data.get("steps", [])
            echo(f"{event.playbook}: {event.message}")
            for i, s in enumerate(steps, 1):
                flag = "  [changes the node]" if s.get("destructive") else ""
                echo(f"  {i}. {s['description']}{flag}")
        elif event.kind == "step_started":
            echo(f"→ {event.message}")
        elif event.kind in _MARK:
            secs = event.data.get("seconds")
            took = f" ({secs:.1f}s)" if isinstance(secs, (int, float)) else ""
            echo(f"  {_MARK[event.kind]}: {event.message}{took}", err=event.kind == "step_failed")
        elif event.kind == "info":
            echo(f"  · {event.message}")
        elif event.kind == "done":
            ok = event.data.get("ok")
            echo(f"{event.playbook}: {event.message}", err=not ok)
        sys.stdout.flush()
    return show


def terminal_confirm() -> Callable[[str], bool] | None:
    """A yes/no prompt when stdin and stdout are terminals; None otherwise (scripts must pass --yes)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return None

    def ask(question: str) -> bool:
        # Not typer.confirm: it turns Ctrl-C and end of input alike into Abort. End of input (Ctrl-D, or
        # garbage then EOF) is no answer, so no (exit 1); Ctrl-C stays an interruption (exit 130).
        while True:
            try:
                answer = input(f"{question} [y/N]: ").strip().lower()
            except EOFError:
                typer.echo("", err=True)
                return False
            if answer in ("y", "yes"):
                return True
            if answer in ("", "n", "no"):
                return False
            typer.echo("Answer y or n.", err=True)
    return ask


def execute(playbook: Playbook, settings: Settings, *, dry_run: bool, yes: bool, json_out: bool,
            wait_s: float = 0.0) -> Result:
    """Run a playbook the CLI way and exit with its code."""
    try:
        result = run(playbook, settings, sink=event_printer(json_out, settings.cli_words), dry_run=dry_run,
                     assume_yes=yes,
                     confirm=None if json_out else terminal_confirm(), lock_wait_s=wait_s)
    except KeyboardInterrupt:
        typer.echo(f"{playbook.name}: interrupted; the steps already done stay done (see `gpuwarden journal`)",
                   err=True)
        raise
    return result


def exit_with(result: Result) -> None:
    raise typer.Exit(result.exit_code)
