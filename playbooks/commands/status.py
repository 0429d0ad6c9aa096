"""CLI: `gpuwarden status` — the node at a glance, or the whole snapshot as JSON for scripts.

Exit 0 healthy, 1 needs attention (residual VRAM, dead holders, crashed engines), 2 error.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ops.settings import Settings


def _snapshot_source(settings: Settings, bundle: Path | None, watch: bool = False):
    if bundle is not None:
        from ops.bundle.replay import snapshot_from_bundle
        return lambda: snapshot_from_bundle(bundle, settings)
    from ops.snapshot import Sampler
    # pidfds pay off only across refreshes; a one-shot status would just pay for opening them.
    sampler = Sampler(settings, use_pidfds=watch)
    first = [True]

    def take():
        deep = first[0]
        first[0] = False
        return sampler.snapshot(deep=True if deep else None)
    return take


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status_cmd(
        ctx: typer.Context,
        json_out: bool = typer.Option(False, "--json", help="Print the whole snapshot as JSON (for scripts)."),
        watch: bool = typer.Option(False, "--watch", "-w", help="Refresh in place until Ctrl-C."),
        interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch.", min=0.25),
        bundle: Optional[Path] = typer.Option(None, "--bundle", help="Show the node as captured in an incident bundle."),
    ) -> None:
        """Show GPUs, their processes, residual VRAM with its holders, engines and warnings.

        Exit status: 0 healthy, 1 needs attention (residual VRAM, a dead holder, a crashed engine), 2 error.
        """
        settings: Settings = ctx.obj
        take = _snapshot_source(settings, bundle, watch)
        from playbooks.hints import Invocation
        from playbooks.report import render as render_plain

        def render(snap, width: int) -> str:  # hints in warnings name commands to paste: same options
            return Invocation(list(settings.cli_words)).paste_ready(render_plain(snap, width)) or ""
        if not watch:
            snap = take()
            if json_out:
                sys.stdout.write(snap.to_json() + "\n")
            else:
                typer.echo(render(snap, shutil.get_terminal_size((100, 24)).columns))
            raise typer.Exit(1 if snap.needs_attention() else 0)
        try:
            while True:
                snap = take()
                if json_out:
                    sys.stdout.write(snap.to_json(indent=None) + "\n")
                    sys.stdout.flush()
                else:
                    text = render(snap, shutil.get_terminal_size((100, 24)).columns)
                    # Home + clear-to-end keeps the screen from flickering on slow SSH links; a pipe or a
                    # log file gets plain reports one after another, no escape codes.
                    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
                    sys.stdout.write(clear + text + f"\n\n(every {interval:g}s, Ctrl-C to stop)\n")
                    sys.stdout.flush()
                if bundle is not None:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
