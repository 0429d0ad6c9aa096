"""Hosts of one group of an Ansible INI inventory, without Ansible: groups, children, ranges, connection vars.

Reads `[group]`, `[group:children]`, `[group:vars]`, `host[:port] key=value ...` lines and `[01:16]` ranges.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..errors import ConfigError, NotFound
from .inventory import Host

# The connection variables that matter here, with the older ansible_ssh_* names Ansible still reads.
_ADDRESS = ("ansible_host", "ansible_ssh_host")
_PORT = ("ansible_port", "ansible_ssh_port")
_USER = ("ansible_user", "ansible_ssh_user")
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::(\d+))?\]")


def expand_range(pattern: str, where: str) -> list[str]:
    """Ansible's `www[01:50].example.com` / `db-[a:f]` (inclusive, optional stride); the first range only
    recurses into the rest."""
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
    return [name for item in items for name in expand_range(head + item + tail, where)]


def read_group(path: Path, group: str | None) -> list[Host]:
    """The hosts of `group` (with its children), or of the whole inventory when group is None or "all"."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise NotFound(f"--hosts-from {path}: no such file", "give an Ansible INI inventory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --hosts-from {path}: {getattr(exc, 'strerror', None) or exc}",
                          "give an Ansible INI inventory (YAML inventories are not read)") from None
    members: dict[str, list[str]] = {"ungrouped": []}
    children: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    host_vars: dict[str, dict[str, str]] = {}
    order: list[str] = []
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
            {"hosts": members, "vars": group_vars, "children": children}[kind].setdefault(section, {} if kind == "vars" else [])
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
            for name in expand_range(words[0], where):
                if name.count(":") == 1:  # host:port on the host line is a host variable, above group vars
                    name, _, hostvars["ansible_port"] = name.partition(":")
                members[section].append(name)
                host_vars.setdefault(name, {}).update(hostvars)
                if name not in order:
                    order.append(name)
    wanted = group or "all"
    if wanted != "all" and wanted not in members and wanted not in children:
        known = sorted((set(members) | set(children)) - {"ungrouped"})
        raise NotFound(f"no group {wanted!r} in {path}", f"groups there: {', '.join(known) or 'none'}")
    chosen = order if wanted == "all" else _flatten(wanted, members, children, set())
    return [_host(name, _vars_for(name, members, children, group_vars, host_vars), str(path)) for name in chosen]


def _pairs(words: list[str], where: str) -> dict[str, str]:
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq:
            raise ConfigError(f"{where}not key=value after the host name: {w!r}", "write e.g. ansible_port=2222")
        out[key] = value
    return out


def _flatten(group: str, members: dict, children: dict, seen: set[str]) -> list[str]:
    if group in seen:  # a cycle of children: Ansible refuses too, but one pass is enough here
        return []
    seen.add(group)
    out = list(members.get(group, []))
    for child in children.get(group, []):
        out += [h for h in _flatten(child, members, children, seen) if h not in out]
    return list(dict.fromkeys(out))


def _vars_for(name: str, members: dict, children: dict, group_vars: dict, host_vars: dict) -> dict[str, str]:
    merged = dict(group_vars.get("all", {}))
    for group, vars_ in group_vars.items():
        if group != "all" and name in _flatten(group, members, children, set()):
            merged.update(vars_)
    merged.update(host_vars.get(name, {}))
    return merged


def _host(name: str, vars_: dict[str, str], where: str) -> Host:
    port_text = next((vars_[k] for k in _PORT if k in vars_), None)
    if port_text is not None and not str(port_text).isdigit():
        raise ConfigError(f"{where}: bad port {port_text!r} for {name}", "ansible_port must be a number")
    return Host(name, next((vars_[k] for k in _USER if k in vars_), None),
                int(port_text) if port_text else None, next((vars_[k] for k in _ADDRESS if k in vars_), None))
