"""`gpuwarden reset` end to end on the simulated node: preconditions, the XGMI hive, verification, failures."""

from __future__ import annotations

import json

import pytest

from helpers.simnode import start_tenant

from helpers.journal import read_journal
from gpuwarden.ops.node import nodestate


# The sim node these tests run on (conftest.py's sim_cli fixture reads it).
SIM_NODE = None


def _resets(sim_cli) -> dict:
    return json.loads(sim_cli("sim", "show", "--json").stdout)["resets"]


def test_reset_needs_a_drained_idle_gpu_then_clears_the_leak(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    sim_cli("sim", "leak", "--gpu", "1", "--size", "6GiB", check=True)
    proc = sim_cli("reset", "1", "--yes")
    assert proc.returncode == 1 and "GPU 1 is not drained" in proc.stdout + proc.stderr
    assert _resets(sim_cli) == {}

    sim_cli("drain", "1", "--yes", "--timeout", "0.2")  # fails on the leak, but marks the GPU drained
    tenant = start_tenant(state_dir, 1, "1GiB")
    try:
        proc = sim_cli("reset", "1", "--yes")
        assert proc.returncode == 1 and f"in use by pid {tenant.pid}" in proc.stdout + proc.stderr
        assert tenant.poll() is None and _resets(sim_cli) == {}
    finally:
        tenant.terminate()
        tenant.wait(10)

    proc = sim_cli("reset", "1", "--yes", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["step"] for e in events if e["kind"] == "step_ok"] == ["reset", "verify"]
    assert "enumerates again" in events[-2]["message"]
    assert _resets(sim_cli) == {"1": 1}
    snap = json.loads(sim_cli("status", "--json").stdout)
    assert next(r for r in snap["residual"] if r["gpu_index"] == 1)["residual"] == 0
    assert 1 in snap["drained"]  # reset does not undrain: the operator decides
    actions = [(e["action"], e["result"]) for e in read_journal(state_dir)]
    assert ("gpu-reset", "ok") in actions and ("reset:verify", "ok") in actions


def test_hive_peers_must_be_drained_too(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "4", "--hive", check=True)
    sim_cli("drain", "2", "--yes", check=True)
    proc = sim_cli("reset", "2", "--yes")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    for peer in (0, 1, 3):
        assert f"GPU {peer} (same XGMI hive as GPU 2: the reset reaches it) is not drained" in out
    assert "XGMI hive" in out and _resets(sim_cli) == {}
    for g in (0, 1, 3):
        nodestate.set_drained(state_dir, g, True)  # setup only: drain itself is tested elsewhere
    proc = sim_cli("reset", "2", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = [e for e in read_journal(state_dir) if e["action"] == "reset" and e["result"] == "started"]
    assert started[-1]["gpus_locked"] == [2, 0, 1, 3]


def test_a_failed_reset_is_a_failed_step_and_journalled(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    sim_cli("sim", "fault", "reset-fails", "on", check=True)
    nodestate.set_drained(state_dir, 0, True)
    proc = sim_cli("reset", "0", "--yes")
    assert proc.returncode == 1
    assert "reset failed (fault 'reset-fails' is on)" in proc.stderr
    assert ("gpu-reset", "failed") in [(e["action"], e["result"]) for e in read_journal(state_dir)]


def test_dry_run_names_the_reset_and_changes_nothing(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    nodestate.set_drained(state_dir, 0, True)
    journal = state_dir / "journal.log"
    assert not journal.exists()
    proc = sim_cli("reset", "0", "--dry-run")
    assert proc.returncode == 0
    assert "via simulated driver reset of GPU 0" in proc.stdout and "nothing changed" in proc.stdout
    assert not journal.exists() and _resets(sim_cli) == {}


def test_dry_run_of_a_hive_gpu_names_everything_the_reset_takes_down(sim_cli, state_dir):
    sim_cli("sim", "init", "--gpus", "4", "--hive", check=True)
    for g in range(4):
        nodestate.set_drained(state_dir, g, True)
    proc = sim_cli("reset", "2", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x51510001" in proc.stdout


def test_unknown_gpu_lists_the_gpus(sim_cli):
    sim_cli("sim", "init", "--gpus", "2", check=True)
    proc = sim_cli("reset", "5", "--yes")
    assert proc.returncode == 2 and "no GPU 5 on this node (GPUs: 0, 1)" in proc.stderr


def test_verify_rides_out_a_gpu_that_vanishes_for_a_moment(sim_cli, state_dir, monkeypatch):
    # A real GPU drops off the bus for seconds during a reset; that cannot happen here, so the first
    # two backend opens fail the way a vanished device makes them fail, then the sim node answers.
    from gpuwarden.ops.foundation.errors import BackendUnavailable
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks import nodecheck
    sim_cli("sim", "init", "--gpus", "2", check=True)
    real, opened = nodecheck.Sampler, []

    class Flaky(real):
        def __init__(self, *a, **kw):
            opened.append(1)
            if len(opened) <= 2:
                raise BackendUnavailable("amdsmi: no AMD GPU found")
            super().__init__(*a, **kw)

    monkeypatch.setattr(nodecheck, "Sampler", Flaky)  # the name nodecheck's polling calls
    settings = Settings(state_dir=state_dir, backend="sim")
    _, states = nodecheck.wait_idle(settings, [1], timeout_s=10, poll_s=0.05)
    assert states[1].ok and len(opened) == 3
    opened.clear()
    monkeypatch.setattr(nodecheck, "Sampler", lambda *a, **kw: (_ for _ in ()).throw(BackendUnavailable("gone")))
    with pytest.raises(Exception, match="cannot read the GPUs: gone"):
        nodecheck.wait_idle(settings, [1], timeout_s=0.3, poll_s=0.05)


def test_undrained_between_plan_and_action_is_not_reset(sim_cli, state_dir):
    # Plan under a drained GPU, then someone undrains it before the step runs: the step looks again.
    import threading

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks.framework import RunContext, StepFailed
    from gpuwarden.playbooks.reset import ResetPlaybook
    sim_cli("sim", "init", "--gpus", "2", check=True)
    nodestate.set_drained(state_dir, 1, True)
    pb = ResetPlaybook(1)
    ctx = RunContext(settings=Settings(state_dir=state_dir, backend="sim"), playbook="reset",
                     sink=lambda e: None, cancelled=threading.Event())
    assert pb.preconditions(ctx) == []
    steps = pb.plan(ctx)
    nodestate.set_drained(state_dir, 1, False)
    with pytest.raises(StepFailed, match="GPU 1 is not drained"):
        steps[0].action(ctx)
    assert _resets(sim_cli) == {}


def test_a_forced_reset_names_every_process_that_loses_its_gpu_memory(sim_cli, state_dir):
    # catalog amd-smi-reset-reach: every KFD process on a reset GPU is told its memory is lost
    # (kfd_events.c kfd_signal_reset_event): a --force plan names them before anything runs.
    sim_cli("sim", "init", "--gpus", "2", check=True)
    tenant = start_tenant(state_dir, 0, "1GiB")
    try:
        proc = sim_cli("reset", "0", "--force", "--dry-run")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert f"lose their GPU memory in the reset (KFD signals 'memory lost' to each): pid {tenant.pid} (python" \
            in out, out
        assert tenant.poll() is None and _resets(sim_cli) == {}
    finally:
        tenant.terminate()
        tenant.wait(10)
