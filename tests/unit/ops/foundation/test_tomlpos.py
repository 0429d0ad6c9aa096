"""gpuwarden.ops.foundation.tomlpos: the line of every key path of a TOML document, so config errors name the right line.

Each document is also parsed by tomllib: every key path tomllib yields must be located, and on the line the
case says (marked in the text with `# <- path`)."""

from __future__ import annotations

import tomllib

import pytest

from gpuwarden.ops.foundation.tomlpos import line_of, locate

DOCS = {
    "tables and dotted keys": '''
[arena]
path = "/dev/shm/w.arena"   # <- arena.path
size = "64GiB"              # <- arena.size
gate.slots = 1              # <- arena.gate.slots
''',
    "arrays of tables": '''
[[engines]]
name = "dp0"                # <- engines.0.name
gpu = 0                     # <- engines.0.gpu

[[engines]]
name = "dp1"                # <- engines.1.name
env = { NCCL_DEBUG = "INFO", HIP_VISIBLE_DEVICES = "1" }   # <- engines.1.env.NCCL_DEBUG
''',
    "strings that look like syntax": '''
[a]
x = "not [a] table = 1"     # <- a.x
y = 'single # quoted'       # <- a.y
z = """multi
[line] = with = equals
"""
w = 2                       # <- a.w
''',
    "arrays spanning lines": '''
[agent]
interval = "1s"             # <- agent.interval
watch = [
  "dmesg",
  "journal",
]
deep = true                 # <- agent.deep
''',
    "quoted keys": '''
[kubernetes]
"node-name" = "gpu01"       # <- kubernetes.node-name
''',
}


def expected_lines(text: str) -> dict[tuple, int]:
    out = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if "# <- " in line:
            path = tuple(int(p) if p.isdigit() else p for p in line.split("# <- ")[1].strip().split("."))
            out[path] = n
    return out


def key_paths(value, prefix=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield prefix + (k,)
            yield from key_paths(v, prefix + (k,))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            yield from key_paths(v, prefix + (i,))


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_key_is_located_on_its_line(name):
    text = DOCS[name]
    where = locate(text)
    for path, line in expected_lines(text).items():
        assert where.get(path) == line, (path, where)
    for path in key_paths(tomllib.loads(text)):
        assert path in where, f"{path} not located in {name!r}"


def test_line_of_falls_back_to_the_nearest_known_parent():
    text = DOCS["arrays of tables"]
    where = locate(text)
    assert line_of(where, ("engines", 1, "env", "NCCL_DEBUG", "deeper")) == 8
