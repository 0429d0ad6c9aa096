"""Who is in the fleet: hosts files, Slurm hostlists, Ansible INI inventories and the fleet config.

Every source gives the same Host records; ~/.ssh/config still decides how each name is reached.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError, GpuwardenError, NotFound


@dataclass(frozen=True)
class Host:
    """One node: `name` is what the operator sees; `address` (default: name) is what ssh connects to."""

    name: str
    user: str | None = None
    port: int | None = None
    address: str | None = None

    @property
    def target(self) -> str:
        """The ssh argument, [user@]address[:port], for messages."""
        where = self.address or self.name
        return f"{self.user + '@' if self.user else ''}{where}{':' + str(self.port) if self.port else ''}"


def parse_target(text: str, where: str = "") -> Host:
    """`[user@]host[:port]` (IPv6 as `[::1]:22`) as a Host; ValueError naming `where` when malformed."""
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
    port = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = rest[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{where}bad port {port!r} in {text!r}")
        port = int(port)
    if not host or any(c.isspace() for c in host) or (user is not None and not user):
        raise ValueError(f"{where}not [user@]host[:port]: {text!r}")
    return Host(host, user or None, port)


def expand_nodelist(pattern: str) -> list[str]:
    """Slurm hostlist syntax (`gpu[01-16],gpu-b[1-4]`) expanded in order, through ClusterShell's NodeSet."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError
    try:
        # No group resolver: `@group` must not run the site's group scripts behind the operator's back.
        return list(NodeSet(pattern, resolver=RESOLVER_NOGROUP))
    except (NodeSetParseError, ValueError) as exc:
        raise GpuwardenError(f"--nodelist {pattern!r} is not a hostlist: {exc}",
                             "write it as Slurm does, e.g. 'gpu[01-16],gpu-b[1-4]'") from None


def read_hosts_file(path: Path) -> list[Host]:
    """One `[user@]host[:port]` per line; `#` starts a comment; a hostlist range is allowed in a name."""
    hosts: list[Host] = []
    for no, raw in enumerate(_read(path, "--hosts").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        hosts.extend(_entry(line, f"{path}:{no}: "))
    return hosts


def hosts_from_config(entries: Iterable[object], where: str) -> list[Host]:
    hosts: list[Host] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise ConfigError(f"{where}: fleet.hosts[{i}] is not a string", "write each host as \"[user@]host[:port]\"")
        hosts.extend(_entry(entry.strip(), f"{where}: fleet.hosts[{i}]: "))
    return hosts


def _entry(text: str, where: str) -> list[Host]:
    user, _, rest = text.rpartition("@")
    if "[" not in rest or rest.startswith("["):  # a plain name, or an IPv6 address in brackets
        try:
            return [parse_target(text, where)]
        except ValueError as exc:
            raise ConfigError(str(exc), "write one [user@]host[:port] per line") from None
    # A hostlist range in the name (gpu[01-16]): every node gets the same user and port.
    name, port = rest, None
    head, sep, tail = rest.rpartition(":")
    if sep and "[" not in tail and "]" not in tail:
        if not tail.isdigit() or not 0 < int(tail) < 65536:
            raise ConfigError(f"{where}bad port {tail!r} in {text!r}", "write one [user@]host[:port] per line")
        name, port = head, int(tail)
    try:
        names = expand_nodelist(name)
    except GpuwardenError as exc:
        raise ConfigError(f"{where}{exc.message}", exc.hint) from None
    return [Host(n, user or None, port) for n in names]


def _read(path: Path, flag: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise NotFound(f"{flag} {path}: no such file", "give a file with one host per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuwardenError(f"cannot read {flag} {path}: {getattr(exc, 'strerror', None) or exc}",
                             "check the path and its permissions") from None


@dataclass(frozen=True)
class FleetConfig:
    """The `[fleet]` table of a fleet config file; every field has a default."""

    hosts: tuple[Host, ...] = ()
    command: str = "gpuwarden"
    parallel: int = 32
    timeout: float = 15.0
    path: Path | None = None
    prometheus: str | None = None  # base URL: fleet status / fleet tui read the fleet from there
    prometheus_selector: str = ""
    prometheus_max_age: float | None = None


FLEET_KEYS = {"hosts", "command", "parallel", "timeout", "prometheus", "prometheus_selector", "prometheus_max_age"}


def load_fleet_config(path: Path | None, explicit: bool) -> FleetConfig:
    """Read `[fleet]` from `path`; a missing default file is no error, a missing explicit one is."""
    if path is None or not Path(path).exists():
        if explicit:
            raise NotFound(f"fleet config {path}: no such file",
                           "write one with a [fleet] table (hosts = [\"gpu[01-16]\"]) or use --hosts/--nodelist")
        return FleetConfig()
    try:
        data = tomllib.loads(_read(Path(path), "--fleet-config"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}", "fix the TOML syntax at that line") from None
    table = data.get("fleet", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: fleet is not a table", "write [fleet] followed by hosts = [...]")
    unknown = set(table) - FLEET_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) in [fleet]: {', '.join(sorted(unknown))}",
                          f"known keys: {', '.join(sorted(FLEET_KEYS))}")
    hosts = table.get("hosts", [])
    if not isinstance(hosts, list):
        raise ConfigError(f"{path}: fleet.hosts is not a list", "write hosts = [\"gpu[01-16]\", \"root@gpu-b1\"]")
    parallel, timeout, command = table.get("parallel", 32), table.get("timeout", 15.0), table.get("command", "gpuwarden")
    if not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"{path}: fleet.parallel must be a whole number >= 1", "e.g. parallel = 32")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"{path}: fleet.timeout must be seconds > 0", "e.g. timeout = 15")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{path}: fleet.command must be a command line", "e.g. command = \"sudo -n gpuwarden\"")
    prometheus, prom_selector = table.get("prometheus"), table.get("prometheus_selector", "")
    prom_max_age = table.get("prometheus_max_age")
    if prometheus is not None and (not isinstance(prometheus, str) or not prometheus.strip()):
        raise ConfigError(f"{path}: fleet.prometheus must be a URL", "e.g. prometheus = \"http://prometheus:9090\"")
    if not isinstance(prom_selector, str):
        raise ConfigError(f"{path}: fleet.prometheus_selector must be a string of label matchers",
                          "e.g. prometheus_selector = 'job=\"gpuwarden\"'")
    if prom_max_age is not None and (not isinstance(prom_max_age, (int, float)) or prom_max_age <= 0):
        raise ConfigError(f"{path}: fleet.prometheus_max_age must be seconds > 0", "e.g. prometheus_max_age = 60")
    return FleetConfig(tuple(hosts_from_config(hosts, str(path))), command, parallel, float(timeout), Path(path),
                       prometheus, prom_selector, float(prom_max_age) if prom_max_age is not None else None)


def unique(hosts: Iterable[Host]) -> list[Host]:
    """Hosts in order with repeats (same name) dropped: a node named twice is asked once."""
    seen: set[str] = set()
    out = []
    for h in hosts:
        if h.name not in seen:
            seen.add(h.name)
            out.append(h)
    return out
