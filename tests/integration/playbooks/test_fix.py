"""`gpuwarden fix N` end to end on the simulated node: from residual to clean and verified, in seconds.

Real tenants, zombies and supervised engines; the reset path runs the simulated driver's reset.
"""

from __future__ import annotations

import json
import os
import signal
import time

from engines.harness import records, start_sim_tenant_engine, supervised  # noqa: F401

from helpers.journal import read_journal
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.engines import state as st
from helpers.simnode import cli_argv, on_terminal, start_tenant, wait_for
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state


# The sim node these tests run on (conftest.py's sim_cli fixture reads it).
SIM_NODE = None


def _events(proc) -> list[dict]:
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    for e in events:
        jsondoc.validate(e)
    return events


def _residual(sim_cli, gpu: int) -> int:
    snap = json.loads(sim_cli("status", "--json").stdout)
    return next(r for r in snap["residual"] if r["gpu_index"] == gpu)["residual"]


def _resets(sim_cli) -> dict:
    return json.loads(sim_cli("sim", "show", "--json").stdout)["resets"]


def test_ownerless_leak_is_reset_verified_and_undrained_in_seconds(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "4", check=True)
    sim_cli("sim", "leak", "--gpu", "2", "--size", "14GiB", check=True)
    plan = sim_cli("fix", "2", "--dry-run")
    assert plan.returncode == 0 and "only if needed" in plan.stdout and "reset GPU 2" in plan.stdout
    assert _resets(sim_cli) == {} and _residual(sim_cli, 2) == 14 << 30

    t0 = time.monotonic()
    proc = sim_cli("fix", "2", "--yes", "--json", "--timeout", "30")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = _events(proc)
    assert [e["step"] for e in events if e["kind"] == "step_ok"] == ["settle", "drain", "reset", "verify", "undrain"]
    assert events[-1]["message"] == "GPU 2 is clean and verified after a reset"
    drained = next(e for e in events if e["kind"] == "step_ok" and e["step"] == "drain")
    assert drained["message"].startswith("GPU 2 drained, nothing uses it"), drained  # one GPU: "it", not "them"
    # Memory no process holds never comes back: fix must not sit out its 30 s timeout waiting for it.
    assert took < 20, took
    assert _residual(sim_cli, 2) == 0 and _resets(sim_cli) == {"2": 1}
    assert nodestate.drained(state_dir) == {}
    journal = read_journal(state_dir)
    assert ("gpu-reset", "ok") in [(e["action"], e["result"]) for e in journal]
    assert ("fix", "ok") in [(e["action"], e["result"]) for e in journal]


def test_a_clean_gpu_is_checked_and_left_alone_without_asking(sim_cli):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    proc = sim_cli("fix", "1")  # no terminal, no --yes: nothing destructive is planned, so nothing to refuse
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU 1 was clean: nothing changed" in proc.stdout
    assert _resets(sim_cli) == {}


def test_a_dirty_gpu_without_a_terminal_needs_yes(sim_cli):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    sim_cli("sim", "leak", "--gpu", "1", "--size", "2GiB", check=True)
    proc = sim_cli("fix", "1")
    assert proc.returncode == 1 and "pass --yes" in proc.stdout + proc.stderr
    assert _resets(sim_cli) == {} and _residual(sim_cli, 1) == 2 << 30


def test_a_zombie_is_purged_and_no_reset_is_needed(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "2GiB"))
    try:
        assert wait_for(lambda: holds_sim_vram(state_dir, fam.tenant), 20)
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
        proc = sim_cli("fix", "1", "--yes", "--json", "--grace", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        events = _events(proc)
        ok = [e["step"] for e in events if e["kind"] == "step_ok"]
        assert ok == [f"pid-{fam.tenant}", "settle"], ok
        assert {e["step"] for e in events if e["kind"] == "step_skipped"} == {"drain", "reset", "verify", "undrain"}
        assert events[-1]["message"] == "GPU 1 is clean and verified (no reset needed)"
        assert _resets(sim_cli) == {} and proc_state(fam.tenant) is None
    finally:
        fam.stop()


def test_the_whole_xgmi_hive_is_drained_reset_and_undrained(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "3", "--hive", check=True)
    sim_cli("sim", "leak", "--gpu", "1", "--size", "3GiB", check=True)
    sim_cli("drain", "2", "--yes", check=True)  # already drained by the operator: fix must leave it drained
    proc = sim_cli("fix", "1", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shares an XGMI hive with GPU 0, 2" in proc.stdout and "mark GPU 1, 0, 2 drained" in proc.stdout
    assert "GPU 2 stays drained as before" in proc.stdout  # wording: it said "GPU 2 stay drained"
    assert "GPUs 1, 0, 2 drained, nothing uses them" in proc.stdout
    assert _resets(sim_cli) == {"1": 1} and set(nodestate.drained(state_dir)) == {2}
    locked = [e for e in read_journal(state_dir) if e["action"] == "fix"]
    assert locked[-1]["gpus_locked"] == [0, 1, 2]


def test_a_live_tenant_on_the_hive_forbids_the_reset(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "2", "--hive", check=True)
    sim_cli("sim", "leak", "--gpu", "0", "--size", "2GiB", check=True)
    tenant = start_tenant(state_dir, 1, "1GiB")
    try:
        proc = sim_cli("fix", "0", "--yes")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1
        assert f"GPU 1 is in use by pid {tenant.pid}" in out and "fix 0` again" in out
        assert tenant.poll() is None and _resets(sim_cli) == {} and nodestate.drained(state_dir) == {}
    finally:
        tenant.terminate()
        tenant.wait(10)


def test_engines_are_stopped_only_with_stop_engines(sim_cli, supervised):  # noqa: F811
    state_dir = supervised
    sim_cli("sim", "init", "--gpus", "2", check=True)
    start_sim_tenant_engine(state_dir, "llm", 1, "1GiB")
    sim_cli("sim", "leak", "--gpu", "1", "--size", "2GiB", check=True)
    proc = sim_cli("fix", "1", "--yes")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "sim fix 1 --stop-engines`" in out, out
    assert records(state_dir)["llm"]["phase"] == "serving" and _resets(sim_cli) == {}

    proc = sim_cli("fix", "1", "--yes", "--stop-engines")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "sim engines restart llm`" in out
    assert records(state_dir)["llm"]["phase"] in st.FINAL_PHASES
    assert _resets(sim_cli) == {"1": 1} and _residual(sim_cli, 1) == 0 and nodestate.drained(state_dir) == {}


def test_the_confirmation_names_the_gpus_and_engines_a_reset_takes_down(sim_cli, supervised):  # noqa: F811
    state_dir = supervised
    sim_cli("sim", "init", "--gpus", "4", "--hive", check=True)
    start_sim_tenant_engine(state_dir, "dp0", 0, "1GiB")
    sim_cli("sim", "leak", "--gpu", "2", "--size", "2GiB", check=True)
    plan = sim_cli("fix", "2", "--stop-engines", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    reach = "resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x51510001: engine dp0 will lose its context"
    assert reach in plan.stdout  # in the reset step of the plan
    rc, out = on_terminal(cli_argv(state_dir, "fix", "2", "--stop-engines"), b"n\n")
    flat = " ".join(out.split())
    assert f"If a reset is needed, {reach}. It may signal 2 process(es), listed above. Proceed? [y/N]" in flat, out
    # The engine and its shim are named before the question: role, command (program first), signals.
    assert "(root, supervised engine dp0): python -m gpuwarden.playbooks.cli.root" in flat or \
        "supervised engine dp0): python" in flat, out
    assert "launcher of a supervised engine dp0): python -m gpuwarden.ops.services.shim" in flat, out
    assert rc == 1 and _resets(sim_cli) == {} and records(state_dir)["dp0"]["phase"] == "serving"
