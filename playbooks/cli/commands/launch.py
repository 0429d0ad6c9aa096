"""CLI: `gpuwarden launch` — preflight, then start the node config's engines under shims, staggered.

Shows each engine's phase as it moves; exits non-zero naming the engine when one dies before serving.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from gpuwarden.playbooks.cli.commands import completion

from gpuwarden.ops.foundation.settings import Settings


def register(app: typer.Typer) -> None:
    @app.command("launch")
    def launch_cmd(
        ctx: typer.Context,
        engines: Optional[List[str]] = typer.Argument(None, help="Engines to start (default: every engine in the config).",
                                                     autocompletion=completion.config_engines),
        stagger: Optional[int] = typer.Option(
            None, "--stagger", min=1, max=1024,
            help="How many engines may register at once (default: [stagger] slots in the config, else 1)."),
        sequential: bool = typer.Option(
            False, "--sequential", help="Start each engine only when the one before it serves."),
        timeout: Optional[float] = typer.Option(
            None, "--timeout", min=1,
            help="Give up following after this many seconds (default: registration_timeout x engines + 60)."),
        skip_verify: bool = typer.Option(
            False, "--skip-verify", help="Check the arena header only, not every chunk hash."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and start nothing."),
        json_out: bool = typer.Option(False, "--json", help="One JSON event per line instead of progress lines."),
    ) -> None:
        """Start engines under detached shims, at most --stagger registering at once, and follow them to serving.

        Preflight first: config valid, arena present and verified, the engines' GPUs not drained, the
        registration budget. Engines outlive this command (and a dropped SSH session): stop them with
        `gpuwarden engines stop`. If an engine dies before it registered, the launch stops the engines that
        had not begun registering, leaves the others, prints the dead engine's signal and last log lines,
        and exits 1.
        """
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.playbooks.launch import LaunchPlaybook, select
        from gpuwarden.playbooks.cli.output import execute, exit_with

        settings: Settings = ctx.obj
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.ops.config import nodeconfig  # here, not at import: every gpuwarden command loads this module
        config = nodeconfig.load(settings)
        playbook = LaunchPlaybook(config=config, engines=select(config, engines or []),
                                  stagger=stagger or config.stagger.slots, sequential=sequential,
                                  timeout_s=timeout, skip_verify=skip_verify)
        result = execute(playbook, settings, dry_run=dry_run, yes=True, json_out=json_out)
        exit_with(result)
