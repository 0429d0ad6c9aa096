"""Hosts of one group of an Ansible INI inventory, without Ansible: groups, children, ranges, connection vars.

Reads `[group]`, `[group:children]`, `[group:vars]`, `host[:port] key=value ...` lines and `[01:16]` ranges.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gpuwarden.ops.foundation.errors import ConfigError, NotFound
from gpuwarden.ops.fleet.hostlist import HostBudget
from gpuwarden.ops.fleet.inventory import Host, read_inventory_text

# The connection variables that matter here, with the older ansible_ssh_* names Ansible still reads.
_ADDRESS = ("ansible_host", "ansible_ssh_host")
_PORT = ("ansible_port", "ansible_ssh_port")
_USER = ("ansible_user", "ansible_ssh_user")
ENTRIES_PER_HOST = 10
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::(\d+))?\]")


def range_size(pattern: str, where: str) -> int:
    """How many names `pattern` expands to, by arithmetic (the ranges' sizes multiplied), before any exists."""
    size = 1
    for m in _RANGE.finditer(pattern):
        lo, hi, stride = m.group(1), m.group(2), int(m.group(3) or 1)
        if stride < 1:
            raise ConfigError(f"{where}stride {stride} in {m.group(0)} must be 1 or more", "write [01:16] or [01:16:2]")
        if lo.isdigit() and hi.isdigit():
            size *= max(0, (int(hi) - int(lo)) // stride + 1)
        elif len(lo) == 1 and len(hi) == 1 and lo.isalpha() and hi.isalpha():
            size *= max(0, (ord(hi) - ord(lo)) // stride + 1)
        # anything else is refused by expand_range with its own message
    return size


def expand_range(pattern: str, where: str, budget: HostBudget | None = None) -> list[str]:
    """Ansible's `www[01:50].example.com` / `db-[a:f]` (inclusive, optional stride); the first range only
    recurses into the rest. The names are counted against `budget` (hostlist.MAX_HOSTS when none) first."""
    (budget or HostBudget()).take(range_size(pattern, where), f"{where}{pattern!r}" if where else repr(pattern))
    return _expand(pattern, where)


def _expand(pattern: str, where: str) -> list[str]:
    m = _RANGE.search(pattern)
    if not m:
        return [pattern]
    lo, hi, stride = m.group(1), m.group(2), int(m.group(3) or 1)
    if lo.isdigit() and hi.isdigit():
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1, stride)]
    elif len(lo) == 1 and len(hi) == 1 and lo.isalpha() and hi.isalpha():
        items = [chr(c) for c in range(ord(lo), ord(hi) + 1, stride)]
    else:
        raise ConfigError(f"{where}bad range [{lo}:{hi}] in {pattern!r}", "write [01:16] or [a:f]")
    if not items:
        raise ConfigError(f"{where}empty range [{lo}:{hi}] in {pattern!r}", "the start must not be past the end")
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [name for item in items for name in _expand(head + item + tail, where)]


def read_group(path: Path, group: str | None, budget: HostBudget | None = None) -> list[Host]:
    """The hosts of `group` (with its children), or of the whole inventory when group is None or "all". The
    file is read bounded (inventory.read_inventory_text); every host line's names count against `budget`."""
    budget = budget or HostBudget()
    # A host is named once per group it is in: the lines may name a few times the cap, its hosts not.
    entries = HostBudget(budget.limit * ENTRIES_PER_HOST, "host entries")
    text = read_inventory_text(path, "Ansible inventory",
                               "give an Ansible INI inventory (--hosts-from; YAML inventories are not read)")
    members: dict[str, list[str]] = {"ungrouped": []}
    children: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    host_vars: dict[str, dict[str, str]] = {}
    order: dict[str, str] = {}  # host -> where it was named first
    section, kind = "ungrouped", "hosts"
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        where = f"{path}:{no}: "
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section, _, kind = line[1:-1].partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise ConfigError(f"{where}unknown section kind {kind!r}", "use [group], [group:vars] or [group:children]")
            if kind == "vars":
                group_vars.setdefault(section, {})
            else:
                (members if kind == "hosts" else children).setdefault(section, [])
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError(f"{where}{exc}", "check the quotes on that line") from None
        if kind == "children":
            children[section].append(words[0])
        elif kind == "vars":
            key, eq, value = line.partition("=")
            if not eq:
                raise ConfigError(f"{where}not key=value: {line!r}", "write e.g. ansible_user=root")
            group_vars[section][key.strip()] = value.strip().strip("'\"")
        else:
            hostvars = _pairs(words[1:], where)
            size = range_size(words[0], where)
            if size > budget.limit:  # one line past the cap: say so in hosts, not in entries
                budget.take(size, f"{where}{words[0]!r}")
            fresh = 0
            for name in expand_range(words[0], where, entries):
                if name.count(":") == 1:  # host:port on the host line is a host variable, above group vars
                    name, _, hostvars["ansible_port"] = name.partition(":")
                members[section].append(name)
                host_vars.setdefault(name, {}).update(hostvars)
                fresh += name not in order
                order.setdefault(name, f"{path}:{no}")
            budget.take(fresh, f"{where}{words[0]!r}")
    wanted = group or "all"
    if wanted != "all" and wanted not in members and wanted not in children:
        known = sorted((set(members) | set(children)) - {"ungrouped"})
        raise NotFound(f"no group {wanted!r} in {path}", f"groups there: {', '.join(known) or 'none'}")
    chosen = list(order) if wanted == "all" else _flatten(wanted, members, children, set())
    # Each group's hosts once, as sets: a big inventory must not flatten every group again for every host.
    in_group = {g: set(_flatten(g, members, children, set())) for g in group_vars if g != "all"}
    return [_host(name, _vars_for(name, in_group, group_vars, host_vars), str(path), order.get(name))
            for name in chosen]


def _pairs(words: list[str], where: str) -> dict[str, str]:
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq:
            raise ConfigError(f"{where}not key=value after the host name: {w!r}", "write e.g. ansible_port=2222")
        out[key] = value
    return out


def _flatten(group: str, members: dict[str, list[str]], children: dict[str, list[str]], seen: set[str]) -> list[str]:
    if group in seen:  # a cycle of children: Ansible refuses too, but one pass is enough here
        return []
    seen.add(group)
    out = dict.fromkeys(members.get(group, []))
    for child in children.get(group, []):
        out.update(dict.fromkeys(_flatten(child, members, children, seen)))
    return list(out)


def _vars_for(name: str, in_group: dict[str, set[str]], group_vars: dict[str, dict[str, str]],
              host_vars: dict[str, dict[str, str]]) -> dict[str, str]:
    merged = dict(group_vars.get("all", {}))
    for group, vars_ in group_vars.items():
        if group != "all" and name in in_group[group]:
            merged.update(vars_)
    merged.update(host_vars.get(name, {}))
    return merged


def _host(name: str, vars_: dict[str, str], where: str, source: str | None) -> Host:
    port_text = next((vars_[k] for k in _PORT if k in vars_), None)
    if port_text is not None and not str(port_text).isdigit():
        raise ConfigError(f"{where}: bad port {port_text!r} for {name}", "ansible_port must be a number")
    return Host(name, next((vars_[k] for k in _USER if k in vars_), None),
                int(port_text) if port_text else None, next((vars_[k] for k in _ADDRESS if k in vars_), None),
                source=source)
