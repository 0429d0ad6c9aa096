"""`gpuwarden drain` / `undrain` with real shims supervising real sim tenants, and GPU locks between playbooks."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from engines.harness import records, start_sim_tenant_engine, supervised  # noqa: F401

from helpers.journal import read_journal
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.engines import state as st
from gpuwarden.ops.foundation.settings import Settings
from helpers.simnode import cli_argv, start_tenant, wait_for


# The sim node these tests run on (conftest.py's sim_cli fixture reads it).
SIM_NODE = {"gpus": 3, "vram": "16GiB"}
pytestmark = pytest.mark.usefixtures("supervised")  # the sim node runs under the supervised state dir


def _used(sim_cli) -> dict[int, int]:
    snap = json.loads(sim_cli("status", "--json").stdout)
    return {g["index"]: g["vram_used"] for g in snap["gpus"]}


def test_drain_stops_only_that_gpus_engines(sim_cli, state_dir):
    start_sim_tenant_engine(state_dir, "llm-a", 0, "4GiB")
    start_sim_tenant_engine(state_dir, "llm-b", 1, "5GiB")
    assert _used(sim_cli) == {0: 4 << 30, 1: 5 << 30, 2: 0}
    b_pid = records(state_dir)["llm-b"]["pid"]

    proc = sim_cli("drain", "0", "--yes", "--json", "--timeout", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["step"] for e in events if e["kind"] == "step_ok"] == ["mark", "stop-engines", "wait-idle"]
    assert any(e["kind"] == "info" and e["data"].get("engine") == "llm-a" for e in events)
    account = next(e["data"] for e in events if e["kind"] == "info" and "remaining" in e.get("data", {}))
    assert [s["engine"] for s in account["stopped"]] == ["llm-a"] and account["remaining"] == []

    assert _used(sim_cli) == {0: 0, 1: 5 << 30, 2: 0}
    recs = records(state_dir)
    assert recs["llm-a"]["phase"] in st.FINAL_PHASES
    assert recs["llm-b"]["phase"] == "serving" and recs["llm-b"]["pid"] == b_pid
    assert st.alive(b_pid, recs["llm-b"]["pid_start"])
    assert 0 in nodestate.drained(state_dir) and 1 not in nodestate.drained(state_dir)
    status = sim_cli("status").stdout
    assert "DRAINED" in [line for line in status.splitlines() if line.strip().startswith("0 ")][0]

    proc = sim_cli("undrain", "0")
    assert proc.returncode == 0 and nodestate.drained(state_dir) == {}


def test_drain_reports_what_remains(sim_cli, state_dir):
    tenant = start_tenant(state_dir, 2, "2GiB")  # not supervised: drain cannot stop it
    try:
        proc = sim_cli("drain", "2", "--yes", "--timeout", "0.5")
        assert proc.returncode == 1
        err = proc.stderr
        assert f"used by pid {tenant.pid}" in err and "stop it" in err and " drain 2` again" in err
        assert "no supervised engine runs on GPU 2" in proc.stdout
        assert tenant.poll() is None
        assert 2 in nodestate.drained(state_dir)
    finally:
        tenant.terminate()
        tenant.wait(10)


def test_two_playbooks_on_one_gpu_do_not_interleave(sim_cli, state_dir):
    tenant = start_tenant(state_dir, 1, "1GiB")
    try:
        # The drain holds GPU 1's lock while it waits (3 s) for a GPU that will not go idle.
        drain = subprocess.Popen(cli_argv(state_dir, "drain", "1", "--yes", "--timeout", "3"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lock_file = state_dir / "locks" / "gpu-1.lock"
        wait_for(lambda: lock_file.exists() and lock_file.read_text(), 15, "drain to take the lock")
        refused = sim_cli("reset", "1", "--yes", "--force")
        assert refused.returncode == 1
        msg = refused.stdout + refused.stderr
        assert "GPU 1 is locked by" in msg and f"(pid {drain.pid}) running 'drain'" in msg
        waited = sim_cli("undrain", "1", "--wait", "20")
        drain.wait(20)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        entries = read_journal(state_dir)
        kinds = [e["action"].split(":")[0] for e in entries]
        drain_at = [i for i, k in enumerate(kinds) if k == "drain"]
        undrain_at = [i for i, k in enumerate(kinds) if k == "undrain"]
        # Every drain line (all from the first process) comes before the waiting undrain's first line.
        assert {entries[i]["pid"] for i in drain_at} == {drain.pid}
        assert drain_at and undrain_at and max(drain_at) < min(undrain_at), kinds
        assert not any(e["action"] == "gpu-reset" for e in entries)
    finally:
        tenant.terminate()
        tenant.wait(10)



def test_gpuwarden_itself_is_never_a_gpu_user(sim_cli, state_dir):
    # NVML and amdsmi open the GPUs' device files in gpuwarden's own process; that must not block a drain.
    from gpuwarden.playbooks import nodecheck
    from gpuwarden.ops.sampling.sampler import take_snapshot
    settings = Settings(state_dir=state_dir, backend="sim")
    with open(state_dir / "sim" / "dev" / "dri" / "renderD129", "rb"):
        snap = take_snapshot(settings)
        assert not any(p.pid == os.getpid() for p in snap.processes)  # the snapshot leaves itself out
        assert nodecheck.users(snap, 1) == []
        assert nodecheck.idle_state(snap, 1).ok
