"""CLI: `gpuwarden fleet ...` — many nodes from one terminal over SSH (status, playbooks, bundles).

Nodes come from --hosts, --hosts-from/--group, --nodelist or fleet.hosts; ~/.ssh/config says how to reach them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

fleet_app = typer.Typer(
    name="fleet", no_args_is_help=True, rich_markup_mode=None,
    help="Many nodes over SSH with your own ~/.ssh/config, keys and known_hosts: `fleet status` (one table, "
         "worst node first), `fleet tui`, and the node playbooks run remotely (purge, drain, undrain, baseline, "
         "bundle). Each node runs its own gpuwarden with its own locks and journal.")

HostsFile = Annotated[Optional[Path], typer.Option(
    "--hosts", metavar="FILE", help="One [user@]host[:port] per line; # starts a comment; gpu[01-16] ranges allowed.")]
HostsFrom = Annotated[Optional[Path], typer.Option(
    "--hosts-from", metavar="INVENTORY", help="An Ansible INI inventory (ansible_host/_port/_user are honoured).")]
Group = Annotated[Optional[str], typer.Option(
    "--group", help="The inventory group to take with --hosts-from (default: all hosts).")]
Nodelist = Annotated[Optional[str], typer.Option(
    "--nodelist", metavar="HOSTLIST", help="Slurm hostlist syntax, e.g. 'gpu[01-16],gpu-b[1-4]'.")]
FleetConfigOpt = Annotated[Optional[Path], typer.Option(
    "--fleet-config", metavar="FILE", envvar="GPUWARDEN_FLEET_CONFIG",
    help="Fleet config TOML with a [fleet] table: hosts, command, parallel, timeout "
         "(default ~/.config/gpuwarden/fleet.toml, else /etc/gpuwarden/fleet.toml).")]
SshConfig = Annotated[Optional[Path], typer.Option(
    "--ssh-config", "-F", metavar="FILE",
    help="OpenSSH client config to use instead of ~/.ssh/config (Host aliases, User, Port, IdentityFile, "
         "ProxyJump, UserKnownHostsFile).")]
AcceptNew = Annotated[bool, typer.Option(
    "--accept-new", help="Add the host key of a node never seen before to known_hosts (as OpenSSH's "
                         "StrictHostKeyChecking=accept-new); a changed host key is always refused.")]
Parallel = Annotated[Optional[int], typer.Option(
    "--parallel", min=1, help="Nodes contacted at once (default 32, or fleet.parallel).")]
Timeout = Annotated[Optional[float], typer.Option(
    "--timeout", help="Seconds each node may take, connection included (default 15, or fleet.timeout).")]
RemoteCommand = Annotated[Optional[str], typer.Option(
    "--remote-command", metavar="CMD", help="How to start gpuwarden on a node (default `gpuwarden`, or "
                                            "fleet.command), e.g. 'sudo -n /opt/gpuwarden/bin/gpuwarden'.")]


def target(hosts: Path | None, hosts_from: Path | None, group: str | None, nodelist: str | None,
           fleet_config: Path | None, ssh_config: Path | None, accept_new: bool, parallel: int | None,
           timeout: float | None, remote_command: str | None):
    from playbooks.fleet.target import resolve
    return resolve(hosts_file=hosts, hosts_from=hosts_from, group=group, nodelist=nodelist,
                   fleet_config=fleet_config, ssh_config=ssh_config, accept_new=accept_new, parallel=parallel,
                   timeout=timeout, remote_command=remote_command)


class Progress:
    """`12/16 nodes answered` on a terminal's stderr while a fan-out runs; nothing into a pipe."""

    def __init__(self, total: int, what: str = "answered"):
        self.total, self.done, self.what = total, 0, what
        self.live = sys.stderr.isatty()

    def __call__(self, _row=None) -> None:
        self.done += 1
        if self.live:
            sys.stderr.write(f"\r{self.done}/{self.total} nodes {self.what}\x1b[K")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@fleet_app.command("status")
def status_cmd(
    hosts: HostsFile = None, hosts_from: HostsFrom = None, group: Group = None, nodelist: Nodelist = None,
    fleet_config: FleetConfigOpt = None, ssh_config: SshConfig = None, accept_new: AcceptNew = False,
    parallel: Parallel = None, timeout: Timeout = None, remote_command: RemoteCommand = None,
    json_out: bool = typer.Option(False, "--json", help="Print the fleet as one JSON document (gpuwarden.fleet-status/1)."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", min=1.0, help="Seconds between refreshes with --watch."),
) -> None:
    """Every node's status in one table, worst node first: GPUs, residual VRAM and its holders, engines
    serving/crashed, drained GPUs, agent, backend (SIMULATED nodes marked), and the reason for each node
    that could not be reached.

    Exit status: the worst node's — 0 all healthy, 1 some need attention, 2 some could not be seen.
    """
    from ops.fleet import summary
    from ops.jsondoc import dumps
    from playbooks.fleet.status import collect
    t = target(hosts, hosts_from, group, nodelist, fleet_config, ssh_config, accept_new, parallel, timeout,
               remote_command)
    try:
        while True:
            progress = Progress(len(t.hosts))
            started = time.monotonic()
            rows = collect(t, progress if not watch else None)
            progress.clear()
            if json_out:
                sys.stdout.write(dumps(summary.document(rows), indent=None if watch else 2) + "\n")
            else:
                text = summary.table(rows)
                if watch:
                    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
                    text = clear + text + f"\n\n(every {interval:g}s, took {time.monotonic() - started:.1f}s, Ctrl-C to stop)"
                sys.stdout.write(text + "\n")
            sys.stdout.flush()
            if not watch:
                raise typer.Exit(summary.exit_code(rows))
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")
