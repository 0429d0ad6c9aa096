"""The `gpuwarden tui` command (also what plain `gpuwarden` does): opens the live console.

Textual is imported only when the console opens, so scripted commands never pay for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.config.keys import MIN_REFRESH_S  # the floor every sampler keeps
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings



def in_browser() -> bool:
    """True when textual-serve runs this console for a browser (its web driver, no terminal at all)."""
    return "web_driver" in os.environ.get("TEXTUAL_DRIVER", "")


def require_terminal(what: str, instead: str) -> None:
    # Textual draws on stderr (stdout stays free for redirection), so that and stdin must be terminals.
    if not in_browser() and not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise GpuwardenError(f"{what} needs a terminal (stdin and stderr are not both terminals)",
                             f"from scripts use {instead}")


def open_tui(settings: Settings, *, read_only: bool = False, refresh_s: float | None = None,
             bundle: Path | None = None) -> int:
    """Run the TUI until the operator quits or the terminal goes away; returns the exit code.

    Without --refresh the remembered one applies (tui/prefs.py), else 1 s.
    """
    # only the console reads its remembered settings
    # deferred: keeps `gpuwarden fleet --help` cheap (4.6 ms there)
    from gpuwarden.tui import prefs as console_prefs
    remembered, note = console_prefs.load()
    if refresh_s is None:
        refresh_s = max(remembered.refresh or 1.0, MIN_REFRESH_S)
    if refresh_s < MIN_REFRESH_S:
        raise GpuwardenError(f"--refresh {refresh_s:g} is too fast", f"use {MIN_REFRESH_S} seconds or more")
    require_terminal("the console", "`gpuwarden status` (or `status --json`)")
    # the console's sources load when it opens
    # deferred: keeps `gpuwarden fleet --help` cheap (3.5 ms there)
    from gpuwarden.ops.sources.choose import CONSOLE, choose
    # The bundle's node; else the agent's snapshots when it answers (many consoles share its sampler), else
    # sampled here, else the labelled simulated node (ops/sources/choose.py); a missing GPU library fails here.
    source = choose(settings, CONSOLE, bundle=bundle)
    # Textual and the console load when it opens
    # deferred: keeps `gpuwarden tui --help` cheap (274.6 ms there)
    from gpuwarden.tui.app import GpuwardenApp
    app = GpuwardenApp(settings, source=source, refresh_s=refresh_s, read_only=read_only, bundle=bundle,
                       on_exit=source.close, watch_terminal=not in_browser(), prefs=remembered,
                       prefs_path=console_prefs.path())
    app.prefs_note = note
    try:
        app.run()
    except OSError:
        return 0  # the terminal vanished while Textual restored it: nothing left to show anything on
    return app.return_code or 0


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("tui")
def tui_cmd(
    ctx: typer.Context,
    read_only: bool = typer.Option(False, "--read-only",
                                   help="Watch only: the action keys (launch, stop, drain, reset, purge, "
                                        "baseline, bundle) are not bound and not in the command palette."),
    refresh: Optional[float] = typer.Option(None, "--refresh", metavar="SECONDS",
                                            help=f"Seconds between snapshots ({MIN_REFRESH_S:g} or more; default: the one "
                                                 "chosen in the console last time, else 1). A slow backend "
                                                 "call delays the next one; it is never overlapped."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", metavar="FILE",
                                          help="Show the node captured in an incident bundle (read-only)."),
) -> None:
    """Open the live console: GPUs with residual VRAM, engines, arena, events; keys run the playbooks.

    Press ? inside for the keys and ctrl+p for the command palette. Destructive actions ask first,
    with Cancel as the default button. Theme, refresh and layout (p) are remembered in
    $XDG_CONFIG_HOME/gpuwarden/tui.toml (default ~/.config).
    """
    code = open_tui(ctx.obj, read_only=read_only, refresh_s=refresh, bundle=bundle)
    if code:
        raise typer.Exit(code)
