"""CLI: `gpuwarden status` — the node at a glance, or the whole snapshot as JSON for scripts.

Exit 0 healthy, 1 needs attention (residual VRAM, dead holders, crashed engines), 2 error. The work is in
gpuwarden.playbooks.cli.statusview, which the program's fast path also calls without loading this CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli import statusview


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("status")
def status_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the whole snapshot as JSON (for scripts): "
                                  "the gpuwarden.snapshot/1 document."),
    watch: bool = typer.Option(False, "--watch", "-w",
                               help="Refresh in place until Ctrl-C, then exit with the last view's status (0 or 1); "
                                    "SIGTERM and SIGHUP exit 143 and 129."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch.", min=MIN_REFRESH_S),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Show the node as captured in an incident bundle."),
    topology: bool = typer.Option(False, "--topology", help="Show XGMI hives, PCIe parents, NUMA nodes and which "
                                  "GPUs a reset of each GPU reaches (with --json: gpuwarden.topology/1)."),
) -> None:
    """Show GPUs, their processes, residual VRAM with its holders, engines and warnings.

    Reads the node agent's latest snapshot when its socket answers (the report says "via agent"),
    else samples the node itself. Exit status: 0 healthy, 1 needs attention (residual VRAM, a dead
    holder, a crashed engine, or the agent's data is stale), 2 error, including "no GPU backend works
    here" (use --backend sim for the simulated node).
    """
    settings: Settings = ctx.obj
    if topology:
        if watch or bundle is not None:
            raise typer.BadParameter("--topology shows the live node once: leave out --watch and --bundle")
        # deferred: keeps `gpuwarden status --help` cheap (0.9 ms there); only this path of the command needs it
        from gpuwarden.playbooks.cli import topologyview
        raise typer.Exit(topologyview.run(settings, json_out=json_out))
    raise typer.Exit(statusview.run(settings, json_out=json_out, watch=watch, interval=interval, bundle=bundle))
