"""`gpuwarden fleet tui`: the fleet console. Textual and asyncssh are imported only when it opens."""

from __future__ import annotations


import typer

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.playbooks.cli.commands import fleet as fleet_cli
from gpuwarden.ops.foundation.units import parse_duration
from gpuwarden.tui.command import in_browser, require_terminal

MIN_REFRESH_S = 0.5


def open_fleet_tui(settings, target, *, refresh_s: float, read_only: bool, history_s: float | None = None) -> int:
    if refresh_s < MIN_REFRESH_S:
        raise GpuwardenError(f"--refresh {refresh_s:g} is too fast", f"use {MIN_REFRESH_S} seconds or more")
    require_terminal("the fleet console", "`gpuwarden fleet status --json`")
    # Textual and the console load when it opens
    # deferred: keeps `gpuwarden fleet --help` cheap (293.1 ms there)
    from gpuwarden.tui.fleet.app import FleetApp
    monitor = _monitor(target, refresh_s, history_s).start()
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


def _monitor(target, refresh_s: float, history_s: float | None):
    """SSH streams for every node, or Prometheus first with streams only where its series fall short."""
    hosts = list(target.hosts)
    if target.prometheus is None:
        # the fleet's sources (asyncio, ssl) when it opens
        # deferred: keeps `gpuwarden fleet --help` cheap (32.2 ms there)
        from gpuwarden.ops.fleet.monitor import FleetMonitor
        return FleetMonitor(hosts, target.ssh, target.remote, interval=refresh_s, parallel=target.parallel)
    # the fleet's sources (asyncio, http) when it opens
    # deferred: keeps `gpuwarden fleet --help` cheap (41.8 ms there)
    from gpuwarden.ops.fleet.promfleet import read_fleet
    # deferred: keeps `gpuwarden fleet --help` cheap (45.6 ms there)
    from gpuwarden.ops.fleet.promwatch import PromFleetMonitor
    if not hosts:  # the fleet is every node Prometheus knows now (one that appears later needs a restart)
        hosts = list(read_fleet(target.prometheus, None).hosts)
        if not hosts:
            raise GpuwardenError(f"no nodes: Prometheus at {target.prometheus.url} has no gpuwarden series",
                                 "check --prometheus-selector, or name the nodes (--hosts, --nodelist, fleet.hosts)")
    return PromFleetMonitor(hosts, target.ssh, target.remote, target.prometheus, interval=refresh_s,
                            parallel=target.parallel, history_s=history_s)


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("tui")
@fleet_cli.with_fleet_view
def fleet_tui_cmd(
    ctx: typer.Context,
    fleet_target=None,
    refresh: float = typer.Option(1.0, "--refresh", metavar="SECONDS",
                                  help="Seconds between each node's snapshots (0.5 or more)."),
    read_only: bool = typer.Option(False, "--read-only", help="Watch only: no playbook keys on any node."),
    history: str = typer.Option("1h", "--history", metavar="DURATION",
                                help="With --prometheus: the span of each node's residual trend and crash "
                                     "count (0 for none)."),
) -> None:
    """Open the fleet console: a row per node, worst first (`/` filters). Enter opens that node's full
    live console, fed over one persistent SSH connection per node; its playbook keys act on that node
    (destructive ones ask first), Escape goes back to the fleet.

    With --prometheus the rows come from Prometheus (with each node's trend over --history) and only nodes
    whose series are missing or stale, and the node you open, are streamed over SSH.
    """
    history_s = parse_duration(history) or None
    code = open_fleet_tui(ctx.obj, fleet_target, refresh_s=refresh, read_only=read_only, history_s=history_s)
    if code:
        raise typer.Exit(code)
