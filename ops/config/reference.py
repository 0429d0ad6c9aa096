"""What ops/config/keys.py's table generates: the node config `gpuwarden config example` prints, and the reference
tables of docs/configuration.md (tests/integration/ops/config/test_config_keys.py checks that the page holds exactly these).
"""

from __future__ import annotations

import textwrap

from gpuwarden.ops.config import keys
from gpuwarden.ops.config.keys import Key

_TITLES = {
    "global": "Command line and environment",
    "": "node.toml, top level",
    "arena": "[arena]: the shared weight arena",
    "stagger": "[stagger]: how many engines register at once",
    "engines": "[[engines]] and [defaults]: the engines the shims supervise",
    "agent": "[agent]: the node agent",
    "kubernetes": "[kubernetes]: the agent in a cluster",
}
_TYPES = {
    "path": "path", "str": "string", "text": "string (may be empty)", "int": "whole number", "gpu": "GPU index",
    "seconds": "seconds (a number)", "duration": "duration (120, \"90s\", \"2m\")", "size": "size", "bool": "true/false", "choice": "one of",
    "choices": "list of", "names": "list of strings", "name": "name", "argv": "list of strings",
    "env": "table of strings", "regex": "regular expression", "signal": "signal name", "gate_release": "string",
}
_COMMENT_AT = 37  # the column inline comments start at


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _number(k: Key, value: float) -> str:
    return _size(int(value)) if k.type == "size" else f"{value:g}"


def _default(k: Key) -> str:
    if k.shown:
        return k.shown
    if k.required:
        return "(required)"
    v = k.default
    if v is None or v == {} or v == ():
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _number(k, v) + (" s" if k.unit == "s" else "")
    if isinstance(v, tuple):
        return ", ".join(v)
    return f"`{v}`" if v else '`""`'


def _range(k: Key) -> str:
    if k.choices:
        return ", ".join(k.choices)
    if k.low is None and k.high is None:
        return ""
    unit = " s" if k.unit == "s" else ""
    low = _number(k, k.low or 0)
    return f"{low} to {_number(k, k.high)}{unit}" if k.high is not None else f"at least {low}{unit}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The reference: one table per section, each key with its type, range, default, variable and meaning."""
    out: list[str] = []
    for section in keys.SECTIONS:
        out += [f"### {_TITLES[section]}", ""]
        if section == "global":
            out += ["| option | variable | type | range | default | meaning |", "|---|---|---|---|---|---|"]
        else:
            out += ["| key | type | range | default | meaning |", "|---|---|---|---|---|"]
        for k in keys.section(section).values():
            kind = _TYPES[k.type]
            cells = [kind, _range(k), _default(k), k.help]
            if section == "global":
                cells = [f"`{k.option}`" if k.option else "", f"`{k.env}`" if k.env else ""] + cells
            else:
                note = " (not in [defaults])" if k.per_engine else ""
                where = f" (also `{k.option}`, `{k.env}`)" if k.env else ""
                cells = [f"`{k.name}`{note}{where}"] + cells
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _line(k: Key, value: str) -> list[str]:
    text = f"{k.name} = {value}"
    comment = f"# {k.help}"
    if len(text) < _COMMENT_AT - 1 and _COMMENT_AT + len(comment) <= 120:
        return [text.ljust(_COMMENT_AT) + comment]
    return _comment(k) + [text]


def _comment(k: Key) -> list[str]:
    """The key's help as comment lines of at most 116 characters, above the key."""
    return textwrap.wrap(f"# {k.help}", 116, subsequent_indent="# ")


def example(engines: int = 4) -> str:
    """A complete node config: `engines` data-parallel engines, one GPU each, sharing one weight arena, with
    every key that has an example value in the table."""
    out = [f"# /etc/gpuwarden/node.toml — {engines} data-parallel engines, one GPU each, sharing one weight arena.",
           "# Every key, its type, range and default: docs/configuration.md. Check it with `gpuwarden config check`.",
           ""]
    for k in keys.section("").values():
        if k.example is not None:
            out += [*_comment(k), f"{k.name} = {k.example}", ""]
    for table in ("arena", "stagger"):
        out.append(f"[{table}]")
        out += [line for k in keys.section(table).values() if k.example is not None for line in _line(k, k.example)]
        out.append("")
    out.append("[defaults]".ljust(_COMMENT_AT) + "# every engine gets these unless it sets its own")
    out += [line for k in keys.section("engines").values() if k.example is not None and not k.per_engine
            for line in _line(k, k.example)]
    out.append("# (a static or setuid engine ignores LD_PRELOAD: use progress = \"log\" with registered_pattern)")
    arena = keys.key("arena", "path").example
    for i in range(engines):
        out += ["", "[[engines]]", f'name = "dp{i}"']
        out += _line(keys.key("engines", "gpu"), str(i)) if i == 0 else [f"gpu = {i}"]
        out.append(f'argv = ["/opt/engine/bin/serve", "--arena", {arena}, "--dp-rank", "{i}", "--port", "{8000 + i}"]')
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # python -m gpuwarden.ops.config.reference: the tables docs/configuration.md holds
    print(markdown(), end="")
