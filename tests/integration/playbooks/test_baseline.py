"""`gpuwarden baseline record|show` on the simulated node, and residual counted against the baseline."""

from __future__ import annotations

import json


from gpuwarden.ops.node import nodestate
from helpers.simnode import start_tenant


# The sim node these tests run on (conftest.py's sim_cli fixture reads it).
SIM_NODE = {"gpus": 2, "vram": "64GiB"}


def test_record_refuses_a_gpu_in_use_and_records_an_idle_one(sim_cli, state_dir):
    tenant = start_tenant(state_dir, 1, "1GiB")
    try:
        proc = sim_cli("baseline", "record")
        assert proc.returncode == 1
        assert f"GPU 1 is in use by pid {tenant.pid}" in proc.stdout + proc.stderr
        assert nodestate.baseline(state_dir) == {}
        proc = sim_cli("baseline", "record", "0", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert nodestate.baseline(state_dir) == {0: 0}
    finally:
        tenant.terminate()
        tenant.wait(10)
    shown = json.loads(sim_cli("baseline", "show", "--json").stdout)
    assert shown["gpus"]["0"]["vram_bytes"] == 0 and shown["gpus"]["0"]["backend"] == "sim"
    assert "GPU 0: 0 B" in sim_cli("baseline", "show").stdout


def test_leak_sized_idle_use_needs_force_and_then_counts_as_baseline(sim_cli, state_dir):
    sim_cli("sim", "leak", "--gpu", "0", "--size", "3GiB", check=True)
    proc = sim_cli("baseline", "record", "0")
    assert proc.returncode == 1 and "looks like a leak" in proc.stdout + proc.stderr
    assert nodestate.baseline(state_dir) == {}
    # Small idle use (driver reservations) is a baseline, not a leak.
    sim_cli("sim", "leak", "--gpu", "1", "--size", "200MiB", check=True)
    assert sim_cli("baseline", "record", "1").returncode == 0
    assert nodestate.baseline(state_dir) == {1: 200 << 20}
    assert sim_cli("baseline", "record", "0", "--force").returncode == 0
    snap = json.loads(sim_cli("status", "--json").stdout)
    res = {r["gpu_index"]: r for r in snap["residual"]}
    assert res[0]["baseline"] == 3 << 30 and res[0]["residual"] == 0
    assert snap["baseline_recorded"] is True


def test_show_without_a_baseline_says_how_to_record(sim_cli):
    out = sim_cli("baseline", "show")
    assert out.returncode == 0 and "gpuwarden baseline record" in out.stdout
