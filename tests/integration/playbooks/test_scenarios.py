"""`gpuwarden sim scenario`: the residual drill is the README's incident, clean ends what it started.

(The arena drill and the fixes run end to end in test_readme.py's walkthrough.)
"""

from __future__ import annotations

import json

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.node import procs


def test_residual_is_the_incident_and_clean_ends_it(cli):
    proc = cli("--backend", "sim", "sim", "scenario", "residual", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    snap = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    res = {r["gpu_index"]: r for r in snap["residual"]}
    assert res[2]["residual"] == 14 << 30 and res[2]["significant"] and not res[2]["holders"]
    (zombie,) = res[1]["holders"]
    assert zombie["reason"] == "zombie" and zombie["vram_bytes"] == 2 << 30
    assert res[0]["residual"] == res[3]["residual"] == 0
    parent = zombie["ppid"]
    assert procs.state_of(parent) == "sleeping"

    proc = cli("--backend", "sim", "sim", "scenario", "clean")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert procs.state_of(parent) in ("gone", "zombie") and procs.state_of(zombie["pid"]) == "gone"
    snap = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    assert all(r["residual"] == 0 and not r["holders"] for r in snap["residual"])


def test_an_unknown_scenario_names_the_known_ones(cli):
    proc = cli("--backend", "sim", "sim", "scenario", "nope")
    assert proc.returncode == 2 and "choose one of: residual, arena, clean" in proc.stderr
