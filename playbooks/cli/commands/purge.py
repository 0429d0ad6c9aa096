"""CLI: `gpuwarden purge [GPU]` — remove what holds residual VRAM, safely, and check that it is gone.

Plan first with --dry-run; scripts pass --yes; --json prints one event per line.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli.commands import completion
from gpuwarden.playbooks.cli.commands.playbook_options import DryRun, JsonOut, Wait, Yes


def register(app: typer.Typer) -> None:
    @app.command("purge")
    def purge_cmd(
        ctx: typer.Context,
        gpu: Optional[int] = typer.Argument(None, help="GPU index; every GPU when left out.",
                                            autocompletion=completion.gpus),
        arenas: bool = typer.Option(False, "--arenas", help="Also delete arena files that no process maps."),
        arena: List[Path] = typer.Option([], "--arena", help="An arena file to consider with --arenas "
                                          "(repeatable; the configured arena is always considered)."),
        drop_caches: bool = typer.Option(False, "--drop-caches", help="Also drop the page cache (root only)."),
        escalate_reset: bool = typer.Option(False, "--escalate-reset", help="When residual stays with no "
                                            "holder left, reset the GPU (only if no live process uses it)."),
        grace: float = typer.Option(5.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
        timeout: float = typer.Option(10.0, "--timeout", help="Seconds to wait for the residual to go."),
        dry_run: DryRun = False,
        yes: Yes = False,
        json_out: JsonOut = False,
        wait: Wait = 0.0,
    ) -> None:
        """Remove what keeps residual VRAM held, safely, then check that it is gone.

        Zombies: SIGCHLD to the parent; if it still does not reap and may be touched, TERM then KILL the
        parent so init reaps. GPU tenants of a container whose runtime shim is gone: TERM, grace, KILL.
        Processes in disk sleep and leaks with no process are reported. Never touched: PID 1, kernel
        threads, init/systemd/sshd, container runtimes, gpuwarden shims, other users (unless root). Every
        signal re-checks PID + start time first and is journalled. When residual stays with no holder,
        purge names the next step (reset), or resets with --escalate-reset.
        """
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.playbooks import nodecheck
        from gpuwarden.playbooks.cli.output import execute, exit_with
        from gpuwarden.playbooks.purge import PurgePlaybook
        settings: Settings = ctx.obj
        if gpu is not None:
            nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
        pb = PurgePlaybook(gpu, arenas=arenas, arena_paths=tuple(str(p) for p in arena), drop_caches=drop_caches,
                           escalate_reset=escalate_reset, grace_s=grace, timeout_s=timeout)
        exit_with(execute(pb, settings, dry_run=dry_run, yes=yes, json_out=json_out, wait_s=wait))
