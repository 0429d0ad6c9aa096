"""Who is in the fleet: hosts files, Slurm hostlists, Ansible INI inventories and the fleet config.

Every source gives the same Host records; ~/.ssh/config still decides how each name is reached.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError, NotFound
from gpuwarden.ops.foundation.inputs import read_regular
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.fleet.hostlist import HostBudget, nodeset_size

# An inventory is text a person wrote: a few hundred KiB at the very most (hostlist.MAX_HOSTS lines, comments and all).
INVENTORY_LIMIT = 4 << 20


@dataclass(frozen=True)
class Host:
    """One node: `name` is what the operator sees, unique in a fleet (see distinct); `address` (default: name) is
    what ssh connects to; `source` where the inventory named it (file:line), for messages."""

    name: str
    user: str | None = None
    port: int | None = None
    address: str | None = None
    source: str | None = field(default=None, compare=False)

    @property
    def target(self) -> str:
        """The ssh argument, [user@]address[:port], for messages."""
        where = self.address or self.name
        return f"{self.user + '@' if self.user else ''}{where}{':' + str(self.port) if self.port else ''}"

    @property
    def key(self) -> tuple[str, str | None, str, int | None]:
        """What makes two inventory lines one node: name, user, address and port, as ssh would take them (a DNS
        name is case-blind, an IPv6 address has one spelling). A line without a port is not the same as one with
        :22 (~/.ssh/config may give that name another Port)."""
        return _norm(self.name), self.user, _norm(self.address or self.name), self.port


def _norm(name: str) -> str:
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name.lower()


def parse_target(text: str, where: str = "") -> Host:
    """`[user@]host[:port]` (IPv6 as `[::1]:22`) as a Host; ValueError naming `where` when malformed."""
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
    port_text: str | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host = text
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{where}bad port {port_text!r} in {text!r}")
        port = int(port_text)
    if not host or any(c.isspace() for c in host) or (user is not None and not user):
        raise ValueError(f"{where}not [user@]host[:port]: {text!r}")
    return Host(host, user or None, port)


def expand_nodelist(pattern: str, budget: HostBudget | None = None, what: str = "--nodelist") -> list[str]:
    """Slurm hostlist syntax (`gpu[01-16],gpu-b[1-4]`) expanded in order, through ClusterShell's NodeSet; its size
    is counted first and taken from `budget` (hostlist.MAX_HOSTS when none), so a huge range is refused before it exists."""
    # deferred: ClusterShell loads only for a hostlist pattern, not for every inventory
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError
    try:
        size = nodeset_size(pattern)
    except GpuwardenError as exc:
        raise GpuwardenError(f"{what} {exc.message}", exc.hint) from None
    (budget or HostBudget()).take(size, f"{what} {pattern!r}")
    try:
        # No group resolver: `@group` must not run the site's group scripts behind the operator's back.
        return list(NodeSet(pattern, resolver=RESOLVER_NOGROUP))
    except (NodeSetParseError, ValueError) as exc:
        raise GpuwardenError(f"{what} {pattern!r} is not a hostlist: {exc}",
                             "write it as Slurm does, e.g. 'gpu[01-16],gpu-b[1-4]'") from None


def read_inventory_text(path: Path, what: str, hint: str) -> str:
    """An inventory file's text: a regular file of at most INVENTORY_LIMIT bytes, opened without blocking (a FIFO,
    a device or a directory is refused in one line naming it), decoded as UTF-8."""
    try:
        data = read_regular(path, what, INVENTORY_LIMIT, hint)
    except NotFound:
        raise
    except GpuwardenError as exc:  # not a regular file, or too big for one: say what an inventory is
        raise GpuwardenError(exc.message, f"{hint}: a regular file of at most {fmt_bytes(INVENTORY_LIMIT)} "
                             "(a pipe, a device or a directory is never read: write the list to a file)") from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: the {what} is not UTF-8 text (byte {exc.start})",
                          f"is {path} the {what} at all? give the text file") from None


def read_hosts_file(path: Path, budget: HostBudget | None = None) -> list[Host]:
    """One `[user@]host[:port]` per line; `#` starts a comment; a hostlist range is allowed in a name. The file is
    read bounded (read_inventory_text) and its hosts counted against `budget` (hostlist.MAX_HOSTS when none)."""
    budget = budget or HostBudget()
    hosts: list[Host] = []
    text = read_inventory_text(path, "hosts file", "give a file with one [user@]host[:port] per line (--hosts)")
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        hosts.extend(_entry(line, f"{path}:{no}", budget))
    return hosts


def hosts_from_config(entries: Iterable[object], where: str, budget: HostBudget | None = None) -> list[Host]:
    budget = budget or HostBudget()
    hosts: list[Host] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise ConfigError(f"{where}: fleet.hosts[{i}] is not a string", "write each host as \"[user@]host[:port]\"")
        hosts.extend(_entry(entry.strip(), f"{where}: fleet.hosts[{i}]", budget))
    return hosts


def _entry(text: str, source: str, budget: HostBudget) -> list[Host]:
    where = f"{source}: "
    user, _, rest = text.rpartition("@")
    if "[" not in rest or rest.startswith("["):  # a plain name, or an IPv6 address in brackets
        try:
            host = parse_target(text, where)
        except ValueError as exc:
            raise ConfigError(str(exc), "write one [user@]host[:port] per line") from None
        budget.take(1, source)
        return [replace(host, source=source)]
    # A hostlist range in the name (gpu[01-16]): every node gets the same user and port.
    name, port = rest, None
    head, sep, tail = rest.rpartition(":")
    if sep and "[" not in tail and "]" not in tail:
        if not tail.isdigit() or not 0 < int(tail) < 65536:
            raise ConfigError(f"{where}bad port {tail!r} in {text!r}", "write one [user@]host[:port] per line")
        name, port = head, int(tail)
    try:
        names = expand_nodelist(name, budget, what=source + ":")
    except ConfigError:
        raise
    except GpuwardenError as exc:
        raise ConfigError(exc.message, exc.hint) from None
    return [Host(n, user or None, port, source=source) for n in names]


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
        data = tomllib.loads(read_inventory_text(Path(path), "fleet config",
                                                 "give a TOML file with a [fleet] table (--fleet-config)"))
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


@dataclass(frozen=True)
class Duplicate:
    """Inventory lines that name a node already named: the node is asked once, and the operator is told."""

    node: str  # the node's name in this fleet
    target: str
    first: str | None  # where the node was named first (file:line)
    repeats: tuple[str | None, ...]  # where it was named again

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "target": self.target, "first": self.first, "repeats": list(self.repeats)}


@dataclass(frozen=True)
class Inventory:
    """The fleet's nodes, each once and each under a name of its own, and the lines that repeated one."""

    hosts: tuple[Host, ...]
    duplicates: tuple[Duplicate, ...] = ()

    def warning(self, shown: int = 5) -> str | None:
        """One line for the operator naming the repeated lines (None when none was)."""
        if not self.duplicates:
            return None
        pairs: dict[tuple[str | None, str | None], list[str]] = {}
        for d in self.duplicates:
            for again in d.repeats:
                pairs.setdefault((again, d.first), []).append(d.node)
        said = []
        for (again, first), nodes in list(pairs.items())[:shown]:
            names = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
            said.append(f"{again or '?'} repeats {first or '?'} ({names})")
        more = f"; and {len(pairs) - shown} more (--json lists them)" if len(pairs) > shown else ""
        count = sum(len(d.repeats) for d in self.duplicates)
        return (f"{count} inventory entr{'ies name' if count != 1 else 'y names'} a node already named, asked once: "
                + "; ".join(said) + more)


def distinct(hosts: Iterable[Host]) -> Inventory:
    """The hosts in order with identical entries (same Host.key) dropped and recorded, and every node given a
    name of its own: nodes that share a name (one address on several ports or for several users, behind one
    bastion) are called by what tells them apart, [user@]host[:port]. ssh still connects to `address`."""
    kept: dict[tuple[str, str | None, str, int | None], Host] = {}
    repeats: dict[tuple[str, str | None, str, int | None], list[str | None]] = {}
    for h in hosts:
        if h.key in kept:
            repeats.setdefault(h.key, []).append(h.source)
        else:
            kept[h.key] = h
    named = _named(list(kept.values()))
    by_key = dict(zip(kept, named))
    dups = tuple(Duplicate(by_key[k].name, by_key[k].target, kept[k].source, tuple(again))
                 for k, again in repeats.items())
    return Inventory(tuple(named), dups)


def _spelled(h: Host) -> str:
    name = f"[{h.name}]" if ":" in h.name else h.name
    return f"{h.user + '@' if h.user else ''}{name}{':' + str(h.port) if h.port else ''}"


def _named(hosts: list[Host]) -> list[Host]:
    groups: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        groups.setdefault(_norm(h.name), []).append(i)
    taken = {h.name for h in hosts}
    out = list(hosts)
    for members in groups.values():
        if len(members) < 2:
            continue
        spelled = [_spelled(hosts[i]) for i in members]
        for i, label in zip(members, spelled):
            h = hosts[i]
            if spelled.count(label) > 1:  # they differ only in the address they reach: say it
                label = f"{label} ({h.address or h.name})"
            base, n = label, 2
            while label in taken and label != h.name:
                label, n = f"{base}#{n}", n + 1
            taken.add(label)
            out[i] = replace(h, name=label, address=h.address or h.name)
    return out


def unique(hosts: Iterable[Host]) -> list[Host]:
    """The hosts of distinct(hosts), without the record of repeats."""
    return list(distinct(hosts).hosts)
