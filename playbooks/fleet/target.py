"""Which nodes a fleet command acts on and how: inventory options and the fleet config, resolved once.

Explicit --hosts / --hosts-from / --nodelist win over the config's fleet.hosts; they add up when combined.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.fleet.hostlist import HostBudget
from gpuwarden.ops.fleet.inventory import Duplicate, FleetConfig, Host, distinct, load_fleet_config, read_hosts_file
from gpuwarden.ops.fleet.inventory import expand_nodelist, Inventory
from gpuwarden.ops.fleet.promfleet import DEFAULT_MAX_AGE_S, PromSettings
from gpuwarden.ops.fleet.ssh import SshSettings
from gpuwarden.ops.foundation.journal import who
from gpuwarden.ops.fleet.sshconfig import check_ssh_config
from gpuwarden.ops.fleet.ansible import read_group


def default_fleet_config() -> Path:
    """$XDG_CONFIG_HOME/gpuwarden/fleet.toml (~/.config/...) when it exists, else /etc/gpuwarden/fleet.toml."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    user = base / "gpuwarden" / "fleet.toml"
    return user if user.exists() else Path("/etc/gpuwarden/fleet.toml")


@dataclass(frozen=True)
class FleetTarget:
    hosts: tuple[Host, ...]
    ssh: SshSettings
    command: str  # how gpuwarden is started on a node, e.g. "gpuwarden" or "sudo -n /opt/gpuwarden/bin/gpuwarden"
    parallel: int
    timeout: float
    prometheus: PromSettings | None = None  # read the fleet from there first (fleet status / tui)
    duplicates: tuple[Duplicate, ...] = ()  # inventory entries that named a node again (asked once)

    def duplicates_warning(self) -> str | None:
        return Inventory(self.hosts, self.duplicates).warning()

    def remote(self, *args: str, env: dict[str, str] | None = None) -> str:
        """The shell command line that runs `gpuwarden ARGS` on a node, every argument quoted."""
        prefix = ""
        if env:
            prefix = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
        return prefix + self.command + "".join(" " + shlex.quote(a) for a in args)


def resolve(*, hosts_file: Path | None, hosts_from: Path | None, group: str | None, nodelist: str | None,
            fleet_config: Path | None, ssh_config: Path | None, accept_new: bool, parallel: int | None,
            timeout: float | None, remote_command: str | None, reads_prometheus: bool = False,
            prometheus: str | None = None, prometheus_selector: str | None = None,
            prometheus_max_age: float | None = None) -> FleetTarget:
    """The nodes and how to reach them. A command that reads_prometheus (status, tui) takes --prometheus or
    fleet.prometheus; with it and no inventory, hosts is empty: the fleet is every node Prometheus has series of.
    Playbooks act only on nodes named in an inventory."""
    explicit = fleet_config is not None
    config: FleetConfig = load_fleet_config(fleet_config or default_fleet_config(), explicit)
    hosts: list[Host] = []
    budget = HostBudget()  # --hosts, --hosts-from and --nodelist add up: the cap is on the whole fleet
    if hosts_file is not None:
        hosts += read_hosts_file(hosts_file, budget)
    if hosts_from is not None:
        hosts += read_group(hosts_from, group, budget)
    elif group is not None:
        raise GpuwardenError("--group needs --hosts-from", "give the Ansible inventory: --hosts-from inventory.ini")
    if nodelist:
        hosts += [Host(n, source="--nodelist") for n in expand_nodelist(nodelist, budget)]
    if not hosts:
        hosts = list(config.hosts)
    prom = _prometheus(config, prometheus, prometheus_selector, prometheus_max_age) if reads_prometheus else None
    if not hosts and prom is None:
        where = f"fleet.hosts in {config.path}" if config.path else "a fleet config (~/.config/gpuwarden/fleet.toml)"
        raise GpuwardenError("no nodes given",
                             f"use --hosts FILE, --hosts-from inventory.ini --group G, --nodelist 'gpu[01-16]', "
                             f"{where}, or --prometheus URL (every node exporting gpuwarden series)")
    if ssh_config is not None:
        # Once, here: bounded in size, a FIFO or a directory named as such, an Include loop named (asyncssh would
        # read it again for each host, and recurse until RecursionError).
        check_ssh_config(ssh_config)
    t = timeout if timeout is not None else config.timeout
    if t <= 0:
        raise GpuwardenError(f"--timeout {t:g} must be more than 0 seconds", "e.g. --timeout 15")
    inventory = distinct(hosts)
    return FleetTarget(
        hosts=inventory.hosts, duplicates=inventory.duplicates,
        ssh=SshSettings(config_files=(ssh_config,) if ssh_config else (), accept_new=accept_new,
                        connect_timeout=t),
        command=remote_command or config.command,
        parallel=parallel if parallel is not None else config.parallel, timeout=t, prometheus=prom)


def _prometheus(config: FleetConfig, url: str | None, selector: str | None,
                max_age: float | None) -> PromSettings | None:
    url = url if url is not None else config.prometheus
    if not url:  # `--prometheus ''` turns the config's off
        return None
    age = max_age if max_age is not None else (config.prometheus_max_age or DEFAULT_MAX_AGE_S)
    if age <= 0:
        raise GpuwardenError(f"--prometheus-max-age {age:g} must be more than 0 seconds", "e.g. --prometheus-max-age 60")
    settings = PromSettings(url, selector if selector is not None else config.prometheus_selector, age)
    settings.api()  # a malformed URL is refused here, in one line, before any node is asked
    return settings


def fleet_origin() -> str:
    """Who is asking, as the nodes' journals record it: operator@console-host."""
    return f"{who()}@{socket.gethostname()}"
