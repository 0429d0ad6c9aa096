"""CLI: `gpuwarden fix GPU` — one command from "residual VRAM" to "clean, verified", through purge and reset.

Plan first with --dry-run; scripts pass --yes; --json prints one event per line.
"""

from __future__ import annotations

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli.commands import completion
from gpuwarden.playbooks.cli.commands.playbook_options import DryRun, JsonOut, Wait, Yes


def register(app: typer.Typer) -> None:
    @app.command("fix")
    def fix_cmd(
        ctx: typer.Context,
        gpu: int = typer.Argument(..., help="GPU index (see `gpuwarden status`).",
                                 autocompletion=completion.gpus),
        no_reset: bool = typer.Option(False, "--no-reset", help="Purge only; never reset the GPU."),
        stop_engines: bool = typer.Option(False, "--stop-engines", help="Allow stopping the supervised engines "
                                          "on the GPU (and its XGMI hive) when only a reset can clear it; "
                                          "without it such a GPU is left as it is."),
        grace: float = typer.Option(5.0, "--grace", help="Seconds between SIGTERM and SIGKILL for a holder "
                                    "or an engine."),
        timeout: float = typer.Option(10.0, "--timeout", help="Seconds to wait for purged VRAM to return and "
                                      "for the GPU to be unused before a reset."),
        reset_timeout: float = typer.Option(60.0, "--reset-timeout", help="Seconds to wait for the GPU to come "
                                            "back clean after a reset."),
        dry_run: DryRun = False,
        yes: Yes = False,
        json_out: JsonOut = False,
        wait: Wait = 0.0,
    ) -> None:
        """Fix GPU N: remove what holds its residual VRAM, reset it only when that is not enough, verify.

        1. Purge: zombies are reaped through their parent, tenants of a gone container are stopped (the
           same checks as `gpuwarden purge`: PID + start time, journal, protected processes).
        2. Settle: wait until the purged VRAM is back; memory no process holds will not come back, so
           fix stops waiting as soon as only that is left (seconds, not the whole timeout).
        3. Only if residual VRAM is left and a reset is allowed: drain the GPU and every GPU of its XGMI
           hive, reset it, verify it enumerates again with its VRAM at the baseline, undrain what fix
           drained. A reset is not allowed while a process other than a supervised engine uses the
           hive, while engines run there without --stop-engines, or with --no-reset.

        A clean GPU is checked and left alone (exit 0, no question asked). Exit 1 when the GPU is not
        clean at the end; the last line says why and what to run next.
        """
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.playbooks import nodecheck
        from gpuwarden.playbooks.fix import FixPlaybook
        from gpuwarden.playbooks.cli.output import execute, exit_with
        settings: Settings = ctx.obj
        nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
        pb = FixPlaybook(gpu, allow_reset=not no_reset, stop_engines=stop_engines, grace_s=grace,
                         timeout_s=timeout, reset_timeout_s=reset_timeout)
        exit_with(execute(pb, settings, dry_run=dry_run, yes=yes, json_out=json_out, wait_s=wait))
