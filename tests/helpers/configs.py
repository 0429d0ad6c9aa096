"""Node configs the config tests share: one that checks clean, one with an error of each kind `config check` lists.

BROKEN's errors, by line: 2 arena.path is relative; 5 defaults.stop_grace is no duration (both engines inherit
it, so it must be listed once); 9 engines[0] names GPU 7 (on a four-GPU node).
"""

GOOD = """\
[stagger]
slots = 2

[[engines]]
name = "e0"
gpu = 0
argv = ["/bin/true"]

[[engines]]
name = "e1"
gpu = 1
argv = ["/bin/true"]
"""


BROKEN = """\
[arena]
path = "relative.arena"

[defaults]
stop_grace = "soon"

[[engines]]
name = "a"
gpu = 7
argv = ["x"]

[[engines]]
name = "b"
gpu = 1
argv = ["y"]
"""
