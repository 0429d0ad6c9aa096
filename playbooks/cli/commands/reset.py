"""CLI: `gpuwarden reset GPU` — reset one drained, idle GPU the vendor's way and verify it came back.

Plan first with --dry-run; scripts pass --yes; --json prints one event per line.
"""

from __future__ import annotations

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli.commands import completion
from gpuwarden.playbooks.cli.commands.playbook_options import DryRun, JsonOut, Wait, Yes


def register(app: typer.Typer) -> None:
    @app.command("reset")
    def reset_cmd(
        ctx: typer.Context,
        gpu: int = typer.Argument(..., help="GPU index (see `gpuwarden status`).",
                                 autocompletion=completion.gpus),
        force: bool = typer.Option(False, "--force", help="Reset even if the GPU is not drained or processes "
                                   "still use it (they lose their GPU contexts)."),
        timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the GPU to come back clean."),
        dry_run: DryRun = False,
        yes: Yes = False,
        json_out: JsonOut = False,
        wait: Wait = 0.0,
    ) -> None:
        """Reset GPU N: every context on it is lost and leaked VRAM returns.

        Refuses unless the GPU is drained (`gpuwarden drain N`) and no process holds it; on AMD every GPU of
        the same XGMI hive must be drained too, since the driver resets the hive as one. Picks the vendor's
        way (amdsmi library, amd-smi, rocm-smi; nvidia-smi -r; the simulated driver), then verifies that the
        GPU enumerates again, its VRAM is back at the baseline and no residual is left. Needs root on real GPUs.
        """
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.playbooks import nodecheck
        from gpuwarden.playbooks.cli.output import execute, exit_with
        from gpuwarden.playbooks.reset import ResetPlaybook
        settings: Settings = ctx.obj
        nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
        exit_with(execute(ResetPlaybook(gpu, force=force, timeout_s=timeout), settings,
                          dry_run=dry_run, yes=yes, json_out=json_out, wait_s=wait))
