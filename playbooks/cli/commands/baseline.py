"""CLI: `gpuwarden baseline record [GPU]` and `gpuwarden baseline show` — the idle VRAM each GPU uses.

Residual VRAM is device use minus what live processes account for minus this baseline.
"""

from __future__ import annotations

import json
import time
from typing import Optional

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli.commands import completion
from gpuwarden.playbooks.cli.commands.playbook_options import DryRun, GPU_INDEX, JsonOut, Wait
from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.units import fmt_bytes

baseline_app = typer.Typer(name="baseline", no_args_is_help=True, rich_markup_mode=None,
                           help="The idle VRAM baseline per GPU: record it on an idle node, show it.")


@baseline_app.command("record")
def record_cmd(
    ctx: typer.Context,
    gpu: Optional[int] = typer.Argument(None, parser=GPU_INDEX, help="GPU index; every GPU when left out.",
                                        autocompletion=completion.gpus),
    force: bool = typer.Option(False, "--force", help="Record even when idle use looks like a leak."),
    dry_run: DryRun = False,
    yes: bool = typer.Option(False, "--yes", "-y", help="Accepted for symmetry; recording asks nothing."),
    json_out: JsonOut = False,
    wait: Wait = 0.0,
) -> None:
    """Record each GPU's idle VRAM use (after a clean start or a reset).

    Refuses a GPU that any process uses or holds, and one whose idle use is large enough to be a leak.
    """
    # deferred: keeps `gpuwarden baseline --help` cheap (4.1 ms there); only this path of the command needs it
    from gpuwarden.playbooks import nodecheck
    # deferred: keeps `gpuwarden baseline --help` cheap (16.5 ms there)
    from gpuwarden.playbooks.baseline import BaselinePlaybook
    # deferred: keeps `gpuwarden baseline --help` cheap (11.3 ms there)
    from gpuwarden.playbooks.cli.output import execute, exit_with
    settings: Settings = ctx.obj
    if gpu is not None:
        nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
    exit_with(execute(BaselinePlaybook(gpu, force=force), settings, dry_run=dry_run, yes=yes,
                      json_out=json_out, wait_s=wait))


@baseline_app.command("show")
def show_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the recorded baseline per GPU (when and from which backend)."""
    settings: Settings = ctx.obj
    data = statefiles.load(settings.state_dir / statedir.BASELINE, statefiles.BASELINE, {"gpus": {}},
                           root=settings.state_dir)
    gpus = {int(k): v for k, v in data["gpus"].items()}
    if json_out:
        body = {str(k): {**v, "recorded_at_iso": iso(v.get("recorded_at"))} for k, v in sorted(gpus.items())}
        typer.echo(json.dumps(document("baseline", {"gpus": body}), indent=2))
        return
    if not gpus:
        typer.echo("no baseline recorded (record one with `gpuwarden baseline record` on an idle node)")
        return
    for g, v in sorted(gpus.items()):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.get("recorded_at", 0)))
        typer.echo(f"GPU {g}: {fmt_bytes(int(v['vram_bytes']))}  recorded {when}  backend {printable(v.get('backend', '?'))}")
