"""`gpuwarden fleet tui`: the fleet console. Textual and asyncssh are imported only when it opens."""

from __future__ import annotations


import typer

from ops.errors import GpuwardenError
from playbooks.commands import fleet as fleet_cli

MIN_REFRESH_S = 0.5


def open_fleet_tui(settings, target, *, refresh_s: float, read_only: bool) -> int:
    if refresh_s < MIN_REFRESH_S:
        raise GpuwardenError(f"--refresh {refresh_s:g} is too fast", f"use {MIN_REFRESH_S} seconds or more")
    from ..command import in_browser, require_terminal
    require_terminal("the fleet console", "`gpuwarden fleet status --json`")
    from ops.fleet.monitor import FleetMonitor

    from .app import FleetApp
    monitor = FleetMonitor(list(target.hosts), target.ssh, target.remote, interval=refresh_s,
                           parallel=target.parallel).start()
    try:
        app = FleetApp(settings, monitor, target, refresh_s=refresh_s, read_only=read_only,
                       watch_terminal=not in_browser())
        try:
            app.run()
        except OSError:
            return 0
        return app.return_code or 0
    finally:
        monitor.close()


def register() -> None:
    @fleet_cli.fleet_app.command("tui")
    @fleet_cli.with_fleet_target
    def fleet_tui_cmd(
        ctx: typer.Context,
        fleet_target=None,
        refresh: float = typer.Option(1.0, "--refresh", metavar="SECONDS",
                                      help="Seconds between each node's snapshots (0.5 or more)."),
        read_only: bool = typer.Option(False, "--read-only", help="Watch only: no playbook keys on any node."),
    ) -> None:
        """Open the fleet console: a row per node, worst first (`/` filters). Enter opens that node's full
        live console, fed over one persistent SSH connection per node; its playbook keys act on that node
        (destructive ones ask first), Escape goes back to the fleet.
        """
        code = open_fleet_tui(ctx.obj, fleet_target, refresh_s=refresh, read_only=read_only)
        if code:
            raise typer.Exit(code)
