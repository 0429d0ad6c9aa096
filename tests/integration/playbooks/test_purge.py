"""`gpuwarden purge` on the simulated node with real processes: zombie holders, ownerless leaks, arenas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.simnode import cli_argv, start_tenant
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state, wait_for
from helpers.journal import read_journal
from helpers.purge import spawn_with_pid


# The sim node these tests run on (conftest.py's sim_cli fixture reads it).
SIM_NODE = {"gpus": 4, "vram": "24GiB"}


def _status(sim_cli) -> dict:
    return json.loads(sim_cli("status", "--json").stdout)


def _residual(snap: dict, gpu: int) -> int:
    return next(r for r in snap["residual"] if r["gpu_index"] == gpu)["residual"]


def _zombie_tenant(state_dir, gpu: int, size: str):
    """A tenant holding VRAM, SIGKILLed, whose parent never reaps it: a zombie that keeps its VRAM."""
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size))
    assert wait_for(lambda fam=fam: holds_sim_vram(state_dir, fam.tenant), 20)
    os.kill(fam.tenant, signal.SIGKILL)
    assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
    return fam


def test_zombie_residual_is_reported_then_purged_and_bystanders_survive(sim_cli, state_dir):
    fam = _zombie_tenant(state_dir, 1, "5GiB")
    bystander = start_tenant(state_dir, 2, "3GiB")  # a healthy tenant on another GPU
    unrelated = subprocess.Popen(["sleep", "120"])  # not a GPU process at all
    try:
        text = sim_cli("status")
        assert text.returncode == 1
        assert f"pid {fam.tenant} on GPU 1: zombie" in text.stdout
        assert f"not reaped by its parent (pid {fam.parent})" in text.stdout
        snap = _status(sim_cli)
        assert _residual(snap, 1) == 5 << 30
        holders = next(r for r in snap["residual"] if r["gpu_index"] == 1)["holders"]
        assert [h["pid"] for h in holders] == [fam.tenant]

        proc = sim_cli("purge", "--yes", "--json", "--grace", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert events[-1]["kind"] == "done" and events[-1]["data"]["ok"]
        assert any(e["kind"] == "step_ok" and e["step"] == f"pid-{fam.tenant}" for e in events)

        snap = _status(sim_cli)
        assert all(r["residual"] == 0 and not r["holders"] for r in snap["residual"]), snap["residual"]
        assert proc_state(fam.tenant) is None
        # Bystanders: the healthy tenant still holds its VRAM, the unrelated process still runs.
        assert bystander.poll() is None and unrelated.poll() is None
        assert next(g for g in snap["gpus"] if g["index"] == 2)["vram_used"] == 3 << 30
        signalled = {e["pid"] for e in read_journal(state_dir)
                     if e["action"] == "reaper-signal" and e["result"] == "ok"}
        assert signalled == {fam.parent}
    finally:
        bystander.terminate()
        unrelated.kill()
        bystander.wait(10)
        unrelated.wait()
        fam.stop()


def test_ownerless_leak_is_named_then_cleared_by_escalation(sim_cli, state_dir):
    sim_cli("sim", "fault", "leak-on-kill", "on", check=True)
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "3", "--size", "4GiB"), mode="direct")
    try:
        assert wait_for(lambda fam=fam: holds_sim_vram(state_dir, fam.tenant), 20)
        os.kill(fam.tenant, signal.SIGKILL)  # its keeper reaps it: no process is left to blame
        assert wait_for(lambda: proc_state(fam.tenant) is None, 5)
    finally:
        fam.stop()
    assert _residual(_status(sim_cli), 3) == 4 << 30

    proc = sim_cli("purge", "3", "--yes")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "held by no process" in out and "sim fix 3`" in out
    assert _residual(_status(sim_cli), 3) == 4 << 30

    proc = sim_cli("purge", "3", "--yes", "--escalate-reset", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["step"] for e in events if e["kind"] == "step_ok"] == ["verify", "reset-gpu3", "verify-gpu3"]
    assert _residual(_status(sim_cli), 3) == 0
    resets = json.loads(sim_cli("sim", "show", "--json").stdout)["resets"]
    assert resets == {"3": 1}
    journal = read_journal(state_dir)
    assert any(e["action"] == "gpu-reset" and e["result"] == "ok" and e["gpu"] == 3 for e in journal)


def test_escalation_refuses_to_reset_a_gpu_a_live_tenant_uses(sim_cli, state_dir):
    sim_cli("sim", "leak", "--gpu", "0", "--size", "2GiB", check=True)
    tenant = start_tenant(state_dir, 0, "1GiB")
    try:
        proc = sim_cli("purge", "0", "--yes", "--escalate-reset")
        assert proc.returncode == 1
        assert f"in use by pid {tenant.pid}" in proc.stdout + proc.stderr
        assert tenant.poll() is None
        assert json.loads(sim_cli("sim", "show", "--json").stdout)["resets"] == {}
    finally:
        tenant.terminate()
        tenant.wait(10)


def test_holder_whose_pid_was_reused_is_left_alone(state_dir):
    from gpuwarden.ops.clean.reaper import target_ticks
    victim = subprocess.Popen(["sleep", "60"])
    try:
        from gpuwarden.ops.node.procs import ProcReader
        info = ProcReader().read(victim.pid)
        assert target_ticks(victim.pid, info.start_time) == info.start_ticks
        # A holder recorded 3 s earlier under this PID is another process: purge must not target it.
        assert target_ticks(victim.pid, info.start_time - 3.0) is None
        assert target_ticks(victim.pid, None) is None
    finally:
        victim.kill()
        victim.wait()


def _arena_file(path):
    from gpuwarden.ops.arena import format as fmt
    path.write_bytes(fmt.MAGIC + b"\0" * 4088)


def test_arenas_removes_only_unmapped_arena_files(sim_cli, state_dir, tmp_path):
    free, mapped, other = tmp_path / "free.arena", tmp_path / "mapped.arena", tmp_path / "notes.txt"
    _arena_file(free)
    _arena_file(mapped)
    other.write_text("not an arena")
    code = ("import mmap,sys,time; f=open(sys.argv[1],'r+b'); m=mmap.mmap(f.fileno(),0,mmap.MAP_SHARED); "
            "print('mapped',flush=True); time.sleep(120)")
    mapper = subprocess.Popen([sys.executable, "-c", code, str(mapped)], stdout=subprocess.PIPE, text=True)
    try:
        assert mapper.stdout.readline().strip() == "mapped"
        proc = sim_cli("purge", "--yes", "--arenas", "--arena", str(free), "--arena", str(mapped),
                   "--arena", str(other))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not free.exists()
        assert mapped.exists() and other.exists()
        assert f"mapped by pid {mapper.pid}" in proc.stdout
        journal = read_journal(state_dir)
        assert [e["path"] for e in journal if e["action"] == "arena-remove"] == [str(free)]
    finally:
        mapper.kill()
        mapper.wait()


def test_unknown_gpu_is_one_line_listing_the_gpus(sim_cli):
    proc = sim_cli("purge", "7", "--yes")
    assert proc.returncode == 2
    assert "no GPU 7 on this node (GPUs: 0, 1, 2, 3)" in proc.stderr
    assert "Traceback" not in proc.stderr


def _container_cgroup():
    """A real cgroup whose name looks like a docker container scope (needs root); None when not possible."""
    cid = "c0ffee" * 10 + "beef"
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        path = base / f"docker-{cid}.scope"
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            continue
        if (path / "cgroup.procs").exists():
            return path, cid[:12]
    return None


def test_tenant_of_a_gone_container_is_ended_but_a_managed_one_is_not(sim_cli, state_dir):
    made = _container_cgroup()
    if made is None:
        pytest.skip("cannot create a cgroup here (needs root and a writable cgroup fs)")
    cgroup, cid = made
    enter = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
    def in_container(gpu: int, size: str) -> list[str]:
        return ["sh", "-c", enter, "sh", *cli_argv(state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size)]
    orphan = start_family(in_container(0, "2GiB"), mode="direct")
    managed = start_family(in_container(1, "1GiB"), mode="direct", env={"FAMILY_COMM": "containerd-shim"})
    try:
        for fam in (orphan, managed):
            assert wait_for(lambda fam=fam: holds_sim_vram(state_dir, fam.tenant), 20)
        snap = _status(sim_cli)
        assert {p["pid"]: p["container"] for p in snap["processes"]}[orphan.tenant] == cid
        plan = sim_cli("purge", "--dry-run").stdout
        assert f"end orphan of a gone container: pid {orphan.tenant}" in plan
        assert f"pid {managed.tenant}" not in plan
        proc = sim_cli("purge", "--yes", "--grace", "2")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert wait_for(lambda: proc_state(orphan.tenant) is None, 5)
        assert proc_state(managed.tenant) in ("S", "R")
        used = {g["index"]: g["vram_used"] for g in _status(sim_cli)["gpus"]}
        assert used[0] == 0 and used[1] == 1 << 30
    finally:
        orphan.stop()
        managed.stop()
        try:
            cgroup.rmdir()
        except OSError:
            pass


def test_escalation_locks_the_whole_xgmi_hive(cli, state_dir):
    cli("--backend", "sim", "sim", "init", "--gpus", "3", "--hive", check=True)
    cli("--backend", "sim", "sim", "leak", "--gpu", "1", "--size", "2GiB", check=True)
    proc = cli("--backend", "sim", "purge", "1", "--yes", "--escalate-reset")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from gpuwarden.ops.foundation import journal
    started = [e for e in journal.read(state_dir) if e["action"] == "purge" and e["result"] == "started"]
    assert started[-1]["gpu"] == 1 and started[-1]["gpus_locked"] == [0, 1, 2]
    assert sorted(p.name for p in (state_dir / "locks").iterdir()) == ["gpu-0.lock", "gpu-1.lock", "gpu-2.lock"]


def test_purge_never_signals_a_pid_reused_between_plan_and_action(sim_cli, state_dir):
    """A real PID reuse: the zombie is planned for, then reaped elsewhere, and an unrelated process is
    started under the very same PID before the purge step acts. The step must leave it alone."""
    import threading

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks.framework import RunContext, SkipStep
    from gpuwarden.playbooks.purge import PurgePlaybook
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next PID (ns_last_pid)")
    fam = _zombie_tenant(state_dir, 1, "1GiB")
    settings = Settings(state_dir=state_dir, backend="sim")
    pb = PurgePlaybook(1, grace_s=0.5)
    ctx = RunContext(settings=settings, playbook="purge", sink=lambda e: None, cancelled=threading.Event())
    assert pb.preconditions(ctx) == []
    steps = pb.plan(ctx)
    assert steps[0].name == f"pid-{fam.tenant}"
    zombie = fam.tenant
    fam.stop()  # the careless parent dies; the keeper reaps the zombie: its PID is free again
    assert wait_for(lambda: proc_state(zombie) is None, 5)
    reused = spawn_with_pid(zombie, ["sleep", "60"])
    if reused is None:
        pytest.skip("could not get the freed PID back (the machine forks too much right now)")
    try:
        with pytest.raises(SkipStep, match="now names another process"):
            steps[0].action(ctx)
        time.sleep(0.2)
        assert reused.poll() is None, "the process now holding the reused PID was signalled"
        journal = read_journal(state_dir)
        assert not any(e["action"] == "reaper-signal" and e["pid"] == zombie and e["result"] == "ok"
                       for e in journal)
    finally:
        reused.kill()
        reused.wait()


def test_vram_charged_to_a_pid_that_no_longer_exists_needs_a_reset(cli, tmp_path, fixtures):
    # A real amdgpu/KFD layout (captured MI300X node properties) with KFD still charging 14 GiB to a
    # PID that has exited: no process to signal, so purge names the reset, and escalation tries it.
    from helpers.sysfs_tree import add_card, add_kfd_node, add_kfd_proc
    root = tmp_path / "sys"
    props = (fixtures / "sysfs/kfd_topology_node4_properties_grep_gfx_target_version_mi300x.txt").read_text()
    add_card(root, 0, vram_total=f"{192 << 30}\n", vram_used=f"{(14 << 30) + (300 << 20)}\n",
             bus="0000:c1:00.0", render_minor=128)
    add_kfd_node(root, 1, 41999, props + "drm_render_minor 128\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    add_kfd_proc(root, gone.pid, 41999, 14 << 30)
    args = ("--backend", "sysfs", "--sysfs-root", str(root))
    snap = json.loads(cli(*args, "status", "--json").stdout)
    holders = snap["residual"][0]["holders"]
    assert [(h["pid"], h["reason"]) for h in holders] == [(gone.pid, "kfd-without-process")]

    proc = cli(*args, "purge", "0", "--yes", "--timeout", "0.5")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert f"pid {gone.pid} on GPU 0 (kfd-without-process" in out and "only a GPU reset frees it" in out
    assert " fix 0`" in out

    proc = cli(*args, "purge", "0", "--yes", "--timeout", "0.5", "--escalate-reset", "--json",
               env={"PATH": str(tmp_path / "no-tools")})
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1
    assert any(e["kind"] == "step_ok" and e["step"] == "verify" and "escalating" in e["message"] for e in events)
    failed = next(e for e in events if e["kind"] == "step_failed")
    assert failed["step"] == "reset-gpu0" and "neither the amdsmi library nor amd-smi nor rocm-smi" in failed["message"]
